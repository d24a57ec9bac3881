"""Capture, part 5: a few hundred random mutations of a real-format transcript (issue 9).

Each seed starts from part of a transcript written by scripts/gen_transcript.py and, step by
step, grows, shrinks, rewrites, corrupts or replaces it (huge numbers, surrogate and invalid
bytes, 100,000 levels of nesting, a FIFO in the file's place). After every step the thread
is read as a new launch would (a fresh Capture), and the export must hold every record the
file now holds exactly once, keep everything it held before, unchanged and in order, and no
command may print a traceback. A sample of steps runs whole processes (`cc-lhc --resume`
with the stand-in CLI, `export`, `measure`), each bounded by a subprocess timeout; the
in-process reads are bounded the same way, in a worker thread.
"""

from __future__ import annotations

import io
import json
import os
import random
import sys
import threading
import uuid
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

import cc_lhc
from conftest import REPO

SESSION = "11111111-2222-4333-8444-555555555555"
SEEDS = range(6)
STEPS = 50            # 6 x 50 = 300 mutations
WHOLE_PROCESS = 1     # steps per seed that also run `cc-lhc --resume` as a real process
BOUND = 20.0          # seconds any one call may take before the test calls it hung
HUGE = [2 ** 63, 2 ** 64 + 1, -(2 ** 63) - 1, 10 ** 30]


# -- the transcript and what it holds ---------------------------------------------------------

