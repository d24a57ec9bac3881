"""Tool outputs Claude Code saves to a file of their own.

An output too large for the transcript is written whole to <session>/tool-results/<name>.txt,
and the transcript's tool result holds only a preview naming that file. The thread keeps
the file's bytes as a message of its own right after the result (export, get-messages and
search reach it), views leave it out (the model only saw the preview), and a file that
cannot be read is a counted problem, never silent.
"""

from __future__ import annotations

import base64
import json
import os
import sqlite3
import sys
import uuid
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import block_text, text_reply, tool_use_reply
from test_capture_live import registered_thread, run_main
from test_capture_parse import Transcript, text

NEEDLE = "END-OF-OUTPUT-needle-7731"


def preview(path: str) -> str:
    return (f"<persisted-output>\nOutput too large (215.7KB). Full output saved to: {path}\n\n"
            "Preview (first 2KB):\nrow 0\nrow 1\n...\n</persisted-output>")


def session_with_saved_output(tmp_path: Path, body: bytes | None, *, where=None, named=True):
    """A transcript whose Bash call's output was saved to a file (``body``; None: the file
    is gone), named by toolUseResult (``named``) or only by the preview (older versions)."""
    sid = str(uuid.uuid4())
    path = tmp_path / f"{sid}.jsonl"
    saved = where or tmp_path / sid / "tool-results" / "bnrfihg75.txt"
    if body is not None:
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_bytes(body)
    t = Transcript(sid)
    t.user("run it")
    t.assistant({"type": "tool_use", "id": "toolu_big", "name": "Bash", "input": {"command": "big"}},
                stop="tool_use")
    extra = {"toolUseResult": {"stdout": "row 0\n", "persistedOutputPath": str(saved),
                               "persistedOutputSize": len(body or b"")}} if named else {}
    t.tool_result(("toolu_big", preview(str(saved))), **extra)
    t.assistant(text("saw it"))
    t.write(path)
    return sid, path, saved


def capture(sid, path):
    home, thread = registered_thread(sid)
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    try:
        cap.catch_up()
    finally:
        cap.stop()
    status, out = run_main("export", thread, "--format", "json")
    assert status == 0
    return home, thread, json.loads(out)


def problems(home, thread):
    db = sqlite3.connect(home.path("threads", f"{thread}.sqlite"))
    try:
        return [(k, d) for k, d in db.execute("SELECT kind, detail FROM problems")]
    finally:
        db.close()


def test_the_saved_file_is_a_message_right_after_its_result(tmp_path):
    body = "".join(f"row {i}\n" for i in range(9000)).encode() + NEEDLE.encode() + b"\n"
    sid, path, saved = session_with_saved_output(tmp_path, body)
    home, thread, records = capture(sid, path)
    kinds = [r["kind"] for r in records]
    assert kinds == ["user_text", "tool_call", "tool_result", cc_lhc.SAVED_OUTPUT, "assistant_text"]
    result, whole = records[2], records[3]
    assert block_text({"content": result["output"]}).startswith("<persisted-output>")
    assert whole["text"].encode() == body and whole["bytes"] == len(body) and whole["path"] == str(saved)
    assert whole["tool_use_id"] == "toolu_big" and whole["turn"] == result["turn"]
    assert problems(home, thread) == []
    # stored compressed, as a tool result's output is (a 20 MB log was kept as it was)
    db = sqlite3.connect(home.path("threads", f"{thread}.sqlite"))
    try:
        (stored,) = db.execute("SELECT text FROM messages WHERE kind = ?", (cc_lhc.SAVED_OUTPUT,)).fetchone()
    finally:
        db.close()
    assert isinstance(stored, bytes) and len(stored) * 3 < len(body)
    status, out = run_main("search", NEEDLE, "--thread", thread)  # (and found by search there)
    assert status == 0 and whole["label"] in out, out
    # the view Claude would be given holds the preview, never the file
    store = cc_lhc.ThreadStore(home, thread)
    turns = cc_lhc.load_turns(store)
    shown = [m["kind"] for t in turns for band in cc_lhc.BANDS for m, _ in cc_lhc.visible_messages(t, band)]
    assert cc_lhc.SAVED_OUTPUT not in shown and "tool_result" in shown
    # a lean stub of the preview names the whole output, to read back
    [(_m, stub)] = [(m, st) for t in turns for m, st in cc_lhc.visible_messages(t, "lean") if m["kind"] == "tool_result"]
    assert stub.startswith(f"[output of Bash {whole['label']}: 9001 lines,") and f"get-messages {whole['label']}" in stub
    # and the markdown export fences it like a tool output
    status, md = run_main("export", thread, "--format", "markdown")
    assert status == 0 and NEEDLE in md and "saved to a file" in md


def test_an_older_preview_alone_names_the_file_too(tmp_path):
    sid, path, _saved = session_with_saved_output(tmp_path, b"whole output " + NEEDLE.encode(), named=False)
    _home, _thread, records = capture(sid, path)
    [whole] = [r for r in records if r["kind"] == cc_lhc.SAVED_OUTPUT]
    assert whole["text"] == "whole output " + NEEDLE


