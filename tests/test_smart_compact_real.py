"""Smart Compact before a one-shot launches, with the real Claude Code CLI and the fake API.

The fake API makes a reply report any usage we like; Claude copies it onto the transcript,
and the next `cc-lhc --resume <id> -p ...` reads it from there. Covered here: the
acceptance scenario of issue 5, below/above a configured trigger, the crash matrix (cc-lhc
SIGKILLs itself at every failpoint, the next launch recovers), 20 one-shots racing for one
thread, orphaned rebuilt sessions, stale runtime descriptors, and an unavailable receipt
store.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import cc_lhc
from conftest import REPO
from fakeapi import error_reply, text_reply, tool_use_reply
from realcli import log_events

ROLLBACK = REPO / "scripts" / "rollback-unaccepted.py"


def usage(total: int) -> dict:
    """A reply usage whose provider-reported context (input + cache) is `total` tokens."""
    return {"input_tokens": total - 1_000, "cache_creation_input_tokens": 600,
            "cache_read_input_tokens": 400, "output_tokens": 5}


OVER = usage(371_000)     # over the built-in 360k trigger
MIDDLE = usage(120_000)   # under the built-in trigger, over a configured 100k one
SMALL = usage(2_000)
SMALL_REPLY = "fine answer from the fake API"


# -- helpers ---------------------------------------------------------------------------------

def lhc(rc, *args, env=None, timeout=60) -> subprocess.CompletedProcess:
    return rc.run_lhc(*args, env=env, timeout=timeout)


def ok(p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def start_thread(rc, context: dict, with_tool: bool = False) -> str:
    """A cc-lhc thread whose newest reply reports `context` usage; returns its session id.

    After this, every further request is answered with a small reply (a responder, so
    the number of requests a test makes does not matter).
    """
    rc.api.script([text_reply("first answer, remember 777", usage=context if not with_tool else SMALL)])
    sid = json.loads(ok(lhc(rc, "-p", "hello one", "--output-format", "json")).stdout)["session_id"]
    if with_tool:
        rc.api.script([tool_use_reply("Bash", {"command": "seq 1 300", "description": "numbers"}),
                       text_reply("second answer", usage=context)])
        ok(lhc(rc, "--resume", sid, "-p", "hello two", "--allowedTools", "Bash"))
    rc.api.responder = lambda body: text_reply(SMALL_REPLY, usage=SMALL)
    return sid


def threads(rc) -> list[dict]:
    return json.loads(ok(lhc(rc, "threads", "--json")).stdout)


def export(rc, thread_id: str) -> list[dict]:
    return json.loads(ok(lhc(rc, "export", thread_id, "--format", "json")).stdout)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def registry_rows(rc, sql: str, args=()) -> list[tuple]:
    db = sqlite3.connect(rc.iso.lhc / "registry.sqlite")
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def rebuilds(rc) -> list[tuple]:
    """(session_id, from_session, status) of every rebuild, oldest first."""
    return registry_rows(rc, "SELECT session_id, from_session, status FROM rebuilds ORDER BY rowid")


def first_text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return next((b.get("text", "") for b in content if b.get("type") == "text"), "")


def all_text(body: dict) -> str:
    return json.dumps(body.get("messages", []))


def rollback_dry_run(rc) -> subprocess.CompletedProcess:
    return ok(rc.run([sys.executable, ROLLBACK]))


def process_gone(pid: int, timeout: float = 10) -> bool:
    """True once pid has exited (a zombie waiting for a reaper counts as gone)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.05)
    return False


# -- (a) the acceptance scenario ------------------------------------------------------------------

def test_over_trigger_oneshot_runs_on_rebuilt_session(real_claude):
    rc = real_claude
    old = start_thread(rc, OVER, with_tool=True)
    old_path = rc.project_dir / f"{old}.jsonl"
    before_sha = sha(old_path)
    thread_id = threads(rc)[0]["id"]
    record_before = export(rc, thread_id)
    n = len(rc.api.message_requests)

    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert SMALL_REPLY in p.stdout                       # the prompt was answered
    assert "Smart Compact" in p.stderr
    sent = rc.api.message_requests[n:]
    assert len(sent) == 1, "the prompt is sent exactly once"
    new = sent[0]["session_id"]
    assert new and new != old
    body = sent[0]["body"]
    assert first_text(body["messages"][0]).startswith(cc_lhc.REBUILT_MARKER)
    assert "remember 777" in all_text(body)              # the rebuilt view carries the history
    last_user = [m for m in body["messages"] if m["role"] == "user"][-1]
    assert "next" in json.dumps(last_user)               # ...and then the prompt, once
    assert sha(old_path) == before_sha                   # old transcript byte-for-byte unchanged
    assert (rc.project_dir / f"{new}.jsonl").exists()

    [row] = threads(rc)
    assert row["id"] == thread_id and row["current_session"] == new
    assert rebuilds(rc) == [(new, old, "accepted")]
    record_after = export(rc, thread_id)
    assert record_after[:len(record_before)] == record_before
    added = record_after[len(record_before):]
    assert [m["text"] for m in added if m["kind"] == "user_text"] == ["next"]
    assert all(m["source_session"] == new for m in added)

    # The governor's decision left a durable receipt with its outcome.
    db = sqlite3.connect(rc.iso.lhc / "cc-lhc.sqlite")
    try:
        receipts = db.execute("SELECT session_id, state, pressure, would_mutate, outcome "
                              "FROM cc_governor_receipts WHERE session_id = ? ORDER BY id", (old,)).fetchall()
    finally:
        db.close()
    # (the earlier `hello two` one-shot was classified healthy: one receipt each)
    assert [(r[1], r[3], r[4]) for r in receipts] == [
        (cc_lhc.STATE_HEALTHY, 0, "no_action"), (cc_lhc.STATE_OVER_SETTLED, 1, f"rebuilt:{new}")]
    assert receipts[1][2] >= 371_000

    # Later, the old id lands on the new session.
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "later"))
    assert SMALL_REPLY in p.stdout
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [new]
    assert sha(old_path) == before_sha
    assert threads(rc)[0]["current_session"] == new
    assert len(rebuilds(rc)) == 1                         # the rebuilt session is healthy: no second rebuild
    assert "nothing to do" in rollback_dry_run(rc).stdout


@pytest.mark.parametrize("how", ["max-turns", "json-schema"])
def test_a_one_shot_loop_that_ends_on_claudes_own_record_is_compacted_at_the_next_launch(real_claude, how):
    """A CI loop of `-p --max-turns 1` (or `--json-schema`) one-shots: each run ends after a
    tool's result, on a record of Claude Code's own, not on an answer. Over the trigger, the
    next one-shot is Smart Compacted (each said "not at a settled seam ... Smart Compact runs
    on the next invocation" and none ever did)."""
    rc = real_claude
    if how == "max-turns":
        args = ["--max-turns", "1", "--allowedTools", "Bash"]
        rc.api.responder = lambda body: tool_use_reply("Bash", {"command": "echo step", "description": "a step"},
                                                       usage=OVER)
    else:
        args = ["--json-schema", '{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}']
        rc.api.responder = lambda body: (tool_use_reply("StructuredOutput", {"name": "x"}, usage=OVER)
                                         if "[cc-lhc]" not in json.dumps(body["messages"][:1])
                                         else tool_use_reply("StructuredOutput", {"name": "y"}))
    first = lhc(rc, "-p", "first step", *args, "--output-format", "json")
    old = json.loads(first.stdout)["session_id"]
    n = len(rc.api.message_requests)
    p = lhc(rc, "--continue", "-p", "next step", *args, "--output-format", "json")
    assert "not at a settled seam" not in p.stderr, p.stderr
    assert "Smart Compact" in p.stderr, p.stderr
    sent = rc.api.message_requests[n]
    assert sent["session_id"] != old
    assert first_text(sent["body"]["messages"][0]).startswith(cc_lhc.REBUILT_MARKER)
    assert "first step" in json.dumps(sent["body"]) and "next step" in json.dumps(sent["body"])


