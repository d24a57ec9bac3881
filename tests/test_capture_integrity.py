"""Capture, part 4: a transcript that changes under the record, and lines the store cannot
hold as they are (issue 9, items 1 and 2).

A transcript whose captured bytes are no longer there (shrunk, or a line rewritten) is read
again from its start, so every record it now holds reaches the thread exactly once and
nothing captured is removed. A line with a number SQLite cannot store, or raw surrogate
bytes, is kept verbatim and counted; the rest of its batch and of the file is captured.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections import Counter
from pathlib import Path

import pytest

import cc_lhc
from test_capture_live import SESSION, registered_thread, run_main, threads_json
from test_capture_parse import Transcript, text

SECRET = "PROMPT-A secret detail 4711"
HUGE = 2 ** 64 + 7  # JSON allows it; SQLite's signed 64-bit integers do not


# -- helpers ------------------------------------------------------------------------------

def capture_once(home, thread, path) -> int:
    """One launch-time catch-up, as `cc-lhc --resume` does it (a fresh Capture each time)."""
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    try:
        return cap.catch_up()
    finally:
        cap.stop()


def export(thread: str) -> list[dict]:
    status, out = run_main("export", thread, "--format", "json")
    assert status == 0
    return json.loads(out)


def file_uuids(path: Path) -> set[str]:
    """uuids of the conversational records a transcript holds now."""
    out = set()
    for line in path.read_bytes().splitlines():
        rec = json.loads(line)
        if rec.get("type") in ("user", "assistant") and rec.get("uuid"):
            out.add(rec["uuid"])
    return out


def uuid_counts(records: list[dict]) -> Counter:
    """How many export rows each source record gave (one each: these records hold one block)."""
    return Counter(r["source_uuid"] for r in records)


def two_turns(t: Transcript) -> Transcript:
    t.user("first question")
    t.assistant(text("first answer"))
    t.user("second question")
    t.assistant(text("second answer"))
    return t


def drop_last_line_and_continue(path: Path, t: Transcript) -> None:
    """What the issue did: the last line gone, a new prompt and its answer appended."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))
    t.lines = t.lines[:-1]
    t.parent = json.loads(t.lines[-1])["uuid"]
    before = len(t.lines)
    t.user(SECRET)
    t.assistant(text("answer to prompt A"), msg_id="msg_after_drop")
    with open(path, "ab") as f:
        f.write(b"".join(line + b"\n" for line in t.lines[before:]))


def rebuild_bytes(home, thread) -> bytes:
    """The transcript the next Smart Compact would write for this thread."""
    store = cc_lhc.ThreadStore(home, thread)
    try:
        return cc_lhc.plan_rebuild(home, store, thread, cc_lhc.resolve_policy([]), str(uuid.uuid4()),
                                   "/w", projects_root=str(home.path("unused-projects"))).data
    finally:
        store.close()


def log_events(home) -> list[dict]:
    return [json.loads(line) for line in Path(home.path("wrapper.log")).read_text().splitlines()]


# -- 1. a transcript that changes under the record ---------------------------------------

def test_dropped_last_line_then_new_prompt_reaches_the_thread_and_the_next_view(tmp_path):
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    assert capture_once(home, thread, path) == 4
    drop_last_line_and_continue(path, t)

    capture_once(home, thread, path)
    records = export(thread)
    texts = [r["text"] for r in records]
    # the new prompt and its answer, and the dropped answer is still in the record
    assert texts == ["first question", "first answer", "second question", "second answer",
                     SECRET, "answer to prompt A"]
    assert set(uuid_counts(records).values()) == {1}
    assert file_uuids(path) <= set(uuid_counts(records))
    assert SECRET.encode() in rebuild_bytes(home, thread)

    [row] = threads_json()
    # it grew back past the old offset: only the bytes before it show the change
    assert row["degraded"] is True and row["degraded_reason"].startswith("transcript_rewritten")
    assert row["captured_bytes"] == path.stat().st_size
    [event] = [e for e in log_events(home) if e["event"] == "transcript_rewritten"]
    assert event["thread"] == thread and event["session"] == SESSION
    store = cc_lhc.ThreadStore(home, thread)
    assert store.db.execute("SELECT count FROM telemetry WHERE type = 'transcript_rewritten'").fetchone() == (1,)
    store.close()
    # read again once: a later launch finds nothing new and reports nothing new
    assert capture_once(home, thread, path) == 0
    assert export(thread) == records
    assert len([e for e in log_events(home) if e["event"].startswith("transcript_")]) == 1


