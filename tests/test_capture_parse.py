"""Capture, part 1: the rollout parser and the record it writes.

Golden tests over the real transcripts in ../shared/samples/ and over transcripts the real
CLI writes at test time, then unit tests of the parser's rules: what is a message, a turn,
a segment, a problem, and what is only telemetry.
"""

from __future__ import annotations

import itertools
import os
import json
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import block_text, tool_results

# Real transcripts written by Claude Code 2.1.328 (already redacted; see fixtures/samples).
SAMPLES = Path(__file__).resolve().parent / "fixtures" / "samples"
SAMPLE_01 = SAMPLES / "01_plain_hello.jsonl"
SAMPLE_02 = SAMPLES / "02_tool_roundtrip_thinking.jsonl"
SAMPLE_08 = SAMPLES / "08_synthetic_resume_prompt_too_long_reactive_compact.jsonl"



# -- helpers ------------------------------------------------------------------------------

def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def rows(out: cc_lhc.ParseOutput) -> list[dict]:
    return [dict(zip(cc_lhc.MESSAGE_COLUMNS, m)) for m in out.messages]


def parse_bytes(data: bytes, soft: int = 10 ** 9, session: str = "sess-1",
                state: cc_lhc.ParseState | None = None) -> cc_lhc.ParseOutput:
    """A one-shot parse of every complete line, as capture would feed them."""
    parser = cc_lhc.RolloutParser(session, state or cc_lhc.ParseState(), soft)
    for n, (line, offset) in enumerate(cc_lhc.split_complete_lines(data, 0), 1):
        parser.feed(line, n, offset)
    return parser.take()


class Captured:
    """A transcript captured into a fresh thread store, opened for reading."""

    def __init__(self, tmp: Path, transcript: Path, session: str = "sess-1", policy=None):
        self.home = cc_lhc.StateHome(tmp / "lhc")
        self.home.ensure()
        self.events = []
        self.capture = cc_lhc.Capture(self.home, "thread-1", session, str(transcript), policy,
                                      on_event=lambda event, _cap: self.events.append(event))
        self.lines = self.capture.catch_up()
        self.store = self.capture.store

    def messages(self) -> list[dict]:
        return list(self.store.messages())

    def export(self) -> list[dict]:
        return [cc_lhc.export_record(m) for m in self.store.messages()]

    def turns(self) -> list[tuple]:
        return self.store.db.execute("SELECT n, kind, status, first_seq, last_seq, stop_reason "
                                     "FROM turns ORDER BY n").fetchall()

    def segments(self) -> list[tuple]:
        return self.store.db.execute("SELECT turn, idx, first_seq, last_seq, reason FROM segments "
                                     "ORDER BY turn, idx").fetchall()

    def usage(self) -> dict:
        return {r[0]: r[1:] for r in self.store.db.execute(
            "SELECT response_id, seq, input, cache_creation, cache_read, output, model FROM usage")}

    def problems(self) -> list[tuple]:
        return self.store.db.execute("SELECT line, kind, detail FROM problems ORDER BY id").fetchall()

    def telemetry(self) -> dict:
        return {t: c for t, c in self.store.db.execute("SELECT type, count FROM telemetry")}

    def close(self):
        self.capture.stop()


@pytest.fixture
def capture(tmp_path):
    opened = []

    def run(transcript, **kw) -> Captured:
        c = Captured(tmp_path / f"c{len(opened)}", Path(transcript), **kw)
        opened.append(c)
        return c

    yield run
    for c in opened:
        c.close()


def conversational_blocks(recs: list[dict]) -> list[tuple]:
    """An independent reading of a transcript: (role, kind, verbatim payload) per block."""
    out = []
    for r in recs:
        if r.get("type") not in ("user", "assistant") or not r.get("uuid") or r.get("isSidechain"):
            continue
        content = r["message"]["content"]
        if r.get("isCompactSummary"):
            out.append(("user", "compact_summary", content))
            continue
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        for b in content:
            if b["type"] == "text":
                kind = "assistant_text" if r["type"] == "assistant" else (
                    "user_meta" if r.get("isMeta") else "user_text")
                out.append((r["type"], kind, b["text"]))
            elif b["type"] == "thinking":
                out.append(("assistant", "thinking", (b["thinking"], b["signature"])))
            elif b["type"] == "tool_use":
                out.append(("assistant", "tool_call", (b["name"], b["input"], b["id"])))
            elif b["type"] == "tool_result":
                out.append(("user", "tool_result", (b["content"], b["tool_use_id"])))
    return out


def exported_blocks(export: list[dict]) -> list[tuple]:
    out = []
    for e in export:
        if e["kind"] == "thinking":
            out.append((e["role"], e["kind"], (e["text"], e["signature"])))
        elif e["kind"] == "tool_call":
            out.append((e["role"], e["kind"], (e["tool"], e["input"], e["tool_use_id"])))
        elif e["kind"] == "tool_result":
            out.append((e["role"], e["kind"], (e["output"], e["tool_use_id"])))
        else:
            out.append((e["role"], e["kind"], e["text"]))
    return out


_UUIDS = itertools.count(1)  # record uuids unique across every Transcript of a run


class Transcript:
    """Writes chained records the way Claude Code does, for the parser's unit tests.

    Each assistant block is its own record sharing ``message.id``; every chained record
    names the previous one as its parent.
    """

    def __init__(self, session: str = "sess-1"):
        self.session = session
        self.lines: list[bytes] = []
        self.parent = None
        self.n = 0
        self.responses = 0

    def _id(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}-{next(_UUIDS):06d}"

    def raw(self, line: bytes) -> "Transcript":
        self.lines.append(line)
        return self

    def record(self, rec: dict, chained: bool = True) -> dict:
        if chained:
            rec = {"parentUuid": self.parent, "isSidechain": False, **rec,
                   "uuid": rec.get("uuid") or self._id("uuid"), "sessionId": self.session,
                   "timestamp": f"2026-11-30T10:00:{self.n % 60:02d}.000Z"}
            self.parent = rec["uuid"]
        self.lines.append(json.dumps(rec, ensure_ascii=False).encode())
        return rec

    def user(self, text: str, **extra) -> dict:
        return self.record({"type": "user", "message": {"role": "user", "content": text}, **extra})

    def bookkeeping(self, rtype: str, **extra) -> dict:
        return self.record({"type": rtype, "sessionId": self.session, **extra}, chained=False)

    def assistant(self, *blocks: dict, stop: str = "end_turn", model: str = "claude-opus-5-5",
                  usage: dict | list | None = None, msg_id: str | None = None) -> list[dict]:
        """One response, one record per block; ``usage`` may be a list, one per record."""
        self.responses += 1
        msg_id = msg_id or f"msg_{self.responses:04d}"
        out = []
        for i, block in enumerate(blocks):
            u = usage[i] if isinstance(usage, list) else (
                usage or {"input_tokens": 100 * self.responses, "output_tokens": 7})
            out.append(self.record({"type": "assistant", "message": {
                "id": msg_id, "type": "message", "role": "assistant", "model": model,
                "content": [block], "stop_reason": stop, "usage": u}}))
        return out

    def tool_result(self, *results: tuple, **extra) -> dict:
        """results: (tool_use_id, content) or (tool_use_id, content, is_error)."""
        blocks = [{"type": "tool_result", "tool_use_id": r[0], "content": r[1],
                   **({"is_error": True} if len(r) > 2 and r[2] else {})} for r in results]
        return self.record({"type": "user", "message": {"role": "user", "content": blocks}, **extra})

    def data(self) -> bytes:
        return b"".join(line + b"\n" for line in self.lines)

    def write(self, path: Path) -> Path:
        path.write_bytes(self.data())
        return path


def text(t: str) -> dict:
    return {"type": "text", "text": t}


def thinking(t: str, sig: str) -> dict:
    return {"type": "thinking", "thinking": t, "signature": sig}


def tool_use(tid: str, command: str, name: str = "Bash") -> dict:
    return {"type": "tool_use", "id": tid, "name": name, "input": {"command": command}}


# -- golden: the committed real transcripts ------------------------------------------------

def test_golden_plain_hello(capture):
    c = capture(SAMPLE_01)
    recs = records(SAMPLE_01)
    assert c.lines == len(recs) == 22
    assert [(m["turn"], m["role"], m["kind"], m["text"]) for m in c.messages()] == [
        (1, "user", "user_text", "hello"),
        (1, "assistant", "assistant_text", "Hello from the fake API."),
    ]
    assert c.turns() == [(1, "prompt", "closed", 1, 2, "end_turn")]
    assert c.segments() == [(1, 0, 1, 2, "terminal")]
    [reply] = [r for r in recs if r["type"] == "assistant"]
    assert c.usage() == {reply["message"]["id"]: (2, 10, 0, 0, 5, "claude-opus-5-5")}
    # every other line is bookkeeping or envelope: counted, never a message, never a problem
    assert sum(c.telemetry().values()) == 20
    assert c.telemetry()["queue-operation"] == 2
    assert c.telemetry()["attachment/prompt_snapshot"] == 2
    assert c.problems() == []
    assert c.store.summary()["degraded"] is None
    assert c.store.summary()["captured_bytes"] == SAMPLE_01.stat().st_size
    # labels and provenance as export shows them
    first, second = c.export()
    assert (first["label"], first["turn"], second["label"], second["turn"]) == ("m1", "t1", "m2", "t1")
    assert first["source_uuid"] == recs[2]["uuid"] and first["source_session"] == "sess-1"
    assert second["source_uuid"] == reply["uuid"] and second["model"] == "claude-opus-5-5"


