"""Smart Prune's planner and the visibility boundary (sections 6, 7, 12), in process, and
the thinking replay setting.

The planner is pure: turns in, (view, header, boundary) out. Around it: the boundary is
kept per thread and only ever moves forward, every later view (Smart Compact's too)
honours it, and a prune that would not move it never gets as far as a pending rebuild.
"""

from __future__ import annotations

import json
import os
import uuid

import pytest

import cc_lhc

NOW = "2026-05-01T12:00:00.000Z"


def _msg(**kw):
    d = dict.fromkeys(cc_lhc.MESSAGE_COLUMNS)
    d.update(kw)
    return d


def _call(seq, n, tid, resp):
    return _msg(seq=seq, turn=n, role="assistant", kind="tool_call", text='{"command":"x"}',
                data=json.dumps({"type": "tool_use", "id": tid, "name": "Bash",
                                 "input": {"command": "x"}}),
                tool_use_id=tid, tool_name="Bash", response_id=resp, model="m")


def _result(seq, n, tid, size):
    return _msg(seq=seq, turn=n, role="user", kind="tool_result", text="y" * size,
                tool_use_id=tid, is_error=0)


def uniform_turns(count, out_bytes=4000):
    """`count` closed turns of about out_bytes/4 tokens each: prompt, call, result, answer."""
    turns = []
    for n in range(1, count + 1):
        s = 1000 + 4 * n
        turns.append(cc_lhc.Turn(n, "prompt", "closed", [
            _msg(seq=s, turn=n, role="user", kind="user_text", text=f"question {n}"),
            _call(s + 1, n, f"toolu_{n}", f"r{n}"),
            _result(s + 2, n, f"toolu_{n}", out_bytes),
            _msg(seq=s + 3, turn=n, role="assistant", kind="assistant_text", text=f"answer {n}",
                 response_id=f"r{n}b", model="m")]))
    return turns


def long_turn(calls=40, out_bytes=4000):
    """One prompt followed by many tool calls, each answered, then a final answer."""
    msgs = [_msg(seq=1, turn=1, role="user", kind="user_text", text="do it all")]
    seq = 2
    for i in range(calls):
        msgs.append(_call(seq, 1, f"toolu_{i}", f"r{i}"))
        msgs.append(_result(seq + 1, 1, f"toolu_{i}", out_bytes))
        seq += 2
    msgs.append(_msg(seq=seq, turn=1, role="assistant", kind="assistant_text", text="done",
                     response_id="rz", model="m"))
    return [cc_lhc.Turn(1, "prompt", "closed", msgs)]


def records_of(view, turns, header):
    return cc_lhc.view_records(view, turns, header, str(uuid.uuid4()), "/w", NOW)


def tool_ids(records, kind):
    return [b["tool_use_id" if kind == "tool_result" else "id"] for r in records
            if isinstance(r.get("message", {}).get("content"), list)
            for b in r["message"]["content"] if isinstance(b, dict) and b.get("type") == kind]


# -- the planner (pure) ---------------------------------------------------------------------

def test_prune_moves_the_oldest_turns_out_and_keeps_the_rest_verbatim():
    turns = uniform_turns(20)  # about 1,000 tokens a turn
    view, header, cut = cc_lhc.prune_view("T", turns, 0, 8_000, "default")
    omitted, full = view.turns_in("omitted"), view.turns_in("full")
    assert omitted == list(range(1, omitted[-1] + 1)) and full == list(range(omitted[-1] + 1, 21))
    assert 4 <= len(full) <= 8
    # nothing summarised, nothing leaned: what stays is verbatim
    assert view.turns_in("lean") == view.turns_in("summary") == [] and view.summaries == {}
    assert cut == turns[omitted[-1] - 1].messages[-1]["seq"]
    assert cc_lhc.omitted_line(1, omitted[-1]) in header.splitlines()
    assert view.costs["full"] + cc_lhc.estimate_tokens(header) <= 8_000
    records = records_of(view, turns, header)
    sent = json.dumps(records)
    assert "question 20" in sent and f"question {omitted[-1]}\"" not in sent
    assert "[output of" not in sent  # no stubs


def test_a_view_that_already_fits_leaves_the_boundary_where_it_is():
    turns = uniform_turns(5)
    view, _header, cut = cc_lhc.prune_view("T", turns, 0, 100_000, "default")
    assert cut == 0 and view.turns_in("full") == [1, 2, 3, 4, 5]
    # an earlier boundary is kept even when more would fit now: it never moves back
    boundary = turns[1].messages[-1]["seq"]
    view, header, cut = cc_lhc.prune_view("T", turns, boundary, 100_000, "default")
    assert cut == boundary and view.turns_in("omitted") == [1, 2]
    assert cc_lhc.omitted_line(1, 2) in header.splitlines()


