"""Claude's own session moves inside a cc-lhc session (/clear, in-app /resume, /compact),
typed as a person would, in tmux, with the real Claude Code CLI.

What the pinned CLI (2.1.328) does, measured here: /clear opens a new session file in the
same project folder (its first records are the /clear command itself) and rewrites
$CLAUDE_CONFIG_DIR/sessions/<pid>.json with the new sessionId; /compact stays in the same
file and writes system/compact_boundary plus an isCompactSummary user record.
"""

from __future__ import annotations

import json
import sys
import uuid

import pytest

import cc_lhc
from fakeapi import text_reply, tool_use_reply
from realcli import CC_LHC, OVER_USAGE, PROMPT, exit_cleanly, log_events, type_line, wait_for_log


def lhc_json(rc, *args):
    p = rc.run([sys.executable, CC_LHC, *args])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def views_text(rc, thread_id: str) -> str:
    """The texts the thread's views hold now (load_turns: off-branch turns left out), as JSON."""
    store = cc_lhc.ThreadStore(cc_lhc.StateHome(rc.env["CC_LHC_HOME"]), thread_id)
    try:
        return json.dumps([m.get("text") for turn in cc_lhc.load_turns(store) for m in turn.messages])
    finally:
        store.close()


def texts(rc, thread_id: str) -> list:
    return [m.get("text") for m in lhc_json(rc, "export", thread_id)]


def test_clear_is_followed_as_a_new_thread_that_is_captured_retrieved_and_compacted(real_claude, tmux):
    real_claude.api.script([
        "first answer, before the clear",
        # In the new conversation the model reads its own first turn back through Bash:
        # the descriptor must now be bound to the new thread.
        tool_use_reply("Bash", {"command": "cc-lhc get-turns t1", "description": "read back"}),
        text_reply("second answer, after the clear", usage=OVER_USAGE),
        "answered on the rebuilt session",
    ])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Bash"],
             cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello before the clear")
    t.wait_for("first answer, before the clear")
    (old_thread,) = [r["id"] for r in lhc_json(real_claude, "threads", "--json")]
    type_line(t, "/clear")
    wait_for_log(real_claude, "session_followed")
    (followed,) = log_events(real_claude, "session_followed")
    assert followed["kind"] == "clear" and followed["created"]
    # the advisory line, then the line saying what happened
    notices = [e["text"] for e in log_events(real_claude, "notice")]
    assert notices[0] == cc_lhc.LIFECYCLE_NOTES["clear"]
    assert any("follows it as thread" in n for n in notices[1:])
    new_thread = followed["thread"]
    assert new_thread != old_thread

    type_line(t, "hello after the clear")
    t.wait_for("second answer, after the clear")
    # retrieval answered from the new thread (its t1 is the caveat Claude writes for /clear),
    # not from the thread the descriptor was first issued for
    bash_result = json.dumps(real_claude.api.message_requests[2]["body"]["messages"][-1])
    assert "local-command-caveat" in bash_result and "hello before the clear" not in bash_result
    assert "refused" not in bash_result
    # over the trigger in the new conversation: Smart Compact swaps it like any other
    wait_for_log(real_claude, "handoff_switched")
    t.wait_for("This conversation was rebuilt by Smart Compact")
    t.wait_for(PROMPT)
    type_line(t, "carry on")
    t.wait_for("answered on the rebuilt session")
    exit_cleanly(t)

    assert texts(real_claude, old_thread) == ["hello before the clear", "first answer, before the clear"]
    after = texts(real_claude, new_thread)
    assert "hello after the clear" in after and "carry on" in after
    assert "hello before the clear" not in after
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    revoked = cc_lhc.HostDB(home).db.execute(
        "SELECT revoked FROM descriptors WHERE thread_id = ?", (old_thread,)).fetchall()
    assert revoked and all(r[0] for r in revoked)  # the old binding refuses
    handoff = log_events(real_claude, "handoff_switched")[0]
    assert handoff["thread"] == new_thread