def test_a_failed_request_does_not_make_a_full_session_read_as_empty(real_claude):
    """A request the API refuses (too long here) leaves Claude's own error record, with a
    usage of zeros, as the session's newest response. That is no provider reading: the
    next one-shot still reads the session as over the trigger and rebuilds it."""
    rc = real_claude
    old = start_thread(rc, OVER)
    rc.api.script([error_reply(400, "prompt is too long: 1000123 tokens > 1000000 maximum")])
    failed = lhc(rc, "--resume", old, "-p", "one more", "--lhc-trigger", "2000000")
    assert failed.returncode != 0 and "Smart Compact" not in failed.stderr
    rc.api.responder = lambda body: text_reply(SMALL_REPLY, usage=SMALL)
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "and now"))
    assert SMALL_REPLY in p.stdout and "Smart Compact" in p.stderr
    assert "371,000" in p.stderr, p.stderr               # the reading is the last real answer's
    [sent] = rc.api.message_requests[n:]
    assert sent["session_id"] != old
    assert first_text(sent["body"]["messages"][0]).startswith(cc_lhc.REBUILT_MARKER)


# -- (b), (c) the trigger ---------------------------------------------------------------------------

def test_below_trigger_no_rebuild(real_claude):
    rc = real_claude
    old = start_thread(rc, MIDDLE)
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert SMALL_REPLY in p.stdout and "Smart Compact" not in p.stderr
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [old]
    assert threads(rc)[0]["current_session"] == old
    assert rebuilds(rc) == []
    assert [p.name for p in rc.project_dir.glob("*.jsonl")] == [f"{old}.jsonl"]


@pytest.mark.parametrize("where", ["flag", "project-file"])
def test_configured_lower_trigger(real_claude, where):
    rc = real_claude
    old = start_thread(rc, MIDDLE)   # 120k: healthy under the built-in 360k trigger
    args = ["--resume", old, "-p", "next"]
    if where == "flag":
        args += ["--lhc-target", "30000", "--lhc-trigger", "100000"]
    else:
        (rc.cwd / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": 30000,
                                                         "upperBoundTokens": 100000}))
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, *args))
    assert SMALL_REPLY in p.stdout
    assert "100,000" in p.stderr, p.stderr               # the reading names the configured trigger
    [sent] = rc.api.message_requests[n:]
    new = sent["session_id"]
    assert new != old
    assert first_text(sent["body"]["messages"][0]).startswith(cc_lhc.REBUILT_MARKER)
    assert threads(rc)[0]["current_session"] == new
    assert rebuilds(rc) == [(new, old, "accepted")]


@pytest.mark.parametrize("cfg, named", [
    ({"lowerBoundTokens": 1, "upperBoundTokens": 100_000}, "(lowerBoundTokens)"),
    ({"lowerBoundTokens": 30_000, "upperBoundTokens": 100_000, "minRunwayTokens": 99_900},
     "upperBoundTokens 100,000 less minRunwayTokens 99,900")])
def test_a_target_with_no_room_for_a_turn_is_said_and_claude_keeps_its_session(real_claude, cfg, named):
    """A target too small for any turn beside the view's header (a tiny target, or a runway
    that leaves the trigger almost nothing) made Smart Compact serve a session holding none
    of the conversation, without a word. It does not run then: the launch says why, naming
    the setting, and Claude goes on in the session it was on, the conversation whole."""
    rc = real_claude
    old = start_thread(rc, MIDDLE)
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(cfg))
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "what number did I ask you to remember?"))
    assert "Smart Compact did not run: a view of thread" in p.stderr and "holds no turn" in p.stderr, p.stderr
    assert named in p.stderr and "launching on the current session" in p.stderr
    [sent] = rc.api.message_requests[n:]
    assert sent["session_id"] == old and "hello one" in json.dumps(sent["body"]["messages"])
    assert rebuilds(rc) == [] and [p.name for p in rc.project_dir.glob("*.jsonl")] == [f"{old}.jsonl"]
    assert [e["why"] for e in log_events(rc, "view_holds_no_turn")] and threads(rc)[0]["current_session"] == old


def test_a_session_to_write_again_with_no_room_for_a_turn_is_refused_not_launched(real_claude):
    """A session whose transcript Claude Code deleted is written again from its thread; with
    a target that holds no turn, the launch said "launching on the current session", and
    Claude, given a session that no longer exists, ended with "No conversation found". It is
    refused before Claude starts (exit 2), naming the setting, and the thread is kept."""
    rc = real_claude
    old = start_thread(rc, SMALL)
    (rc.project_dir / f"{old}.jsonl").unlink()
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": 1, "upperBoundTokens": 100_000}))
    n = len(rc.api.message_requests)
    p = lhc(rc, "--resume", old, "-p", "what number did I ask you to remember?")
    assert p.returncode == 2, p.stderr
    assert f"session {old} has to be written again from thread" in p.stderr and "holds no turn" in p.stderr
    assert "launching on the current session" not in p.stderr and len(rc.api.message_requests) == n
    assert any("777" in (m.get("text") or "") for m in export(rc, threads(rc)[0]["id"]))


def test_over_trigger_but_left_mid_turn_launches_on_the_resumed_session(real_claude):
    rc = real_claude
    old = start_thread(rc, SMALL)
    path = rc.project_dir / f"{old}.jsonl"
    lines = path.read_text().splitlines()
    last = json.loads(next(line for line in reversed(lines) if json.loads(line).get("type") == "assistant"))
    # Claude was killed while a tool ran: the newest response asked for a tool and no
    # result followed. Its usage is over the trigger.
    last.update(uuid=str(uuid.uuid4()), parentUuid=last["uuid"])
    last["message"] = dict(last["message"], id="msg_midturn", stop_reason="tool_use", usage=OVER,
                           content=[{"type": "tool_use", "id": "toolu_midturn", "name": "Bash",
                                     "input": {"command": "sleep 100"}}])
    path.write_text("\n".join(lines + [json.dumps(last)]) + "\n")
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert SMALL_REPLY in p.stdout
    assert "not at a settled seam" in p.stderr and "mid-turn" in p.stderr, p.stderr
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [old]
    assert rebuilds(rc) == [] and threads(rc)[0]["current_session"] == old


