"""Capture, part 2: live, killed, corrupted, torn.

The randomized test appends a large transcript in random chunks (cutting lines anywhere,
UTF-8 sequences included) while capture runs, in this process or in one that is SIGKILLed
at random moments, and proves the record equals a one-shot read of the final file.
"""

from __future__ import annotations

import bisect
import io
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path

import pytest

import cc_lhc
from conftest import REPO
from test_capture_parse import Transcript, text

SESSION = "11111111-2222-4333-8444-555555555555"
THREAD = "thread-under-test"
# soft size 2200 bytes: long turns get cut into segments, so restarts must get that right too
POLICY = {"lowerBoundTokens": 2000, "profile": "default"}

# A capture process for the randomized test. BATCH_BYTES is made small so one read is many
# transactions; with die_at > 0 it SIGKILLs itself just before its die_at-th write statement
# (BEGIN, INSERT, UPDATE or COMMIT), which puts kills inside and between transactions.
CAPTURE_LOOP = r"""
import json, os, signal, sys, time
sys.path.insert(0, sys.argv[1])
import cc_lhc
home, thread, session, path, policy, batch, die_at = sys.argv[2:9]
cc_lhc.Capture.BATCH_BYTES = int(batch)
cap = cc_lhc.Capture(cc_lhc.StateHome(home), thread, session, path, json.loads(policy))
cap._open()
writes = 0
def trace(sql):
    global writes
    if sql.lstrip().split(None, 1)[0].upper() in ("BEGIN", "INSERT", "UPDATE", "COMMIT"):
        writes += 1
        if writes == int(die_at):
            os.kill(os.getpid(), signal.SIGKILL)
cap.store.db.set_trace_callback(trace)
while True:
    cap.catch_up()
    time.sleep(0.001)
"""


# -- helpers ------------------------------------------------------------------------------

def wait_for(condition, timeout: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.005)


def big_transcript(seed: int, size_mb: float) -> bytes:
    """A realistic transcript from scripts/gen_transcript.py: thinking, tools, bookkeeping,
    native compactions, non-ASCII text."""
    import tempfile
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from gen_transcript import generate
    finally:
        sys.path.remove(str(REPO / "scripts"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "big.jsonl")
        generate(path, size_mb=size_mb, seed=seed, thinking=True, compact_every=4)
        return Path(path).read_bytes()


def append_chunk(path: Path, data: bytes, pos: int, rng: random.Random, multibyte: list) -> int:
    """Append data[pos:end] for a random end: tiny, medium or large, sometimes mid-UTF-8."""
    roll = rng.random()
    if roll < 0.25 and multibyte:
        i = bisect.bisect_right(multibyte, pos + rng.randint(1, 4096))
        end = multibyte[i] if i < len(multibyte) else len(data)  # lands inside a character
    elif roll < 0.45:
        end = pos + rng.randint(1, 16)
    elif roll < 0.94:
        end = pos + rng.randint(17, 16384)
    else:
        end = pos + rng.randint(16385, 200_000)
    end = min(end, len(data))
    with open(path, "ab") as f:
        f.write(data[pos:end])
    return end


def snapshot(store: cc_lhc.ThreadStore) -> dict:
    """Everything capture decides, minus wall-clock stamps of our own."""
    db = store.db
    q = lambda sql: db.execute(sql).fetchall()  # noqa: E731
    return {
        "messages": q("SELECT * FROM messages ORDER BY seq"),
        "turns": q("SELECT * FROM turns ORDER BY n"),
        "segments": q("SELECT * FROM segments ORDER BY turn, idx"),
        "usage": q("SELECT * FROM usage ORDER BY response_id"),
        "chain": q("SELECT * FROM chain ORDER BY session, uuid"),
        "problems": q("SELECT session, line, offset, kind, detail FROM problems ORDER BY id"),
        "telemetry": q("SELECT * FROM telemetry ORDER BY session, type"),
        "source": q("SELECT session_id, start_offset, offset, lines, degraded FROM sources"),
    }


def exported(store: cc_lhc.ThreadStore) -> list[dict]:
    return [cc_lhc.export_record(m) for m in store.messages()]


def one_shot(tmp: Path, data: bytes, name: str = "oneshot"):
    path = tmp / f"{name}.jsonl"
    path.write_bytes(data)
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp / name), THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    result = snapshot(cap.store), exported(cap.store), list(cap.store.messages())
    cap.stop()
    return result


