"""The control panel with the real Claude Code CLI, in tmux, as a person uses it:
/export, and what the panel says on opening (a thread's standing alarm raised by an
earlier process, the configuration fallback)."""

from __future__ import annotations

import json
import os
import stat
import sys
import time
from pathlib import Path

import cc_lhc
from realcli import CC_LHC, PROMPT, exit_cleanly, log_events, type_line


def _wait_for_capture(rc, text: str, timeout: float = 30) -> str:
    """The one thread's id, once its record holds ``text`` (Claude writes it after drawing)."""
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    deadline = time.monotonic() + timeout
    while True:
        threads = cc_lhc.Registry(home).threads() if os.path.exists(home.path("registry.sqlite")) else []
        if threads:
            store = cc_lhc.ThreadStore(home, threads[0][0])
            try:
                found = store.db.execute("SELECT count(*) FROM messages WHERE text = ?", (text,)).fetchone()[0]
            finally:
                store.close()
            if found:
                return threads[0][0]
        assert time.monotonic() < deadline, f"{text!r} never reached the thread"
        time.sleep(0.05)


def test_export_writes_the_rollout_and_the_served_view_privately(real_claude, tmux):
    real_claude.api.script(["the answer is 4242", "after the export"])
    t = tmux([sys.executable, CC_LHC], cols=220, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "what is the answer?")
    t.wait_for("the answer is 4242")
    thread = _wait_for_capture(real_claude, "the answer is 4242")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/export")
    screen = t.wait_for("served view, to read")
    (event,) = log_events(real_claude, "panel_export")
    paths = {k: Path(event[k]) for k in ("rollout", "view_jsonl", "view_markdown")}
    for path in paths.values():
        assert str(path) in screen  # every path is printed in the panel
        assert path.parent.parent == Path(real_claude.env["CC_LHC_HOME"]) / "exports"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(paths["rollout"].parent.stat().st_mode) == 0o700
    assert paths["rollout"].parent.name.startswith(thread[:8])
    # the rollout is Claude's own transcript as it stood, byte for byte
    (transcript,) = real_claude.transcripts()
    assert transcript.read_bytes().startswith(paths["rollout"].read_bytes())
    assert b"the answer is 4242" in paths["rollout"].read_bytes()
    # the served view is a rebuilt transcript (what Smart Compact would write now) ...
    records = [json.loads(line) for line in paths["view_jsonl"].read_text().splitlines()]
    assert any(r.get("type") == "assistant" for r in records)
    assert "This conversation was rebuilt by Smart Compact" in paths["view_jsonl"].read_text()
    assert "the answer is 4242" in paths["view_jsonl"].read_text()
    # ... and the same view to read
    markdown = paths["view_markdown"].read_text()
    assert markdown.startswith(f"# Served view of thread {thread}")
    assert "## assistant" in markdown and "the answer is 4242" in markdown
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    type_line(t, "go on")
    t.wait_for("after the export")
    exit_cleanly(t)
    # nothing was made a session: still one transcript, and no rebuild recorded
    assert len(real_claude.transcripts()) == 1
    registry = cc_lhc.Registry(cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"]))
    assert registry.db.execute("SELECT count(*) FROM rebuilds").fetchone()[0] == 0


def test_a_standing_alarm_and_the_config_fallback_show_when_the_panel_opens(real_claude, tmux):
    real_claude.api.script(["noted"])
    p = real_claude.run([sys.executable, CC_LHC, "-p", "remember this", "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    session = json.loads(p.stdout)["session_id"]
    # an earlier cc-lhc raised the alarm for this thread (as LiveHandoff._survive does)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    ((thread, *_),) = registry.threads()
    with cc_lhc.Tx(registry.db) as db:
        db.execute("INSERT INTO thread_alarms VALUES (?, ?, ?)",
                   (thread, cc_lhc.LiveHandoff.ALARM, cc_lhc.utc_now_iso()))
    (real_claude.cwd / ".cc-lhc.json").write_text('{"upperBoundTokens": "lots"}')
    real_claude.api.script(["back again"])
    t = tmux([sys.executable, CC_LHC, "--resume", session], cols=220, rows=32,
             env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    # Said before Claude started, and again over its screen once it has drawn it (Claude's
    # screen hid the lines said before it, until it exited)
    screen = t.wait_for(f"{cc_lhc.MSG_CONFIG_FALLBACK} (", timeout=20)  # (as said before: the problem below it)
    assert "upperBoundTokens" in screen and PROMPT.search(screen)
    t.wait_for(cc_lhc.LiveHandoff.ALARM[:60], timeout=10)
    t.send_keys("C-]")
    screen = t.wait_for("cc-lhc control panel")
    assert f"alarm: {cc_lhc.LiveHandoff.ALARM}" in screen
    assert cc_lhc.MSG_CONFIG_FALLBACK in screen and "upperBoundTokens" in screen
    type_line(t, "/details")
    t.wait_for("allowed while the thread's standing alarm lasts")
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    t.send_keys("C-]")  # opened again: the alarm stands, the fallback was said already
    screen = t.wait_for("cc-lhc control panel")
    assert f"alarm: {cc_lhc.LiveHandoff.ALARM}" in screen
    assert cc_lhc.MSG_CONFIG_FALLBACK not in screen
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    exit_cleanly(t)
    # and the launch itself said it, before Claude started
    assert cc_lhc.LiveHandoff.ALARM in t.capture(history=True).replace("\n", "")


def test_mouse_moves_and_focus_changes_leave_the_open_panel_open(real_claude, tmux):
    """Claude turns on mouse reports for every motion and focus reports, and asks its
    terminal for its version and attributes as it starts: a mouse move, a focus change or
    an answer arriving while the panel is open is not an Esc, so the panel stays open (it
    used to close at once). (The answers are sent here only in process, test_panel: Claude
    may take an answer it never asked for as typing.)"""
    real_claude.api.script(["first answer"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    t.send_text("\x1b[<35;20;10M\x1b[O\x1b[I")  # the mouse moved, the window lost focus and got it back
    type_line(t, "/help")
    screen = t.wait_for("/smart-compact")
    assert "cc-lhc control panel" in screen
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("first answer")
    exit_cleanly(t)
    sent = json.dumps([r["body"]["messages"] for r in real_claude.api.message_requests])
    assert "/help" not in sent


def test_a_smart_compact_asked_from_the_panel_that_fails_is_said_and_claudes_screen_comes_back(
        real_claude, tmux, tmp_path):
    """The replacement never comes up: the person who asked is told the Smart Compact did not
    complete, and Claude draws its screen again (it stayed blank)."""
    from realcli import wait_for_log, wait_until
    flag, wrapper = tmp_path / "fail-next", tmp_path / "claude-wrap"
    wrapper.write_text(f"#!/bin/sh\nif [ -e {flag} ]; then exit 1; fi\nexec {real_claude.claude} \"$@\"\n")
    wrapper.chmod(0o755)
    real_claude.api.script(["small answer"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env={**real_claude.env, "CC_LHC_CLAUDE_BIN": str(wrapper)},
             cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("small answer")
    flag.write_text("")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/smart-compact")
    wait_for_log(real_claude, "handoff_failed")
    said = wait_until(lambda: [e["text"] for e in log_events(real_claude, "notice")
                               if e["text"].startswith("Smart Compact did not complete")], "the failure said")
    assert "nothing was lost" in said[0]
    t.wait_for("small answer")  # Claude's screen is back
    t.wait_for("Smart Compact did not complete")  # ...and the line saying why, over it
    flag.unlink()
    exit_cleanly(t)


def test_the_config_fallback_is_shown_over_a_claude_that_is_slow_to_start(real_claude, tmux, tmp_path):
    """Said again over Claude's screen once Claude has drawn it, however long that takes
    (with a fixed 1.5 s it was written before a slow Claude's first frame, which wiped it)."""
    slow = tmp_path / "slow-claude"
    slow.write_text(f"#!/bin/sh\nsleep 3\nexec {real_claude.env['CC_LHC_CLAUDE_BIN']} \"$@\"\n")
    slow.chmod(0o755)
    (real_claude.cwd / ".cc-lhc.json").write_text('{"upperBoundTokens": "lots"}')
    t = tmux([sys.executable, CC_LHC], cols=200, rows=30, env={**real_claude.env, "CC_LHC_CLAUDE_BIN": str(slow)},
             cwd=real_claude.cwd)
    t.wait_for(PROMPT, timeout=30)
    screen = t.wait_for(f"{cc_lhc.MSG_CONFIG_FALLBACK} (", timeout=10)
    assert "upperBoundTokens" in screen
    exit_cleanly(t)