def test_retrieval_works_inside_the_rebuilt_oneshot(real_claude):
    rc = real_claude
    old = start_thread(rc, OVER)
    rc.api.script([tool_use_reply("Bash", {"command": "cc-lhc get-messages m1",
                                           "description": "read back"}), "read it"])
    p = ok(lhc(rc, "--resume", old, "-p", "what was the first prompt?", "--allowedTools", "Bash"))
    assert "Smart Compact" in p.stderr
    final = rc.api.message_requests[-1]
    assert final["session_id"] != old
    result = json.dumps(final["body"]["messages"][-1])
    assert "retrieval refused" not in result
    assert "hello one" in result


# -- (d) the crash matrix ---------------------------------------------------------------------------

# Failpoints after which the rebuilt transcript exists but its acceptance was never recorded.
UNUSED_REBUILD = {"after-rollout-write", "after-spawn", "before-acceptance",
                  "after-acceptance-before-alias"}
AFTER_SPAWN = {"after-spawn", "before-acceptance", "after-acceptance-before-alias",
               "after-alias-advance"}


def test_failpoints_cover_every_step():
    assert set(cc_lhc.FAILPOINTS) >= {"after-pending-record", "after-rollout-write", "after-spawn",
                                      "before-acceptance", "after-acceptance-before-alias",
                                      "after-alias-advance"}
    assert UNUSED_REBUILD | AFTER_SPAWN | {"after-pending-record"} >= set(cc_lhc.FAILPOINTS)


@pytest.mark.parametrize("point", cc_lhc.FAILPOINTS)
def test_crash_matrix(real_claude, point):
    rc = real_claude
    old = start_thread(rc, OVER)
    old_path = rc.project_dir / f"{old}.jsonl"
    before_sha = sha(old_path)
    thread_id = threads(rc)[0]["id"]
    record_before = export(rc, thread_id)

    crashed = lhc(rc, "--resume", old, "-p", "next", env={cc_lhc.FAILPOINT_ENV: point})
    assert crashed.returncode == -9, (crashed.returncode, crashed.stderr)
    assert sha(old_path) == before_sha
    [(new, from_session, status)] = rebuilds(rc)
    assert from_session == old
    advanced = point == "after-alias-advance"
    assert status == ("accepted" if advanced else "pending")
    # Right after the kill the thread is on an accepted session already.
    assert threads(rc)[0]["current_session"] == (new if advanced else old)

    # Claude dies with the wrapper.
    children = [e["child_pid"] for e in log_events(rc, "child_started") if e.get("session") == new]
    assert len(children) == (1 if point in AFTER_SPAWN else 0)
    for pid in children:
        assert process_gone(pid), f"claude (pid {pid}) outlived the killed cc-lhc"
    stale = list((rc.iso.lhc / "runtime").glob("*.json"))
    assert bool(stale) == (point in AFTER_SPAWN)         # the dead owner's descriptor is left over

    # The rollback script sees what a crash left (dry run changes nothing).
    dry = rollback_dry_run(rc).stdout
    prefix = cc_lhc.HostDB(cc_lhc.StateHome(rc.env["CC_LHC_HOME"])).session(new)
    written = (prefix is not None and (rc.project_dir / f"{new}.jsonl").exists()
               and (rc.project_dir / f"{new}.jsonl").stat().st_size > prefix["replayed_prefix_bytes"])
    # A turn of Claude's own in the rebuild (here the one-shot's answer, once Claude has
    # exited) means the rebuild was used: recovery completes the swap instead of rolling back.
    used = written and any(
        r.get("type") in ("user", "assistant") and not r.get("isMeta")
        for r in map(json.loads, (rc.project_dir / f"{new}.jsonl").read_bytes()[
            prefix["replayed_prefix_bytes"]:].splitlines()) if isinstance(r, dict))
    if point in ("before-acceptance", "after-acceptance-before-alias"):
        assert used
    if advanced:
        assert "nothing to do" in dry
    elif written:
        # Claude wrote into the rebuild before the kill: the script leaves it for cc-lhc,
        # whose recovery keeps what it holds (checked below)
        assert "holding records Claude wrote" in dry and new in dry
    else:
        assert "would roll back" in dry and new in dry

    # Launch again, without the failpoint, by the old id.
    n = len(rc.api.message_requests)
    again = ok(lhc(rc, "--resume", old, "-p", "again"))
    assert SMALL_REPLY in again.stdout
    [sent] = rc.api.message_requests[n:]
    current = threads(rc)[0]["current_session"]
    assert sent["session_id"] == current
    statuses = dict((s, st) for s, _f, st in rebuilds(rc))
    assert "pending" not in statuses.values()
    if advanced:
        assert current == new                             # it stays on the accepted rebuild
        assert "was rolled back" not in again.stderr
    elif used:
        assert current == new and statuses[new] == "accepted"
        assert "was completed" in again.stderr and "was rolled back" not in again.stderr
    else:
        assert statuses[new] == "abandoned"
        assert "was rolled back" in again.stderr
        # the old session was over the trigger, so this launch compacted afresh
        assert current not in (old, new) and statuses[current] == "accepted"
    assert (rc.project_dir / f"{current}.jsonl").exists()
    assert sha(old_path) == before_sha

    abandoned = rc.iso.lhc / "abandoned-rebuilds"
    moved = list(abandoned.rglob("*.jsonl")) if abandoned.exists() else []
    if point in UNUSED_REBUILD and not used:
        assert [p.name for p in moved] == [f"{new}.jsonl"]
        assert moved[0].parent.name == cc_lhc.project_slug(str(rc.cwd))
        assert not (rc.project_dir / f"{new}.jsonl").exists()
    else:
        assert moved == []

    # No record lost: everything exported before is still there under the same labels.
    record_after = export(rc, thread_id)
    assert record_after[:len(record_before)] == record_before
    assert "again" in [m.get("text") for m in record_after[len(record_before):]]

    assert not list((rc.iso.lhc / "runtime").glob("*.json")), "stale descriptors were not removed"
    assert not list((rc.iso.lhc / "runtime").glob("bin-*"))
    assert "nothing to do" in rollback_dry_run(rc).stdout


