"""A lost registry.sqlite is rebuilt from the thread files, and nothing is adopted twice.

Each thread file keeps a copy of its registry rows (aliases with their current flag,
rebuilds with their status, the thread's folder and alarm). These tests delete the
registry and check that `threads`, `export`, `--resume` of the current and of an older
session, and `doctor --repair` all find the thread again. The stand-in CLI writes the
transcripts (tests/fake_claude.py); the same with the real CLI is in
tests/test_smart_compact_real.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
import uuid

import cc_lhc
from conftest import CC_LHC, project_slug

REBUILT_LINE = "registry.sqlite lacked 1 thread(s) whose files exist"


def lhc(fake, *args):
    return subprocess.run([sys.executable, str(CC_LHC), *args], env=fake.env, cwd=fake.cwd,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60)


def transcript_steps(text: str, cwd) -> list[dict]:
    """A user prompt and an answer, written where Claude writes this session's transcript."""
    path = "{config_dir}/projects/" + project_slug(str(cwd)) + "/{session_id}.jsonl"
    steps, parent = [], None
    for kind, content in (("user", text), ("assistant", [{"type": "text", "text": "answer to " + text}])):
        rid = str(uuid.uuid4())
        message = {"role": kind, "content": content}
        if kind == "assistant":
            message.update(id="msg_" + rid[:8], model="claude-fake", stop_reason="end_turn")
        steps.append({"transcript": {"path": path, "record": {
            "parentUuid": parent, "type": kind, "uuid": rid, "message": message,
            "timestamp": "2026-01-01T00:00:00.000Z"}}})
        parent = rid
    return steps


def lose_registry(iso_env) -> None:
    for suffix in ("", "-wal", "-shm"):
        path = iso_env.lhc / f"registry.sqlite{suffix}"
        if path.exists():
            path.unlink()


