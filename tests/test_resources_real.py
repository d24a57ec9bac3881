"""cc-lhc's state folder in trouble during a live session (the real CLI in tmux): its disk
full, as a person meets it. Claude goes on; cc-lhc says what it cannot do, never ends the
session over it, and loses nothing of what Claude wrote.

The disk is a small tmpfs mounted over the test's CC_LHC_HOME, so these tests need root and
a kernel that lets it mount one; elsewhere they are skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from fakeapi import text_reply, tool_results, tool_use_reply
from realcli import CC_LHC, OVER_USAGE, PROMPT, log_events, type_line, wait_until

SMALL = {"input_tokens": 1_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
         "output_tokens": 5}


@pytest.fixture
def full_disk(real_claude):
    """CC_LHC_HOME on a 3 MB tmpfs; ``fill()`` fills it, ``free()`` makes room again."""
    folder = real_claude.iso.lhc
    if os.geteuid() != 0:
        pytest.skip("mounting a small disk needs root")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    filler = folder / "zz-filler"

    class Disk:
        @staticmethod
        def fill():
            subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)

        @staticmethod
        def free():
            filler.unlink(missing_ok=True)

    # (the state folder's own files are made first, on the empty disk, by the launch)
    yield Disk
    Disk.free()
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def start(rc, tmux, *args):
    t = tmux(f"{sys.executable} {CC_LHC} {' '.join(args)}; echo EXIT=$?", cols=120, rows=40, env=rc.env,
             cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    return t


def test_a_disk_that_fills_during_a_swap_leaves_the_session_on_the_old_claude(real_claude, tmux, full_disk):
    """The disk under CC_LHC_HOME filled between the replacement's start and the switch: cc-lhc
    ended with `OperationalError: database or disk is full`, both Claudes gone, the person back
    at the shell. The swap is given up instead, and the session goes on where it was."""
    rc = real_claude
    rc.api.script(["ANSWER-ONE", text_reply("ANSWER-BIG", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("DEFAULT-ANSWER", usage=SMALL)
    t = start(rc, tmux)
    type_line(t, "first prompt")
    t.wait_for("ANSWER-ONE", timeout=30)
    log = rc.iso.lhc / "wrapper.log"
    spawned = threading.Event()

    def fill_once_spawned():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not spawned.is_set():
            if log.exists() and '"event": "handoff_spawned"' in log.read_text():
                full_disk.fill()
                spawned.set()
            time.sleep(0.01)
    watcher = threading.Thread(target=fill_once_spawned)
    watcher.start()
    type_line(t, "second prompt")
    t.wait_for("ANSWER-BIG", timeout=30)
    watcher.join()
    assert spawned.is_set(), "the swap began"
    time.sleep(3)  # (past the replacement's 1 s on its own, when the switch was due)
    type_line(t, "after the swap")
    screen = t.wait_for("DEFAULT-ANSWER", timeout=30)
    assert "EXIT=" not in screen
    full_disk.free()
    type_line(t, "/exit")
    t.wait_for("EXIT=0", timeout=60)


def test_claudes_retrievals_answer_when_the_disk_is_full(real_claude, tmux, full_disk):
    """Claude's get-messages, get-turns and search printed their answer and then failed
    (exit 1, `database or disk is full`) on the note of what they showed: Claude got an
    error for a read that worked. The note is left out, logged, and the answer stands."""
    rc = real_claude
    rc.api.script(["ANSWER-ONE remember ZEBRA-11"])
    t = start(rc, tmux)
    type_line(t, "first prompt")
    t.wait_for("ANSWER-ONE", timeout=30)
    time.sleep(1.5)  # (captured)
    full_disk.fill()
    rc.api.script([tool_use_reply("Bash", {"command": "cc-lhc get-messages m2", "description": "read"}),
                   tool_use_reply("Bash", {"command": "cc-lhc get-turns t1", "description": "read"}),
                   tool_use_reply("Bash", {"command": "cc-lhc search ZEBRA-11", "description": "find"}),
                   "ANSWER-TWO"])
    type_line(t, "second prompt")
    t.wait_for("ANSWER-TWO", timeout=40)
    results = [r for req in rc.api.message_requests[-3:] for r in tool_results(req["body"])]
    assert len(results) == 3 and all("ZEBRA-11" in json.dumps(r) for r in results), results
    assert not [r for r in results if r["is_error"]], results
    full_disk.free()
    type_line(t, "/exit")
    t.wait_for("EXIT=0", timeout=60)


def test_capture_that_cannot_write_is_said_and_status_shows_it(real_claude, tmux, full_disk):
    """A full disk under CC_LHC_HOME: capture failed every second with nothing on the screen,
    and /status said "healthy". It is said once, /status says since when and why, and once
    there is room again the record takes in everything Claude wrote meanwhile."""
    rc = real_claude
    rc.api.script(["ANSWER-ONE"])
    t = start(rc, tmux)
    type_line(t, "first prompt")
    t.wait_for("ANSWER-ONE", timeout=30)
    time.sleep(1.5)
    full_disk.fill()
    rc.api.script(["ANSWER-WHILE-FULL"])
    type_line(t, "second prompt")
    t.wait_for("ANSWER-WHILE-FULL", timeout=30)
    t.wait_for("cannot write its record of this session", timeout=30, history=True)
    t.send_keys("C-]")
    t.wait_for("control panel", timeout=10)
    type_line(t, "/status")
    screen = t.wait_for("capture:", timeout=10)
    line = next(x for x in screen.splitlines() if x.startswith("capture:"))
    assert "FAILING since" in line and "healthy" not in line, line
    t.send_keys("Escape")
    full_disk.free()
    t.wait_for("writes its record of this session again", timeout=30, history=True)
    type_line(t, "/exit")
    t.wait_for("EXIT=0", timeout=60)
    threads = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", threads[0]["id"]).stdout)
    assert any("ANSWER-WHILE-FULL" in (m.get("text") or "") for m in record)
    assert any("second prompt" in (m.get("text") or "") for m in record)


HOLDER = r'''
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
print("LOCKED", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
'''


def hold_thread(rc):
    """Another process holding the thread file's write lock until ``release()``."""
    import cc_lhc
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, home.path("threads", f"{thread_id}.sqlite")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "LOCKED"

    def release():
        holder.stdin.close()
        holder.wait(timeout=30)
    return release


