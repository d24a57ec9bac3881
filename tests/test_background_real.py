"""Background work carried across a live Smart Compact swap (issue 12), with the real
Claude Code CLI in tmux against the fake API."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import text_reply, tool_use_reply
from realcli import (CC_LHC, OVER_USAGE, PROMPT, end_all_of_this_test, log_events, new_input, requests_holding,
                     running, type_line, wait_for_log, wait_until)

# A swap with a background job or agent beside Claude: two Claude processes start on a
# loaded 2-core machine, which has been seen to need more than the usual 30 s.
_wait_for_log = functools.partial(wait_for_log, timeout=60)
# And for Claude's first prompt and answer: tmux's default 15 s ran out once on that
# machine, with the test beside this one starting Claude too.
STARTUP = 60


def over_until_swapped(rc, swaps: int = 1):
    """Answer "noted", over the trigger until the ``swaps``th swap has begun.

    The session being replaced keeps its large context, as a real one would: a monitor
    event or a finished job can start Claude's next turn a few milliseconds after the
    answer that went over, and the capture may read both at once; with a small "noted"
    in between it would see the context shrink back under the trigger and never swap.
    Set ``.swaps`` on the returned responder to ask for one more swap.
    """
    def answer(body):
        if len(log_events(rc, "handoff_spawned")) < answer.swaps:
            return text_reply("noted", usage=OVER_USAGE)
        return "noted"
    answer.swaps = swaps
    rc.api.responder = answer
    return answer


def until_released(path: Path) -> str:
    """A shell prefix that waits until the test creates ``path``: a job that finishes when
    the test says so, not after a sleep that a loaded machine may outlast before the swap."""
    return f"while [ ! -e {path} ]; do sleep 0.2; done; "


def launch(rc, tmux, prompt: str, *args: str):
    """cc-lhc in the default permission mode (plus ``args``) in a 120x30 pane, with
    ``prompt`` typed at Claude's first idle prompt."""
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", *args],
             cols=120, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=STARTUP)
    type_line(t, prompt)
    return t


def start_in_background(rc, tmux, command: str):
    """A session whose last answer, over the trigger, comes after starting ``command``."""
    rc.api.script([tool_use_reply("Bash", {"command": command, "description": "in the background",
                                           "run_in_background": True}),
                   text_reply("started it", usage=OVER_USAGE)])
    over_until_swapped(rc)
    t = launch(rc, tmux, "start the job", "--allowedTools", "Bash")
    t.wait_for("started it", timeout=STARTUP)
    return t


def release_and_exit(rc, t, marker: str, release: Path) -> None:
    """Let a carried job finish, wait until its result (holding ``marker``) reaches the
    replacement, and end the session."""
    release.touch()
    wait_until(lambda: [r for r in requests_holding(rc, "has finished") if marker in json.dumps(r)],
               "the result reaching the replacement")
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def rebuilt_manifest(rc, n: int = 0) -> str:
    """The carried-work manifest written into the ``n``th rebuilt session ('' if none)."""
    path = log_events(rc, "smart_compact_rebuilt")[n]["path"]
    for line in Path(path).read_text().splitlines():
        content = json.loads(line).get("message", {}).get("content")
        if isinstance(content, str) and content.startswith("[cc-lhc] Background work"):
            return content
    return ""


def test_a_background_shell_job_outlives_the_swap_and_its_result_reaches_the_replacement(
        real_claude, tmux):
    marker, release = "DONE-7f3a", real_claude.cwd / "release-7f3a"
    t = start_in_background(real_claude, tmux, f"{until_released(release)}echo {marker}")
    _wait_for_log(real_claude, "handoff_switched")
    (carried,) = log_events(real_claude, "background_carried")
    assert carried["items"][0].startswith("Bash m")
    job = running(f"echo {marker}")
    assert job, "the job is still running after the old Claude was ended"
    release.touch()
    # when it finishes, the replacement is told its result, marked as a runtime note
    wait_until(lambda: requests_holding(real_claude, "has finished"), "the result reaching the replacement")
    (said,) = [e for e in log_events(real_claude, "notice") if "carried across the swap" in e["text"]]
    assert said["text"].startswith(f"carried across the swap: shell {carried['said'][0].split()[1]}")
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    first = real_claude.api.message_requests[0]
    (told,) = [r for r in requests_holding(real_claude, "has finished") if marker in json.dumps(r)]
    assert told["session_id"] != first["session_id"]  # the replacement, not the old child
    note = new_input(told)  # what follows Claude's last answer (the CLI may add system text after it)
    assert "[runtime note]" in note and marker in note
    output = re.search(r"Its output file is (\S+?\.output)", note).group(1)
    content = Path(output).read_text()
    assert marker in content and "[killed]" not in content  # it ran to its end, never killed
    assert not running(f"echo {marker}")


def test_keys_dropped_by_a_swap_that_carries_a_job_are_said_beside_what_it_carried(real_claude, tmux):
    """Keys typed while a swap that carries a job runs are dropped, and the screen says so
    together with what the swap carried. The dropped line was written over by the carried
    one a moment later, so the person never saw it."""
    release = real_claude.cwd / "release-keys"
    t = start_in_background(real_claude, tmux, f"{until_released(release)}echo KEYS-DONE")
    _wait_for_log(real_claude, "handoff_spawned")
    t.send_text("typed during the swap")
    _wait_for_log(real_claude, "handoff_switched")
    assert [e for e in log_events(real_claude, "notice") if e["text"].startswith("input typed during")]
    t.wait_for(re.compile(r"not delivered.*carried across the swap", re.S))
    release.touch()
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def test_a_job_started_before_a_clear_outlives_the_new_conversations_swap(real_claude, tmux):
    """A background job runs on after /clear in the same Claude, as plain Claude keeps it;
    the new conversation's first Smart Compact carries it too (it was killed with the old
    Claude, its output "[killed]", and no one told), and it is recorded as carried in the
    thread it was started in."""
    marker, release = "CLEARED-9c1e", real_claude.cwd / "release-9c1e"
    real_claude.api.script([tool_use_reply("Bash", {"command": f"{until_released(release)}echo {marker}",
                                                    "description": "in the background",
                                                    "run_in_background": True}),
                            "started it"])
    t = launch(real_claude, tmux, "start the job", "--allowedTools", "Bash")
    t.wait_for("started it", timeout=STARTUP)
    type_line(t, "/clear")
    _wait_for_log(real_claude, "session_followed")
    over_until_swapped(real_claude)
    real_claude.api.script([text_reply("a long answer", usage=OVER_USAGE)])
    type_line(t, "go long")
    _wait_for_log(real_claude, "handoff_switched")
    (carried,) = log_events(real_claude, "background_carried")
    assert len(carried["items"]) == 1 and carried["said"][0].startswith("shell ")
    assert running(f"echo {marker}"), "the job is still running after the old Claude was ended"
    release_and_exit(real_claude, t, marker, release)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    first_thread = cc_lhc.Registry(home).thread_for_session(real_claude.api.message_requests[0]["session_id"])
    store = cc_lhc.ThreadStore.existing(home, first_thread)
    try:
        assert cc_lhc.background_items(store) == []  # (carried: no later launch takes it for open)
    finally:
        store.close()