def spawn_capture(home: Path, path: Path, batch: int, die_at: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CAPTURE_LOOP, str(REPO), str(home), THREAD,
                             SESSION, str(path), json.dumps(POLICY), str(batch), str(die_at)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def read_count(db_path: Path, sql: str, args=()) -> int:
    if not db_path.exists():
        return 0
    con = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return con.execute(sql, args).fetchone()[0]
    except sqlite3.OperationalError:  # tables not created yet
        return 0
    finally:
        con.close()


def captured_offset(home_dir: Path) -> int:
    """The byte offset the record has reached, read from outside the capture process."""
    return read_count(home_dir / "threads" / f"{THREAD}.sqlite",
                      "SELECT coalesce(max(offset), 0) FROM sources WHERE session_id = ?", (SESSION,))


def run_main(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        status = cc_lhc.main(list(argv))
    return status, out.getvalue()


# -- 1. the randomized test --------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_chunks_kills_and_restarts_equal_a_one_shot_parse(tmp_path, seed):
    data = big_transcript(seed, size_mb=1.5)
    want, want_export, _ = one_shot(tmp_path, data)
    assert len(want["messages"]) > 100 and want["problems"] == []
    assert any(t[1] == "compact_summary" for t in want["turns"])
    assert any(s[4] == "soft_size" for s in want["segments"])
    multibyte = [i for i, b in enumerate(data) if 0x80 <= b < 0xC0]  # continuation bytes
    assert multibyte

    rng = random.Random(seed)
    home_dir = tmp_path / "lhc"
    home = cc_lhc.StateHome(home_dir)
    path = tmp_path / "live.jsonl"
    path.write_bytes(b"")
    pos = kills = self_kills = restarts = 0
    while pos < len(data):
        if rng.random() < 0.4:
            # in-process live capture, stopped the way cc-lhc stops it when Claude exits
            cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
            cap.start()
            for _ in range(rng.randint(1, 10)):
                pos = append_chunk(path, data, pos, rng, multibyte)
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 0.01)
            cap.stop()
            assert cap.error is None, cap.error
            restarts += 1
        else:
            # a separate capture process, SIGKILLed wherever it happens to be: by us at a
            # random moment, or by itself at a random write statement
            die_at = rng.choice([0, rng.randint(1, 40), rng.randint(1, 40)])
            proc = spawn_capture(home_dir, path, rng.choice([512, 4096, 65536, 8 << 20]), die_at)
            try:
                for _ in range(rng.randint(0, 10)):
                    pos = append_chunk(path, data, pos, rng, multibyte)
                    time.sleep(rng.random() * 0.01)
                if die_at:  # until it dies, or has read all there is without dying
                    done = data[:pos].rfind(b"\n") + 1
                    wait_for(lambda: proc.poll() is not None or captured_offset(home_dir) == done,
                             timeout=30, what="the capture process to die or catch up")
                    self_kills += proc.poll() is not None
                else:
                    time.sleep(rng.random() * 0.08)
            finally:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGKILL)
                _, err = proc.communicate(timeout=30)
            assert proc.returncode == -signal.SIGKILL, err.decode()
            kills += 1
    print(f"seed {seed}: {kills} kills ({self_kills} inside capture's own writes), "
          f"{restarts} live captures stopped")
    assert kills >= 2 and self_kills >= 1 and restarts >= 1
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    got, got_export = snapshot(cap.store), exported(cap.store)
    # the search index has caught up with everything that was stored
    top = cap.store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    fts_upto = cap.store.db.execute("SELECT value FROM meta WHERE key = 'fts_upto'").fetchone()
    cap.stop()
    assert path.read_bytes() == data
    assert got_export == want_export
    for key in want:
        assert got[key] == want[key], key
    assert fts_upto is not None and int(fts_upto[0]) == top


KILLED_BEFORE_INDEXING = r"""
import os, signal, sys
sys.path.insert(0, sys.argv[1])
import cc_lhc
cap = cc_lhc.Capture(cc_lhc.StateHome(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5])
cap._open()
cap.store.db.set_trace_callback(
    lambda sql: "messages_fts" in sql and os.kill(os.getpid(), signal.SIGKILL))
cap.catch_up()
"""


def test_a_kill_between_storing_and_indexing_is_made_good_on_the_next_run(tmp_path):
    """Search must see every captured message, even when the run that stored them died
    before it indexed them and nothing new was written since."""
    t = Transcript(SESSION)
    t.user("findable needle prompt")
    t.assistant(text("an answer with a haystack"))
    path = t.write(tmp_path / "t.jsonl")
    home_dir = tmp_path / "lhc"
    proc = subprocess.run([sys.executable, "-c", KILLED_BEFORE_INDEXING, str(REPO), str(home_dir),
                           THREAD, SESSION, str(path)], capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    cap = cc_lhc.Capture(cc_lhc.StateHome(home_dir), THREAD, SESSION, str(path))
    assert cap.catch_up() == 0  # everything was stored already
    hits = cap.store.db.execute("SELECT rowid FROM messages_fts WHERE messages_fts MATCH 'needle OR haystack'"
                                ).fetchall()
    cap.stop()
    assert sorted(hits) == [(1,), (2,)]


def test_stop_catches_up_to_the_end_of_the_file(tmp_path):
    """When Claude exits, capture reads its last lines before cc-lhc exits."""
    data = big_transcript(7, 0.2)
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"")
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path))
    cap.start()
    with open(path, "ab") as f:
        f.write(data)
    cap.stop()
    store = cc_lhc.ThreadStore(cc_lhc.StateHome(tmp_path / "lhc"), THREAD)
    assert store.source(SESSION)["offset"] == len(data)
    assert exported(store) == one_shot(tmp_path, data)[1]
    store.close()


