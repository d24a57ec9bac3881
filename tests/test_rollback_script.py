"""scripts/rollback-unaccepted.py on a state home built in-process with cc_lhc's own stores.

The script itself is run as a separate program in isolated mode (`python3 -I`), so it
proves it needs nothing but the standard library and the state layout.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import types
import uuid
from pathlib import Path


import cc_lhc
from conftest import REPO, project_slug

SCRIPT = REPO / "scripts" / "rollback-unaccepted.py"


def run_script(iso_env, *args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-I", str(SCRIPT), *args], env={**iso_env.env, **(env or {})},
                          cwd=iso_env.work, capture_output=True, text=True, timeout=30)


def dead_identity() -> dict:
    """The identity of a process that has exited (its pid may later be reused: still dead)."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        ident = cc_lhc.process_identity(p.pid)
    finally:
        p.kill()
        p.wait()
    assert ident["start"] is not None and not cc_lhc.identity_alive(ident)
    return ident


class State:
    """A thread on session `old` with a pending rebuild `new` whose transcript exists."""

    def __init__(self, iso_env, owner: dict, stored_path: str | None = None):
        self.iso = iso_env
        self.home = cc_lhc.StateHome()
        self.registry = cc_lhc.Registry(self.home)
        self.cwd = str(iso_env.work)
        self.old, self.new = str(uuid.uuid4()), str(uuid.uuid4())
        self.thread = self.registry.create_thread(self.old, self.cwd, "fresh")
        self.transcript = iso_env.config / "projects" / project_slug(self.cwd) / f"{self.new}.jsonl"
        self.transcript.parent.mkdir(parents=True, exist_ok=True)
        self.transcript.write_text(json.dumps({"type": "user", "message": {
            "role": "user", "content": f"{cc_lhc.REBUILT_MARKER} from thread {self.thread}. ..."}}) + "\n")
        rebuild = types.SimpleNamespace(session_id=self.new, path=stored_path or str(self.transcript))
        cc_lhc.record_pending(self.registry, self.thread, self.old, rebuild, self.cwd)
        with cc_lhc.Tx(self.registry.db) as db:
            db.execute("UPDATE rebuilds SET owner = ? WHERE session_id = ?", (json.dumps(owner), self.new))

    @property
    def moved_to(self) -> Path:
        return self.iso.lhc / "abandoned-rebuilds" / project_slug(self.cwd) / f"{self.new}.jsonl"

    def rows(self):
        db = self.registry.db
        return (db.execute("SELECT session_id, status FROM rebuilds").fetchall(),
                sorted(db.execute("SELECT alias, is_current FROM aliases").fetchall()))


def test_no_registry_nothing_to_do(iso_env):
    p = run_script(iso_env)
    assert p.returncode == 0 and "nothing to do" in p.stdout


def test_help_and_usage_errors(iso_env):
    p = run_script(iso_env, "--help")
    assert p.returncode == 0 and "--apply" in p.stdout and "CC_LHC_HOME" in p.stdout
    p = run_script(iso_env, "--frobnicate")
    assert p.returncode == 2 and "usage" in p.stderr
    p = run_script(iso_env, "extra-argument")
    assert p.returncode == 2


def test_script_is_stdlib_only_and_python38():
    source = SCRIPT.read_text()
    ast.parse(source, feature_version=(3, 8))
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_dead_owner_dry_run_apply_then_nothing(iso_env):
    s = State(iso_env, dead_identity())
    before = s.rows()
    assert before == ([(s.new, "pending")],
                      sorted([(f"claude-code:{s.old}", 1), (f"claude-code:{s.new}", 0)]))

    dry = run_script(iso_env)
    assert dry.returncode == 0, dry.stderr
    assert "would roll back" in dry.stdout and s.new in dry.stdout and s.thread in dry.stdout
    assert str(s.transcript) in dry.stdout and str(s.moved_to) in dry.stdout
    assert s.transcript.exists() and not s.moved_to.exists() and s.rows() == before

    done = run_script(iso_env, "--apply")
    assert done.returncode == 0, done.stderr
    assert "rolled back" in done.stdout and "moved" in done.stdout and s.new in done.stdout
    assert not s.transcript.exists() and s.moved_to.exists()
    if os.name == "posix":  # every folder it made is private, as cc-lhc's own are
        for folder in (s.moved_to.parent, s.moved_to.parent.parent):
            assert folder.stat().st_mode & 0o777 == 0o700, folder
    assert s.rows() == ([], [(f"claude-code:{s.old}", 1)])
    assert s.registry.current_session(s.thread) == s.old

    for args in ((), ("--apply",)):
        again = run_script(iso_env, *args)
        assert again.returncode == 0 and "nothing to do" in again.stdout
    assert s.moved_to.exists()


