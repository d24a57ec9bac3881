"""`cc-lhc preview`: the control panel's frames drawn by the session's own renderer, for
named situations and terminal sizes, in a throwaway state folder, never starting Claude."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unicodedata

import pytest

import cc_lhc
from conftest import CC_LHC


def run(*args, env=None):
    return subprocess.run([sys.executable, str(CC_LHC), "preview", *args], capture_output=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def cells_written(frame: bytes, rows: int, cols: int):
    """Where each printed character of a frame lands: (row, column) pairs, 1-based, read
    the way a terminal reads the panel's escapes. Raises when one would land past the last
    column (a wrap) or a line feed would pass the last row (a scroll)."""
    text = frame.decode("utf-8")
    r = c = 1
    cells = []
    i = 0
    while i < len(text):
        m = re.match(r"\x1b\[(\??)([0-9;]*)([A-Za-z])", text[i:])
        if m:
            if m.group(3) == "H":
                nums = [int(x) for x in m.group(2).split(";") if x] or [1, 1]
                r, c = nums[0], (nums + [1])[1]
                assert 1 <= r <= rows and 1 <= c <= cols, f"cursor sent to {r};{c}"
            i += m.end()
            continue
        ch = text[i]
        if ch == "\r":
            c = 1
        elif ch == "\n":
            r += 1
            assert r <= rows, "a line feed past the last row scrolls the screen"
        elif unicodedata.category(ch) not in ("Mn", "Me", "Cf"):
            wide = unicodedata.east_asian_width(ch) in ("W", "F")  # two cells in a terminal
            assert c + wide <= cols, f"{ch!r} written past the last column of row {r}"
            cells.append((r, c))
            c += 1 + wide
        i += 1
    return cells


@pytest.mark.parametrize("geometry", list(cc_lhc.PREVIEW_GEOMETRIES))
@pytest.mark.parametrize("fixture", list(cc_lhc.PREVIEW_FIXTURES))
def test_every_frame_fits_its_terminal(fixture, geometry, tmp_path, monkeypatch):
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "home"))
    rows, cols = cc_lhc.PREVIEW_GEOMETRIES[geometry]
    frame = cc_lhc.preview_frame(fixture, geometry)
    assert frame.startswith(b"\x1b[H\x1b[2J")
    assert cells_written(frame, rows, cols)
    shown = "\n".join(cc_lhc.frame_text(frame, rows, cols))
    assert shown.startswith("cc-lhc ")  # the title always shows, cut to the width if need be
    assert not (tmp_path / "home").exists()  # a throwaway folder of its own, not the state home


# What each situation must show at the normal size (the first words of it).
SHOWS = {
    "first-load": "Type a command (/help lists them)",
    "config-fallback": cc_lhc.MSG_CONFIG_FALLBACK[:40],
    "autocompact": "advisory: Claude native Compact may run before Smart Compact",
    "alarm": "alarm: " + cc_lhc.LiveHandoff.ALARM[:40],
    "suggestions": "/status /stats /smart-compact /smart-prune",
    "unknown": "unknown command /nope",
    "help": "/smart-compact",
    "status": "capture: 0 lines read live, healthy",
    "details": "configuration (value, source):",
}


@pytest.mark.parametrize("fixture", list(cc_lhc.PREVIEW_FIXTURES))
def test_each_situation_shows_what_it_is_about(fixture):
    shown = " ".join(line.strip() for line in cc_lhc.frame_text(cc_lhc.preview_frame(fixture, "normal"), 24, 80))
    assert SHOWS[fixture] in re.sub(r" +", " ", shown)


def test_a_narrow_panel_keeps_the_title_on_one_row_and_words_whole():
    lines = cc_lhc.frame_text(cc_lhc.preview_frame("status", "narrow"), 24, 40)
    assert lines[0].rstrip() == "cc-lhc control panel \u00b7 thread 5e1ec7ed"
    assert "retrieval: not available (cc-lhc" in lines[3]  # wrapped between words
    tiny = cc_lhc.frame_text(cc_lhc.preview_frame("alarm", "20x5"), 5, 20)
    assert tiny[0].rstrip() == "cc-lhc panel" and tiny[1].startswith("alarm: cc-lhc")
    assert tiny[4].startswith("> _")


def test_a_line_typed_past_the_width_shows_its_end_and_the_cursor_after_it(monkeypatch, tmp_path):
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    session = types.SimpleNamespace(capture=types.SimpleNamespace(thread_id="t" * 36),
                                    spec=types.SimpleNamespace(session_id="s" * 36, found={}, mod=None),
                                    home=cc_lhc.StateHome(), alarms=[],
                                    policy=cc_lhc.Policy(dict(cc_lhc.BUILTIN_POLICY), {}, []))
    p = cc_lhc.ControlPanel(session, types.SimpleNamespace(size=lambda: (5, 20)), None)
    p.relay = cc_lhc.Relay(-1, None, -1)
    p.on_input(b"\x1d/bounds 120000 240000")
    frame = bytes(p.relay.to_user)
    frame = frame[frame.rfind(b"\x1b[H"):]
    cells_written(frame, 5, 20)
    assert cc_lhc.frame_text(frame, 5, 20)[4] == "ounds 120000 240000_"  # "> /b" scrolled out


def test_the_command_lists_draws_and_prints_one_raw_frame_without_claude(tmp_path):
    marker = tmp_path / "claude-ran"
    claude = tmp_path / "claude"
    claude.write_text(f"#!/bin/sh\ntouch {marker}\n")
    claude.chmod(0o755)
    env = {"CC_LHC_HOME": str(tmp_path / "home"), "CC_LHC_CLAUDE_BIN": str(claude),
           "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    listed = run("--list", env=env)
    assert listed.returncode == 0
    names = [line.split()[1] for line in listed.stdout.decode().splitlines()]
    assert names == list(cc_lhc.PREVIEW_FIXTURES) + list(cc_lhc.PREVIEW_GEOMETRIES)
    every = run(env=env)
    assert every.returncode == 0
    assert every.stdout.decode().count("\n+") == 2 * len(cc_lhc.PREVIEW_FIXTURES) * len(cc_lhc.PREVIEW_GEOMETRIES)
    raw = run("--fixture", "alarm", "--geometry", "narrow", "--raw", env=env)
    assert raw.returncode == 0 and raw.stdout == cc_lhc.preview_frame("alarm", "narrow")
    assert run("--fixture", "alarm", "--geometry", "40x24", "--raw", env=env).stdout == raw.stdout
    for bad, why in [(["--raw", "--fixture", "help"], b"give --fixture and --geometry"),
                     (["--fixture", "nope"], b"--fixture is one of first-load"),
                     (["--geometry", "huge"], b"--geometry is one of normal, narrow, 20x5"),
                     (["extra"], b"unexpected argument 'extra'")]:
        proc = run(*bad, env=env)
        assert proc.returncode == cc_lhc.EXIT_USAGE and why in proc.stderr, (bad, proc.stderr)
    assert not marker.exists() and not (tmp_path / "home").exists()


@pytest.mark.parametrize("geometry", list(cc_lhc.PREVIEW_GEOMETRIES))
def test_wide_characters_take_two_cells_and_still_fit(geometry, monkeypatch, tmp_path):
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    rows, cols = cc_lhc.PREVIEW_GEOMETRIES[geometry]
    session = types.SimpleNamespace(capture=types.SimpleNamespace(thread_id="t" * 36),
                                    spec=types.SimpleNamespace(session_id="s" * 36, found={}, mod=None),
                                    home=cc_lhc.StateHome(), alarms=[],
                                    policy=cc_lhc.Policy(dict(cc_lhc.BUILTIN_POLICY), {}, []))
    p = cc_lhc.ControlPanel(session, types.SimpleNamespace(size=lambda: (rows, cols)), None)
    p.relay = cc_lhc.Relay(-1, None, -1)
    p.on_input(b"\x1d")
    p.output = ["exported to /home/\u5c71\u7530/\u30d7\u30ed\u30b8\u30a7\u30af\u30c8/"
                "\u65e5\u672c\u8a9e\u306e\u30d5\u30a1\u30a4\u30eb\u540d.jsonl \U0001f680 done"]
    p.on_input("\u65e5\u672c\u8a9e".encode() * 8)  # typed: a line wider than the row
    frame = bytes(p.relay.to_user)
    frame = frame[frame.rfind(b"\x1b[H\x1b[2J"):]
    cells_written(frame, rows, cols)
    # the preview's picture of it gives each wide character its two cells as well
    last = cc_lhc.frame_text(frame, rows, cols)[-1]
    assert cc_lhc.cell_width(last) <= cols and last.rstrip("_ ").endswith("\u8a9e")