def test_kill_while_claude_works_in_an_unaccepted_rebuild(real_claude):
    """A one-shot accepts its rebuild when Claude exits. Killed while Claude is mid-turn in
    it, the next launch continues in that rebuild, which holds the turn's work, instead
    of rolling back to the oversized session without it."""
    rc = real_claude
    old = start_thread(rc, OVER)
    thread_id = threads(rc)[0]["id"]
    rc.api.script([tool_use_reply("Bash", {"command": "echo STEP-ONE-OUTPUT-4417", "description": "one"},
                                  text="working on step one"),
                   # (not a bare `sleep`, which Claude Code refuses at once)
                   tool_use_reply("Bash", {"command": "python3 -c 'import time; time.sleep(120)'",
                                           "description": "long"}, usage=SMALL)])
    p = subprocess.Popen(rc.lhc_argv("--resume", old, "-p", "do both steps", "--allowedTools", "Bash"),
                         env=rc.env, cwd=rc.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    try:
        [(new, _from, status)] = wait_for_rebuild(rc)
        path = rc.project_dir / f"{new}.jsonl"
        deadline = time.monotonic() + 60
        while b"time.sleep(120)" not in (path.read_bytes() if path.exists() else b""):
            assert p.poll() is None and time.monotonic() < deadline, "Claude never started step two"
            time.sleep(0.05)
    finally:
        p.kill()
        p.communicate()
    assert status == "pending" and threads(rc)[0]["current_session"] == old

    n = len(rc.api.message_requests)
    again = ok(lhc(rc, "--resume", old, "-p", "and now?"))
    assert "was completed" in again.stderr and "rolled back" not in again.stderr, again.stderr
    [sent] = rc.api.message_requests[n:]
    assert sent["session_id"] == new                      # the rebuild, not the oversized session
    assert "STEP-ONE-OUTPUT-4417" in all_text(sent["body"])
    assert threads(rc)[0]["current_session"] == new
    assert dict((s, st) for s, _f, st in rebuilds(rc)) == {new: "accepted"}
    assert not (rc.iso.lhc / "abandoned-rebuilds").exists() or not list(
        (rc.iso.lhc / "abandoned-rebuilds").rglob("*.jsonl"))
    record = export(rc, thread_id)
    assert "STEP-ONE-OUTPUT-4417" in json.dumps(record)
    assert "and now?" in [m.get("text") for m in record]


def wait_for_rebuild(rc, timeout: float = 60) -> list[tuple]:
    deadline = time.monotonic() + timeout
    while not rebuilds(rc):
        assert time.monotonic() < deadline, f"no rebuild was recorded in {timeout}s"
        time.sleep(0.05)
    return rebuilds(rc)


# -- (e) single ownership ---------------------------------------------------------------------------

def race(rc, session: str, count: int, reply: str) -> tuple[subprocess.Popen, list]:
    """Start `count` one-shots on `session` at once while the first request is held.

    Returns the one that ran (finished) and the (returncode, stdout, stderr) of the others,
    collected while the winner was still running."""
    n = len(rc.api.message_requests)
    hold = threading.Event()
    rc.api.script([text_reply(reply, usage=SMALL, hold=hold)])
    procs = [subprocess.Popen(rc.lhc_argv("--resume", session, "-p", f"racer {i}"), env=rc.env,
                              cwd=rc.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(count)]
    try:
        rc.api.wait_for_requests(n + 1, timeout=60, answered=False)
        deadline = time.monotonic() + 60
        while sum(p.poll() is not None for p in procs) < count - 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        running = [p for p in procs if p.poll() is None]
        assert len(running) == 1, f"{len(running)} one-shots still running"
        losers = [(p.returncode, *p.communicate()) for p in procs if p is not running[0]]
    finally:
        hold.set()
    winner = running[0]
    out, err = winner.communicate(timeout=60)
    assert winner.returncode == 0, err
    assert reply in out
    for code, lout, lerr in losers:
        assert code == 2, lerr
        assert "already in use" in lerr and "nothing was queued" in lerr
        assert lout == ""
    assert len(rc.api.message_requests) == n + 1            # nothing queued, nothing re-sent
    return winner, losers


def test_twenty_oneshots_at_once_exactly_one_runs(real_claude):
    rc = real_claude
    old = start_thread(rc, OVER)
    thread_id = threads(rc)[0]["id"]
    record_before = export(rc, thread_id)
    race(rc, old, 20, "the one that ran")
    sent = rc.api.message_requests[-1]
    [(new, from_session, status)] = rebuilds(rc)
    assert (from_session, status) == (old, "accepted") and sent["session_id"] == new
    assert threads(rc)[0]["current_session"] == new
    record_after = export(rc, thread_id)
    assert record_after[:len(record_before)] == record_before
    added = record_after[len(record_before):]
    assert [m["text"] for m in added if m["kind"] == "user_text"] in ([f"racer {i}"] for i in range(20))
    assert "the one that ran" in [m.get("text") for m in added]


def test_oneshots_racing_to_adopt_a_plain_claude_session(real_claude):
    rc = real_claude
    rc.api.script(["plain answer"])
    plain = json.loads(ok(rc.run_claude("-p", "plain prompt", "--output-format", "json")).stdout)
    race(rc, plain["session_id"], 10, "adopted and ran")
    [row] = threads(rc)
    assert row["origin"] == "adopted" and row["current_session"] == plain["session_id"]
    texts = [m.get("text") for m in export(rc, row["id"])]
    assert texts[:2] == ["plain prompt", "plain answer"] and "adopted and ran" in texts


# -- (f) orphans -----------------------------------------------------------------------------------

def test_orphan_rebuilt_session_is_refused_before_claude_starts(real_claude):
    rc = real_claude
    start_thread(rc, SMALL)
    thread_id = threads(rc)[0]["id"]
    orphan = str(uuid.uuid4())
    records, parent = [], None
    for kind, content in (("user", cc_lhc.REBUILT_MARKER + " from thread 0000 (an older cc-lhc)."),
                          ("user", "hello one"),
                          ("assistant", [{"type": "text", "text": "first answer"}])):
        rid = str(uuid.uuid4())
        message = {"role": kind, "content": content}
        if kind == "assistant":
            message.update(id="msg_orphan", model="claude-fake-model")
        records.append({"parentUuid": parent, "isSidechain": False, "type": kind, "uuid": rid,
                        "sessionId": orphan, "cwd": str(rc.cwd), "message": message,
                        "timestamp": "2026-01-01T00:00:00.000Z"})
        parent = rid
    (rc.project_dir / f"{orphan}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    n = len(rc.api.requests)

    p = lhc(rc, "--resume", orphan, "-p", "x")
    assert p.returncode == 2, p.stderr
    assert len(rc.api.requests) == n                        # Claude never started
    assert not log_events(rc, "child_started")[1:], "a child was started for the orphan"
    assert "cc-lhc --resume" in p.stderr
    assert "unverified possible match" in p.stderr and thread_id in p.stderr
    assert p.stdout == ""
    assert [t["id"] for t in threads(rc)] == [thread_id]    # never linked by guesswork


# -- (g) stale runtime descriptors -------------------------------------------------------------------

def test_stale_runtime_descriptor_removed_at_next_launch(real_claude):
    rc = real_claude
    code = ("import json, cc_lhc\n"
            "home = cc_lhc.StateHome(); home.ensure()\n"
            "d = cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), 'thread-x', 'session-x')\n"
            "print(json.dumps(d))\n")
    made = ok(rc.run([sys.executable, "-c", code], env={"PYTHONPATH": str(REPO)}))
    stale = json.loads(made.stdout)
    assert os.path.exists(stale["path"]) and os.path.isdir(stale["shim_dir"])

    rc.api.responder = lambda body: text_reply(SMALL_REPLY, usage=SMALL)
    ok(lhc(rc, "-p", "hello"))
    assert not os.path.exists(stale["path"]) and not os.path.exists(stale["shim_dir"])
    assert not list((rc.iso.lhc / "runtime").glob("*.json"))
    db = sqlite3.connect(rc.iso.lhc / "cc-lhc.sqlite")
    try:
        [(revoked,)] = db.execute("SELECT revoked FROM descriptors WHERE token = ?",
                                  (stale["token"],)).fetchall()
    finally:
        db.close()
    assert revoked and "owner gone" in revoked


# -- receipts are write-behind -------------------------------------------------------------------------

def test_unavailable_receipt_store_does_not_stop_smart_compact(real_claude):
    rc = real_claude
    old = start_thread(rc, OVER)
    db = sqlite3.connect(rc.iso.lhc / "cc-lhc.sqlite")
    db.execute("DROP TABLE cc_governor_receipts")
    db.close()
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert "warning: governor receipt could not be stored" in p.stderr
    assert SMALL_REPLY in p.stdout
    [sent] = rc.api.message_requests[n:]
    assert sent["session_id"] != old
    assert threads(rc)[0]["current_session"] == sent["session_id"]


def test_an_interrupted_rebuild_claude_answered_in_becomes_the_session(real_claude):
    # cc-lhc dies after writing the rebuild; Claude is then run on it by hand (as a user
    # might with the id from the log). The next launch must take that exchange into the
    # thread, and since Claude worked in the rebuild the thread goes on there: nothing
    # Claude wrote is ever lost, from the thread or from what Claude sees.
    rc = real_claude
    old = start_thread(rc, OVER)
    crashed = lhc(rc, "--resume", old, "-p", "next", env={"CC_LHC_FAILPOINT": "after-rollout-write"})
    assert crashed.returncode == -9 or crashed.returncode == 137
    registry = cc_lhc.Registry(cc_lhc.StateHome(rc.env["CC_LHC_HOME"]))
    ((rebuilt, path),) = registry.db.execute("SELECT session_id, path FROM rebuilds "
                                             "WHERE status = 'pending'").fetchall()
    rc.api.responder = lambda body: text_reply("answered inside the orphaned rebuild", usage=SMALL)
    direct = rc.run_claude("--resume", rebuilt, "-p", "typed while cc-lhc was gone")
    assert direct.returncode == 0, direct.stderr
    ok(lhc(rc, "--resume", old, "-p", "again"))
    (thread,) = threads(rc)
    texts = [m.get("text") for m in export(rc, thread["id"])]
    assert "typed while cc-lhc was gone" in texts
    assert "answered inside the orphaned rebuild" in texts
    assert os.path.exists(path) and thread["current_session"] == rebuilt
    assert rc.api.message_requests[-1]["session_id"] == rebuilt
    assert "answered inside the orphaned rebuild" in all_text(rc.api.message_requests[-1]["body"])


# -- a long agentic turn ------------------------------------------------------------------------------

def test_one_prompt_and_fifty_big_tool_outputs_keep_the_newest_verbatim(real_claude):
    # Issue 10: one prompt, 50 Bash calls of about 16 KB, usage over the trigger. After Smart
    # Compact the rebuilt request holds the newest outputs verbatim and stays inside the
    # target, and the model reads a stubbed output back byte for byte.
    rc = real_claude
    calls = 50
    command = "seq -f 'step {i} line %g of the migration log: ok' 1 420"
    rc.api.script([tool_use_reply("Bash", {"command": command.format(i=i), "description": f"step {i}"},
                                  usage=SMALL) for i in range(calls)]
                  + [text_reply("migration finished", usage=OVER)])
    sid = json.loads(ok(lhc(rc, "-p", "run the migration", "--output-format", "json",
                            "--allowedTools", "Bash", timeout=300)).stdout)["session_id"]
    thread_id = threads(rc)[0]["id"]
    outputs = [m for m in recorded(rc, thread_id) if m["kind"] == "tool_result"]
    assert len(outputs) == calls and all(len(m["text"]) > 15_000 for m in outputs)

    def responder(body):
        last = body["messages"][-1]
        if any(b.get("type") == "tool_result" for b in blocks_of(last)):
            return text_reply("read it back", usage=SMALL)
        stub = re.search(r"cc-lhc get-messages (m\d+)\]", json.dumps(body["messages"]))
        return tool_use_reply("Bash", {"command": f"cc-lhc get-messages {stub.group(1)}",
                                       "description": "read back"}, usage=SMALL)

    rc.api.responder = responder
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", sid, "-p", "what did step 3 print?", "--allowedTools", "Bash",
               timeout=120))
    assert "Smart Compact" in p.stderr and "read it back" in p.stdout
    first, second = rc.api.message_requests[n:n + 2]
    assert first["session_id"] != sid and second["session_id"] == first["session_id"]
    messages = first["body"]["messages"]
    results = {b["tool_use_id"]: tool_result_of(b) for m in messages for b in blocks_of(m)
               if b.get("type") == "tool_result"}
    by_id = {m["tool_use_id"]: m["text"] for m in outputs}
    assert set(results) == set(by_id)  # every call and its result, none without the other
    verbatim = [m["tool_use_id"] for m in outputs if results[m["tool_use_id"]] == m["text"]]
    newest = [m["tool_use_id"] for m in outputs[-len(verbatim):]] if verbatim else []
    assert len(verbatim) >= 10 and verbatim == newest  # the work in hand, verbatim
    stubbed = [tid for tid in by_id if tid not in verbatim]
    assert stubbed and all(results[t].startswith("[output of Bash m") for t in stubbed)
    target = cc_lhc.resolve_policy([]).effective_target
    assert cc_lhc.estimate_tokens(json.dumps(messages, ensure_ascii=False)) <= target
    # the model's get-messages gave back the stubbed output exactly as recorded
    label = re.search(r"cc-lhc get-messages (m\d+)\]", json.dumps(messages)).group(1)
    recalled = tool_result_of([b for b in blocks_of(second["body"]["messages"][-1])
                               if b.get("type") == "tool_result"][0])
    original = next(m for m in recorded(rc, thread_id) if f"m{m['seq']}" == label)
    assert original["kind"] == "tool_result" and original["tool_use_id"] in stubbed
    assert "\n" + original["text"] + "\n" in recalled and "retrieval refused" not in recalled


def test_a_single_turn_far_over_the_target_resumes_with_its_newest_part_verbatim(real_claude):
    # 600k tokens in 200 tool calls, one prompt, over the trigger: cc-lhc adopts the session,
    # Smart Compact builds a view within the target, and the real CLI resumes it and answers.
    from test_views import long_turn_transcript
    rc = real_claude
    tr = long_turn_transcript(200, 12_000, cwd=str(rc.cwd), model="claude-fake-model")
    tr.records[-1]["message"]["usage"] = OVER
    rc.project_dir.mkdir(parents=True, exist_ok=True)
    path = tr.write(rc.project_dir / f"{tr.session_id}.jsonl")
    assert path.stat().st_size > 2_400_000
    rc.api.responder = lambda body: text_reply("continuing the migration", usage=SMALL)
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", tr.session_id, "-p", "carry on", timeout=120))
    assert "Smart Compact" in p.stderr and "continuing the migration" in p.stdout
    (request,) = rc.api.message_requests[n:]
    assert request["session_id"] != tr.session_id
    messages = request["body"]["messages"]
    target = cc_lhc.resolve_policy([]).effective_target
    assert cc_lhc.estimate_tokens(json.dumps(messages, ensure_ascii=False)) <= target
    outputs = [m for m in recorded(rc, threads(rc)[0]["id"]) if m["kind"] == "tool_result"]
    results = {b["tool_use_id"]: tool_result_of(b) for m in messages for b in blocks_of(m)
               if b.get("type") == "tool_result"}
    assert results[outputs[-1]["tool_use_id"]] == outputs[-1]["text"]
    assert sum(results.get(m["tool_use_id"]) == m["text"] for m in outputs) >= 10
    for i, m in enumerate(messages):  # every tool_use answered in the very next message
        uses = {b["id"] for b in blocks_of(m) if b.get("type") == "tool_use"}
        if uses:
            assert uses == {b["tool_use_id"] for b in blocks_of(messages[i + 1])
                            if b.get("type") == "tool_result"}
    assert "carry on" in json.dumps([m for m in messages if m["role"] == "user"][-1])


def recorded(rc, thread_id: str) -> list[dict]:
    """The thread's messages as stored."""
    store = cc_lhc.ThreadStore(cc_lhc.StateHome(str(rc.iso.lhc)), thread_id)
    try:
        return list(store.messages())
    finally:
        store.close()


def blocks_of(message: dict) -> list:
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def tool_result_of(block: dict) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [])