def test_the_boundary_only_moves_forward_between_prunes():
    turns = uniform_turns(20)
    _v, _h, first = cc_lhc.prune_view("T", turns, 0, 8_000, "default")
    _v, _h, again = cc_lhc.prune_view("T", turns, first, 8_000, "default")
    assert again == first  # same thread, same target: nothing more to move
    _v, _h, tighter = cc_lhc.prune_view("T", turns, first, 4_000, "default")
    assert tighter > first
    _v, _h, looser = cc_lhc.prune_view("T", turns, tighter, 50_000, "default")
    assert looser == tighter


def test_a_long_turn_is_cut_inside_and_named_by_message_range():
    turns = long_turn(calls=40)  # one turn of about 40,000 tokens
    view, header, cut = cc_lhc.prune_view("T", turns, 0, 10_000, "default")
    assert view.bands[1] == cc_lhc.SPLIT
    (first, last, band), *rest = view.pieces[1]
    assert band == "omitted" and first == 1 and last == cut
    assert all(b == "full" for _a, _b, b in rest)
    assert f"  m1\u2013m{cut} not in view; use get-messages m1-m{cut}" in header.splitlines()
    records = records_of(view, turns, header)
    calls, results = tool_ids(records, "tool_use"), tool_ids(records, "tool_result")
    assert calls and sorted(calls) == sorted(results)  # no call separated from its result
    assert "toolu_39" in calls and "toolu_0" not in calls  # the newest stay, the oldest go
    assert cc_lhc.safe_cut(turns[0].messages, cut) == cut


def test_a_boundary_between_a_call_and_its_result_moves_past_the_result():
    turns = long_turn(calls=3)
    call_seq = next(m["seq"] for m in turns[0].messages if m["tool_use_id"] == "toolu_1"
                    and m["kind"] == "tool_call")
    assert cc_lhc.safe_cut(turns[0].messages, call_seq) == call_seq + 1


def test_smart_compact_honours_the_boundary():
    turns = uniform_turns(10)
    boundary = turns[3].messages[-1]["seq"]
    view, header = cc_lhc.serve_view("T", turns, 1_000_000, "default", {}, favoured={2},
                                     boundary=boundary)
    assert view.turns_in("omitted") == [1, 2, 3, 4] and view.turns_in("full") == list(range(5, 11))
    assert cc_lhc.omitted_line(1, 4) in header.splitlines()
    # a boundary inside a turn (from a prune under another target) splits that turn there
    inside = turns[4].messages[1]["seq"]  # the tool call: the cut moves past its result
    view, _ = cc_lhc.serve_view("T", turns, 1_000_000, "default", {}, boundary=inside)
    assert view.bands[5] == cc_lhc.SPLIT and view.pieces[5][0] == (inside - 1, inside + 1, "omitted")


# -- the boundary per thread, and the mechanism ------------------------------------------------

@pytest.fixture
def thread(iso_env, tmp_path):
    from test_views import Transcript, intake_transcript, text
    tr = Transcript()
    for i in range(1, 13):
        tr.prompt(f"question {i} " + "x" * 2000)
        tr.response(text(f"answer {i} " + "y" * 2000))
    return intake_transcript(tr, tmp_path)


def _policy(**values):
    return cc_lhc.resolve_policy([("test", values)])


def test_plan_rebuild_prunes_and_refuses_when_nothing_would_change(thread, tmp_path):
    policy = _policy()
    kw = dict(projects_root=str(tmp_path / "p"), now=NOW)
    plan = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()),
                               "/w", prune_target=4_000, **kw)
    assert plan.boundary > 0 and plan.view.turns_in("omitted")[0] == 1
    assert plan.view.turns_in("lean") == plan.view.turns_in("summary") == []
    with pytest.raises(cc_lhc.PruneUnchanged, match="nothing to prune"):
        cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()), "/w",
                            prune_target=1_000_000, **kw)


