"""Transcripts of other Claude Code versions (issue 11, part 1).

tests/fixtures/versions/<version>/ holds small hand-written sessions in the shapes those
versions write (see the README there). Each is captured as a live session would be and
must behave as its version meant: turns end where that version says they end, settled
seams are found, subagent work is kept (tagged, linked to its call, outside the main
view), and what is only counted is counted by kind.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path

import pytest

import cc_lhc
from test_capture_live import wait_for
from test_views import Thread, grant, intake, retrieve

VERSIONS = Path(__file__).parent / "fixtures" / "versions"
SESSIONS = {"1.0.98": "10980000-0000-4000-8000-000000000001",
            "2.0.76": "20760000-0000-4000-8000-000000000002",
            "2.1.39": "21390000-0000-4000-8000-000000000003"}


def fixture_copy(version, tmp_path) -> Path:
    """The version's folder copied (so capture may write nothing next to the originals)."""
    dest = tmp_path / "projects" / version
    shutil.copytree(VERSIONS / version, dest)
    return dest / f"{SESSIONS[version]}.jsonl"


def captured(version, tmp_path):
    return intake(fixture_copy(version, tmp_path), SESSIONS[version])


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def turns(thread):
    return thread.store.db.execute("SELECT n, status, stop_reason FROM turns ORDER BY n").fetchall()


def telemetry(thread) -> dict:
    return dict(thread.store.db.execute("SELECT type, count FROM telemetry").fetchall())


def agent_rows(thread, agent=None):
    sql = "SELECT seq, kind, text, agent, source_uuid FROM messages WHERE agent IS NOT NULL"
    args = ()
    if agent:
        sql, args = sql + " AND agent = ?", (agent,)
    return thread.store.db.execute(sql + " ORDER BY seq", args).fetchall()


# -- end-of-turn evidence, per version -------------------------------------------------------

def test_1_0_98_turns_end_at_the_next_prompt_and_the_idle_end_is_settled(tmp_path):
    t = captured("1.0.98", tmp_path)
    # stop_reason is null throughout: the prompt after a response that asked for nothing
    # starts a turn, it does not interrupt one; the API error closes its turn.
    assert turns(t) == [(1, "closed", "next_prompt"), (2, "closed", "stop_sequence"), (3, "open", None)]
    assert cc_lhc.unsettled_reason(t.store, idle=True) == ""
    assert "mid-turn" in cc_lhc.unsettled_reason(t.store)        # while Claude may still write
    assert t.store.db.execute("SELECT count(*) FROM problems").fetchone()[0] == 0
    kinds = telemetry(t)
    assert kinds["summary"] == 1 and kinds["system/None"] == 1
    assert "sidechain" not in kinds


def test_2_0_76_shapes(tmp_path):
    t = captured("2.0.76", tmp_path)
    assert [r[1] for r in turns(t)] == ["closed", "open"]
    assert cc_lhc.unsettled_reason(t.store, idle=True) == ""
    kinds = telemetry(t)
    assert kinds["file-history-snapshot"] == 2 and kinds["progress/agent_progress"] == 1
    thinking = [json.loads(d) for (d,) in t.store.db.execute(
        "SELECT data FROM messages WHERE kind = 'thinking' AND agent IS NULL ORDER BY seq")]
    # empty signed thinking is kept as written: the signature is what the API checks
    assert [(b["thinking"], b["signature"][:8]) for b in thinking] == [("", "EqQBCkYI"), ("", "EqQBCkYI")]


def test_2_1_39_turn_ends_by_its_system_records_and_smart_compact_would_run(tmp_path):
    t = captured("2.1.39", tmp_path)
    assert turns(t) == [(1, "closed", "stop_hook_summary")]
    assert cc_lhc.unsettled_reason(t.store) == ""                # settled even for a live reader
    reading = cc_lhc.governor_reading(t.store, SESSIONS["2.1.39"])
    c = cc_lhc.classify(reading, cc_lhc.BUILTIN_POLICY["upperBoundTokens"], True)
    assert c["state"] == cc_lhc.STATE_OVER_SETTLED and c["would_mutate"]
    assert reading["provider_tokens"] == 371_000               # the main chain's, not an agent's
    assert telemetry(t)["system/microcompact_boundary"] == 1


def test_a_tool_call_still_waiting_keeps_the_turn_open_despite_turn_duration(tmp_path):
    path = fixture_copy("2.1.39", tmp_path)
    recs = records(path)
    last_asst = max(i for i, r in enumerate(recs) if r.get("type") == "assistant")
    call = dict(recs[last_asst], uuid="00000000-0000-4000-8000-00000000cafe")
    call["message"] = dict(call["message"], id="msg_pending", content=[
        {"type": "tool_use", "id": "toolu_pending", "name": "Bash", "input": {"command": "sleep 9"}}])
    recs.insert(last_asst + 1, call)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    t = intake(path, SESSIONS["2.1.39"])
    assert turns(t)[-1][1] == "open"
    assert "waiting for results" in cc_lhc.unsettled_reason(t.store, idle=True)


# -- subagents --------------------------------------------------------------------------------

def test_1_0_98_sidechain_records_are_kept_and_linked_by_prompt(tmp_path):
    t = captured("1.0.98", tmp_path)
    rows = agent_rows(t)
    src = records(VERSIONS / "1.0.98" / f"{SESSIONS['1.0.98']}.jsonl")
    assert {r[4] for r in rows} == {r["uuid"] for r in src if r.get("isSidechain")}
    [(agent, info)] = t.store.agents().items()
    assert info["kind"] == "sidechain" and info["tool_use_id"] == "toolu_0198task"
    call_turn = t.store.db.execute("SELECT turn FROM messages WHERE tool_use_id = 'toolu_0198task' "
                                   "AND kind = 'tool_call'").fetchone()[0]
    assert {r[0] for r in t.store.db.execute(
        "SELECT turn FROM messages WHERE agent IS NOT NULL")} == {call_turn}
    # not in the main view, whose chain already holds the agent's answer
    seen = [m["text"] for turn in cc_lhc.load_turns(t.store, closed_only=False) for m in turn.messages]
    assert not any("sidechain-needle-1098" in (s or "") for s in seen)