def threads(fake) -> list[dict]:
    p = lhc(fake, "threads", "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def a_thread(fake, monkeypatch) -> tuple[str, str]:
    fake.script(transcript_steps("PROMPT-ONE remember 4711", fake.cwd))
    p = lhc(fake, "-p", "PROMPT-ONE remember 4711")
    assert p.returncode == 0, p.stderr
    [launch] = fake.launches()
    session = launch["argv"][launch["argv"].index("--session-id") + 1]
    [thread] = threads(fake)
    return thread["id"], session


def test_threads_and_export_after_the_registry_is_lost(fake_claude, iso_env, monkeypatch):
    thread_id, session = a_thread(fake_claude, monkeypatch)
    lose_registry(iso_env)
    p = lhc(fake_claude, "threads", "--json")
    assert p.returncode == 0, p.stderr
    assert REBUILT_LINE in p.stderr and "Traceback" not in p.stderr
    [thread] = json.loads(p.stdout)
    assert thread["id"] == thread_id and thread["current_session"] == session
    assert thread["cwd"] == str(iso_env.work)
    again = lhc(fake_claude, "threads", "--json")
    assert REBUILT_LINE not in again.stderr                     # said once, when it happened
    export = lhc(fake_claude, "export", thread_id[:8], "--format", "json")
    assert export.returncode == 0, export.stderr
    assert "PROMPT-ONE remember 4711" in [m.get("text") for m in json.loads(export.stdout)]
    log = [json.loads(line) for line in (iso_env.lhc / "wrapper.log").read_text().splitlines()]
    assert [e["threads"] for e in log if e["event"] == "registry_rebuilt"] == [[thread_id]]


def test_resume_of_the_current_session_lands_on_its_thread(fake_claude, iso_env, monkeypatch):
    thread_id, session = a_thread(fake_claude, monkeypatch)
    lose_registry(iso_env)
    fake_claude.script(transcript_steps("PROMPT-TWO", iso_env.work))
    p = lhc(fake_claude, "--resume", session, "-p", "PROMPT-TWO")
    assert p.returncode == 0, p.stderr
    assert REBUILT_LINE in p.stderr and "looks like a rebuilt session" not in p.stderr
    [thread] = threads(fake_claude)                              # not adopted a second time
    assert thread["id"] == thread_id and thread["current_session"] == session
    texts = [m.get("text") for m in json.loads(lhc(fake_claude, "export", thread_id,
                                                   "--format", "json").stdout)]
    assert texts.count("PROMPT-ONE remember 4711") == 1 and "PROMPT-TWO" in texts


def swapped_thread(iso_env) -> tuple:
    """In-process: a thread whose accepted rebuild `new` replaced `old` (and one abandoned)."""
    home = cc_lhc.StateHome()
    registry = cc_lhc.Registry(home)
    cwd = str(iso_env.work)
    old, new, unused = (str(uuid.uuid4()) for _ in range(3))
    thread = registry.create_thread(old, cwd, "fresh")
    folder = iso_env.config / "projects" / project_slug(cwd)
    folder.mkdir(parents=True, exist_ok=True)
    for sid in (old, new, unused):
        (folder / f"{sid}.jsonl").write_text("")
    for sid in (new, unused):
        cc_lhc.record_pending(registry, thread, old, types.SimpleNamespace(
            session_id=sid, path=str(folder / f"{sid}.jsonl")), cwd)
    with cc_lhc.Tx(registry.db) as db:
        db.execute("UPDATE rebuilds SET owner = '{}'")
    cc_lhc.advance_current(registry, thread, new)
    cc_lhc.abandon(home, registry, unused, "test")
    with cc_lhc.Tx(registry.db) as db:
        db.execute("INSERT INTO thread_alarms VALUES (?, 'an alarm', 'now')", (thread,))
    registry.save_copy(thread)
    before = dump(registry)
    registry.db.close()
    return home, thread, old, new, unused, before


def dump(registry) -> tuple:
    db = registry.db
    return (db.execute("SELECT * FROM threads").fetchall(),
            sorted(db.execute("SELECT alias, thread_id, session_id, is_current FROM aliases").fetchall()),
            sorted(db.execute("SELECT * FROM rebuilds").fetchall()),
            db.execute("SELECT * FROM thread_alarms").fetchall())


def test_the_rebuilt_registry_holds_what_the_lost_one_held(iso_env, capsys):
    home, thread, old, new, unused, before = swapped_thread(iso_env)
    lose_registry(iso_env)
    registry = cc_lhc.Registry(home)
    assert REBUILT_LINE in capsys.readouterr().err
    assert dump(registry) == before
    assert registry.current_session(thread) == new
    assert registry.thread_for_session(old) == registry.thread_for_session(unused) == thread


def test_resume_of_an_old_session_forwards_to_the_current_one(fake_claude, iso_env, monkeypatch):
    _home, thread, old, new, _unused, _before = swapped_thread(iso_env)
    lose_registry(iso_env)
    fake_claude.script(transcript_steps("PROMPT-THREE", iso_env.work))
    p = lhc(fake_claude, "--resume", old, "-p", "PROMPT-THREE")
    assert p.returncode == 0, p.stderr
    assert REBUILT_LINE in p.stderr
    assert f"session {old} continues as {new}" in p.stderr
    argv = fake_claude.launches()[-1]["argv"]
    assert argv[argv.index("--resume") + 1] == new
    [listed] = threads(fake_claude)
    assert listed["id"] == thread and listed["current_session"] == new


def test_a_registry_missing_only_some_threads_gets_them_back(iso_env, capsys):
    home, thread, _old, new, _unused, _before = swapped_thread(iso_env)
    registry = cc_lhc.Registry(home)
    other = registry.create_thread(str(uuid.uuid4()), str(iso_env.work), "fresh")
    with cc_lhc.Tx(registry.db) as db:
        for table, column in (("aliases", "thread_id"), ("rebuilds", "thread_id"),
                              ("thread_alarms", "thread_id"), ("threads", "id")):
            db.execute(f"DELETE FROM {table} WHERE {column} = ?", (thread,))
    capsys.readouterr()
    again = cc_lhc.Registry(home)
    assert REBUILT_LINE in capsys.readouterr().err
    assert {r[0] for r in again.threads()} == {thread, other}
    assert again.current_session(thread) == new


def test_a_thread_file_from_before_copies_is_rebuilt_from_its_sources(iso_env):
    """A file written before migration 004 has no copy: its captured sessions become its
    aliases, the newest current, and its folder comes from cc-lhc.sqlite."""
    home = cc_lhc.StateHome()
    thread, first, second = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    store = cc_lhc.ThreadStore(home, thread)
    store.add_source(first, "/x/first.jsonl")
    store.add_source(second, "/x/second.jsonl")
    with cc_lhc.Tx(store.db) as db:
        db.execute("UPDATE sources SET first_seen = '2026-01-0' || rowid")
    store.close()
    cc_lhc.HostDB(home).note_session(first, thread, "/x/first.jsonl", str(iso_env.work))
    registry = cc_lhc.Registry(home)
    assert registry.current_session(thread) == second
    assert registry.thread_for_session(first) == thread
    assert registry.thread_cwd(thread) == str(iso_env.work)


def test_doctor_reports_and_repairs_a_lost_registry(fake_claude, iso_env, monkeypatch):
    thread_id, session = a_thread(fake_claude, monkeypatch)
    lose_registry(iso_env)
    p = lhc(fake_claude, "doctor")
    assert "1 thread file(s) not in registry.sqlite" in p.stdout and "doctor --repair" in p.stdout
    assert not (iso_env.lhc / "registry.sqlite").exists() or "lacked" not in p.stderr
    p = lhc(fake_claude, "doctor", "--repair")
    assert "rebuilt 1 thread(s) from their thread files" in p.stdout, p.stdout
    [thread] = threads(fake_claude)
    assert thread["id"] == thread_id and thread["current_session"] == session
    assert "0 thread file(s) not in registry" not in lhc(fake_claude, "doctor").stdout
    assert "[  ok] registry: 1 thread(s)" in lhc(fake_claude, "doctor").stdout


def test_a_process_checks_for_missing_threads_once_until_the_registry_or_threads_change(
        iso_env, capsys, monkeypatch):
    home, thread, _old, new, _unused, _before = swapped_thread(iso_env)
    cc_lhc.Registry(home)
    listed = []
    real = cc_lhc._thread_file_ids
    monkeypatch.setattr(cc_lhc, "_thread_file_ids", lambda h: listed.append(1) or real(h))
    for _ in range(3):
        cc_lhc.Registry(home)
    assert listed == []  # nothing changed since the first open: no folder listing, no query
    lose_registry(iso_env)  # lost while the process runs: the next open brings it back
    capsys.readouterr()
    again = cc_lhc.Registry(home)
    assert listed == [1] and REBUILT_LINE in capsys.readouterr().err
    assert again.current_session(thread) == new


def test_a_damaged_thread_file_the_registry_lost_is_named_not_passed_over(fake_claude, iso_env, monkeypatch):
    thread, _session = a_thread(fake_claude, monkeypatch)
    other = iso_env.lhc / "threads" / f"{uuid.uuid4()}.sqlite"
    other.write_bytes(b"this is no database" * 50)
    empty = iso_env.lhc / "threads" / f"{uuid.uuid4()}.sqlite"
    empty.write_bytes(b"")
    lose_registry(iso_env)
    p = lhc(fake_claude, "threads", "--json")
    assert p.returncode == 1  # the list is not whole, and says which files it could not read
    assert [t["id"] for t in json.loads(p.stdout)] == [thread]
    assert other.stem in p.stderr and empty.stem in p.stderr and "cc-lhc doctor" in p.stderr
    assert empty.stat().st_size == 0  # read, never written into
    assert lhc(fake_claude, "export", thread[:8].upper()).returncode == 0  # ids are hex: any case
