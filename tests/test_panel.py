"""The control panel's keys, in process (the tmux tests drive it with the real CLI)."""

from __future__ import annotations

import types

import pytest

import cc_lhc


class FakeChild:
    def __init__(self):
        self.sizes = []

    def setwinsize(self, rows, cols):
        self.sizes.append((rows, cols))


def panel(monkeypatch, leader=None):
    if leader is None:
        monkeypatch.delenv("CC_LHC_LEADER", raising=False)
    else:
        monkeypatch.setenv("CC_LHC_LEADER", leader)
    session = types.SimpleNamespace(capture=types.SimpleNamespace(thread_id="t" * 36),
                                    spec=types.SimpleNamespace(session_id="s" * 36),
                                    home=None, alarms=[])
    host = types.SimpleNamespace(size=lambda: (24, 80), child=FakeChild())
    p = cc_lhc.ControlPanel(session, host, handoff=None)
    p.relay = cc_lhc.Relay(0, None, 1)
    return p


@pytest.mark.parametrize("leader", [b"\x1d", b"\x1b[93;5u", b"\x1b[27;5;93~"])
def test_every_encoding_of_ctrl_bracket_opens_the_panel(monkeypatch, leader):
    p = panel(monkeypatch)
    assert p.on_input(b"abc" + leader + b"/he") == b"abc"  # what came before still reaches Claude
    assert p.open and p.line == "/he"
    assert p.on_input(b"lp\r") == b""  # typed into the panel, never into Claude
    assert "/smart-compact" in p.output[0]
    assert p.on_input(b"\x1b") == b"" and not p.open
    assert p.on_input(b"hello") == b"hello"


def test_cc_lhc_leader_changes_the_key(monkeypatch):
    p = panel(monkeypatch, "ctrl-g")
    assert p.on_input(b"\x1d") == b"\x1d"  # ctrl-] goes to Claude now
    assert p.on_input(b"\x07") == b"" and p.open


def test_partial_names_complete_and_unknown_ones_are_named(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/intro\t")
    assert p.line == "/introduction "
    p.on_input(b"\x7f\x7f\x7f\r")  # backspaces, then Enter on "/introduct": completes
    assert p.line == "/introduction "
    p.on_input(b"\r")
    assert "Smart Compact rebuilds" in p.output[0]
    p.on_input(b"/sta\r")
    assert p.output == ["/sta: could be /status, /stats"]
    p.on_input(b"/nope\r")
    assert p.output == ["unknown command /nope; /help lists them"]


def test_arrow_keys_do_not_type_into_the_panel(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/he\x1b[A\x1b[Dlp")
    assert p.line == "/help" and p.open