def test_1_0_98_sidechain_whose_prompt_is_text_blocks_is_linked_too(tmp_path):
    path = fixture_copy("1.0.98", tmp_path)
    recs = records(path)
    first = next(r for r in recs if r.get("isSidechain"))
    first["message"]["content"] = [{"type": "text", "text": first["message"]["content"]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    t = intake(path, SESSIONS["1.0.98"])
    [(agent, info)] = t.store.agents().items()
    assert info["kind"] == "sidechain" and info["tool_use_id"] == "toolu_0198task"


def test_2_0_76_agent_file_is_linked_through_its_progress_record(tmp_path):
    # 2.0 wrote agent-<id>.jsonl beside the session file, in the folder all its sessions share
    path = fixture_copy("2.0.76", tmp_path)
    other = json.loads((path.parent / "agent-b2076aa.jsonl").read_text().splitlines()[0])
    other.update(sessionId="20760000-0000-4000-8000-0000000000ff", agentId="c0ther", uuid="u-other")
    other["message"] = {"role": "user", "content": "another session's agent"}
    (path.parent / "agent-c0ther.jsonl").write_text(json.dumps(other) + "\n")
    t = intake(path, SESSIONS["2.0.76"])
    assert t.store.agents()["b2076aa"]["tool_use_id"] == "toolu_0276task"
    assert [r[2] for r in agent_rows(t, "b2076aa")] == [
        "Summarise README.md in one line.", "README: a CLI host (agent-needle-2076)."]
    assert "c0ther" not in t.store.agents() and agent_rows(t, "c0ther") == []
    # measure counts it with its session, and a folder's agent files are not sessions of their own
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cc_lhc.main(["measure", str(path.parent), "--json"]) == 0
    [report] = json.loads(out.getvalue())["sessions"]
    assert report["subagents"] == 1 and report["subagent_messages"] == 2


def test_1_0_98_sidechains_of_one_prompt_used_twice_link_to_their_own_calls(tmp_path):
    """Two Task calls with the same prompt, one per turn, each followed by its sidechain:
    read in one batch, each sidechain is linked to the call just before it."""
    src = records(VERSIONS / "1.0.98" / f"{SESSIONS['1.0.98']}.jsonl")[1:10]  # t1: call, sidechain, answer
    second = []
    for r in src:
        r = json.loads(json.dumps(r).replace("-00000000100", "-00000000200").replace("toolu_0198", "toolu_0298")
                       .replace("sidechain-needle-1098", "sidechain-needle-2098"))
        second.append(r)
    second[0]["parentUuid"] = src[-1]["uuid"]
    second[0]["message"]["content"] = "and once more, please"
    path = tmp_path / f"{SESSIONS['1.0.98']}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in src + second))
    t = intake(path, SESSIONS["1.0.98"])
    links = {}
    for text, agent in t.store.db.execute("SELECT text, agent FROM messages WHERE agent IS NOT NULL AND "
                                         "kind = 'assistant_text'"):
        links[re.search(r"sidechain-needle-\d+", text).group(0)] = t.store.agents()[agent]["tool_use_id"]
    assert links == {"sidechain-needle-1098": "toolu_0198task", "sidechain-needle-2098": "toolu_0298task"}


def test_claudes_compaction_agent_is_no_broken_chain_and_no_subagent(tmp_path):
    """2.1.x's compaction agent (subagents/agent-acompact-*.jsonl) chains its records to the
    main conversation's: no problem, the thread is not degraded; it sits in the turn it ran
    in (it was started by no call), and measure counts it apart from the subagents."""
    path = fixture_copy("2.1.39", tmp_path)
    main = records(path)
    prompt = next(r for r in main if r.get("type") == "user")
    later = dict(prompt, uuid="00000000-0000-0000-0000-0000000019f0", parentUuid=main[-1]["uuid"],
                 timestamp="2025-09-01T11:00:00.000Z", message={"role": "user", "content": "and now the docs"})
    with path.open("a") as f:
        f.write(json.dumps(later) + "\n")
    agent = [{"parentUuid": main[-1]["uuid"], "isSidechain": True, "userType": "external", "cwd": "/home/u/proj",
              "sessionId": SESSIONS["2.1.39"], "version": "2.1.39", "agentId": "acompact-1f2e3d", "type": "user",
              "message": {"role": "user", "content": "Summarise the conversation so far."},
              "uuid": "00000000-0000-0000-0000-0000000018a1", "timestamp": "2025-09-01T10:01:00.000Z"},
             {"parentUuid": "00000000-0000-0000-0000-0000000018a1", "isSidechain": True, "userType": "external",
              "cwd": "/home/u/proj", "sessionId": SESSIONS["2.1.39"], "version": "2.1.39",
              "agentId": "acompact-1f2e3d", "type": "assistant", "uuid": "00000000-0000-0000-0000-0000000018a2",
              "timestamp": "2025-09-01T10:01:05.000Z",
              "message": {"id": "msg_acompact", "type": "message", "role": "assistant", "model": "claude-opus-4-6",
                          "content": [{"type": "text", "text": "Summary: both reviewed (acompact-needle)."}],
                          "stop_reason": "end_turn", "usage": {"input_tokens": 9, "output_tokens": 9}}}]
    folder = path.parent / SESSIONS["2.1.39"] / "subagents"
    (folder / "agent-acompact-1f2e3d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in agent))
    t = intake(path, SESSIONS["2.1.39"])
    assert t.store.db.execute("SELECT kind, detail FROM problems").fetchall() == []
    assert t.store.db.execute("SELECT degraded FROM sources WHERE degraded IS NOT NULL").fetchall() == []
    assert t.store.agents()["acompact-1f2e3d"]["kind"] == "compaction"
    assert {turn for (turn,) in t.store.db.execute(
        "SELECT turn FROM messages WHERE agent = 'acompact-1f2e3d'")} == {1}  # not the newest, t2
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cc_lhc.main(["measure", str(path), "--json"]) == 0
    report = json.loads(out.getvalue())
    report = report["sessions"][0] if "sessions" in report else report
    assert (report["subagents"], report["compaction_agents"], report["integrity_problems"]) == (3, 1, 0)
    # Measured alone, its file (every record chained onto the session's) is named for what it
    # is, as a subagent's file is, not called unreadable (it was, with exit 1).
    for name, what in (("agent-acompact-1f2e3d.jsonl", "Claude's own compaction agent (acompact-1f2e3d)"),
                       ("agent-a2139one.jsonl", "a subagent (a2139one)")):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            assert cc_lhc.main(["measure", str(folder / name)]) == 0
        assert f"is the transcript of {what}, not a session's: measure the session" in err.getvalue()
        assert "could not be read" not in err.getvalue()


def test_2_0_agent_file_whose_first_record_is_long_is_still_its_sessions(tmp_path):
    """A 2.0 agent file tells whose it is by its records' sessionId; one whose first line
    is a long prompt, its sessionId written after the message, is captured all the same."""
    path = fixture_copy("2.0.76", tmp_path)
    agent = path.parent / "agent-b2076aa.jsonl"
    first, *rest = agent.read_text().splitlines()
    rec = json.loads(first)
    rec["message"]["content"] = "Summarise README.md in one line. " + "Be thorough. " * 8000
    session = rec.pop("sessionId")
    rec["sessionId"] = session  # (last)
    agent.write_text("\n".join([json.dumps(rec)] + rest) + "\n")
    assert json.dumps(rec).index('"sessionId"') > 100_000
    t = intake(path, SESSIONS["2.0.76"])
    assert [r[2][:33] for r in agent_rows(t, "b2076aa")] == ["Summarise README.md in one line. ",
                                                              "README: a CLI host (agent-needle-"]


@pytest.mark.parametrize("first_line", [b"", b"{not json", b'{"type": "summary", "summary": "x"}'])
def test_2_0_agent_file_whose_first_line_names_no_session_is_still_its_sessions(tmp_path, first_line):
    """A blank, damaged or session-less first line: a later record names the session, the
    file is captured, and a damaged line is kept and named as any other."""
    path = fixture_copy("2.0.76", tmp_path)
    agent = path.parent / "agent-b2076aa.jsonl"
    agent.write_bytes(first_line + b"\n" + agent.read_bytes())
    t = intake(path, SESSIONS["2.0.76"])
    assert [r[2][:33] for r in agent_rows(t, "b2076aa")] == ["Summarise README.md in one line.",
                                                              "README: a CLI host (agent-needle-"]
    problems = [r[0] for r in t.store.db.execute("SELECT kind FROM problems")]
    assert problems == (["malformed_line"] if first_line.startswith(b"{not") else [])


def test_2_0_agent_file_of_another_session_is_left_alone(tmp_path):
    path = fixture_copy("2.0.76", tmp_path)
    other = path.parent / "agent-c0ffee1.jsonl"
    other.write_text("\n" + (path.parent / "agent-b2076aa.jsonl").read_text().replace(
        SESSIONS["2.0.76"], "99990000-0000-4000-8000-000000000009"))
    t = intake(path, SESSIONS["2.0.76"])
    assert not agent_rows(t, "c0ffee1") and agent_rows(t, "b2076aa")


def test_two_subagents_and_a_workflow_reach_export_get_messages_and_search(
        tmp_path, monkeypatch, capsysbinary):
    """The acceptance case: every conversational record of every agent file is in the
    export, clearly marked; get-messages and search reach them; measure counts them."""
    path = fixture_copy("2.1.39", tmp_path)
    t = intake(path, SESSIONS["2.1.39"])
    agents = t.store.agents()
    assert {a: (i["kind"], i["tool_use_id"]) for a, i in agents.items()} == {
        "a2139one": ("subagent", "toolu_2139a1"), "a2139two": ("subagent", "toolu_2139a2"),
        "w2139fix": ("workflow", "toolu_2139wf")}

    monkeypatch.setenv("CC_LHC_HOME", str(t.home.root))
    assert cc_lhc.main(["export", t.id, "--format", "json"]) == 0
    exported = json.loads(capsysbinary.readouterr().out)
    agent_files = sorted(path.parent.glob(f"{SESSIONS['2.1.39']}/subagents/**/agent-*.jsonl"))
    assert len(agent_files) == 3
    for f in agent_files:
        uuids = {r["uuid"] for r in records(f)}
        marked = [m for m in exported if m["source_uuid"] in uuids]
        assert {m["source_uuid"] for m in marked} == uuids, f.name
        agent_id = f.stem[len("agent-"):]
        assert all(m["agent"]["id"] == agent_id for m in marked)
        assert marked[0]["agent"]["call"].startswith("m")
    assert all("agent" not in m for m in exported if m["source_session"] == SESSIONS["2.1.39"]
               and m["source_uuid"] in {r.get("uuid") for r in records(path)})

    grant(t, monkeypatch)
    for needle in ("parser-needle-2139", "store-needle-2139", "workflow-needle-2139"):
        body, _ = retrieve(capsysbinary, "search", needle)
        found = re.search(r"\bm(\d+)\b", body.decode())
        assert found, body
        assert re.search(r"in subagent (a2139one|a2139two|w2139fix)\b", body.decode()), body  # says whose
        assert "(a subagent's record: get-messages only)." in body.decode()  # get-turns leaves them out
        label = found.group(0)
        got, _ = retrieve(capsysbinary, "get-messages", label)
        assert needle in got.decode() and "subagent" in got.decode()

    report = cc_lhc.measure_transcript(str(path), "default", 180_000)
    assert report["subagents"] == 3
    assert report["subagent_messages"] == sum(len(agent_rows(t, a)) for a in agents)


def test_agent_files_read_in_small_batches_match_one_read(tmp_path, monkeypatch):
    """Main and subagent files share one read loop: many small batches store what one read
    stores, and a half-written last line of an agent file waits for its newline."""
    whole = captured("2.1.39", tmp_path / "one")
    expected = agent_rows(whole)
    path = fixture_copy("2.1.39", tmp_path / "many")
    agent_file = path.parent / SESSIONS["2.1.39"] / "subagents" / "agent-a2139one.jsonl"
    complete = agent_file.read_bytes()
    last = complete.rstrip(b"\n").rsplit(b"\n", 1)[1]
    agent_file.write_bytes(complete[:-len(last) - 1] + last[:20])   # last line cut mid-write
    monkeypatch.setattr(cc_lhc.Capture, "BATCH_BYTES", 300)
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "many" / "lhc"))
    t = intake(path, SESSIONS["2.1.39"])
    key = f"{SESSIONS['2.1.39']}/subagents/agent-a2139one.jsonl"
    assert t.store.source(key)["offset"] == len(complete) - len(last) - 1
    assert [r for r in agent_rows(t) if r[3] == "a2139one"] == [
        r for r in expected if r[3] == "a2139one"][:-1]
    agent_file.write_bytes(complete)
    cap = cc_lhc.Capture(t.home, t.id, SESSIONS["2.1.39"], str(path))
    cap.catch_up()
    cap.stop()
    assert t.store.source(key)["offset"] == len(complete)
    by_agent = lambda rows: sorted((r[3], r[0], r[1:]) for r in rows)   # seqs differ across reads
    assert [r[2] for r in by_agent(agent_rows(t))] == [r[2] for r in by_agent(expected)]


def test_an_agent_file_that_shrinks_or_is_rewritten_is_read_again(tmp_path):
    """A subagent file is checked as the session's own transcript is: shorter, or holding
    other bytes before the captured offset, it is read again from its start, each record
    once, nothing captured removed, the reason recorded (it used to stop at a shrink and
    read on mid-line after a rewrite)."""
    path = fixture_copy("2.1.39", tmp_path)
    t = intake(path, SESSIONS["2.1.39"])
    agent_file = path.parent / SESSIONS["2.1.39"] / "subagents" / "agent-a2139one.jsonl"
    key = f"{SESSIONS['2.1.39']}/subagents/agent-a2139one.jsonl"
    lines = agent_file.read_bytes().splitlines()
    before = agent_rows(t, "a2139one")
    first = json.loads(lines[0])

    def record(n, words):
        return json.dumps(dict(first, uuid=f"00000000-0000-4000-8000-00000000a{n:03d}",
                               parentUuid=first["uuid"], message={"role": "user", "content": words},
                               timestamp="2025-09-01T10:01:00.000Z")).encode()

    def again():
        cap = cc_lhc.Capture(t.home, t.id, SESSIONS["2.1.39"], str(path))
        cap.catch_up()
        cap.stop()
    agent_file.write_bytes(lines[0] + b"\n" + record(1, "after the shrink SHRUNK-NEEDLE") + b"\n")
    again()
    after = agent_rows(t, "a2139one")
    assert after[:len(before)] == before and [r[2] for r in after[len(before):]] == [
        "after the shrink SHRUNK-NEEDLE"]
    # replaced by a longer file whose bytes before the offset differ
    agent_file.write_bytes(b"\n".join([record(2, "x" * 40 + " REWRITTEN-ONE"), *lines,
                                       record(3, "REWRITTEN-TWO")]) + b"\n")
    again()
    texts = [r[2] for r in agent_rows(t, "a2139one")]
    assert texts[:len(after)] == [r[2] for r in after]
    assert sorted(texts[len(after):]) == ["REWRITTEN-TWO", "x" * 40 + " REWRITTEN-ONE"]
    kinds = [r[0] for r in t.store.db.execute("SELECT kind FROM problems WHERE session = ?", (key,))]
    assert kinds == ["transcript_shrank", "transcript_rewritten"]
    assert t.store.source(key)["offset"] == agent_file.stat().st_size


def test_live_capture_picks_up_a_subagent_file_that_appears_later(tmp_path):
    path = fixture_copy("2.1.39", tmp_path)
    agent_dir = path.parent / SESSIONS["2.1.39"] / "subagents"
    held = tmp_path / "held"
    shutil.move(str(agent_dir), held)
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(SESSIONS["2.1.39"], "/home/u/proj", "test")
    cap = cc_lhc.Capture(home, thread_id, SESSIONS["2.1.39"], str(path))
    cap.start()
    try:
        store = cc_lhc.ThreadStore(home, thread_id)
        wait_for(lambda: store.db.execute("SELECT count(*) FROM turns").fetchone()[0] == 1,
                 what="main transcript captured")
        agent_dir.mkdir(parents=True)
        shutil.copy(held / "agent-a2139one.jsonl", agent_dir)   # the main file does not change
        wait_for(lambda: store.db.execute("SELECT count(*) FROM messages WHERE agent = 'a2139one'"
                                          ).fetchone()[0] == 4, what="subagent file captured")
        store.close()
    finally:
        cap.stop()


# -- with the real CLI ---------------------------------------------------------------------------

def _ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def _compacted_one_shot(rc, sid) -> dict:
    """`--resume sid -p next` over the trigger: Smart Compact runs first and the real CLI
    sends the rebuilt session; returns that one request."""
    from fakeapi import text_reply
    rc.api.responder = lambda body: text_reply("answered after the rebuild")
    p = _ok(rc.run_lhc("--resume", sid, "-p", "next", timeout=120))
    assert "answered after the rebuild" in p.stdout
    assert "Smart Compact" in p.stderr and "not at a settled seam" not in p.stderr, p.stderr
    [sent] = rc.api.message_requests
    assert sent["session_id"] != sid
    return sent


def test_real_cli_resumes_a_smart_compacted_2_1_39_session(real_claude):
    """A 2.1.39 session over the trigger (its last response says stop_reason null, then
    the turn's system records) is rebuilt before the one-shot, and the real CLI accepts
    the rebuilt session."""
    rc = real_claude
    sid = SESSIONS["2.1.39"]
    rc.project_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(VERSIONS / "2.1.39" / sid, rc.project_dir / sid)
    lines = [json.dumps(dict(r, cwd=str(rc.cwd)) if "cwd" in r else r)
             for r in records(VERSIONS / "2.1.39" / f"{sid}.jsonl")]
    (rc.project_dir / f"{sid}.jsonl").write_text("\n".join(lines) + "\n")
    sent = _compacted_one_shot(rc, sid)
    first = sent["body"]["messages"][0]["content"]
    first = first if isinstance(first, str) else first[0].get("text", "")
    assert first.startswith(cc_lhc.REBUILT_MARKER)
    assert "store bug is fixed" in json.dumps(sent["body"]["messages"])


@pytest.mark.parametrize("version,last_words,last_answer", [("1.0.98", "try again", "The network is fine now."),
                                                             ("2.0.76", "and the licence?", "MIT.")])
def test_real_cli_resumes_a_smart_compacted_session_with_its_last_turn(real_claude, version, last_words,
                                                                     last_answer):
    """1.0.x and 2.0.x end a session's last turn with nothing (stop_reason null, no
    system record): with no Claude writing, that turn is over, so the rebuild before the
    one-shot holds it verbatim, as the idle seam said it would, and Claude is sent it."""
    rc = real_claude
    sid = SESSIONS[version]
    recs = records(VERSIONS / version / f"{sid}.jsonl")
    last = max(i for i, r in enumerate(recs) if r.get("type") == "assistant")
    recs[last]["message"]["usage"] = {"input_tokens": 382_000, "output_tokens": 40}
    rc.project_dir.mkdir(parents=True, exist_ok=True)
    for extra in (VERSIONS / version).glob("agent-*.jsonl"):
        shutil.copy(extra, rc.project_dir / extra.name)
    (rc.project_dir / f"{sid}.jsonl").write_text(
        "".join(json.dumps(dict(r, cwd=str(rc.cwd)) if "cwd" in r else r) + "\n" for r in recs))
    sent_text = json.dumps(_compacted_one_shot(rc, sid)["body"]["messages"])
    assert last_words in sent_text and last_answer in sent_text
    assert sent_text.index(last_words) < sent_text.index(last_answer) < sent_text.index('"next"')


def test_real_cli_subagent_records_reach_the_thread(real_claude):
    """The real CLI 2.1.328 runs an Agent call against the fake API; the agent writes its
    own subagents/agent-<id>.jsonl, and every record of it is in the thread, linked to the
    call."""
    from fakeapi import text_reply, tool_use_reply
    rc = real_claude
    needle = "agent-reply-needle-328"

    def reply(body):
        first = json.dumps(body["messages"][0])
        if "look around please" in first and "spawn" not in first:   # the agent's own requests
            return text_reply(f"the agent saw things ({needle})")
        if any(b.get("type") == "tool_result" for m in body["messages"] if m["role"] == "user"
               and isinstance(m["content"], list) for b in m["content"]):
            return text_reply("main done")
        return tool_use_reply("Agent", {"description": "look around", "prompt": "look around please",
                                        "subagent_type": "general-purpose",
                                        "run_in_background": False})

    rc.api.responder = reply
    p = _ok(rc.run_lhc("-p", "spawn an agent", "--allowedTools", "Agent", "--output-format", "json",
                       timeout=120))
    sid = json.loads(p.stdout)["session_id"]
    [agent_file] = list((rc.project_dir / sid / "subagents").glob("agent-*.jsonl"))
    uuids = {r["uuid"] for r in records(agent_file) if r.get("uuid")}
    conversational = {r["uuid"] for r in records(agent_file) if r.get("type") in ("user", "assistant")}
    [thread] = json.loads(_ok(rc.run_lhc("threads", "--json")).stdout)
    exported = json.loads(_ok(rc.run_lhc("export", thread["id"], "--format", "json")).stdout)
    in_thread = {m["source_uuid"] for m in exported if m.get("agent")}
    assert conversational <= in_thread <= uuids
    agent_id = agent_file.stem[len("agent-"):]
    marked = [m for m in exported if m.get("agent")]
    assert {m["agent"]["id"] for m in marked} == {agent_id}
    call = next(m for m in exported if m["kind"] == "tool_call" and m["tool"] == "Agent")
    assert all(m["agent"]["tool_use_id"] == call["tool_use_id"] for m in marked)
    assert any(needle in (m.get("text") or "") for m in marked)


# -- a live capture reads a line at a time: it must store what one read stores --------------

def _mod_view_session(tmp_path) -> Path:
    """A 2.1.328 session the cc-lhc mod compacted in process: the boundary, the view it
    served back (header, replayed turn, end marker), then a new turn."""
    def line(**rec):
        return json.dumps({"uuid": rec.pop("uuid"), "parentUuid": rec.pop("parent", None),
                           "timestamp": "2026-01-01T00:00:00Z", "sessionId": "sess-mod", **rec})

    def said(role, content, **more):
        return {"role": role, "content": content, **more}
    answer = [{"type": "text", "text": "first answer"}]
    lines = [
        line(uuid="p1", type="user", message=said("user", "first prompt")),
        line(uuid="a1", parent="p1", type="assistant",
             message=said("assistant", answer, id="r1", model="m", stop_reason="end_turn")),
        line(uuid="b", type="system", subtype="compact_boundary", content="Conversation compacted"),
        line(uuid="h", parent="b", type="user", message=said("user", cc_lhc.REBUILT_MARKER + " from thread T.")),
        line(uuid="p1b", parent="h", type="user", message=said("user", "first prompt")),
        line(uuid="a1b", parent="p1b", type="assistant",
             message=said("assistant", answer, id="r1", model="m", stop_reason="end_turn")),
        line(uuid="e", parent="a1b", type="assistant",
             message=said("assistant", [{"type": "text", "text": cc_lhc.IN_PROCESS_VIEW_END}], id="x",
                          model="<synthetic>")),
        line(uuid="p2", parent="e", type="user", message=said("user", "second prompt")),
        line(uuid="a2", parent="p2", type="assistant", message=said(
            "assistant", [{"type": "text", "text": "second answer"}], id="r2", model="m", stop_reason="end_turn")),
    ]
    path = tmp_path / "projects" / "mod" / "sess-mod.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join(lines) + "\n")
    return path


def _decided(store) -> dict:
    """What capture decided about a session, in a form two reads can be compared by: turns
    in order, the main chain's messages in order, each agent's messages and link."""
    db = store.db
    main = db.execute("SELECT kind, role, text, tool_use_id, source_uuid, block, is_error FROM messages "
                      "WHERE agent IS NULL ORDER BY seq").fetchall()
    agents = sorted(db.execute("SELECT agent, kind, text, tool_use_id, source_uuid, block FROM messages "
                               "WHERE agent IS NOT NULL").fetchall(), key=repr)
    return {"turns": db.execute("SELECT kind, status, stop_reason FROM turns ORDER BY n").fetchall(),
            "main": main, "agents": agents,
            "links": sorted(db.execute("SELECT agent_id, kind, tool_use_id FROM agents").fetchall(), key=repr),
            "problems": sorted(r[0] for r in db.execute("SELECT kind FROM problems")),
            "raw": sorted(r[0] for r in db.execute("SELECT reason FROM raw_lines"))}


def _with_a_sidechain_hook_record(path: Path) -> None:
    """The 1.0.98 session with a hook's system record inside its sidechain (no message),
    the sidechain's next record chained to it."""
    recs = records(path)
    at = next(k for k, r in enumerate(recs) if r.get("isSidechain") and r["type"] == "assistant")
    hook = {**{k: recs[at][k] for k in ("isSidechain", "userType", "cwd", "sessionId", "version")},
            "parentUuid": recs[at]["uuid"], "type": "system", "content": "Running PreToolUse hooks…",
            "level": "info", "uuid": "00000000-0000-0000-0000-0000000051de", "timestamp": recs[at]["timestamp"]}
    recs.insert(at + 1, hook)
    recs[at + 2]["parentUuid"] = hook["uuid"]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))