@pytest.fixture(scope="module")
def pool() -> list[bytes]:
    """Lines of one realistic transcript; each seed starts from a prefix and appends the rest."""
    import tempfile
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from gen_transcript import generate
    finally:
        sys.path.remove(str(REPO / "scripts"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "pool.jsonl")
        generate(path, size_mb=0.15, seed=9, session_id=SESSION, thinking=True, compact_every=3)
        return Path(path).read_bytes().splitlines()


def message_rows(rec: dict) -> int:
    """How many export rows a conversational record gives: one per content block."""
    if rec.get("type") not in ("user", "assistant") or not isinstance(rec.get("uuid"), str):
        return 0
    if rec.get("isSidechain"):
        return 0
    content = (rec.get("message") or {}).get("content")
    if rec.get("isCompactSummary") or rec["type"] == "assistant" and not isinstance(content, list):
        return 1
    if isinstance(content, list):
        return len(content)
    return 1 if isinstance(content, str) or content else 0


def read_line(line: bytes):
    """A line as Claude Code reads it: bytes that are not UTF-8 each read as U+FFFD."""
    try:
        return json.loads(line)
    except UnicodeDecodeError:
        return json.loads(line.decode("utf-8", "replace"))


def file_records(lines: list[bytes]) -> dict[str, int]:
    """uuid -> export rows, for every record of the file a JSON reader can read.

    The first copy of a uuid wins, as in the record: Claude writes records again under the
    same uuid, so a later copy (here, a rewritten one) is never taken a second time.
    """
    found: dict[str, int] = {}
    for line in lines:
        try:
            rec = read_line(line)
        except (ValueError, RecursionError):
            continue  # not a record: cut off, or deeper than any reader goes
        if isinstance(rec, dict) and isinstance(rec.get("uuid"), str):
            found.setdefault(rec["uuid"], message_rows(rec))
    return found


def leaf(lines: list[bytes]):
    for line in reversed(lines):
        try:
            rec = read_line(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("uuid"), str):
            return rec["uuid"]
    return None


def record(parent, role: str, text: str, **extra) -> dict:
    rec = {"parentUuid": parent, "isSidechain": False, "type": role, "uuid": str(uuid.uuid4()),
           "timestamp": "2026-11-30T10:00:00.000Z", "sessionId": SESSION}
    if role == "user":
        rec["message"] = {"role": "user", "content": text}
    else:
        rec["message"] = {"id": f"msg_{uuid.uuid4().hex[:16]}", "type": "message", "role": "assistant",
                          "model": "claude-opus-5-5", "content": [{"type": "text", "text": text}],
                          "stop_reason": "end_turn", "usage": {"input_tokens": 1000, "output_tokens": 9}}
    rec.update(extra)
    return rec


def line_of(rec: dict) -> bytes:
    return json.dumps(rec, ensure_ascii=False).encode()


# -- mutations: each takes (lines, rng, world) and returns the new lines ----------------------

def grow(lines, rng, world):
    n = rng.randint(1, 12)
    taken, world["next"] = world["pool"][world["next"]:world["next"] + n], world["next"] + n
    if not taken:  # the pool is used up: a prompt and its answer of our own
        u = record(leaf(lines), "user", f"prompt {rng.random()}")
        taken = [line_of(u), line_of(record(u["uuid"], "assistant", "answer"))]
    return lines + taken


def drop_tail(lines, rng, world):
    return lines[:max(1, len(lines) - rng.randint(1, 3))]


def drop_and_continue(lines, rng, world):
    """The issue's case: the last line gone, a new prompt and its answer in its place."""
    kept = lines[:-1]
    u = record(leaf(kept), "user", f"PROMPT-A secret detail {rng.randint(0, 9999)}")
    return kept + [line_of(u), line_of(record(u["uuid"], "assistant", "answer to A"))]


def tear(lines, rng, world):
    """The last line cut off mid-way (a crash, a full disk): no newline, not a record."""
    last = lines[-1]
    world["fragment"] = last[:rng.randint(1, max(1, len(last) - 1))]
    return lines[:-1]


def rewrite_middle(lines, rng, world):
    i = rng.randrange(len(lines) // 4, max(len(lines) // 4 + 1, len(lines) * 3 // 4))
    try:
        rec = json.loads(lines[i])
    except (ValueError, RecursionError):
        rec = None
    out = list(lines)
    roll = rng.random()
    if isinstance(rec, dict) and rec.get("type") == "user" and roll < 0.5:
        rec = dict(rec, uuid=str(uuid.uuid4()), message={"role": "user", "content": f"rewritten {roll}"})
        out[i] = line_of(rec)  # a new record where another was
    elif isinstance(rec, dict) and rec.get("uuid") and roll < 0.8:
        rec = dict(rec, message={"role": "user", "content": "same uuid, other words"}, type="user")
        out[i] = line_of(rec)  # a record captured before, changed: the first copy stays
    else:
        out[i] = b'{"type":"user","garbled' + bytes([rng.randrange(256)]) * 5
    return out


def delete_middle(lines, rng, world):
    if len(lines) < 3:
        return lines
    i = rng.randrange(1, len(lines) - 1)
    return lines[:i] + lines[i + 1:]


def huge_number(lines, rng, world):
    u = record(leaf(lines), "user", "count these")
    a = record(u["uuid"], "assistant", "counted")
    a["message"]["usage"][rng.choice(["input_tokens", "output_tokens", "cache_read_input_tokens"])] = \
        rng.choice(HUGE)
    return lines + [line_of(u), line_of(a)]


def bad_bytes(lines, rng, world):
    u = record(leaf(lines), "user", "odd MARK bytes")
    raw = line_of(u).replace(b"MARK", rng.choice([b"\xed\xa0\x80", b"\xed\xb0\x80x", b"\xff\xfe", b"\xc0"]))
    return lines + [raw]


def deep_nesting(lines, rng, world):
    depth = 100_000
    if rng.random() < 0.5:
        return lines + [b"[" * depth + b"]" * depth]
    u = record(leaf(lines), "user", "DEEP")
    return lines + [line_of(u).replace(b'"DEEP"', b'{"a":' * depth + b"1" + b"}" * depth)]


MUTATIONS = [(grow, 30), (drop_tail, 8), (drop_and_continue, 8), (tear, 5), (rewrite_middle, 12),
             (delete_middle, 5), (huge_number, 8), (bad_bytes, 8), (deep_nesting, 5), ("fifo", 5)]


def write(path: Path, lines: list[bytes], fragment: bytes = b"") -> None:
    """The file as these lines, plus a torn last line (no newline) when there is one."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(b"".join(line + b"\n" for line in lines) + fragment)
    os.replace(tmp, path)


def file_lines(path: Path) -> list[bytes]:
    """The complete lines of the file as it is now (what a reader of it can take)."""
    data = path.read_bytes()
    return data.split(b"\n")[:-1]


# -- bounded calls --------------------------------------------------------------------------

def bounded(fn, *args):
    """fn(*args) in a worker thread; a call still running after BOUND seconds is a hang."""
    result, error = [], []

    def run():
        try:
            result.append(fn(*args))
        except BaseException as e:  # noqa: BLE001 - reported below, with its traceback
            error.append(e)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(BOUND)
    assert not worker.is_alive(), f"{getattr(fn, '__name__', fn)} still running after {BOUND}s"
    if error:
        raise error[0]
    return result[0]


def capture(home, thread, path) -> None:
    cap = cc_lhc.Capture(home, thread, SESSION, str(path))
    try:
        cap.catch_up()
    finally:
        cap.stop()


def main_out(*argv: str) -> str:
    """stdout of `cc-lhc <argv>` run in this process, which must succeed without a traceback."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = cc_lhc.main(list(argv))
    assert "Traceback" not in err.getvalue(), err.getvalue()
    assert status == 0, err.getvalue()
    return out.getvalue()


def export_in_process(thread: str) -> list[dict]:
    return json.loads(main_out("export", thread, "--format", "json"))


def run(fake_claude, *args):
    p = fake_claude.run_lhc(*args, timeout=BOUND)
    assert "Traceback" not in p.stderr and "Traceback" not in p.stdout, p.stderr
    return p


# -- the test -----------------------------------------------------------------------------

def check(records, before, first_rows, lines, step):
    """The export holds each record once, everything it held before, and all the file holds."""
    where = f"after step {step}"
    assert records[:len(before)] == before, f"{where}: the record changed or lost messages"
    rows: dict[str, int] = {}
    for r in records:
        rows[r["source_uuid"]] = rows.get(r["source_uuid"], 0) + 1
    for uid, n in file_records(lines).items():
        first_rows.setdefault(uid, n)
        assert rows.get(uid, 0) == first_rows[uid], f"{where}: record {uid} is in the export {rows.get(uid, 0)} times"
    for uid, n in rows.items():
        assert n == first_rows.get(uid), f"{where}: record {uid} is in the export {n} times"


@pytest.mark.parametrize("seed", SEEDS)
def test_random_mutations_keep_every_record_exactly_once(fake_claude, pool, seed):
    rng = random.Random(seed)
    home = cc_lhc.StateHome()
    home.ensure()
    cwd = str(fake_claude.cwd)
    path = Path(cc_lhc.rollout_path(SESSION, cwd))
    path.parent.mkdir(parents=True, exist_ok=True)
    registry = cc_lhc.Registry(home)
    thread = registry.create_thread(SESSION, cwd, "fresh")
    registry.db.close()

    start = len(pool) // 3
    world = {"pool": pool[start:], "next": 0}  # and "fragment" when a mutation tore the tail
    lines = pool[:start]
    write(path, lines)
    whole = set(rng.sample(range(STEPS), WHOLE_PROCESS))
    kinds = [m for m, _ in MUTATIONS]
    weights = [w for _, w in MUTATIONS]
    before, first_rows, rebuilt = [], {}, 0
    for step in range(STEPS):
        kind = rng.choices(kinds, weights)[0]
        if kind == "fifo":
            if hasattr(os, "mkfifo"):
                path.unlink()
                os.mkfifo(path)
                bounded(capture, home, thread, path)  # never waits on a writer that is not there
                path.unlink()
            write(path, lines)
        else:
            lines = kind(lines, rng, world)
            write(path, lines, world.pop("fragment", b""))
        if step in whole:
            reply = record(leaf(file_lines(path)), "user", f"via the stand-in at step {step}")
            # (written to the session Claude is resumed on: a file that lost records the thread
            # holds is written again from the thread first, and Claude goes on in that one)
            fake_claude.script([{"transcript": {"path": str(path).replace(SESSION, "{session_id}"),
                                                "record": reply}}])
            p = run(fake_claude, "--resume", SESSION, "-p", "go on")
            assert p.returncode == 0, p.stderr
            if "no longer holds" in p.stderr:  # (the reply is in the rebuilt session, not this file)
                first_rows[reply["uuid"]] = 1
                rebuilt += 1
        else:
            bounded(capture, home, thread, path)
        lines = file_lines(path)  # a launch may have trimmed a torn line or appended one
        records = bounded(export_in_process, thread)
        check(records, before, first_rows, lines, step)
        before = records

    # the same, read by a whole process; measure reads the file, alone and in its folder
    # beside a FIFO (in this process: a whole one for one seed only, it loads the tokenizer)
    assert json.loads(run(fake_claude, "export", thread, "--format", "json").stdout) == before
    os.mkfifo(path.parent / "not-a-file.jsonl")
    measure = (lambda *a: run(fake_claude, *a).stdout) if seed == 0 else main_out
    alone = json.loads(bounded(measure, "measure", str(path), "--json"))
    assert alone["sessions"][0]["messages"] >= sum(file_records(lines).values())
    both = json.loads(bounded(measure, "measure", str(path.parent), "--json"))
    # the FIFO beside it is skipped, not read (and never hangs the folder's measure); a session
    # a launch wrote again from the thread is beside it
    sizes = [s["messages"] for s in both["sessions"]]
    assert len(sizes) == 1 + rebuilt and alone["sessions"][0]["messages"] in sizes
