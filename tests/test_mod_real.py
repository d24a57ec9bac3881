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
from realcli import (CC_LHC, OVER_USAGE, PROMPT, exit_cleanly, log_events, message_mid_turn, new_input, thread_turns,
                     type_line, wait_for_log, wait_until)


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
             env={**rc.env, "CC_LHC_MOD": "on", **(env or {})}, cwd=rc.cwd)
    t.wait_for(PROMPT)
    return t


def with_the_mod(rc, tmux, prompt: str, answer: str, *args, env=None):
    """cc-lhc with the mod active (its handshake seen), ``prompt`` typed and ``answer`` drawn."""
    t = start(rc, tmux, *args, env=env)
    wait_for_log(rc, "mod_active")
    type_line(t, prompt)
    t.wait_for(answer)
    return t


def test_the_mod_shakes_hands_from_the_claude_child_and_details_says_so(real_claude, tmux):
    t = start(real_claude, tmux)
    wait_for_log(real_claude, "mod_active")
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


def _tool_result(request) -> dict:
    (block,) = [b for b in request["body"]["messages"][-1]["content"] if b.get("type") == "tool_result"]
    return block


def _result_text(block) -> str:
    content = block["content"]
    return content if isinstance(content, str) else "".join(c.get("text", "") for c in content)


def test_native_retrieval_tools_answer_byte_exact_without_an_approval_prompt(real_claude, tmux):
    real_claude.api.script([
        "first answer, to be read back",
        tool_use_reply("lhc_get_messages", {"messages": ["m1-m2"]}),
        tool_use_reply("Bash", {"command": "cc-lhc get-messages m1-m2", "description": "read back"}),
        "read it back",
        tool_use_reply("lhc_search", {"text": "to be read back"}),
        "searched",
        tool_use_reply("lhc_get_turns", {"turns": ["t1"]}),
        "refused as it should be",
    ])
    t = start(real_claude, tmux, "--allowedTools", "Bash")
    wait_for_log(real_claude, "mod_active")
    type_line(t, "hello, remember this")
    t.wait_for("first answer, to be read back")
    type_line(t, "read m1 and m2 back")
    screen = t.wait_for("read it back")
    assert "Do you want to proceed" not in screen
    requests = real_claude.api.message_requests
    assert set(cc_lhc.MOD_TOOLS) <= {tool["name"] for tool in requests[-1]["body"].get("tools", [])}
    native, bash = _tool_result(requests[-2]), _tool_result(requests[-1])
    assert not native.get("is_error") and not bash.get("is_error")
    text = _result_text(native)
    assert "hello, remember this" in text and "first answer, to be read back" in text
    # the same bytes the command prints (Claude's Bash tool trims the final newline)
    assert text.rstrip("\n") == _result_text(bash).rstrip("\n") and text.endswith("\n")

    type_line(t, "search it")
    t.wait_for("searched")
    found = _tool_result(real_claude.api.message_requests[-1])
    assert "m2" in _result_text(found) and not found.get("is_error")

    # a forged descriptor at the path Claude inherited: the tool answers the refusal
    (desc,) = (Path(real_claude.env["CC_LHC_HOME"]) / "runtime").glob("*.json")
    real = desc.read_text()
    desc.write_text(json.dumps(dict(json.loads(real), token="0" * 32)))
    type_line(t, "read t1")
    screen = t.wait_for("refused as it should be")
    assert "Do you want to proceed" not in screen
    refused = _tool_result(real_claude.api.message_requests[-1])
    assert refused.get("is_error") and "retrieval refused" in _result_text(refused)
    desc.write_text(real)
    exit_cleanly(t)


# -- In-process Smart Compact ------------------------------------------------------------

from fakeapi import text_reply, thinking_reply  # noqa: E402

SMALL_USAGE = {"input_tokens": 1_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
               "output_tokens": 5}


def _thinking_blocks(messages) -> list[dict]:
    return [b for m in messages if m["role"] == "assistant" and isinstance(m["content"], list)
            for b in m["content"] if b.get("type") == "thinking"]


def _rows(rc, sql, *args):
    from test_smart_compact_real import registry_rows
    return registry_rows(rc, sql, args)