def test_a_long_catch_up_copies_its_wal_into_the_file_once_it_is_done_on_a_thread_of_its_own(tmp_path, monkeypatch):
    """A catch-up of many batches leaves the thread file as it was through all its commits
    (no checkpoint, with its fsyncs, after any batch, nor before catch_up returns); then a
    connection of its own copies them all while the store goes on being used, and the
    store is left checkpointing as SQLite does by default: the live reads after it start no
    copy of their own. A throwaway store is not copied apart."""
    data = big_transcript(11, 6)
    expected = one_shot(tmp_path, data)[1]
    cut = data.index(b"\n", len(data) * 9 // 10) + 1
    path = tmp_path / "t.jsonl"
    path.write_bytes(data[:cut])
    monkeypatch.setattr(cc_lhc.Capture, "BATCH_BYTES", 1 << 20)
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path))
    cap._open()
    sizes, trust = [os.path.getsize(cap.store.path)], cc_lhc.Capture._trust

    def sized_commit(self, batch):  # runs once each batch is committed
        trust(self, batch)
        sizes.append(os.path.getsize(self.store.path))
    monkeypatch.setattr(cc_lhc.Capture, "_trust", sized_commit)
    copies = []
    import threading
    real_start = threading.Thread.start

    def noted_start(self):
        if self.name == "cc-lhc-checkpoint":
            copies.append(os.path.getsize(cap.store.path))  # (the file before the copy)
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", noted_start)
    cap.catch_up(index=False)
    assert len(sizes) > 3
    assert set(sizes) == {sizes[0]} and copies == [sizes[0]]
    cap.store._checkpointer.join()
    assert os.path.getsize(cap.store.path) > sizes[0]  # copied, with the store still open
    assert cap.store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == cc_lhc.WAL_CHECKPOINT_PAGES
    rest = data[cut:].splitlines(keepends=True)
    for k in range(5):  # live reads of a few lines each
        with open(path, "ab") as f:
            f.write(b"".join(rest[k * len(rest) // 5:(k + 1) * len(rest) // 5]))
        assert cap.catch_up(index=False) > 0
    assert len(copies) == 1
    assert exported(cap.store) == expected
    cap.stop()
    path.write_bytes(data)

    scratch = cc_lhc.StateHome(str(tmp_path / "scratch"), scratch=True)
    cap = cc_lhc.Capture(scratch, THREAD, SESSION, str(path))
    cap.catch_up(index=False)
    assert cap.store._checkpointer is None and os.path.getsize(cap.store.path + "-wal") > (1 << 20)
    assert exported(cap.store) == expected
    cap.stop()
    assert len(copies) == 1


def test_a_long_catch_up_writes_on_a_store_thread_and_a_failed_write_loses_nothing(tmp_path, monkeypatch):
    """Many batches: each is written on the store thread while the next is parsed. The
    capture thread reads the store only between writes, trusts a batch only once it is
    committed, and a write that fails stops the catch-up there; the next one goes on from
    the last commit and ends with exactly what a clean run stores."""
    import threading
    data = big_transcript(12, 3)
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(cc_lhc.Capture, "BATCH_BYTES", 256 << 10)
    apply, trust = cc_lhc.ThreadStore.apply, cc_lhc.Capture._trust
    seen = {"threads": set(), "writing": False, "calls": 0, "fail_at": 4, "trusted": [], "overlaps": 0}

    def watched_apply(self, *args, **kwargs):
        seen["threads"].add(threading.current_thread().name)
        seen["calls"] += 1
        if seen["calls"] == seen["fail_at"]:
            raise sqlite3.OperationalError("disk I/O error (injected)")
        seen["writing"] = True
        try:
            return apply(self, *args, **kwargs)
        finally:
            seen["writing"] = False

    def watched_trust(self, batch):
        seen["overlaps"] += seen["writing"]
        seen["trusted"].append((batch.end, self.store.source(SESSION)["offset"]))
        trust(self, batch)

    monkeypatch.setattr(cc_lhc.ThreadStore, "apply", watched_apply)
    monkeypatch.setattr(cc_lhc.Capture, "_trust", watched_trust)
    responses = []
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path), POLICY,
                         on_responses=lambda c: responses.append(seen["writing"]))
    with pytest.raises(sqlite3.OperationalError, match="injected"):
        cap.catch_up()
    assert seen["threads"] == {"cc-lhc-store"}
    assert not cap.caught_up and seen["overlaps"] == 0 and not any(responses)
    # Trusted one by one, each only once its own offset was committed: 3 of them, then the failure.
    assert [end for end, _ in seen["trusted"]] == [committed for _, committed in seen["trusted"]]
    assert len(seen["trusted"]) == 3
    assert cap.store.source(SESSION)["offset"] == seen["trusted"][-1][0]
    assert not [t for t in threading.enumerate() if t.name == "cc-lhc-store"]

    seen["fail_at"] = 0
    cap.catch_up()
    assert cap.caught_up and seen["overlaps"] == 0
    snap, export, _ = one_shot(tmp_path, data)
    assert snapshot(cap.store) == snap and exported(cap.store) == export
    cap.stop()

    # One batch's worth is written right here, with no thread started for it.
    seen["threads"].clear()
    small = tmp_path / "small.jsonl"
    small.write_bytes(data[:data.index(b"\n", 100_000) + 1])
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc2"), THREAD, SESSION, str(small), POLICY)
    cap.catch_up()
    assert seen["threads"] == {threading.current_thread().name}
    cap.stop()


def test_a_batchs_outputs_are_compressed_while_the_next_batch_is_parsed(tmp_path, monkeypatch):
    """The packer's worker gets little of the GIL while the parser holds it: a batch's rows
    are taken back only once the next batch is parsed (the last one once the file ended),
    so the worker has had that time for them, and what is stored is what a one-shot
    catch-up stores."""
    data = big_transcript(13, 3)
    path = tmp_path / "t.jsonl"
    path.write_bytes(data)
    monkeypatch.setattr(cc_lhc.Capture, "BATCH_BYTES", 256 << 10)
    feed, settle = cc_lhc.RolloutParser.feed, cc_lhc.Packer.settle
    seen = {"fed_to": 0, "settled": []}  # (the end of the last line parsed) when each batch is settled

    def watched_feed(self, line, line_no, at):
        seen["fed_to"] = max(seen["fed_to"], at + len(line) + 1)
        return feed(self, line, line_no, at)

    def watched_settle(self, rows):
        seen["settled"].append((seen["fed_to"], rows[-1].seq if rows else None))
        return settle(self, rows)
    monkeypatch.setattr(cc_lhc.RolloutParser, "feed", watched_feed)
    monkeypatch.setattr(cc_lhc.Packer, "settle", watched_settle)
    trusted = []
    trust = cc_lhc.Capture._trust
    monkeypatch.setattr(cc_lhc.Capture, "_trust", lambda self, batch: (trusted.append(batch.end), trust(self, batch)))
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path), POLICY)
    cap.catch_up(index=False)
    assert len(trusted) > 5 and trusted[-1] == len(data)
    # each batch but the last was settled with the next one already parsed
    assert len(seen["settled"]) == len(trusted)
    for (fed_to, _seq), end, after in zip(seen["settled"], trusted, trusted[1:]):
        assert fed_to == after > end
    assert seen["settled"][-1][0] == len(data)
    assert exported(cap.store) == one_shot(tmp_path, data)[1]
    cap.stop()


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_rows_written_in_small_multi_row_statements_are_the_same_record(tmp_path, monkeypatch, chunk):
    """Each table is written a chunk of rows per statement (a power of two up to
    INSERT_CHUNK_ROWS); whatever the chunk, the record is the one a one-shot parse makes."""
    data = big_transcript(13, 0.5)
    expected = one_shot(tmp_path, data, "default")
    monkeypatch.setattr(cc_lhc, "INSERT_CHUNK_ROWS", chunk)
    chunked = one_shot(tmp_path, data, f"chunk{chunk}")
    assert chunked[0] == expected[0] and chunked[1] == expected[1]