def test_live_owner_is_skipped(iso_env):
    s = State(iso_env, cc_lhc.process_identity())   # this test process: alive
    for args in ((), ("--apply",)):
        p = run_script(iso_env, *args)
        assert p.returncode == 0, p.stderr
        assert "session still running" in p.stdout and "nothing to do" in p.stdout
    assert s.transcript.exists() and s.rows()[0] == [(s.new, "pending")]


def test_reused_pid_is_not_alive(iso_env):
    me = cc_lhc.process_identity()
    s = State(iso_env, dict(me, start=me["start"] + 1))   # same pid, another process's start
    p = run_script(iso_env, "--apply")
    assert "rolled back" in p.stdout and s.moved_to.exists()


def test_thread_owned_by_a_running_cc_lhc_is_skipped(iso_env):
    s = State(iso_env, dead_identity())
    lease = cc_lhc.Lease(s.home, s.thread)
    lease.acquire()
    try:
        for args in ((), ("--apply",)):
            p = run_script(iso_env, *args)
            assert p.returncode == 0 and "still running" in p.stdout, p.stdout
        assert s.transcript.exists()
    finally:
        lease.release()
    assert "rolled back" in run_script(iso_env, "--apply").stdout


def test_missing_stored_path_found_under_claude_config_dir(iso_env, tmp_path):
    s = State(iso_env, dead_identity(), stored_path=str(tmp_path / "elsewhere" / "gone.jsonl"))
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0 and str(s.transcript) in p.stdout
    assert s.moved_to.exists() and not s.transcript.exists()
    assert s.rows()[0] == []


def test_no_transcript_anywhere_still_clears_the_record(iso_env):
    s = State(iso_env, dead_identity())
    s.transcript.unlink()
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0 and "no transcript found" in p.stdout
    assert s.rows() == ([], [(f"claude-code:{s.old}", 1)])


def test_accepted_swap_awaiting_pointer_repair_is_left_for_cc_lhc(iso_env):
    """accept() saw the new session accept the prompt but could not write the
    registry: the rebuild is still 'pending' there and a pointer repair is recorded. Neither
    the script nor recovery may treat it as unused; recovery advances the pointer."""
    s = State(iso_env, dead_identity())
    hostdb = cc_lhc.HostDB(s.home)
    with cc_lhc.Tx(hostdb.db) as db:
        db.execute("INSERT INTO pointer_repairs (thread_id, from_session, to_session, created) "
                   "VALUES (?, ?, ?, 'now')", (s.thread, s.old, s.new))
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0 and "was accepted" in p.stdout and s.new in p.stdout
    assert s.transcript.exists()

    cc_lhc.recover_thread(s.home, s.registry, hostdb, s.thread)
    assert s.registry.current_session(s.thread) == s.new
    assert s.rows()[0] == [(s.new, "accepted")]
    assert s.transcript.exists() and not s.moved_to.exists()
    assert "nothing to do" in run_script(iso_env).stdout


def test_recovery_moves_the_same_rebuild_the_script_would(iso_env):
    s = State(iso_env, dead_identity())
    cc_lhc.recover_thread(s.home, s.registry, cc_lhc.HostDB(s.home), s.thread)
    assert s.moved_to.exists() and not s.transcript.exists()
    assert s.rows()[0] == [(s.new, "abandoned")]
    assert s.registry.current_session(s.thread) == s.old
    assert "nothing to do" in run_script(iso_env).stdout


def grow_rebuild(s: State) -> tuple[int, int]:
    """Record the rebuild's replayed prefix in cc-lhc.sqlite (as record_lineage does), then
    append what Claude wrote after accepting the prompt: the transcript outgrows its prefix."""
    prefix = s.transcript.stat().st_size
    hostdb = cc_lhc.HostDB(s.home)
    with cc_lhc.Tx(hostdb.db) as db:
        db.execute("INSERT INTO sessions (session_id, thread_id, rollout_path, cwd, captured_offset, "
                   "replayed_prefix_bytes, created, updated) VALUES (?, ?, ?, ?, ?, ?, 'now', 'now')",
                   (s.new, s.thread, str(s.transcript), s.cwd, prefix, prefix))
    hostdb.db.close()
    with s.transcript.open("a") as f:
        f.write(json.dumps({"type": "user", "uuid": str(uuid.uuid4()), "sessionId": s.new,
                            "message": {"role": "user", "content": "typed after the rebuild"}}) + "\n")
    return prefix, s.transcript.stat().st_size