@pytest.mark.parametrize("case", ["1.0.98", "1.0.98-hook", "2.0.76", "2.1.39", "sample-01", "sample-02",
                                  "sample-08", "mod-view"])
def test_a_line_at_a_time_stores_what_one_read_stores(case, tmp_path, monkeypatch):
    """Live capture looks at the file every few ms, so any line can end a read, and a
    restart (cc-lhc killed) can fall there too. Whatever the parser remembers from one
    line to the next must survive both: turns close as their version meant, sidechains
    stay one agent linked to its call, a view the mod served back is not taken for new
    conversation."""
    if case.split("-")[0] in SESSIONS:
        version = case.split("-")[0]
        source = fixture_copy(version, tmp_path / "one")
        again = fixture_copy(version, tmp_path / "steps")
        session = SESSIONS[version]
        if case.endswith("-hook"):
            _with_a_sidechain_hook_record(source)
            _with_a_sidechain_hook_record(again)
    elif case == "mod-view":
        source, again, session = _mod_view_session(tmp_path / "one"), _mod_view_session(tmp_path / "steps"), "sess-mod"
    else:
        name = next(p for p in (Path(__file__).parent / "fixtures" / "samples").glob(case[len("sample-"):] + "_*.jsonl"))
        session = json.loads(name.read_text().splitlines()[0]).get("sessionId") or "s"
        for where in ("one", "steps"):
            (tmp_path / where).mkdir()
            shutil.copy(name, tmp_path / where / f"{session}.jsonl")
        source, again = tmp_path / "one" / f"{session}.jsonl", tmp_path / "steps" / f"{session}.jsonl"
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "one" / "lhc"))
    expected = _decided(intake(source, session).store)
    lines = again.read_bytes().splitlines(keepends=True)
    again.write_bytes(b"")
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "steps" / "lhc"))
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(session, "/home/u/proj", "test")
    cap = None
    for i, raw in enumerate(lines):
        with open(again, "ab") as f:
            f.write(raw)
        if cap is None:
            cap = cc_lhc.Capture(home, thread_id, session, str(again))
        cap.catch_up()
        if i % 2:  # every other line, as if cc-lhc was killed there and started again
            cap.stop()
            cap = None
    if cap is not None:
        cap.stop()
    assert _decided(cc_lhc.ThreadStore(home, thread_id)) == expected
    if case.endswith("-hook"):  # (one agent, linked to its call, as one read makes it)
        assert [kind for _a, kind, tool in expected["links"]] == ["sidechain"] and expected["links"][0][2]


