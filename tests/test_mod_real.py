"""The cc-lhc mod inside the real Claude Code CLI (2.1.328), in tmux against the fake API.

The mod is a resource of cc_lhc.py written under the state home at launch and handed to
Claude with --plugin-dir; cc-lhc counts it as active only after its session.start hook
has reported back through the runtime descriptor.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import tool_use_reply
from test_interactive_real import CC_LHC, PROMPT, _wait_for_log, exit_cleanly, type_line


def log_events(rc, event: str) -> list[dict]:
    log = Path(rc.env["CC_LHC_HOME"]) / "wrapper.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if f'"event": "{event}"' in line]


def details(t) -> str:
    """Open the control panel, show /details, close it again."""
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/details")
    screen = t.wait_for("running operation:")
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    return screen


def start(rc, tmux, *args, env=None):
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", *args], cols=120, rows=36,
             env={**rc.env, **(env or {})}, cwd=rc.cwd)
    t.wait_for(PROMPT)
    return t


def test_the_mod_shakes_hands_from_the_claude_child_and_details_says_so(real_claude, tmux):
    t = start(real_claude, tmux)
    _wait_for_log(real_claude, "mod_active")
    (started,) = log_events(real_claude, "child_started")
    folder = started["argv"][started["argv"].index("--plugin-dir") + 1]
    assert Path(folder).parent == Path(real_claude.env["CC_LHC_HOME"]) / "mods"
    (active,) = log_events(real_claude, "mod_active")
    assert active["claude_pid"] == started["child_pid"] and active["folder"] == folder
    assert "cc-lhc mod: active" in details(t)
    exit_cleanly(t)
    assert not log_events(real_claude, "mod_inactive")


def test_bare_gets_no_mod_and_says_why_once(real_claude, tmux):
    t = start(real_claude, tmux, "--bare")
    (started,) = log_events(real_claude, "child_started")
    assert "--plugin-dir" not in started["argv"]
    (inactive,) = log_events(real_claude, "mod_inactive")
    assert inactive["reason"] == "--bare loads no plugins"
    assert "cc-lhc mod: not in use (--bare loads no plugins)" in details(t)
    exit_cleanly(t)
    assert not log_events(real_claude, "mod_active")