def test_live_capture_looks_often_while_claude_writes_and_less_once_it_is_quiet(tmp_path, monkeypatch):
    """After a change the files are looked at every FAST_POLL_SECONDS, once nothing changed
    for ACTIVE_SECONDS every POLL_SECONDS, and once nothing changed for IDLE_SECONDS (Claude
    at its prompt) every IDLE_POLL_SECONDS; a change makes the looks quick again."""
    import threading
    monkeypatch.setattr(cc_lhc.Capture, "ACTIVE_SECONDS", 0.3)
    monkeypatch.setattr(cc_lhc.Capture, "IDLE_SECONDS", 1.0)
    monkeypatch.setattr(cc_lhc.Capture, "IDLE_POLL_SECONDS", 0.1)
    fast, slow, idle = cc_lhc.Capture.FAST_POLL_SECONDS, cc_lhc.Capture.POLL_SECONDS, 0.1
    t = Transcript()
    t.user("hello")
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path))
    waits, quiet = [], threading.Event()
    cap.start()
    real_wait = cap._stop.wait

    def wait(timeout=None):
        waits.append(timeout)
        if waits[-3:] == [idle] * 3:
            quiet.set()
        return real_wait(timeout)
    cap._stop.wait = wait
    assert quiet.wait(10)
    seen = len(waits)
    with open(path, "a") as f:  # Claude writes again: quick looks again
        f.write(json.dumps({"type": "user", "uuid": "late-1", "parentUuid": t.parent, "sessionId": SESSION,
                            "timestamp": "2026-11-30T10:00:09.000Z",
                            "message": {"role": "user", "content": "again"}}) + "\n")
    wait_for(lambda: any(m["text"] == "again" for m in cc_lhc.ThreadStore(cap.home, THREAD).messages()),
             what="the appended prompt")
    wait_for(lambda: len(waits) > seen + 3 and waits[-1] == idle, timeout=10, what="idle polling again")
    cap.stop()

    def runs(part):  # the waits with repeats folded: the order the looks went through
        return [w for i, w in enumerate(part) if i == 0 or part[i - 1] != w]
    assert runs(waits[:seen]) == [fast, slow, idle]  # the first read was a change, then it went quiet
    after = runs(waits[seen:])  # (an idle look or two may come before the write)
    assert after[after[0] == idle:] == [fast, slow, idle]
    assert cc_lhc.Capture.poll_after(0) == fast and cc_lhc.Capture.poll_after(0.5) == slow
    assert cc_lhc.Capture.poll_after(5) == idle


# -- 2. corruption ------------------------------------------------------------------------

NEVER_UTF8 = bytes([0xC0, 0xC1] + list(range(0xF5, 0x100)))  # bytes no UTF-8 text holds


def registered_thread(session: str = SESSION) -> tuple[cc_lhc.StateHome, str]:
    """A thread in the registry of the test's own CC_LHC_HOME, as cc-lhc would make it."""
    home = cc_lhc.StateHome()
    home.ensure()
    registry = cc_lhc.Registry(home)
    thread = registry.create_thread(session, os.getcwd(), "fresh")
    registry.db.close()
    return home, thread


def threads_json() -> list[dict]:
    status, out = run_main("threads", "--json")
    assert status == 0
    return json.loads(out)


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_corrupted_bytes_mid_file_mark_the_thread_degraded(tmp_path, seed):
    rng = random.Random(seed)
    clean = big_transcript(seed, size_mb=0.4)
    data = bytearray(clean)
    positions = []
    for p in sorted(rng.sample(range(len(data) // 10, len(data) * 9 // 10), 3)):
        while data[p] == 0x0A:  # keep the line structure, so line numbers are predictable
            p += 1
        data[p] = rng.choice(NEVER_UTF8)
        positions.append(p)
    bad_lines = sorted({bytes(data[:p]).count(b"\n") + 1 for p in positions})
    home, thread = registered_thread()
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"")
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    cap.start()
    pos = 0
    while pos < len(data):  # appended while the live capture runs
        end = min(len(data), pos + rng.randint(1, 60_000))
        with open(path, "ab") as f:
            f.write(data[pos:end])
        pos = end
    cap.stop()
    assert cap.error is None

    [row] = threads_json()
    assert row["id"] == thread and row["degraded"] is True
    # (a byte inside a string reads as U+FFFD, as Claude Code reads it; anywhere else the
    # line is no JSON)
    assert re.match(rf"(malformed_line|invalid_utf8) at line {bad_lines[0]}:", row["degraded_reason"])
    assert row["captured_bytes"] == len(data)
    status, listing = run_main("threads")
    assert status == 0 and re.search("DEGRADED: (malformed_line|invalid_utf8)", listing)
    # every corrupted line is named; every other line's messages are all still there
    store = cc_lhc.ThreadStore(home, thread)
    named = {line for line, kind in store.db.execute("SELECT line, kind FROM problems")
             if kind in ("malformed_line", "invalid_utf8")}
    assert named == set(bad_lines)
    want = [(m["source_uuid"], m["block"], m["kind"], m["text"])
            for m in one_shot(tmp_path, clean)[2] if m["line"] not in bad_lines]
    got = [(m["source_uuid"], m["block"], m["kind"], m["text"]) for m in store.messages()
           if m["line"] not in bad_lines]
    store.close()
    assert got == want


@pytest.mark.parametrize("seed", range(20, 28))
def test_any_random_corruption_never_crashes_capture(tmp_path, seed):
    """Arbitrary bytes (newlines, quotes, braces, anything) anywhere in the middle."""
    rng = random.Random(seed)
    data = bytearray(big_transcript(seed, 0.15))
    for _ in range(rng.randint(1, 40)):
        p = rng.randrange(len(data) // 10, len(data) * 9 // 10)
        data[p] = rng.choice(b'\n"{}[]:,\\0123456789 abtrue\x00\xff' + bytes([rng.randrange(256)]))
    path = tmp_path / "t.jsonl"
    path.write_bytes(bytes(data))
    home = cc_lhc.StateHome(tmp_path / "lhc")
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path))
    cap.catch_up()
    src = cap.store.source(SESSION)
    problems = cap.store.db.execute("SELECT kind, line FROM problems").fetchall()
    cap.stop()
    assert src["offset"] == len(data)
    if problems:
        assert src["degraded"] and src["degraded"].split(" at line ")[0] in {k for k, _ in problems}


def test_a_transcript_that_shrinks_marks_the_thread_degraded(tmp_path):
    home, thread = registered_thread()
    t = Transcript()
    t.user("one")
    t.assistant(text("two"))
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    cap.catch_up()
    path.write_bytes(path.read_bytes()[:10])
    assert cap.catch_up() == 0
    cap.stop()
    [row] = threads_json()
    assert row["degraded"] is True and row["degraded_reason"].startswith("transcript_shrank")
    assert row["messages"] == 2  # what was captured stays


# -- 3. live latency ----------------------------------------------------------------------

def test_live_capture_stores_an_appended_line_within_a_fraction_of_a_second(tmp_path):
    path = tmp_path / "t.jsonl"  # Claude creates it with the first prompt: not there yet
    home = cc_lhc.StateHome(tmp_path / "lhc")
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path))
    cap.start()
    db_path = Path(home.path("threads", f"{THREAD}.sqlite"))
    count = lambda: read_count(db_path, "SELECT count(*) FROM messages")  # noqa: E731
    t = Transcript(SESSION)
    delays = []
    try:
        for i in range(5):
            t.user(f"prompt {i} ✓")
            t.assistant(text(f"reply {i}"))
            with open(path, "ab") as f:
                f.write(t.lines[-2] + b"\n" + t.lines[-1] + b"\n")
            t0 = time.monotonic()
            wait_for(lambda: count() == 2 * (i + 1), timeout=5, what=f"lines of round {i}")
            delays.append(time.monotonic() - t0)
    finally:
        cap.stop()
    assert cap.error is None
    # The figure belongs to scripts/bench.py (median ~30 ms); this only catches capture
    # that has stopped being live (a poll of a second or more would fail it).
    assert max(delays) < 1.0, f"live capture delays: {[round(d * 1000) for d in delays]} ms"