# -- the abandon step moves only what it can prove is the rebuild ------------------------------------

def test_recovery_leaves_a_file_outside_claude_projects_where_it_is(real_claude, tmp_path):
    rc = real_claude
    old = start_thread(rc, OVER)
    crashed = lhc(rc, "--resume", old, "-p", "next", env={"CC_LHC_FAILPOINT": "after-rollout-write"})
    assert crashed.returncode in (-9, 137)
    precious = tmp_path / "precious.jsonl"
    precious.write_text("the user's own file\n")
    db = sqlite3.connect(rc.iso.lhc / "registry.sqlite")
    with db:
        ((rebuilt,),) = db.execute("SELECT session_id FROM rebuilds WHERE status = 'pending'").fetchall()
        db.execute("UPDATE rebuilds SET path = ? WHERE session_id = ?", (str(precious), rebuilt))
    db.close()
    ok(lhc(rc, "--resume", old, "-p", "again"))
    assert precious.read_text() == "the user's own file\n"
    [event] = log_events(rc, "rebuild_not_moved")
    assert event["session"] == rebuilt and "not a file inside Claude's projects folder" in event["why"]
    assert dict((s, st) for s, _f, st in rebuilds(rc))[rebuilt] == "abandoned"
    assert not list((rc.iso.lhc / "abandoned-rebuilds").rglob("precious*"))