def test_rebuild_grown_past_its_prefix_is_skipped_unless_discard_unsaved(iso_env):
    s = State(iso_env, dead_identity())
    _prefix, size = grow_rebuild(s)
    content, before = s.transcript.read_bytes(), s.rows()
    for args in ((), ("--apply",)):
        p = run_script(iso_env, *args)
        assert p.returncode == 0, p.stderr
        assert "skipped" in p.stdout and s.new in p.stdout
        assert "Claude wrote into it after cc-lhc stopped" in p.stdout
        assert "launch the newer cc-lhc on that thread once" in p.stdout.lower()
        assert "--discard-unsaved" in p.stdout
        assert "nothing to do" in p.stdout and "1 holding records Claude wrote" in p.stdout
        assert "still running" not in p.stdout
        assert s.transcript.read_bytes() == content and not s.moved_to.exists()
        assert s.rows() == before

    dry = run_script(iso_env, "--discard-unsaved")
    assert dry.returncode == 0 and "would roll back" in dry.stdout, dry.stdout
    assert s.transcript.read_bytes() == content and s.rows() == before

    done = run_script(iso_env, "--apply", "--discard-unsaved")
    assert done.returncode == 0, done.stderr
    assert "rolled back" in done.stdout and "not kept in the thread" in done.stdout
    assert not s.transcript.exists() and s.moved_to.read_bytes() == content
    assert s.moved_to.stat().st_size == size
    assert s.rows() == ([], [(f"claude-code:{s.old}", 1)])
    assert s.registry.current_session(s.thread) == s.old


def test_rebuild_not_grown_past_its_prefix_is_rolled_back(iso_env):
    s = State(iso_env, dead_identity())
    hostdb = cc_lhc.HostDB(s.home)
    with cc_lhc.Tx(hostdb.db) as db:
        db.execute("INSERT INTO sessions (session_id, thread_id, replayed_prefix_bytes) VALUES (?, ?, ?)",
                   (s.new, s.thread, s.transcript.stat().st_size))
    hostdb.db.close()
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0 and "rolled back" in p.stdout, p.stdout
    assert s.moved_to.exists() and not s.transcript.exists()


def test_grown_rebuild_is_settled_by_cc_lhc_recovery_then_nothing_to_do(iso_env):
    """The advice the script gives works: cc-lhc's recovery keeps the content and, since
    Claude worked in the rebuild, completes the swap onto it (nothing is left pending)."""
    s = State(iso_env, dead_identity())
    grow_rebuild(s)
    assert "Claude wrote into it" in run_script(iso_env, "--apply").stdout
    hostdb = cc_lhc.HostDB(s.home)
    cc_lhc.recover_thread(s.home, s.registry, hostdb, s.thread)
    assert s.transcript.exists() and not s.moved_to.exists()
    assert s.rows()[0] == [(s.new, "accepted")]
    assert s.registry.current_session(s.thread) == s.new
    store = cc_lhc.ThreadStore(s.home, s.thread)
    try:
        assert store.db.execute("SELECT 1 FROM messages WHERE text = 'typed after the rebuild'").fetchone()
    finally:
        store.close()
    assert "nothing to do" in run_script(iso_env).stdout