# -- 4. the incomplete last line ----------------------------------------------------------

class WatchedCapture(cc_lhc.Capture):
    """A Capture that notes how big the file was when its last finished read began."""

    seen = -1

    def catch_up(self, *args, **kwargs):
        size = os.path.getsize(self.path) if os.path.exists(self.path) else -1
        try:
            return super().catch_up(*args, **kwargs)
        finally:
            self.seen = size


def test_an_incomplete_last_line_is_never_parsed_early(tmp_path):
    t = Transcript(SESSION)
    t.user("first")
    t.assistant(text("reply with ünïcødé ✓ at the end"))
    first, last = t.lines
    cut = last.index("✓".encode()) + 1  # inside the three bytes of ✓
    path = tmp_path / "t.jsonl"
    path.write_bytes(first + b"\n" + last[:cut])
    home = cc_lhc.StateHome(tmp_path / "lhc")

    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path))
    assert cap.catch_up() == 1
    assert cap.store.source(SESSION)["offset"] == len(first) + 1
    with open(path, "ab") as f:
        f.write(last[cut:])  # complete now, but still no newline: Claude may be writing
    assert cap.catch_up() == 0
    assert [m["text"] for m in cap.store.messages()] == ["first"]
    with open(path, "ab") as f:
        f.write(b"\n")
    assert cap.catch_up() == 1
    assert [m["text"] for m in cap.store.messages()] == ["first", "reply with ünïcødé ✓ at the end"]
    assert cap.store.db.execute("SELECT count(*) FROM problems").fetchone()[0] == 0
    cap.stop()


def test_live_capture_waits_on_an_incomplete_last_line(tmp_path):
    t = Transcript(SESSION)
    t.user("first")
    t.assistant(text("second, written in two pieces — 日本語"))
    first, last = t.lines
    path = tmp_path / "t.jsonl"
    path.write_bytes(first + b"\n")
    home = cc_lhc.StateHome(tmp_path / "lhc")
    db_path = Path(home.path("threads", f"{THREAD}.sqlite"))
    count = lambda: read_count(db_path, "SELECT count(*) FROM messages")  # noqa: E731
    cap = WatchedCapture(home, THREAD, SESSION, str(path))
    cap.start()
    try:
        wait_for(lambda: count() == 1, what="the first line")
        cut = last.index("日".encode()) + 2
        with open(path, "ab") as f:
            f.write(last[:cut])
        size = path.stat().st_size
        wait_for(lambda: cap.seen >= size, what="capture to have read the new bytes")
        assert count() == 1
        assert read_count(db_path, "SELECT count(*) FROM problems") == 0
        with open(path, "ab") as f:
            f.write(last[cut:] + b"\n")
        wait_for(lambda: count() == 2, what="the completed line")
    finally:
        cap.stop()
    store = cc_lhc.ThreadStore(home, THREAD)
    assert [m["text"] for m in store.messages()][-1] == "second, written in two pieces — 日本語"
    assert store.summary()["degraded"] is None
    store.close()


# -- 5. torn last line repair -------------------------------------------------------------

def transcript_file(tmp_path: Path) -> tuple[Path, bytes]:
    t = Transcript(SESSION)
    t.user("one")
    t.assistant(text("two"))
    path = t.write(tmp_path / "t.jsonl")
    path.chmod(0o600)  # as Claude Code writes it
    return path, path.read_bytes()