def pending_rebuild(iso_env, content: bytes) -> tuple:
    """In-process: a thread with a pending rebuild of a dead owner whose file holds content."""
    home = cc_lhc.StateHome()
    registry = cc_lhc.Registry(home)
    cwd = str(iso_env.work)
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    thread = registry.create_thread(old, cwd, "fresh")
    path = Path(cc_lhc.rollout_path(new, cwd))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.replace(b"THREAD", thread.encode()))
    cc_lhc.record_pending(registry, thread, old, type("R", (), {"session_id": new, "path": str(path)}), cwd)
    with cc_lhc.Tx(registry.db) as db:
        db.execute("UPDATE rebuilds SET owner = '{}' WHERE session_id = ?", (new,))
    return home, registry, thread, new, path


HEADER = (json.dumps({"type": "user", "message": {"role": "user", "content":
                      cc_lhc.REBUILT_MARKER + " from thread THREAD. ..."}}) + "\n").encode()


def test_recovery_moves_a_file_that_starts_as_the_threads_rebuild(iso_env):
    home, registry, thread, new, path = pending_rebuild(iso_env, HEADER)
    cc_lhc.recover_thread(home, registry, cc_lhc.HostDB(home), thread)
    assert not path.exists()
    assert list((iso_env.lhc / "abandoned-rebuilds").rglob(path.name))


def test_recovery_does_not_move_a_file_that_is_not_a_rebuild(iso_env):
    home, registry, thread, new, path = pending_rebuild(iso_env, b'{"type": "user"}\n')
    cc_lhc.recover_thread(home, registry, cc_lhc.HostDB(home), thread)
    assert path.read_bytes() == b'{"type": "user"}\n'
    assert registry.db.execute("SELECT status FROM rebuilds WHERE session_id = ?",
                               (new,)).fetchone() == ("abandoned",)


def test_recovery_does_not_follow_a_link_out_of_claude_projects(iso_env, tmp_path):
    home, registry, thread, new, path = pending_rebuild(iso_env, HEADER)
    outside = tmp_path / "outside.jsonl"
    path.rename(outside)
    path.symlink_to(outside)
    cc_lhc.recover_thread(home, registry, cc_lhc.HostDB(home), thread)
    assert path.is_symlink() and outside.exists()
    assert not (iso_env.lhc / "abandoned-rebuilds").exists() or \
        not list((iso_env.lhc / "abandoned-rebuilds").rglob("*.jsonl"))


# -- a lost registry is rebuilt from the thread files ------------------------------------------------

def test_lost_registry_is_rebuilt_and_nothing_is_adopted_twice(real_claude):
    rc = real_claude
    old = start_thread(rc, OVER)
    ok(lhc(rc, "--resume", old, "-p", "next"))            # Smart Compact: old -> current
    [before] = threads(rc)
    current = before["current_session"]
    assert current != old
    exported = export(rc, before["id"])
    for suffix in ("", "-wal", "-shm"):
        (rc.iso.lhc / f"registry.sqlite{suffix}").unlink(missing_ok=True)

    listed = ok(lhc(rc, "threads", "--json"))
    assert "rebuilt their entries from the thread files" in listed.stderr
    assert json.loads(listed.stdout) == [before]
    assert export(rc, before["id"]) == exported

    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", current, "-p", "on the current one"))
    assert "looks like a rebuilt session" not in p.stderr
    [sent] = rc.api.message_requests[n:]
    assert sent["session_id"] == current
    p = ok(lhc(rc, "--resume", old, "-p", "by the old id"))
    assert f"session {old} continues as {current}" in p.stderr
    [sent] = rc.api.message_requests[n + 1:]
    assert sent["session_id"] == current
    [after] = threads(rc)
    assert after["id"] == before["id"] and after["current_session"] == current
    texts = [m.get("text") for m in export(rc, before["id"])]
    assert texts.count("hello one") == 1                   # the history was not adopted again
    assert "on the current one" in texts and "by the old id" in texts