def test_a_rewrite_that_leaves_the_file_longer_is_found_by_the_prefix_hash(tmp_path):
    """Size alone cannot tell: the replacement line is longer than the one it replaced."""
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    capture_once(home, thread, path)
    old = json.loads(t.lines[2])
    new = {**old, "uuid": "rewritten-middle", "message": {"role": "user", "content": "a longer question now"}}
    t.lines[2] = json.dumps(new).encode()
    later = json.loads(t.lines[3])
    t.lines[3] = json.dumps({**later, "parentUuid": "rewritten-middle"}).encode()
    t.write(path)

    capture_once(home, thread, path)
    records = export(thread)
    assert [r["text"] for r in records] == ["first question", "first answer", "second question",
                                            "second answer", "a longer question now"]
    assert set(uuid_counts(records).values()) == {1}
    [row] = threads_json()
    assert row["degraded_reason"].startswith("transcript_rewritten")


def test_live_capture_notices_a_dropped_line_when_claude_appends_again(tmp_path):
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    cap.catch_up()  # the live thread's first read
    drop_last_line_and_continue(path, t)
    assert path.stat().st_size > cap.store.source(SESSION)["offset"]  # it grew past the offset
    cap.catch_up()  # the live thread's next read after the file changed
    cap.stop()
    assert [r["text"] for r in export(thread)][-2:] == [SECRET, "answer to prompt A"]
    assert set(uuid_counts(export(thread)).values()) == {1}


