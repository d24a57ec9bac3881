"""Launch edge cases: forks, reused session ids, ownership during rollout write, broken
state, a vanished working folder, and a project that shadows the standard library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import cc_lhc
from conftest import CC_LHC
from fakeapi import text_reply, tool_results, tool_use_reply
from realcli import log_events


def lhc(rc, *args, **kw):
    return rc.run([sys.executable, CC_LHC, *args], **kw)


def first_session(rc, prompt="the original topic", reply="noted") -> str:
    rc.api.script([reply])
    p = lhc(rc, "-p", prompt, "--output-format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["session_id"]


def threads(rc) -> list[dict]:
    return json.loads(lhc(rc, "threads", "--json").stdout)


def test_fork_session_becomes_a_thread_of_its_own(real_claude):
    source = first_session(real_claude)
    real_claude.api.script(["forked reply"])
    p = lhc(real_claude, "--resume", source, "--fork-session", "-p", "in the fork",
            "--output-format", "json")
    assert p.returncode == 0, p.stderr
    fork = json.loads(p.stdout)["session_id"]
    assert fork != source and real_claude.api.message_requests[-1]["session_id"] == fork
    by_session = {t["current_session"]: t for t in threads(real_claude)}
    assert set(by_session) == {source, fork}
    assert by_session[source]["messages"] == 2  # the source thread is untouched
    export = json.loads(lhc(real_claude, "export", by_session[fork]["id"]).stdout)
    texts = [m.get("text") for m in export]
    assert texts[:2] == ["the original topic", "noted"] and texts[-2:] == ["in the fork", "forked reply"]


def test_a_launch_claude_refuses_leaves_no_empty_thread(real_claude):
    kept = first_session(real_claude)
    p = lhc(real_claude, "-p", "hi", "--no-such-claude-option")
    assert p.returncode == 1 and "--no-such-claude-option" in p.stderr
    assert [t["current_session"] for t in threads(real_claude)] == [kept]
    files = list((real_claude.iso.lhc / "threads").glob("*.sqlite"))
    assert [f.stem for f in files] == [threads(real_claude)[0]["id"]]
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    assert [e["reason"] for e in log_events(real_claude, "empty_thread_dropped")] and \
        cc_lhc.HostDB(home).db.execute("SELECT count(*) FROM sessions").fetchone()[0] == 1
    # its lease's lock file went with it: one lock file a thread that exists
    assert len(list((real_claude.iso.lhc / "owners").glob("*.lock"))) == 1


def test_reusing_a_known_session_id_is_a_clear_refusal(real_claude):
    sid = first_session(real_claude)
    p = lhc(real_claude, "--session-id", sid, "-p", "again")
    assert p.returncode == 2 and f"--resume {sid}" in p.stderr and "Traceback" not in p.stderr


def test_rollout_write_waits_for_no_one_while_a_session_owns_the_thread(real_claude):
    sid = first_session(real_claude)
    (thread,) = threads(real_claude)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    lease = cc_lhc.Lease(home, thread["id"])
    lease.acquire()  # as a live cc-lhc session would hold it
    try:
        p = lhc(real_claude, "rollout", "write", "--thread-id", thread["id"][:8],
                "--session-id", str(uuid.uuid4()))
    finally:
        lease.release()
    assert p.returncode == 2 and "already in use" in p.stderr
    assert "rollout write moves its current session, so it can run only once that session ends" in p.stderr
    assert "second Claude" not in p.stderr  # (it starts none)
    assert threads(real_claude)[0]["current_session"] == sid


def test_a_corrupt_registry_is_named_not_a_traceback(iso_env):
    (iso_env.lhc / "registry.sqlite").write_bytes(b"this is not a database" * 100)
    p = subprocess.run([sys.executable, CC_LHC, "threads"], env=iso_env.env, capture_output=True,
                       text=True, cwd=iso_env.work)
    assert p.returncode == 1 and "registry.sqlite" in p.stderr and "Traceback" not in p.stderr


def test_launch_from_a_folder_that_was_removed(iso_env, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    p = subprocess.run(f"cd {gone} && rmdir {gone} && {sys.executable} {CC_LHC} -p hi",
                       shell=True, env=iso_env.env, capture_output=True, text=True)
    assert p.returncode == 2 and "no longer exists" in p.stderr and "Traceback" not in p.stderr


def test_a_project_json_py_does_not_shadow_retrieval(real_claude):
    # Claude's Bash runs in the user's project; a json.py there must not reach cc-lhc.
    (real_claude.cwd / "json.py").write_text("raise SystemExit('shadowed the standard library')\n")
    sid = first_session(real_claude, "remember 9917", "remembered")
    real_claude.api.script([tool_use_reply("Bash", {"command": "cc-lhc get-messages m1",
                                                    "description": "read back"}), "done"])
    p = lhc(real_claude, "--resume", sid, "-p", "what was it?", "--allowedTools", "Bash")
    assert p.returncode == 0, p.stderr
    (result,) = tool_results(real_claude.api.message_requests[-1]["body"])
    content = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert "remember 9917" in content and "shadowed" not in content


# -- cleanup at the end of a session runs whatever state the terminal is in ---------------------

class _DeadTerminal:
    """A stderr whose terminal was closed: every write fails as a hung-up tty does."""

    def __init__(self, errno_):
        self.errno = errno_

    def write(self, _text):
        raise OSError(self.errno, "terminal gone")

    def flush(self):
        raise OSError(self.errno, "terminal gone")


def test_say_on_a_dead_terminal_does_not_raise(monkeypatch):
    import errno
    for code in (errno.EIO, errno.EBADF, errno.EPIPE):
        monkeypatch.setattr(sys, "stderr", _DeadTerminal(code))
        cc_lhc.say("the window was closed")


def ending_session(iso_env, accepted: bool):
    """A ManagedSession at its end: a live descriptor and a pending rebuild to settle."""
    import types
    home = cc_lhc.StateHome()
    registry, hostdb = cc_lhc.Registry(home), cc_lhc.HostDB(home)
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    thread = registry.create_thread(old, str(iso_env.work), "fresh")
    path = iso_env.work / f"{new}.jsonl"
    path.write_text("prefix\n" + ("answer\n" if accepted else ""))
    cc_lhc.record_pending(registry, thread, old, types.SimpleNamespace(session_id=new, path=str(path)),
                          str(iso_env.work))
    capture = types.SimpleNamespace(thread_id=thread, session_id=new, lines=0, lease=None,
                                    stop=lambda: None)
    spec = types.SimpleNamespace(print_mode=True, session_id=new)
    session = cc_lhc.ManagedSession(spec, home, None, capture)
    session.descriptor = cc_lhc.create_descriptor(home, hostdb, thread, new)
    session.pending = cc_lhc.PendingRebuild(new, old, str(path), len("prefix\n"))
    session.notices = ["a notice for the closed window"]
    return session, registry, hostdb, new


def assert_cleaned_up(session, registry, hostdb, new, status):
    assert not os.path.exists(session.descriptor["path"])
    assert not os.path.exists(session.descriptor["shim_dir"])
    [(revoked,)] = hostdb.db.execute("SELECT revoked FROM descriptors WHERE token = ?",
                                     (session.descriptor["token"],)).fetchall()
    assert revoked and "session ended" in revoked
    assert registry.db.execute("SELECT status FROM rebuilds WHERE session_id = ?",
                               (new,)).fetchone() == (status,)


def test_session_end_cleans_up_when_the_terminal_is_gone(iso_env, monkeypatch):
    import errno
    session, registry, hostdb, new = ending_session(iso_env, accepted=False)
    monkeypatch.setattr(sys, "stderr", _DeadTerminal(errno.EIO))
    session.__exit__(None, None, None)
    assert_cleaned_up(session, registry, hostdb, new, "abandoned")


def test_every_cleanup_step_runs_when_an_earlier_one_fails(iso_env, monkeypatch):
    import errno

    def broken_say(_message):
        raise OSError(errno.EIO, "Input/output error")

    session, registry, hostdb, new = ending_session(iso_env, accepted=False)
    monkeypatch.setattr(cc_lhc, "say", broken_say)
    session.__exit__(None, None, None)
    assert_cleaned_up(session, registry, hostdb, new, "abandoned")

    session, registry, hostdb, new = ending_session(iso_env, accepted=True)
    session.capture.stop = lambda: broken_say("")   # capture's last read fails too
    session.__exit__(None, None, None)
    assert_cleaned_up(session, registry, hostdb, new, "accepted")
    assert registry.current_session(session.capture.thread_id) == new


def test_a_leftover_descriptor_of_a_dead_owner_is_swept_at_the_next_launch(real_claude):
    """A wrapper killed between writing its descriptor and recording it: only the file
    (and its shim folder) is left, no row in cc-lhc.sqlite names it."""
    rc = real_claude
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    dead = cc_lhc.process_identity(p.pid)
    p.kill()
    p.wait()
    runtime = rc.iso.lhc / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    left = runtime / "0123456789abcdef.json"
    left.write_text(json.dumps({"version": 1, "token": "0123456789abcdef" * 2, "thread_id": "t",
                                "session_id": "s", "owner": dead}))
    (runtime / "bin-0123456789abcdef").mkdir()
    first_session(rc)
    assert not left.exists() and not (runtime / "bin-0123456789abcdef").exists()
    assert not list(runtime.glob("*.json"))


def test_a_worktree_session_is_captured_where_claude_writes_it(real_claude):
    # `claude -w NAME` runs in <repo>/.claude/worktrees/NAME, so its transcript lands in the
    # projects folder of that path, not of the folder cc-lhc was started in.
    rc = real_claude
    for cmd in (["git", "init", "-q"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(cmd, cwd=rc.cwd, check=True)
    rc.api.script(["answered in the worktree"])
    p = lhc(rc, "-w", "feat", "-p", "hello from a worktree", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    [written] = list((rc.iso.config / "projects").glob(f"*/{sid}.jsonl"))
    assert written.parent != rc.project_dir
    [thread] = threads(rc)
    assert thread["current_session"] == sid
    texts = [m.get("text") for m in json.loads(lhc(rc, "export", thread["id"]).stdout)]
    assert texts == ["hello from a worktree", "answered in the worktree"]
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    assert cc_lhc.HostDB(home).session(sid)["rollout_path"] == str(written)


def _git_repo(rc):
    for cmd in (["git", "init", "-q"],
                ["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "x"]):
        subprocess.run(cmd, cwd=rc.cwd, check=True)


def test_a_rebuilt_worktree_session_goes_on_in_the_worktree(real_claude):
    # Claude's own --resume of a -w session, from the repository folder, goes back into the
    # worktree (its worktree-state record says where): so must the session Smart Compact
    # writes for it, or Claude would go on editing the main checkout.
    rc = real_claude
    _git_repo(rc)
    over = {"input_tokens": 370_000, "cache_creation_input_tokens": 600, "cache_read_input_tokens": 400,
            "output_tokens": 5}
    rc.api.script([text_reply("first answer", usage=over)])
    p = lhc(rc, "-w", "feat", "-p", "start in a worktree", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    old = json.loads(p.stdout)["session_id"]
    rc.api.script(["answered after the rebuild"])
    p = lhc(rc, "--resume", old, "-p", "where am I", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    assert "Smart Compact" in p.stderr
    new = json.loads(p.stdout)["session_id"]
    assert new != old
    [path] = list((rc.iso.config / "projects").glob(f"*/{new}.jsonl"))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    worktree = str(rc.cwd / ".claude" / "worktrees" / "feat")
    [prompt] = [r for r in records if r.get("type") == "user" and r["message"]["content"] == "where am I"]
    assert prompt["cwd"] == worktree
    assert records[0]["cwd"] == worktree          # the rebuilt records name the worktree as their folder
    states = [r for r in records if r.get("type") == "worktree-state"]
    assert states and all(s["sessionId"] == new and s["worktreeSession"]["sessionId"] == new for s in states)
    assert states[0]["worktreeSession"]["worktreePath"] == worktree


def test_a_one_shot_continue_in_a_folder_with_no_session_is_captured(real_claude):
    """`claude -p -c` with nothing to continue starts a new conversation (an interactive
    `-c` says there is none instead); cc-lhc captures that conversation, so the next
    `-c` goes on with it as a thread, with retrieval and Smart Compact."""
    rc = real_claude
    rc.api.script(["Noted: PINEAPPLE."])
    p = lhc(rc, "-p", "-c", "remember the word PINEAPPLE", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    [thread] = threads(rc)
    assert thread["current_session"] == sid and thread["messages"] == 2
    rc.api.script(["It was PINEAPPLE."])
    p = lhc(rc, "-p", "--continue", "what was the word?", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["session_id"] == sid and "PINEAPPLE" in json.dumps(
        rc.api.message_requests[-1]["body"]["messages"][0])
    assert [t["messages"] for t in threads(rc)] == [4]


def test_a_session_id_given_in_capitals_names_its_thread_in_either_case(real_claude):
    """Claude takes `--session-id` in capitals and keeps it so; the thread's commands find
    the thread by that id however it is typed."""
    rc = real_claude
    sid = "AAAAAAAA-BBBB-4CCC-8DDD-EEEEEEEEEEEE"
    rc.api.script(["noted, in capitals"])
    p = lhc(rc, "-p", "--session-id", sid, "a session named in capitals")
    assert p.returncode == 0, p.stderr
    [thread] = threads(rc)
    for given in (sid, sid.lower()):
        p = lhc(rc, "export", given, "--format", "json")
        assert p.returncode == 0, p.stderr
        assert [m["text"] for m in json.loads(p.stdout)] == ["a session named in capitals", "noted, in capitals"]
        p = lhc(rc, "search", "capitals", "--thread", given)
        assert p.returncode == 0 and thread["id"][:8] in p.stdout, p.stderr


def test_a_session_in_a_project_folder_that_is_a_link_resumes_as_it_is(real_claude, tmp_path):
    """Claude reads sessions through a projects folder that is a link to another place, so
    cc-lhc resumes such a session as it is (it took it for one Claude cannot find, and
    wrote the conversation again at every launch)."""
    rc = real_claude
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rc.project_dir.parent.mkdir(parents=True, exist_ok=True)
    rc.project_dir.symlink_to(elsewhere, target_is_directory=True)
    sid = first_session(rc, "remember the word KIWI", "Noted: KIWI.")
    for _ in range(2):
        rc.api.script(["It was KIWI."])
        p = lhc(rc, "-p", "-c", "what was the word?", "--output-format", "json")
        assert p.returncode == 0 and "does not look for sessions" not in p.stderr, p.stderr
        assert json.loads(p.stdout)["session_id"] == sid


def test_resuming_a_session_another_cc_lhc_runs_names_that_cc_lhc(real_claude, tmux):
    """The thread's lease speaks first: the refusal names the cc-lhc holding it (and what
    to do), not its Claude as if it were one running on its own."""
    from realcli import PROMPT, exit_cleanly, type_line
    rc = real_claude
    sid = first_session(rc)
    rc.api.script(["still here"])
    t = tmux([sys.executable, str(CC_LHC), "--resume", sid], cols=100, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "are you there?")
    t.wait_for("still here")
    p = lhc(rc, "-p", "again", "--resume", sid)
    assert p.returncode == 2 and "already in use by cc-lhc pid" in p.stderr, p.stderr
    assert "--fork-session" in p.stderr and "open in another Claude" not in p.stderr
    exit_cleanly(t)


def test_a_claude_killed_under_cc_lhc_is_said_with_the_way_back(real_claude, tmux):
    """Claude dying of a signal no one asked for (an out-of-memory kill, a crash) ends the
    session with a line saying so and how to go on, not in silence."""
    import signal
    from realcli import PROMPT, log_events, type_line, wait_for_log
    rc = real_claude
    rc.api.script(["still here", "here after the clear"])
    t = tmux(f"{sys.executable} {CC_LHC}; echo EXIT=$?", cols=250, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("still here")
    type_line(t, "/clear")  # (the line names the thread Claude is on at the end)
    wait_for_log(rc, "session_followed")
    type_line(t, "hello again")
    t.wait_for("here after the clear")
    (started,) = log_events(rc, "child_started")
    (followed,) = log_events(rc, "session_followed")
    os.kill(started["child_pid"], signal.SIGKILL)
    t.wait_for("EXIT=")
    screen = t.capture(history=True)
    assert "EXIT=137" in screen, screen
    assert "Claude ended by signal SIGKILL, not by itself" in screen and "cc-lhc --continue" in screen, screen
    assert f"in thread {followed['thread'][:8]}" in screen and f"--resume {followed['new_session']}" in screen


def _record(kind, text, parent, session):
    uid = str(uuid.uuid4())
    message = ({"role": "user", "content": text} if kind == "user" else
               {"id": "msg_" + uid[:8], "type": "message", "role": "assistant", "model": "claude-opus-5-5",
                "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                "usage": {"input_tokens": 100, "output_tokens": 7}})
    return {"parentUuid": parent, "isSidechain": False, "type": kind, "message": message, "uuid": uid,
            "timestamp": "2026-11-30T10:00:00.000Z", "sessionId": session, "cwd": "/w", "version": "2.1.328"}


def _line(rec) -> bytes:
    return json.dumps(rec, ensure_ascii=False).encode() + b"\n"


def _session_file(fake, session, data: bytes):
    folder = Path(fake.env["CLAUDE_CONFIG_DIR"]) / "projects" / cc_lhc.project_slug(str(fake.cwd))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{session}.jsonl"
    path.write_bytes(data)
    return path


def test_a_whole_last_record_holding_a_byte_that_is_not_utf8_gets_its_newline(fake_claude):
    """A whole record the file ends on without its newline gets one before Claude resumes
    the file, also when it holds a byte that is not UTF-8 (read as U+FFFD, as capture reads
    any line): it was taken for a torn fragment, cut out of Claude's transcript and kept
    only under torn-lines/."""
    session = str(uuid.uuid4())
    u1 = _record("user", "first prompt", None, session)
    a1 = _record("assistant", "first answer", u1["uuid"], session)
    last = _line(_record("user", "caf\u00e9 last prompt", a1["uuid"], session)).rstrip(b"\n")
    last = last.replace("\u00e9".encode(), b"\xe9")
    path = _session_file(fake_claude, session, _line(u1) + _line(a1) + last)
    p = subprocess.run([sys.executable, str(CC_LHC), "--resume", session, "-p", "hi"], env=fake_claude.env,
                       cwd=fake_claude.cwd, capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 0, p.stderr
    assert path.read_bytes().startswith(_line(u1) + _line(a1) + last + b"\n")
    (thread,) = cc_lhc.Registry(cc_lhc.StateHome(fake_claude.env["CC_LHC_HOME"])).threads()
    out = subprocess.run([sys.executable, str(CC_LHC), "export", thread[0]], env=fake_claude.env,
                         capture_output=True, text=True, timeout=60)
    assert "caf\ufffd last prompt" in [m.get("text") for m in json.loads(out.stdout)]
    assert cc_lhc.whole_record(last) and not cc_lhc.whole_record(last[:-3])


def test_continue_passes_over_a_link_that_leads_nowhere_among_claude_s_sessions(fake_claude):
    """No thread in the folder yet: `--continue` takes Claude's newest session, and a link
    among them that leads nowhere (or a file Claude Code removes meanwhile) is passed over
    (it ended the launch with FileNotFoundError)."""
    session = str(uuid.uuid4())
    u1 = _record("user", "good prompt", None, session)
    path = _session_file(fake_claude, session, _line(u1) + _line(_record("assistant", "good answer", u1["uuid"],
                                                                         session)))
    os.utime(path, (1_700_000_000, 1_700_000_000))
    os.symlink("/nonexistent/gone.jsonl", path.parent / f"{uuid.uuid4()}.jsonl")
    os.symlink("loop.jsonl", path.parent / "loop.jsonl")  # (not a session's name: never looked at)
    p = subprocess.run([sys.executable, str(CC_LHC), "--continue", "-p", "hi"], env=fake_claude.env,
                       cwd=fake_claude.cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert p.returncode == 0, p.stderr
    (thread,) = cc_lhc.Registry(cc_lhc.StateHome(fake_claude.env["CC_LHC_HOME"])).threads()
    assert thread[4] == session