@pytest.mark.parametrize("via", ["file", "socket"])
def test_a_one_shot_prompt_on_standard_input_counts_toward_the_trigger(real_claude, tmp_path, via):
    """A prompt too long for an argument goes on standard input (`-p < prompt.txt`); it is
    counted into the reading before the launch, as an argument's words are."""
    from fakeapi import text_reply
    rc = real_claude
    rc.api.script([text_reply("noted", usage={"input_tokens": 355_000, "cache_creation_input_tokens": 0,
                                             "cache_read_input_tokens": 0, "output_tokens": 5})])
    p = rc.run_lhc("-p", "remember this", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("word " * 8000)  # about 10,000 tokens: over the trigger with the 355,000
    rc.api.script(["answered on the rebuilt session"])
    if via == "file":
        with open(prompt) as stdin:
            p = rc.run_lhc("--resume", sid, "-p", stdin=stdin)
    else:  # (what Node's spawn gives a child for a pipe: a socket, written before it starts)
        import socket
        ours, theirs = socket.socketpair()
        ours.sendall(prompt.read_bytes())
        ours.shutdown(socket.SHUT_WR)
        try:
            p = rc.run_lhc("--resume", sid, "-p", stdin=theirs.fileno())
        finally:
            ours.close()
            theirs.close()
    assert p.returncode == 0, p.stderr
    assert "Smart Compact" in p.stderr and "+ LHC estimated tokens" in p.stderr, p.stderr
    assert rc.api.message_requests[-1]["session_id"] != sid


def test_the_newest_of_outputs_claude_asked_for_at_once_reach_the_rebuilt_session_verbatim(real_claude):
    """Two Bash calls in one response, their outputs together too large for the verbatim
    share of a 12k target: the newest is served whole in the request Claude sends on the
    rebuilt session (both were stubs), the older one a stub naming it."""
    rc = real_claude
    rc.api.script([text_reply("first answer", usage=SMALL)])
    sid = json.loads(ok(lhc(rc, "-p", "hello one", "--output-format", "json")).stdout)["session_id"]
    calls = [{"type": "tool_use", "name": "Bash", "id": f"toolu_01PARALLEL{i}XXXXXXXXXXXXXX",
              "input": {"command": f"seq {100000 + i * 5000} {103000 + i * 5000}", "description": f"numbers {i}"}}
             for i in range(2)]
    rc.api.script([{"content": calls, "usage": SMALL}, text_reply("second answer", usage=OVER)])
    ok(lhc(rc, "--resume", sid, "-p", "count in parallel", "--allowedTools", "Bash"))
    rc.api.responder = lambda body: text_reply(SMALL_REPLY, usage=SMALL)
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--lhc-target", "12000", "--resume", sid, "-p", "next"))
    assert "Smart Compact" in p.stderr, p.stderr
    body = rc.api.message_requests[n]["body"]
    shown = {b["tool_use_id"]: b["content"] if isinstance(b["content"], str) else
             " ".join(x.get("text", "") for x in b["content"])
             for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], list)
             for b in m["content"] if b.get("type") == "tool_result"}
    # (the newest output is the one Claude Code wrote last: it writes each as its call
    # finishes, and the two commands race)
    results = [m for m in export(rc, threads(rc)[0]["id"]) if m["kind"] == "tool_result"]
    written = [m["tool_use_id"] for m in results if m["tool_use_id"] in {c["id"] for c in calls}]
    older, newest = (shown[i] for i in written)
    last = calls[[c["id"] for c in calls].index(written[-1])]["input"]["command"].split()
    assert f"{last[1]}\n" in newest and last[2] in newest
    assert "cc-lhc get-messages" in older and len(older) < 200


def _one_shot_session(p) -> str:
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["session_id"]


def test_a_large_answer_is_in_the_pressure_the_next_one_shot_reads(real_claude):
    """The usage of a response is what its request held; its answer goes into the next
    request too. An answer of 30,000 output tokens on a request of 355,000 puts the next one
    at 385,000, over the 360,000 trigger: it was read as 355,000 (healthy), one turn late."""
    rc = real_claude
    rc.api.script(["one"])
    sid = _one_shot_session(rc.run_lhc("-p", "turn one", "--output-format", "json"))
    big = " ".join(f"word{i}" for i in range(12000))
    rc.api.script([text_reply(big, usage={"input_tokens": 355_000, "output_tokens": 30_000})])
    assert rc.run_lhc("--resume", sid, "-p", "write a lot").returncode == 0
    rc.api.script(["three"])
    p = rc.run_lhc("--resume", sid, "-p", "turn three", "--output-format", "json")
    assert "Smart Compact: provider-reported context 355,000 + LHC estimated tokens 30,0" in p.stderr, p.stderr
    assert _one_shot_session(p) != sid


def test_a_one_shot_the_api_rejected_as_too_long_is_rebuilt_at_the_next_launch(real_claude):
    """A one-shot never continues by itself after a too-long rejection, but the next launch
    must not start Claude on the session the API refused again: it was resumed as it was
    (the last reading healthy), to be refused again, launch after launch."""
    rc = real_claude
    rc.api.script(["one"])
    sid = _one_shot_session(rc.run_lhc("-p", "turn one", "--output-format", "json"))
    rc.api.script([error_reply()] * 3)
    assert rc.run_lhc("--resume", sid, "-p", "turn two").returncode == 1
    n = len(rc.api.message_requests)
    rc.api.script(["three"])
    p = rc.run_lhc("--resume", sid, "-p", "turn three", "--output-format", "json")
    assert "rejected this session's last request as too long" in p.stderr, p.stderr
    rebuilt = _one_shot_session(p)
    assert rebuilt != sid
    (request,) = rc.api.message_requests[n:]  # the person's prompt, nothing sent on its own before it
    assert "turn three" in json.dumps(request["body"]["messages"])
    rc.api.script(["four"])  # the rebuilt session goes on as it is: no rebuild at every launch
    assert _one_shot_session(rc.run_lhc("--resume", rebuilt, "-p", "turn four", "--output-format", "json")) == rebuilt


def test_a_transcript_cut_after_capture_is_written_again_from_the_thread_before_claude_resumes_it(real_claude):
    """The transcript lost its first records after cc-lhc captured them (cut, or deleted
    while Claude ran and written anew): the thread still holds them, but the next launch
    resumed Claude on the cut file without a word, and Claude went on without them. It is
    written again from the thread, and said. A file whose records only moved holds them
    all: resumed as it is."""
    rc = real_claude
    rc.api.script(["ANSWER-ONE remember ZEBRA-11"])
    sid = _one_shot_session(rc.run_lhc("-p", "first prompt KIWI-1", "--output-format", "json"))
    rc.api.script(["ANSWER-TWO"])
    assert _one_shot_session(rc.run_lhc("--resume", sid, "-p", "second prompt KIWI-2",
                                        "--output-format", "json")) == sid
    path = rc.project_dir / f"{sid}.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[1:] + lines[:1]))  # (the same records, one moved: none lost)
    rc.api.script(["ANSWER-THREE"])
    p = rc.run_lhc("--resume", sid, "-p", "third prompt KIWI-3", "--output-format", "json")
    assert _one_shot_session(p) == sid and "no longer holds" not in p.stderr, p.stderr
    first = next(i for i, line in enumerate(lines) if b"KIWI-2" in line)
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[first:]))  # turn one cut away
    rc.api.script(["ANSWER-FOUR"])
    p = rc.run_lhc("--resume", sid, "-p", "fourth prompt KIWI-4", "--output-format", "json")
    assert re.search(rf"the transcript of session {sid} no longer holds \d+ record\(s\)", p.stderr), p.stderr
    assert _one_shot_session(p) != sid
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    for word in ("KIWI-1", "ZEBRA-11", "KIWI-2", "KIWI-3", "KIWI-4"):
        assert word in sent, word