@pytest.mark.parametrize("cut", ["newline", "fragment"])
def test_a_subagent_files_torn_last_line_is_mended_when_the_session_ends(tmp_path, monkeypatch, cut):
    """A subagent killed with Claude can leave its file's last line without its newline,
    as Claude's own: at the session's end a whole record gets its newline and reaches the
    thread; a cut-off one is kept as a torn raw line and the file trimmed."""
    path = fixture_copy("2.1.39", tmp_path)
    agent = path.parent / SESSIONS["2.1.39"] / "subagents" / "agent-a2139one.jsonl"
    whole = agent.read_bytes()
    last = whole.rstrip(b"\n").rsplit(b"\n", 1)[1]
    agent.write_bytes(whole[:-1] if cut == "newline" else whole[:-1 - len(last) // 2])
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "lhc"))
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(SESSIONS["2.1.39"], "/home/u/proj", "test")
    cap = cc_lhc.Capture(home, thread_id, SESSIONS["2.1.39"], str(path))
    cap.catch_up()
    cc_lhc.finish_capture(cap, None, home)
    store = cc_lhc.ThreadStore(home, thread_id)
    rows = [r for r in agent_rows(Thread(home, thread_id, SESSIONS["2.1.39"], store)) if r[3] == "a2139one"]
    texts = [r[2] for r in rows]
    kept = store.db.execute("SELECT session, reason, raw FROM raw_lines").fetchall()
    if cut == "newline":
        assert agent.read_bytes() == whole and len(rows) == 4 and not kept
    else:
        fragment = whole[len(whole) - 1 - len(last):-1 - len(last) // 2]
        assert agent.read_bytes() == whole[:-1 - len(last)] and len(rows) == 3
        assert kept == [(f"{SESSIONS['2.1.39']}/subagents/agent-a2139one.jsonl", cc_lhc.TORN_LINE, fragment)]
    assert all(texts)


def test_a_2_0_agent_files_owner_is_read_from_at_most_a_megabyte_of_a_line(tmp_path):
    """A first record of many megabytes (a huge prompt) is not read whole to tell whose the
    file is: its sessionId, which Claude writes ahead of the message, is found in its start."""
    path = tmp_path / "agent-x.jsonl"
    head = '{"parentUuid": null, "sessionId": "s-early", "message": {"role": "user", "content": "'
    path.write_text(head + "x" * (3 << 20) + '"}}\n')
    assert cc_lhc.legacy_owner(str(path), 20) == "s-early"
    path.write_text('{"message": {"role": "user", "content": "' + "x" * (3 << 20) + '"}, "sessionId": "s-late"}\n')
    assert cc_lhc.legacy_owner(str(path), 20) is None


# -- shapes of 2.1.328's workflows, and records with nothing or more to say -------------------

def _record(session, n, rtype, parent=None, agent=None, **more):
    rec = {"parentUuid": parent, "isSidechain": agent is not None, "sessionId": session, "version": "2.1.328",
           "type": rtype, "uuid": f"00000000-0000-4000-8000-{n:012d}",
           "timestamp": f"2026-12-01T10:{n // 60:02d}:{n % 60:02d}.000Z", **more}
    if agent:
        rec["agentId"] = agent
    return rec


def _uuid(n: int) -> str:
    """The uuid _record gives its record n."""
    return f"00000000-0000-4000-8000-{n:012d}"


def _call(session, n, parent, call_id, name, agent=None, **tool_input):
    """An assistant record n that calls tool ``name`` (id ``call_id``) and stops for it."""
    return _record(session, n, "assistant", parent, agent=agent, message={
        "id": f"msg_{n}", "role": "assistant", "model": "m", "stop_reason": "tool_use",
        "content": [{"type": "tool_use", "id": call_id, "name": name, "input": tool_input}]})


def _intake_in_two(path: Path, session, recs, first=None):
    """The records into a new thread: all at once, or the ``first`` of them, then (a capture
    of its own, as after a restart) the rest."""
    t = intake(_write(path, recs[:first] if first else recs), session)
    if first:
        _write(path, recs)
        cap = cc_lhc.Capture(t.home, t.id, session, str(path))
        cap.catch_up()
        cap.stop()
    return t


def _write(path: Path, recs) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _workflow_session(root: Path, session: str, run: str, first: int = 1):
    """A session whose Workflow call launched ``run`` in the background, as 2.1.328 writes it:
    the acknowledgement names the run (the agents' .meta.json names no call, and no progress
    record names them); one agent of the run has finished."""
    u = _uuid
    n = first
    ack = (f"Workflow launched in background. Task ID: w{n}\nSummary: two steps\n"
           f"Transcript dir: {root}/{session}/subagents/workflows/{run}\nRun ID: {run}\n")
    main = [_record(session, n, "user", message={"role": "user", "content": "run the workflow"}),
            _record(session, n + 1, "assistant", u(n), message={
                "id": f"msg_{n}", "role": "assistant", "model": "m", "stop_reason": "tool_use",
                "content": [{"type": "tool_use", "id": f"toolu_wf{n}", "name": "Workflow",
                             "input": {"script": "await agent('STEP')"}}]}),
            _record(session, n + 2, "user", u(n + 1), toolUseResult={"runId": run}, message={
                "role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_wf{n}", "content": ack}]}),
            _record(session, n + 3, "assistant", u(n + 2), message={
                "id": f"msg_{n + 3}", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                "content": [{"type": "text", "text": "started"}]})]
    folder = root / session / "subagents" / "workflows" / run
    agent = f"a{n:016d}"
    _write(folder / f"agent-{agent}.jsonl", [
        _record(session, n + 10, "user", agent=agent, message={"role": "user", "content": "STEP please"}),
        _record(session, n + 11, "assistant", u(n + 10), agent=agent, message={
            "id": f"msg_{n + 11}", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": f"STEP-DONE-NEEDLE-{n}"}]})])
    (folder / f"agent-{agent}.meta.json").write_text(json.dumps({"agentType": "workflow-subagent",
                                                                 "inWorkflowRun": True}))
    (folder / "journal.jsonl").write_text(json.dumps({"type": "result", "agentId": agent}) + "\n")
    return _write(root / f"{session}.jsonl", main), f"toolu_wf{n}", agent


def test_a_subagent_started_by_a_subagent_is_linked_to_that_agents_call(tmp_path, monkeypatch, capsysbinary):
    """A subagent may start one of its own (2.1.328: its .meta.json names the call, made in
    the first agent's file): the second is linked to that call, in that call's turn, and
    the Markdown export says which message started it."""
    session = "21328000-0000-4000-8000-0000000000b7"
    root = tmp_path / "projects"
    u = _uuid
    outer, inner = "a1111222233334444", "a5555666677778888"
    path = _write(root / f"{session}.jsonl", [
        _record(session, 1, "user", message={"role": "user", "content": "delegate it"}),
        _call(session, 2, u(1), "toolu_outer", "Agent", prompt="OUTER TASK", description="outer"),
        _record(session, 3, "user", u(2), message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_outer", "content": "outer done"}]}),
        _record(session, 4, "assistant", u(3), message={
            "id": "msg_4", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "all done"}]})])
    agents = root / session / "subagents"
    _write(agents / f"agent-{outer}.jsonl", [
        _record(session, 10, "user", agent=outer, message={"role": "user", "content": "OUTER TASK"}),
        _call(session, 11, u(10), "toolu_inner", "Agent", agent=outer, prompt="INNER TASK", description="inner"),
        _record(session, 12, "user", u(11), agent=outer, message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_inner", "content": "inner done"}]}),
        _record(session, 13, "assistant", u(12), agent=outer, message={
            "id": "msg_13", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "outer done"}]})])
    _write(agents / f"agent-{inner}.jsonl", [
        _record(session, 20, "user", agent=inner, message={"role": "user", "content": "INNER TASK"}),
        _record(session, 21, "assistant", u(20), agent=inner, message={
            "id": "msg_21", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "INNER-NEEDLE done"}]})])
    for agent, call, parent in ((outer, "toolu_outer", None), (inner, "toolu_inner", outer)):
        (agents / f"agent-{agent}.meta.json").write_text(json.dumps(
            {"agentType": "general-purpose", "toolUseId": call, **({"parentAgentId": parent} if parent else {})}))
    t = intake(path, session)
    found = t.store.agents()
    (inner_call,) = [seq for (seq,) in t.store.db.execute(
        "SELECT seq FROM messages WHERE kind = 'tool_call' AND tool_use_id = 'toolu_inner'")]
    assert found[inner]["tool_use_id"] == "toolu_inner" and found[inner]["call"] == inner_call
    assert {n for (n,) in t.store.db.execute("SELECT turn FROM messages WHERE agent = ?", (inner,))} == {1}
    monkeypatch.setenv("CC_LHC_HOME", str(t.home.root))
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", t.id, "--format", "markdown"]) == 0
    assert f"subagent {inner}, started by m{inner_call}" in capsysbinary.readouterr().out.decode()