def test_plain_appends_are_never_taken_for_a_rewrite(tmp_path):
    home, thread = registered_thread()
    t = Transcript()
    path = tmp_path / "t.jsonl"
    for i in range(5):
        t.user(f"q{i}")
        t.assistant(text(f"a{i}"))
        t.write(path)
        capture_once(home, thread, path)
    [row] = threads_json()
    assert row["degraded"] is False and row["messages"] == 10
    store = cc_lhc.ThreadStore(home, thread)
    src = store.source(SESSION)
    assert src["prefix_sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
    store.close()


def test_a_thread_captured_before_hashes_were_kept_is_not_read_again(tmp_path):
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    capture_once(home, thread, path)
    store = cc_lhc.ThreadStore(home, thread)
    with cc_lhc.Tx(store.db):
        store.db.execute("UPDATE sources SET prefix_sha256 = NULL")
    store.close()
    t.user("third")
    t.write(path)
    assert capture_once(home, thread, path) == 1
    [row] = threads_json()
    assert row["degraded"] is False and row["messages"] == 5


def test_a_fifo_in_place_of_the_transcript_is_reported_not_waited_on(tmp_path):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    capture_once(home, thread, path)
    path.unlink()
    os.mkfifo(path)
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    assert cap.catch_up() == 0 and cap.caught_up
    cap.stop()
    [row] = threads_json()
    assert row["messages"] == 4 and row["degraded_reason"].startswith("transcript_unreadable")


# -- 2. lines the store cannot hold as they are -------------------------------------------

def odd_transcript(tmp_path: Path, odd_line) -> tuple[Path, bytes]:
    """A prompt, an odd line (built from the parent uuid), then more turns after it."""
    t = Transcript()
    t.user("before the odd line")
    line = odd_line(t.parent)
    t.raw(line)
    t.parent = json.loads(line.decode("utf-8", "surrogatepass"), parse_int=lambda s: None)["uuid"]
    t.user("after the odd line")
    t.assistant(text("answer after it"))
    return t.write(tmp_path / "t.jsonl"), line


def huge_usage(parent) -> bytes:
    rec = {"parentUuid": parent, "isSidechain": False, "type": "assistant", "uuid": "huge-1",
           "timestamp": "2026-11-30T10:00:01.000Z",
           "message": {"id": "msg_huge", "role": "assistant", "model": "claude-opus-5-5",
                       "content": [{"type": "text", "text": "a reply with odd usage"}],
                       "stop_reason": "end_turn",
                       "usage": {"input_tokens": HUGE, "output_tokens": 5}}}
    return json.dumps(rec).encode()


def raw_surrogate(parent) -> bytes:
    rec = {"parentUuid": parent, "isSidechain": False, "type": "assistant", "uuid": "sur-1",
           "timestamp": "2026-11-30T10:00:01.000Z",
           "message": {"id": "msg_sur", "role": "assistant", "model": "claude-opus-5-5",
                       "content": [{"type": "text", "text": "cut SURROGATE here"}],
                       "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}}}
    return json.dumps(rec).encode().replace(b"SURROGATE", b"\xed\xa0\x80")


def not_finite(parent, call=False) -> bytes:
    """A reply holding a number no float holds (JSON.parse reads it as Infinity, which
    JSON.stringify writes as null) and a NaN (which JSON does not have); with ``call``,
    in a tool call's input."""
    content = [{"type": "text", "text": "a reply with odd numbers"}]
    if call:
        content.append({"type": "tool_use", "id": "toolu_inf", "name": "Calc",
                        "input": {"big": "BIG", "nan": "NAN", "ok": 1.5}})
    rec = {"parentUuid": parent, "isSidechain": False, "type": "assistant", "uuid": "inf-1",
           "timestamp": "2026-11-30T10:00:01.000Z", "costUSD": "BIG", "durationMs": "NAN",
           "message": {"id": "msg_inf", "role": "assistant", "model": "claude-opus-5-5", "content": content,
                       "stop_reason": "end_turn", "usage": {"input_tokens": 10, "output_tokens": 5}}}
    return json.dumps(rec).encode().replace(b'"BIG"', b"1e400").replace(b'"NAN"', b"NaN")


def too_long_int(parent, call=False) -> bytes:
    """A reply whose usage (and with ``call`` a tool input) holds an integer of more digits
    than Python reads (4,300): valid JSON, which JavaScript reads as Infinity and sends on
    as null."""
    content = [{"type": "text", "text": "a reply with a long integer"}]
    if call:
        content.append({"type": "tool_use", "id": "toolu_long", "name": "Calc", "input": {"n": "LONG", "ok": 7}})
    rec = {"parentUuid": parent, "isSidechain": False, "type": "assistant", "uuid": "long-1",
           "timestamp": "2026-11-30T10:00:01.000Z",
           "message": {"id": "msg_long", "role": "assistant", "model": "claude-opus-5-5", "content": content,
                       "stop_reason": "end_turn", "usage": {"input_tokens": "LONG", "output_tokens": 5}}}
    return json.dumps(rec).encode().replace(b'"LONG"', b"9" * 5000)


@pytest.mark.parametrize("odd_line, reason, odd_text", [
    (huge_usage, "number_out_of_range", "a reply with odd usage"),
    (too_long_int, "number_out_of_range", "a reply with a long integer"),
    (raw_surrogate, "text_repaired", "cut \ufffd here"),
    (not_finite, "number_out_of_range", "a reply with odd numbers"),
])
def test_an_odd_line_is_kept_verbatim_and_the_rest_is_captured(tmp_path, odd_line, reason, odd_text):
    home, thread = registered_thread()
    path, line = odd_transcript(tmp_path, odd_line)
    capture_once(home, thread, path)
    assert [r["text"] for r in export(thread)] == [
        "before the odd line", odd_text, "after the odd line", "answer after it"]
    [row] = threads_json()
    assert row["captured_bytes"] == path.stat().st_size
    assert row["degraded"] is False  # counted, not an integrity failure: nothing was lost
    store = cc_lhc.ThreadStore(home, thread)
    assert store.db.execute("SELECT count FROM telemetry WHERE type = ?", (reason,)).fetchone() == (1,)
    assert store.db.execute("SELECT reason, raw FROM raw_lines").fetchall() == [(reason, line)]
    store.close()


def test_a_number_no_float_holds_is_stored_as_null_and_the_line_kept(tmp_path):
    home, thread = registered_thread()
    path, line = odd_transcript(tmp_path, lambda parent: not_finite(parent, call=True))
    capture_once(home, thread, path)
    [call] = [m for m in export(thread) if m["kind"] == "tool_call"]
    assert call["input"] == {"big": None, "nan": None, "ok": 1.5}
    # what the store (and so a rebuilt session) holds is JSON: never Infinity or NaN
    store = cc_lhc.ThreadStore(home, thread)
    text, data = store.db.execute("SELECT lhc_text(text), data FROM messages WHERE kind = 'tool_call'").fetchone()
    assert store.db.execute("SELECT reason, raw FROM raw_lines").fetchall() == [("number_out_of_range", line)]
    store.close()
    assert json.loads(text, parse_constant=pytest.fail) == call["input"] and b"1e400" in line
    assert "Infinity" not in data and "NaN" not in data


def test_an_integer_longer_than_python_reads_is_null_and_its_record_kept(tmp_path):
    home, thread = registered_thread()
    path, line = odd_transcript(tmp_path, lambda parent: too_long_int(parent, call=True))
    capture_once(home, thread, path)
    [call] = [m for m in export(thread) if m["kind"] == "tool_call"]
    assert call["input"] == {"n": None, "ok": 7}
    store = cc_lhc.ThreadStore(home, thread)
    assert store.db.execute("SELECT reason, raw FROM raw_lines").fetchall() == [("number_out_of_range", line)]
    assert store.db.execute("SELECT count(*) FROM problems").fetchone() == (0,)
    store.close()


def test_an_out_of_range_usage_figure_is_stored_as_unknown(tmp_path):
    home, thread = registered_thread()
    path, _line = odd_transcript(tmp_path, huge_usage)
    capture_once(home, thread, path)
    store = cc_lhc.ThreadStore(home, thread)
    assert store.db.execute("SELECT input, output FROM usage WHERE response_id = 'msg_huge'"
                            ).fetchone() == (None, 5)
    store.close()


def test_a_surrogate_in_a_key_is_repaired_too():
    parser = cc_lhc.RolloutParser("s", cc_lhc.ParseState(), 10 ** 9)
    line = (b'{"type":"user","uuid":"k1","message":{"content":[{"type":"odd","\xed\xa0\x80":1}]}}')
    parser.feed(line, 1, 0)
    out = parser.take()
    assert out.problems == [] and "\ufffd" in out.messages[0][6]
    assert out.raw_lines == [("s", 1, 0, "text_repaired", line)]


def test_sqlite_int_is_the_signed_64_bit_range():
    assert cc_lhc.sqlite_int(2 ** 63 - 1) == 2 ** 63 - 1
    assert cc_lhc.sqlite_int(-(2 ** 63)) == -(2 ** 63)
    assert cc_lhc.sqlite_int(2 ** 63) is None and cc_lhc.sqlite_int(-(2 ** 63) - 1) is None
    assert cc_lhc.sqlite_int(True) is None and cc_lhc.sqlite_int(1.0) is None


@pytest.mark.parametrize("odd_line", [huge_usage, raw_surrogate])
def test_measure_reads_an_odd_file_alone_and_in_a_folder(tmp_path, odd_line):
    path, _line = odd_transcript(tmp_path, odd_line)
    status, out = run_main("measure", str(path), "--json")
    assert status == 0
    [row] = json.loads(out)["sessions"]
    assert row["messages"] == 4
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "odd.jsonl").write_bytes(path.read_bytes())
    (folder / "plain.jsonl").write_bytes(two_turns(Transcript()).data())
    status, out = run_main("measure", str(folder), "--json")
    assert status == 0
    assert [r["messages"] for r in json.loads(out)["sessions"]] == [4, 4]


def test_measure_names_a_transcript_it_cannot_read_and_measures_the_rest(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "folder"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_bytes(two_turns(Transcript()).data())
    real = cc_lhc.measure_transcript

    def measure(path, *args):
        if path.endswith("b.jsonl"):
            raise PermissionError(13, "Permission denied", path)
        return real(path, *args)
    monkeypatch.setattr(cc_lhc, "measure_transcript", measure)
    status, out = run_main("measure", str(folder), "--json")
    assert status == 1 and [r["session"] for r in json.loads(out)["sessions"]] == [1]
    assert "b.jsonl could not be read (Permission denied): left out" in capsys.readouterr().err
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(cc_lhc.LhcError, match="holds no transcripts"):
        cc_lhc.cmd_measure([str(empty)])
    with pytest.raises(cc_lhc.LhcError, match="give one of them"):
        cc_lhc.cmd_measure([str(folder), "--json", "--markdown"])


def test_a_shrink_read_in_between_still_takes_what_is_appended_later(tmp_path):
    home, thread = registered_thread()
    t = two_turns(Transcript())
    path = t.write(tmp_path / "t.jsonl")
    capture_once(home, thread, path)
    path.write_bytes(b"".join(line + b"\n" for line in t.lines[:2]))
    capture_once(home, thread, path)  # shorter than the offset: read again, nothing new
    t.lines = t.lines[:2]
    t.parent = json.loads(t.lines[-1])["uuid"]
    t.user(SECRET)
    t.write(path)
    capture_once(home, thread, path)
    records = export(thread)
    assert [r["text"] for r in records] == ["first question", "first answer", "second question",
                                            "second answer", SECRET]
    [row] = threads_json()
    assert row["degraded_reason"].startswith("transcript_shrank")


# -- through the real CLI ------------------------------------------------------------------

def chained_records(path: Path) -> list[dict]:
    return [r for r in map(json.loads, path.read_bytes().splitlines()) if r.get("uuid")]


def like(rec: dict, parent: str, **changes) -> dict:
    """A copy of a record Claude wrote, as the next link of the chain."""
    return {**rec, **changes, "parentUuid": parent, "uuid": str(uuid.uuid4())}


def append_turn(path: Path, prompt: str, answer: str, *, text_bytes=None, usage=None) -> bytes:
    """Append a prompt and its answer in the real CLI's own format; returns what was written.

    ``text_bytes`` replaces the answer text's bytes in the written line (for bytes JSON
    text cannot express), ``usage`` the answer's usage figures.
    """
    recs = chained_records(path)
    user = next(r for r in recs if r["type"] == "user" and isinstance(r["message"]["content"], str))
    reply = next(r for r in reversed(recs) if r["type"] == "assistant")
    leaf = recs[-1]["uuid"]
    u = like(user, leaf, message={"role": "user", "content": prompt})
    message = {**reply["message"], "id": f"msg_{uuid.uuid4().hex[:20]}",
               "content": [{"type": "text", "text": answer}], "stop_reason": "end_turn"}
    if usage:
        message["usage"] = {**message["usage"], **usage}
    a = like(reply, u["uuid"], message=message)
    lines = [json.dumps(u).encode(), json.dumps(a).encode()]
    if text_bytes is not None:
        lines[1] = lines[1].replace(answer.encode(), text_bytes)
    data = b"".join(line + b"\n" for line in lines)
    with open(path, "ab") as f:
        f.write(data)
    return data


def real_lhc(rc, *args):
    p = rc.run_lhc(*args)
    assert "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 0, f"cc-lhc {' '.join(args)} -> {p.returncode}\n{p.stderr}"
    return p


def test_real_cli_a_dropped_line_and_a_new_prompt_reach_the_thread(real_claude):
    rc, api = real_claude, real_claude.api
    api.script(["first reply"])
    session = json.loads(real_lhc(rc, "-p", "first", "--output-format", "json").stdout)["session_id"]
    api.script(["second reply"])
    real_lhc(rc, "--resume", session, "-p", "second")
    [path] = rc.transcripts()
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:-1]))
    append_turn(path, SECRET, "answer to prompt A")

    api.script(["third reply"])
    real_lhc(rc, "--resume", session, "-p", "third")
    # Claude continued from the appended prompt: it was really in the conversation
    from fakeapi import user_texts
    assert SECRET in user_texts(api.message_requests[-1]["body"])
    [row] = threads_json()
    records = export(row["id"])
    says = [r["text"] for r in records if r["kind"] in ("user_text", "assistant_text")]
    assert says == ["first", "first reply", "second", "second reply", SECRET,
                    "answer to prompt A", "third", "third reply"]
    assert set(uuid_counts(records).values()) == {1}
    assert {r["source_uuid"] for r in records} <= {r["uuid"] for r in chained_records(path)}
    assert row["degraded_reason"].startswith("transcript_rewritten")
    assert row["captured_bytes"] == path.stat().st_size
    assert SECRET.encode() in rebuild_bytes(cc_lhc.StateHome(), row["id"])


