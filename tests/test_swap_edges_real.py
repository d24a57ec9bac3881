"""What a person does while Smart Compact runs, with the real CLI in tmux: the panel open
through a swap, the terminal resized mid-swap and with the panel open, and an answer over
the trigger right after an in-process compact."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
import threading

import cc_lhc
from fakeapi import text_reply, user_texts
from realcli import (CC_LHC, OVER_USAGE, PROMPT, exit_cleanly, log_events, type_line, wait_for_log,
                     wait_until)

SMALL = {"input_tokens": 1_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
         "output_tokens": 5}


def answers(rc, table: dict, default="plain"):
    """The fake API answers by the first key of ``table`` found in the newest user text."""
    def answer(body):
        texts = user_texts(body)
        last = texts[-1] if texts else ""
        for key, reply in table.items():
            if key in last:
                return reply() if callable(reply) else reply
        return default
    rc.api.responder = answer


def start(rc, tmux, mod="off", cols=120, rows=32):
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=cols, rows=rows,
             env={**rc.env, "CC_LHC_MOD": mod}, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    if mod == "on":
        wait_for_log(rc, "mod_active")
    return t


def pty_size(pid: int):
    """(rows, cols) of the terminal process ``pid`` has as its stdin."""
    fd = os.open(f"/proc/{pid}/fd/0", os.O_RDONLY | os.O_NOCTTY)
    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        return rows, cols
    finally:
        os.close(fd)


def test_the_panel_open_through_an_automatic_swap_closes_on_esc_and_shows_the_replacement(
        real_claude, tmux):
    rc, hold = real_claude, threading.Event()
    answers(rc, {"first prompt": lambda: dict(text_reply("first answer", usage=OVER_USAGE), hold=hold),
                 "next one": text_reply("after the swap", usage=SMALL)})
    t = start(rc, tmux)
    type_line(t, "first prompt")
    rc.api.wait_for_requests(1, answered=False)
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    hold.set()
    wait_for_log(rc, "handoff_spawned", timeout=60)
    t.send_keys("Escape")  # while the swap runs: the panel's key, not input for Claude
    wait_for_log(rc, "handoff_switched", timeout=60)
    screen = t.wait_for(PROMPT, timeout=30)
    assert "cc-lhc control panel" not in screen and "\ufffd" not in screen
    type_line(t, "next one")
    t.wait_for("after the swap", timeout=30)
    exit_cleanly(t)
    history = t.capture(history=True).replace("\n", "")
    assert cc_lhc.LiveHandoff.NOTICE not in history  # nothing typed for Claude was dropped
    assert not [e for e in log_events(rc, "notice") if cc_lhc.LiveHandoff.NOTICE in e["text"]]


def test_a_resize_while_the_replacement_starts_reaches_it(real_claude, tmux):
    rc = real_claude
    answers(rc, {"first prompt": text_reply("first answer", usage=OVER_USAGE),
                 "next one": text_reply("after the swap", usage=SMALL)})
    t = start(rc, tmux, cols=120, rows=32)
    type_line(t, "first prompt")
    wait_for_log(rc, "handoff_spawned", timeout=60)
    t.resize(80, 24)
    wait_for_log(rc, "handoff_switched", timeout=60)
    (switched,) = log_events(rc, "handoff_switched")
    assert pty_size(switched["new_pid"]) == (24, 80)
    type_line(t, "next one")
    t.wait_for("after the swap", timeout=30)
    exit_cleanly(t)


def test_a_resize_with_the_panel_open_draws_the_panel_again_for_the_new_size(real_claude, tmux):
    rc = real_claude
    answers(rc, {"hello": text_reply("first answer", usage=SMALL)})
    t = start(rc, tmux, cols=120, rows=32)
    type_line(t, "hello")
    t.wait_for("first answer")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/help")
    t.wait_for("/smart-compact")
    t.resize(40, 20)
    # drawn for 40 columns: the title shortened to fit (the whole one is 57 wide), the help
    # wrapped, the prompt on the last row
    wait_until(lambda: t.capture().splitlines()[0].rstrip().startswith("cc-lhc control panel")
               and "session" not in t.capture().splitlines()[0], "the panel drawn for 40 columns")
    rows = t.capture().splitlines()
    assert all(len(r) <= 40 for r in rows) and rows[-1].startswith(">") and len(rows) <= 20
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    child = log_events(rc, "child_started")[0]["child_pid"]
    # (closing the panel over Claude's full screen nudges its width to make it repaint)
    wait_until(lambda: pty_size(child) == (20, 40), "Claude at the terminal's new size")
    exit_cleanly(t)


def test_an_answer_over_the_trigger_right_after_an_in_process_compact_is_compacted_too(
        real_claude, tmux):
    """The first answer on the compacted conversation is over the trigger again (a turn
    that read a lot): that seam came while the first compact waited for its acceptance, and
    is looked at once it is accepted."""
    rc = real_claude
    answers(rc, {"first prompt": text_reply("ANSWER-ONE", usage=OVER_USAGE),
                 "second prompt": text_reply("ANSWER-TWO", usage=OVER_USAGE),
                 "third prompt": text_reply("ANSWER-THREE", usage=SMALL)})
    t = start(rc, tmux, mod="on")
    type_line(t, "first prompt")
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    t.wait_for(PROMPT)
    type_line(t, "second prompt")
    t.wait_for("ANSWER-TWO", timeout=30)
    wait_for_log(rc, "in_process_compact_started", count=2, timeout=60)
    wait_for_log(rc, "in_process_compact_served", count=2, timeout=60)
    type_line(t, "third prompt")
    t.wait_for("ANSWER-THREE", timeout=30)
    exit_cleanly(t)