@pytest.mark.parametrize("restart_between", [False, True])
def test_a_companion_record_and_the_notification_after_it_are_one_turn(tmp_path, restart_between):
    """2.1.328 writes what ran before a background agent's summary as a record for the model
    (isMeta, turnCompanion) just before the <task-notification> that goes with it in one
    request: the two are one turn, of the notification's kind, also when capture stops
    between them."""
    session = "21328000-0000-4000-8000-0000000000c3"
    u = _uuid
    recs = [
        _record(session, 1, "user", message={"role": "user", "content": "start it in the background"}),
        _record(session, 2, "assistant", u(1), message={
            "id": "msg_2", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "started"}]}),
        _record(session, 3, "user", u(2), isMeta=True, turnCompanion=True, message={
            "role": "user", "content": "<system-reminder>\n<tools-used-before-summary>Bash</tools-used-before-summary>"
                                       "\n</system-reminder>"}),
        _record(session, 4, "user", u(3), origin={"kind": "task-notification"}, message={
            "role": "user", "content": "<task-notification>\n<task-id>b1</task-id>\n<status>completed</status>"
                                       "\n</task-notification>"}),
        _record(session, 5, "assistant", u(4), message={
            "id": "msg_5", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "it finished"}]})]
    t = _intake_in_two(tmp_path / "projects" / f"{session}.jsonl", session, recs, 3 if restart_between else None)
    rows = t.store.db.execute("SELECT n, kind FROM turns ORDER BY n").fetchall()
    assert rows == [(1, "prompt"), (2, "task-notification")]
    assert [(turn, kind) for turn, kind in t.store.db.execute(
        "SELECT turn, kind FROM messages WHERE turn = 2 ORDER BY seq")] == [
        (2, "user_meta"), (2, "user_text"), (2, "assistant_text")]