@pytest.mark.parametrize("odd", ["usage", "bytes"])
def test_real_cli_an_odd_line_does_not_stop_capture_or_the_launch(real_claude, odd):
    rc, api = real_claude, real_claude.api
    api.script(["first reply"])
    session = json.loads(real_lhc(rc, "-p", "first", "--output-format", "json").stdout)["session_id"]
    [path] = rc.transcripts()
    if odd == "usage":
        append_turn(path, "odd prompt", "odd answer", usage={"output_tokens": HUGE})
        odd_answer = "odd answer"
    else:
        append_turn(path, "odd prompt", "odd answer", text_bytes=b"odd \xed\xa0\x80 answer")
        odd_answer = "odd \ufffd answer"
    append_turn(path, "later prompt", "later answer")  # in the same batch, after the odd line

    api.script(["next reply"])
    p = rc.run_lhc("--resume", session, "-p", "next")
    assert "Traceback" not in p.stderr, p.stderr
    # Claude started, and cc-lhc's exit is Claude's own (Claude itself refuses a session whose
    # usage adds up to more than its window: "Prompt is too long")
    [exited] = [e for e in log_events(cc_lhc.StateHome()) if e["event"] == "child_exited"][1:]
    assert p.returncode == exited["status"]
    assert p.returncode == 0 or (odd == "usage" and p.stdout.strip() == "Prompt is too long")
    [row] = threads_json()
    says = [r["text"] for r in export(row["id"]) if r["kind"] in ("user_text", "assistant_text")]
    assert says[:7] == ["first", "first reply", "odd prompt", odd_answer, "later prompt",
                        "later answer", "next"]
    assert row["captured_bytes"] == path.stat().st_size
    # measure reads it too, alone and in its folder
    alone = json.loads(real_lhc(rc, "measure", str(path), "--json").stdout)
    folder = json.loads(real_lhc(rc, "measure", str(path.parent), "--json").stdout)
    assert [s["messages"] for s in folder["sessions"]] == [s["messages"] for s in alone["sessions"]]
    assert alone["sessions"][0]["messages"] >= 7