def test_in_app_resume_follows_a_free_thread_and_refuses_a_held_one(real_claude, tmux):
    # Two earlier sessions, each its own thread.
    sessions = []
    for prompt in ("the free topic", "the held topic"):
        real_claude.api.script([f"noted: {prompt}"])
        p = real_claude.run([sys.executable, CC_LHC, "-p", prompt, "--output-format", "json"])
        assert p.returncode == 0, p.stderr
        sessions.append(json.loads(p.stdout)["session_id"])
    free, held = sessions
    by_session = {r["current_session"]: r["id"] for r in lhc_json(real_claude, "threads", "--json")}
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    lease = cc_lhc.Lease(home, by_session[held])
    lease.acquire()  # as another live cc-lhc would hold it
    try:
        real_claude.api.script(["answer in the first window", "back on the free topic",
                                "back again after the refusal"])
        t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
        t.wait_for(PROMPT)
        type_line(t, "a fresh start")
        t.wait_for("answer in the first window")
        type_line(t, f"/resume {free}")
        wait_for_log(real_claude, "session_followed")
        (followed,) = log_events(real_claude, "session_followed")
        assert followed["kind"] == "resume" and followed["thread"] == by_session[free]
        assert not followed["created"]
        t.wait_for(PROMPT)
        type_line(t, "more on it")
        t.wait_for("back on the free topic")
        type_line(t, f"/resume {held}")
        wait_for_log(real_claude, "follow_refused")
        notices = [e["text"] for e in log_events(real_claude, "notice")]
        assert any(f"whose thread {by_session[held][:8]} is held by cc-lhc pid {cc_lhc.os.getpid()}" in n
                   for n in notices)
        assert not any("nothing was queued" in n for n in notices)
        # retrieval in this window tells Claude why it is withdrawn, not that it is broken
        revoked = [r for (r,) in cc_lhc.HostDB(home).db.execute("SELECT revoked FROM descriptors")
                   if r and "is held" in r]
        assert len(revoked) == 1 and cc_lhc._withdrawn(home, cc_lhc.HostDB(home).db.execute(
            "SELECT path FROM descriptors WHERE revoked = ?", (revoked[0],)).fetchone()).startswith(
            "retrieval in this window was withdrawn: Claude moved to session")
        # back on the session it was bound to: taken again, lease, capture and all
        t.wait_for(PROMPT)
        type_line(t, f"/resume {free}")
        wait_for_log(real_claude, "session_followed", count=2)
        with pytest.raises(cc_lhc.LhcError):
            cc_lhc.Lease(home, by_session[free]).acquire()  # this window holds it again
        t.wait_for(PROMPT)
        type_line(t, "after coming back")
        t.wait_for("back again after the refusal")
        exit_cleanly(t)
    finally:
        lease.release()
    assert texts(real_claude, by_session[free])[-4:] == ["more on it", "back on the free topic",
                                                        "after coming back", "back again after the refusal"]
    # nothing of the held thread's window was mixed into either thread
    assert texts(real_claude, by_session[held]) == ["the held topic", "noted: the held topic"]