def test_bytes_that_are_not_utf8_are_kept_exactly(tmp_path):
    body = b"caf\xe9 \xff\xfe " + NEEDLE.encode()
    sid, path, _saved = session_with_saved_output(tmp_path, body)
    _home, _thread, records = capture(sid, path)
    [whole] = [r for r in records if r["kind"] == cc_lhc.SAVED_OUTPUT]
    assert base64.b64decode(whole["raw_base64"]) == body and NEEDLE in whole["text"]


def test_a_large_output_that_is_not_utf8_is_kept_exactly_and_compressed(tmp_path):
    """A large log with one latin-1 byte: its exact bytes were kept as base64 of the whole
    file, uncompressed (5.85 MB for a 4.4 MB log), beside its compressed text."""
    body = b"".join(b"line %d of a log, caf\xe9\n" % i for i in range(60000))
    sid, path, _saved = session_with_saved_output(tmp_path, body)
    home, thread, records = capture(sid, path)
    [whole] = [r for r in records if r["kind"] == cc_lhc.SAVED_OUTPUT]
    assert base64.b64decode(whole["raw_base64"]) == body  # (the export gives the bytes as they were)
    db = sqlite3.connect(home.path("threads", f"{thread}.sqlite"))
    try:
        (data,) = db.execute("SELECT data FROM messages WHERE kind = ?", (cc_lhc.SAVED_OUTPUT,)).fetchone()
    finally:
        db.close()
    assert len(data) * 5 < len(body), len(data)


def test_a_file_that_is_gone_is_a_counted_problem(tmp_path):
    sid, path, saved = session_with_saved_output(tmp_path, None)
    home, thread, records = capture(sid, path)
    assert [r["kind"] for r in records] == ["user_text", "tool_call", "tool_result", "assistant_text"]
    [(kind, detail)] = problems(home, thread)
    assert kind == "saved_output_unreadable" and str(saved) in detail and "toolu_big" in detail


def test_a_file_outside_the_sessions_folder_is_never_read(tmp_path):
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not for the thread")
    sid, path, _saved = session_with_saved_output(tmp_path, None, where=secret)
    home, thread, records = capture(sid, path)
    assert "not for the thread" not in json.dumps(records)
    [(kind, detail)] = problems(home, thread)
    assert kind == "saved_output_unreadable" and "tool-results" in detail


