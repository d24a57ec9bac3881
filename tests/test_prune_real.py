"""Smart Prune and the thinking replay fallback with the real Claude Code CLI and the fake API.

Prune from the panel in tmux, automatic prune enabled by project config (at a live seam
and before a one-shot), each ending on a rebuilt session the real `claude --resume`
continues, with the pruned turns named as not in view. Then the thinking fallback: the
API refuses the first request of a rebuild over its replayed thinking, and the next
invocation rebuilds the thread with thinking left out.
"""

from __future__ import annotations

import json
import sys

import cc_lhc
from fakeapi import error_reply, text_reply, thinking_reply
from realcli import CC_LHC, PROMPT, exit_cleanly, type_line, wait_for_log
from test_smart_compact_real import (SMALL, SMALL_REPLY, first_text, lhc, ok, rebuilds, threads,
                                     usage)

PRUNE_CONFIG = {"pruneEnabled": True, "pruneThresholdTokens": 100_000, "pruneTargetTokens": 3_000}
BIG = "x" * 4_000  # about 1,000 tokens a prompt


def long_thread(rc, turns=6, last_usage=SMALL) -> str:
    """A thread of `turns` one-shots with big prompts; the newest reply reports last_usage."""
    rc.api.script([text_reply("answer 1", usage=SMALL if turns > 1 else last_usage)])
    sid = json.loads(ok(lhc(rc, "-p", f"question 1 {BIG}", "--output-format", "json")).stdout)["session_id"]
    for i in range(2, turns + 1):
        rc.api.script([text_reply(f"answer {i}", usage=last_usage if i == turns else SMALL)])
        ok(lhc(rc, "--resume", sid, "-p", f"question {i} {BIG}"))
    rc.api.responder = lambda body: text_reply(SMALL_REPLY, usage=SMALL)
    return sid


def opening(request) -> str:
    return first_text(request["body"]["messages"][0])


def assert_pruned(request, kept_from: int):
    """The request opens a rebuilt view that names turns t1..t(kept_from - 1) as not in
    view and holds the turns from kept_from on verbatim."""
    head = opening(request)
    assert head.startswith(cc_lhc.REBUILT_MARKER)
    assert cc_lhc.omitted_line(1, kept_from - 1) in head.splitlines(), head
    sent = json.dumps(request["body"]["messages"])
    assert "question 1 " not in sent and f"question {kept_from} " in sent


def omitted_upto(head: str) -> int:
    line = next(x for x in head.splitlines() if x.endswith("not in view; use get-turns"))
    return int(line.split("\u2013t")[1].split()[0])


def boundary_of(rc, thread_id) -> int:
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    store = cc_lhc.ThreadStore(home, thread_id)
    try:
        return cc_lhc.visibility_boundary(store)
    finally:
        store.close()


# -- Smart Prune ------------------------------------------------------------------------------

def test_smart_prune_from_the_panel_hands_over_to_a_pruned_session(real_claude, tmux):
    rc = real_claude
    old = long_thread(rc)
    n = len(rc.api.message_requests)
    rc.api.responder = None
    rc.api.script(["answered on the pruned session"])
    t = tmux([sys.executable, CC_LHC, "--resume", old], cols=120, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/smart-prune 9000000")  # everything fits: nothing moves, nothing hands over
    t.wait_for("nothing to prune")
    type_line(t, "/smart-prune 0")
    t.wait_for("nothing changed")        # out of range: refused
    type_line(t, "/smart-prune 3000")
    wait_for_log(rc, "handoff_switched")
    t.wait_for(PROMPT)
    type_line(t, "carry on")
    t.wait_for("answered on the pruned session")
    exit_cleanly(t)
    [request] = rc.api.message_requests[n:]
    assert request["session_id"] != old
    kept_from = omitted_upto(opening(request)) + 1
    assert 2 < kept_from <= 6
    assert_pruned(request, kept_from)
    assert "carry on" in json.dumps([m for m in request["body"]["messages"] if m["role"] == "user"][-1])
    [row] = threads(rc)
    assert row["current_session"] == request["session_id"]
    assert boundary_of(rc, row["id"]) > 0
    assert [r[2] for r in rebuilds(rc)] == ["accepted"]
    log = (rc.iso.lhc / "wrapper.log").read_text()
    assert log.count('"event": "prune_unchanged"') == 1


def test_automatic_prune_enabled_by_project_config_runs_at_a_live_seam(real_claude, tmux):
    rc = real_claude
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(PRUNE_CONFIG))
    old = long_thread(rc)
    n = len(rc.api.message_requests)
    rc.api.responder = None
    # 120k: over the prune threshold, under the 360k Smart Compact trigger
    rc.api.script([text_reply("a long answer", usage=usage(120_000)), "after the prune"])
    t = tmux([sys.executable, CC_LHC, "--resume", old], cols=120, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "question 7 go long")
    t.wait_for("a long answer")
    wait_for_log(rc, "handoff_switched")
    t.wait_for(PROMPT)
    type_line(t, "next one")
    t.wait_for("after the prune")
    exit_cleanly(t)
    first, second = rc.api.message_requests[n:]
    assert first["session_id"] == old != second["session_id"]
    assert_pruned(second, omitted_upto(opening(second)) + 1)
    assert "question 7" in json.dumps(second["body"]["messages"])
    assert [r[2] for r in rebuilds(rc)] == ["accepted"]