def test_a_smart_compact_due_while_another_process_writes_the_thread_waits_and_typing_goes_on(real_claude,
                                                                                             tmux):
    """A seam over the trigger taken up while another process held the thread's write lock
    (a search in another terminal bringing its index up to date): Smart Compact began, held
    back what the person typed, and waited on the lock (30 s and more) with nothing on the
    screen. It waits for a later seam instead, and the typing reaches Claude; once the lock
    is gone the next seam is Smart Compacted."""
    rc = real_claude
    rc.api.script([tool_use_reply("Bash", {"command": "sleep 4", "description": "the slow thing"}, usage=SMALL),
                   text_reply("ANSWER-BIG", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("DEFAULT-ANSWER", usage=SMALL)
    t = start(rc, tmux, "--allowedTools", "Bash")
    type_line(t, "run the slow thing")
    t.wait_for("the slow thing")
    time.sleep(1)
    t.send_keys("x")  # (a draft: the seam over the trigger waits for it)
    t.wait_for("ANSWER-BIG", timeout=30)
    wait_until(lambda: log_events(rc, "handoff_waits_for_person"), "the seam waiting for the draft")
    release = hold_thread(rc)
    try:
        t.send_keys("BSpace")  # (the draft gone: the seam is taken up once the keys are quiet)
        wait_until(lambda: log_events(rc, "handoff_waits_for_thread"), "Smart Compact finding the thread busy")
        rc.api.script(["ANSWER-DURING-LOCK"])
        type_line(t, "QUESTION-DURING-LOCK")
        t.wait_for("ANSWER-DURING-LOCK", timeout=15)
        assert not log_events(rc, "handoff_spawned") and "not delivered" not in t.capture()
    finally:
        release()
    rc.api.script([text_reply("ANSWER-AFTER", usage=OVER_USAGE)])
    type_line(t, "after the lock")
    t.wait_for("ANSWER-AFTER", timeout=30)
    wait_until(lambda: log_events(rc, "handoff_switched") or log_events(rc, "in_process_compact_started"),
               "the next seam Smart Compacted", timeout=60)
    type_line(t, "/exit")
    t.wait_for("EXIT=0", timeout=60)


@pytest.mark.parametrize("when", ["launch", "exit"])
def test_a_wait_for_another_process_writing_the_thread_is_said(real_claude, tmux, when):
    """Another process holding the thread's write lock when the person launches onto it, or
    leaves Claude: cc-lhc waited for it (half a minute and more) on a blank or silent
    terminal. It says what it waits for, then goes on."""
    rc = real_claude
    rc.api.script(["ANSWER-ONE"])
    rc.api.responder = lambda body: text_reply("DEFAULT-ANSWER", usage=SMALL)
    assert rc.run_lhc("-p", "first prompt").returncode == 0
    if when == "launch":
        release = hold_thread(rc)
        threading.Timer(4, release).start()
        p = rc.run_lhc("-c", "-p", "second prompt")
        assert p.returncode == 0 and "DEFAULT-ANSWER" in p.stdout, p.stderr
        assert "waiting for another process that is writing thread" in p.stderr, p.stderr
        return
    t = start(rc, tmux, "-c")
    type_line(t, "second prompt")
    t.wait_for("DEFAULT-ANSWER", timeout=30)
    release = hold_thread(rc)
    try:
        type_line(t, "/exit")
        t.wait_for("waiting for another process that is writing thread", timeout=30, history=True)
    finally:
        release()
    t.wait_for("EXIT=0", timeout=60)


def test_a_prompt_typed_while_cc_lhc_was_stopped_is_in_the_session_it_swaps_to(real_claude, tmux):
    """cc-lhc stopped (SIGSTOP) while Claude answered over the trigger, and a prompt typed
    meanwhile: on SIGCONT the prompt went to Claude, but the seam before it, captured only
    then, was taken for settled (the prompt "just sent" looked recorded: a prompt, the one
    before it, had come in since the send), and the swap's session held neither the prompt
    nor its answer. A prompt counts as recorded only once Claude's record of it is newer
    than the send."""
    import os
    import signal
    from realcli import requests_holding, running
    rc = real_claude
    rc.api.script(["ANSWER-ONE"])
    rc.api.responder = lambda body: text_reply("DEFAULT-ANSWER", usage=SMALL)
    t = start(rc, tmux)
    type_line(t, "first prompt")
    t.wait_for("ANSWER-ONE", timeout=30)
    time.sleep(1)
    (pid,) = running("cc_lhc.py")
    hold = threading.Event()
    rc.api.script([dict(text_reply("ANSWER-BIG", usage=OVER_USAGE), hold=hold), "ANSWER-TYPED"])
    type_line(t, "second prompt")
    rc.api.wait_for_requests(2, answered=False)
    os.kill(pid, signal.SIGSTOP)
    try:
        hold.set()
        wait_until(lambda: "ANSWER-BIG" in (rc.project_dir / f"{rc.api.message_requests[-1]['session_id']}.jsonl")
                   .read_text(), "Claude writing its answer while cc-lhc is stopped")
        type_line(t, "TYPED-WHILE-STOPPED")
        time.sleep(2)
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: requests_holding(rc, "TYPED-WHILE-STOPPED"), "the typed prompt reaching Claude")
    t.wait_for("ANSWER-TYPED", timeout=30)
    time.sleep(3)  # (a swap at the seam after it, if one is due, is under way by now)
    rc.api.script(["ANSWER-LAST"])
    type_line(t, "last prompt")
    t.wait_for("ANSWER-LAST", timeout=60)
    body = json.dumps(requests_holding(rc, "last prompt")[-1]["body"]["messages"])
    assert "TYPED-WHILE-STOPPED" in body and "ANSWER-TYPED" in body
    type_line(t, "/exit")
    t.wait_for("EXIT=0", timeout=60)
