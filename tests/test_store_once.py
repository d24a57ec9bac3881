"""Each payload is stored once (large tool output compressed), and views are counted exactly.

Export, get-messages and search read what the transcript held, whether a row was written
in the stored-once form or by an older cc-lhc (text and block JSON both whole); views are
within their budget by exact o200k count, and the estimate used without the tokenizer
never counts fewer tokens than o200k on real CLI content.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import zlib
from pathlib import Path

import pytest

import cc_lhc
from test_search import hits_of, search
from test_views import Transcript, grant, intake_transcript, retrieve, text, thinking, tool_use

SAMPLES = Path(__file__).resolve().parent / "fixtures" / "samples"
NEEDLE = "qz-unique-needle-7731"


def _log(n: int) -> str:
    return "\n".join(f"{i:05d} worker-{i % 7} wrote block {i * 37 % 1009} in {i % 83} ms" for i in range(n))


@pytest.fixture
def big(tmp_path):
    """A thread whose tool outputs are large (compressed), small, and held in a list block."""
    tr = Transcript()
    tr.prompt("look at the logs")
    calls = tr.response(thinking("I will read the logs first, then the list output. " * 12),
                        tool_use("Bash", command="cat big.log", description="x" * 400),
                        tool_use("Bash", command="echo hi"),
                        stop="tool_use")
    tr.results((calls[1]["id"], _log(400) + f"\n{NEEDLE} at the end\n", False),
               (calls[2]["id"], "hi", False))
    calls = tr.response(tool_use("Read", file_path="/w/a.py"), stop="tool_use")
    tr.results((calls[0]["id"], [{"type": "text", "text": _log(300)}], False))
    tr.response(text("done"))
    return intake_transcript(tr, tmp_path)


def _export(capsys, thread) -> str:
    capsys.readouterr()
    assert cc_lhc.main(["export", thread.id]) == 0
    return capsys.readouterr().out


def test_each_payload_is_stored_once_and_large_output_compressed(big):
    rows = big.store.db.execute("SELECT kind, typeof(text), data FROM messages ORDER BY seq").fetchall()
    kinds = [(k, t) for k, t, _ in rows]
    assert ("tool_result", "blob") in kinds and ("tool_result", "text") in kinds
    for kind, _type, data in rows:
        if kind in ("tool_result", "thinking", "tool_call") and data and len(data) > 300:
            pytest.fail(f"{kind} block JSON holds its payload again: {data[:80]}")
    # every row reads back as the parser made it
    raw = big.store.db.execute(f"SELECT {', '.join(cc_lhc.MESSAGE_COLUMNS)} FROM messages").fetchall()
    for row in raw:
        m = cc_lhc.message_row(row)
        assert isinstance(m["text"], (str, type(None)))
        if m["data"]:
            json.loads(m["data"])


def test_a_message_read_back_puts_its_block_json_together_only_when_read_and_reads_whole(big):
    # A view reads every message but shows few as recorded blocks: the block JSON is
    # made when first read, and any way of reading the dict sees the whole row, in order.
    import copy
    import pickle
    raw = big.store.db.execute(f"SELECT {', '.join(cc_lhc.MESSAGE_COLUMNS)} FROM messages").fetchall()
    made = []
    real = cc_lhc.full_block_json
    for row in raw:
        eager = dict(zip(cc_lhc.MESSAGE_COLUMNS, row))
        eager["text"] = cc_lhc.stored_text(eager["text"])
        eager["data"] = real(eager["text"], eager["data"]) if eager["data"] else eager["data"]
        readers = [dict, lambda m: dict(m.items()), lambda m: {**m}, copy.copy, copy.deepcopy,
                   lambda m: json.loads(json.dumps(m)), lambda m: pickle.loads(pickle.dumps(m)),
                   lambda m: {k: m[k] for k in m}, lambda m: dict(zip(m.keys(), m.values())),
                   lambda m: {k: m.get(k) for k in cc_lhc.MESSAGE_COLUMNS}]
        for read in readers:
            m = cc_lhc.message_row(row)
            got = read(m)
            assert got == eager and list(got) == list(cc_lhc.MESSAGE_COLUMNS)
        m = cc_lhc.message_row(row)
        assert m == eager and eager == m and len(m) == len(eager) and "data" in m
        made.append(row)
    # built lazily: reading seq and text alone builds no block JSON
    calls = []
    cc_lhc.full_block_json = lambda t, d: calls.append(1) or real(t, d)
    try:
        for row in raw:
            m = cc_lhc.message_row(row)
            m["seq"], m["text"], m.get("kind")
        assert calls == []
        assert [cc_lhc.message_row(r)["data"] for r in raw] and calls
    finally:
        cc_lhc.full_block_json = real
    assert made


def test_export_is_byte_exact_for_stored_once_and_older_rows(big, capsys):
    now = _export(capsys, big)
    # The same thread as an older cc-lhc wrote it: text plain, block JSON whole.
    db = big.store.db
    rows = db.execute("SELECT seq, text, data FROM messages").fetchall()
    with cc_lhc.Tx(db):
        for seq, stored, data in rows:
            plain = cc_lhc.stored_text(stored)
            db.execute("UPDATE messages SET text = ?, data = ? WHERE seq = ?",
                       (plain, cc_lhc.full_block_json(plain, data), seq))
    assert db.execute("SELECT count(*) FROM messages WHERE typeof(text) = 'blob' "
                      "OR data LIKE '%cc-lhc:%'").fetchone()[0] == 0
    assert _export(capsys, big) == now
    exported = json.loads(now)
    outputs = [r["output"] for r in exported if r["kind"] == "tool_result"]
    assert outputs[0].endswith(f"{NEEDLE} at the end\n") and outputs[1] == "hi"
    assert outputs[2] == [{"type": "text", "text": _log(300)}]


def _two_big_outputs(tmp_path):
    tr = Transcript()
    tr.prompt("read both logs")
    calls = tr.response(tool_use("Bash", command="cat a.log"), tool_use("Bash", command="cat b.log"),
                        stop="tool_use")
    outputs = (_log(300) + "\nfirst\n", _log(350) + "\nsecond\n")
    tr.results((calls[0]["id"], outputs[0], False), (calls[1]["id"], outputs[1], False))
    tr.response(text("done"))
    return tr, tr.write(tmp_path / f"{tr.session_id}.jsonl"), outputs


def test_capture_compresses_large_output_on_a_worker_thread(tmp_path, monkeypatch):
    """zlib lets go of the GIL: capture hands large outputs to a worker while it parses on,
    and the store keeps exactly what compressing in line keeps."""
    import threading
    tr, path, outputs = _two_big_outputs(tmp_path)
    where = []
    inline = cc_lhc._compressed
    monkeypatch.setattr(cc_lhc, "_compressed",
                        lambda t: where.append(threading.current_thread().name) or inline(t))
    thread = intake_transcript(tr, tmp_path)
    # Each output is compressed once: on the worker, or by the store when the worker had
    # not started on it yet (which thread wins depends on scheduling under load).
    assert len(where) == 2 and set(where) <= {"cc-lhc-pack", threading.main_thread().name}
    assert "cc-lhc-pack" in where or os.cpu_count() == 1 or os.getloadavg()[0] > 1
    stored = thread.store.db.execute("SELECT text FROM messages WHERE kind = 'tool_result' "
                                     "ORDER BY seq").fetchall()
    assert [r[0] for r in stored] == [inline(o) for o in outputs]
    assert [zlib.decompress(r[0]).decode() for r in stored] == list(outputs)
    assert not [t for t in threading.enumerate() if t.name == "cc-lhc-pack"]


def test_a_compression_that_fails_on_the_worker_stores_nothing_of_its_batch(tmp_path, monkeypatch):
    import threading
    _tr, path, outputs = _two_big_outputs(tmp_path)
    inline = cc_lhc._compressed

    def failing(t):
        if t == outputs[1]:
            raise MemoryError("no room to compress")
        return inline(t)

    monkeypatch.setattr(cc_lhc, "_compressed", failing)
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    cap = cc_lhc.Capture(home, "thread-1", "s", str(path))
    with pytest.raises(MemoryError):
        cap.catch_up()
    assert cap.store.source("s")["offset"] == 0
    assert cap.store.db.execute("SELECT count(*) FROM messages").fetchone()[0] == 0
    assert not [t for t in threading.enumerate() if t.name == "cc-lhc-pack"]
    monkeypatch.setattr(cc_lhc, "_compressed", inline)
    assert cap.catch_up() == len(path.read_bytes().splitlines())
    assert cap.store.source("s")["offset"] == path.stat().st_size
    cap.stop()


def test_a_block_holding_marker_like_text_is_kept_whole():
    marker = cc_lhc.PAYLOAD_AS_STRING
    for block, payload in (
            ({"tool_use_id": marker, "type": "tool_result", "content": "a" * 400}, "a" * 400),
            ({"tool_use_id": "t", "type": "tool_result", "content": marker * 40}, marker * 40),
            ({"tool_use_id": "t", "type": "tool_result", "content": [{"type": "text", "text": "b"},
                                                                    {"type": "text", "text": marker}]},
             "b\n" + marker)):
        stored = cc_lhc._result_json_once(block, payload)
        assert cc_lhc.full_block_json(payload, stored) == cc_lhc._dump(block)


def test_compressed_output_round_trips_through_get_messages_and_search(big, monkeypatch, capsysbinary):
    seq = big.store.db.execute("SELECT seq FROM messages WHERE typeof(text) = 'blob' ORDER BY seq").fetchone()[0]
    packed = big.store.db.execute("SELECT text FROM messages WHERE seq = ?", (seq,)).fetchone()[0]
    grant(big, monkeypatch)
    body, _ = retrieve(capsysbinary, "get-messages", f"m{seq}")
    assert zlib.decompress(packed).decode() in body.decode()
    status, out, _ = search(capsysbinary, NEEDLE)
    assert status == 0 and [h["seq"] for h in hits_of(out)][:1] == [str(seq)]
    status, out, _ = search(capsysbinary, "worker-3 wrote block")  # the word index reads it too
    assert status == 0 and f"m{seq}" in out


def test_an_older_thread_is_migrated_and_its_word_index_refilled(big, monkeypatch, capsysbinary):
    db = big.store.db
    assert db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_fts'").fetchone()[0].count(
        "messages_plain") == 1
    # A thread from before: the word index read the messages table itself.
    names = [n for n, _ in cc_lhc.THREAD_MIGRATIONS]
    before = names.index("008_payload_once")
    db.execute("DROP TABLE messages_fts")
    db.execute("DROP VIEW messages_plain")
    db.execute("CREATE VIRTUAL TABLE messages_fts USING fts5 (text, content='messages', content_rowid='seq')")
    # and its kept lines were filed by their bytes' hash alone
    db.execute("DROP TABLE raw_lines")
    db.execute("CREATE TABLE raw_lines (session TEXT, sha256 TEXT, line INTEGER, offset INTEGER, reason TEXT, "
               "raw BLOB, created TEXT, PRIMARY KEY (session, sha256))")
    db.execute("INSERT INTO raw_lines VALUES ('s', 'ab', 7, 700, 'malformed_line', x'7b78', 'then')")
    db.executemany("DELETE FROM migrations WHERE name = ?", [(n,) for n in names[before:]])
    db.execute(f"PRAGMA user_version = {before}")
    big.store.close()
    grant(big, monkeypatch)
    monkeypatch.setattr(cc_lhc, "INDEX_CHUNK_ROWS", 2)  # refilled a few messages a transaction
    status, out, _ = search(capsysbinary, "worker-5 wrote block")
    assert status == 0 and hits_of(out)
    store = cc_lhc.ThreadStore(big.home, big.id)
    top = store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    assert store.db.execute("SELECT value FROM meta WHERE key = 'fts_upto'").fetchone() == (str(top),)
    assert store.db.execute("SELECT count(*) FROM messages_fts WHERE messages_fts MATCH 'wrote'").fetchone()[0] == \
        store.db.execute("SELECT count(*) FROM messages WHERE text IS NOT NULL AND lhc_text(text) LIKE '%wrote%'").fetchone()[0]
    assert store.db.execute("SELECT session, line, offset, raw FROM raw_lines").fetchall() == [("s", 7, 700, b"{x")]
    store.keep_raw_line("s", 9, 900, "malformed_line", b"{x")  # the same bytes elsewhere: a row of its own
    assert store.db.execute("SELECT count(*) FROM raw_lines").fetchone()[0] == 2
    store.close()


@pytest.fixture
def exact_tokens():
    counter = cc_lhc.TokenCounter()
    counter.encoding()
    if not counter.exact:
        pytest.skip(f"needs the o200k_base tokenizer: {counter.reason}")
    return counter


def _ids_of(m) -> str:
    """What a block holds besides its text: a call's id and name, a result's id."""
    if m["kind"] == "tool_call":
        return f"{m['tool_use_id']} {m['tool_name']}"
    return m["tool_use_id"] or "" if m["kind"] == "tool_result" else ""


def test_views_are_within_budget_by_exact_count(tmp_path, exact_tokens):
    # Content denser than 4 bytes a token (numbers, listings): the quick estimate undercounts it.
    tr = Transcript()
    for i in range(24):
        tr.prompt(f"step {i}")
        calls = tr.response(tool_use("Bash", command=f"ls -la /srv/{i}"), stop="tool_use")
        tr.results((calls[0]["id"], _log(60 + i * 7), False))
        tr.response(text(f"step {i} done: " + " ".join(str(i * j) for j in range(80))))
    thread = intake_transcript(tr, tmp_path)
    turns = cc_lhc.load_turns(thread.store)
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    counter = cc_lhc.ViewCounter(exact_tokens)
    over = []
    for budget in (2_000, 6_000, 15_000):
        view, header = cc_lhc.serve_view(thread.id, turns, budget, "default", summaries, counter=counter)
        exact = exact_tokens.count(header) + exact_tokens.count(cc_lhc.VIEW_CLOSING_TEXT) + cc_lhc.MESSAGE_TOKENS
        for t in turns:
            notes, items = cc_lhc.turn_items(view, t)
            exact += sum(exact_tokens.count(note) + cc_lhc.MESSAGE_TOKENS for _at, note in notes)
            exact += sum(exact_tokens.count(stub if stub is not None else (m["text"] or m["data"] or ""))
                         + exact_tokens.count(_ids_of(m)) + cc_lhc.MESSAGE_TOKENS for m, stub in items)
        assert view.tokens == exact <= budget, (budget, exact)
        assert view.counting == "exact o200k_base"
        # allocated by the quick estimate alone, the same view counts over its budget
        quick, quick_header = cc_lhc._serve_view(thread.id, turns, budget, "default", summaries, (), False, 0)
        over.append(cc_lhc.view_tokens(quick, quick_header, turns, counter)["total"] > budget)
    assert any(over)


def _real_cli_texts():
    """Every payload of the real CLI's sample transcripts, and each whole line."""
    out = []
    for path in sorted(SAMPLES.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            out.append(line)
            content = (json.loads(line).get("message") or {}).get("content")
            for block in content if isinstance(content, list) else [{"type": "text", "text": content}]:
                if not isinstance(block, dict):
                    continue
                value = {"tool_result": lambda: cc_lhc.flatten_tool_output(block.get("content")),
                         "tool_use": lambda: cc_lhc._dump(block.get("input")),
                         "text": lambda: block.get("text"),
                         "thinking": lambda: block.get("thinking")}.get(block.get("type"), lambda: None)()
                if isinstance(value, str) and value:
                    out.append(value)
    # what dense tool output looks like: a long listing, numbered file lines, JSON
    out.append("\n".join(f"-rw-r--r-- 1 root root {i * 977 % 65536:6d} Dec  1 08:{i % 60:02d} f{i}.py"
                         for i in range(300)))
    out.append("\n".join(f"{i:6d}\t    return self._x{i}[{i}]" for i in range(1, 400)))
    out.append(json.dumps({f"k{i}": [i, i * 2, None, True] for i in range(300)}))
    out.append("\n".join(f"{uuid.UUID(int=i * 7919 << 64 | i)} {hashlib.sha1(bytes([i])).hexdigest()} ok"
                         for i in range(200)))  # ids and hashes: the densest output seen
    return out


def test_the_safe_estimate_never_undercounts_real_cli_content(exact_tokens):
    texts = _real_cli_texts()
    assert len(texts) > 50
    short = [(exact_tokens.count(t), cc_lhc.safe_estimate(t), t[:60]) for t in texts
             if cc_lhc.safe_estimate(t) < exact_tokens.count(t)]
    assert short == []


def _dense_texts():
    """Text o200k cuts finer than prose: what tool output holds besides prose and code."""
    import base64
    import random
    import string
    rnd = random.Random(5)

    def chars(alphabet, n):
        return "".join(rnd.choice(alphabet) for _ in range(n))

    def code_points(lo, hi, n):
        return "".join(chr(rnd.randint(lo, hi)) for _ in range(n))
    return {
        "base64": base64.b64encode(rnd.randbytes(3000)).decode(),
        "base64 lines": "\n".join(base64.urlsafe_b64encode(rnd.randbytes(57)).decode() for _ in range(40)),
        "hex": chars("0123456789abcdef", 2000), "HEX": chars("0123456789ABCDEF", 2000),
        "hexdump": "\n".join(" ".join(f"{rnd.getrandbits(8):02x}" for _ in range(16)) for _ in range(60)),
        "uuids": " ".join(str(uuid.UUID(int=rnd.getrandbits(128))) for _ in range(100)),
        "hashes": "\n".join(f"{rnd.getrandbits(160):040x}  file{i}.py" for i in range(60)),
        "random lower": chars(string.ascii_lowercase, 2000), "random upper": chars(string.ascii_uppercase, 2000),
        "random alnum": chars(string.ascii_letters + string.digits, 2000),
        "random printable": chars(string.printable[:94], 2000), "digits": chars(string.digits, 2000),
        "controls": chars("".join(map(chr, range(32))), 1000), "signs": chars("!@#$%^&*()_+{}|:<>?\n", 1000),
        "whitespace": chars(" \t\n\r\x0b\x0c", 2000), "capitals": "ZZZZZZZZZ QQQQQQQQQ XJXJXJXJ " * 20,
        "cjk common": code_points(0x4E00, 0x9FFF, 300), "cjk rare": code_points(0x3400, 0x4DBF, 200),
        "cjk ext b": code_points(0x20000, 0x2A6DF, 200), "hangul": code_points(0xAC00, 0xD7A3, 200),
        "emoji": code_points(0x1F300, 0x1FAFF, 200), "latin extended": code_points(0x100, 0x24F, 500),
        "c1 controls": code_points(0x80, 0x9F, 500), "arabic": code_points(0x600, 0x6FF, 500),
        "marks": "".join("a" + code_points(0x300, 0x36F, 3) for _ in range(300)),
        "dna": chars("acgt", 8000), "dna lines": "\n".join(chars("acgt", 60) for _ in range(130)),
        "random words": " ".join(chars(string.ascii_lowercase, rnd.randint(8, 23)) for _ in range(400)),
        "consonant words": " ".join(chars("bcdfghjklmnpqrstvwxz", rnd.randint(4, 12)) for _ in range(600)),
        # random names in the shapes identifiers take (a capital, then small letters; glued
        # CamelCase; snake_case; paths; short words one per line; tab-indented short words):
        # o200k cuts them one to three letters a token, where prose and code take a word a token
        **{f"{name} ({n} bytes)": make(n) for n in (24, 60, 400, 6000) for name, make in {
            "Abb": lambda n: "".join(chars(string.ascii_uppercase, 1) + chars(string.ascii_lowercase, 2)
                                     for _ in range(n // 3)),
            "AAAbb": lambda n: "".join(chars(string.ascii_uppercase, 3) + chars(string.ascii_lowercase, 2)
                                       for _ in range(n // 5)),
            "camel": lambda n: "".join(chars(string.ascii_uppercase, 1) + chars(string.ascii_lowercase, rnd.randint(2, 7))
                                       for _ in range(n // 5)),
            "snake": lambda n: "_".join(chars(string.ascii_lowercase, rnd.randint(3, 9)) for _ in range(n // 6)),
            "paths": lambda n: "/".join(chars(string.ascii_lowercase + "_-.", rnd.randint(2, 12)) for _ in range(n // 8)),
            "word lines": lambda n: "\n".join(chars(string.ascii_lowercase, rnd.randint(2, 9)) for _ in range(n // 6)),
            "tab lines": lambda n: "".join("\t" * rnd.randint(1, 6) + chars(string.ascii_lowercase, rnd.randint(1, 4))
                                           + "\n" for _ in range(n // 6)),
            "lower digits": lambda n: chars(string.ascii_lowercase + string.digits, n)}.items()},
    }


def test_the_safe_estimate_never_undercounts_dense_text(exact_tokens):
    """Without the tokenizer, views are fitted by the safe estimate: base64, ids, hashes,
    random letters, controls and characters beyond ASCII must not count short (the
    estimate by bytes and pieces alone gave 0.45-0.65 of o200k on them)."""
    short = {name: (cc_lhc.safe_estimate(text), exact_tokens.count(text))
             for name, text in _dense_texts().items()
             if cc_lhc.safe_estimate(text) < exact_tokens.count(text)}
    assert short == {}


def test_the_safe_estimate_of_fuzzed_text_is_short_at_most_once_in_thousands(exact_tokens):
    import random
    import string
    from test_tokenizer import fuzz_texts
    rnd = random.Random(3)
    alphabets = [string.ascii_letters, string.digits, string.punctuation, " \t\n", string.hexdigits,
                 "ñéüßøåΩЖ中文日本語한국어", "🙂🚀✨", string.ascii_uppercase]
    texts = fuzz_texts(11, 1500) + ["".join(rnd.choice(rnd.choice(alphabets)) for _ in range(rnd.randint(1, 300)))
                                    for _ in range(1500)]
    short = [(cc_lhc.safe_estimate(t), exact_tokens.count(t), t[:40]) for t in texts
             if cc_lhc.safe_estimate(t) < exact_tokens.count(t)]
    assert len(short) <= 2 and all(est >= 0.85 * exact for est, exact, _t in short), short


def test_carried_file_state_and_the_closing_record_stay_within_the_target(tmp_path, exact_tokens):
    """Reads whose paths and ids are all hashes (2 bytes a token, not 4) are carried into
    the rebuilt session; the view is fitted around their exact count, so view and pairs
    together stay within the target (measure says so too)."""
    import random
    import string
    rnd = random.Random(7)

    def b62(n):
        return "".join(rnd.choice(string.ascii_letters + string.digits) for _ in range(n))
    tr = Transcript()
    for t in range(30):
        tr.prompt(f"read file {t}")
        path = f"/home/u/proj/.cache/{rnd.getrandbits(128):032x}/{b62(12)}_{rnd.getrandbits(64):016x}.json"
        (call,) = tr.response({"type": "tool_use", "name": "Read", "id": "toolu_01" + b62(22),
                               "input": {"file_path": path}}, stop="tool_use")
        tr.results((call["id"], '1\t{"k": "' + b62(60) + '"}', False))
        tr.response(text("ok"))
    words = "the parser reads each record and the cache keeps the view within its budget".split()
    for t in range(60):
        tr.prompt(f"question {t}: " + " ".join(rnd.choice(words) for _ in range(900)))
        tr.response(text(" ".join(rnd.choice(words) for _ in range(300))))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    for target in (10_000, 20_000, 40_000):
        row = cc_lhc.measure_transcript(str(path), "default", target)
        assert row["carried_file_state_tokens"] > 0
        assert row["smart_compact_tokens"] <= target and row["view_within_target"], (target, row)


def test_an_image_counts_what_its_pixels_cost_not_its_base64(tmp_path):
    """A screenshot a tool gave back is served whole and costs up to IMAGE_TOKENS (it was
    counted as the word "[image]"); a pasted one is not counted as its base64 (tens of
    thousands of tokens, which pushed its turn out of view)."""
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": "iVBORw0KGgo" + "A" * 200_000}}
    tr = Transcript()
    tr._record("user", message={"role": "user", "content": [{"type": "text", "text": "what is on this screen?"},
                                                            picture]})
    (call,) = tr.response(tool_use("Read", file_path="/srv/screen.png"), stop="tool_use")
    tr.results((call["id"], [{"type": "text", "text": "the screenshot:"}, picture], False))
    tr.response(text("a login form"))
    thread = intake_transcript(tr, tmp_path)
    turns = cc_lhc.load_turns(thread.store)
    (turn,) = turns
    view, _header = cc_lhc.serve_view(thread.id, turns, 20_000, "default", {})
    assert view.bands[turn.n] == "full"
    assert 2 * cc_lhc.IMAGE_TOKENS < view.tokens < 2 * cc_lhc.IMAGE_TOKENS + 1_000
    assert 2 * cc_lhc.IMAGE_TOKENS <= cc_lhc.band_cost(turn, "full") < 2 * cc_lhc.IMAGE_TOKENS + 1_000


def test_a_tool_outputs_document_is_counted_and_a_markdown_image_link_is_no_image(tmp_path, exact_tokens):
    """A document block an MCP tool gave back is served whole: its text is counted (it was
    the word "[document]"). "[image]" in an output's own text (a Markdown link) is text,
    not a picture of 1,600 tokens."""
    document = "escalate to the on-call lead after fifteen minutes; page the backup after thirty. " * 200
    tr = Transcript()
    tr.prompt("what does the runbook say?")
    calls = tr.response(tool_use("mcp__docs__fetch", page="runbook"), tool_use("Read", file_path="/srv/README.md"),
                        stop="tool_use")
    tr.results((calls[0]["id"], [{"type": "text", "text": "the runbook:"},
                                 {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                                                 "data": document}}], False),
               (calls[1]["id"], "![image](https://example.com/a.png)\n" * 20, False))
    tr.response(text("escalate after fifteen minutes"))
    thread = intake_transcript(tr, tmp_path)
    turns = cc_lhc.load_turns(thread.store)
    view, _header = cc_lhc.serve_view(thread.id, turns, 60_000, "default", {},
                                      counter=cc_lhc.ViewCounter(exact_tokens))
    assert view.bands[turns[0].n] == "full"
    assert exact_tokens.count(document) < view.tokens < exact_tokens.count(document) + 1_500


def test_measure_says_both_counts_under_its_table(exact_tokens, capsys):
    """With the tokenizer, measure's table is in exact tokens; the line under it gives the
    session and the same view by the safe estimate, as --json does."""
    sample = Path(__file__).parent / "fixtures" / "samples" / "02_tool_roundtrip_thinking.jsonl"
    assert cc_lhc.main(["measure", str(sample), "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["sessions"][0]["estimate"]
    assert cc_lhc.main(["measure", str(sample)]) == 0
    out = capsys.readouterr().out
    assert (f"the safe estimate used without the tokenizer counts it {estimate['tokens']:,} tokens and this "
            f"view {estimate['smart_compact_tokens']:,}") in out
    folder = Path(__file__).parent / "fixtures" / "samples"  # (several sessions: one line for them all)
    assert cc_lhc.main(["measure", str(folder), "--json"]) in (0, 1)
    sessions = json.loads(capsys.readouterr().out)["sessions"]
    cc_lhc.main(["measure", str(folder)])
    out = capsys.readouterr().out
    assert out.count("the safe estimate used without the tokenizer counts") == 1
    assert f"counts these sessions {sum(r['estimate']['tokens'] for r in sessions):,} tokens" in out


def test_weighing_a_thread_for_a_view_puts_no_text_messages_block_json_together(tmp_path, monkeypatch):
    """A stored message's block JSON is put together from its text only when something reads
    it: weighing every turn of a long thread for a view (cutting parts, testing a message,
    summarising, the model-written summaries read in one query) reads only a tool call's,
    whose size is its JSON. Putting every message's together made a view of 20,000 turns
    a second slower."""
    tr = Transcript()
    for i in range(6):
        tr.prompt(f"question {i}")
        tr.response(text(f"answer {i}"))
    tr.prompt("list it")
    (call,) = tr.response(tool_use("Bash", command="ls"), stop="tool_use")
    tr.results((call["id"], "a\nb", False))
    tr.response(text("two files"))
    thread = intake_transcript(tr, tmp_path)
    turns = cc_lhc.load_turns(thread.store)
    assembled = []
    real = cc_lhc.StoredMessage.__missing__
    monkeypatch.setattr(cc_lhc.StoredMessage, "__missing__",
                        lambda self, key: assembled.append(dict.get(self, "kind")) or real(self, key))
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    for t in turns:
        cc_lhc.turn_parts(t, 10_000)
        assert all(m for m in t.messages)
    assert set(assembled) <= {"tool_call"}
    assert summaries[turns[0].n] == (cc_lhc.extractive_summary(turns[0].messages), "extractive")


def _screenshots_turn(tr, count):
    picture = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                           "data": "iVBORw0KGgo" + "B" * 4_000}}
    tr.prompt(f"NEWEST: read {count} screenshots")
    for i in range(count):
        (call,) = tr.response(tool_use("Read", file_path=f"/srv/shot{i}.png"), stop="tool_use")
        tr.results((call["id"], [picture], False))
    tr.response(text("NEWEST-ANSWER: all of them read"))


def test_a_long_turn_of_images_is_cut_by_what_they_weigh_and_its_newest_ones_are_served(tmp_path):
    """A turn that reads 130 screenshots (each output's text only "[image]", each image
    1,600 tokens): capture closes its segments by the images' weight, and Smart Compact's
    view at the default target holds its newest outputs verbatim, images included, the
    older ones as stubs that say an image is there. It summarised the whole turn (839 of
    180,000 tokens served), every segment and stub weighing the seven bytes of "[image]"."""
    tr = Transcript()
    tr.prompt("old prompt")
    tr.response(text("old answer"))
    _screenshots_turn(tr, 130)
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    newest = turns[-1]
    assert len({m["segment"] for m in newest.messages}) > 2
    plan = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, cc_lhc.resolve_policy([]),
                               str(uuid.uuid4()), "/home/u/proj", projects_root=str(tmp_path / "p"))
    records = [json.loads(line) for line in plan.data.decode().splitlines()]
    results = [b for r in records if r.get("type") == "user" and isinstance(r["message"]["content"], list)
               for b in r["message"]["content"] if b.get("type") == "tool_result"]
    pictures = [b for b in results if isinstance(b["content"], list)
                and any(part.get("type") == "image" for part in b["content"])]
    stubs = [b["content"] for b in results if isinstance(b["content"], str)]
    assert "NEWEST-ANSWER" in plan.data.decode()
    assert 50 <= len(pictures) < 130 and len(pictures) + len(stubs) == 130
    assert all(", 1 image · cc-lhc get-messages m" in stub for stub in stubs)
    assert results[-1] in pictures  # the newest output is verbatim
    assert 100_000 < plan.view.tokens <= cc_lhc.resolve_policy([]).effective_target


def test_a_short_output_holding_an_image_is_stubbed_in_lean(tmp_path):
    """The lean band keeps a short output as it is; one holding an image is not short."""
    tr = Transcript()
    _screenshots_turn(tr, 1)
    thread = intake_transcript(tr, tmp_path)
    (turn,) = thread.turns
    lean = dict((m["kind"], stub) for m, stub in cc_lhc.visible_messages(turn, "lean"))
    assert lean["tool_result"].startswith("[output of Read m") and ", 1 image · " in lean["tool_result"]
    assert cc_lhc.band_cost(turn, "lean") < cc_lhc.IMAGE_TOKENS < cc_lhc.band_cost(turn, "full")