def test_a_pruned_view_fits_its_target_by_exact_count(tmp_path):
    """Log output runs about 3.3 bytes an o200k token, not the estimate's 4: a prune sized by
    the estimate alone served a view a quarter over its target. It is counted and fitted."""
    from test_views import intake_transcript, long_turn_transcript
    thread = intake_transcript(long_turn_transcript(40, 24_000, before=1), tmp_path)
    counter = cc_lhc.ViewCounter(cc_lhc.TokenCounter())
    if not counter.exact:
        pytest.skip(f"exact counts are not to be had here: {counter.tokens.reason}")
    for target in (50_000, 80_000, 150_000):
        plan = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, _policy(), str(uuid.uuid4()), "/w",
                                   prune_target=target, projects_root=str(tmp_path / "p"), now=NOW)
        assert plan.view.counting == "exact o200k_base"
        assert target * 0.7 <= plan.view.tokens <= target, (target, plan.view.tokens)  # (parts come whole: 15k each)
        turns = cc_lhc.load_turns(thread.store)
        header = json.loads(plan.data.decode().splitlines()[0])["message"]["content"]
        again = cc_lhc.view_tokens(plan.view, header, turns, counter)["total"]
        assert again <= target, (target, again)


class _HeavyCounts:
    """A token counter by which log output runs 1.3x the 4-bytes estimate (as o200k does)."""

    def usable(self):
        return True

    def count_many(self, texts):
        return [int(len(t.encode() if isinstance(t, str) else t) / 4 * 1.3) for t in texts]

    def save_later(self):
        pass


def test_a_prune_whose_newest_part_alone_is_over_the_target_serves_the_smallest_view():
    """No allocation fits when the newest part (which always stays) is over the target on
    its own: the view served is then the smallest one counted, not the first and largest."""
    turns = uniform_turns(40, out_bytes=4000)
    n, s = 41, 5000
    turns.append(cc_lhc.Turn(n, "prompt", "closed", [
        _msg(seq=s, turn=n, role="user", kind="user_text", text="big"),
        _call(s + 1, n, "toolu_big", "rbig"),
        _result(s + 2, n, "toolu_big", 48_000)]))
    counter = cc_lhc.ViewCounter(_HeavyCounts())
    view, _header, _cut = cc_lhc.fitted_prune_view("T", turns, 0, 15_000, "default", False, False, counter)
    alone, header, _ = cc_lhc.prune_view("T", turns, 0, 0, "default")
    assert view.tokens == cc_lhc.view_tokens(alone, header, turns, counter)["total"] > 15_000


def test_an_unchanged_prune_records_no_pending_rebuild(thread, tmp_path):
    home = thread.home
    with pytest.raises(cc_lhc.PruneUnchanged):
        cc_lhc.rebuild(home, cc_lhc.HostDB(home), thread.store, thread.id, thread.session_id,
                       _policy(), "/w", projects_root=str(tmp_path / "p"),
                       plan_view=cc_lhc.prune_planner(1_000_000))
    assert cc_lhc.Registry(home).db.execute("SELECT count(*) FROM rebuilds").fetchone()[0] == 0


def test_the_thread_boundary_moves_on_acceptance_and_never_back(thread, tmp_path):
    home, store = thread.home, thread.store
    pending = cc_lhc.rebuild(home, cc_lhc.HostDB(home), store, thread.id, thread.session_id,
                             _policy(), "/w", projects_root=str(tmp_path / "p"),
                             plan_view=cc_lhc.prune_planner(4_000))
    assert cc_lhc.visibility_boundary(store) == 0  # written, not yet accepted
    with open(pending.path, "a") as f:
        f.write("{}\n")  # Claude wrote past the prefix: accepted
    assert cc_lhc.accept(home, thread.id, pending)
    moved = cc_lhc.visibility_boundary(store)
    assert moved > 0
    # a later Smart Compact keeps the pruned turns out of view
    plan = cc_lhc.plan_rebuild(home, store, thread.id, _policy(), str(uuid.uuid4()), "/w",
                               projects_root=str(tmp_path / "p"), now=NOW)
    assert plan.boundary == moved and 1 in plan.view.turns_in("omitted")
    # a session built with an older boundary does not move it back
    cc_lhc.note_built_boundary(store, "older", 1)
    assert cc_lhc.advance_boundary(store, "older") == moved
    assert cc_lhc.visibility_boundary(store) == moved


# -- thinking replay as a setting ------------------------------------------------------------