def test_manual_compact_is_one_turn_reported_on_screen_and_in_status(real_claude, tmux):
    real_claude.api.script(["an answer worth keeping", "SUMMARY OF THE CONVERSATION"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "remember the number 4711")
    t.wait_for("an answer worth keeping")
    type_line(t, "/compact")
    wait_for_log(real_claude, "native_compact")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/status")
    t.wait_for("Claude native Compact ran")
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    real_claude.api.script(["after the compact"])  # whatever the compaction itself asked for
    type_line(t, "and now")
    t.wait_for("after the compact")
    exit_cleanly(t)
    notices = [e["text"] for e in log_events(real_claude, "notice")]
    assert notices[0] == cc_lhc.LIFECYCLE_NOTES["compact"]
    assert any(n.startswith("Claude native Compact ran") for n in notices)
    (thread,) = lhc_json(real_claude, "threads", "--json")
    kept = texts(real_claude, thread["id"])
    assert kept[:2] == ["remember the number 4711", "an answer worth keeping"]  # nothing lost
    assert kept[-2:] == ["and now", "after the compact"]
    assert any("SUMMARY OF THE CONVERSATION" in (k or "") for k in kept)
    # The views hold the turns it summarised, not its summary of them as well
    seen = views_text(real_claude, thread["id"])
    assert "remember the number 4711" in seen and "after the compact" in seen
    assert "SUMMARY OF THE CONVERSATION" not in seen


def test_no_notifier_flag_keeps_quiet_but_still_follows(real_claude, tmux):
    real_claude.api.script(["before", "after"])
    t = tmux([sys.executable, CC_LHC, "--lhc-no-notifier"], cols=110, rows=32, env=real_claude.env,
             cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "one")
    t.wait_for("before")
    type_line(t, "/clear")
    wait_for_log(real_claude, "session_followed")
    exit_cleanly(t)
    notices = [e["text"] for e in log_events(real_claude, "notice")]
    assert cc_lhc.LIFECYCLE_NOTES["clear"] not in notices
    assert any("follows it as thread" in n for n in notices)


# -- the notifier on its own (pure) --------------------------------------------------------

def _notes(*chunks: bytes) -> list:
    seen = []
    n = cc_lhc.LifecycleNotifier(seen.append)
    for chunk in chunks:
        assert n.observe(chunk) == chunk  # never changes what Claude gets
    return seen


def test_notifier_speaks_only_for_a_typed_lifecycle_command():
    typed = [bytes([c]) for c in b"/clear"]
    assert _notes(*typed, b"\r") == [cc_lhc.LIFECYCLE_NOTES["clear"]]
    assert _notes(b"/compact", b"\r") == [cc_lhc.LIFECYCLE_NOTES["compact"]]
    assert _notes(b"/resume " + str(uuid.uuid4()).encode(), b"\r") == [cc_lhc.LIFECYCLE_NOTES["resume"]]
    assert _notes(b"/clearx", b"\x7f", b"\r") == [cc_lhc.LIFECYCLE_NOTES["clear"]]  # backspace
    # the terminal's own reports between keys (focus, device attributes, tmux's DCS) are no keys
    assert _notes(b"\x1b[O", b"\x1bP>|tmux 3.3a\x1b\\", b"\x1b[?1;2c", b"/clear", b"\r") == \
        [cc_lhc.LIFECYCLE_NOTES["clear"]]


def test_notifier_stays_quiet_for_pastes_longer_messages_and_edited_lines():
    assert _notes(b"\x1b[200~/clear\x1b[201~", b"\r") == []       # a paste
    assert _notes(b"notes\r/clear\r") == []                        # several lines at once
    assert _notes(b"/clear\r") == [cc_lhc.LIFECYCLE_NOTES["clear"]]  # typed fast: still typed
    assert _notes(b"please /clear the cache", b"\r") == []         # a longer message
    assert _notes(b"/cl", b"\x1b[D", b"ear", b"\r") == []           # cursor moved: unsure
    assert _notes(b"/cl", b"\t", b"\r") == []                       # completion: unsure
    assert _notes(b"/clear", b"\x15", b"hi", b"\r") == []           # ctrl-u wiped it
    assert _notes(b"/help", b"\r") == []


def test_a_session_file_is_new_until_it_holds_an_earlier_prompt(tmp_path):
    path = tmp_path / "s.jsonl"
    assert cc_lhc.starts_a_conversation(str(path))                 # not written yet
    path.write_text('{"type":"mode","mode":"default"}\n')
    assert cc_lhc.starts_a_conversation(str(path))                 # bookkeeping only
    caveat = '{"type":"user","isMeta":true,"message":{"content":"<local-command-caveat>"}}\n'
    clear = ('{"type":"user","message":{"content":"<command-name>/clear</command-name>'
             '<command-message>clear</command-message>"}}\n')
    path.write_text(caveat + clear)
    assert cc_lhc.starts_a_conversation(str(path))
    prompt = '{"type":"user","message":{"content":"the first prompt after it"}}\n'
    path.write_text(caveat + clear + prompt)
    assert cc_lhc.starts_a_conversation(str(path))                 # (written before cc-lhc looked)
    answer = '{"type":"assistant","message":{"content":[{"type":"text","text":"an answer"}]}}\n'
    path.write_text(caveat + clear + prompt + answer)
    assert not cc_lhc.starts_a_conversation(str(path))             # one /clear began long ago, reopened
    path.write_text('{"type":"user","message":{"content":"an earlier prompt"}}\n')
    assert not cc_lhc.starts_a_conversation(str(path))             # a resumed conversation
    # a prompt sent at once after the /clear, answered before cc-lhc looked: the /clear is new
    just_now = clear.replace('{"type":"user",', f'{{"type":"user","timestamp":"{cc_lhc.utc_now_iso()}",')
    path.write_text(caveat + just_now + prompt + answer)
    assert cc_lhc.starts_a_conversation(str(path))
    long_ago = clear.replace('{"type":"user",', '{"type":"user","timestamp":"2026-01-02T03:04:05.678Z",')
    path.write_text(caveat + long_ago + prompt + answer)
    assert not cc_lhc.starts_a_conversation(str(path))


def test_a_prompt_sent_at_once_after_clear_leaves_it_said_as_a_clear(real_claude, tmux):
    """A prompt typed straight after /clear can be answered before cc-lhc looks at the new
    session file (twice a second): the answer after the /clear read as a session /clear began
    long ago, reopened, and the new conversation was said to be an in-app /resume."""
    rc = real_claude
    rc.api.responder = lambda body: text_reply("answered " + ("second" if "PB1" in json.dumps(body) else "first"))
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=30)
    type_line(t, "PA1")
    t.wait_for("answered first")
    type_line(t, "/clear")
    type_line(t, "PB1")
    t.wait_for("answered second", timeout=30)
    wait_for_log(rc, "session_followed")
    exit_cleanly(t)
    (followed,) = log_events(rc, "session_followed")
    notices = [e["text"] for e in log_events(rc, "notice")]
    assert followed["kind"] == "clear", notices
    assert any(n.startswith("/clear started a new conversation") for n in notices), notices