def test_real_cli_a_large_output_is_captured_whole(real_claude):
    rc = real_claude
    cmd = ("python3 -c \"[print(f'row {i} filler-filler-filler-filler') for i in range(6000)]; "
           f"print('{NEEDLE[:14]}' + '{NEEDLE[14:]}')\"")
    rc.api.script([tool_use_reply("Bash", {"command": cmd, "description": "a large output"}),
                   text_reply("saw it")])
    p = rc.run_lhc("-p", "run it", "--allowedTools", "Bash", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    [saved] = list((rc.project_dir / sid / "tool-results").iterdir())
    transcript = (rc.project_dir / f"{sid}.jsonl").read_text()
    assert NEEDLE not in transcript and "<persisted-output>" in transcript  # Claude kept a preview only
    [thread] = json.loads(rc.run_lhc("threads", "--json").stdout)
    records = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    [i] = [n for n, r in enumerate(records) if r["kind"] == cc_lhc.SAVED_OUTPUT]
    assert records[i - 1]["kind"] == "tool_result" and records[i]["text"].encode() == saved.read_bytes()
    label = records[i]["label"]
    found = rc.run_lhc("search", NEEDLE, "--all")
    assert found.returncode == 0 and label in found.stdout
    # a session written from the thread's view holds the preview, not the file
    new = str(uuid.uuid4())
    w = rc.run_lhc("rollout", "write", "--thread-id", thread["id"], "--session-id", new)
    assert w.returncode == 0, w.stderr
    rebuilt = (rc.project_dir / f"{new}.jsonl").read_text()
    assert "<persisted-output>" in rebuilt and NEEDLE not in rebuilt


def test_real_cli_a_subagents_large_output_is_captured_whole_too(real_claude):
    # a subagent's saved outputs go to its session's tool-results folder as well
    rc = real_claude
    big = (f"python3 -c \"[print(f'row {{i}} filler-filler-filler-filler') for i in range(6000)]; "
           f"print('{NEEDLE[:14]}' + '{NEEDLE[14:]}')\"")

    def reply(body):
        first = json.dumps(body["messages"][0])
        answered = any(b.get("type") == "tool_result" for m in body["messages"] if m["role"] == "user"
                       and isinstance(m["content"], list) for b in m["content"])
        if "look around please" in first and "spawn" not in first:       # the agent's own requests
            return text_reply("agent done") if answered else tool_use_reply("Bash", {"command": big,
                                                                                     "description": "big"})
        if answered:
            return text_reply("main done")
        return tool_use_reply("Agent", {"description": "look around", "prompt": "look around please",
                                        "subagent_type": "general-purpose", "run_in_background": False})
    rc.api.responder = reply
    p = rc.run_lhc("-p", "spawn an agent", "--allowedTools", "Agent", "Bash", "--output-format", "json",
                   timeout=120)
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    [saved] = list((rc.project_dir / sid / "tool-results").iterdir())
    [thread] = json.loads(rc.run_lhc("threads", "--json").stdout)
    assert thread["degraded"] is False
    records = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    [whole] = [r for r in records if r["kind"] == cc_lhc.SAVED_OUTPUT]
    assert whole.get("agent") and whole["text"].encode() == saved.read_bytes() and NEEDLE in whole["text"]


def test_a_long_turn_cut_in_parts_keeps_a_saved_output_with_the_result_that_previews_it(tmp_path):
    """Parts of a long turn are cut after a tool result: the whole output saved beside it
    goes in the same part, so the header never names it "verbatim" in a part of its own
    (it said m46-m56 verbatim while m46 was only named by the stub of m45)."""
    body = "".join(f"row {i}\n" for i in range(9000)).encode()
    sid, path, saved = session_with_saved_output(tmp_path, body)
    lines = path.read_bytes().splitlines(keepends=True)
    tail = Transcript(sid)
    for i in range(3):  # more calls in the same turn after the saved one
        tail.assistant({"type": "tool_use", "id": f"toolu_{i}", "name": "Bash", "input": {"command": f"c{i}"}},
                       stop="tool_use")
        tail.tool_result((f"toolu_{i}", "out " * 2000))
    tail.assistant(text("done"))
    path.write_bytes(b"".join(lines[:-1]) + tail.data())
    home, thread, records = capture(sid, path)
    store = cc_lhc.ThreadStore(home, thread)
    try:
        [turn] = cc_lhc.load_turns(store)
        parts = cc_lhc.turn_parts(turn, 10)  # (a soft size small enough to cut after each result)
        kinds = [[m["kind"] for m in p.messages] for p in parts]
        assert all(k[0] != cc_lhc.SAVED_OUTPUT for k in kinds), kinds
        [holding] = [k for k in kinds if cc_lhc.SAVED_OUTPUT in k]
        assert holding[holding.index(cc_lhc.SAVED_OUTPUT) - 1] == "tool_result"
    finally:
        store.close()


RSS_SCRIPT = r"""
import os, random, string, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], os.path.join(sys.argv[1], "tests")]
import cc_lhc
from test_capture_live import registered_thread
from test_saved_outputs import preview, session_with_saved_output
def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))
rnd = random.Random(1)
body = "".join(f"{i} {''.join(rnd.choices(string.ascii_letters, k=60))}\n" for i in range(330000)).encode()
tmp = Path(sys.argv[2])
if sys.argv[3] == "main":
    sid, path, saved = session_with_saved_output(tmp, body)
else:  # saved by a subagent: its file under <session>/subagents/ names it
    import json
    from test_capture_parse import Transcript, text
    sid, path, _saved = session_with_saved_output(tmp, b"small")
    saved = tmp / sid / "tool-results" / "agentbig.txt"
    saved.write_bytes(body)
    a = Transcript(sid)
    a.record({"type": "user", "message": {"role": "user", "content": "look"}})
    a.assistant({"type": "tool_use", "id": "toolu_ag", "name": "Bash", "input": {"command": "big"}}, stop="tool_use")
    a.tool_result(("toolu_ag", preview(str(saved))), toolUseResult={"stdout": "x", "persistedOutputPath": str(saved),
                                                                  "persistedOutputSize": len(body)})
    a.assistant(text("done"))
    agent = tmp / sid / "subagents" / "agent-abc.jsonl"
    agent.parent.mkdir(parents=True)
    agent.write_text("".join(json.dumps({**json.loads(line), "isSidechain": True, "agentId": "abc"}) + "\n"
                             for line in a.data().splitlines()))
del body
before = rss()
home, thread = registered_thread(sid)
cap = cc_lhc.Capture(home, thread, sid, str(path))
cap.catch_up()
(saved_outputs,) = cap.store.db.execute("SELECT count(*) FROM messages WHERE kind = ? AND length(text) > 0",
                                         (cc_lhc.SAVED_OUTPUT,)).fetchone()
after = rss()
cap.stop()
print(before, after, saved_outputs)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="/proc")
@pytest.mark.parametrize("by", ["main", "agent"])
def test_a_large_saved_output_does_not_leave_cc_lhc_holding_ten_times_its_size(tmp_path, by):
    """Capturing a 21 MB saved output took the process from 70 MB to 270 MB and left it
    there for the rest of the session: freed, but kept by the allocator (a subagent's, until
    the session's own transcript next got a line)."""
    import subprocess
    env = {**os.environ, "CC_LHC_HOME": str(tmp_path / "lhc")}
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(Path(cc_lhc.__file__).parent), str(tmp_path), by],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    before, after, saved_outputs = map(int, out.stdout.split())
    assert saved_outputs == (1 if by == "main" else 2)  # (the agent's, and the session's own small one)
    assert after - before < 80, (before, after)  # MB (200 more before it was given back)