def log_events(home: cc_lhc.StateHome) -> list[dict]:
    log = Path(home.path("wrapper.log"))
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_torn_fragment_is_saved_and_trimmed(tmp_path):
    path, good = transcript_file(tmp_path)
    fragment = b'{"parentUuid":"x","type":"assistant","message":{"content":[{"type":"text","text":"half \xe2\x9c'
    with open(path, "ab") as f:
        f.write(fragment)
    home = cc_lhc.StateHome(tmp_path / "lhc")
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) == "trimmed"
    assert path.read_bytes() == good
    [saved] = Path(home.path("torn-lines")).iterdir()
    assert saved.read_bytes() == fragment and SESSION in saved.name
    assert [e["event"] for e in log_events(home)] == ["torn_tail_trimmed"]
    # nothing left to repair
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) is None

    # after the repair Claude appends where the file now ends: nothing is malformed
    t = Transcript(SESSION)
    t.parent = json.loads(good.splitlines()[-1])["uuid"]
    t.user("three")
    with open(path, "ab") as f:
        f.write(t.data())
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path))
    cap.catch_up()
    assert [m["text"] for m in cap.store.messages()] == ["one", "two", "three"]
    assert cap.store.summary()["degraded"] is None
    cap.stop()


def test_a_whole_file_that_is_one_fragment_is_trimmed_to_empty(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b'{"type":"user","mess')
    path.chmod(0o600)
    home = cc_lhc.StateHome(tmp_path / "lhc")
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) == "trimmed"
    assert path.read_bytes() == b""


def test_a_complete_record_missing_its_newline_gets_one(tmp_path):
    path, good = transcript_file(tmp_path)
    t = Transcript(SESSION)
    t.parent = json.loads(good.splitlines()[-1])["uuid"]
    t.user("three, complete but unterminated")
    with open(path, "ab") as f:
        f.write(t.lines[-1])
    home = cc_lhc.StateHome(tmp_path / "lhc")
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path))
    cap.catch_up()
    assert len(list(cap.store.messages())) == 2  # not parsed while unterminated
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) == "newline"
    assert path.read_bytes() == good + t.lines[-1] + b"\n"
    assert not os.path.exists(home.path("torn-lines"))
    cap.catch_up()
    assert [m["text"] for m in cap.store.messages()][-1] == "three, complete but unterminated"
    cap.stop()


def test_a_torn_file_held_open_by_another_process_is_left_alone(tmp_path):
    path, good = transcript_file(tmp_path)
    torn = good + b'{"type":"user","uuid":"half'
    path.write_bytes(torn)
    home = cc_lhc.StateHome(tmp_path / "lhc")
    holder = subprocess.Popen(["sh", "-c", 'exec 3<"$1"; echo ready; exec sleep 60', "sh", str(path)],
                              stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    try:
        assert holder.stdout.readline() == b"ready\n"
        assert cc_lhc.file_is_held(str(path)) is True
        assert cc_lhc.repair_torn_tail(str(path), home, SESSION) is None
        assert path.read_bytes() == torn
        assert not os.path.exists(home.path("torn-lines"))
        [event] = log_events(home)
        assert event["event"] == "torn_tail_left" and "held" in event["reason"]
    finally:
        holder.kill()
        holder.wait()
    assert cc_lhc.file_is_held(str(path)) is False
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) == "trimmed"
    assert path.read_bytes() == good


def test_a_torn_file_is_left_alone_when_no_one_can_say_who_holds_it(tmp_path, monkeypatch):
    path, good = transcript_file(tmp_path)
    path.write_bytes(good + b'{"type":')
    home = cc_lhc.StateHome(tmp_path / "lhc")
    monkeypatch.setattr(cc_lhc, "file_is_held", lambda _path: None)
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) is None
    assert path.read_bytes() == good + b'{"type":'
    assert log_events(home)[-1]["reason"] == "could not prove the file unheld"


def test_an_intact_file_is_not_touched(tmp_path):
    path, good = transcript_file(tmp_path)
    before = path.stat().st_mtime_ns
    home = cc_lhc.StateHome(tmp_path / "lhc")
    assert cc_lhc.repair_torn_tail(str(path), home, SESSION) is None
    assert cc_lhc.repair_torn_tail(str(tmp_path / "missing.jsonl"), home, SESSION) is None
    assert path.read_bytes() == good and path.stat().st_mtime_ns == before
    assert log_events(home) == []


# -- 6. a store from a newer cc-lhc --------------------------------------------------------

def test_a_thread_store_from_a_newer_cc_lhc_is_refused(tmp_path):
    home, thread = registered_thread()
    t = Transcript(SESSION)
    t.user("one")
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    cap.catch_up()
    cap.stop()
    db_path = Path(home.path("threads", f"{thread}.sqlite"))
    con = sqlite3.connect(db_path)
    con.execute("PRAGMA user_version = 999")
    con.close()
    before = db_path.read_bytes()
    with pytest.raises(cc_lhc.LhcError) as e:
        cc_lhc.ThreadStore(home, thread)
    assert "newer" in str(e.value) and str(db_path) in str(e.value)
    assert e.value.status in (1, 2)
    # the commands refuse the same way, and nothing is rewritten
    for argv in (["threads", "--json"], ["export", thread[:8]]):
        proc = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), *argv],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode in (1, 2), proc
        assert "newer" in proc.stderr and "Traceback" not in proc.stderr
    assert db_path.read_bytes() == before
    con = sqlite3.connect(db_path)
    assert con.execute("PRAGMA user_version").fetchone()[0] == 999
    con.close()


def test_a_registry_from_a_newer_cc_lhc_is_refused(tmp_path):
    home, _thread = registered_thread()
    con = sqlite3.connect(home.path("registry.sqlite"))
    con.execute("PRAGMA user_version = 999")
    con.close()
    proc = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), "threads"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode in (1, 2)
    assert "newer cc-lhc" in proc.stderr and "registry.sqlite" in proc.stderr


def _cut_last_line_launch(fake_claude, tail: str) -> tuple[str, Path]:
    """A one-shot whose stand-in Claude writes a prompt and an answer, then ``tail`` with
    no newline (as when it is killed mid-write), and exits."""
    from test_registry_rebuild import lhc as run_lhc, transcript_steps
    sid = str(uuid.uuid4())
    steps = transcript_steps("a prompt before the cut", fake_claude.cwd)
    path = steps[0]["transcript"]["path"]
    steps.append({"transcript": {"path": path, "raw": tail}})
    fake_claude.script(steps)
    p = run_lhc(fake_claude, "--session-id", sid, "-p", "go")
    assert p.returncode == 0, p.stderr
    path = Path(path.format(config_dir=fake_claude.env["CLAUDE_CONFIG_DIR"], session_id=sid))
    return sid, path