def test_thinking_replay_is_a_validated_setting():
    assert cc_lhc.BUILTIN_POLICY["thinkingReplay"] == "signed_verbatim"
    assert _policy(thinkingReplay="omit")["thinkingReplay"] == "omit"
    bad = _policy(thinkingReplay="sometimes")
    assert bad["thinkingReplay"] == "signed_verbatim" and "thinkingReplay from test" in bad.problems[0]
    flags, _ = cc_lhc.parse_launch(["--lhc-thinking-replay", "omit", "-p", "x"])
    assert cc_lhc.policy_flag_values(flags) == {"thinkingReplay": ("--lhc-thinking-replay", "omit")}


def test_the_thread_arm_wins_once_the_api_refused_replayed_thinking(thread):
    assert cc_lhc.thinking_arm(thread.store, _policy()) == "signed_verbatim"
    assert cc_lhc.thinking_arm(thread.store, _policy(thinkingReplay="omit")) == "omit"
    cc_lhc._set_meta(thread.store, cc_lhc.THINKING_KEY, "omit")
    assert cc_lhc.thinking_arm(thread.store, _policy(thinkingReplay="signed_verbatim")) == "omit"


@pytest.mark.parametrize("text, refused", [
    ('API Error: 400 {"type":"error","error":{"type":"invalid_request_error","message":'
     '"messages.1.content.0: Invalid `signature` in `thinking` block"}}', True),
    ("API Error: 400 thinking blocks in the latest assistant message cannot be modified", True),
    ("prompt is too long: 250000 tokens > 200000 maximum", False),
    ("API Error: 529 overloaded", False),
])
def test_what_counts_as_a_thinking_refusal(text, refused):
    assert bool(cc_lhc.THINKING_REFUSAL.search(text)) is refused


def test_the_panels_export_twice_in_a_second_and_before_any_transcript(thread, tmp_path, monkeypatch):
    """Two /export within one second make a folder each (the second failed on a file that
    existed); before Claude wrote a transcript there is nothing to export, said plainly,
    with nothing left behind."""
    import time
    monkeypatch.setattr(time, "strftime", lambda *_a: "20261207-120000")  # (one second)
    rollout = tmp_path / "session.jsonl"
    rollout.write_text('{"type":"user"}\n')
    policy = _policy()
    first = cc_lhc.write_session_export(thread.home, thread.store, thread.id, policy, str(rollout), "/w")
    second = cc_lhc.write_session_export(thread.home, thread.store, thread.id, policy, str(rollout), "/w")
    assert first["rollout"] != second["rollout"]
    assert all(os.path.getsize(p) for paths in (first, second) for p in paths.values())
    exports = sorted(os.listdir(thread.home.path("exports")))
    with pytest.raises(cc_lhc.LhcError, match="nothing to export yet"):
        cc_lhc.write_session_export(thread.home, thread.store, thread.id, policy, str(tmp_path / "none.jsonl"), "/w")
    assert sorted(os.listdir(thread.home.path("exports"))) == exports


def test_a_prune_to_less_than_the_newest_part_says_what_is_left_not_that_it_fits(thread, tmp_path):
    """The newest turn's last part always stays: a target below it moves nothing, and the
    refusal says so (it said the view already fit 50 tokens)."""
    with pytest.raises(cc_lhc.PruneUnchanged) as refused:
        for target in (4_000, 50, 50):  # (the first two move the boundary up to the newest part)
            plan = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, _policy(), str(uuid.uuid4()), "/w",
                                       prune_target=target, projects_root=str(tmp_path / "p"), now=NOW)
            cc_lhc._set_meta(thread.store, cc_lhc.BOUNDARY_KEY, plan.boundary)
    said = str(refused.value)
    assert "always stays in view" in said and "over 50" in said and "already fits" not in said


def test_the_panels_export_with_the_mod_active_is_the_view_it_would_install(thread, tmp_path):
    """With the cc-lhc mod active, Smart Compact installs its view in the running Claude,
    naming the mod's tools: /export writes that view, not the one a swap would serve
    (which tells Claude to run cc-lhc through Bash)."""
    rollout = tmp_path / "session.jsonl"
    rollout.write_text('{"type":"user"}\n')
    swap = cc_lhc.write_session_export(thread.home, thread.store, thread.id, _policy(), str(rollout), "/w")
    inside = cc_lhc.write_session_export(thread.home, thread.store, thread.id, _policy(), str(rollout), "/w",
                                         in_process=True)
    said = {name: open(paths["view_markdown"], encoding="utf-8").read() for name, paths in
            (("swap", swap), ("inside", inside))}
    assert "run these through Bash" in said["swap"] and "lhc_get_turns" not in said["swap"]
    assert "call these tools" in said["inside"] and "lhc_get_turns" in said["inside"]