def test_recovery_completes_a_grown_rebuild_only_when_it_is_provably_ours_and_still_next(iso_env):
    """A rebuild Claude worked in becomes the thread's session only if the file is provably
    cc-lhc's rebuild of that thread and the thread is still on the session it was built
    from; otherwise it is settled as abandoned (the file left where it is when unproven)."""
    stranger = State(iso_env, dead_identity())
    grow_rebuild(stranger)
    lines = stranger.transcript.read_text().splitlines()
    # (the same length, so what Claude appended still starts where the prefix ends)
    lines[0] = json.dumps({"type": "user", "message": {"role": "user", "content": "not a rebuild".ljust(
        len(lines[0]) - len(json.dumps({"type": "user", "message": {"role": "user", "content": ""}})))}})
    stranger.transcript.write_text("\n".join(lines) + "\n")
    cc_lhc.recover_thread(stranger.home, stranger.registry, cc_lhc.HostDB(stranger.home), stranger.thread)
    assert stranger.rows()[0] == [(stranger.new, "abandoned")]
    assert stranger.registry.current_session(stranger.thread) == stranger.old
    assert stranger.transcript.exists() and not stranger.moved_to.exists()

    overtaken = State(iso_env, dead_identity())
    grow_rebuild(overtaken)
    later = str(uuid.uuid4())
    with cc_lhc.Tx(overtaken.registry.db) as db:
        db.execute("UPDATE aliases SET is_current = 0 WHERE thread_id = ?", (overtaken.thread,))
        db.execute("INSERT INTO aliases (alias, thread_id, session_id, is_current, created) "
                   "VALUES (?, ?, ?, 1, 'now')", (cc_lhc.session_alias(later), overtaken.thread, later))
    cc_lhc.recover_thread(overtaken.home, overtaken.registry, cc_lhc.HostDB(overtaken.home), overtaken.thread)
    assert (overtaken.new, "abandoned") in overtaken.rows()[0]
    assert overtaken.registry.current_session(overtaken.thread) == later


def test_summary_counts_each_skip_reason(iso_env):
    repair = State(iso_env, dead_identity())
    hostdb = cc_lhc.HostDB(repair.home)
    with cc_lhc.Tx(hostdb.db) as db:
        db.execute("INSERT INTO pointer_repairs (thread_id, from_session, to_session, created) "
                   "VALUES (?, ?, ?, 'now')", (repair.thread, repair.old, repair.new))
    hostdb.db.close()
    p = run_script(iso_env)
    assert p.returncode == 0
    assert "nothing to do: 1 unaccepted rebuild(s), all skipped: 1 accepted, awaiting their pointer repair" \
        in p.stdout
    assert "still running" not in p.stdout

    State(iso_env, cc_lhc.process_identity())   # alive
    grow_rebuild(State(iso_env, dead_identity()))
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0
    assert ("all skipped: 1 still running, 1 accepted, awaiting their pointer repair, "
            "1 holding records Claude wrote after cc-lhc stopped") in p.stdout, p.stdout

    rollable = State(iso_env, dead_identity())
    p = run_script(iso_env)
    assert "dry run: 1 to roll back, 3 skipped (1 still running, 1 accepted" in p.stdout, p.stdout
    p = run_script(iso_env, "--apply")
    assert "done: 1 rolled back, 3 skipped (1 still running" in p.stdout, p.stdout
    assert rollable.moved_to.exists()


def hand_made_registry(iso_env, rows):
    """A registry.sqlite whose rebuilds table has no column types or NOT NULL (as an older or
    hand-edited one may), so a NULL or an integer thread id really is stored as such."""
    import sqlite3
    iso_env.lhc.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(iso_env.lhc / "registry.sqlite")
    db.execute("CREATE TABLE rebuilds (session_id, thread_id, from_session, path, cwd, owner, "
               "status, created, settled)")
    db.execute("CREATE TABLE aliases (alias, thread_id, session_id, is_current, created)")
    db.executemany("INSERT INTO rebuilds VALUES (?, ?, 'old', ?, ?, ?, 'pending', ?, NULL)", rows)
    db.commit()
    db.close()


def test_null_or_integer_thread_id_is_skipped_and_counted(iso_env):
    dead = json.dumps(dead_identity())
    target = iso_env.config / "projects" / "p" / "x.jsonl"
    target.parent.mkdir(parents=True)
    target.write_text("{}\n")
    hand_made_registry(iso_env, [
        (str(uuid.uuid4()), None, str(target), str(iso_env.work), dead, "1"),
        (str(uuid.uuid4()), 42, str(target), 7, dead, "2"),
        (None, str(uuid.uuid4()), 3, None, dead, "3"),
    ])
    for args in ((), ("--apply",)):
        p = run_script(iso_env, *args)
        assert p.returncode == 0, p.stderr
        assert "Traceback" not in p.stderr
        assert "nothing to do: 3 unaccepted rebuild(s), all skipped: 3 malformed" in p.stdout, p.stdout
        assert p.stdout.count("skipped a pending record") == 3
    assert target.exists()