def _companion_session(tmp_path, shape, restart_at=None):
    """Turns of a 2.1.328 session holding a companion record in ``shape`` (a list of record
    kinds), read in one go or restarted before record ``restart_at``."""
    session = f"21328000-0000-4000-8001-{restart_at or 0:012d}"  # (one thread each: a restart at each line)
    made = {
        "prompt": lambda n: _record(session, n, "user", _uuid(n - 1) if n > 1 else None,
                                    message={"role": "user", "content": f"prompt {n}"}),
        "answer": lambda n: _record(session, n, "assistant", _uuid(n - 1), message={
            "id": f"msg_{n}", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": f"answer {n}"}]}),
        "call": lambda n: _call(session, n, _uuid(n - 1), f"toolu_{n}", "Bash", command="ls"),
        "companion": lambda n: _record(session, n, "user", _uuid(n - 1), isMeta=True, turnCompanion=True, message={
            "role": "user", "content": "<system-reminder>\n<tools-used-before-summary>Bash"
                                       "</tools-used-before-summary>\n</system-reminder>"}),
        "notification": lambda n: _record(session, n, "user", _uuid(n - 1), origin={"kind": "task-notification"},
                                          message={"role": "user", "content": "<task-notification>\n"
                                                   "<status>completed</status>\n</task-notification>"}),
        "caveat": lambda n: _record(session, n, "user", _uuid(n - 1), isMeta=True, message={
            "role": "user", "content": "<local-command-caveat>Caveat: ...</local-command-caveat>"}),
        "command": lambda n: _record(session, n, "user", _uuid(n - 1), message={
            "role": "user", "content": "<command-name>/context</command-name>\n<command-message>context"
                                       "</command-message>\n<command-args></command-args>"}),
        "output": lambda n: _record(session, n, "user", _uuid(n - 1), message={
            "role": "user", "content": "<local-command-stdout>Context usage 10%</local-command-stdout>"}),
    }
    recs = [made[kind](n) for n, kind in enumerate(shape, start=1)]
    t = _intake_in_two(tmp_path / "projects" / f"{session}.jsonl", session, recs,
                       restart_at - 1 if restart_at else None)
    return t.store.db.execute("SELECT n, kind FROM turns ORDER BY n").fetchall()


@pytest.mark.parametrize("shape, turns", [
    # answered without a prompt: the companion's turn is the model's work, and the prompt after
    # it a turn of its own, whether capture stopped before it or not
    (["prompt", "answer", "companion", "call", "prompt", "answer"], [(1, "prompt"), (2, "companion"), (3, "prompt")]),
    # after a command's output (/context run while an agent works): still the notification's turn
    (["prompt", "answer", "caveat", "command", "output", "companion", "notification", "answer"],
     [(1, "prompt"), (2, "command"), (3, "task-notification")]),
])
def test_a_companion_record_joins_only_a_prompt_that_follows_it_unanswered(tmp_path, shape, turns):
    assert _companion_session(tmp_path, shape) == turns
    for restart in range(2, len(shape) + 1):
        assert _companion_session(tmp_path / str(restart), shape, restart) == turns, restart


def test_a_2_1_328_workflows_agents_are_linked_through_the_run_its_call_names(tmp_path):
    session = "21328000-0000-4000-8000-0000000000a1"
    path, call, agent = _workflow_session(tmp_path / "projects", session, "wf_6de95f72-ce6")
    t = intake(path, session)
    assert t.store.agents()[agent]["tool_use_id"] == call
    assert {r[0] for r in agent_rows(t, agent)} and all(
        n == 1 for (n,) in t.store.db.execute("SELECT turn FROM messages WHERE agent = ?", (agent,)))


def test_a_workflow_run_copied_into_the_next_session_is_not_stored_twice(tmp_path):
    """A swap carries a running workflow by copying its run folder, agent files and all,
    into the new session's folder: the copies' records are the ones already captured."""
    root, run = tmp_path / "projects", "wf_0a0b0c0d-123"
    first, second = "21328000-0000-4000-8000-0000000000b1", "21328000-0000-4000-8000-0000000000b2"
    path, call, agent = _workflow_session(root, first, run)
    t = intake(path, first)
    later = _write(root / f"{second}.jsonl", [_record(second, 90, "user", message={"role": "user", "content": "go on"})])
    shutil.copytree(root / first / "subagents", root / second / "subagents")
    cap = cc_lhc.Capture(t.home, t.id, second, str(later))
    cap.catch_up()
    cap.stop()
    rows = agent_rows(t, agent)
    assert [r[2] for r in rows] == ["STEP please", "STEP-DONE-NEEDLE-1"]  # once each
    assert telemetry(t)["duplicate_record"] == 2


def test_a_sidechain_with_an_agent_id_in_the_main_file_is_linked_by_its_prompt(tmp_path):
    session = "21328000-0000-4000-8000-0000000000c1"
    u = _uuid
    path = _write(tmp_path / f"{session}.jsonl", [
        _record(session, 1, "user", message={"role": "user", "content": "look around"}),
        _call(session, 2, u(1), "toolu_t", "Task", prompt="Look at foo", description="d"),
        _record(session, 3, "user", agent="aside", message={"role": "user", "content": "Look at foo"}),
        _record(session, 4, "assistant", u(3), agent="aside", message={
            "id": "msg_4", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "foo is fine"}]}),
        _record(session, 5, "user", u(2), message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_t", "content": "foo is fine"}]})])
    t = intake(path, session)
    assert t.store.agents()["aside"]["tool_use_id"] == "toolu_t"


def test_a_user_record_with_nothing_in_it_is_kept_as_its_line_and_opens_no_turn(tmp_path):
    """No message, no content, content null: nothing to place in the conversation. The line
    is kept as written and named (never only dropped), and no empty turn appears."""
    session = "21328000-0000-4000-8000-0000000000d1"
    u = _uuid
    said = lambda n, parent, text, role="user": _record(  # noqa: E731
        session, n, role, parent, message={"role": role, "content": text} if role == "user" else {
            "id": f"msg_{n}", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": text}]})
    path = _write(tmp_path / f"{session}.jsonl", [
        said(1, None, "first"), said(2, u(1), "one", "assistant"),
        _record(session, 3, "user", u(2)),
        _record(session, 4, "user", u(3), message={"role": "user"}),
        _record(session, 5, "user", u(4), message={"role": "user", "content": None}),
        _record(session, 6, "user", u(5), message={"role": "user", "content": ""}),
        said(7, u(6), "second"), said(8, u(7), "two", "assistant")])
    t = intake(path, session)
    assert [n for n, _s, _r in turns(t)] == [1, 2]
    assert [m["text"] for m in t.store.messages()] == ["first", "one", "second", "two"]
    kept = t.store.db.execute("SELECT line, reason FROM raw_lines ORDER BY line").fetchall()
    assert kept == [(n, "unplaced_record") for n in (3, 4, 5, 6)]


def test_a_text_blocks_other_fields_are_kept_and_exported(tmp_path, monkeypatch, capsysbinary):
    session = "21328000-0000-4000-8000-0000000000e1"
    cited = {"type": "text", "text": "as the page says", "citations": [
        {"type": "char_location", "cited_text": "abc", "document_index": 0}]}
    marked = {"type": "text", "text": "x" * 300, "cache_control": {"type": "ephemeral"}}
    path = _write(tmp_path / f"{session}.jsonl", [
        _record(session, 1, "user", message={"role": "user", "content": [marked]}),
        _record(session, 2, "assistant", "00000000-0000-4000-8000-000000000001", message={
            "id": "msg_2", "role": "assistant", "model": "m", "stop_reason": "end_turn", "content": [cited]})])
    t = intake(path, session)
    monkeypatch.setenv("CC_LHC_HOME", str(t.home.root))
    assert cc_lhc.main(["export", t.id, "--format", "json"]) == 0
    exported = json.loads(capsysbinary.readouterr().out)
    assert [m.get("block") for m in exported] == [marked, cited]
    assert [m["text"] for m in exported] == [marked["text"], cited["text"]]
    # a prompt's own block is no prompt queued mid-turn (whose data is its attachment):
    # the in-process view still serves it by its handle
    assert t.store.db.execute(f"SELECT count(*) FROM messages WHERE {cc_lhc.QUEUED_PROMPT_SQL}").fetchone() == (0,)


def test_a_record_of_an_unknown_type_holding_a_message_is_kept_as_its_line(tmp_path):
    session = "21328000-0000-4000-8000-0000000000f1"
    path = _write(tmp_path / f"{session}.jsonl", [
        _record(session, 1, "user", message={"role": "user", "content": "hi"}),
        _record(session, 2, "assistant_note", "00000000-0000-4000-8000-000000000001",
                message={"role": "assistant", "content": [{"type": "text", "text": "NOTE-NEEDLE"}]})])
    t = intake(path, session)
    (raw,) = [r for (r,) in t.store.db.execute("SELECT raw FROM raw_lines WHERE reason = 'unplaced_record'")]
    assert b"NOTE-NEEDLE" in raw
    assert telemetry(t)["assistant_note"] == 1


def test_a_subagents_stop_hook_report_does_not_hold_the_sessions_seam(tmp_path):
    """SubagentStop hooks write system/stop_hook_summary into the agent's own file: that says
    nothing about Stop hooks of the session, whose finished turn is a settled seam."""
    session = "21328000-0000-4000-8000-0000000000a9"
    path, _call, agent = _workflow_session(tmp_path / "projects", session, "wf_11112222-333")
    agent_file = next((tmp_path / "projects" / session).glob("subagents/workflows/*/agent-*.jsonl"))
    with agent_file.open("a") as f:
        f.write(json.dumps(_record(session, 40, "system", "00000000-0000-4000-8000-000000000012", agent=agent,
                                   subtype="stop_hook_summary", hookCount=1)) + "\n")
    t = intake(path, session)
    assert telemetry(t)["system/stop_hook_summary"] == 1
    assert cc_lhc.unsettled_reason(t.store) == ""


def test_the_markdown_export_names_each_turn_once_and_each_agents_call(tmp_path, monkeypatch, capsysbinary):
    """Agent files are read after their session's, so their records come later in label
    order than the turns that follow the call: the Markdown export still shows each turn
    under one heading, the agent's records in the turn of the call that started them."""
    t = captured("2.1.39", tmp_path)
    monkeypatch.setenv("CC_LHC_HOME", str(t.home.root))
    assert cc_lhc.main(["export", t.id, "--format", "markdown"]) == 0
    out = capsysbinary.readouterr().out.decode()
    headings = re.findall(r"^## (t\d+)$", out, re.M)
    assert len(headings) == len(set(headings)) == len(turns(t))
    calls = {a: f"m{i['call']}" for a, i in t.store.agents().items()}
    for agent, call in calls.items():
        assert f"subagent {agent}, started by {call} " in out


def test_a_catch_up_of_its_own_sees_a_2_0_agent_file_that_just_appeared(tmp_path):
    """Only a live capture's polls look at the shared folder once a second: a catch-up that
    is no poll (measure, a one-shot's last read) finds an agent file written a moment ago."""
    path = fixture_copy("2.0.76", tmp_path)
    (agent_file,) = path.parent.glob("agent-*.jsonl")
    aside = agent_file.read_bytes()
    agent_file.unlink()
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(SESSIONS["2.0.76"], "/home/u/proj", "test")
    cap = cc_lhc.Capture(home, thread_id, SESSIONS["2.0.76"], str(path))
    cap.catch_up()
    held = "SELECT count(*) FROM messages WHERE agent IS NOT NULL"
    assert cap.store.db.execute(held).fetchone() == (0,)
    agent_file.write_bytes(aside)
    cap.catch_up()
    assert cap.store.db.execute(held).fetchone()[0] > 0
    cap.stop()


def test_a_prompt_block_kept_whole_behind_its_nul_is_served_by_its_handle(tmp_path):
    """A text block with other fields whose text looks like cc-lhc's marker is stored whole,
    behind a NUL (no JSON): telling queued prompts apart never reads it as JSON."""
    session = "21328000-0000-4000-8000-0000000000e2"
    odd = {"type": "text", "text": "\u0000cc-lhc:text here", "cache_control": {"type": "ephemeral"}}
    path = _write(tmp_path / f"{session}.jsonl", [
        _record(session, 1, "user", message={"role": "user", "content": [odd]}),
        _record(session, 2, "assistant", "00000000-0000-4000-8000-000000000001", message={
            "id": "msg_2", "role": "assistant", "model": "m", "stop_reason": "end_turn",
            "content": [{"type": "text", "text": "ok"}]})])
    t = intake(path, session)
    assert t.store.db.execute("SELECT substr(CAST(data AS BLOB), 1, 1) FROM messages WHERE seq = 1").fetchone() == (b"\x00",)
    handles = cc_lhc.live_handles(t.store, session)
    assert handles and cc_lhc.HELD_AS_WORDS not in handles.values()


# -- Claude's own compaction in the middle of a turn -----------------------------------------

def _compacted_mid_turn(session="21390000-0000-4000-8000-0000000c0de1", version="2.1.39"):
    """2.1.39's auto-compaction after a tool result: the turn's call and result, the
    boundary and summary, then Claude goes on unasked and ends the turn (stop_reason null,
    as that version writes it; then its Stop hooks' report and the turn's duration)."""
    def rec(n, rtype, parent, **more):
        return {**_record(session, n, rtype, parent, **more), "version": version}
    return [
        rec(1, "user", None, message={"role": "user", "content": "do the work"}),
        rec(2, "assistant", _uuid(1), message={
            "id": "msg_2", "role": "assistant", "model": "m", "stop_reason": None,
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}),
        rec(3, "user", _uuid(2), message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file.txt"}]}),
        rec(4, "system", None, subtype="compact_boundary", logicalParentUuid=_uuid(3), content="Conversation compacted",
            compactMetadata={"trigger": "auto", "preTokens": 160000}),
        rec(5, "user", _uuid(4), isCompactSummary=True, isVisibleInTranscriptOnly=True,
            message={"role": "user", "content": "This session is being continued from a previous conversation. "
                                                "Summary: listing files."}),
        rec(6, "assistant", _uuid(5), message={"id": "msg_6", "role": "assistant", "model": "m", "stop_reason": None,
                                               "content": [{"type": "text", "text": "All done: file.txt is there."}]}),
        rec(7, "system", _uuid(6), subtype="stop_hook_summary", hookCount=1, hookInfos=[{"command": "true"}],
            hookErrors=[], preventedContinuation=False, stopReason="", hasOutput=False),
        rec(8, "system", _uuid(7), subtype="turn_duration", durationMs=7000),
    ]


def _grown(where: Path, monkeypatch, session, recs, cuts=(), each=None):
    """The records into a new thread in a state folder of ``where``'s own, the file growing
    to each of ``cuts`` records in turn (a capture of its own each time, as after a
    restart), then to all; ``each(store)`` runs after each read."""
    monkeypatch.setenv("CC_LHC_HOME", str(where / "lhc"))
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(session, "/home/u/proj", "test")
    path = where / f"{session}.jsonl"
    for n in [*cuts, len(recs)]:
        _write(path, recs[:n])
        cap = cc_lhc.Capture(home, thread_id, session, str(path))
        cap.catch_up()
        cap.stop()
        if each is not None:
            each(cc_lhc.ThreadStore(home, thread_id))
    return Thread(home, thread_id, session, cc_lhc.ThreadStore(home, thread_id))


@pytest.mark.parametrize("first", [6, 7])
def test_the_turn_claude_goes_on_with_after_compacting_ends_on_its_records_read_later(tmp_path, monkeypatch, first):
    """Read live, 2.1.39's answer after its own mid-turn compaction and the records that end
    the turn come in different reads (and a restart can fall between): the turn ends on them
    as in one read (it stayed open, so no seam after it was settled)."""
    recs = _compacted_mid_turn()
    session = recs[0]["sessionId"]
    one = _grown(tmp_path / "one", monkeypatch, session, recs)
    live = _grown(tmp_path / "live", monkeypatch, session, recs, [first])
    assert turns(live) == turns(one) and turns(one)[-1][1:] == ("closed", "stop_hook_summary")
    assert cc_lhc.unsettled_reason(live.store) == ""


def test_the_seam_right_after_claudes_own_mid_turn_compaction_is_not_settled(tmp_path, monkeypatch):
    """Claude compacted in the middle of a turn and goes on with its work unasked: until it
    does, a running session is not at a settled seam (it read as settled from the summary
    on, so a swap or a typed note could land while Claude was about to answer)."""
    recs = _compacted_mid_turn()
    seen = []
    _grown(tmp_path, monkeypatch, recs[0]["sessionId"], recs, [5, 6],
           each=lambda store: seen.append((cc_lhc.unsettled_reason(store), cc_lhc.unsettled_reason(store, idle=True))))
    assert seen[0] == ("Claude compacted the conversation in the middle of t1 and goes on with that turn's work",
                       "")  # (idle: no Claude goes on with it, so it is settled)
    assert seen[1][0].startswith("the transcript was left mid-turn")  # (its answer: the turn is open)
    assert seen[2] == ("", "")


def test_the_seam_after_claudes_reactive_compaction_waits_for_its_answer(tmp_path, monkeypatch):
    """2.1.328 compacts by itself when the API finds a prompt too long, then sends it again:
    the prompt's turn goes on after the summary (the real sample, cut before the answer)."""
    name = next((Path(__file__).parent / "fixtures" / "samples").glob("08_*.jsonl"))
    lines = name.read_bytes().splitlines(keepends=True)
    session = json.loads(lines[0]).get("sessionId") or "s"
    seen = []
    for n in (41, len(lines)):
        (tmp_path / str(n)).mkdir()
        (tmp_path / str(n) / f"{session}.jsonl").write_bytes(b"".join(lines[:n]))
        monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / str(n) / "lhc"))
        seen.append(cc_lhc.unsettled_reason(intake(tmp_path / str(n) / f"{session}.jsonl", session).store))
    assert "compacted the conversation in the middle" in seen[0] and seen[1] == ""


def test_a_compaction_between_turns_leaves_the_seam_settled(tmp_path, monkeypatch):
    """Claude's compaction after a turn that had ended (a typed /compact, which 2.1.328
    writes before the command's own records) cuts nothing short: the seam stays settled."""
    recs = _compacted_mid_turn(version="2.1.328")
    ended = [recs[0], {**recs[5], "parentUuid": recs[0]["uuid"],
                       "message": {**recs[5]["message"], "stop_reason": "end_turn"}},
             {**recs[7], "parentUuid": recs[5]["uuid"]}, recs[3], {**recs[4], "uuid": _uuid(9)}]
    t = _grown(tmp_path, monkeypatch, recs[0]["sessionId"], ended)
    assert turns(t)[-1][1:] == ("closed", "compact_summary")
    assert cc_lhc.unsettled_reason(t.store) == ""


@pytest.mark.parametrize("restart", [False, True])
def test_a_readable_copy_of_a_record_kept_only_as_its_line_is_read(tmp_path, monkeypatch, restart):
    """A record in a shape the parser cannot read is kept as its line; a later copy under
    the same uuid that can be read is the only readable one, and it was dropped as a copy
    of the first (a duplicate), its words in no message. It is read now, and the chain
    goes on from it."""
    session = "21328000-0000-4000-8000-0000000000f1"
    bad = _record(session, 1, "user", None, message="error")
    good = _record(session, 1, "user", None, message={"role": "user", "content": "the readable copy"})
    answer = _record(session, 2, "assistant", _uuid(1), message={
        "id": "msg_2", "role": "assistant", "model": "m", "stop_reason": "end_turn",
        "content": [{"type": "text", "text": "answered"}]})
    t = _grown(tmp_path, monkeypatch, session, [bad, good, answer], [1] if restart else [])
    assert [m["text"] for m in t.store.messages()] == ["the readable copy", "answered"]
    assert t.store.db.execute("SELECT line, reason FROM raw_lines").fetchall() == [(1, "malformed_line")]
    assert "duplicate_record" not in telemetry(t)
    problems = [r[0] for r in t.store.db.execute("SELECT kind FROM problems")]
    assert problems == ["malformed_line"]


@pytest.mark.parametrize("restart", [False, True])
def test_a_record_that_failed_after_opening_its_turn_leaves_no_empty_turn_for_its_copy(tmp_path, monkeypatch,
                                                                                      restart):
    """A prompt whose block the parser cannot read gets as far as opening its turn: a copy
    of it read again under its uuid would open a second turn before its own, empty and
    misnumbered. Its uuid stays taken then: the thread keeps the turns one prompt makes."""
    session = "21328000-0000-4000-8000-0000000000f2"
    said = lambda n, parent, role, text: _record(session, n, role, parent, message=(  # noqa: E731
        {"role": "user", "content": text} if role == "user" else
        {"id": f"msg_{n}", "role": "assistant", "model": "m", "stop_reason": "end_turn",
         "content": [{"type": "text", "text": text}]}))
    recs = [said(10, None, "user", "earlier prompt"), said(11, _uuid(10), "assistant", "earlier answer"),
            _record(session, 1, "user", _uuid(11), message={"role": "user", "content": [{"type": "text", "text": 5}]}),
            said(1, _uuid(11), "user", "the readable copy"), said(2, _uuid(1), "assistant", "answered")]
    t = _grown(tmp_path, monkeypatch, session, recs, [3] if restart else [])
    assert [n for n, _s, _r in turns(t)] == [1, 2]
    firsts = t.store.db.execute("SELECT first_seq, last_seq FROM turns ORDER BY n").fetchall()
    assert all(first <= last for first, last in firsts), firsts