def test_a_command_claude_moved_to_the_background_at_its_timeout_outlives_the_swap(real_claude, tmux):
    """A Bash call that outlasts its timeout is moved to the background by Claude itself
    (no run_in_background): it is open work like any other job, carried across the swap,
    and its result reaches the replacement."""
    rc = real_claude
    marker, release = "MOVED-DONE-3c1", rc.cwd / "release-3c1"
    rc.api.script([tool_use_reply("Bash", {"command": f"{until_released(release)}echo {marker}",
                                           "description": "a long build", "timeout": 3000}),
                   text_reply("it runs on", usage=OVER_USAGE)])
    over_until_swapped(rc)
    t = launch(rc, tmux, "build it", "--allowedTools", "Bash")
    t.wait_for("it runs on", timeout=STARTUP)
    _wait_for_log(rc, "handoff_switched")
    (carried,) = log_events(rc, "background_carried")
    assert carried["items"] and carried["items"][0].startswith("Bash m")
    assert running(f"echo {marker}"), "the moved job died with the old Claude"
    release_and_exit(rc, t, marker, release)
    assert not running(f"echo {marker}")


def test_taskstop_of_a_carried_job_stops_it(real_claude, tmux):
    """After the swap a carried job runs under cc-lhc, in no task list of the replacement's:
    its TaskStop finds nothing there, so cc-lhc stops the job itself and says so."""
    rc = real_claude
    marker, release = "STOPPED-NEVER-9e2", rc.cwd / "release-9e2"
    t = start_in_background(rc, tmux, f"{until_released(release)}echo {marker}")
    _wait_for_log(rc, "handoff_switched")
    task = log_events(rc, "background_carried")[0]["said"][0].split()[1]
    assert running(f"echo {marker}")
    rc.api.push(tool_use_reply("TaskStop", {"task_id": task}))
    rc.api.push("asked it to stop")
    type_line(t, "stop the background job")
    wait_until(lambda: not running(f"echo {marker}"), "the carried job stopped")
    told = replacement_told(rc, f"cc-lhc stopped shell {task}")
    assert "TaskStop asked" in told
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    assert not release.exists()