def _shell(real_claude, tmux):
    """An interactive bash (job control on) in a tmux pane, as a person's terminal."""
    import shlex
    t = tmux(["bash", "--norc", "--noprofile", "-i"], cols=100, rows=30,
             env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for("bash")
    t.send_text("PS1='SHELL$ '")
    t.send_keys("Enter")
    t.wait_for("SHELL$")
    t.send_text(shlex.join([sys.executable, CC_LHC]))
    t.send_keys("Enter")
    t.wait_for(PROMPT)
    return t


def _stopped(pid) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _group_stopped(leader) -> bool:
    """Whether the process group of ``leader`` is stopped as a whole. A SIGSTOP to the
    group stops a process only once it runs: Claude caught in vfork(), waiting for a child
    that the same signal stopped before its exec, stays in uninterruptible sleep ("D")
    instead, and goes on with the rest at SIGCONT. A child that ended just as Claude was
    stopped stays a zombie ("Z") until Claude runs again to reap it: it has nothing left to
    stop. Every member is then "T", "D" or "Z"."""
    import os
    states = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == leader:
            states.append(fields[0])
    return bool(states) and "T" in states and all(s in "TDZ" for s in states)


def test_ctrl_z_stops_the_job_and_fg_brings_it_back(real_claude, tmux):
    """Claude sits in a session of its own, where the kernel discards the stop it sends
    itself on ctrl-z: cc-lhc stops the job as the shell would (Claude included), and on fg
    the turn goes on where it was, with nothing lost. A SIGTSTP sent to cc-lhc does the same."""
    import os
    import re
    import signal
    import threading
    from realcli import wait_until
    hold = threading.Event()
    real_claude.api.script([dict(text_reply("the held answer"), hold=hold), "second answer", "third answer"])
    t = _shell(real_claude, tmux)
    type_line(t, "a long question")
    real_claude.api.wait_for_requests(1, answered=False)
    t.send_keys("C-z")
    t.wait_for(re.compile(r"Stopped .*cc_lhc\.py\s+SHELL\$"))
    (claude,) = [e["child_pid"] for e in log_events(real_claude, "child_started")]
    # the whole job stopped, as with claude alone (a SIGSTOP lands when Claude next runs)
    wait_until(lambda: _group_stopped(claude), "Claude stopped with the job", timeout=30)
    hold.set()
    t.send_text("fg")
    t.send_keys("Enter")
    t.wait_for("the held answer")
    type_line(t, "after fg")
    t.wait_for("second answer")
    wait_for_log(real_claude, "resumed")
    # stopped from outside: the same, Claude first asked to let go of the terminal
    (lhc,) = [e["pid"] for e in log_events(real_claude, "launch")]
    os.kill(lhc, signal.SIGTSTP)
    wait_until(lambda: _stopped(lhc) and _group_stopped(claude), "the job stopped by SIGTSTP", timeout=30)
    t.send_text("fg")
    t.send_keys("Enter")
    wait_for_log(real_claude, "resumed", count=2)
    type_line(t, "after the second fg")
    t.wait_for("third answer")
    t.send_text("/exit")
    t.send_keys("Enter")
    wait_for_log(real_claude, "child_exited")
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    export = json.loads(real_claude.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    assert [m.get("text") for m in export] == ["a long question", "the held answer", "after fg", "second answer",
                                               "after the second fg", "third answer"]


def test_a_turn_stopped_with_esc_is_over_and_its_seam_settled(real_claude, tmux):
    """Esc on a tool call Claude asks about writes a refused result and the note
    "[Request interrupted by user for tool use]": the turn is over (interrupted), so an
    idle session is at a settled seam and Smart Compact can run there; the note opened a
    prompt turn that stayed open for good before."""
    from realcli import wait_until
    rc = real_claude
    slow = "python3 -c 'import time; time.sleep(30)'"
    rc.api.script([tool_use_reply("Bash", {"command": slow, "description": "a slow one"}), "after the stop"])
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "run the slow one")
    t.wait_for("Esc to cancel")
    t.send_keys("Escape")
    [path] = rc.transcripts()
    marker = "[Request interrupted by user for tool use]"
    wait_until(lambda: marker in path.read_text(), "the interrupt note in the transcript")
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()

    def last_turn():
        store = cc_lhc.ThreadStore(home, thread_id)
        try:
            return (list(store.db.execute("SELECT kind, status, stop_reason FROM turns ORDER BY n"))[-1],
                    cc_lhc.unsettled_reason(store, idle=True))
        finally:
            store.close()
    turn, unsettled = wait_until(lambda: (lambda r: r if r[0][2] == "user_interrupt" else None)(last_turn()),
                                 "the stopped turn closed")
    assert turn[1] == "interrupted" and unsettled == ""
    type_line(t, "carry on")
    t.wait_for("after the stop")
    exit_cleanly(t)
    export = json.loads(rc.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    [note] = [m for m in export if m.get("text") == marker]
    [call] = [m for m in export if m["kind"] == "tool_call"]
    assert note["turn"] == call["turn"]              # the note ends the turn it stopped


@pytest.mark.parametrize("back", [1, 2], ids=["to-the-second-prompt", "to-the-first-prompt"])
def test_a_rewound_conversation_is_rebuilt_without_the_turns_it_went_back_over(real_claude, tmux, back):
    """Esc Esc, an earlier prompt, "Restore conversation": Claude goes on from before that
    prompt and its file keeps the abandoned turns. The thread keeps them too, and a session
    written from the thread's view leaves them out, as Claude's own resume would. Back to
    the first prompt, Claude writes the next one with no parent at all."""
    from realcli import wait_until
    rc = real_claude
    rc.api.script(["answer one", "answer two OLD-BRANCH", "answer three NEW-BRANCH"])
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "prompt one")
    t.wait_for("answer one")
    type_line(t, "prompt two")
    t.wait_for("answer two OLD-BRANCH")
    t.send_keys("Escape")
    t.send_keys("Escape")
    t.wait_for("Restore the code and/or conversation")
    for _ in range(back):
        t.send_keys("Up")
    t.send_keys("Enter")
    t.wait_for("Restore conversation")
    t.send_keys("Enter")
    wait_until(lambda: "Restore conversation" not in t.capture(), "the rewind dialog closed")
    t.send_keys("C-u")
    type_line(t, "prompt three")
    t.wait_for("answer three NEW-BRANCH")
    exit_cleanly(t)
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    export = json.loads(rc.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    texts = [m.get("text") for m in export if m["kind"] in ("user_text", "assistant_text")]
    assert texts == ["prompt one", "answer one", "prompt two", "answer two OLD-BRANCH", "prompt three",
                     "answer three NEW-BRANCH"]                  # the thread keeps every turn
    store = cc_lhc.ThreadStore(home, thread_id)
    off = {m["text"] for m in export if any(a <= int(m["label"][1:]) <= b for a, b in cc_lhc.off_branch(store))}
    store.close()
    abandoned = {"prompt two", "answer two OLD-BRANCH"} | ({"prompt one", "answer one"} if back == 2 else set())
    assert off == abandoned
    new = str(uuid.uuid4())
    w = rc.run([sys.executable, CC_LHC, "rollout", "write", "--thread-id", thread_id, "--session-id", new])
    assert w.returncode == 0, w.stderr
    rebuilt = (rc.project_dir / f"{new}.jsonl").read_text()
    assert "NEW-BRANCH" in rebuilt and not any(json.dumps(x)[1:-1] in rebuilt for x in abandoned)


def test_a_session_whose_transcript_claude_deleted_resumes_from_the_thread(real_claude):
    """Claude Code deletes old sessions' transcripts (cleanupPeriodDays); cc-lhc's thread
    still holds the conversation, so resuming such a session writes it again from the
    thread and the real CLI goes on with it, instead of finding no conversation."""
    rc = real_claude
    rc.api.script([text_reply("Noted: the build number is OLDWORK-4711.")])
    first = rc.run_lhc("-p", "remember the build number OLDWORK-4711", "--output-format", "json")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session_id"]
    (rc.project_dir / f"{sid}.jsonl").unlink()
    rc.api.script([text_reply("It was OLDWORK-4711.")])
    again = rc.run_lhc("--resume", sid, "-p", "which build number did I give you?")
    assert again.returncode == 0, again.stderr
    assert "It was OLDWORK-4711." in again.stdout
    assert f"the transcript of session {sid} is gone" in again.stderr
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert "remember the build number OLDWORK-4711" in sent and "Noted: the build number is OLDWORK-4711." in sent
    assert rc.api.message_requests[-1]["session_id"] != sid
    assert log_events(rc, "transcript_gone")


def test_a_transcript_in_another_projects_folder_is_not_taken_for_gone(real_claude):
    """Claude files a session under the folder it ran in (a worktree has its own): found
    under another folder of the same projects folder, it is that session, not a deleted
    one, so it is resumed as it is and nothing is written again."""
    import shutil
    rc = real_claude
    rc.api.script([text_reply("Noted ELSEWHERE-5150.")])
    first = rc.run_lhc("-p", "remember ELSEWHERE-5150", "--output-format", "json")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session_id"]
    other = rc.project_dir.parent / "-somewhere-else"
    other.mkdir()
    shutil.move(rc.project_dir / f"{sid}.jsonl", other / f"{sid}.jsonl")
    rc.api.script([text_reply("It was ELSEWHERE-5150.")])
    again = rc.run_lhc("--resume", sid, "-p", "which one?")
    assert again.returncode == 0, again.stderr
    assert "It was ELSEWHERE-5150." in again.stdout
    assert "is gone" not in again.stderr and not log_events(rc, "transcript_gone")
    assert rc.api.message_requests[-1]["session_id"] == sid            # the same session, resumed
    assert not (rc.project_dir / f"{sid}.jsonl").exists()
    assert [p.name for p in rc.project_dir.glob("*.jsonl")] == []       # nothing written again

def test_a_gone_session_left_mid_turn_keeps_that_turn_as_far_as_it_went(real_claude):
    """Killed while a tool ran, the session's last turn stays open for good once Claude
    deletes its transcript. Written again from the thread, that turn is in the view up to
    its last finished call: the prompt and the output Claude had already seen."""
    import os
    import signal
    import subprocess
    import time
    rc = real_claude
    rc.api.script([tool_use_reply("Bash", {"command": "echo FINISHED-STEP-8123", "description": "one"}),
                   tool_use_reply("Bash", {"command": "python3 -c 'import time; time.sleep(120)'",
                                           "description": "long"})])
    p = subprocess.Popen(rc.lhc_argv("-p", "run the two steps", "--allowedTools", "Bash",
                                     "--output-format", "stream-json", "--verbose"),
                         env=rc.env, cwd=rc.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL)
    try:
        sid = json.loads(p.stdout.readline())["session_id"]
        path = rc.project_dir / f"{sid}.jsonl"
        deadline = time.monotonic() + 60
        while b"time.sleep(120)" not in (path.read_bytes() if path.exists() else b""):
            assert p.poll() is None and time.monotonic() < deadline, "Claude never started step two"
            time.sleep(0.05)
        time.sleep(0.5)  # (cc-lhc's live capture reads the line)
    finally:
        # Claude first, so it cannot write its exit records, then cc-lhc
        for e in log_events(rc, "child_started"):
            try:
                os.kill(e["child_pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
        p.send_signal(signal.SIGKILL)
        p.communicate()
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    export = json.loads(rc.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    assert "time.sleep(120)" in json.dumps(export), "the open turn was not captured before the kill"
    store = cc_lhc.ThreadStore(home, thread_id)
    assert "mid-turn" in cc_lhc.unsettled_reason(store, idle=True)
    store.close()
    path.unlink()
    rc.api.script([text_reply("Step one printed FINISHED-STEP-8123.")])
    again = rc.run_lhc("--resume", sid, "-p", "what did step one print?")
    assert again.returncode == 0, again.stderr
    assert f"the transcript of session {sid} is gone" in again.stderr
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert "run the two steps" in sent and "FINISHED-STEP-8123" in sent
    assert "Step one printed FINISHED-STEP-8123." in again.stdout


# -- the person's terminal however Claude ends ------------------------------------------

PANE_MODES = "alt=#{alternate_on} cursor=#{cursor_flag} mouse=#{mouse_any_flag}"


@pytest.mark.parametrize("how", ["claude killed", "claude killed, panel open", "claude ends, panel open"])
def test_the_terminal_modes_claude_turned_on_are_off_however_it_ends(real_claude, tmux, how):
    """Claude draws on the alternate screen with the cursor hidden and mouse reports on, and
    turns them off as it exits. Killed by a signal (or ending under the open panel) it
    cannot: cc-lhc switches off what was left on, so the shell's output is seen again."""
    import os
    import signal
    import time
    rc = real_claude
    rc.api.script([text_reply("HELLO-ANSWER")])
    # (the shell lingers a moment: tmux reports a pane whose program ended as cursorless)
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=110, rows=32, env=rc.env,
             cwd=rc.cwd, after="printf 'SHELL-IS-BACK\\n'; sleep 3")
    t.wait_for(PROMPT, timeout=60)
    type_line(t, "hello")
    t.wait_for("HELLO-ANSWER")
    during = t._tmux("display-message", "-p", "-t", t.target, PANE_MODES).stdout.strip()
    if "panel" in how:
        t.send_keys("C-]")
        t.wait_for("cc-lhc control panel")
    (started,) = log_events(rc, "child_started")
    os.kill(started["child_pid"], signal.SIGKILL if "killed" in how else signal.SIGTERM)
    t.wait_for("SHELL-IS-BACK", timeout=30)  # (written after cc-lhc's last bytes)
    deadline = time.monotonic() + 2
    while True:
        after = t._tmux("display-message", "-p", "-t", t.target, PANE_MODES).stdout.strip()
        if after == "alt=0 cursor=1 mouse=0" or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert during.startswith("alt=1") and after == "alt=0 cursor=1 mouse=0", (during, after)
    t.wait_exit(30)
    assert t.stty_before == t.stty_after


def test_terminal_modes_follow_what_was_written_in_any_cut():
    stream = (b"\x1b[?1049h\x1b[?25l\x1b[?1000;1006h\x1b[?2004h\x1b[?1004h\x1b[>1u\x1b[>4;2m"
              b"text\x1b[?1004l\x1b[>3u\x1b[<u\x1b[?2026hhalf a fra")
    whole = cc_lhc.TerminalModes()
    whole.feed(stream)
    assert whole.reset() == (b"\x1b[0m\x1b[?2026l\x1b[<1u\x1b[>4m\x1b[?1000l\x1b[?1006l\x1b[?2004l"
                             b"\x1b[?1049l\x1b[?25h")
    for cut in range(1, len(stream)):
        modes = cc_lhc.TerminalModes()
        modes.feed(stream[:cut])
        modes.feed(stream[cut:])
        assert modes.reset() == whole.reset(), cut
    tidy = cc_lhc.TerminalModes()  # a program that turned everything off again leaves nothing
    tidy.feed(stream + b"me\x1b[?2026l\x1b[<u\x1b[>4m\x1b[?1000;1006l\x1b[?2004l\x1b[?1049l\x1b[?25h")
    assert tidy.reset() == b""
    for open_ in (b"\x1b]0;a title", b"\x1b[38;5", b"\x1b"):  # killed in the middle of a sequence
        cut = cc_lhc.TerminalModes()
        cut.feed(b"\x1b[?25l" + open_)
        assert cut.reset() == b"\x18\x1b[0m\x1b[?25h"
    done = cc_lhc.TerminalModes()
    done.feed(b"\x1b]0;a title\x07plain")
    assert done.reset() == b""


def test_resume_back_to_the_session_before_a_smart_compact_leaves_the_rebuilt_turns_off(real_claude, tmux):
    """After a swap, `/resume <the session before it>` puts Claude back on that conversation,
    which never held the turns typed on the rebuilt session: the thread keeps them, and no
    view holds them. Back on the rebuilt session, they are on the branch again and what
    was typed on the older one is off it."""
    rc = real_claude
    rc.api.script([text_reply("answer one ORIGINAL", usage=OVER_USAGE), "answer on the rebuilt REBUILT-TURN",
                   "answer back on the old ONE-AGAIN", "answer on the rebuilt again"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "prompt one")
    t.wait_for("answer one ORIGINAL")
    wait_for_log(rc, "handoff_switched")
    t.wait_for("This conversation was rebuilt by Smart Compact")
    t.wait_for(PROMPT)
    registry = cc_lhc.Registry(cc_lhc.StateHome(rc.env["CC_LHC_HOME"]))
    ((thread_id, *_),) = registry.threads()
    rebuilt = log_events(rc, "handoff_switched")[0]["new_session"]
    (original,) = {s for (s,) in registry.db.execute("SELECT session_id FROM aliases WHERE thread_id = ?",
                                                      (thread_id,))} - {rebuilt}
    registry.db.close()
    type_line(t, "prompt on the rebuilt")
    t.wait_for("answer on the rebuilt REBUILT-TURN")
    type_line(t, f"/resume {original}")
    wait_for_log(rc, "session_followed")
    (followed,) = log_events(rc, "session_followed")
    assert followed["kind"] == "resume" and followed["thread"] == thread_id and followed["off_branch"]
    t.wait_for(PROMPT)
    type_line(t, "prompt back on the old")
    t.wait_for("answer back on the old ONE-AGAIN")

    def on_branch() -> str:
        return views_text(rc, thread_id)
    from realcli import wait_until
    wait_until(lambda: "ONE-AGAIN" in on_branch(), "the turn on the old session in the views")
    now = on_branch()
    assert "ORIGINAL" in now and "ONE-AGAIN" in now and "REBUILT-TURN" not in now
    # Claude's request on the old session held no rebuilt turn either (what the view now matches)
    assert "REBUILT-TURN" not in json.dumps(rc.api.message_requests[-1]["body"]["messages"])

    type_line(t, f"/resume {rebuilt}")
    wait_for_log(rc, "session_followed", count=2)
    t.wait_for(PROMPT)
    type_line(t, "prompt on the rebuilt again")
    t.wait_for("answer on the rebuilt again")
    exit_cleanly(t)
    again = on_branch()
    assert "ORIGINAL" in again and "REBUILT-TURN" in again and "ONE-AGAIN" not in again
    new = str(uuid.uuid4())  # and a session written from the thread is that branch
    w = rc.run([sys.executable, CC_LHC, "rollout", "write", "--thread-id", thread_id, "--session-id", new])
    assert w.returncode == 0, w.stderr
    written = (rc.project_dir / f"{new}.jsonl").read_text()
    assert "ORIGINAL" in written and "REBUILT-TURN" in written and "ONE-AGAIN" not in written
    every = texts(rc, thread_id)  # the thread keeps every turn
    for said in ("answer one ORIGINAL", "answer on the rebuilt REBUILT-TURN", "answer back on the old ONE-AGAIN",
                 "answer on the rebuilt again"):
        assert every.count(said) == 1


def test_resume_back_after_a_smart_compact_before_the_launch(real_claude, tmux):
    """A resume over the trigger is rebuilt before Claude starts and accepted only when the
    session ends or Claude moves, by then with the rebuild's own turns captured: a /resume
    back to the original session still leaves those turns off its branch."""
    from realcli import wait_until
    rc = real_claude
    rc.api.script([text_reply("answer one ORIGINAL", usage=OVER_USAGE), "answer on the rebuilt REBUILT-TURN",
                   "answer back on the old ONE-AGAIN"])
    p = rc.run_lhc("-p", "prompt one", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    original = json.loads(p.stdout)["session_id"]
    t = tmux([sys.executable, CC_LHC, "--resume", original], cols=110, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for("This conversation was rebuilt by Smart Compact", timeout=60)
    t.wait_for(PROMPT)
    type_line(t, "prompt on the rebuilt")
    t.wait_for("answer on the rebuilt REBUILT-TURN")
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    ((thread_id, *_),) = registry.threads()
    registry.db.close()

    def on_branch() -> str:
        return views_text(rc, thread_id)
    wait_until(lambda: "REBUILT-TURN" in on_branch(), "the rebuilt turn captured")
    type_line(t, f"/resume {original}")
    wait_for_log(rc, "session_followed")
    (followed,) = log_events(rc, "session_followed")
    t.wait_for(PROMPT)
    type_line(t, "prompt back on the old")
    t.wait_for("answer back on the old ONE-AGAIN")
    wait_until(lambda: "ONE-AGAIN" in on_branch(), "the turn on the old session in the views")
    sent = json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    now = on_branch()
    exit_cleanly(t)
    assert "REBUILT-TURN" not in sent  # Claude on the old session never saw it
    new = str(uuid.uuid4())
    w = rc.run([sys.executable, CC_LHC, "rollout", "write", "--thread-id", thread_id, "--session-id", new])
    assert w.returncode == 0, w.stderr
    written = (rc.project_dir / f"{new}.jsonl").read_text()
    assert "ONE-AGAIN" in written and "REBUILT-TURN" not in written
    assert followed.get("off_branch"), followed
    assert "REBUILT-TURN" not in now, now


def test_cc_lhcs_line_over_claudes_screen_leaves_nothing_behind_once_its_time_is_up(real_claude, tmux):
    """The line saying /clear started a new thread is written over Claude's bottom rows.
    Claude redraws only the cells it changes, so pieces of it stayed mixed into its own
    rows for many prompts ("…4c)        · ? for shortcuts"): once the line has had its
    time, Claude draws its whole screen again."""
    import time
    rc = real_claude
    rc.api.responder = lambda body: text_reply("plain answer")
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=120, rows=36, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "one")
    t.wait_for("plain answer")
    type_line(t, "/clear")
    wait_for_log(rc, "session_followed")
    t.wait_for("follows it as")
    time.sleep(cc_lhc.ManagedSession.ON_SCREEN_SECONDS + 1.5)
    for word in ("two", "three"):
        type_line(t, word)
        time.sleep(1.5)
    screen = t.capture()
    assert "cc-lhc:" not in screen and "follows it as" not in screen, screen
    bad = [row for row in screen.splitlines() if "for shortcuts" in row and row.lstrip()[:1] not in ("⏸", "?", "⏵")]
    assert not bad, screen
    exit_cleanly(t)
