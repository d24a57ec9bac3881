"""`--fork-session` of a session cc-lhc keeps a thread of, with the real CLI and the fake API.

A fork is a thread of its own that starts as the source thread: the same turns under the
same labels. When the source is over the trigger, or its transcript no longer holds the
whole thread (a rebuilt session), cc-lhc writes the fork's session from the copied thread
(Smart Compact when it is over the trigger) instead of letting Claude copy the transcript.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import text_reply, tool_use_reply
from realcli import CC_LHC, PROMPT, exit_cleanly, type_line


def usage(total: int) -> dict:
    return {"input_tokens": total - 1_000, "cache_creation_input_tokens": 600,
            "cache_read_input_tokens": 400, "output_tokens": 5}


CC_LHC_SOURCE = Path(cc_lhc.__file__).read_text()
OVER = usage(371_000)     # over the built-in 360k trigger
SMALL = usage(2_000)
REPLY = "fine answer from the fake API"


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def over_trigger_session(rc) -> str:
    """A thread of two turns whose newest reply reports a context over the trigger."""
    rc.api.script([text_reply("first answer, remember 777", usage=SMALL)])
    sid = json.loads(ok(rc.run_lhc("-p", "hello one", "--output-format", "json")).stdout)["session_id"]
    rc.api.script([tool_use_reply("Bash", {"command": "seq 1 300", "description": "numbers"}),
                   text_reply("second answer", usage=OVER)])
    ok(rc.run_lhc("--resume", sid, "-p", "hello two", "--allowedTools", "Bash"))
    rc.api.responder = lambda body: text_reply(REPLY, usage=SMALL)
    return sid


def threads(rc) -> dict:
    return {t["id"]: t for t in json.loads(ok(rc.run_lhc("threads", "--json")).stdout)}


def export(rc, thread_id) -> list[dict]:
    return json.loads(ok(rc.run_lhc("export", thread_id, "--format", "json")).stdout)


def user_texts(records) -> list[str]:
    return [m["text"] for m in records if m["kind"] == "user_text"]


def fork(rc, source, prompt):
    n = len(rc.api.message_requests)
    p = ok(rc.run_lhc("--resume", source, "--fork-session", "-p", prompt, "--output-format", "json"))
    return json.loads(p.stdout), rc.api.message_requests[n:], p


def test_fork_of_a_session_over_the_trigger_starts_smart_compacted(real_claude):
    rc = real_claude
    source = over_trigger_session(rc)
    [source_thread] = threads(rc)
    before = export(rc, source_thread)

    answer, sent, p = fork(rc, source, "in the fork")
    assert answer["is_error"] is False and REPLY in answer["result"]
    assert "Smart Compact" in p.stderr
    forked = answer["session_id"]
    assert forked != source and [r["session_id"] for r in sent] == [forked]
    body = json.dumps(sent[0]["body"]["messages"])
    assert cc_lhc.REBUILT_MARKER in body
    assert "remember 777" in body and "in the fork" in body

    rows = threads(rc)
    assert len(rows) == 2 and rows[source_thread]["current_session"] == source
    assert export(rc, source_thread) == before              # the source is only read
    [fork_thread] = [t for t in rows if t != source_thread]
    assert rows[fork_thread]["current_session"] == forked
    record = export(rc, fork_thread)
    # the fork holds the source's turns under the same labels, then its own
    strip = [{k: m.get(k) for k in ("label", "turn", "kind", "text")} for m in record]
    assert strip[:len(before)] == [{k: m.get(k) for k in ("label", "turn", "kind", "text")} for m in before]
    assert user_texts(record) == ["hello one", "hello two", "in the fork"]

    # The source's own next resume is still Smart Compacted: the fork took nothing from it.
    n = len(rc.api.message_requests)
    p = ok(rc.run_lhc("--resume", source, "-p", "back in the source"))
    assert "Smart Compact" in p.stderr
    assert rc.api.message_requests[n]["session_id"] not in (source, forked)


def test_fork_of_a_rebuilt_session_keeps_the_source_labels(real_claude):
    rc = real_claude
    source = over_trigger_session(rc)
    ok(rc.run_lhc("--resume", source, "-p", "compact me"))   # Smart Compact: a rebuilt session
    [source_thread] = threads(rc)
    rebuilt = threads(rc)[source_thread]["current_session"]
    assert rebuilt != source
    before = export(rc, source_thread)

    answer, sent, p = fork(rc, rebuilt, "fork of the rebuilt one")
    assert answer["is_error"] is False and "Smart Compact" not in p.stderr
    forked = answer["session_id"]
    assert [r["session_id"] for r in sent] == [forked]
    rows = threads(rc)
    [fork_thread] = [t for t in rows if t != source_thread]
    record = export(rc, fork_thread)
    assert user_texts(record) == ["hello one", "hello two", "compact me", "fork of the rebuilt one"]
    assert [(m["label"], m["turn"], m.get("text")) for m in record[:len(before)]] == \
        [(m["label"], m["turn"], m.get("text")) for m in before]
    assert record[0]["label"] == "m1" and record[0]["text"] == "hello one"     # m1 is not a header
    assert export(rc, source_thread) == before


def test_a_fork_of_a_session_the_thread_went_on_from_holds_that_sessions_branch(real_claude):
    """--fork-session of a session that is no longer its thread's current one forks the
    thread as it was on that session: the turns the thread took in after it (on the rebuilt
    session) are not in the fork, as a /resume back to it leaves them out; and it is said
    (it forked the thread as it is now)."""
    rc = real_claude
    source = over_trigger_session(rc)
    ok(rc.run_lhc("--resume", source, "-p", "compact me"))   # Smart Compact: a rebuilt session
    ok(rc.run_lhc("--continue", "-p", "only on the rebuilt one"))
    [source_thread] = threads(rc)
    rebuilt = threads(rc)[source_thread]["current_session"]
    before = export(rc, source_thread)
    answer, sent, p = fork(rc, source, "fork of the old one")
    assert (f"session {source} is not thread {source_thread[:8]}'s current session (that is {rebuilt}); "
            "the fork holds the thread as it was on that session") in p.stderr
    body = json.dumps(sent[0]["body"]["messages"])
    assert "hello one" in body and "remember 777" in body and "fork of the old one" in body
    assert "compact me" not in body and "only on the rebuilt one" not in body
    assert answer["session_id"] == sent[0]["session_id"] and sent[0]["session_id"] not in (source, rebuilt)
    assert export(rc, source_thread) == before  # (the source thread is only read)
    # the fork is a thread of its own, on its own session; the source stays where it was
    rows = threads(rc)
    assert rows[source_thread]["current_session"] == rebuilt and len(rows) == 2
    _answer, _sent, p = fork(rc, rebuilt, "fork of the current one")
    assert "is not thread" not in p.stderr


def test_fork_of_a_small_single_session_is_claudes_own_copy(real_claude):
    rc = real_claude
    rc.api.script([text_reply("noted", usage=SMALL)])
    source = json.loads(ok(rc.run_lhc("-p", "the topic", "--output-format", "json")).stdout)["session_id"]
    rc.api.responder = lambda body: text_reply(REPLY, usage=SMALL)
    answer, sent, p = fork(rc, source, "small fork")
    body = json.dumps(sent[0]["body"]["messages"])
    assert cc_lhc.REBUILT_MARKER not in body and "the topic" in body
    assert (rc.project_dir / f"{answer['session_id']}.jsonl").exists()


def test_a_lost_registry_brings_back_the_fork_and_its_source(real_claude):
    rc = real_claude
    source = over_trigger_session(rc)
    answer, _sent, _p = fork(rc, source, "in the fork")
    rows = {t["current_session"]: (t["id"], t["messages"]) for t in threads(rc).values()}
    (rc.iso.lhc / "registry.sqlite").unlink()
    again = {t["current_session"]: (t["id"], t["messages"]) for t in threads(rc).values()}
    assert again == rows and set(rows) == {source, answer["session_id"]}


def test_an_interactive_fork_over_the_trigger_opens_the_forks_own_session(real_claude, tmux):
    rc = real_claude
    source = over_trigger_session(rc)
    rc.api.responder = lambda body: text_reply("answered in the interactive fork", usage=SMALL)
    n = len(rc.api.message_requests)
    t = tmux([sys.executable, CC_LHC, "--resume", source, "--fork-session"], cols=120, rows=30,
             env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "typed in the fork")
    t.wait_for("answered in the interactive fork")
    exit_cleanly(t)
    (request,) = rc.api.message_requests[n:]
    rows = threads(rc)
    [fork_thread] = [tid for tid, row in rows.items() if row["current_session"] != source]
    assert request["session_id"] == rows[fork_thread]["current_session"]
    assert cc_lhc.REBUILT_MARKER in json.dumps(request["body"]["messages"])
    assert user_texts(export(rc, fork_thread)) == ["hello one", "hello two", "typed in the fork"]


def test_a_fork_that_cannot_be_written_leaves_no_thread_behind(real_claude):
    import uuid
    rc = real_claude
    source = over_trigger_session(rc)
    taken = str(uuid.uuid4())
    (rc.project_dir / f"{taken}.jsonl").write_text("")   # something is already where the fork goes
    p = rc.run_lhc("--resume", source, "--fork-session", "--session-id", taken, "-p", "x")
    assert p.returncode == 2 and "already exists" in p.stderr and "Traceback" not in p.stderr
    assert [row["current_session"] for row in threads(rc).values()] == [source]
    assert len(list((rc.iso.lhc / "threads").iterdir())) == 1


def test_the_fork_record_is_private(real_claude):
    import stat
    rc = real_claude
    source = over_trigger_session(rc)
    fork(rc, source, "in the fork")
    modes = {stat.S_IMODE(f.stat().st_mode) for f in (rc.iso.lhc / "threads").glob("*.sqlite")}
    assert modes == {0o600}


def test_a_fork_claude_refuses_to_open_is_removed_and_continue_finds_the_source(real_claude):
    rc = real_claude
    source = over_trigger_session(rc)
    p = rc.run_lhc("--resume", source, "--fork-session", "-p", "x", "--no-such-claude-option")
    assert p.returncode == 1
    assert [row["current_session"] for row in threads(rc).values()] == [source]
    assert [f.stem for f in rc.project_dir.glob("*.jsonl")] == [source]
    n = len(rc.api.message_requests)
    ok(rc.run_lhc("-c", "-p", "where were we"))
    assert rc.api.message_requests[n]["session_id"] != source       # Smart Compacted first ...
    assert len(threads(rc)) == 1                                   # ... in the source's thread


def test_a_source_with_subagent_records_is_copied_with_them(real_claude):
    rc = real_claude
    rc.api.script([tool_use_reply("Agent", {"description": "look", "prompt": "look around",
                                            "subagent_type": "general-purpose"}),
                   text_reply("the agent looked", usage=SMALL),
                   text_reply("main done", usage=SMALL)])
    source = json.loads(ok(rc.run_lhc("-p", "use an agent", "--output-format", "json")).stdout)["session_id"]
    [source_thread] = threads(rc)
    before = export(rc, source_thread)
    assert any(m.get("agent") for m in before)
    rc.api.responder = lambda body: text_reply(REPLY, usage=SMALL)
    fork(rc, source, "in the fork")
    [fork_thread] = [t for t in threads(rc) if t != source_thread]
    record = export(rc, fork_thread)
    assert record[:len(before)] == [dict(m) for m in before]


@pytest.mark.parametrize("point", cc_lhc.FORK_FAILPOINTS)
def test_a_fork_killed_at_any_step_is_gone_at_the_next_launch_and_nothing_is_lost(real_claude, point):
    assert f'failpoint("{point}")' in CC_LHC_SOURCE
    rc = real_claude
    source = over_trigger_session(rc)
    [source_thread] = threads(rc)
    before = export(rc, source_thread)
    crashed = rc.run_lhc("--resume", source, "--fork-session", "-p", "x", env={"CC_LHC_FAILPOINT": point})
    assert crashed.returncode != 0
    # the next launch (any) removes the half-made fork; a fork made again works
    answer, sent, _p = fork(rc, source, "in the fork, again")
    rows = threads(rc)
    assert sorted(row["current_session"] for row in rows.values()) == sorted([source, answer["session_id"]])
    assert all(row["origin"] != cc_lhc.FORKING for row in rows.values())
    assert export(rc, source_thread) == before
    [fork_thread] = [t for t in rows if t != source_thread]
    assert user_texts(export(rc, fork_thread)) == ["hello one", "hello two", "in the fork, again"]
    sessions = {f.stem for f in rc.project_dir.glob("*.jsonl")}
    assert sessions == {source, answer["session_id"]}         # the killed fork's session went too
    assert len(list((rc.iso.lhc / "threads").glob("*.sqlite"))) == 2


def test_a_source_whose_rebuilt_sessions_stopped_loading_is_forked_by_claude(real_claude):
    # its alarm stands: a session cc-lhc writes is what stopped loading, so Claude copies
    import sqlite3
    rc = real_claude
    source = over_trigger_session(rc)
    [source_thread] = threads(rc)
    db = sqlite3.connect(rc.iso.lhc / "registry.sqlite")
    with db:
        db.execute("INSERT INTO thread_alarms VALUES (?, 'rebuilt sessions are not loading', '2026')",
                   (source_thread,))
    db.close()
    answer, sent, p = fork(rc, source, "in the fork")
    assert "Smart Compact of the fork" not in p.stderr
    assert cc_lhc.REBUILT_MARKER not in json.dumps(sent[0]["body"]["messages"])
    assert (rc.project_dir / f"{answer['session_id']}.jsonl").exists()