def test_a_last_record_left_without_its_newline_reaches_the_thread_at_exit(fake_claude):
    last = {"parentUuid": None, "type": "user", "uuid": str(uuid.uuid4()), "timestamp": "2026-01-01T00:00:01.000Z",
            "message": {"role": "user", "content": "the last record, never ended by a newline"}}
    sid, path = _cut_last_line_launch(fake_claude, json.dumps(last))
    assert path.read_bytes().endswith(b"newline\"}}\n")          # mended as a resume would
    [row] = threads_json()
    status, out = run_main("export", row["id"], "--format", "json")
    assert [m.get("text") for m in json.loads(out)][-1] == "the last record, never ended by a newline"
    assert row["captured_bytes"] == path.stat().st_size


def test_a_last_line_cut_off_is_kept_in_the_thread_and_trimmed_at_exit(fake_claude):
    fragment = '{"parentUuid":null,"type":"assistant","message":{"content":[{"type":"text","text":"half of it'
    sid, path = _cut_last_line_launch(fake_claude, fragment)
    assert path.read_bytes().endswith(b"}\n")                      # trimmed back to the last whole line
    [row] = threads_json()
    status, out = run_main("export", row["id"], "--format", "raw-lines")
    [kept] = [json.loads(line) for line in out.splitlines()]
    assert kept["raw"] == fragment and kept["reason"] == cc_lhc.TORN_LINE and kept["line"] == 3
    assert kept["offset"] == path.stat().st_size
    home = cc_lhc.StateHome()
    [saved] = Path(home.path("torn-lines")).iterdir()
    assert saved.read_bytes() == fragment.encode()


def test_measure_counts_the_whole_record_a_file_ends_on_without_its_newline(tmp_path):
    path, good = transcript_file(tmp_path)
    t = Transcript(SESSION)
    t.parent = json.loads(good.splitlines()[-1])["uuid"]
    t.user("three, complete but unterminated")
    whole = path.read_bytes() + t.lines[-1]
    path.write_bytes(whole)
    status, out = run_main("measure", str(path), "--json")
    assert status == 0 and json.loads(out)["sessions"][0]["messages"] == 3
    assert path.read_bytes() == whole                      # measure never writes the file
    assert json.loads(out)["sessions"][0]["cut_off_last_line_bytes"] == 0
    path.write_bytes(whole[:-9])                           # a cut-off line is still not counted
    status, out = run_main("measure", str(path), "--json")
    row = json.loads(out)["sessions"][0]
    assert row["messages"] == 2 and row["cut_off_last_line_bytes"] == len(t.lines[-1]) - 9
    status, out = run_main("measure", str(path))           # and the report says it left it out
    assert status == 0 and f"its last line is cut off ({len(t.lines[-1]) - 9:,} bytes" in out


@pytest.mark.parametrize("how", ["esc", "permission-no"])
def test_a_turn_stopped_by_the_person_is_a_seam_the_host_is_told_of(tmp_path, how):
    """Esc during a tool call, or "No" at a permission prompt, ends the turn with records
    that carry no usage: the host is told all the same, so an idle session over the
    trigger is Smart Compacted there, not only after the next answer."""
    from test_capture_parse import tool_use
    t = Transcript(SESSION)
    t.user("run the slow thing")
    t.assistant(tool_use("toolu_1", "sleep 60"), stop="tool_use")
    path = t.write(tmp_path / "t.jsonl")
    told = []
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path), POLICY,
                         on_responses=lambda c: told.append(c.store.db.execute(
                             "SELECT status FROM turns ORDER BY n DESC LIMIT 1").fetchone()[0]))
    cap.catch_up()
    assert told == ["open"]  # (the answer that called the tool)
    if how == "esc":
        t.tool_result(("toolu_1", "[Request interrupted by user for tool use]", True))
        t.user("[Request interrupted by user for tool use]")
    else:
        t.tool_result(("toolu_1", "The user doesn't want to proceed with this tool use. The tool use was "
                                  "rejected (eg. if it was a file edit, the new_string was NOT written to the "
                                  "file). STOP what you are doing and wait for the user to tell you how to "
                                  "proceed.", True))
        t.user("[Request interrupted by user for tool use]")
    t.write(path)
    cap.catch_up()
    assert told == ["open", "interrupted"]
    assert not cc_lhc.unsettled_reason(cap.store, idle=True)  # (a settled seam)
    cap.stop()


@pytest.mark.parametrize("how", ["max-turns", "json-schema"])
@pytest.mark.parametrize("restart", [False, True])
def test_a_one_shot_run_claude_ended_on_its_own_record_is_a_settled_seam(tmp_path, how, restart):
    """`-p --max-turns N` stops after a tool's result with a max_turns_reached attachment,
    and `-p --json-schema` ends on its StructuredOutput call's result: the turn is over
    there (it looked open for ever, so no later one-shot ever Smart Compacted the thread).
    Read in one go or with cc-lhc restarted between the call and its result."""
    from test_capture_parse import tool_use
    t = Transcript(SESSION)
    t.user("do it")
    name = "Bash" if how == "max-turns" else "StructuredOutput"
    t.assistant(tool_use("toolu_1", "echo step", name=name), stop="tool_use")
    path = t.write(tmp_path / "t.jsonl")
    home = cc_lhc.StateHome(tmp_path / "lhc")
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    if restart:
        cap.catch_up()
        cap.stop()
        cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    if how == "max-turns":
        t.tool_result(("toolu_1", "step"))
        t.record({"type": "attachment", "attachment": {"type": "max_turns_reached", "maxTurns": 1,
                                                        "turnCount": 2, "exitCommitted": False}})
    else:
        t.record({"type": "attachment", "attachment": {"type": "structured_output", "data": {"name": "x"},
                                                        "toolUseID": "toolu_1"}})
        t.tool_result(("toolu_1", "Structured output provided successfully"))
    t.bookkeeping("last-prompt", lastPrompt="do it")
    t.write(path)
    cap.catch_up()
    assert not cc_lhc.unsettled_reason(cap.store, idle=True)
    if how == "json-schema":  # (no record of Claude's closes it: the next prompt does)
        t.user("and the next one")
        t.write(path)
        cap.catch_up()
    status, why = cap.store.db.execute("SELECT status, stop_reason FROM turns WHERE n = 1").fetchone()
    assert (status, why) == ("closed", "max_turns" if how == "max-turns" else "structured_output")
    cap.stop()