def test_golden_tool_round_trip_with_signed_thinking(capture):
    c = capture(SAMPLE_02)
    recs = records(SAMPLE_02)
    raw = SAMPLE_02.read_bytes()
    assert c.lines == 30
    export = c.export()
    assert [(e["label"], e["turn"], e["kind"]) for e in export] == [
        ("m1", "t1", "user_text"), ("m2", "t1", "thinking"), ("m3", "t1", "assistant_text"),
        ("m4", "t1", "tool_call"), ("m5", "t1", "tool_result"), ("m6", "t1", "assistant_text")]
    assert exported_blocks(export) == conversational_blocks(recs)
    prompt, think, say, call, result, answer = export
    assert prompt["text"] == "run echo hi"
    # thinking: text and signature exactly as written, byte for byte
    assert think["text"] == "The user wants me to run echo. I'll use Bash."
    assert think["signature"] == "ZmFrZS1zaWduYXR1cmUtMQ=="
    assert b'"signature":"ZmFrZS1zaWduYXR1cmUtMQ=="' in raw
    stored = c.messages()[1]
    raw_block = [r for r in recs if r["type"] == "assistant"][0]["message"]["content"][0]
    assert json.loads(stored["data"]) == raw_block
    assert say["text"] == "Running it now."
    # the tool call and its result are paired by tool_use_id
    assert call["tool"] == "Bash" and call["input"] == {"command": "echo hi", "description": "Print hi"}
    assert result["tool_use_id"] == call["tool_use_id"] == "toolu_c826ebaa58604d7b8274cb7d"
    assert result["output"] == "hi" and result["is_error"] is False
    assert answer["text"] == "The command printed: hi"
    # one response written as three records is one response; usage is that response's
    assert len({m["response_id"] for m in c.messages()[1:4]}) == 1
    assert c.usage() == {
        "msg_fake_541b513696fe43b593ba": (4, 1200, 3000, 0, 40, "claude-opus-5-5"),
        "msg_fake_3de1b0423d1344aebdb3": (6, 370000, 1500, 4200, 12, "claude-opus-5-5"),
    }
    assert c.turns() == [(1, "prompt", "closed", 1, 6, "end_turn")]
    assert c.problems() == []


def test_golden_native_compact_summary_is_its_own_closed_turn(capture):
    c = capture(SAMPLE_08)
    recs = records(SAMPLE_08)
    assert c.lines == 47
    export = c.export()
    assert len(export) == 9 and len(c.turns()) == 4
    assert exported_blocks(export) == conversational_blocks(recs)
    summary_rec = next(r for r in recs if r.get("isCompactSummary"))
    [summary] = [e for e in export if e["kind"] == "compact_summary"]
    assert summary["text"] == summary_rec["message"]["content"]  # verbatim
    assert summary["source_uuid"] == summary_rec["uuid"]
    n = int(summary["turn"][1:])
    turns = {t[0]: t for t in c.turns()}
    # a bounded, closed turn holding only the summary
    assert turns[n][1:3] == ("compact_summary", "closed")
    assert [e["label"] for e in export if e["turn"] == f"t{n}"] == [summary["label"]]
    # ... reported loudly, once
    assert c.events == [("native_compact", n)]
    # everything before it stays in the thread, with its signature
    think = next(e for e in export if e["kind"] == "thinking")
    raw_think = recs[1]["message"]["content"][0]
    assert (think["text"], think["signature"]) == (raw_think["thinking"], raw_think["signature"])
    assert [e["text"] for e in export if e["kind"] == "user_text"] == [
        "[context rebuilt] turns t1–t40 not in view; use get-turns", "continue"]
    assert turns[1][1:3] == ("prompt", "closed")
    # the prompt before and the reply after live in their own turns, not in the summary's
    continue_turn = next(e["turn"] for e in export if e.get("text") == "continue")
    reply = export[-1]
    assert reply["text"] == "reply after compaction"
    assert int(continue_turn[1:]) < n < int(reply["turn"][1:])
    assert c.telemetry()["system/compact_boundary"] == 1
    # a compact boundary has no parent by design: not a broken chain
    assert c.problems() == []


