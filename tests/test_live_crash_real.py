"""The crash matrix of the live interactive swap, in tmux with the real Claude Code CLI.

A running session goes over the trigger, so cc-lhc hands it to a rebuilt one while the
person watches. $CC_LHC_FAILPOINT makes the wrapper SIGKILL itself at one step of that
swap (cc_lhc.LIVE_FAILPOINTS). Whatever the step: no Claude process outlives it, the next
launch lands on an accepted session of the same thread and Claude answers there, every
record of the original session is still in the thread, and no traceback was printed.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import text_reply
from realcli import CC_LHC, OVER_USAGE, PROMPT, log_events, type_line
from test_smart_compact_real import export, process_gone, rebuilds

SMALL = {"input_tokens": 1_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
         "output_tokens": 5}
AFTER_CRASH = "answered after the crash"

# Steps at which the replacement Claude had been started.
CANDIDATE_SPAWNED = {"after-candidate-spawn", "before-switch", "after-switch-before-accept",
                     "after-alias-advance"}


def test_live_failpoints_name_every_step_of_the_swap():
    assert set(cc_lhc.LIVE_FAILPOINTS) == {"after-pending-record", "after-rollout-write",
                                           "after-candidate-spawn", "before-switch",
                                           "after-switch-before-accept", "after-alias-advance"}
    # every one is a real place in the code, not only a name in a list
    source = Path(cc_lhc.__file__).read_text()
    for point in cc_lhc.LIVE_FAILPOINTS:
        assert f'failpoint("{point}")' in source, point


def original_uuids(path: Path) -> set[str]:
    """uuids of the conversation records (prompts, answers) Claude wrote into a transcript."""
    found = set()
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        if rec.get("type") in ("user", "assistant") and rec.get("uuid"):
            found.add(rec["uuid"])
    return found


def died_or_deferred(rc, t, timeout: float = 40) -> str:
    """Wait until cc-lhc died, or said the swap's acceptance waits for the session's end."""
    log = rc.iso.lhc / "wrapper.log"
    deadline = time.monotonic() + timeout
    while True:
        if t.exit_status() is not None:
            return "died"
        if '"event": "handoff_acceptance_deferred"' in log.read_text():
            return "deferred"
        assert time.monotonic() < deadline, f"cc-lhc neither died nor deferred in {timeout}s"
        time.sleep(0.05)


def crash_during_the_swap(rc, tmux, point: str):
    """Run an interactive session until cc-lhc kills itself at `point`; returns the pane."""
    rc.api.script([text_reply("a very long answer", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply(AFTER_CRASH, usage=SMALL)
    env = dict(rc.env, **{cc_lhc.FAILPOINT_ENV: point})
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "go long")
    if point == "after-alias-advance" and died_or_deferred(rc, t) == "deferred":
        # Acceptance happens at the switch when the replacement has already written to its
        # transcript (the pinned CLI does so as it opens a session), else when the session
        # ends: leaving reaches the step then.
        type_line(t, "/exit")
    assert t.wait_exit(timeout=40) == 128 + signal.SIGKILL
    assert [e["name"] for e in log_events(rc, "failpoint")] == [point]
    return t


@pytest.mark.parametrize("point", cc_lhc.LIVE_FAILPOINTS)
def test_live_swap_crash_matrix(real_claude, tmux, point):
    rc = real_claude
    t = crash_during_the_swap(rc, tmux, point)

    # (1) no Claude is left behind: neither the child that was running nor its replacement
    (started,) = log_events(rc, "child_started")
    old = started["session"]
    spawned = log_events(rc, "handoff_spawned")
    assert len(spawned) == (1 if point in CANDIDATE_SPAWNED else 0)
    for pid in [started["child_pid"]] + [e["candidate_pid"] for e in spawned]:
        assert process_gone(pid), f"claude (pid {pid}) outlived the killed cc-lhc"

    [(live_new, from_session, _status)] = rebuilds(rc)
    assert from_session == old
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    kept = original_uuids(rc.project_dir / f"{old}.jsonl")
    assert kept  # the prompt and the answer at least

    # (2) the next launch is on an accepted session of the same thread, and Claude answers
    n = len(rc.api.message_requests)
    again = rc.run_lhc("--resume", old, "-p", "next")
    assert again.returncode == 0, again.stderr
    assert AFTER_CRASH in again.stdout
    [sent] = rc.api.message_requests[n:]
    registry = cc_lhc.Registry(cc_lhc.StateHome(rc.env["CC_LHC_HOME"]))
    current = registry.current_session(thread["id"])
    assert sent["session_id"] == current
    assert registry.thread_for_session(current) == thread["id"]
    statuses = {s: st for s, _f, st in rebuilds(rc)}
    assert "pending" not in statuses.values()
    abandoned = rc.iso.lhc / "abandoned-rebuilds"
    moved = sorted(p.name for p in abandoned.rglob("*.jsonl")) if abandoned.exists() else []
    if point == "after-alias-advance":
        # acceptance was recorded before the kill: the thread stays on the rebuild
        assert current == live_new and statuses[live_new] == "accepted"
        assert "was rolled back" not in again.stderr
        assert moved == []
    else:
        # rolled back to the original session, which was over the trigger, so this launch
        # compacted it afresh and Claude accepted that rebuild
        assert statuses[live_new] == "abandoned"
        assert "was rolled back" in again.stderr
        assert current not in (old, live_new) and statuses[current] == "accepted"
        assert not (rc.project_dir / f"{live_new}.jsonl").exists()
        # an unused rebuild is moved aside, not deleted (none exists before it was written)
        assert moved == ([] if point == "after-pending-record" else [f"{live_new}.jsonl"])

    # what the dead wrapper left for retrieval (its descriptors and shims) is cleaned up
    runtime = rc.iso.lhc / "runtime"
    assert not list(runtime.glob("*.json")) and not list(runtime.glob("bin-*"))

    # (3) nothing captured is lost: every record of the original session is in the thread
    record = export(rc, thread["id"])
    exported = {m["source_uuid"] for m in record if m["source_session"] == old}
    assert kept <= exported, f"lost from the thread: {sorted(kept - exported)}"
    texts = [m.get("text") for m in record]
    assert {"go long", "a very long answer", "next", AFTER_CRASH} <= set(texts)

    # (4) no traceback, neither on the crashed screen nor from the next launch
    assert "Traceback" not in t.capture(history=True)
    assert "Traceback" not in again.stderr
    assert "Traceback" not in (rc.iso.lhc / "wrapper.log").read_text()