def test_a_tool_result_alone_still_leaves_the_turn_open(tmp_path):
    """Only those records end a run: a Bash result with nothing after it is a turn Claude
    was still in (killed before its next request)."""
    from test_capture_parse import tool_use
    t = Transcript(SESSION)
    t.user("do it")
    t.assistant(tool_use("toolu_1", "echo step"), stop="tool_use")
    t.tool_result(("toolu_1", "step"))
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    assert cap.store.db.execute("SELECT status FROM turns").fetchone() == ("open",)
    assert cc_lhc.unsettled_reason(cap.store, idle=True)
    cap.stop()


@pytest.mark.parametrize("how", ["with-another-call", "retried"])
def test_a_json_schema_run_ends_where_claude_ends_it(tmp_path, how):
    """The run ends once the response whose StructuredOutput call succeeded has every call
    answered (a Bash call beside it, written after its result, joins the same turn), and not
    at a StructuredOutput Claude refused and the model tried again (the run was cut in two)."""
    from test_capture_parse import tool_use
    t = Transcript(SESSION)
    t.user("give the name")
    if how == "with-another-call":
        t.assistant(tool_use("toolu_so", '{"name": "ok"}', name="StructuredOutput"), msg_id="msg_both",
                    stop="tool_use")
        t.tool_result(("toolu_so", "Structured output provided successfully"))
        t.assistant(tool_use("toolu_b", "echo hi"), msg_id="msg_both", stop="tool_use")
        t.tool_result(("toolu_b", "hi"))
    else:
        t.assistant(tool_use("toolu_bad", '{"wrong": 1}', name="StructuredOutput"), stop="tool_use")
        t.tool_result(("toolu_bad", "Output does not match required schema", True))
        t.assistant(tool_use("toolu_so", '{"name": "ok"}', name="StructuredOutput"), stop="tool_use")
        t.tool_result(("toolu_so", "Structured output provided successfully"))
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "lhc"), THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    assert not cc_lhc.unsettled_reason(cap.store, idle=True)
    t.user("and the next one")
    t.write(path)
    cap.catch_up()
    assert cap.store.db.execute("SELECT n, status, stop_reason FROM turns WHERE n = 1").fetchall() == [
        (1, "closed", "structured_output")]
    assert cap.store.db.execute("SELECT count(*) FROM turns").fetchone() == (2,)
    cap.stop()


def test_a_json_schema_run_read_across_a_restart_ends_where_claude_ends_it(tmp_path):
    """The response whose StructuredOutput succeeded is remembered in the thread: capture
    restarted before the last call beside it was answered still ends the run there (the
    answer after the restart opened a turn of its own, open for good)."""
    from test_capture_parse import tool_use
    t = Transcript(SESSION)
    t.user("give the name")
    t.assistant(tool_use("toolu_so", '{"name": "ok"}', name="StructuredOutput"), msg_id="msg_both", stop="tool_use")
    t.tool_result(("toolu_so", "Structured output provided successfully"))
    t.assistant(tool_use("toolu_b", "echo hi"), msg_id="msg_both", stop="tool_use")
    path = t.write(tmp_path / "t.jsonl")
    home = cc_lhc.StateHome(tmp_path / "lhc")
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    cap.stop()
    t.tool_result(("toolu_b", "hi"))
    t.write(path)
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    assert cap.store.db.execute("SELECT count(*) FROM turns").fetchone() == (1,)
    assert not cc_lhc.unsettled_reason(cap.store, idle=True)
    cap.stop()
    t.user("and the next one")
    t.write(path)
    cap = cc_lhc.Capture(home, THREAD, SESSION, str(path), POLICY)
    cap.catch_up()
    assert cap.store.db.execute("SELECT n, status, stop_reason FROM turns WHERE n = 1").fetchall() == [
        (1, "closed", "structured_output")]
    cap.stop()


def test_a_line_added_to_a_long_session_is_read_without_reading_back_all_its_uuids(tmp_path):
    """Live capture reads a running session a few lines at a time; each read rebuilt the
    parser's memory from the record, every uuid of the session included, so a read grew
    with the session (45 ms a line at 50,000 records). The memory its own last read left
    is used again, and what another writer changes (a subagent's labels, a turn a swap
    ended) is read again; the record stays as one read of the whole file makes it."""
    tr = Transcript(SESSION)
    tool = lambda n: {"type": "tool_use", "id": f"toolu_{n}", "name": "Bash", "input": {"command": "ls"}}  # noqa: E731
    tr.user("first")
    tr.assistant(tool(1), stop="tool_use")
    head = len(tr.lines)
    tr.tool_result(("toolu_1", "out 1"))
    tr.assistant(text("answer one"))
    tr.user("second")
    tr.assistant(tool(2), stop="tool_use")
    tr.tool_result(("toolu_2", "out 2"))
    tr.assistant(text("answer two"))
    path = tmp_path / "live.jsonl"
    cap = cc_lhc.Capture(cc_lhc.StateHome(tmp_path / "live"), THREAD, SESSION, str(path), POLICY)
    reads = []
    path.write_bytes(b"".join(line + b"\n" for line in tr.lines[:head]))
    cap.catch_up()
    cap.store.db.set_trace_callback(lambda sql: reads.append(sql) if "FROM chain WHERE session" in sql else None)
    for n in range(head + 1, len(tr.lines) + 1):
        with open(path, "ab") as f:
            f.write(tr.lines[n - 1] + b"\n")
        cap.catch_up()
    assert reads == []  # (the first read alone looked)
    live = snapshot(cap.store)
    cap.stop()
    whole = one_shot(tmp_path, tr.data())[0]
    assert live == whole