def test_nothing_latches_after_a_compact_summary(tmp_path, capture):
    t = Transcript()
    t.lines = SAMPLE_08.read_bytes().splitlines()
    t.parent = records(SAMPLE_08)[-5]["uuid"]  # the last chained record
    t.user("after the summary")
    t.assistant(text("a normal reply"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    turns = c.turns()
    assert turns[-1] == (5, "prompt", "closed", 10, 11, "end_turn")
    assert [m["kind"] for m in c.messages()][-2:] == ["user_text", "assistant_text"]
    assert c.events == [("native_compact", 3)]
    assert c.problems() == []


def test_samples_parse_the_same_pure_and_through_the_store(capture):
    """The pure parser and the stored record agree line for line."""
    for sample in (SAMPLE_01, SAMPLE_02, SAMPLE_08):
        out = parse_bytes(sample.read_bytes())
        stored = [tuple(m.values()) for m in capture(sample).messages()]
        assert [row for row in out.messages] == stored
        assert out.problems == []


# -- golden: transcripts the real CLI writes now --------------------------------------------

SIGNATURE = "RXFzaWduZWQ+/+thinking/sig==" + "A" * 200


def test_real_cli_transcript_golden(real_claude, capture):
    """Signed thinking and a Bash round trip, as the pinned CLI really writes them."""
    api = real_claude.api
    api.script([
        {"content": [thinking("I should run the command ✓ — 日本語.", SIGNATURE),
                     {"type": "thinking", "thinking": "", "signature": "empty-but-signed"},
                     text("Running it."),
                     {"type": "tool_use", "id": "toolu_golden_1", "name": "Bash",
                      "input": {"command": "echo golden-$((6*7))", "description": "multiply"}}],
         "usage": {"input_tokens": 370000, "cache_creation_input_tokens": 11,
                   "cache_read_input_tokens": 22, "output_tokens": 33}},
        lambda body: {"text": "Saw: " + block_text(tool_results(body)[0]),
                      "usage": {"input_tokens": 5, "output_tokens": 6}},
    ])
    p = real_claude.run_claude("-p", "run the golden command", "--output-format", "json",
                               "--allowedTools", "Bash")
    assert p.returncode == 0, p.stderr
    session = json.loads(p.stdout)["session_id"]
    [path] = real_claude.transcripts()
    recs = records(path)
    c = capture(path, session=session)
    export = c.export()
    assert exported_blocks(export) == conversational_blocks(recs)
    kinds = [e["kind"] for e in export]
    assert kinds == ["user_text", "thinking", "thinking", "assistant_text", "tool_call",
                     "tool_result", "assistant_text"]
    assert export[0]["text"] == "run the golden command"
    assert (export[1]["text"], export[1]["signature"]) == ("I should run the command ✓ — 日本語.", SIGNATURE)
    assert (export[2]["text"], export[2]["signature"]) == ("", "empty-but-signed")
    call, result = export[4], export[5]
    assert call["input"] == {"command": "echo golden-$((6*7))", "description": "multiply"}
    assert call["tool_use_id"] == result["tool_use_id"] == "toolu_golden_1"
    assert block_text({"content": result["output"]}) == "golden-42"
    assert export[6]["text"] == "Saw: golden-42"
    assert c.turns() == [(1, "prompt", "closed", 1, 7, "end_turn")]
    # usage: the scripted figures, believed verbatim, once per response
    models = {r["message"]["model"] for r in recs if r.get("type") == "assistant"}
    [model] = models
    responses = {r["message"]["id"] for r in recs if r.get("type") == "assistant"}
    usage = c.usage()
    assert set(usage) == responses and len(responses) == 2
    first = next(u for u in usage.values() if u[1] == 370000)
    assert first == (5, 370000, 11, 22, 33, model)
    assert all(e["model"] == model for e in export if e["role"] == "assistant")
    assert all(e["source_session"] == session for e in export)
    assert {e["source_uuid"] for e in export} <= {r.get("uuid") for r in recs}
    assert c.problems() == []
    assert c.store.summary()["captured_bytes"] == path.stat().st_size


def test_real_cli_resumed_session_golden(real_claude, capture):
    """Two prompts in one session (the second through --resume): two closed turns."""
    real_claude.api.script(["first answer — ünïcødé 🚀", "second answer"])
    p = real_claude.run_claude("-p", "first prompt", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    session = json.loads(p.stdout)["session_id"]
    p = real_claude.run_claude("--resume", session, "-p", "second prompt")
    assert p.returncode == 0, p.stderr
    [path] = real_claude.transcripts()
    c = capture(path, session=session)
    assert [(e["turn"], e["kind"], e["text"]) for e in c.export()] == [
        ("t1", "user_text", "first prompt"), ("t1", "assistant_text", "first answer — ünïcødé 🚀"),
        ("t2", "user_text", "second prompt"), ("t2", "assistant_text", "second answer")]
    assert [t[1:3] for t in c.turns()] == [("prompt", "closed"), ("prompt", "closed")]
    assert c.problems() == []


# -- parser rules ---------------------------------------------------------------------------

def test_empty_but_signed_thinking_is_kept():
    t = Transcript()
    t.user("think")
    t.assistant(thinking("", "c2lnbmVkLWJ1dC1lbXB0eQ=="), text("done"))
    out = parse_bytes(t.data())
    rows = [dict(zip(cc_lhc.MESSAGE_COLUMNS, m)) for m in out.messages]
    assert [r["kind"] for r in rows] == ["user_text", "thinking", "assistant_text"]
    exported = cc_lhc.export_record(rows[1])
    assert exported["text"] == "" and exported["signature"] == "c2lnbmVkLWJ1dC1lbXB0eQ=="
    assert json.loads(rows[1]["data"]) == {"type": "thinking", "thinking": "",
                                           "signature": "c2lnbmVkLWJ1dC1lbXB0eQ=="}


def test_unknown_and_bookkeeping_records_are_telemetry_not_errors():
    t = Transcript()
    t.user("hi")
    t.bookkeeping("queue-operation", operation="enqueue")
    t.bookkeeping("a-type-from-the-future", payload="x" * 50)
    t.record({"type": "progress-from-the-future", "data": {"n": 1}})  # chained, unknown
    t.record({"type": "system", "subtype": "turn_duration", "durationMs": 5})
    t.record({"type": "attachment", "attachment": {"type": "date", "date": "today"}})
    t.assistant(text("hello"))  # its parent is the unknown chained record: not broken
    out = parse_bytes(t.data())
    assert out.problems == []
    assert [m.kind for m in out.messages] == ["user_text", "assistant_text"]
    tele = {k: v[0] for k, v in out.telemetry.items()}
    assert tele == {"queue-operation": 1, "a-type-from-the-future": 1,
                    "progress-from-the-future": 1, "system/turn_duration": 1,
                    "attachment/date": 1}
    assert out.telemetry["a-type-from-the-future"][1] == len(t.lines[2])


def test_malformed_line_before_the_last_is_a_problem_with_its_line(tmp_path, capture):
    t = Transcript()
    t.user("one")
    t.assistant(text("two"))
    t.raw(b'{"type":"user","uuid":"torn-in-the-mid')  # line 3
    t.user("three")
    t.assistant(text("four"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    [(line, kind, detail)] = c.problems()
    assert (line, kind) == (3, "malformed_line")
    summary = c.store.summary()
    assert summary["degraded"].startswith("malformed_line at line 3")
    # nothing after it is lost
    assert [m["text"] for m in c.messages()] == ["one", "two", "three", "four"]


def test_two_unreadable_lines_of_the_same_bytes_are_both_kept(tmp_path, capture):
    """A kept line is one per place in the file: the second copy of the same bytes is a
    row of its own (its line and offset), and reading the file again adds none."""
    t = Transcript()
    t.raw(b"garbage GARB-1")
    t.user("between")
    t.raw(b"garbage GARB-1")
    path = t.write(tmp_path / "t.jsonl")
    c = capture(path)
    kept = c.store.db.execute("SELECT line, offset, raw FROM raw_lines ORDER BY offset").fetchall()
    assert [(line, raw) for line, _o, raw in kept] == [(1, b"garbage GARB-1"), (3, b"garbage GARB-1")]
    whole = path.read_bytes()
    path.write_bytes(b"")           # rewritten from its start: read again, each line once
    c.capture.catch_up()
    path.write_bytes(whole)
    c.capture.catch_up()
    assert c.store.db.execute("SELECT count(*) FROM raw_lines").fetchone()[0] == 2


def test_a_conversational_record_without_uuid_or_type_is_kept_and_named(tmp_path, capture):
    """Claude always writes both; a user or assistant record without a uuid (it cannot join
    the chain) or a record with a message and no type is kept as written and is a
    problem, never only a count."""
    t = Transcript()
    t.user("one")
    rec = t.user("NO-UUID-PROMPT")
    t.lines[-1] = json.dumps({k: v for k, v in rec.items() if k != "uuid"}).encode()
    rec = t.user("NO-TYPE-PROMPT")
    t.lines[-1] = json.dumps({k: v for k, v in rec.items() if k != "type"}).encode()
    t.assistant(text("two"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    assert [(line, kind) for line, kind, _d in c.problems()] == [
        (2, "unplaced_record"), (3, "unplaced_record"), (3, "broken_chain")]  # (its parent had no uuid)
    kept = [json.loads(raw)["message"]["content"] for (raw,) in c.store.db.execute(
        "SELECT raw FROM raw_lines WHERE reason = 'unplaced_record' ORDER BY line")]
    assert kept == ["NO-UUID-PROMPT", "NO-TYPE-PROMPT"]
    assert [m["text"] for m in c.messages()] == ["one", "two"]


@pytest.mark.parametrize("blank", ["", "   "])
def test_a_blank_uuid_names_no_record(tmp_path, capture, blank):
    """A uuid of "" (or spaces) is no uuid: records that share one are each kept as their
    line and named, never taken for copies of the first (which lost every later one)."""
    t = Transcript()
    t.user("one")
    t.assistant(text("two"))
    for words in ("BLANK-PROMPT-1", "BLANK-PROMPT-2"):
        rec = t.user(words)
        t.lines[-1] = json.dumps({**rec, "uuid": blank}).encode()
    c = capture(t.write(tmp_path / "t.jsonl"))
    kept = [json.loads(raw)["message"]["content"] for (raw,) in c.store.db.execute(
        "SELECT raw FROM raw_lines WHERE reason = 'unplaced_record' ORDER BY line")]
    assert kept == ["BLANK-PROMPT-1", "BLANK-PROMPT-2"]
    assert [m["text"] for m in c.messages()] == ["one", "two"]
    assert [kind for _line, kind, _d in c.problems()].count("unplaced_record") == 2


def test_blank_line_is_not_a_problem():
    t = Transcript()
    t.user("one")
    t.raw(b"")
    t.raw(b"   ")
    t.assistant(text("two"))
    assert parse_bytes(t.data()).problems == []


def test_broken_chain_is_a_problem(tmp_path, capture):
    t = Transcript()
    t.user("one")
    t.assistant(text("two"))
    t.parent = "a-parent-nobody-wrote"
    t.user("three")  # line 3
    c = capture(t.write(tmp_path / "t.jsonl"))
    [(line, kind, detail)] = c.problems()
    assert (line, kind) == (3, "broken_chain") and "a-parent-nobody-wrote" in detail
    assert c.store.summary()["degraded"].startswith("broken_chain at line 3")
    assert [m["text"] for m in c.messages()] == ["one", "two", "three"]


def test_tool_result_without_call_is_a_problem(tmp_path, capture):
    t = Transcript()
    t.user("one")
    t.assistant(tool_use("toolu_a", "ls"), stop="tool_use")
    t.tool_result(("toolu_a", "file"))
    t.tool_result(("toolu_never_called", "orphan"))  # line 4
    t.assistant(text("done"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    [(line, kind, detail)] = c.problems()
    assert (line, kind) == (4, "tool_result_without_call") and "toolu_never_called" in detail
    assert "tool_result_without_call at line 4" in c.store.summary()["degraded"]
    # the orphan is still kept
    assert [m["text"] for m in c.messages() if m["kind"] == "tool_result"] == ["file", "orphan"]


def test_clean_transcript_is_not_degraded(tmp_path, capture):
    t = Transcript()
    t.user("one")
    t.assistant(thinking("hm", "sig"), tool_use("toolu_a", "ls"), stop="tool_use")
    t.tool_result(("toolu_a", [{"type": "text", "text": "a\nb"}]))
    t.assistant(text("done"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    assert c.problems() == [] and c.store.summary()["degraded"] is None
    [result] = [e for e in c.export() if e["kind"] == "tool_result"]
    assert result["output"] == [{"type": "text", "text": "a\nb"}]


def test_usage_is_the_last_record_of_a_response():
    """Claude Code may write an early partial snapshot under the same message.id."""
    t = Transcript()
    t.user("go")
    t.assistant(thinking("hm", "s"), text("part"), text("whole"), usage=[
        {"input_tokens": 9, "output_tokens": 1},
        {"input_tokens": 9, "output_tokens": 50, "cache_read_input_tokens": 3},
        {"input_tokens": 9, "output_tokens": 90, "cache_read_input_tokens": 4,
         "cache_creation_input_tokens": 2}])
    out = parse_bytes(t.data())
    assert out.usage == {"msg_0001": ("sess-1", 4, 9, 2, 4, 90, "claude-opus-5-5",
                                      out.usage["msg_0001"][7])}
    # one response: every block carries the same response id
    assert {m[10] for m in out.messages if m[3] == "assistant"} == {"msg_0001"}


def test_usage_across_batches_keeps_the_last_record(tmp_path):
    t = Transcript()
    t.user("go")
    t.assistant(text("a"), text("b"), usage=[{"input_tokens": 1, "output_tokens": 1},
                                             {"input_tokens": 1, "output_tokens": 77}])
    path = tmp_path / "t.jsonl"
    home = cc_lhc.StateHome(tmp_path / "lhc")
    data = t.data()
    cut = data.index(t.lines[2])  # the second record of the response comes later
    path.write_bytes(data[:cut])
    cap = cc_lhc.Capture(home, "th", "s", str(path))
    cap.catch_up()
    path.write_bytes(data)
    cap.catch_up()
    assert cap.store.db.execute("SELECT seq, output FROM usage").fetchall() == [(3, 77)]
    cap.stop()


def test_model_is_frozen_per_message():
    """Each message keeps the model of the response that wrote it, whatever comes later."""
    t = Transcript()
    t.user("one")
    t.assistant(thinking("x", "s"), text("by opus"), model="claude-opus-5-5")
    t.user("two")
    t.assistant(text("by sonnet"), model="claude-sonnet-9")
    out = parse_bytes(t.data())
    models = [(m["kind"], m["model"]) for m in rows(out)]
    assert models == [("user_text", None), ("thinking", "claude-opus-5-5"),
                      ("assistant_text", "claude-opus-5-5"), ("user_text", None),
                      ("assistant_text", "claude-sonnet-9")]
    assert {rid: u[6] for rid, u in out.usage.items()} == {"msg_0001": "claude-opus-5-5",
                                                           "msg_0002": "claude-sonnet-9"}


def test_api_error_message_closes_the_turn():
    t = Transcript()
    t.user("too much")
    t.record({"type": "assistant", "isApiErrorMessage": True, "message": {
        "id": "err1", "role": "assistant", "model": "<synthetic>", "stop_reason": "stop_sequence",
        "content": [text("Prompt is too long")]}})
    out = parse_bytes(t.data())
    assert [m.kind for m in out.messages] == ["user_text", "api_error"]
    assert [c.status for c in out.turns_closed] == ["closed"]


def test_parse_rows_are_read_by_name():
    """Every row a parsed batch carries names its fields (still a tuple in the store's
    column order, so the store inserts it as it is)."""
    t = Transcript()
    t.user("hello")
    t.assistant(text("hi"))
    t.record({"type": "user", "parentUuid": "never-seen", "message": {"role": "user", "content": "x"}})
    bookkeeping = b'{"type":"mode","mode":"plan"}'
    out = parse_bytes(t.data() + b"{not json\n" + bookkeeping + b"\n")
    message = out.messages[0]
    assert (message.kind, message.text, message.turn) == ("user_text", "hello", 1)
    assert tuple(message) == tuple(getattr(message, c) for c in cc_lhc.MESSAGE_COLUMNS)
    assert [(o.n, o.kind) for o in out.turns_opened][0] == (1, "prompt")
    assert out.turns_closed[0].status == "closed" and out.segments[0].reason == "terminal"
    assert [c.session for c in out.chain] == ["sess-1"] * 3
    assert {p.kind for p in out.problems} == {"broken_chain", "malformed_line"}
    assert [(r.reason, r.raw) for r in out.raw_lines] == [("malformed_line", b"{not json")]
    usage = next(iter(out.usage.values()))
    assert (usage.session, usage.output) == ("sess-1", 7)
    assert (out.telemetry["mode"].count, out.telemetry["mode"].bytes) == (1, len(bookkeeping))


def test_sidechain_records_are_kept_as_agent_messages():
    """A subagent's records in the main file (1.0.x) are stored, tagged with their agent,
    outside the main turns; they used to be only counted."""
    t = Transcript()
    t.user("main")
    t.record({"type": "user", "isSidechain": True, "message": {"role": "user", "content": "sub"}})
    t.assistant(text("main reply"))
    out = parse_bytes(t.data())
    assert [(m.text, m.agent is not None) for m in out.messages] == [
        ("main", False), ("sub", True), ("main reply", False)]
    assert [m.segment for m in out.messages if m.agent] == [-1]   # in no segment
    assert [a.kind for a in out.agents] == ["sidechain"] and out.problems == []
    assert "sidechain" not in out.telemetry


def test_a_record_written_twice_is_kept_once(tmp_path, capture):
    """Claude Code re-writes records with the same uuid (a reopened or resumed session
    replays them); capture must neither duplicate them nor stall on them."""
    t = Transcript()
    t.user("one")
    t.assistant(text("two"), tool_use("toolu_a", "ls"), stop="tool_use")
    t.tool_result(("toolu_a", "out"))
    t.assistant(text("three"))
    t.lines += t.lines[:]  # the whole history replayed verbatim
    t.user("four")
    path = t.write(tmp_path / "t.jsonl")
    c = capture(path)
    assert [m["text"] for m in c.messages() if m["kind"] != "tool_call"] == [
        "one", "two", "out", "three", "four"]
    assert c.store.source("sess-1")["offset"] == path.stat().st_size
    assert c.problems() == []


@pytest.mark.parametrize("line", [
    b'{"type":"user","uuid":"w1","message":"not an object"}',
    b'{"type":"user","uuid":"w1","message":{"content":[{"type":"text","text":5}]}}',
    b'{"type":"user","uuid":"w1","message":{"content":[{"type":"text","text":["a"]}]}}',
    b'{"type":"assistant","uuid":"w1","message":{"id":"m","content":[{"type":"tool_use","id":["x"]}]}}',
    b'{"type":"user","uuid":"w1","message":{"content":[{"type":"tool_result","tool_use_id":{"x":1}}]}}',
    b'{"type":"assistant","uuid":"w1","message":{"id":{"x":1},"content":[{"type":"text","text":"t"}]}}',
    b'{"type":"assistant","uuid":"w1","message":{"id":"m","model":["m"],"content":"t"}}',
    b'{"type":"attachment","uuid":"w1","attachment":"not an object"}',
    b'{"type":"user","uuid":["w1"],"message":{"content":"hi"}}',
    b'{"type":"user","uuid":"w1","parentUuid":{"p":1},"message":{"content":"hi"}}',
    b'{"type":"user","uuid":"w1","timestamp":{"t":1},"message":{"content":"hi"}}',
    b'[1, 2, 3]',
    b'"a string"',
])
def test_a_record_in_a_shape_claude_never_writes_degrades_but_never_stalls(tmp_path, capture, line):
    """Valid JSON in a foreign shape (a flipped byte can do it) is a malformed line:
    capture reports it with its line number and goes on to the end of the file."""
    t = Transcript()
    t.user("before")
    t.raw(line)
    t.assistant(text("after"))
    path = t.write(tmp_path / "t.jsonl")
    c = capture(path)
    assert c.store.source("sess-1")["offset"] == path.stat().st_size
    texts = [m["text"] for m in c.messages()]
    assert texts[0] == "before" and texts[-1] == "after"
    problems = c.problems()
    assert problems and problems[0][:2] == (2, "malformed_line")
    assert c.store.summary()["degraded"].startswith("malformed_line at line 2")


def test_a_record_nested_deeper_than_python_reads_never_stalls_capture(tmp_path, capture):
    """JSON sets no depth limit (a tool input can nest deep); Python's reader has one."""
    t = Transcript()
    t.user("before")
    head = t.record({"type": "assistant", "message": {"id": "msg_deep", "role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_deep", "name": "Bash", "input": "DEEP"}]}})
    t.lines[-1] = t.lines[-1].replace(b'"DEEP"', b'{"x":' * 5000 + b"{}" + b"}" * 5000)  # line 2
    assert head["uuid"].encode() in t.lines[-1]
    t.user("after")
    path = t.write(tmp_path / "t.jsonl")
    c = capture(path)
    assert c.store.source("sess-1")["offset"] == path.stat().st_size
    assert [m["text"] for m in c.messages()] == ["before", "after"]
    assert c.problems()[0][:2] == (2, "malformed_line")


# -- segments --------------------------------------------------------------------------------

def long_turn(t: Transcript, calls: int, out_size: int, tag: str = "") -> None:
    """One prompt, then `calls` tool round trips with outputs of out_size, then an answer."""
    t.user(f"long task {tag}")
    for i in range(calls):
        t.assistant(text(f"step {i}"), tool_use(f"toolu_{tag}{i}", f"cat f{i}"), stop="tool_use")
        t.tool_result((f"toolu_{tag}{i}", f"{i}:" + "é" * out_size))
    t.assistant(text(f"finished {tag}"))


def test_long_turn_is_closed_into_segments_at_safe_places():
    t = Transcript()
    long_turn(t, calls=12, out_size=300)
    out = parse_bytes(t.data(), soft=1000)
    msgs = [dict(zip(cc_lhc.MESSAGE_COLUMNS, m)) for m in out.messages]
    segs = out.segments
    assert len(segs) > 2
    # every segment but the last ends on a tool result with no call outstanding,
    # once it has passed the soft size; the last ends on the terminal line
    by_seq = {m["seq"]: m for m in msgs}
    for turn, idx, first, last, reason, _tokens in segs[:-1]:
        assert reason == "soft_size" and by_seq[last]["kind"] == "tool_result"
        # a tool call counts its input and its block as sent back to the API
        size = sum(len(by_seq[s]["text"] or "")
                   + (len(by_seq[s]["data"]) if by_seq[s]["kind"] == "tool_call" else 0)
                   for s in range(first, last + 1))
        assert size >= 1000
    assert segs[-1][4] == "terminal" and segs[-1][3] == msgs[-1]["seq"]
    # segments partition the turn, in order, and each message carries its segment index
    assert segs[0][2] == 1
    for a, b in zip(segs, segs[1:]):
        assert b[2] == a[3] + 1 and b[1] == a[1] + 1
    for turn, idx, first, last, *_ in segs:
        assert {by_seq[s]["segment"] for s in range(first, last + 1)} == {idx}


def test_no_segment_closes_while_a_call_is_outstanding():
    t = Transcript()
    t.user("parallel")
    t.assistant(tool_use("toolu_a", "a"), tool_use("toolu_b", "b"), stop="tool_use")
    t.tool_result(("toolu_a", "x" * 5000))  # past the soft size, but toolu_b is still out
    t.tool_result(("toolu_b", "y"))         # the first safe place
    t.assistant(text("done"))
    out = parse_bytes(t.data(), soft=1000)
    assert [(s[2], s[3], s[4]) for s in out.segments] == [(1, 5, "soft_size"), (6, 6, "terminal")]


def test_short_turns_are_one_terminal_segment_each():
    t = Transcript()
    for i in range(3):
        t.user(f"q{i}")
        t.assistant(text(f"a{i}"))
    out = parse_bytes(t.data(), soft=1000)
    assert [(s[0], s[1], s[4]) for s in out.segments] == [(1, 0, "terminal"), (2, 0, "terminal"),
                                                          (3, 0, "terminal")]


def stored_segments(store) -> list[tuple]:
    return store.db.execute("SELECT turn, idx, first_seq, last_seq, reason FROM segments "
                            "ORDER BY turn, idx").fetchall()


def stored_rows(store) -> list[tuple]:
    return store.db.execute("SELECT * FROM messages ORDER BY seq").fetchall()


def test_segmenting_is_the_same_whatever_line_capture_restarts_at(tmp_path):
    """Killed and restarted between any two lines, capture cuts the same segments."""
    t = Transcript()
    long_turn(t, calls=10, out_size=150, tag="a")
    long_turn(t, calls=10, out_size=150, tag="b")
    data = t.data()
    policy = {"lowerBoundTokens": 1000, "profile": "default"}  # soft size 1100 bytes
    one = Captured(tmp_path / "one", t.write(tmp_path / "one.jsonl"), policy=policy)
    want_rows, want_segs = stored_rows(one.store), stored_segments(one.store)
    one.close()
    assert len(want_segs) > 4
    path = tmp_path / "restarted.jsonl"
    home = cc_lhc.StateHome(tmp_path / "restarted")
    ends = [i + 1 for i, b in enumerate(data) if b == 0x0A]
    for end in ends:  # a fresh Capture (a new process) for every line
        path.write_bytes(data[:end])
        cap = cc_lhc.Capture(home, "th", "sess-1", str(path), policy)
        cap.catch_up()
        cap.stop()
    store = cc_lhc.ThreadStore(home, "th")
    assert stored_segments(store) == want_segs
    assert stored_rows(store) == want_rows
    store.close()


def test_restart_after_a_prompt_with_no_content(tmp_path):
    """A prompt record with an empty content list opens a turn holding no message yet."""
    t = Transcript()
    t.record({"type": "user", "message": {"role": "user", "content": []}})
    first = t.data()
    t.assistant(text("answer"))
    whole = t.data()
    one = Captured(tmp_path / "one", t.write(tmp_path / "one.jsonl"))
    want = stored_rows(one.store), stored_segments(one.store)
    one.close()
    path = tmp_path / "t.jsonl"
    home = cc_lhc.StateHome(tmp_path / "lhc")
    for data in (first, whole):
        path.write_bytes(data)
        cap = cc_lhc.Capture(home, "th", "sess-1", str(path))
        cap.catch_up()
        got = stored_rows(cap.store), stored_segments(cap.store)
        cap.stop()
    assert got == want and len(want[0]) == 1


def test_recorded_turns_are_not_resegmented_after_a_restart(tmp_path):
    """A later run (even with another policy) never re-cuts what is already recorded."""
    t = Transcript()
    long_turn(t, calls=8, out_size=200, tag="a")
    first_turn = t.data()
    long_turn(t, calls=3, out_size=10, tag="b")
    path = tmp_path / "t.jsonl"
    home = cc_lhc.StateHome(tmp_path / "lhc")
    path.write_bytes(first_turn)
    cap = cc_lhc.Capture(home, "th", "sess-1", str(path), {"lowerBoundTokens": 1000, "profile": "default"})
    cap.catch_up()
    before = stored_segments(cap.store)
    cap.stop()
    assert len(before) > 2
    path.write_bytes(t.data())
    cap = cc_lhc.Capture(home, "th", "sess-1", str(path), {"lowerBoundTokens": 10, "profile": "default"})
    cap.catch_up()
    after = stored_segments(cap.store)
    cap.stop()
    assert after[:len(before)] == before
    assert all(s[0] == 2 for s in after[len(before):])


def test_an_open_turn_keeps_segmenting_from_where_it_was_after_a_restart(tmp_path):
    """Stopped in the middle of a long turn, the next run continues its segment count."""
    t = Transcript()
    long_turn(t, calls=10, out_size=200)
    data = t.data()
    mid = data.index(t.lines[12])
    path = tmp_path / "t.jsonl"
    home = cc_lhc.StateHome(tmp_path / "lhc")
    policy = {"lowerBoundTokens": 1000, "profile": "default"}
    path.write_bytes(data[:mid])
    cap = cc_lhc.Capture(home, "th", "sess-1", str(path), policy)
    cap.catch_up()
    assert cap.store.db.execute("SELECT status FROM turns").fetchall() == [("open",)]
    cap.stop()
    path.write_bytes(data)
    cap = cc_lhc.Capture(home, "th", "sess-1", str(path), policy)
    cap.catch_up()
    segs = stored_segments(cap.store)
    cap.stop()
    assert [s[1] for s in segs] == list(range(len(segs)))
    assert segs[-1][4] == "terminal" and all(s[4] == "soft_size" for s in segs[:-1])


# -- a final response written as several records ----------------------------------------------

def test_final_response_split_into_records_stays_one_turn(tmp_path, capture):
    # Claude Code copies the final stop_reason onto every record of the response, so the
    # thinking record already says end_turn; its text record must still join the same turn.
    t = Transcript()
    t.user("explain")
    t.assistant(thinking("let me think", "c2ln"), text("the answer"), stop="end_turn")
    t.user("next")
    t.assistant(text("second answer"), stop="end_turn")
    c = capture(t.write(tmp_path / "t.jsonl"))
    assert [(n, kind, status, first, last) for n, kind, status, first, last, _ in c.turns()] == [
        (1, "prompt", "closed", 1, 3), (2, "prompt", "closed", 4, 5)]
    assert c.segments() == [(1, 0, 1, 3, "terminal"), (2, 0, 4, 5, "terminal")]


def test_final_response_rejoins_its_turn_across_a_restart(tmp_path):
    # Capture killed between the two records of one response: the next run must place the
    # text in the same turn as a one-shot read does.
    t = Transcript()
    t.user("explain")
    t.assistant(thinking("let me think", "c2ln"), text("the answer"), stop="end_turn")
    full = t.data()
    cut = full.index(b"\n", full.index(b'"thinking"')) + 1
    path = tmp_path / "t.jsonl"
    path.write_bytes(full[:cut])
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    first = cc_lhc.Capture(home, "thread-1", "sess-1", str(path))
    first.catch_up()
    first.stop()
    path.write_bytes(full)
    again = cc_lhc.Capture(home, "thread-1", "sess-1", str(path))
    again.catch_up()
    turns = again.store.db.execute("SELECT n, status, last_seq FROM turns").fetchall()
    segments = again.store.db.execute("SELECT turn, idx, first_seq, last_seq FROM segments").fetchall()
    again.stop()
    assert turns == [(1, "closed", 3)]
    assert segments == [(1, 0, 1, 3)]


def test_half_a_surrogate_pair_is_repaired_not_a_stalled_capture(tmp_path, capture):
    # A string cut in the middle of an emoji is valid JSON but not storable text.
    t = Transcript()
    t.raw(json.dumps({"type": "user", "uuid": "lone-1", "parentUuid": None,
                      "timestamp": "2026-11-30T10:00:00.000Z",
                      "message": {"role": "user", "content": "cut \ud83d here, whole \U0001F600"}},
                     ensure_ascii=True).encode())
    t.parent = "lone-1"
    t.assistant(text("still captured after it"))
    c = capture(t.write(tmp_path / "t.jsonl"))
    texts = [m["text"] for m in c.messages()]
    assert texts == ["cut \ufffd here, whole \U0001F600", "still captured after it"]
    assert c.telemetry().get("text_repaired") == 1


def test_bytes_that_are_not_utf8_read_as_claude_reads_them_and_the_line_is_kept(tmp_path, capture):
    """A line holding bytes that are not UTF-8 (a file an editor wrote in Latin-1, pasted
    back) is read by Claude Code with each such byte as U+FFFD, and the message goes on to
    the model. It does here too (so its call keeps its result in every view), and the line's
    own bytes are kept as written."""
    t = Transcript()
    t.user("show me the file")
    t.assistant({"type": "tool_use", "id": "toolu_l1", "name": "Bash", "input": {"command": "cat l1.txt"}},
                stop="tool_use")
    t.tool_result(("toolu_l1", "caf@@ LATIN-NEEDLE"))
    t.assistant(text("It says cafe."))
    data = t.data().replace(b"caf@@", b"caf\xe9\xff")
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    c = capture(path)
    kinds = [(m["kind"], m["text"]) for m in c.messages()]
    assert kinds[2] == ("tool_result", "caf\ufffd\ufffd LATIN-NEEDLE")
    [(line, kind, _detail)] = c.problems()  # (the thread is marked degraded: the file was damaged)
    assert (line, kind) == (3, "invalid_utf8") and c.telemetry().get("text_repaired") == 1
    [(reason, raw)] = c.store.db.execute("SELECT reason, raw FROM raw_lines").fetchall()
    assert reason == "text_repaired" and b"caf\xe9\xff LATIN-NEEDLE" in bytes(raw)
    shown = [m["kind"] for turn in cc_lhc.load_turns(c.store) for m in turn.messages]
    assert shown == ["user_text", "tool_call", "tool_result", "assistant_text"]


# Lines json.loads reads in its own ways: a BOM, UTF-16, surrogates escaped and as bytes,
# invalid UTF-8, trailing whitespace or data, NaN, control characters, not an object.
ODD_LINES = [b'{"a":1}', b'{"a":1} \t\r', b'{"a":1} x', b'{"a":', b'{', b'{}', b'[1]', b' {"a":1}',
             b'\xef\xbb\xbf{"a":1}', '{"a":1}'.encode("utf-16-le"), '{"a":1}'.encode("utf-16"),
             b'{"a":"\xed\xa0\x80"}', b'{"\\ud800":1}', b'{"a":"\xff"}', b'{"a":NaN}', b'{"a":-Infinity}',
             b'{"a":"\x01"}', b'{"a":1e400}', b'{"a":{"a":{"a":[]}}}', b'{"k":1,"k":2}', b'{\x00}', b'"x"']


@pytest.mark.parametrize("path", sorted(SAMPLES.glob("*.jsonl")) + sorted(
    (Path(__file__).resolve().parent / "fixtures" / "versions").rglob("*.jsonl")), ids=lambda p: p.name)
def test_transcript_lines_read_exactly_as_json_loads_reads_them(path):
    # The parser's fast path for a line must give json.loads's value or json.loads's error.
    def read(fn, line):
        try:
            return "ok", fn(line)
        except (ValueError, RecursionError) as e:
            return type(e).__name__, str(e)

    def mine(line):
        try:
            return read(cc_lhc.transcript_json, line)
        except cc_lhc.NotFiniteNumber:  # (feed keeps such a line's bytes and stores null)
            return "not finite", None

    def theirs(line):
        got = read(json.loads, line)
        return ("not finite", None) if got[0] == "ok" and json.dumps(got[1]) != json.dumps(
            cc_lhc.finite_or_null(got[1])) else got

    lines = path.read_bytes().splitlines() + ODD_LINES + [b'{"a":-1e400}', b'{"a":NaN}', b'{"a":[Infinity]}']
    for line in lines:
        assert repr(mine(line)) == repr(theirs(line)), line[:80]


# -- local commands: what 2.1.328 writes for a /compact it runs itself ------------------------

CAVEAT = ("<local-command-caveat>The command below was run directly in Claude Code, not sent to "
          "you as a request, and its output goes straight to the user. It's recorded here as "
          "context for later messages.</local-command-caveat>")
COMPACT_NAME = ("<command-name>/compact</command-name>\n            <command-message>compact"
                "</command-message>\n            <command-args></command-args>")


def answered(t: Transcript, prompt: str, answer: str) -> None:
    t.user(prompt)
    t.assistant(text(answer))
    t.record({"type": "system", "subtype": "turn_duration", "durationMs": 12})


def local_compact(t: Transcript, output: str | None) -> None:
    """The caveat and the command as user records, then the output: a system record
    (declined), a user record (compacted), or None (not written yet)."""
    t.user(CAVEAT, isMeta=True)
    t.user(COMPACT_NAME)
    if output == "system":
        t.record({"type": "system", "subtype": "local_command", "level": "info",
                  "content": "<local-command-stdout>Not compacted \u00b7 cc-lhc: declined</local-command-stdout>",
                  "commandRun": {"command": "compact", "args": ""}})
    elif output == "user":
        t.user("<local-command-stdout>\x1b[2mCompacted (ctrl+o to see full summary)\x1b[22m"
               "</local-command-stdout>")


def context_command(t: Transcript) -> None:
    """/context as 2.1.328 writes it: two system records, then its output for the model."""
    t.record({"type": "system", "subtype": "local_command", "level": "info",
              "content": "<command-name>/context</command-name>\n<command-message>context</command-message>"})
    t.record({"type": "system", "subtype": "local_command", "level": "info", "commandRun": {"command": "context"},
              "content": "<local-command-stdout> \x1b[1mContext usage\x1b[22m</local-command-stdout>"})
    t.user("## Context Usage\n\n**Tokens:** 10.9k / 1m (1%)", isMeta=True)


def turn_shapes(store) -> list[tuple]:
    return store.db.execute("SELECT n, kind, status, stop_reason FROM turns ORDER BY n").fetchall()


@pytest.mark.parametrize("output", ["system", "user"], ids=["declined", "compacted"])
def test_a_local_command_is_a_turn_of_its_own_settled_once_its_output_is_written(tmp_path, capture, output):
    t = Transcript()
    answered(t, "first prompt", "first answer")
    local_compact(t, None)
    running = capture(t.write(tmp_path / "running.jsonl"))
    assert turn_shapes(running.store)[-1] == (2, "command", "open", None)
    assert "t2 is still open" in cc_lhc.unsettled_reason(running.store)  # the command still runs
    t = Transcript()
    answered(t, "first prompt", "first answer")
    local_compact(t, output)
    done = capture(t.write(tmp_path / "done.jsonl"))
    assert turn_shapes(done.store) == [(1, "prompt", "closed", "end_turn"),
                                       (2, "command", "closed", "local_command")]
    assert cc_lhc.unsettled_reason(done.store) == ""  # Claude is at its prompt: a settled seam
    kinds = [(m["turn"], m["kind"]) for m in done.messages()]
    assert kinds[2:4] == [(2, "user_meta"), (2, "user_text")]  # nothing of it is dropped
    answered(t, "next prompt", "next answer")
    later = capture(t.write(tmp_path / "later.jsonl"))
    assert turn_shapes(later.store)[1:] == [(2, "command", "closed", "local_command"),
                                            (3, "prompt", "closed", "end_turn")]


def test_a_slash_command_that_is_a_prompt_ends_its_turn_when_the_model_has_answered(tmp_path, capture):
    """A skill or custom command writes its name, then the prompt it stands for (isMeta),
    and the model answers it: no output record, so its turn ends as a model turn does."""
    t = Transcript()
    answered(t, "first prompt", "first answer")
    t.user("<command-name>/review</command-name>\n<command-message>review</command-message>")
    t.user("Review the change on this branch.", isMeta=True)
    running = capture(t.write(tmp_path / "running.jsonl"))
    assert "t2 is still open" in cc_lhc.unsettled_reason(running.store)
    t.assistant(text("reviewed"))
    t.record({"type": "system", "subtype": "turn_duration", "durationMs": 12})
    done = capture(t.write(tmp_path / "done.jsonl"))
    assert turn_shapes(done.store)[-1] == (2, "command", "closed", "end_turn")
    assert [m["turn"] for m in done.messages()][2:] == [2, 2, 2]


def test_a_local_command_is_recorded_the_same_whatever_line_capture_restarts_at(tmp_path):
    t = Transcript()
    answered(t, "first prompt", "first answer")
    local_compact(t, "system")
    local_compact(t, "user")
    context_command(t)
    t.user(COMPACT_NAME)  # a command written with no caveat before it
    t.user("<local-command-stdout>done</local-command-stdout>")
    t.user("<command-name>/review</command-name>")  # a prompt, and a command while it is answered
    t.assistant(text("looking"), stop=None)
    t.record({"type": "system", "subtype": "local_command", "content": "<local-command-stdout>4%</local-command-stdout>"})
    t.assistant(text("reviewed"))
    answered(t, "next prompt", "next answer")
    data = t.data()
    one = Captured(tmp_path / "one", t.write(tmp_path / "one.jsonl"))
    want = stored_rows(one.store), turn_shapes(one.store)
    one.close()
    assert [kind for _, kind, _, _ in want[1]] == ["prompt"] + ["command"] * 5 + ["prompt"]
    assert want[1][5][2:] == ("closed", "end_turn")
    path = tmp_path / "restarted.jsonl"
    home = cc_lhc.StateHome(tmp_path / "restarted")
    for end in [i + 1 for i, b in enumerate(data) if b == 0x0A]:  # a new process for every line
        path.write_bytes(data[:end])
        cap = cc_lhc.Capture(home, "th", "sess-1", str(path))
        cap.catch_up()
        cap.stop()
    store = cc_lhc.ThreadStore(home, "th")
    assert (stored_rows(store), turn_shapes(store)) == want
    store.close()


def test_a_local_command_run_while_the_model_answers_a_slash_command_ends_nothing(tmp_path, capture):
    t = Transcript()
    answered(t, "first prompt", "first answer")
    t.user("<command-name>/review</command-name>\n<command-message>review</command-message>")
    t.user("Review the change on this branch.", isMeta=True)
    t.assistant(tool_use("toolu_r1", "git diff"), stop="tool_use")
    t.tool_result(("toolu_r1", "diff --git a/x b/x"))
    t.assistant(text("looking further"), stop=None)
    t.record({"type": "system", "subtype": "local_command", "level": "info",
              "content": "<local-command-stdout>Context usage: 4%</local-command-stdout>"})
    c = capture(t.write(tmp_path / "t.jsonl"))
    assert turn_shapes(c.store)[-1] == (2, "command", "open", None)  # still the model's turn


def test_context_written_out_for_the_model_leaves_the_seam_settled(tmp_path, capture):
    t = Transcript()
    answered(t, "first prompt", "first answer")
    context_command(t)
    c = capture(t.write(tmp_path / "t.jsonl"))
    assert turn_shapes(c.store)[1:] == [(2, "command", "closed", "local_command")]
    assert cc_lhc.unsettled_reason(c.store) == ""
    # an isMeta record that follows anything else still opens a turn the model answers
    t.user("<task-notification>job b1 finished</task-notification>", isMeta=True)
    c = capture(t.write(tmp_path / "t2.jsonl"))
    assert turn_shapes(c.store)[-1] == (3, "continuation", "open", None)


def test_a_turn_left_open_by_a_claude_a_swap_ended_is_interrupted_and_the_seam_settles(tmp_path):
    """A notification reached the old Claude between the seam and the switch: its turn was
    opened, never answered, and that Claude is gone. Once the swap has read its last lines
    the turn is interrupted (as a new prompt would have cut it), not open under every seam."""
    t = Transcript("old-session")
    answered(t, "watch the counter", "monitoring")
    t.user("<task-notification>\n<task-id>b7</task-id>\n<summary>Monitor event</summary>\n"
           "</task-notification>", origin={"kind": "task-notification"})
    c = Captured(tmp_path / "c", t.write(tmp_path / "old.jsonl"), session="old-session")
    assert "t2 is still open" in cc_lhc.unsettled_reason(c.store)
    assert c.store.interrupt_open_turn("another-session", "swapped") is None  # not its turn
    assert c.store.interrupt_open_turn("old-session", "swapped") == 2
    assert turn_shapes(c.store)[-1] == (2, "task-notification", "interrupted", "swapped")
    assert stored_segments(c.store)[-1][-1] == "interrupted"
    assert cc_lhc.unsettled_reason(c.store) == ""
    assert c.store.interrupt_open_turn("old-session", "swapped") is None  # once
    c.close()
    # the replacement's own records go on in new turns
    n = Transcript("new-session")
    answered(n, "carry on", "carried on")
    cap = cc_lhc.Capture(c.home, "thread-1", "new-session", str(n.write(tmp_path / "new.jsonl")))
    cap.catch_up()
    assert turn_shapes(cap.store)[1:] == [(2, "task-notification", "interrupted", "swapped"),
                                          (3, "prompt", "closed", "end_turn")]
    cap.stop()


def test_a_message_sent_mid_turn_is_a_user_message_of_that_turn():
    """Claude Code writes a message typed while it works only as a queued_command
    attachment: a user message of the running turn, or of a new one when none is open; a
    prompt of several blocks keeps them; other attachments stay telemetry."""
    t = Transcript()
    t.user("run it")
    t.assistant(tool_use("toolu_1", "make"), stop="tool_use")
    t.tool_result(("toolu_1", "built"))
    queued = {"type": "queued_command", "prompt": "QUEUED also the date", "commandMode": "prompt"}
    t.record({"type": "attachment", "attachment": queued})
    t.record({"type": "attachment", "attachment": {"type": "date", "date": "2026-12-01"}})
    t.assistant(text("did both"))
    blocks = [{"type": "text", "text": "after the turn"}, {"type": "image", "source": {"data": "AA=="}}]
    t.record({"type": "attachment", "attachment": {"type": "queued_command", "prompt": blocks}})
    t.assistant(text("seen"))
    t.record({"type": "attachment", "attachment": {"type": "queued_command", "prompt": None}})
    out = parse_bytes(t.data())
    got = [(m.turn, m.role, m.kind, m.text) for m in out.messages if m.role == "user"]
    assert got == [(1, "user", "user_text", "run it"), (1, "user", "tool_result", "built"),
                   (1, "user", "user_text", "QUEUED also the date"),
                   (2, "user", "user_text", "after the turn\n[image]")]
    assert json.loads(out.messages[-2].data)["prompt"] == blocks
    assert [(o.n, o.kind) for o in out.turns_opened] == [(1, "prompt"), (2, "prompt")]
    assert [c.status for c in out.turns_closed] == ["closed", "closed"]
    assert "attachment/queued_command" in out.telemetry  # the one without a prompt
    assert out.telemetry["attachment/queued_command"].count == 1 and "attachment/date" in out.telemetry


def _queue_op(t: Transcript, operation: str, content: str | None = None, **extra) -> None:
    t.bookkeeping("queue-operation", operation=operation, timestamp="2026-11-30T10:00:00.000Z",
                  **({"content": content} if content is not None else {}), **extra)


def test_a_message_claude_took_from_its_queue_mid_turn_is_a_user_message_there_in_2_1_39():
    """Claude Code 2.1.39 writes a message typed while it works only as queue-operation
    records: an enqueue with its words, then a remove naming none when the model gets it
    inside the running turn. The words are a user message of that turn, just before the
    response that read them. A background task's notification (enqueued, never dequeued,
    sent as a record of its own) is not taken for it, nor is a slash command."""
    t = Transcript()
    t.user("run the tests")
    t.assistant(tool_use("toolu_1", "make test"), stop=None)
    _queue_op(t, "enqueue", "<task-notification>\n<task-id>b1</task-id>\n</task-notification>")
    t.tool_result(("toolu_1", "running"))
    _queue_op(t, "enqueue", "check again")
    _queue_op(t, "enqueue", "/mcp")
    t.assistant(tool_use("toolu_2", "tail log"), stop=None)
    _queue_op(t, "remove")                                    # "check again"
    _queue_op(t, "remove")                                    # "/mcp": Claude ran the command
    t.tool_result(("toolu_2", "3 failed"))
    t.assistant(text("Three failed; checking again as you asked."), stop=None)
    t.user("<task-notification>\n<task-id>b1</task-id>\n</task-notification>")
    t.assistant(text("The task is done."), stop=None)
    out = parse_bytes(t.data())
    got = [(m.turn, m.kind, m.text) for m in out.messages]
    assert got == [(1, "user_text", "run the tests"), (1, "tool_call", '{"command":"make test"}'),
                   (1, "tool_result", "running"), (1, "tool_call", '{"command":"tail log"}'),
                   (1, "tool_result", "3 failed"), (1, "user_text", "check again"),
                   (1, "assistant_text", "Three failed; checking again as you asked."),
                   (2, "user_text", "<task-notification>\n<task-id>b1</task-id>\n</task-notification>"),
                   (2, "assistant_text", "The task is done.")]
    words = next(m for m in out.messages if m.text == "check again")
    assert json.loads(words.data) == {"type": "queue-operation", "sessionId": "sess-1", "operation": "enqueue",
                                      "timestamp": "2026-11-30T10:00:00.000Z", "content": "check again"}
    assert out.telemetry["queue-operation"].count == 5


def test_a_queued_message_a_newer_claude_also_writes_as_an_attachment_is_one_message():
    """Newer versions name the words on the remove and write them again as a
    queued_command attachment after the tool's result: one user message, the
    attachment's; a message taken back into the input box (popAll) or sent as a prompt
    of its own (dequeue) is none."""
    t = Transcript()
    t.user("build it")
    t.assistant(tool_use("toolu_1", "make"), stop="tool_use")
    _queue_op(t, "enqueue", "also the docs")
    _queue_op(t, "enqueue", "never mind")
    _queue_op(t, "popAll")
    _queue_op(t, "enqueue", "QUEUED the docs too")
    _queue_op(t, "remove", "QUEUED the docs too", reason="absorbed_mid_turn")
    t.tool_result(("toolu_1", "built"))
    t.record({"type": "attachment", "attachment": {"type": "queued_command", "prompt": "QUEUED the docs too",
                                                   "commandMode": "prompt"}})
    t.assistant(text("Built, and the docs."))
    _queue_op(t, "enqueue", "next thing")
    _queue_op(t, "dequeue")
    t.user("next thing")
    t.assistant(text("Done."))
    out = parse_bytes(t.data())
    got = [(m.turn, m.kind, m.text) for m in out.messages if m.role == "user"]
    assert got == [(1, "user_text", "build it"), (1, "tool_result", "built"),
                   (1, "user_text", "QUEUED the docs too"), (2, "user_text", "next thing")]
    assert json.loads(got and out.messages[3].data)["type"] == "queued_command"


def test_a_queued_message_cleared_rewound_or_dropped_is_no_message():
    """Esc clears the queue back into the input box (remove, cleared_on_cancel): the words
    were never sent, so they are no message; only the edited text sent after is."""
    t = Transcript()
    t.user("run the tests")
    t.assistant(tool_use("toolu_1", "make test"), stop="tool_use")
    _queue_op(t, "enqueue", "DRAFT: also run lint")
    _queue_op(t, "remove", "DRAFT: also run lint", reason="cleared_on_cancel")
    _queue_op(t, "enqueue", "<task-notification>\n<task-id>b9</task-id>\n</task-notification>")
    _queue_op(t, "remove", "<task-notification>\n<task-id>b9</task-id>\n</task-notification>", reason="rewound")
    _queue_op(t, "enqueue", "HOOKED: format it")
    _queue_op(t, "remove", reason="dropped_by_hook")
    t.tool_result(("toolu_1", "[Request interrupted by user for tool use]", True))
    t.user("[Request interrupted by user for tool use]")
    t.user("DRAFT: also run lint, and the tests again")
    t.assistant(text("ok"))
    out = parse_bytes(t.data())
    texts = [m.text for m in out.messages if m.kind == "user_text"]
    assert texts == ["run the tests", "[Request interrupted by user for tool use]",
                     "DRAFT: also run lint, and the tests again"]
    assert [(o.n, o.kind) for o in out.turns_opened] == [(1, "prompt"), (2, "prompt")]


def test_a_remove_of_words_never_queued_as_text_takes_no_other_message():
    """An enqueue of an image message (its content no text) still holds its place: the
    remove naming it, or a remove naming words not queued, takes nothing else mid-turn."""
    blocks = [{"type": "text", "text": "look at this"}, {"type": "image", "source": {"data": "AAAA"}}]
    for content in (blocks, None, "never queued"):
        t = Transcript()
        t.user("build it")
        t.assistant(tool_use("toolu_1", "make"), stop="tool_use")
        _queue_op(t, "enqueue", blocks if content != "never queued" else "LATER: then deploy")
        if content != "never queued":
            _queue_op(t, "enqueue", "LATER: then deploy")
        _queue_op(t, "remove", content, reason="absorbed_mid_turn")
        t.tool_result(("toolu_1", "built"))
        t.assistant(text("Built."))
        _queue_op(t, "dequeue")
        t.user("LATER: then deploy")
        t.assistant(text("Deploying."))
        out = parse_bytes(t.data())
        assert [m.text for m in out.messages].count("LATER: then deploy") == 1, content


def test_words_taken_in_before_an_interrupt_belong_to_the_stopped_turn():
    t = Transcript()
    t.user("run the tests")
    t.assistant(tool_use("toolu_1", "make test"), stop=None)
    _queue_op(t, "enqueue", "also check lint")
    _queue_op(t, "remove")
    t.tool_result(("toolu_1", "[Request interrupted by user for tool use]", True))
    t.user("[Request interrupted by user]")
    t.user("new question")
    t.assistant(text("answer"), stop=None)
    out = parse_bytes(t.data())
    assert [(m.turn, m.text) for m in out.messages if m.kind == "user_text"] == [
        (1, "run the tests"), (1, "also check lint"), (1, "[Request interrupted by user]"), (2, "new question")]
    assert [(o.n, o.kind) for o in out.turns_opened] == [(1, "prompt"), (2, "prompt")]


def test_the_same_words_queued_twice_are_two_messages():
    """A prompt sent as its own record takes only its own queued copy: the second copy,
    which 2.1.39 later hands to the model mid-turn, is still there."""
    t = Transcript()
    t.user("first")
    t.assistant(text("one"), stop=None)
    _queue_op(t, "enqueue", "continue")
    _queue_op(t, "enqueue", "continue")
    _queue_op(t, "dequeue")
    t.user("continue")
    t.assistant(tool_use("toolu_1", "make"), stop=None)
    _queue_op(t, "remove")
    t.tool_result(("toolu_1", "ok"))
    t.assistant(text("continued twice"), stop=None)
    out = parse_bytes(t.data())
    assert [(m.turn, m.text) for m in out.messages if m.kind == "user_text"] == [
        (1, "first"), (2, "continue"), (2, "continue")]


def test_a_queued_message_taken_mid_turn_survives_a_capture_stopped_between_its_records(tmp_path, capture):
    """The queue is parse state the thread keeps (its meta): a capture that stops after
    the enqueue, and again after the remove, still puts the words in their turn, once."""
    t = Transcript()
    t.user("run the tests")
    t.assistant(tool_use("toolu_1", "make test"), stop=None)
    _queue_op(t, "enqueue", "check again")
    cut_enqueued = len(t.data())
    t.tool_result(("toolu_1", "running"))
    t.assistant(thinking("hmm", "sig-1"), stop=None, msg_id="msg_split")
    _queue_op(t, "remove")      # between two records of one response: a capture may stop here
    cut_removed = len(t.data())
    t.assistant(tool_use("toolu_2", "tail log"), stop=None, msg_id="msg_split")
    t.tool_result(("toolu_2", "3 failed"))
    t.assistant(text("Checked again."), stop=None)
    whole = t.data()
    path = tmp_path / "sess-1.jsonl"
    path.write_bytes(whole[:cut_enqueued])
    c = capture(path)
    for cut in (cut_removed, len(whole)):
        c.capture.stop()           # a new process: the parser's memory comes from the thread
        path.write_bytes(whole[:cut])
        c.capture = cc_lhc.Capture(c.home, "thread-1", "sess-1", str(path))
        c.capture.catch_up()
        c.store = c.capture.store
    texts = [(m["turn"], m["kind"], m["text"]) for m in c.messages()]
    assert texts[-5:] == [(1, "thinking", "hmm"), (1, "tool_call", '{"command":"tail log"}'),
                          (1, "tool_result", "3 failed"), (1, "user_text", "check again"),
                          (1, "assistant_text", "Checked again.")]
    assert [m["text"] for m in c.messages()].count("check again") == 1
    assert [(m[1], m[5]) for m in parse_bytes(whole).messages] == [(m[0], m[2]) for m in texts]  # as one read


def test_an_interrupt_note_ends_the_turn_it_stopped():
    t = Transcript()
    t.user("write the long essay")
    t.assistant(text("It was a dark and"), stop=None)          # Esc while the answer streamed
    t.user("[Request interrupted by user]")
    t.user("something shorter")
    t.assistant(text("Fine."))
    t.user("[Request interrupted by user for tool use]")     # a second note, after a closed turn
    out = parse_bytes(t.data())
    opened = [(o.n, o.kind) for o in out.turns_opened]
    closed = {c.n: (c.status, c.stop_reason) for c in out.turns_closed}
    assert opened == [(1, "prompt"), (2, "prompt"), (3, "interrupted")]
    assert closed[1] == ("interrupted", "user_interrupt") and closed[3] == ("interrupted", "user_interrupt")
    assert [(m[1], m[5]) for m in out.messages][:3] == [(1, "write the long essay"), (1, "It was a dark and"),
                                                        (1, "[Request interrupted by user]")]


def test_stop_hooks_hold_the_seam_until_they_report(tmp_path):
    """The order Claude Code 2.1.328 writes when a Stop hook sends it back once (taken from
    a real run): final answer, the hook's feedback (isMeta), stop_hook_summary, the answer
    to the feedback, stop_hook_summary. Once the thread has shown it runs Stop hooks, a
    turn that ended on a final answer is a settled seam only after the hooks reported; the
    feedback and its answer are one turn, open until answered."""
    sid = "sess-hooks"
    t = Transcript(sid)
    steps = []

    def step(fn, *a, **kw):
        fn(*a, **kw)
        steps.append(len(t.lines))
    step(t.user, "first prompt")
    step(t.assistant, text("first answer"))
    step(t.bookkeeping, "system", subtype="stop_hook_summary", uuid="sys-1")
    step(t.user, "second prompt")
    step(t.assistant, text("second answer"))                    # hooks still running here
    step(t.user, "Stop hook feedback:\n[stop.sh]: tests fail, keep going", isMeta=True)
    step(t.bookkeeping, "system", subtype="stop_hook_summary", uuid="sys-2")
    step(t.assistant, text("fixed the tests"))
    step(t.bookkeeping, "system", subtype="stop_hook_summary", uuid="sys-3")
    path = tmp_path / f"{sid}.jsonl"
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(sid, str(tmp_path), "fresh")
    seen = []
    for n in steps:
        path.write_bytes(b"".join(line + b"\n" for line in t.lines[:n]))
        cap = cc_lhc.Capture(home, thread, sid, str(path))
        cap.catch_up()
        seen.append(bool(cc_lhc.unsettled_reason(cap.store)))
        idle = cc_lhc.unsettled_reason(cap.store, idle=True)
        cap.stop()
    # (the first answer: no hook had reported in this thread yet, so nothing says to wait)
    assert seen == [True, False, False, True, True, True, True, True, False]
    assert idle == ""
    store = cc_lhc.ThreadStore(home, thread)
    rows = list(store.db.execute("SELECT n, kind, status, stop_reason FROM turns ORDER BY n"))
    assert [r[1] for r in rows] == ["prompt", "prompt", "continuation"] and rows[-1][2:] == ("closed", "end_turn")
    assert [(m["turn"], m["text"][:9]) for m in store.messages()][-2:] == [(3, "Stop hook"), (3, "fixed the")]
    store.close()


def test_an_api_error_after_stop_hooks_ran_is_a_settled_seam(tmp_path):
    """A thread that runs Stop hooks (a 2.1.39 session wrote stop_hook_summary after each
    turn), then the API refuses a request as too long: Claude writes its error as an answer
    (stop_sequence, model <synthetic>) and runs no Stop hook after it, so nothing will ever
    report that turn's end. The seam is settled: the too-long rejection is rebuilt now, not
    held for a report that never comes."""
    sid = "sess-hooks-error"
    t = Transcript(sid)
    t.user("first prompt")
    t.assistant(text("first answer"))
    t.bookkeeping("system", subtype="stop_hook_summary", uuid="sys-1")
    t.user("second prompt")
    t.record({"type": "assistant", "isApiErrorMessage": True, "sessionId": sid, "message": {
        "id": "err1", "role": "assistant", "model": "<synthetic>", "stop_reason": "stop_sequence",
        "content": [text("Prompt is too long")]}})
    path = t.write(tmp_path / f"{sid}.jsonl")
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(sid, str(tmp_path), "fresh")
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    cap.catch_up()
    assert cc_lhc.unsettled_reason(cap.store) == ""
    cap.stop()


def rewound_thread(t, sid, tmp_path):
    """The transcript captured into a new thread: (home, thread, its open store, the texts
    every view can hold, in order)."""
    path = t.write(tmp_path / f"{sid}.jsonl")
    home = cc_lhc.StateHome()
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(sid, str(tmp_path), "fresh")
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    cap.catch_up()
    cap.stop()
    store = cc_lhc.ThreadStore(home, thread)
    return home, thread, store, [m["text"] or "" for turn in cc_lhc.load_turns(store) for m in turn.messages]


def test_a_rewind_leaves_the_turns_it_went_back_over_out_of_every_view(tmp_path):
    """Claude Code's rewind ("Restore conversation") chains the next prompt to an earlier
    record; the turns after that record stay in the file, off Claude's branch. They stay in
    the thread (export marks them) and no view holds them."""
    sid = "sess-rewind"
    t = Transcript(sid)
    t.user("first prompt: list files")
    t.assistant(text("Here are the files."))
    back_to = t.bookkeeping("system", subtype="turn_duration", uuid="sys-after-first", parentUuid=t.parent)
    t.parent = "sys-after-first"
    t.user("OLD-BRANCH: delete the database")
    t.assistant({"type": "tool_use", "id": "toolu_old", "name": "Bash", "input": {"command": "rm -rf db/"}},
                stop="tool_use")
    t.tool_result(("toolu_old", "removed db/"))
    t.assistant(text("OLD-BRANCH answer: deleted"))
    t.parent = back_to["uuid"]                                   # the person rewinds
    t.user("NEW-BRANCH: back it up instead")
    t.assistant(text("NEW-BRANCH answer: backed up"))
    home, thread, store, shown = rewound_thread(t, sid, tmp_path)
    assert not any("OLD-BRANCH" in x for x in shown) and any("NEW-BRANCH" in x for x in shown)
    assert cc_lhc.off_branch(store) == [(3, 6)]
    store.close()
    status, out = run_main_export(thread)
    assert len(json.loads(out)) == 8  # every message is still in the thread, as captured
    # an ordinary session (every prompt chained to the newest record) leaves nothing off its branch
    t2 = Transcript("sess-plain")
    t2.user("one")
    t2.assistant(text("two"))
    t2.user("three")
    t2.assistant(text("four"))
    plain = t2.write(tmp_path / "sess-plain.jsonl")
    other = cc_lhc.Registry(home).create_thread("sess-plain", str(tmp_path), "fresh")
    cap = cc_lhc.Capture(home, other, "sess-plain", str(plain))
    cap.catch_up()
    assert cc_lhc.off_branch(cap.store) == []
    cap.stop()


def test_a_rewind_to_the_first_prompt_leaves_every_turn_before_it_out_of_every_view(tmp_path):
    """Rewinding to the session's first prompt writes the next prompt with no parent at all
    (parentUuid null): everything before it in the file is off Claude's branch, as Claude's
    own resume leaves it out. A prompt that was never answered (Esc) goes with it."""
    sid = "sess-rewind-start"
    t = Transcript(sid)
    t.user("OLD-BRANCH first prompt")
    t.assistant(text("OLD-BRANCH first answer"))
    t.user("OLD-BRANCH second prompt")
    t.assistant(text("OLD-BRANCH second answer"))
    t.user("OLD-BRANCH never answered")
    t.parent = None                                              # the person rewinds to the start
    t.user("NEW-BRANCH prompt")
    t.assistant(text("NEW-BRANCH answer"))
    _home, thread, store, shown = rewound_thread(t, sid, tmp_path)
    assert shown == ["NEW-BRANCH prompt", "NEW-BRANCH answer"]
    assert cc_lhc.off_branch(store) == [(1, 5)]
    store.close()
    status, out = run_main_export(thread)
    assert len(json.loads(out)) == 7  # every message is still in the thread


def run_main_export(thread):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = cc_lhc.main(["export", thread, "--format", "json"])
    return status, out.getvalue()


def test_the_settings_claude_reads_say_whether_stop_hooks_run(tmp_path, monkeypatch):
    import types
    hooked = {"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "true"}]}]}}
    other = {"hooks": {"PreToolUse": [{"hooks": [{"type": "command", "command": "true"}]}]}}
    config = tmp_path / "config"
    config.mkdir()
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    work = tmp_path / "work"
    (work / ".claude").mkdir(parents=True)

    def spec(*args):
        return types.SimpleNamespace(cwd=str(work), claude_args=list(args))
    assert not cc_lhc.stop_hooks_configured(spec())
    (config / "settings.json").write_text(json.dumps(other))
    assert not cc_lhc.stop_hooks_configured(spec())
    assert cc_lhc.stop_hooks_configured(spec("--settings", json.dumps(hooked)))   # a JSON argument
    given = tmp_path / "given.json"
    given.write_text(json.dumps(hooked))
    assert cc_lhc.stop_hooks_configured(spec(f"--settings={given}"))              # a file
    (work / ".claude" / "settings.local.json").write_text("{not json")
    assert not cc_lhc.stop_hooks_configured(spec())                             # unreadable: none
    (work / ".claude" / "settings.json").write_text(json.dumps(hooked))
    assert cc_lhc.stop_hooks_configured(spec())                                 # the folder's
    (work / ".claude" / "settings.json").write_text(json.dumps(other))
    managed = tmp_path / "managed-settings.json"
    monkeypatch.setattr(cc_lhc, "managed_settings_file", lambda: str(managed))
    assert not cc_lhc.stop_hooks_configured(spec())
    managed.write_text(json.dumps(hooked))
    assert cc_lhc.stop_hooks_configured(spec())                                 # the administrator's
    managed.unlink()


def _plugin(root, hooks_json=None, manifest_hooks=None):
    (root / ".claude-plugin").mkdir(parents=True)
    manifest = {"name": root.name, "version": "1.0.0"}
    if manifest_hooks is not None:
        manifest["hooks"] = manifest_hooks
    (root / ".claude-plugin" / "plugin.json").write_text(json.dumps(manifest))
    if hooks_json is not None:
        (root / "hooks").mkdir()
        (root / "hooks" / "hooks.json").write_text(json.dumps(hooks_json))
    return root


def test_a_plugins_stop_hooks_are_found_before_they_first_report(tmp_path, monkeypatch):
    import types
    stop = {"Stop": [{"hooks": [{"type": "command", "command": "true"}]}]}
    pre = {"PreToolUse": [{"hooks": [{"type": "command", "command": "true"}]}]}
    config = tmp_path / "config"
    (config / "plugins").mkdir(parents=True)
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", str(config))
    monkeypatch.setattr(cc_lhc, "managed_settings_file", lambda: str(tmp_path / "none.json"))
    work = tmp_path / "work"
    work.mkdir()

    def spec(*args):
        return types.SimpleNamespace(cwd=str(work), claude_args=list(args))
    quiet = _plugin(tmp_path / "quiet", hooks_json={"hooks": pre})
    hooky = _plugin(tmp_path / "hooky", hooks_json={"hooks": stop})
    inline = _plugin(tmp_path / "inline", manifest_hooks={"hooks": stop})
    named = _plugin(tmp_path / "named", manifest_hooks="./more/stop.json")
    (named / "more").mkdir()
    (named / "more" / "stop.json").write_text(json.dumps({"hooks": stop}))
    assert not cc_lhc.stop_hooks_configured(spec("--plugin-dir", str(quiet)))
    for plugin in (hooky, inline, named):
        assert cc_lhc.stop_hooks_configured(spec("--plugin-dir", str(quiet), "--plugin-dir", str(plugin)))
    assert cc_lhc.stop_hooks_configured(spec(f"--plugin-dir={hooky}"))
    assert cc_lhc.stop_hooks_configured(spec("--plugin-dir", "../hooky"))          # the folder's relative path
    monkeypatch.setenv("CLAUDE_CODE_PLUGIN_DIRS", f"{quiet}{os.pathsep}{hooky}")   # the plugins Claude's env names
    assert cc_lhc.stop_hooks_configured(spec())
    monkeypatch.setenv("CLAUDE_CODE_PLUGIN_DIRS", str(quiet))
    assert not cc_lhc.stop_hooks_configured(spec())
    monkeypatch.delenv("CLAUDE_CODE_PLUGIN_DIRS")
    # an installed plugin counts when a settings file turns it on, and the last word wins
    (config / "plugins" / "installed_plugins.json").write_text(json.dumps(
        {"version": 2, "plugins": {"hooky@m": [{"scope": "user", "installPath": str(hooky)}],
                                   "quiet@m": [{"scope": "user", "installPath": str(quiet)}]}}))
    assert not cc_lhc.stop_hooks_configured(spec())
    (config / "settings.json").write_text(json.dumps({"enabledPlugins": {"quiet@m": True, "hooky@m": True}}))
    assert cc_lhc.stop_hooks_configured(spec())
    (work / ".claude").mkdir()
    (work / ".claude" / "settings.local.json").write_text(json.dumps({"enabledPlugins": {"hooky@m": False}}))
    assert not cc_lhc.stop_hooks_configured(spec())
    (config / "plugins" / "installed_plugins.json").write_text("[not, an, object")
    assert not cc_lhc.stop_hooks_configured(spec("--settings", json.dumps({"enabledPlugins": {"hooky@m": True}})))