def telemetry(home, thread) -> dict:
    import sqlite3
    db = sqlite3.connect(home.path("threads", f"{thread}.sqlite"))
    try:
        return {t: (n, b) for t, n, b in db.execute("SELECT type, count, bytes FROM telemetry")}
    finally:
        db.close()


def raw_lines(thread) -> list[str]:
    status, out = run_main("export", thread, "--format", "raw-lines")
    assert status == 0
    return [json.loads(line)["raw"] for line in out.splitlines()]


def test_a_file_read_again_keeps_and_counts_its_lines_without_uuid_once(tmp_path):
    """Lines with no uuid have nothing to know them by but their bytes: read again after a
    rewrite, each is one the thread already holds, one for one; a second copy is new."""
    home, thread = registered_thread()
    t = Transcript()
    t.user("first question")
    snapshot = json.dumps({"type": "file-history-snapshot", "messageId": "m1", "snapshot": {}}).encode()
    loose = b'{"type":"user","message":{"role":"user","content":"a prompt with no uuid"}}'
    t.lines += [snapshot, loose]
    t.assistant(text("first answer"))
    path = t.write(tmp_path / "t.jsonl")
    capture_once(home, thread, path)
    before = telemetry(home, thread)
    assert raw_lines(thread) == [loose.decode()]

    first = json.loads(t.lines[0])
    first["message"]["content"] = "first question, asked at more length"
    t.lines[0] = json.dumps(first).encode()  # the file rewritten: every later line moves
    t.write(path)
    capture_once(home, thread, path)
    after = telemetry(home, thread)
    assert raw_lines(thread) == [loose.decode()]
    assert after.pop("transcript_rewritten") == (1, 0)
    assert after == before  # (the records met again are no copies Claude wrote)

    t.lines.insert(2, loose)  # now the file holds it twice, and the snapshot twice
    t.lines.insert(2, snapshot)
    t.write(path)
    capture_once(home, thread, path)
    assert raw_lines(thread) == [loose.decode()] * 2
    grown = telemetry(home, thread)
    assert grown["file-history-snapshot"] == (2, 2 * len(snapshot))
    assert grown["unplaced_record"][0] == 2
    assert "duplicate_record" not in grown
    assert [r["text"] for r in export(thread)][:2] == ["first question", "first answer"]