def test_a_carried_jobs_output_naming_a_file_with_an_at_sign_attaches_nothing(real_claude, tmux):
    """The result note is typed to Claude as a prompt; an `@README` in the job's output must
    not make Claude read that file into the conversation."""
    rc = real_claude
    (rc.cwd / "README").write_text("SECRET-README-BODY\n")
    release = rc.cwd / "release-at"
    t = start_in_background(rc, tmux, f"{until_released(release)}echo 'AT-DONE see @README'")
    _wait_for_log(rc, "handoff_switched")
    release.touch()
    told = wait_until(lambda: [r for r in requests_holding(rc, "has finished") if "AT-DONE" in json.dumps(r)],
                      "the result reaching the replacement")
    sent = json.dumps(told[0]["body"]["messages"])
    assert "SECRET-README-BODY" not in sent and "AT-DONE see \\\\@README" in sent
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def _daemons_of(cwd) -> list:
    """Claude background daemons started for this test's folder, and every process under them."""
    import subprocess
    rows = [line.split(None, 2) for line in subprocess.run(
        ["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout.splitlines()[1:]]
    found = [int(pid) for pid, _ppid, args in rows if " daemon run " in args and str(cwd) in args]
    for pid in found:  # (grows as it goes: children, then theirs)
        found += [int(child) for child, ppid, _args in rows if int(ppid) == pid]
    return found


def test_moving_the_session_to_the_background_at_exit_is_said_with_the_way_back(real_claude, tmux):
    """"Move to background and exit" in Claude's exit dialog goes on in a Claude daemon, in a
    session of its own that cc-lhc does not run: cc-lhc says so, and how to take it up."""
    import signal
    rc = real_claude
    release = rc.cwd / "release-daemon"
    rc.api.script([tool_use_reply("Bash", {"command": f"{until_released(release)}echo DAEMON-DONE",
                                           "description": "in the background", "run_in_background": True}),
                   "started it"])
    for _ in range(4):  # what the daemon's Claude answers the job's end with (and any title it asks for)
        rc.api.push("DAEMON GOES ON")
    t = launch(rc, tmux, "start the job", "--allowedTools", "Bash")
    try:
        t.wait_for("started it", timeout=STARTUP)
        type_line(t, "/exit")
        t.wait_for("Move to background")
        t.send_keys("Down")
        t.send_keys("Enter")
        assert t.wait_exit(timeout=30) == 0
        (said,) = log_events(rc, "continued_in_background")
        moved = said["continued_in"]  # (its file is written once the daemon's Claude has something to say)
        notice = [e["text"] for e in log_events(rc, "notice")] + [t.capture(history=True)]
        assert any(f"cc-lhc --resume {moved}" in n for n in notice), notice[-1][-2000:]
        # While the daemon runs it, no second Claude is started on it, by either way back.
        release.touch()
        wait_until(lambda: b"DAEMON GOES ON" in _read(rc.project_dir / f"{moved}.jsonl"),
                   "the daemon's Claude answering the job's end", timeout=60)
        wait_until(lambda: cc_lhc.claude_running(moved) is not None, "the daemon's Claude named")
        started = len(log_events(rc, "child_started"))
        for how in (["--resume", moved], ["--continue"]):
            p = rc.run([sys.executable, CC_LHC, "-p", "are you there?", *how])
            assert p.returncode == 2 and f"session {moved} is open in another Claude" in p.stderr, p.stderr
        assert len(log_events(rc, "child_started")) == started  # (no Claude was started by either)
        listed = rc.run_claude("agents", "--json")  # (Claude's own way to end a background session)
        (agent,) = [a for a in json.loads(listed.stdout) if a.get("sessionId") == moved]
        stopped = rc.run_claude("stop", agent["id"])
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        wait_until(lambda: cc_lhc.claude_running(moved) is None, "the daemon's Claude gone", timeout=30)
    finally:
        release.touch()
        for pid in _daemons_of(rc.cwd):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        end_all_of_this_test()  # (and the processes the daemon started under none of them)
    # Once it is done, --continue goes on where the daemon left off (as `claude --continue`
    # would: the newest session of the folder), not in the session it left behind.
    rc.api.script(["back under cc-lhc"])
    p = rc.run([sys.executable, CC_LHC, "-p", "what did the job say?", "--continue", "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["session_id"] == moved
    assert "DAEMON GOES ON" in json.dumps(rc.api.message_requests[-1]["body"]["messages"])


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("background", [False, True], ids=["foreground", "and-a-job"])
def test_a_swap_reads_the_thread_s_large_tool_outputs_as_the_text_they_are(real_claude, tmux, background):
    """A tool output of 2 KB or more is kept compressed in the thread; the check for open
    background work reads it as text, so the swap happens (it failed at every seam, and
    after three raised the alarm and turned Claude's own compaction back on)."""
    marker, release = "BIG-DONE-51c", real_claude.cwd / "release-51c"
    calls = [tool_use_reply("Bash", {"command": "seq 1 2000", "description": "numbers"})]
    if background:
        calls.append(tool_use_reply("Bash", {"command": f"{until_released(release)}seq 1 3000; echo {marker}",
                                             "description": "in the background", "run_in_background": True}))
    real_claude.api.script(calls + [text_reply("counted", usage=OVER_USAGE)])
    over_until_swapped(real_claude)
    t = launch(real_claude, tmux, "count", "--allowedTools", "Bash")
    t.wait_for("counted", timeout=STARTUP)
    _wait_for_log(real_claude, "handoff_switched")
    assert not log_events(real_claude, "handoff_error") and not log_events(real_claude, "handoff_alarm")
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    store = cc_lhc.ThreadStore(home, thread_id)
    try:
        (stored,) = store.db.execute("SELECT text FROM messages WHERE kind = 'tool_result' AND text "
                                     "IS NOT NULL ORDER BY seq LIMIT 1").fetchone()
    finally:
        store.close()
    assert isinstance(stored, bytes)  # the case at hand: kept compressed
    if background:
        (carried,) = log_events(real_claude, "background_carried")
        assert carried["items"][0].startswith("Bash m")
        release.touch()
        wait_until(lambda: [r for r in requests_holding(real_claude, "has finished") if marker in json.dumps(r)],
                   "the job's result reaching the replacement")
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def test_the_session_end_stops_carried_jobs_and_keeps_what_was_not_told(real_claude, tmux):
    t = start_in_background(real_claude, tmux, "sleep 300; echo NEVER-SEEN")
    _wait_for_log(real_claude, "handoff_switched")
    assert running("echo NEVER-SEEN"), "carried across the swap"
    # the rebuilt session itself says the job keeps running and cc-lhc watches it, so the
    # replacement's first request already holds it, with nothing typed on its behalf
    assert "keeps running as its own process" in rebuilt_manifest(real_claude)
    assert "echo NEVER-SEEN" in rebuilt_manifest(real_claude)
    type_line(t, "what is running?")
    first = real_claude.api.message_requests[0]["session_id"]
    (asked,) = wait_until(lambda: [r for r in requests_holding(real_claude, "what is running?")
                                   if r["session_id"] != first], "the prompt reaching the replacement")
    assert "keeps running as its own process" in json.dumps(asked["body"]["messages"])
    assert "[runtime note]" not in json.dumps(asked["body"]["messages"])  # nothing to add after it
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    assert not running("echo NEVER-SEEN")  # nobody asked for it to outlive the session
    (stopped,) = log_events(real_claude, "carried_job_stopped")
    assert stopped["pids"]
    home = Path(real_claude.env["CC_LHC_HOME"])
    (kept,) = home.glob("continuity/*/undelivered.json")
    notes = json.loads(kept.read_text())
    assert any("was stopped when the previous cc-lhc session ended" in n for n in notes)
    # said on the terminal as the session ends: the replacement had no exit dialog to ask
    assert "stopped 1 background job(s) carried across a Smart Compact swap" in t.capture(history=True)


def test_a_too_long_rejection_while_a_job_runs_is_compacted_continued_once_and_carries_it(
        real_claude, tmux):
    from fakeapi import error_reply
    too_long = error_reply(400, "prompt is too long: 1050000 tokens > 1000000 maximum")
    release = real_claude.cwd / "release-toolong"
    real_claude.api.script([
        tool_use_reply("Bash", {"command": f"{until_released(release)}echo DONE-toolong",
                                "description": "bg", "run_in_background": True}),
        "job started",
        tool_use_reply("Bash", {"command": "echo read-the-first-pdf", "description": "read"}),
        too_long,
    ])
    real_claude.api.responder = lambda body: "noted"
    t = launch(real_claude, tmux, "start the job", "--allowedTools", "Bash")
    t.wait_for("job started", timeout=STARTUP)
    type_line(t, "now read every pdf")
    _wait_for_log(real_claude, "too_long_continued")
    release.touch()
    wait_until(lambda: requests_holding(real_claude, "has finished"), "the job's result", timeout=40)
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    assert len(log_events(real_claude, "too_long_continued")) == 1
    assert log_events(real_claude, "background_carried")[0]["items"][0].startswith("Bash m")
    (told,) = [r for r in requests_holding(real_claude, "has finished") if "DONE-toolong" in json.dumps(r)]
    assert told["session_id"] != real_claude.api.message_requests[0]["session_id"]


def test_a_monitor_is_relaunched_keeps_its_pid_across_two_swaps_and_each_event_arrives_once(
        real_claude, tmux):
    rc, marker = real_claude, "MON-4c1e"
    command = f"for i in $(seq 1 60); do echo {marker}-$i; sleep 2; done"
    rc.api.script([tool_use_reply("ToolSearch", {"query": "select:Monitor", "max_results": 1}),
                   tool_use_reply("Monitor", {"description": "count", "timeout_ms": 120000,
                                              "command": command}),
                   text_reply("monitoring", usage=OVER_USAGE)])
    pressure = over_until_swapped(rc)
    t = launch(rc, tmux, "watch the counter", "--allowedTools", "Monitor")
    _wait_for_log(rc, "handoff_switched")
    (relaunched,) = log_events(rc, "monitor_relaunched")
    pid = relaunched["pid"]
    assert relaunched["output"].endswith(".output") and "/continuity/" in relaunched["output"]
    assert "/monitors/" in relaunched["output"]
    # only the relaunched copy runs: the old Claude's own copy was stopped with it
    wait_until(lambda: running(marker) == [pid], "one copy of the monitor, cc-lhc's")
    first = rc.api.message_requests[0]["session_id"]
    wait_until(lambda: [r for r in rc.api.message_requests if r["session_id"] != first
                        and f"event: {marker}-" in new_input(r)], "an event reaching the replacement",
               timeout=60)  # the replacement's start and first settled seam, on a loaded machine
    pressure.swaps = 2  # the replacement's answers go over the trigger: a second swap
    _wait_for_log(rc, "handoff_switched", count=2, timeout=40)
    assert len(log_events(rc, "monitor_relaunched")) == 1
    assert running(marker) == [pid]  # the same process lives through the second swap
    second = log_events(rc, "handoff_switched")[1]["new_session"]
    wait_until(lambda: [r for r in rc.api.message_requests if r["session_id"] == second
                        and f"event: {marker}-" in new_input(r)], "an event reaching the second replacement",
               timeout=60)
    said = [e["text"] for e in log_events(rc, "notice") if "carried across the swap" in e["text"]]
    assert said == [f"carried across the swap: monitor {relaunched['task']} (relaunched, pid {pid})",
                    f"carried across the swap: monitor {relaunched['task']} (still running, pid {pid})"]
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    assert not running(marker)  # stopped when the session ended
    (stopped,) = log_events(rc, "carried_job_stopped")
    assert stopped["pids"] == [pid]
    # each event the relaunched command wrote reached Claude exactly once (told on a
    # prompt, or kept for the next launch when the session ended first)
    emitted = [line for line in Path(relaunched["output"]).read_text().splitlines() if line]
    told = "".join(new_input(r) for r in rc.api.message_requests if r["session_id"] != first)
    home = Path(rc.env["CC_LHC_HOME"])
    kept = "".join("".join(json.loads(p.read_text())) for p in home.glob("continuity/*/undelivered.json"))
    said = [m.group(1) for m in re.finditer(rf"event: ({marker}-\d+)", told + kept)]
    assert sorted(said) == sorted(set(said)), "an event was told twice"
    assert set(said) == set(emitted), "an event was never told"


def test_a_monitor_event_that_reached_the_old_claude_during_the_swap_is_told_to_the_replacement(
        real_claude, tmux, tmp_path):
    """The monitor speaks once the replacement is spawned, so its event reaches the Claude
    about to be ended, which starts answering it (a Bash call) and is then ended. The
    replacement was rebuilt before that, and the relaunched command does not say it again:
    cc-lhc tells the replacement what came and what the old Claude began doing about it."""
    rc, go, once = real_claude, tmp_path / "go", tmp_path / "once"
    command = (until_released(go) + f"if mkdir {once} 2>/dev/null; then echo LATE-7f2a; fi; "
               "sleep 100")
    rc.api.script([tool_use_reply("ToolSearch", {"query": "select:Monitor", "max_results": 1}),
                   tool_use_reply("Monitor", {"description": "late", "timeout_ms": 120000,
                                              "command": command}),
                   text_reply("monitoring", usage=OVER_USAGE)])
    acted = []

    def answer(body):
        if "LATE-7f2a" in new_input({"body": body}) and not acted:
            acted.append(body)
            return tool_use_reply("Bash", {"command": "echo looked", "description": "look"})
        return "noted"
    rc.api.responder = answer
    t = launch(rc, tmux, "watch for it", "--allowedTools", "Monitor", "--allowedTools", "Bash")
    _wait_for_log(rc, "handoff_spawned")
    go.touch()
    first = rc.api.message_requests[0]["session_id"]
    wait_until(lambda: [r for r in rc.api.message_requests if r["session_id"] == first
                        and "echo looked" in json.dumps(r["body"]["messages"])],
               "the old Claude calling Bash about the event", timeout=30)
    _wait_for_log(rc, "handoff_switched")
    (told,) = log_events(rc, "after_seam_told")
    assert "monitor " in told["note"] and "(late) reported LATE-7f2a" in told["note"]
    new = log_events(rc, "handoff_switched")[0]["new_session"]
    wait_until(lambda: [r for r in rc.api.message_requests if r["session_id"] == new
                        and "reached only the previous Claude process" in new_input(r)],
               "the replacement told of the event", timeout=60)
    (request,) = [r for r in rc.api.message_requests if r["session_id"] == new
                  and "reached only the previous Claude process" in new_input(r)]
    said = new_input(request)
    assert "LATE-7f2a" in said and "(it called Bash)" in said and "get-turns" in said
    assert not [r for r in rc.api.message_requests if "event: LATE-7f2a" in new_input(r)]  # said once
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def start_agent(rc, tmux, task: str, answer):
    """A session whose last answer, over the trigger, comes after launching a background
    agent on ``task``; the agent's own requests get ``answer(body)``."""
    rc.api.script([tool_use_reply("Agent", {"description": "look around", "prompt": task,
                                            "run_in_background": True})])

    # Told apart by what they hold, not by order: the agent's first request and the main
    # session's next one race, and a queued reply would go to whichever came first.
    def respond(body):
        seen = json.dumps(body)
        if task in json.dumps(body["messages"][:1]) and "agent started" not in seen:
            return answer(body)  # the agent's own
        return "noted" if "agent started" in seen else text_reply("agent started", usage=OVER_USAGE)
    rc.api.responder = respond
    return launch(rc, tmux, "start the agent")


def replacement_told(rc, text: str, timeout: float = 30) -> str:
    first = rc.api.message_requests[0]["session_id"]
    found = wait_until(lambda: [new_input(r) for r in rc.api.message_requests
                                if r["session_id"] != first and text in new_input(r)],
                       f"{text!r} reaching the replacement", timeout)
    return found[0]


def exit_stopping_work(t) -> None:
    """/exit, answering Claude's question about work still running with its default
    ("Exit and stop tasks": a resumed agent may still be at work); exit status 0."""
    type_line(t, "/exit")
    wait_until(lambda: t.exit_status() is not None or "Background work is running" in t.capture(),
               "Claude ending or asking about the work still running")
    if t.exit_status() is None:
        t.send_keys("Enter")
    assert t.wait_exit() == 0

def test_an_unfinished_background_agent_is_reported_interrupted_with_its_id(real_claude, tmux):
    import threading
    busy = threading.Event()  # never set before the end: the agent is still working at the swap
    t = start_agent(real_claude, tmux, "AGENT-TASK-busy",
                    lambda body: text_reply("never", hold=busy))
    try:
        _wait_for_log(real_claude, "handoff_switched")
        (said,) = log_events(real_claude, "background_carried")[0]["said"]
        agent = re.search(r"agent (a\w+)", said).group(1)
        assert said == f"agent {agent} (interrupted, resume offered)"
        manifest = rebuilt_manifest(real_claude)
        assert "was interrupted by the swap" in manifest and f"SendMessage({agent})" in manifest
        type_line(t, "where is the agent?")
        first = real_claude.api.message_requests[0]["session_id"]
        (asked,) = wait_until(lambda: [r for r in requests_holding(real_claude, "where is the agent?")
                                       if r["session_id"] != first], "the prompt reaching the replacement")
        assert f"resume it with SendMessage({agent})" in json.dumps(asked["body"]["messages"])
    finally:
        busy.set()
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def test_an_interrupted_background_agent_is_resumed_by_sendmessage_in_the_replacement(real_claude, tmux):
    """The offer holds: SendMessage resumes an agent from its transcript in the session it
    runs in, so the swap carries the agent's transcript into the replacement's folder."""
    import threading
    rc = real_claude
    busy, task, state = threading.Event(), "AGENT-TASK-resumable", {}
    rc.api.script([tool_use_reply("Agent", {"description": "look around", "prompt": task,
                                            "run_in_background": True})])

    def respond(body):
        seen, said = json.dumps(body), new_input({"body": body})
        if task in json.dumps(body["messages"][:1]) and "agent started" not in seen:
            return "AGENT-RESUMED-OK" if "RESUME-PLEASE" in said else text_reply("never", hold=busy)
        if "Tool loaded" in said and state.get("agent") and not state.get("sent"):
            state["sent"] = True
            return tool_use_reply("SendMessage", {"to": state["agent"], "message": "RESUME-PLEASE carry on"})
        return "noted" if "agent started" in seen else text_reply("agent started", usage=OVER_USAGE)
    rc.api.responder = respond
    t = launch(rc, tmux, "start the agent", "--allowedTools", "SendMessage")
    try:
        _wait_for_log(rc, "handoff_switched")
        (said,) = log_events(rc, "background_carried")[0]["said"]
        state["agent"] = agent = re.search(r"agent (a\w+)", said).group(1)
        new = log_events(rc, "handoff_switched")[0]["new_session"]
        assert (rc.project_dir / new / "subagents" / f"agent-{agent}.jsonl").exists()
        rc.api.push(tool_use_reply("ToolSearch", {"query": "select:SendMessage", "max_results": 1}))
        type_line(t, "resume the agent")
        wait_until(lambda: [r for r in rc.api.message_requests if "RESUME-PLEASE" in new_input(r)
                            and task in json.dumps(r["body"]["messages"][:1])], "the agent resumed", 40)
    finally:
        busy.set()
    exit_stopping_work(t)
    # the agent's records are in the thread once each, though two of its files hold them
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    mine = [m for m in record if (m.get("agent") or {}).get("id") == agent]
    copies = {json.dumps({k: v for k, v in m.items() if k not in ("label", "turn", "source_session")},
                         sort_keys=True) for m in mine}
    assert mine and len(mine) == len(copies)  # (no record taken twice)
    assert any("RESUME-PLEASE" in (m.get("text") or "") for m in mine)


def test_a_background_agent_that_finished_during_the_swap_has_its_result_told(real_claude, tmux):
    import threading
    done = threading.Event()
    t = start_agent(real_claude, tmux, "AGENT-TASK-done",
                    lambda body: text_reply("AGENT-RESULT-42", hold=done))
    try:
        # it finishes while the replacement comes up: the old Claude hears of it, the
        # replacement would not, so cc-lhc tells it the final result
        _wait_for_log(real_claude, "handoff_spawned")
        done.set()
        _wait_for_log(real_claude, "handoff_switched")
        told = replacement_told(real_claude, "its final result")
        assert "had finished" in told and "AGENT-RESULT-42" in told
        # the rebuilt session was written before it finished: only the change is told
        assert "was interrupted by the swap" in rebuilt_manifest(real_claude)
        assert "since the rebuilt session was written" in told
    finally:
        done.set()
    type_line(t, "/exit")
    assert t.wait_exit() == 0



@pytest.mark.parametrize("ending", ["terminal closed", "wrapper SIGTERM", "wrapper SIGKILL"])
def test_when_the_session_ends_abruptly_carried_work_is_stopped_and_kept_for_the_next_launch(
        real_claude, tmux, ending):
    import signal
    rc, job, watch = real_claude, "END-9d2b", "MEND-9d2b"
    rc.api.script([tool_use_reply("Bash", {"command": f"sleep 300; echo {job}", "description": "bg",
                                           "run_in_background": True}),
                   tool_use_reply("ToolSearch", {"query": "select:Monitor", "max_results": 1}),
                   tool_use_reply("Monitor", {"description": "tick", "timeout_ms": 120000,
                                              "command": f"while true; do echo {watch}; sleep 2; done"}),
                   text_reply("both started", usage=OVER_USAGE)])
    over_until_swapped(rc)
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Bash,Monitor"],
             cols=120, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "start both")
    _wait_for_log(rc, "handoff_switched")
    (relaunched,) = log_events(rc, "monitor_relaunched")
    assert running(job) and running(watch) == [relaunched["pid"]]
    wrapper = log_events(rc, "handoff_switched")[0]["pid"]
    (guard,) = log_events(rc, "carry_guard_started")
    if ending == "terminal closed":
        t.kill()
    elif ending == "wrapper SIGTERM":
        os.kill(wrapper, signal.SIGTERM)
    else:  # nothing of cc-lhc runs after this: the guard it started stops the carried work
        os.kill(wrapper, signal.SIGKILL)
    wait_until(lambda: wrapper not in running(CC_LHC), "the wrapper ending")
    wait_until(lambda: guard["guard_pid"] not in running("__carry-guard"), "the guard ending")
    assert not running(job) and not running(watch)  # nobody asked for them to outlive the session
    assert bool(log_events(rc, "carried_job_stopped_by_guard")) == (ending == "wrapper SIGKILL")
    home = Path(rc.env["CC_LHC_HOME"])
    (folder,) = home.glob("continuity/*/")
    notes = "".join(cc_lhc.kept_notes(cc_lhc.StateHome(str(home)), folder.name)[0])
    assert notes.count("was stopped when the previous cc-lhc session ended") == 2
    assert f"echo {job}" in notes and watch in notes


def test_a_wake_up_scheduled_before_a_swap_fires_after_it_from_the_replacement(real_claude, tmux):
    """The one slow test here: Claude clamps a wake-up's delay to at least 60 s and fires it
    at the next whole minute, so cc-lhc's own firing comes 60 to 120 s after it was set."""
    marker = "WAKE-5c1e"
    rc = real_claude
    rc.api.script([tool_use_reply("ScheduleWakeup", {"delaySeconds": 60, "reason": "look again",
                                                     "prompt": f"{marker} check the build"}),
                   text_reply("scheduled it", usage=OVER_USAGE)])
    rc.api.responder = lambda body: "noted"
    t = launch(rc, tmux, "wake me later")
    t.wait_for("scheduled it")
    _wait_for_log(rc, "handoff_switched")
    (carried,) = log_events(rc, "background_carried")
    assert carried["said"] == ["wake-up"]
    assert "a wake-up you scheduled (look again) is still pending" in rebuilt_manifest(rc)
    # the old Claude, which held the wake-up in memory, is gone: cc-lhc fires it when due
    told = replacement_told(rc, marker, timeout=150)
    assert told.count("[runtime note] your scheduled wake-up is due (look again)") == 1
    assert f"{marker} check the build" in told
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    first = rc.api.message_requests[0]["session_id"]
    fired = [r for r in rc.api.message_requests if marker in new_input(r)]
    assert len(fired) == 1 and fired[0]["session_id"] != first  # once, from the replacement


WORKFLOW_SCRIPT = """export const meta = { name: 'carry', description: 'two steps', phases: [] }
const a = await agent('WF-STEP-ONE')
const b = await agent('WF-STEP-TWO')
return a + ' ' + b
"""


def test_a_workflow_running_at_the_swap_resumes_in_the_replacement_from_its_carried_journal(
        real_claude, tmux):
    """Its first agent finished before the swap, its second was still running: the rebuilt
    session says how to resume it, the journal is in the new session's folder, and resuming
    there serves the first agent from the journal and runs only the second again."""
    import threading
    rc = real_claude
    one_done, two_free, swapped = threading.Event(), threading.Event(), threading.Event()

    def respond(body):
        first, messages = json.dumps(body["messages"][:1]), json.dumps(body["messages"])
        if "WF-STEP-ONE" in first:
            one_done.set()
            return "ONE-DONE"
        if "WF-STEP-TWO" in first:
            return "TWO-DONE" if swapped.is_set() else text_reply("TWO-LATE", hold=two_free)
        if "resume the workflow" in new_input({"body": body}):
            call = re.search(r'Workflow\(\{scriptPath: \\"(\S+?)\\", resumeFromRunId: \\"(wf_[\w-]+)\\"\}\)',
                             messages)
            return tool_use_reply("Workflow", {"scriptPath": call.group(1), "resumeFromRunId": call.group(2)})
        if "Workflow launched in background" in new_input({"body": body}) and not swapped.is_set():
            # the answer over the trigger waits for the first agent, so the swap finds the
            # run half done: one result in its journal, one agent still working
            one_done.wait(30)
            return text_reply("workflow started", usage=OVER_USAGE)
        return "noted"

    rc.api.script([tool_use_reply("Workflow", {"script": WORKFLOW_SCRIPT})])
    rc.api.responder = respond
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Workflow"],
             cols=120, rows=30, env=rc.env, cwd=rc.cwd)
    try:
        t.wait_for(PROMPT)
        type_line(t, "run the workflow")
        _wait_for_log(rc, "handoff_switched")
        swapped.set()
        (carried,) = log_events(rc, "background_carried")
        (said,) = carried["said"]
        run = re.match(r"workflow (wf_[\w-]+) \(resume offered\)", said).group(1)
        assert f'resumeFromRunId: "{run}"' in rebuilt_manifest(rc)
        _wait_for_log(rc, "workflow_journal_carried")  # once the old Claude has ended
        (journal,) = log_events(rc, "workflow_journal_carried")
        new_session = log_events(rc, "handoff_switched")[0]["new_session"]
        assert journal["run"] == run and f"/{new_session}/subagents/workflows/{run}" in journal["to"]
        assert '"type":"result"' in (Path(journal["to"]) / "journal.jsonl").read_text()  # step one
        type_line(t, "resume the workflow")
        done = wait_until(lambda: [r for r in rc.api.message_requests if r["session_id"] == new_session
                                   and "served from cache" in new_input(r)],
                          "the resumed workflow's completion reaching the replacement", timeout=60)
        told = new_input(done[0])
        assert "ONE-DONE TWO-DONE" in told
        asked = [json.dumps(r["body"]["messages"][:1]) for r in rc.api.message_requests]
        assert sum("WF-STEP-ONE" in a for a in asked) == 1  # from the journal, not asked again
        assert sum("WF-STEP-TWO" in a for a in asked) == 2  # unfinished at the swap: run again
    finally:
        two_free.set()
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    # The run's agents are linked to the Workflow call that started them (2.1.328 names the
    # run in the call's acknowledgement only), and the copies the swap carried into the new
    # session's folder add no record a second time.
    import sqlite3
    (thread,) = (Path(rc.env["CC_LHC_HOME"]) / "threads").glob("*.sqlite")
    db = sqlite3.connect(thread)
    try:
        linked = db.execute("SELECT a.agent_id, c.tool_name FROM agents a LEFT JOIN messages c ON "
                            "c.tool_use_id = a.tool_use_id AND c.kind = 'tool_call' AND c.agent IS NULL "
                            "WHERE a.kind = 'workflow'").fetchall()
        assert len(linked) >= 2 and all(tool == "Workflow" for _a, tool in linked), linked
        assert not db.execute("SELECT source_uuid, block FROM messages WHERE agent IS NOT NULL "
                              "GROUP BY source_uuid, block HAVING count(*) > 1").fetchall()
    finally:
        db.close()


def test_an_open_item_a_swap_cannot_carry_skips_the_seam_with_a_receipt_saying_why(
        real_claude, tmux):
    """A WebSocket monitor cannot be reopened by cc-lhc: a seam over the trigger while it
    is open keeps the current Claude (never killing it), receipted, and the session goes on."""
    import sqlite3
    rc = real_claude
    rc.api.script([tool_use_reply("ToolSearch", {"query": "select:Monitor", "max_results": 1}),
                   tool_use_reply("Monitor", {"description": "feed", "timeout_ms": 120000,
                                              "ws": {"url": "ws://127.0.0.1:9/feed"}}),
                   text_reply("watching the feed", usage=OVER_USAGE)])
    rc.api.responder = lambda body: text_reply("noted", usage=OVER_USAGE)  # over at every seam
    t = launch(rc, tmux, "watch the feed", "--allowedTools", "Monitor")
    t.wait_for("watching the feed", timeout=STARTUP)
    _wait_for_log(rc, "handoff_skipped")
    (skipped, *_again) = log_events(rc, "handoff_skipped")
    (why,) = skipped["items"]
    assert why.startswith("Monitor m") and "WebSocket" in why
    receipts = sqlite3.connect(Path(rc.env["CC_LHC_HOME"]) / "cc-lhc.sqlite")
    outcomes = [o for (o,) in receipts.execute("SELECT outcome FROM cc_governor_receipts")]
    receipts.close()
    assert f"skipped: background work open: {why}" in outcomes
    assert not log_events(rc, "handoff_spawned")  # the Claude running the monitor was kept
    n = len(rc.api.message_requests)
    type_line(t, "still there?")
    wait_until(lambda: len(rc.api.message_requests) > n, "the next prompt reaching Claude")
    (started,) = log_events(rc, "child_started")
    assert rc.api.message_requests[-1]["session_id"] == started["session"]  # the same session
    assert not log_events(rc, "handoff_spawned")
    type_line(t, "/exit")
    assert t.wait_exit() == 0


def test_notes_kept_for_the_next_launch_reach_a_one_shots_claude(real_claude):
    """What the last session's end stopped (kept in continuity/<thread>/undelivered.json)
    reaches the next launch's Claude also when that launch is a one-shot: ahead of its
    prompt, and then no longer kept. A prompt on standard input leaves them kept."""
    import subprocess
    rc = real_claude
    rc.api.script([text_reply("first reply")])
    assert rc.run_lhc("-p", "first prompt").returncode == 0
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    kept = Path(rc.env["CC_LHC_HOME"]) / "continuity" / thread["id"] / "undelivered.json"
    kept.parent.mkdir(parents=True)
    note = cc_lhc.stopped_note("shell", "b1", "sleep 300", "/tmp/out.b1")
    kept.write_text(json.dumps([note]))
    rc.api.script([text_reply("from stdin")])
    # (an option cc-lhc once did not know to take a value: its value is no prompt)
    p = subprocess.run([sys.executable, CC_LHC, "-c", "-p", "--max-turns", "3"], input="prompt on stdin",
                       env=rc.env, cwd=rc.cwd, capture_output=True, text=True, timeout=90)
    assert p.returncode == 0 and "wait for this thread's next launch" in p.stderr, p.stderr
    assert kept.exists() and note not in json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    rc.api.script([text_reply("second reply")])
    p = rc.run_lhc("-c", "-p", "hello again", "--max-turns", "3")
    assert p.returncode == 0 and "second reply" in p.stdout, p.stderr
    said = new_input(rc.api.message_requests[-1])
    assert note in said and said.index(note) < said.index("hello again")
    assert not kept.exists()



def test_work_left_open_by_a_killed_claude_is_closed_at_the_next_launch(real_claude):
    """A Claude killed while its background job runs never writes how the job ended; the
    next launch runs another Claude process, so that job is no work of its to carry at a
    later swap (a monitor would be started again, a job named as still running)."""
    import signal
    import subprocess
    rc = real_claude
    rc.api.script([tool_use_reply("Bash", {"command": "sleep 60; echo ORPHAN-1c", "description": "wait",
                                           "run_in_background": True}), "started it"])
    proc = subprocess.Popen(rc.lhc_argv("-p", "start a job", "--allowedTools", "Bash"), env=rc.env,
                            cwd=rc.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        wait_until(lambda: len(rc.api.message_requests) >= 2 and log_events(rc, "child_started"),
                   "Claude sending the job's acknowledgement")
        home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])

        def opened():
            threads = cc_lhc.Registry(home).threads()
            if not threads:
                return []
            store = cc_lhc.ThreadStore(home, threads[0][0])
            try:
                return [i.label for i in cc_lhc.background_items(store)]
            finally:
                store.close()
        assert wait_until(opened, "the job captured as open") == ["Bash m2"]
        os.kill(log_events(rc, "child_started")[0]["child_pid"], signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        proc.kill()
        proc.wait()
        for pid in running("ORPHAN-1c"):
            os.kill(pid, signal.SIGKILL)
    rc.api.script(["hello again"])
    p = rc.run_lhc("-p", "-c", "anything new?")
    assert p.returncode == 0, p.stderr
    (orphaned,) = log_events(rc, "background_orphaned")
    assert orphaned["items"] == ["Bash m2"] and opened() == []


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_a_stop_asked_during_a_swap_ends_the_session_and_carries_nothing(real_claude, tmux, tmp_path, sig):
    """SIGTERM or SIGHUP to cc-lhc while the replacement starts: the swap is given up and
    the session ends, as it does outside a swap (it switched to the replacement and went on,
    and told it a job the old Claude had ended as it stopped was carried and "finished")."""
    import signal
    import time
    rc = real_claude
    slow = tmp_path / "slow-to-resume"  # (the replacement starts with --resume: it takes 4 s to draw)
    slow.write_text('#!/bin/sh\ncase " $* " in *" --resume "*) sleep 4 ;; esac\n'
                    f'exec {rc.env["CC_LHC_CLAUDE_BIN"]} "$@"\n')
    slow.chmod(0o755)
    rc.env["CC_LHC_CLAUDE_BIN"] = str(slow)
    t = start_in_background(rc, tmux, "sleep 300; echo STOPPED-5b7c")
    _wait_for_log(rc, "handoff_spawned")
    (started,) = log_events(rc, "child_started")
    os.kill(started["pid"], getattr(signal, sig))
    wait_until(lambda: t.exit_status() is not None, "cc-lhc ending", timeout=30)
    time.sleep(0.5)
    assert not log_events(rc, "handoff_switched")
    assert [e["why"] for e in log_events(rc, "handoff_given_up")] == [
        f"cc-lhc was asked to stop ({sig}) during the swap"]
    assert not [e for e in log_events(rc, "notice") if "carried across the swap" in e["text"]]
    assert not running("sleep 300; echo STOPPED-5b7c")


def _agent_id(rc) -> str:
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    return next(m["agent"]["id"] for m in record if m.get("agent"))


def agent_once(task: str, usage=None, name=None):
    """A responder: the prompt "start the agent" gets one Agent call on ``task`` (naming the
    agent ``name``), the agent answers "AGENT-FIRST-RESULT", anything else of the main
    conversation "the agent is done" (with ``usage``)."""
    def respond(body):
        if task in json.dumps(body["messages"][:1]):
            return "AGENT-FIRST-RESULT"
        if "start the agent" in new_input({"body": body}):
            return tool_use_reply("Agent", {"description": "look around", "prompt": task,
                                            **({"name": name} if name else {})})
        return text_reply("the agent is done", usage=usage)
    return respond

def _resume_by_sendmessage(rc, task: str, agent_answer: str, to: str | None = None):
    """A responder for the main conversation that loads SendMessage and resumes the agent
    (``rc.agent``, or by ``to``) once asked; its agent answers ``agent_answer`` to the
    resumed message. Returns the dict it keeps what the SendMessage call got in ("result")."""
    state = {}

    def respond(body):
        said = new_input({"body": body})
        if task in json.dumps(body["messages"][:1]):
            return agent_answer if "RESUME-PLEASE" in said else "AGENT-FIRST-RESULT"
        if "resume the agent" in said and not state.get("searched"):
            state["searched"] = True
            return tool_use_reply("ToolSearch", {"query": "select:SendMessage", "max_results": 1})
        if "Tool loaded" in said and not state.get("sent"):
            state["sent"] = True
            return tool_use_reply("SendMessage", {"to": to or rc.agent, "message": "RESUME-PLEASE carry on",
                                                  "summary": "carry on"})
        if state.get("sent") and "result" not in state:
            state["result"] = said
            return text_reply("sent it", usage=state.get("usage"))
        return "noted"
    rc.api.responder = respond
    return state


def test_sendmessage_resumes_a_finished_agent_after_a_one_shot_smart_compact(real_claude):
    """SendMessage resumes an agent from its transcript in the session Claude runs: a
    rebuilt session's folder gets the thread's agents' transcripts, so Claude can still
    resume one after a Smart Compact ("No transcript found for agent ID" before)."""
    rc = real_claude
    task = "AGENT-TASK-finished"

    rc.api.responder = agent_once(task, usage=OVER_USAGE)
    p = rc.run_lhc("-p", "start the agent", "--allowedTools", "Agent")
    assert p.returncode == 0, p.stderr
    rc.agent = _agent_id(rc)
    state = _resume_by_sendmessage(rc, task, "AGENT-RESUMED-OK")
    p = rc.run_lhc("-c", "-p", "resume the agent", "--allowedTools", "Agent", "SendMessage", "ToolSearch")
    assert p.returncode == 0, p.stderr
    assert "Smart Compact" in p.stderr
    (rebuilt,) = log_events(rc, "smart_compact_rebuilt")
    assert (Path(rebuilt["path"][:-len(".jsonl")]) / "subagents" / f"agent-{rc.agent}.jsonl").exists()
    assert "success\\\":true" in state["result"] and "Resuming agent" in state["result"], state["result"]
    wait_until(lambda: [r for r in rc.api.message_requests if "RESUME-PLEASE" in new_input(r)
                        and task in json.dumps(r["body"]["messages"][:1])], "the agent resumed")


def test_a_background_agent_a_killed_one_shot_left_running_is_named_in_the_session_rebuilt_next(real_claude):
    """Claude's own resume says a background agent whose Claude process died did not
    finish; a session rebuilt from the thread held nothing it reads that from, so Claude
    waited for a notification that never came. The rebuild now says it, with the way to
    resume the agent."""
    import signal
    import subprocess
    import threading
    rc = real_claude
    task, busy = "AGENT-TASK-orphaned", threading.Event()

    def respond(body):
        said = new_input({"body": body})
        if task in json.dumps(body["messages"][:1]):
            return text_reply("never", hold=busy)
        if "Async agent launched" in said:
            return text_reply("agent started", usage=OVER_USAGE)
        if "start the agent" in said:
            return tool_use_reply("Agent", {"description": "look around", "prompt": task,
                                            "run_in_background": True})
        return "noted"
    rc.api.responder = respond
    proc = subprocess.Popen(rc.lhc_argv("-p", "start the agent", "--allowedTools", "Agent"), env=rc.env,
                            cwd=rc.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        wait_until(lambda: any("agent started" in path.read_text() for path in rc.project_dir.glob("*.jsonl")),
                   "the answer after the launch written")
        wait_until(lambda: [r for r in rc.api.message_requests if task in json.dumps(r["body"]["messages"][:1])],
                   "the agent at work")
        wait_until(lambda: list(rc.project_dir.glob("*/subagents/agent-a*.jsonl")), "the agent's transcript begun")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        busy.set()
    # (by its transcript's name: killed at once, cc-lhc may not have read that file yet; the
    # next launch does, and the main transcript's acknowledgement names the agent anyway)
    (started,) = rc.project_dir.glob("*/subagents/agent-a*.jsonl")
    agent = started.stem[len("agent-"):]
    n = len(rc.api.message_requests)
    rc.api.responder = lambda body: "noted"
    p = rc.run_lhc("-c", "-p", "anything new?")
    assert p.returncode == 0, p.stderr
    assert "Smart Compact" in p.stderr and log_events(rc, "background_orphaned")
    (asked,) = [r for r in rc.api.message_requests[n:] if "anything new?" in new_input(r)]
    assert f"SendMessage with to: '{agent}' resumes it" in json.dumps(asked["body"]["messages"])


def test_an_agent_resumed_by_sendmessage_and_running_at_the_swap_is_reported_interrupted(real_claude, tmux):
    """SendMessage to a finished agent runs it again in the background: running at a swap,
    it is carried as the agent's first launch is (it was dropped without a word: the
    replacement's last news of it was "Resuming agent")."""
    import threading
    rc = real_claude
    task, busy = "AGENT-TASK-again", threading.Event()
    # Told apart by what they hold: the agent runs in the background, so its request and
    # the main conversation's next one race, and a queued reply goes to whichever is first.
    rc.api.responder = agent_once(task)
    t = launch(rc, tmux, "start the agent", "--allowedTools", "Agent", "SendMessage", "ToolSearch")
    try:
        t.wait_for("the agent is done", timeout=STARTUP)
        rc.agent = _agent_id(rc)
        state = _resume_by_sendmessage(rc, task, text_reply("never", hold=busy))
        state["usage"] = OVER_USAGE
        type_line(t, "resume the agent")
        _wait_for_log(rc, "handoff_switched")
        (said,) = log_events(rc, "background_carried")[0]["said"]
        assert said == f"agent {rc.agent} (interrupted, resume offered)"
        assert f"SendMessage({rc.agent})" in rebuilt_manifest(rc)
    finally:
        busy.set()
    exit_stopping_work(t)



def test_a_fork_of_an_earlier_session_holds_its_agents_as_they_were_then(real_claude):
    """The fork holds the thread as it was on that session, and its agents as they were
    then: not the copy a later session of the thread resumed (which knows work the fork
    left out)."""
    rc = real_claude
    task = "AGENT-TASK-finished"

    rc.api.responder = agent_once(task, usage=OVER_USAGE)
    p = rc.run_lhc("-p", "start the agent", "--allowedTools", "Agent", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    first = json.loads(p.stdout)["session_id"]
    rc.agent = _agent_id(rc)
    _resume_by_sendmessage(rc, task, "AGENT-SAW-THE-LATER-BRANCH")
    p = rc.run_lhc("-c", "-p", "resume the agent", "--allowedTools", "Agent", "SendMessage", "ToolSearch")
    assert p.returncode == 0, p.stderr
    (rebuilt,) = log_events(rc, "smart_compact_rebuilt")
    later = Path(rebuilt["path"][:-len(".jsonl")]) / "subagents" / f"agent-{rc.agent}.jsonl"
    wait_until(lambda: "AGENT-SAW-THE-LATER-BRANCH" in later.read_text(), "the agent resumed in the later session")
    rc.api.responder = lambda body: "forked"
    p = rc.run_lhc("--resume", first, "--fork-session", "-p", "where are we?", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    fork = json.loads(p.stdout)["session_id"]
    copy = rc.project_dir / fork / "subagents" / f"agent-{rc.agent}.jsonl"
    assert copy.exists() and "AGENT-FIRST-RESULT" in copy.read_text()
    assert "AGENT-SAW-THE-LATER-BRANCH" not in copy.read_text()


@pytest.mark.parametrize("by", ["id", "name"])
def test_what_an_agent_does_after_sendmessage_resumed_it_is_in_the_turn_of_that_call(real_claude, by):
    """An agent's first run is in the turn of the call that started it; what it does after
    a later SendMessage ran it again is in the turn of that SendMessage (it was filed under
    the first call's turn, which had ended long before), whether the message names the
    agent by its id or by the name its Agent call gave it."""
    rc = real_claude
    task = "AGENT-TASK-twice"
    rc.api.responder = agent_once(task, name="helper" if by == "name" else None)
    p = rc.run_lhc("-p", "start the agent", "--allowedTools", "Agent")
    assert p.returncode == 0, p.stderr
    rc.api.responder = lambda body: "noted"
    assert rc.run_lhc("-c", "-p", "something else").returncode == 0
    rc.agent = _agent_id(rc)
    _resume_by_sendmessage(rc, task, "AGENT-RESUMED-OK", to="helper" if by == "name" else None)
    p = rc.run_lhc("-c", "-p", "resume the agent", "--allowedTools", "Agent", "SendMessage", "ToolSearch")
    assert p.returncode == 0, p.stderr
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    record = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    (start,) = [m for m in record if m["kind"] == "tool_call" and m.get("tool") == "Agent"]
    (send,) = [m for m in record if m["kind"] == "tool_call" and m.get("tool") == "SendMessage"]
    mine = [m for m in record if (m.get("agent") or {}).get("id") == rc.agent]
    first = next(m for m in mine if "AGENT-FIRST-RESULT" in (m.get("text") or ""))
    again = next(m for m in mine if "AGENT-RESUMED-OK" in (m.get("text") or ""))
    assert start["turn"] != send["turn"]
    assert first["turn"] == start["turn"] and again["turn"] == send["turn"]
    assert [m["turn"] for m in mine] == sorted((m["turn"] for m in mine), key=lambda t: int(t[1:]))
    # each run names the call that ran it: the first the Agent call, the later the SendMessage
    assert first["agent"]["call"] == start["label"] and first["agent"]["tool_use_id"] == start["tool_use_id"]
    assert again["agent"]["call"] == send["label"] and again["agent"]["tool_use_id"] == send["tool_use_id"]
    markdown = rc.run_lhc("export", thread["id"], "--format", "markdown").stdout
    assert f"**{again['label']} · subagent {rc.agent}, started by {send['label']}" in markdown
    assert f"**{first['label']} · subagent {rc.agent}, started by {start['label']}" in markdown


@pytest.mark.parametrize("point", ["after-rollout-write", "after-spawn"])
def test_an_abandoned_rebuild_takes_its_agent_transcripts_out_of_claude_s_folder(real_claude, point):
    """A Smart Compact killed before its rebuild was taken up is rolled back at the next
    launch: the rebuilt transcript goes to abandoned-rebuilds/, and the folder beside it
    that holds the copies of the thread's agent transcripts goes with it (it stayed in
    Claude's projects folder, a copy more at each interrupted Smart Compact)."""
    rc, task = real_claude, "AGENT-TASK-abandoned"
    rc.api.responder = agent_once(task, usage=OVER_USAGE)
    assert rc.run_lhc("-p", "start the agent", "--allowedTools", "Agent").returncode == 0
    rc.api.responder = lambda body: "noted"
    crashed = rc.run_lhc("-c", "-p", "next", env={cc_lhc.FAILPOINT_ENV: point})
    assert crashed.returncode == -9
    again = rc.run_lhc("-c", "-p", "again")
    assert again.returncode == 0 and "rolled back" in again.stderr, again.stderr
    (moved,) = [p for p in (rc.iso.lhc / "abandoned-rebuilds").rglob("*.jsonl") if p.parent.name != "subagents"]
    assert not (rc.project_dir / moved.name).exists() and not (rc.project_dir / moved.stem).exists()
    assert list((moved.parent / moved.stem / "subagents").glob("agent-*.jsonl"))


def test_a_catch_up_cut_short_leaves_the_agents_for_the_next_one(real_claude, monkeypatch):
    """A launch's catch-up stops at its deadline; what it had not read of the main file may
    hold the SendMessage an agent's later records belong to, so the agents' files wait for
    the next catch-up (read then, those records were filed in the first call's turn for
    good)."""
    import time
    rc, task = real_claude, "AGENT-TASK-cut-short"
    rc.api.responder = agent_once(task)
    assert rc.run_lhc("-p", "start the agent", "--allowedTools", "Agent").returncode == 0
    rc.agent = _agent_id(rc)
    rc.api.responder = lambda body: "noted"  # (Claude's own runs: not captured yet, as after a crash)
    assert rc.run_claude("-c", "-p", "something else").returncode == 0
    _resume_by_sendmessage(rc, task, "AGENT-RESUMED-OK")
    assert rc.run_claude("-c", "-p", "resume the agent", "--allowedTools", "Agent", "SendMessage",
                         "ToolSearch").returncode == 0
    (thread,) = json.loads(rc.run_lhc("threads", "--json").stdout)
    (path,) = rc.project_dir.glob("*.jsonl")
    capture = cc_lhc.Capture(cc_lhc.StateHome(rc.env["CC_LHC_HOME"]), thread["id"], path.stem, str(path))
    monkeypatch.setattr(cc_lhc.Capture, "BATCH_BYTES", 512)
    real, asked = time.monotonic, []

    def clock():  # (the deadline passes once the first new batch is stored)
        asked.append(1)
        return real() + (0 if len(asked) <= 1 else 1000)
    monkeypatch.setattr(time, "monotonic", clock)
    capture.catch_up(deadline=real() + 100)
    monkeypatch.setattr(time, "monotonic", real)
    assert not capture.caught_up
    capture.catch_up()
    capture.stop()
    record = json.loads(rc.run_lhc("export", thread["id"]).stdout)
    (send,) = [m for m in record if m["kind"] == "tool_call" and m.get("tool") == "SendMessage"]
    again = next(m for m in record if (m.get("agent") or {}).get("id") == rc.agent
                 and "AGENT-RESUMED-OK" in (m.get("text") or ""))
    assert again["turn"] == send["turn"]


def test_a_job_whose_shell_ended_is_told_at_once_with_its_exit_code_and_a_last_backslash(
        real_claude, tmux):
    """A carried command that started a process of its own in the background and returned
    (`server &`) was taken to run on until that process ended, as it still held the output
    file; it failed, and the note said only "has finished". And its result, ending in a
    backslash, was typed but never sent: Claude took the Enter after it for a new line, and
    the person's next words joined the note."""
    rc = real_claude
    release = rc.cwd / "release-5c1"
    t = start_in_background(rc, tmux, f"{until_released(release)}(sleep 200; echo LATE-5c1) & "
                                      "echo 'dir is C:\\temp\\'; exit 3")
    _wait_for_log(rc, "handoff_switched")
    first = rc.api.message_requests[0]["session_id"]
    release.touch()
    try:
        (told,) = wait_until(lambda: [r for r in requests_holding(rc, "has finished") if r["session_id"] != first],
                             "the result reaching the replacement")
        texts = [c if isinstance(c, str) else b.get("text", "") for m in told["body"]["messages"]
                 for c in [m["content"]] for b in ([None] if isinstance(c, str) else c)]
        note = [x for x in texts if "has finished" in x][-1]
        assert note.rstrip().endswith("dir is C:\\temp\\")  # (sent, its backslash kept)
        # its shell ended under cc-lhc (Linux), which tells how, as Claude would have
        assert "has finished with exit code 3." in note
        assert running("sleep 200")  # (its own process runs on: the job itself is over)
        t.wait_for(PROMPT)
        type_line(t, "what is the weather")
        (asked,) = wait_until(lambda: requests_holding(rc, "what is the weather"), "the next prompt")
        last = asked["body"]["messages"][-1]["content"]
        assert [last] == ["what is the weather"] or {"type": "text", "text": "what is the weather",
                                                     "cache_control": {"type": "ephemeral"}} in last
        type_line(t, "/exit")
        assert t.wait_exit() == 0
    finally:
        for pid in running("sleep 200"):
            os.kill(pid, 9)