def test_file_outside_claude_projects_is_not_moved(iso_env, tmp_path):
    """The registry names a rebuild-looking file outside Claude's projects folder: kept."""
    s = State(iso_env, dead_identity())
    outside = tmp_path / "precious.jsonl"
    outside.write_bytes(s.transcript.read_bytes())
    s.transcript.unlink()
    with cc_lhc.Tx(s.registry.db) as db:
        db.execute("UPDATE rebuilds SET path = ? WHERE session_id = ?", (str(outside), s.new))
    p = run_script(iso_env, "--apply")
    assert p.returncode == 0, p.stderr
    projects = os.path.join(iso_env.env["CLAUDE_CONFIG_DIR"], "projects")
    assert f"not inside Claude's projects folder {projects} (is CLAUDE_CONFIG_DIR set" in p.stdout, p.stdout
    assert "1 not provably a cc-lhc rebuild" in p.stdout
    assert outside.exists() and s.rows()[0] == [(s.new, "pending")]


def test_symlink_from_projects_to_outside_is_not_moved(iso_env, tmp_path):
    s = State(iso_env, dead_identity())
    outside = tmp_path / "precious.jsonl"
    outside.write_bytes(s.transcript.read_bytes())
    s.transcript.unlink()
    s.transcript.symlink_to(outside)
    p = run_script(iso_env, "--apply")
    assert "not inside Claude's projects folder" in p.stdout, p.stdout
    assert outside.exists() and s.transcript.is_symlink()


def test_file_that_is_not_a_rebuild_is_not_moved(iso_env):
    """Inside the projects folder, but an ordinary session (no header, no recorded prefix)."""
    s = State(iso_env, dead_identity())
    s.transcript.write_text(json.dumps({"type": "user", "message": {"role": "user",
                                                                    "content": "my own work"}}) + "\n")
    p = run_script(iso_env, "--apply")
    assert "does not start as cc-lhc's rebuild of that thread" in p.stdout, p.stdout
    assert s.transcript.exists() and not s.moved_to.exists()


def test_file_matching_its_recorded_lineage_is_moved(iso_env):
    """No header (a future header wording), but exactly the prefix cc-lhc recorded writing."""
    s = State(iso_env, dead_identity())
    data = b'{"type": "user", "message": {"role": "user", "content": "other header"}}\n'
    s.transcript.write_bytes(data)
    cc_lhc.record_lineage(cc_lhc.HostDB(s.home), s.new, s.thread, str(s.transcript), s.cwd, data)
    p = run_script(iso_env, "--apply")
    assert "rolled back" in p.stdout, p.stdout
    assert s.moved_to.exists()


def test_rollback_also_leaves_the_thread_files_registry_copy(iso_env):
    """cc-lhc rebuilds a lost registry from the copy in each thread file: a rolled-back
    rebuild must not come back from there."""
    s = State(iso_env, dead_identity())
    assert run_script(iso_env, "--apply").returncode == 0
    store = cc_lhc.ThreadStore(s.home, s.thread)
    try:
        assert store.db.execute("SELECT * FROM registry_rebuilds").fetchall() == []
        assert store.db.execute("SELECT session_id FROM registry_aliases").fetchall() == [(s.old,)]
    finally:
        store.close()
    s.registry.db.close()
    for suffix in ("", "-wal", "-shm"):
        (iso_env.lhc / f"registry.sqlite{suffix}").unlink(missing_ok=True)
    registry = cc_lhc.Registry(s.home)
    assert registry.current_session(s.thread) == s.old
    assert registry.thread_for_session(s.new) is None
    assert registry.db.execute("SELECT * FROM rebuilds").fetchall() == []


def test_the_rebuilt_session_s_folder_goes_with_its_transcript(iso_env):
    """The folder beside a rebuilt transcript (the agent transcripts a rebuild is given)
    is moved with it, as cc-lhc's own recovery moves it; a dry run names it too."""
    s = State(iso_env, dead_identity())
    agents = s.transcript.parent / s.transcript.stem / "subagents"
    agents.mkdir(parents=True)
    (agents / "agent-a1.jsonl").write_text('{"type": "user"}\n')
    dry = run_script(iso_env)
    assert str(agents.parent) in dry.stdout and agents.exists()
    done = run_script(iso_env, "--apply")
    assert done.returncode == 0, done.stderr
    assert not agents.parent.exists()
    assert (s.moved_to.parent / s.moved_to.stem / "subagents" / "agent-a1.jsonl").read_text() == '{"type": "user"}\n'