def over_the_trigger_with_the_mod(rc, tmux, *args, env=None, wait_last=True):
    """A session with the mod active whose second answer (signed thinking) goes over the
    trigger at a settled seam; returns the pane once cc-lhc served the view in process."""
    rc.api.script([thinking_reply("first thought", "first answer", signature="SIG-FIRST", usage=SMALL_USAGE),
                   thinking_reply("second thought", "second answer", signature="SIG-SECOND",
                                  usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("answered on the compacted conversation", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer", *args, env=env)
    type_line(t, "second prompt")
    if wait_last:  # (a failpoint may end cc-lhc before Claude has drawn it)
        t.wait_for("second answer")
    return t


def compacted_and_answered(rc, tmux):
    """over_the_trigger_with_the_mod, then a third prompt answered on the conversation the
    mod compacted (which accepts the compaction); returns the pane."""
    t = over_the_trigger_with_the_mod(rc, tmux)
    wait_for_log(rc, "in_process_compact_served")
    type_line(t, "third prompt")
    t.wait_for("answered on the compacted conversation")
    wait_for_log(rc, "smart_compact_accepted")
    return t


def test_over_the_trigger_the_view_is_served_in_process_on_the_same_session_and_pid(real_claude, tmux):
    rc = real_claude
    t = over_the_trigger_with_the_mod(rc, tmux)
    wait_for_log(rc, "in_process_compact_served")
    before = rc.api.message_requests[-1]
    if os.environ.get("H14_TIMING"):
        import datetime
        print("OVER REQUEST", datetime.datetime.utcfromtimestamp(before["time"]).isoformat())
    type_line(t, "third prompt")
    t.wait_for("answered on the compacted conversation")
    wait_for_log(rc, "smart_compact_accepted")
    request = rc.api.message_requests[-1]
    (started,) = log_events(rc, "child_started")
    # the same session, the same Claude process: nothing was swapped
    assert request["session_id"] == before["session_id"] == started["session"]
    assert not log_events(rc, "handoff_spawned")
    (served,) = log_events(rc, "in_process_compact_started")
    assert served["session"] == started["session"]
    messages = request["body"]["messages"]
    first = messages[0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and "lhc_get_messages" in first
    assert "cc-lhc get-messages" not in first  # the header names the mod's tools
    # the kept messages went back by handle: their signed thinking is byte-identical
    assert _thinking_blocks(messages) == _thinking_blocks(before["body"]["messages"]) + [
        {"type": "thinking", "thinking": "second thought", "signature": "SIG-SECOND"}]
    texts = json.dumps(messages)
    assert cc_lhc.IN_PROCESS_VIEW_END in texts and "third prompt" in texts
    # the row is settled as accepted, and the thread did not move
    ((key, status, from_session),) = _rows(rc, "SELECT session_id, status, from_session FROM rebuilds")
    assert status == "accepted" and from_session == started["session"] and key.startswith(from_session + "#")
    # capture took the view as a rebuild: nothing of it is new content, and it goes on after
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"], "--format", "json").stdout)
    said = [m["text"] for m in record if m["kind"] == "user_text"]
    assert said.count("first prompt") == 1 and said.count("second prompt") == 1
    assert "third prompt" in said
    assert not any(cc_lhc.REBUILT_MARKER in (m["text"] or "") for m in record)
    assert not any(m["kind"] == "compact_summary" for m in record)
    assert [m["text"] for m in record if m["kind"] == "assistant_text"].count("second answer") == 1
    exit_cleanly(t)


@pytest.mark.parametrize("how", ["interactive", "one-shot"])
def test_a_session_compacted_in_process_resumes_with_each_message_once(real_claude, tmux, how):
    """The mod's compaction writes the records it kept again after its boundary, under the
    message ids they had: Claude's own resume would read each of them twice. cc-lhc's
    resume writes the session again from the thread, and Claude reads each message once."""
    rc = real_claude
    t = compacted_and_answered(rc, tmux)
    live = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    exit_cleanly(t)
    rc.api.responder = lambda body: text_reply("the fourth answer", usage=SMALL_USAGE)
    n = len(rc.api.message_requests)
    if how == "one-shot":
        p = rc.run_lhc("-c", "-p", "fourth prompt")
        assert p.returncode == 0 and "compacted inside Claude by the cc-lhc mod" in p.stderr, p.stderr
    else:
        t = start(rc, tmux, "-c")
        type_line(t, "fourth prompt")
        t.wait_for("the fourth answer")
        exit_cleanly(t)
    resumed = rc.api.message_requests[n]
    body = json.dumps(resumed["body"]["messages"])
    for said in ("second answer", "third prompt"):
        assert live.count(said) == 1 and body.count(said) == 1, said
    assert body.count("answered on the compacted conversation") == 1
    signatures = [b["signature"] for b in _thinking_blocks(resumed["body"]["messages"])]
    assert len(signatures) == len(set(signatures))
    assert log_events(rc, "resume_rewrites_in_process_compaction")


def test_a_background_job_started_before_runs_on_and_its_notification_arrives(real_claude, tmux):
    from fakeapi import tool_use_reply
    rc = real_claude
    rc.api.script([tool_use_reply("Bash", {"command": "sleep 8; echo DONE", "description": "wait",
                                           "run_in_background": True}),
                   text_reply("started it", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("noted", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "start the job", "started it", "--allowedTools", "Bash")
    wait_for_log(rc, "in_process_compact_served")
    (started,) = log_events(rc, "child_started")
    deadline = __import__("time").monotonic() + 30
    while True:  # Claude tells itself the job finished, on the compacted conversation
        told = [r for r in rc.api.message_requests if "<task-notification>" in json.dumps(r["body"]["messages"])]
        if told:
            break
        assert __import__("time").monotonic() < deadline, "no task notification reached the API"
        __import__("time").sleep(0.1)
    request = told[0]
    assert request["session_id"] == started["session"]
    assert "DONE" in json.dumps(request["body"]["messages"]) or "completed" in json.dumps(request["body"]["messages"])
    first = request["body"]["messages"][0]["content"]
    assert (first if isinstance(first, str) else first[0]["text"]).startswith(cc_lhc.REBUILT_MARKER)
    assert not log_events(rc, "handoff_spawned")
    exit_cleanly(t)


def test_with_bare_the_same_session_is_handled_by_the_swap(real_claude, tmux):
    rc = real_claude
    rc.api.script([text_reply("a long answer", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("on the swapped session", usage=SMALL_USAGE)
    t = start(rc, tmux, "--bare")
    type_line(t, "go long")
    wait_for_log(rc, "handoff_switched")
    assert not log_events(rc, "in_process_compact_started")
    type_line(t, "next")
    t.wait_for("on the swapped session")
    (started,) = log_events(rc, "child_started")
    assert rc.api.message_requests[-1]["session_id"] != started["session"]
    first = rc.api.message_requests[-1]["body"]["messages"][0]["content"]
    text = first if isinstance(first, str) else first[0]["text"]
    assert "cc-lhc get-messages" in text and "lhc_get_messages" not in text
    exit_cleanly(t)


def test_a_persons_own_compact_runs_through_the_hook_with_their_instructions(real_claude, tmux):
    rc = real_claude
    rc.api.script([thinking_reply("a thought", "first answer", signature="SIG-A", usage=SMALL_USAGE)])
    rc.api.responder = lambda body: text_reply("after my compact", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    n = len(rc.api.message_requests)
    type_line(t, "/compact keep the plan")
    wait_for_log(rc, "in_process_compact_served")
    # announced on screen (Claude redraws over it at once, so the log says what was shown)
    assert cc_lhc.InProcessCompact.PERSON in [e["text"] for e in log_events(rc, "notice")]
    assert cc_lhc.LIFECYCLE_NOTES["compact"] not in [e["text"] for e in log_events(rc, "notice")]
    assert len(rc.api.message_requests) == n  # no summary was asked for
    type_line(t, "go on")
    rc.api.wait_for_requests(n + 1)  # the notice drawn over Claude's frame garbles the screen
    messages = rc.api.message_requests[-1]["body"]["messages"]
    first = messages[0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and "keep the plan" in first
    assert {"type": "thinking", "thinking": "a thought", "signature": "SIG-A"} in _thinking_blocks(messages)
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"], "--format", "json").stdout)
    assert any("keep the plan" in (m["text"] or "") for m in record)  # the instructions are in the thread
    # the /compact itself is a turn of its own, over once Claude wrote that it compacted:
    # the seam after it is a settled one
    assert ("command", "closed", "local_command") in thread_turns(rc)[0]
    exit_cleanly(t)


def test_native_compact_keeps_claudes_own_summary(real_claude, tmux):
    rc = real_claude
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps({"nativeCompact": True}))
    rc.api.script([text_reply("first answer", usage=SMALL_USAGE)])
    rc.api.responder = lambda body: text_reply("a summary of it all", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    n = len(rc.api.message_requests)
    type_line(t, "/compact")
    wait_until(lambda: len(rc.api.message_requests) > n, "Claude asking for its own summary")
    assert not log_events(rc, "in_process_compact_started")
    shown = [e["text"] for e in log_events(rc, "notice")]
    assert cc_lhc.InProcessCompact.PERSON_NATIVE.format(why="nativeCompact is on") in shown
    exit_cleanly(t)


def test_in_process_failpoints_name_every_step():
    source = Path(cc_lhc.__file__).read_text()
    for point in cc_lhc.IN_PROCESS_FAILPOINTS:
        assert f'failpoint("{point}")' in source, point


@pytest.mark.parametrize("point", cc_lhc.IN_PROCESS_FAILPOINTS)
def test_in_process_kill_matrix(real_claude, tmux, point):
    import signal
    from test_smart_compact_real import process_gone
    rc = real_claude
    t = over_the_trigger_with_the_mod(rc, tmux, env={cc_lhc.FAILPOINT_ENV: point}, wait_last=False)
    if point == "before-acceptance":
        wait_for_log(rc, "in_process_compact_served")
        type_line(t, "third prompt")  # acceptance is Claude's next request
    assert t.wait_exit(timeout=40) == 128 + signal.SIGKILL
    assert [e["name"] for e in log_events(rc, "failpoint")] == [point]
    (started,) = log_events(rc, "child_started")
    sid = started["session"]
    assert process_gone(started["child_pid"]), "claude outlived the killed cc-lhc"
    assert [s for (s,) in _rows(rc, "SELECT status FROM rebuilds")] == ["inprocess"]
    # what Claude wrote before any compaction: every prompt and answer must stay captured
    transcript = rc.project_dir / f"{sid}.jsonl"
    kept = set()
    for line in transcript.read_bytes().splitlines():
        rec = json.loads(line)
        if rec.get("subtype") == "compact_boundary":
            break
        if rec.get("type") in ("user", "assistant") and rec.get("uuid"):
            kept.add(rec["uuid"])
    files_before = sorted(p.name for p in rc.project_dir.glob("*.jsonl"))

    # the next launch settles the row without moving any file, and Claude answers
    again = rc.run_lhc("--resume", sid, "-p", "next")
    assert again.returncode == 0, again.stderr
    assert "answered on the compacted conversation" in again.stdout
    # Claude holds each message once: a view it already wrote is never resumed as it is
    # (Claude would read the newest records it kept twice)
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert sent.count("SIG-FIRST") <= 1 and sent.count("SIG-SECOND") == 1, sent[:3000]
    assert "Traceback" not in again.stderr
    assert "in-process Smart Compact" in again.stderr
    statuses = [s for (s,) in _rows(rc, "SELECT status FROM rebuilds WHERE session_id LIKE ?", sid + "#%")]
    assert statuses == ["abandoned"]
    assert set(files_before) <= {p.name for p in rc.project_dir.glob("*.jsonl")}
    assert not (rc.iso.lhc / "abandoned-rebuilds").exists() or not list(
        (rc.iso.lhc / "abandoned-rebuilds").rglob(f"{sid}*"))
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"], "--format", "json").stdout)
    exported = {m["source_uuid"] for m in record if m["source_session"] == sid}
    assert kept <= exported, f"lost from the thread: {sorted(kept - exported)}"
    assert not any(cc_lhc.REBUILT_MARKER in (m["text"] or "") and m["source_session"] == sid for m in record)


def test_after_clear_the_new_conversation_is_compacted_without_claudes_own_summary(real_claude, tmux):
    """/clear sends the mod no handshake for the new session: cc-lhc must not type /compact
    for a session the mod does not serve (Claude's own lossy summary would run); it swaps."""
    from fakeapi import text_reply
    rc = real_claude
    rc.api.script(["before the clear", text_reply("after the clear, a long answer", usage=OVER_USAGE),
                   "on the rebuilt session"])
    t = with_the_mod(rc, tmux, "one", "before the clear")
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    type_line(t, "two")
    t.wait_for("after the clear, a long answer")
    wait_for_log(rc, "handoff_switched")
    t.wait_for(PROMPT)
    type_line(t, "three")
    t.wait_for("on the rebuilt session")
    exit_cleanly(t)
    assert log_events(rc, "mod_unbound") and not log_events(rc, "native_compact")
    assert not log_events(rc, "in_process_compact_started")

def test_a_clear_right_after_an_in_process_compact_leaves_the_new_conversation_governed(real_claude, tmux):
    """A Smart Compact served in process, then /clear before any request on it: Claude will
    never send one on that conversation, so the compaction is settled with the old thread
    then; the new conversation is governed from its first line. It stayed "already under
    way" for good: the new thread went far over the trigger and nothing ever ran, and the
    old thread's compaction was accepted under the new thread's id at exit."""
    from fakeapi import text_reply
    rc = real_claude
    rc.api.script([text_reply("first answer, big", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("later answer, big", usage=OVER_USAGE)
    t = with_the_mod(rc, tmux, "one", "first answer, big")
    wait_for_log(rc, "in_process_compact_served")
    (first,) = log_events(rc, "in_process_compact_started")
    t.wait_for("Compacted")
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    (followed,) = log_events(rc, "session_followed")
    t.wait_for(PROMPT)
    type_line(t, "two")
    t.wait_for("later answer, big")
    wait_until(lambda: len(log_events(rc, "in_process_compact_started") + log_events(rc, "handoff_switched")) >= 2,
               "a Smart Compact of the new conversation")
    exit_cleanly(t)
    accepted = [e for e in log_events(rc, "smart_compact_accepted") if e.get("key") == first["key"]]
    assert [e["thread"] for e in accepted] == [first["thread"]] != [followed["thread"]]


def test_the_panels_export_with_the_mod_active_writes_the_view_it_would_install(real_claude, tmux):
    """/export writes the view Smart Compact would serve now: with the mod active that is
    the one installed in the running Claude, which names the mod's tools."""
    rc = real_claude
    rc.api.script(["the answer is 4242"])
    t = with_the_mod(rc, tmux, "what is the answer?", "the answer is 4242")
    wait_until(lambda: thread_turns(rc)[0], "the answer captured")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/export")
    t.wait_for("served view, to read")
    (event,) = log_events(rc, "panel_export")
    view = Path(event["view_markdown"]).read_text(encoding="utf-8")
    assert "lhc_get_turns" in view and "run these through Bash" not in view
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    exit_cleanly(t)


def test_a_sentence_typed_through_the_start_of_a_compaction_is_dropped_whole(real_claude, tmux):
    """A person types a sentence at an even pace as cc-lhc starts compacting in process
    after an answer that went over the trigger: its first keys are dropped, and so is the rest,
    typed on without a pause; Claude's box is left empty and the person is asked to
    resend. The rest used to land in the box ("eck the deploy script now"), ready to be
    sent clipped."""
    import time
    rc = real_claude
    rc.api.script([text_reply("first answer, big", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("small", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "one", "first answer, big")
    # (typed from the moment it starts: a draft typed before would hold it back until sent)
    wait_for_log(rc, "in_process_compact_started")
    sentence = "please also check the deploy script and the release notes now"
    for ch in sentence:
        t.send_text(ch)
        time.sleep(0.05)
    wait_for_log(rc, "in_process_compact_served")
    assert [e for e in log_events(rc, "notice") if e["text"] == cc_lhc.LiveHandoff.NOTICE]
    time.sleep(cc_lhc.Relay.DROP_PAUSE_SECONDS + 0.5)
    box = [row for row in t.capture().splitlines() if row.startswith("\u276f")][-1]
    assert box[1:].strip() == "", box
    type_line(t, "resent")  # after a pause, typing reaches Claude again
    t.wait_for("small")
    exit_cleanly(t)


def test_after_clear_a_persons_own_compact_still_goes_through_the_hook(real_claude, tmux):
    """/clear gives no handshake, but the mod's compact hook asking for a view for the new
    session through its descriptor shows the mod serves it: the person's /compact is
    cc-lhc's view, not Claude's own lossy summary."""
    rc = real_claude
    rc.api.script(["before the clear", "after the clear"])
    rc.api.responder = lambda body: text_reply("after my compact", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "one", "before the clear")
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    type_line(t, "two")
    t.wait_for("after the clear")
    n = len(rc.api.message_requests)
    type_line(t, "/compact keep it")
    wait_for_log(rc, "in_process_compact_served")
    assert len(rc.api.message_requests) == n  # no summary was asked for
    assert not log_events(rc, "native_compact")
    [rebound] = [e for e in log_events(rc, "mod_active") if e.get("by")]
    type_line(t, "go on")
    rc.api.wait_for_requests(n + 1)
    first = rc.api.message_requests[-1]["body"]["messages"][0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and "keep it" in first
    assert rc.api.message_requests[-1]["session_id"] == rebound["session"]
    exit_cleanly(t)


def test_when_the_hook_declines_the_swap_handles_the_seam_and_the_session_goes_on(real_claude, tmux):
    """CC_LHC_MOD_COMPACT=decline makes the mod's hook decline the view cc-lhc typed
    /compact for (as it does a view it cannot use): the conversation stays as it was,
    cc-lhc says once that it swaps instead, and the swap serves the seam."""
    rc = real_claude
    t = over_the_trigger_with_the_mod(rc, tmux, env={"CC_LHC_MOD_COMPACT": "decline"})
    wait_for_log(rc, "handoff_switched")
    (refused,) = log_events(rc, "in_process_compact_refused")
    why = "the cc-lhc mod declined it: CC_LHC_MOD_COMPACT=decline"
    assert refused["why"] == why
    shown = [e["text"] for e in log_events(rc, "notice")]
    assert shown.count(cc_lhc.InProcessCompact.FALLBACK.format(why=why)) == 1
    n = len(rc.api.message_requests)
    assert n == 2  # the hook left the conversation as it was: no summary was asked for
    type_line(t, "third prompt")
    t.wait_for("answered on the compacted conversation")
    wait_for_log(rc, "smart_compact_accepted")
    (started,) = log_events(rc, "child_started")
    request = rc.api.message_requests[-1]
    assert request["session_id"] != started["session"]  # a replacement Claude, on its own session
    first = request["body"]["messages"][0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and "third prompt" in json.dumps(request["body"]["messages"])
    statuses = sorted(s for (s,) in _rows(rc, "SELECT status FROM rebuilds"))
    assert statuses == ["abandoned", "accepted"]  # the in-process attempt, then the swap
    assert len(log_events(rc, "in_process_compact_refused")) == 1
    exit_cleanly(t)
    # the /compact Claude declined is a settled turn of its own (its output says so), so
    # the swap never waits on it for a later seam
    assert thread_turns(rc)[0][2] == ("command", "closed", "local_command")


@pytest.mark.parametrize("mod", ["on", "off"])
def test_a_draft_in_claudes_box_waits_for_the_person_and_smart_compact_follows_its_answer(
        real_claude, tmux, mod):
    """The person writes the next prompt (two lines, not sent) while Claude answers the one
    that goes over the trigger. Typing /compact now would send the draft with it, and a swap
    would end the Claude holding it: Smart Compact waits. The draft, sent later, is a prompt
    of its own, and the seam after its answer is compacted."""
    import threading
    rc, hold, sent = real_claude, threading.Event(), []
    from fakeapi import text_reply, user_texts

    def answer(body):
        texts = user_texts(body)
        if texts and "DRAFTLINE-TWO" in texts[-1] and not sent:
            sent.append(texts[-1])
            return text_reply("answered the draft", usage=OVER_USAGE)
        if texts and "first prompt" in texts[-1] and not hold.is_set():
            return dict(text_reply("first answer", usage=OVER_USAGE), hold=hold)
        return "plain"
    rc.api.responder = answer
    t = start(rc, tmux, env={"CC_LHC_MOD": mod})
    if mod == "on":
        wait_for_log(rc, "mod_active")
    type_line(t, "first prompt")
    rc.api.wait_for_requests(1, answered=False)
    t.send_text("DRAFTLINE-ONE")
    t.send_text("\\")
    t.send_keys("Enter")
    t.send_text("DRAFTLINE-TWO")
    t.wait_for("DRAFTLINE-TWO")
    hold.set()
    t.wait_for("first answer")
    wait_for_log(rc, "handoff_waits_for_person")
    (waited,) = log_events(rc, "handoff_waits_for_person")[:1]
    assert "input box holds a message not sent yet" in waited["why"] and not waited["manual"]
    assert not log_events(rc, "in_process_compact_started") and not log_events(rc, "handoff_spawned")
    assert "DRAFTLINE-ONE" in t.capture()  # still in the box, as the person left it
    assert not [r for r in rc.api.message_requests if "DRAFTLINE" in json.dumps(r["body"]["messages"])]
    t.send_keys("Enter")  # the person sends it
    wait_until(lambda: sent, "the draft sent as a prompt")
    assert "DRAFTLINE-ONE" in sent[0] and "/compact" not in sent[0]
    wait_for_log(rc, "in_process_compact_served" if mod == "on" else "handoff_switched", timeout=60)
    exit_cleanly(t)


def test_an_earlier_prompt_brought_back_with_up_is_a_draft_smart_compact_waits_for(real_claude, tmux):
    """While Claude answers over the trigger, the person presses Up twice and brings back an
    earlier prompt of two lines: nothing typed shows it, yet typing ctrl-u and /compact under
    it would send its first line with "/compact". Smart Compact waits; sent again, it is the
    same prompt, and the seam after its answer is compacted."""
    import threading
    rc, hold, again = real_claude, threading.Event(), []
    from fakeapi import text_reply, user_texts

    def answer(body):
        texts = user_texts(body)
        last = texts[-1] if texts else ""
        if "RECALL-TWO" in last:
            again.append(last)
            return text_reply("answered it again", usage=OVER_USAGE) if len(again) > 1 else "plain"
        if "first prompt" in last and not hold.is_set():
            return dict(text_reply("first answer", usage=OVER_USAGE), hold=hold)
        return "plain"
    rc.api.responder = answer
    t = start(rc, tmux, env={"CC_LHC_MOD": "on"})
    wait_for_log(rc, "mod_active")
    t.send_text("RECALL-ONE")
    t.send_text("\\")
    t.send_keys("Enter")
    t.send_text("RECALL-TWO")
    t.send_keys("Enter")
    wait_until(lambda: again, "the two-line prompt answered")
    t.wait_for("plain")
    type_line(t, "first prompt")
    rc.api.wait_for_requests(2, answered=False)
    t.send_keys("Up")
    t.wait_for("History 2/2")  # (Claude reads one Up at a time)
    t.send_keys("Up")
    t.wait_for("History 1/2")
    hold.set()
    t.wait_for("first answer")
    wait_for_log(rc, "handoff_waits_for_person")
    assert not log_events(rc, "in_process_compact_started") and not log_events(rc, "handoff_spawned")
    assert not [r for r in rc.api.message_requests if "/compact" in json.dumps(r["body"]["messages"])]
    t.send_keys("Enter")  # the person sends it again
    wait_until(lambda: len(again) > 1, "the recalled prompt sent")
    assert "RECALL-ONE" in again[1] and "/compact" not in again[1]
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    exit_cleanly(t)


def test_a_message_typed_mid_turn_goes_back_to_claude_by_its_handle(real_claude, tmux):
    """A message sent while Claude works is a queued_command attachment Claude holds among
    its messages: the in-process view hands it back by its uuid like any newest record."""
    import threading
    rc, hold = real_claude, threading.Event()
    from fakeapi import text_reply, tool_use_reply
    rc.api.script([dict(tool_use_reply("Bash", {"command": "echo ran"}), hold=hold),
                   text_reply("answered both", usage=OVER_USAGE), "after the compact"])
    t = start(rc, tmux, "--allowedTools", "Bash", env={"CC_LHC_MOD": "on"})
    wait_for_log(rc, "mod_active")
    message_mid_turn(rc, t, hold)
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    assert not log_events(rc, "in_process_compact_refused")
    type_line(t, "next")
    t.wait_for("after the compact")
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert "QUEUED-WORDS also check the date" in sent and "run the thing" in sent
    # once: inside the result it came with, which goes back by its handle (it was also
    # given back as words of its own, so the model read it twice)
    assert sent.count("QUEUED-WORDS also check the date") == 1
    exit_cleanly(t)


def test_a_too_long_rejection_of_the_compacted_conversation_is_not_its_acceptance(real_claude, tmux):
    # Served in process, then the API refuses the first request on the compacted
    # conversation as too long: the in-process compact is not accepted by that error, and
    # the rejection is handled as any other (a swap onto a rebuilt session, continued once).
    from fakeapi import error_reply, text_reply
    rc = real_claude
    rc.api.script([text_reply("first answer", usage=SMALL_USAGE), text_reply("second answer", usage=OVER_USAGE),
                   error_reply(400, "prompt is too long: 250000 tokens > 200000 maximum")])
    rc.api.responder = lambda body: text_reply("recovered fine", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    type_line(t, "second prompt")
    t.wait_for("second answer")
    wait_for_log(rc, "in_process_compact_served")
    type_line(t, "third prompt")
    wait_for_log(rc, "too_long_continued", timeout=60)
    t.wait_for("recovered fine", timeout=30)
    assert [e["why"] for e in log_events(rc, "in_process_compact_refused")] == [
        "the API refused the compacted conversation as too long"]
    accepted = [e for e in log_events(rc, "smart_compact_accepted") if e.get("in_process")]
    exit_cleanly(t)
    assert not accepted, accepted


def test_the_persons_compact_just_after_one_is_not_claudes_summary(real_claude, tmux):
    # cc-lhc's compact is installed and nothing was sent on it yet: a /compact typed now has
    # nothing older to compact, so it is skipped at once (never Claude's own summary).
    import time
    from fakeapi import text_reply
    rc = real_claude
    rc.api.script([text_reply("first answer", usage=SMALL_USAGE), text_reply("second answer", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("answered after it", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    type_line(t, "second prompt")
    wait_for_log(rc, "in_process_compact_served")
    t.wait_for(PROMPT)
    n = len(rc.api.message_requests)
    began = time.monotonic()
    type_line(t, "/compact keep the plan")
    wait_for_log(rc, "person_compact_skipped")
    t.wait_for("compacted this conversation a moment ago")
    assert time.monotonic() - began < cc_lhc.MOD_COMPACT_WAIT
    assert len(rc.api.message_requests) == n                     # no summary was asked for
    type_line(t, "third prompt")
    wait_until(lambda: rc.api.message_requests[n:], "the third prompt's request")
    (request,) = rc.api.message_requests[n:]
    assert "third prompt" in json.dumps(request["body"]["messages"][-1])
    first = request["body"]["messages"][0]["content"]
    assert (first if isinstance(first, str) else first[0]["text"]).startswith(cc_lhc.REBUILT_MARKER)
    exit_cleanly(t)


def test_a_dialog_open_at_the_seam_holds_smart_compact_back_until_the_next_one(real_claude, tmux):
    # The ctrl-o transcript view is open when the answer over the trigger ends: a typed
    # /compact would go to it, so Smart Compact waits; the seam after the next answer over
    # the trigger is compacted in process, as usual. (The /model picker and the other
    # dialogs are told the same way: tests/test_relay.py.)
    import threading
    from fakeapi import text_reply, user_texts
    rc, hold = real_claude, threading.Event()

    def answer(body):
        last = (user_texts(body) or [""])[-1]
        if "second prompt" in last and not hold.is_set():
            return dict(text_reply("second answer", usage=OVER_USAGE), hold=hold)
        if "third prompt" in last:
            return text_reply("third answer", usage=OVER_USAGE)
        return text_reply("plain", usage=SMALL_USAGE)
    rc.api.responder = answer
    t = with_the_mod(rc, tmux, "first prompt", "plain")
    type_line(t, "second prompt")
    wait_until(lambda: any("second prompt" in json.dumps(r["body"]["messages"][-1:])
                           for r in rc.api.message_requests), "the second prompt's request")
    t.send_keys("C-o")
    hold.set()
    wait_for_log(rc, "handoff_waits_for_person")
    (waited,) = log_events(rc, "handoff_waits_for_person")[:1]
    assert "dialog" in waited["why"]
    assert not log_events(rc, "in_process_compact_started") and not log_events(rc, "in_process_compact_refused")
    t.send_keys("C-o")
    t.wait_for(PROMPT)
    type_line(t, "third prompt")
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    assert not log_events(rc, "in_process_compact_refused") and not log_events(rc, "handoff_spawned")
    exit_cleanly(t)


def test_a_long_agentic_turn_keeps_its_newest_calls_by_handle_in_process(real_claude, tmux):
    # One prompt and more tool output than the target holds: the newest turn cannot be
    # verbatim from its prompt on, so the view hands back its newest responses by handle
    # (their tool calls with their results, the last answer's signed thinking) instead of
    # flattening the whole turn into the header's text.
    rc = real_claude
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": 9000}))
    calls = 8
    command = "seq -f 'step {i} line %g of the build log: ok' 1 250"
    rc.api.script([tool_use_reply("Bash", {"command": command.format(i=i), "description": f"step {i}"},
                                  usage=SMALL_USAGE) for i in range(calls)]
                  + [thinking_reply("last thought", "build finished", signature="SIG-LAST", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("answered after the long turn", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "run the build", "build finished", "--allowedTools", "Bash")
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    type_line(t, "what next?")
    t.wait_for("answered after the long turn")
    messages = rc.api.message_requests[-1]["body"]["messages"]
    first = messages[0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and "run the build" in first
    assert cc_lhc.IN_PROCESS_ACK not in json.dumps(messages)
    results = [b for m in messages if isinstance(m["content"], list) for b in m["content"]
               if b.get("type") == "tool_result"]
    uses = {b["id"] for m in messages if isinstance(m["content"], list) for b in m["content"]
            if b.get("type") == "tool_use"}
    assert results and uses == {b["tool_use_id"] for b in results}  # each call with its result
    assert "step 7 line 250 of the build log: ok" in json.dumps(results)  # the newest, verbatim
    assert {"type": "thinking", "thinking": "last thought", "signature": "SIG-LAST"} in _thinking_blocks(messages)
    # right after the header comes the first verbatim response, a call of the long turn
    after = next(m for m in messages[1:] if m["role"] == "assistant")
    assert [b["type"] for b in after["content"]] == ["tool_use"]
    exit_cleanly(t)


def test_a_call_whose_output_claude_saved_to_a_file_goes_back_by_its_handle(real_claude, tmux):
    # Claude keeps only a preview of a large output (the file beside the session holds the
    # rest, and the thread a copy of it); the record is still one message of the view, so
    # the in-process view hands it back whole rather than as text.
    rc = real_claude
    cmd = "python3 -c \"[print(f'row {i} filler-filler-filler-filler') for i in range(6000)]\""
    rc.api.script([tool_use_reply("Bash", {"command": cmd, "description": "a large output"}, usage=SMALL_USAGE),
                   thinking_reply("saw the rows", "rows seen", signature="SIG-ROWS", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("answered on the compacted conversation", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "print the rows", "rows seen", "--allowedTools", "Bash")
    wait_for_log(rc, "in_process_compact_served", timeout=60)
    type_line(t, "and now?")
    t.wait_for("answered on the compacted conversation")
    messages = rc.api.message_requests[-1]["body"]["messages"]
    (result,) = [b for m in messages if isinstance(m["content"], list) for b in m["content"]
                 if b.get("type") == "tool_result"]
    assert "<persisted-output>" in json.dumps(result)
    assert {"type": "thinking", "thinking": "saw the rows", "signature": "SIG-ROWS"} in _thinking_blocks(messages)
    exit_cleanly(t)


@pytest.mark.parametrize("where", ["outside", "inside"])
def test_a_file_read_by_an_earlier_claude_outside_the_project_is_kept_editable(real_claude, tmux, tmp_path, where):
    """Claude 2.1.328 forgets, when it compacts, the files it knows as read only from the
    transcript it resumed: Edit then refuses one outside the project ("File has not been
    read yet"). Such a session is compacted by the swap, whose resume carries them; a file
    inside the project Edit takes anyway, so that one stays in process."""
    rc = real_claude
    folder = (tmp_path / "elsewhere") if where == "outside" else (rc.cwd / "src")
    folder.mkdir()
    target = folder / "calc.py"
    target.write_text("def div(a, b):\n    return round(a / b, 2)\n")
    rc.api.script([tool_use_reply("Read", {"file_path": str(target)}, usage=SMALL_USAGE),
                   text_reply("read it", usage=SMALL_USAGE)])
    p = rc.run_lhc("-p", "read calc.py", "--output-format", "json", "--allowedTools", "Read")
    assert p.returncode == 0, p.stderr
    session = json.loads(p.stdout)["session_id"]
    rc.api.script([text_reply("looked again", usage=OVER_USAGE)])
    t = start(rc, tmux, "--allowedTools", "Read,Edit", "--resume", session)
    wait_for_log(rc, "mod_active")
    type_line(t, "one more look")
    t.wait_for("looked again")
    wait_for_log(rc, "handoff_switched" if where == "outside" else "in_process_compact_served", timeout=60)
    t.wait_for(PROMPT)
    rc.api.script([tool_use_reply("Edit", {"file_path": str(target), "old_string": "round(a / b, 2)",
                                           "new_string": "round(a / b, 4)"}, usage=SMALL_USAGE),
                   text_reply("EDITED", usage=SMALL_USAGE)])
    type_line(t, "now edit it")
    t.wait_for("EDITED")
    exit_cleanly(t)
    assert "round(a / b, 4)" in target.read_text()
    if where == "outside":
        (skipped,) = log_events(rc, "in_process_compact_skipped")
        assert skipped["files"] == [str(target)] and not log_events(rc, "in_process_compact_served")
    else:
        assert not log_events(rc, "handoff_switched") and not log_events(rc, "in_process_compact_skipped")


def test_later_views_leave_out_the_compact_command_cc_lhc_typed(real_claude, tmux):
    """The `/compact` cc-lhc types for an in-process Smart Compact is kept in the thread as
    Claude wrote it (caveat, command, "Compacted" with terminal escapes), and no later view
    gives it to the model again (each compaction added one such turn to the next view)."""
    import time
    rc = real_claude
    rc.api.script([text_reply("first answer", usage=SMALL_USAGE), text_reply("second answer", usage=OVER_USAGE),
                   text_reply("third answer", usage=SMALL_USAGE), text_reply("fourth answer", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("later answer", usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    type_line(t, "second prompt")
    t.wait_for("second answer")
    wait_for_log(rc, "in_process_compact_served")
    t.wait_for(PROMPT)
    type_line(t, "third prompt")
    t.wait_for("third answer")
    type_line(t, "fourth prompt")
    t.wait_for("fourth answer")
    wait_for_log(rc, "in_process_compact_served", count=2, timeout=60)
    t.wait_for(PROMPT)
    time.sleep(0.5)
    type_line(t, "fifth prompt")
    t.wait_for("later answer")
    exit_cleanly(t)
    header = rc.api.message_requests[-1]["body"]["messages"][0]["content"]
    header = header if isinstance(header, str) else header[0]["text"]
    assert "\x1b[" not in header and cc_lhc.COMPACT_COMMAND not in header
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread, *_),) = cc_lhc.Registry(home).threads()
    export = json.loads(rc.run([sys.executable, CC_LHC, "export", thread]).stdout)
    assert sum(cc_lhc.COMPACT_COMMAND in (m.get("text") or "") for m in export) == 2  # (kept in the thread)


def test_a_local_commands_caveat_at_the_start_of_the_kept_turns_is_sent_once(real_claude, tmux):
    """A `/clear`, then `/compact keep it` served in process: the kept turns start at the
    /clear command, whose handle brings its caveat along, so the caveat is not also rendered
    into the header (it was sent twice)."""
    import time
    from fakeapi import user_texts
    rc = real_claude
    rc.api.responder = lambda body: text_reply("reply to " + (user_texts(body) or [""])[-1][-8:], usage=SMALL_USAGE)
    t = with_the_mod(rc, tmux, "one", "reply to")
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    t.wait_for(PROMPT)
    type_line(t, "two")
    t.wait_for("reply to two")
    type_line(t, "/compact keep it")
    wait_for_log(rc, "in_process_compact_served")
    time.sleep(1)
    t.wait_for(PROMPT)
    n = len(rc.api.message_requests)
    type_line(t, "three")
    rc.api.wait_for_requests(n + 1)
    exit_cleanly(t)
    before = json.dumps(rc.api.message_requests[-2]["body"]["messages"])  # (the request for "two")
    after = json.dumps(rc.api.message_requests[-1]["body"]["messages"])   # (and for "three")
    caveat = "local-command-caveat>The command below"
    assert "two" in before and "three" in after
    assert before.count(caveat) == 1 and after.count(caveat) == 2  # (the /clear's, and the /compact's own)


def test_an_in_app_resume_of_a_session_compacted_in_process_is_compacted_again(real_claude, tmux):
    """/resume back (in Claude) to a session the mod compacted: Claude reads it back holding
    its newest turns twice (text and signed thinking repeated), as a launch's resume would,
    so cc-lhc compacts it again at once, before Claude's next request (that request held
    each kept message twice, and in a longer day the whole older conversation)."""
    import time
    rc = real_claude
    t = compacted_and_answered(rc, tmux)
    sid = rc.api.message_requests[-1]["session_id"]
    time.sleep(1)
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    t.wait_for(PROMPT)
    time.sleep(1)
    n = len(rc.api.message_requests)
    type_line(t, "on the new conversation")
    rc.api.wait_for_requests(n + 1)
    time.sleep(1.5)
    type_line(t, f"/resume {sid}")
    wait_for_log(rc, "session_followed", count=2)
    wait_for_log(rc, "resume_rewrites_in_process_compaction")
    wait_for_log(rc, "smart_compact_accepted", count=2, timeout=60)
    time.sleep(1)
    n = len(rc.api.message_requests)
    type_line(t, "fourth prompt")
    rc.api.wait_for_requests(n + 1)
    body = json.dumps(rc.api.message_requests[n]["body"]["messages"])
    assert body.count("second answer") == 1 and body.count("first answer") <= 1
    assert cc_lhc.IN_PROCESS_VIEW_END not in body and cc_lhc.COMPACT_COMMAND not in body
    exit_cleanly(t)


@pytest.mark.parametrize("then", ["answer", "parallel calls"])
def test_a_background_agent_that_ran_a_tool_leaves_the_in_process_smart_compact_to_the_mod(
        real_claude, tmux, then):
    """Claude Code 2.1.328 writes a record naming the tools a background agent ran just
    before its summary (isMeta, turnCompanion), and keeps no message of it: the view asked
    for it by handle, the mod declined every such compaction and the swap ran instead. The
    view leaves it out, and the mod serves it."""
    from fakeapi import text_reply
    rc, task = real_claude, "AGENT-TASK-bg-tool"

    def respond(body):
        said = new_input({"body": body})
        if task in json.dumps(body["messages"][:1]):
            if "SUB-OUT-1" in json.dumps(body["messages"]):
                return "AGENT-RESULT-1"
            return tool_use_reply("Bash", {"command": "echo SUB-OUT-1", "description": "s"})
        if "P3-OUT" in said:
            return text_reply("all done", usage=OVER_USAGE)
        if "task-notification" in said:
            if then == "parallel calls":
                return {"content": [{"type": "tool_use", "name": "Bash", "input": {
                    "command": f"echo P{i}-OUT", "description": f"p{i}"}} for i in (1, 2, 3)]}
            return text_reply("saw the agent finish", usage=OVER_USAGE)
        if "start the work" in said:
            return tool_use_reply("Agent", {"description": "look", "prompt": task, "run_in_background": True})
        return "agent started" if "Async agent launched" in said else "later answer"
    rc.api.responder = respond
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Agent", "Bash"],
             cols=120, rows=36, env={**rc.env, "CC_LHC_MOD": "on"}, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    wait_for_log(rc, "mod_active", timeout=60)
    type_line(t, "start the work")
    wait_until(lambda: log_events(rc, "in_process_compact_served") or log_events(rc, "in_process_compact_refused"),
               "the in-process Smart Compact served or refused", timeout=60)
    assert not log_events(rc, "in_process_compact_refused")
    assert not log_events(rc, "handoff_spawned")
    exit_cleanly(t)


@pytest.mark.parametrize("typed", ["/compact keep the auth notes", "/compac", "/comp\tkeep the auth notes",
                                   "/compact keep the auth notes\nthird prompt"])
def test_a_compact_the_person_queued_while_claude_answered_is_the_one_that_runs(real_claude, tmux, typed):
    """A /compact typed while Claude streams an answer that takes the session over the
    trigger waits in Claude's queue until that answer ends, at the very seam cc-lhc would
    compact. cc-lhc typed its own /compact there too: the hook served cc-lhc's view for the
    person's command (their words left out of the header), and cc-lhc's own then ran as a
    second command the person never typed ("Not compacted"). The seam is now theirs: one
    compaction, through the hook, with their words."""
    import threading
    import time
    rc = real_claude
    hold = threading.Event()

    def respond(body):
        said = new_input({"body": body})
        if "second prompt" in said:
            return dict(thinking_reply("t-two", "second answer", signature="SIG-B", usage=OVER_USAGE), hold=hold)
        if "first prompt" in said:
            return thinking_reply("t-one", "first answer", signature="SIG-A", usage=SMALL_USAGE)
        return text_reply("THIRD-ANSWER" if "third prompt" in said else "UNEXPECTED-REQUEST", usage=SMALL_USAGE)
    rc.api.responder = respond
    t = with_the_mod(rc, tmux, "first prompt", "first answer")
    type_line(t, "second prompt")
    rc.api.wait_for_requests(2, answered=False)
    for line in typed.split("\n"):  # (Claude queues it; "/compac" and Tab: its menu finishes it)
        head, tab, words = line.partition("\t")
        if tab:
            t.send_text(head)
            t.send_keys("Tab")
            type_line(t, words)
        else:
            type_line(t, line)
    time.sleep(0.3)
    hold.set()
    t.wait_for("second answer")
    wait_for_log(rc, "in_process_compact_served")
    t.wait_for(PROMPT)
    if "third prompt" not in typed:
        type_line(t, "third prompt")
    t.wait_for("THIRD-ANSWER")
    requests = rc.api.message_requests
    assert [new_input(r) for r in requests[2:] if "third prompt" not in json.dumps(r["body"])] == []
    (third,) = [r for r in requests if "third prompt" in json.dumps(r["body"]["messages"])]
    first = third["body"]["messages"][0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith(cc_lhc.REBUILT_MARKER) and ("keep the auth notes" in first) == ("keep" in typed)
    body = json.dumps(third["body"]["messages"])
    assert body.count("second answer") == 1 and body.count(cc_lhc.REBUILT_MARKER) == 1
    assert "Not compacted" not in body
    assert len(log_events(rc, "in_process_compact_served")) == 1 and not log_events(rc, "person_compact_skipped")
    assert cc_lhc.InProcessCompact.PERSON in [e["text"] for e in log_events(rc, "notice")]
    exit_cleanly(t)