def test_automatic_prune_runs_before_a_oneshot_over_the_threshold(real_claude):
    rc = real_claude
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(PRUNE_CONFIG))
    old = long_thread(rc, last_usage=usage(120_000))
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert SMALL_REPLY in p.stdout and "Smart Prune" in p.stderr, p.stderr
    [request] = rc.api.message_requests[n:]
    new = request["session_id"]
    assert new != old
    assert_pruned(request, omitted_upto(opening(request)) + 1)
    [row] = threads(rc)
    assert row["current_session"] == new and boundary_of(rc, row["id"]) > 0
    assert rebuilds(rc) == [(new, old, "accepted")]
    # the pruned session reports a small context: the next one-shot neither prunes nor compacts
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "later"))
    assert "Smart Prune" not in p.stderr and "Smart Compact" not in p.stderr
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [new]


def test_prune_stays_off_without_config(real_claude):
    rc = real_claude
    old = long_thread(rc, last_usage=usage(120_000))
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "next"))
    assert "Smart Prune" not in p.stderr
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [old] and rebuilds(rc) == []


# -- thinking replay after a rebuild ---------------------------------------------------------

# The prefix-mismatch refusal. (Claude Code 2.1.328 itself strips thinking and retries when
# a 400 says "Invalid `signature` in `thinking` block" or that a thinking block "cannot be
# modified"; a refusal worded otherwise reaches the transcript as an API error.)
REFUSAL = ("messages.1.content.0: thinking block prefix mismatch: the block was produced over "
           "a different conversation history than the one it is sent with")


def _has_thinking(body) -> bool:
    return any(isinstance(m.get("content"), list) and any(
        b.get("type") == "thinking" for b in m["content"]) for m in body.get("messages", []))


def test_a_refused_thinking_replay_is_rebuilt_with_omit_on_the_next_invocation(real_claude):
    rc = real_claude
    rc.api.script([thinking_reply("a deep thought", "first answer, remember 777",
                                  signature="sig-" + "Q" * 60, usage=usage(371_000))])
    old = json.loads(ok(lhc(rc, "-p", "hello", "--output-format", "json")).stdout)["session_id"]

    def answer(body):
        # An account that rejects signed thinking replayed over a rebuilt history.
        rebuilt = first_text(body["messages"][0]).startswith(cc_lhc.REBUILT_MARKER)
        if rebuilt and _has_thinking(body):
            return error_reply(400, REFUSAL)
        return text_reply(SMALL_REPLY, usage=SMALL)

    rc.api.responder = answer
    n = len(rc.api.message_requests)
    p = lhc(rc, "--resume", old, "-p", "next")
    assert "Smart Compact" in p.stderr
    assert p.returncode != 0 and "prefix mismatch" in p.stdout
    attempts = rc.api.message_requests[n:]  # Claude retries a 400 it does not recognise
    refused = attempts[0]
    assert all(a["session_id"] == refused["session_id"] != old and _has_thinking(a["body"])
               for a in attempts)

    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "again"))
    assert SMALL_REPLY in p.stdout
    said = [line for line in p.stderr.splitlines() if "refused the thinking" in line]
    assert len(said) == 1 and "omit" in said[0], p.stderr
    [request] = rc.api.message_requests[n:]
    assert request["session_id"] not in (old, refused["session_id"])
    assert not _has_thinking(request["body"])
    sent = json.dumps(request["body"]["messages"])
    assert "remember 777" in sent and "next" in sent  # nothing lost, the refused prompt too
    [row] = threads(rc)
    assert row["current_session"] == request["session_id"]
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    store = cc_lhc.ThreadStore(home, row["id"])
    try:
        assert cc_lhc.thinking_arm(store, cc_lhc.resolve_policy([])) == "omit"
    finally:
        store.close()
    # later invocations stay on the omit session without rebuilding again
    n = len(rc.api.message_requests)
    p = ok(lhc(rc, "--resume", old, "-p", "later"))
    assert "refused the thinking" not in p.stderr
    assert [r["session_id"] for r in rc.api.message_requests[n:]] == [request["session_id"]]


def test_a_running_session_whose_thinking_is_refused_is_rebuilt_with_omit_and_continues(
        real_claude, tmux):
    rc = real_claude

    def answer(body):
        if first_text(body["messages"][0]).startswith(cc_lhc.REBUILT_MARKER):
            if _has_thinking(body):
                return error_reply(400, REFUSAL)
            return text_reply("answered without thinking", usage=SMALL)
        return thinking_reply("a deep thought", "a long answer", signature="sig-" + "Q" * 60,
                              usage=usage(371_000))

    rc.api.responder = answer
    t = tmux([sys.executable, CC_LHC], cols=120, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "think hard")
    t.wait_for("a long answer")
    wait_for_log(rc, "handoff_switched")     # Smart Compact over the trigger
    t.wait_for(PROMPT)
    type_line(t, "and then")                  # the rebuilt session's first request is refused
    wait_for_log(rc, "thinking_refused")
    wait_for_log(rc, "handoff_switched", count=2)
    t.wait_for("answered without thinking")
    exit_cleanly(t)
    requests = rc.api.message_requests
    last = requests[-1]
    assert not _has_thinking(last["body"])
    sent = json.dumps(last["body"]["messages"])
    assert "think hard" in sent and "and then" in sent and "[runtime note]" in sent
    screen = t.capture(history=True).replace("\n", "")
    assert "thinking replay: omit" in screen
    assert [r[2] for r in rebuilds(rc)] == ["accepted", "accepted"]