def compacted_thread(rc) -> Path:
    """Three one-shots in one thread, the third Smart Compacted (the second's answer went over
    the trigger): the thread's record file. Its turns hold KIWI-1..3 and ZEBRA-11."""
    rc.api.script(["ANSWER-ONE remember ZEBRA-11"])
    assert rc.run_lhc("-p", "first prompt KIWI-1").returncode == 0
    rc.api.script([text_reply("ANSWER-TWO big LLAMA-22", usage=OVER)])
    assert rc.run_lhc("-c", "-p", "second prompt KIWI-2").returncode == 0
    rc.api.script(["ANSWER-THREE"])
    p = rc.run_lhc("-c", "-p", "third prompt KIWI-3")
    assert p.returncode == 0 and "Smart Compact" in p.stderr, p.stderr
    (record,) = (rc.iso.lhc / "threads").glob("*.sqlite")
    return record


@pytest.mark.parametrize("lost", ["emptied", "removed"])
def test_a_lost_thread_record_is_made_again_from_every_session_claude_still_keeps(real_claude, lost):
    """The thread's record was emptied (or removed) after a Smart Compact: the next launch
    made a new record of the current (rebuilt) session alone, without a word, so the older
    turns were gone from the thread and the labels moved. Every session Claude Code still
    keeps is taken in again, oldest first, under the labels they had, and it is said."""
    rc = real_claude
    record = compacted_thread(rc)
    before = json.loads(rc.run_lhc("export", record.stem, "--format", "json").stdout)
    if lost == "emptied":
        os.truncate(record, 0)
    else:
        for tail in ("", "-wal", "-shm"):
            Path(str(record) + tail).unlink(missing_ok=True)
    rc.api.script(["ANSWER-FOUR"])
    p = rc.run_lhc("-c", "-p", "fourth prompt KIWI-4")
    assert p.returncode == 0, p.stderr
    state = "is empty" if lost == "emptied" else "is missing"
    assert f"its record {record} {state}; it is made again from Claude Code's transcripts of its sessions " \
           "(2 of 2 still there)" in p.stderr, p.stderr
    after = json.loads(rc.run_lhc("export", record.stem, "--format", "json").stdout)
    key = [(m["label"], m["kind"], m.get("text")) for m in before]
    assert [(m["label"], m["kind"], m.get("text")) for m in after][:len(key)] == key
    texts = "\n".join(m.get("text") or "" for m in after)
    for word in ("KIWI-1", "ZEBRA-11", "KIWI-2", "KIWI-3", "KIWI-4"):
        assert word in texts, word


@pytest.mark.parametrize("point", ["before-acceptance", "after-rollout-write"])
def test_a_lost_record_after_a_crash_left_a_rebuild_pending_gets_the_old_session_back(real_claude, point):
    """A crash left a Smart Compact's rebuild pending (or to be rolled back), then the record
    was lost: the remaking took the pending rebuild for an earlier session and left the old
    current one out, whose turns recovery then moved away from; and a rebuild rolled back
    (which never held anything of the thread's own) was named as a session whose content
    was lost. Every session that holds the thread's turns is taken in; the rolled-back one
    is not named."""
    rc = real_claude
    old = start_thread(rc, OVER)
    thread_id = threads(rc)[0]["id"]
    crashed = lhc(rc, "--resume", old, "-p", "next", env={cc_lhc.FAILPOINT_ENV: point})
    assert crashed.returncode == -9, (crashed.returncode, crashed.stderr)
    if point == "after-rollout-write":
        assert "rolled back" in ok(lhc(rc, "--resume", old, "-p", "again")).stderr
    record = rc.iso.lhc / "threads" / f"{thread_id}.sqlite"
    for tail in ("", "-wal", "-shm"):
        Path(str(record) + tail).unlink(missing_ok=True)
    p = ok(lhc(rc, "-c", "-p", "after the loss"))
    assert "it is made again from Claude Code's transcripts" in p.stderr and "in the thread no more" not in p.stderr
    texts = "\n".join(m.get("text") or "" for m in export(rc, thread_id))
    assert "hello one" in texts and "remember 777" in texts and "after the loss" in texts


def test_doctors_fix_for_a_damaged_thread_file_gets_the_whole_thread_back(real_claude):
    """doctor's fix for a damaged thread file was a pipe through sqlite3's .recover, which
    fails where sqlite3 lacks it (Debian's 3.40) and then made an empty file to put in the
    damaged one's place: the thread lost everything. The fix now moves the files aside, and
    the next launch makes the record again from Claude Code's transcripts."""
    rc = real_claude
    record = compacted_thread(rc)
    with open(record, "r+b") as f:  # one page damaged
        f.seek(5 * 2048 + 8)
        f.write(b"\xff" * 8)
    d = rc.run_lhc("doctor")
    assert d.returncode == 1 and f"thread {record.stem}" in d.stdout and "is damaged" in d.stdout, d.stdout
    fix = re.search(r"move its files aside, `([^`]+)`", d.stdout).group(1)
    assert subprocess.run(fix, shell=True).returncode == 0
    assert not list((rc.iso.lhc / "threads").glob(record.name + "*"))
    rc.api.script(["ANSWER-FOUR"])
    p = rc.run_lhc("-c", "-p", "fourth prompt KIWI-4")
    assert p.returncode == 0 and "it is made again from Claude Code's transcripts" in p.stderr, p.stderr
    texts = "\n".join(m.get("text") or "" for m in json.loads(rc.run_lhc("export", record.stem, "--format",
                                                                          "json").stdout))
    for word in ("KIWI-1", "ZEBRA-11", "KIWI-2", "KIWI-3", "KIWI-4"):
        assert word in texts, word
    assert rc.run_lhc("doctor").returncode == 0


def test_a_plain_claude_session_resumed_from_another_folder_is_adopted_where_it_is(real_claude):
    """Claude finds a session it wrote under another folder's projects folder and goes on
    writing it there; cc-lhc looked only in this folder's, captured nothing, said nothing, and
    had still switched Claude's own compaction off: no compaction at all."""
    rc = real_claude
    other = rc.iso.root / "other"
    other.mkdir()
    p = rc.run_claude("-p", "plain session", "--output-format", "json")
    session = json.loads(p.stdout)["session_id"]
    path = rc.project_dir / f"{session}.jsonl"
    rc.api.script(["adopted"])
    p = rc.run_lhc("--resume", session, "-p", "from the other folder", "--output-format", "json", cwd=other)
    assert _one_shot_session(p) == session
    assert "from the other folder" in path.read_text()  # (Claude wrote on in the original file)
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"], "--format", "json").stdout)
    texts = [m.get("text") or "" for m in record]
    assert "plain session" in texts and "from the other folder" in texts and "adopted" in texts


def test_a_resume_of_a_session_claude_cannot_find_leaves_its_own_compaction_on(real_claude):
    rc = real_claude
    wrapper = rc.iso.root / "claude-env"
    seen = rc.iso.root / "seen"
    wrapper.write_text(f"#!/bin/sh\necho \"${{DISABLE_AUTO_COMPACT:-unset}}\" > {seen}\nexec {rc.claude} \"$@\"\n")
    wrapper.chmod(0o755)
    p = rc.run_lhc("--resume", str(uuid.uuid4()), "-p", "hello", env={"CC_LHC_CLAUDE_BIN": str(wrapper)})
    assert p.returncode != 0  # (Claude finds no such conversation)
    assert seen.read_text().strip() == "unset"
