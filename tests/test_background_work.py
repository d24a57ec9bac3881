"""Which background items a live swap must carry (cc_lhc.background_items), from the
records Claude Code 2.1.328 writes (tests/fixtures/background/)."""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
import types
from pathlib import Path

import pytest

import cc_lhc
from test_capture_parse import Transcript, text, tool_use

FIXTURES = Path(__file__).parent / "fixtures" / "background"
SHELL_ACK = ("Command running in background with ID: {id}. Output is being written to: "
             "/tmp/claude-0/proj/sess/tasks/{id}.output. You will be notified when it completes")
AGENT_ACK = "Async agent launched successfully.\nagentId: a0123456789abcdef (use SendMessage)"


def a_home(tmp_path):
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    return home


def a_session(home, thread="thread-1", path="/nonexistent/t.jsonl"):
    """A stand-in for the session a BackgroundCarry serves: its state home and its capture
    (the thread it is on, the transcript Claude writes)."""
    return types.SimpleNamespace(home=home, capture=types.SimpleNamespace(thread_id=thread, path=str(path)))


def recorded(tmp_path, fixture: str, lines: int):
    """A capture of the first ``lines`` lines of a recorded fixture; returns (capture,
    the transcript path, every line of the fixture)."""
    every = (FIXTURES / fixture).read_text().splitlines(True)
    home = a_home(tmp_path)
    path = tmp_path / "t.jsonl"
    path.write_text("".join(every[:lines]))
    cap = cc_lhc.Capture(home, "thread-1", "sess-1", str(path))
    cap.catch_up()
    return cap, path, every


def captured(tmp_path, t: Transcript):
    home = a_home(tmp_path)
    cap = cc_lhc.Capture(home, "thread-1", "sess-1", str(t.write(tmp_path / "t.jsonl")))
    cap.catch_up()
    return cap


def open_items(tmp_path, t: Transcript) -> list:
    cap = captured(tmp_path, t)
    try:
        return cc_lhc.background_items(cap.store)
    finally:
        cap.stop()


def launch(t: Transcript, tid: str, tool: str, ack: str = "started", **inp):
    t.user("go")
    t.assistant({"type": "tool_use", "id": tid, "name": tool, "input": inp}, stop="tool_use")
    t.tool_result((tid, ack))
    t.assistant(text("started"))


def notification(tid: str, status: str, task: str = "b1") -> str:
    return (f"<task-notification><task-id>{task}</task-id><tool-use-id>{tid}</tool-use-id>"
            f"<status>{status}</status><summary>done</summary></task-notification>")


def test_the_recorded_background_shell_opens_and_its_completion_closes_it(tmp_path):
    # The records the real CLI wrote for Bash{run_in_background}: the launch
    # acknowledgement, then the completion notification.
    cap, path, lines = recorded(tmp_path, "bash-run-in-background-2.1.328.jsonl", 2)
    (item,) = cc_lhc.background_items(cap.store)
    assert (item.kind, item.task_id) == ("shell", "b2i3ux1l7")
    assert item.output_file.endswith("/tasks/b2i3ux1l7.output")
    assert item.command == "sleep 4; echo DONE-none"
    with open(path, "a") as f:
        f.write("".join(lines[2:]))
    cap.catch_up()
    assert cc_lhc.background_items(cap.store) == []
    cap.stop()


def test_a_background_shell_job_is_open_until_its_completion_is_notified(tmp_path):
    t = Transcript()
    launch(t, "toolu_bg", "Bash", SHELL_ACK.format(id="b1"), command="sleep 30", run_in_background=True)
    assert cc_lhc.open_background_work(captured(tmp_path / "a", t).store) == ["Bash m2"]
    t.user(notification("toolu_bg", "completed"))
    t.assistant(text("it finished"))
    assert open_items(tmp_path / "b", t) == []


def test_a_running_notice_is_not_terminal_evidence(tmp_path):
    t = Transcript()
    launch(t, "toolu_mon", "Monitor", command="tail -f log", timeout_ms=60000, description="watch")
    t.user(notification("toolu_mon", "running"))
    assert [i.label for i in open_items(tmp_path, t)] == ["Monitor m2"]


def test_a_task_stop_of_its_id_closes_it_and_another_id_does_not(tmp_path):
    t = Transcript()
    launch(t, "toolu_bg", "Bash", SHELL_ACK.format(id="b7"), command="sleep 30", run_in_background=True)
    launch(t, "toolu_stop1", "TaskStop", "stopped", task_id="b8")
    assert [i.task_id for i in open_items(tmp_path / "a", t)] == ["b7"]
    launch(t, "toolu_stop2", "TaskStop", "stopped", task_id="b7")
    assert open_items(tmp_path / "b", t) == []


def test_a_notification_for_another_task_closes_nothing(tmp_path):
    t = Transcript()
    launch(t, "toolu_bg", "Bash", SHELL_ACK.format(id="b1"), command="sleep 30", run_in_background=True)
    t.user(notification("toolu_other", "completed", task="b9"))
    assert [i.label for i in open_items(tmp_path, t)] == ["Bash m2"]


def test_foreground_work_and_failed_launches_are_not_open(tmp_path):
    t = Transcript()
    launch(t, "toolu_fg", "Bash", "file-a", command="ls")
    launch(t, "toolu_agent", "Agent", "the answer", prompt="look", description="d",
           run_in_background=False)
    launch(t, "toolu_sync_agent", "Agent", "an agent's final answer", prompt="look", description="d")
    t.user("go")
    t.assistant(tool_use("toolu_bad", "sleep 9"), stop="tool_use")
    t.tool_result(("toolu_bad", "could not start", True))
    t.assistant(text("failed"))
    assert open_items(tmp_path, t) == []


def test_an_agent_claude_ran_in_the_background_though_the_call_asked_otherwise_is_open(tmp_path):
    """The acknowledgement says what Claude did: "Async agent launched" with the call's
    run_in_background false is a background agent all the same (Claude 2.1.328 backgrounds
    such agents; it was never carried, and its work was lost at a swap). A foreground one
    whose answer names its agent id is not."""
    t = Transcript()
    launch(t, "toolu_bg", "Agent", AGENT_ACK, prompt="look", description="d", run_in_background=False)
    launch(t, "toolu_fg", "Agent", "the answer\nagentId: a5 (use SendMessage to continue)", prompt="look",
           description="d", run_in_background=False)
    assert [i.tool_use_id for i in open_items(tmp_path, t)] == ["toolu_bg"]


@pytest.mark.parametrize("ack", [
    "Command was manually backgrounded by user with ID: b5. Output is being written to: /t/tasks/b5.output.",
    "Command did not complete within its 3s timeout and was moved to the background (ID: b5). Output is "
    "being written to: /t/tasks/b5.output.",
    "Command was moved to the background (ID: b5) after running for 120s. Output is being written to: "
    "/t/tasks/b5.output.",
    "Command was moved to the background (ID: b5) so that a message that arrived while it was running can "
    "reach you; it was not interrupted. Output is being written to: /t/tasks/b5.output.",
])
def test_a_foreground_command_claude_moved_to_the_background_is_open_work(tmp_path, ack):
    """Claude Code moves a running Bash call to the background itself (its timeout ran out,
    the person pressed ctrl-b, a message arrived): that job runs on like one started in the
    background, and a swap must carry it, not let it die with the old Claude."""
    t = Transcript()
    launch(t, "toolu_moved", "Bash", ack, command="make test", timeout=3000)
    items = open_items(tmp_path / "a", t)
    assert [(i.kind, i.task_id, i.output_file) for i in items] == [("shell", "b5", "/t/tasks/b5.output")]
    t.user(notification("toolu_moved", "completed", task="b5"))
    t.assistant(text("it finished"))
    assert open_items(tmp_path / "b", t) == []


def test_output_that_reads_like_an_acknowledgement_opens_nothing(tmp_path):
    t = Transcript()
    launch(t, "toolu_fg", "Bash", "log: Command running in background with ID: b9. (an old log line)",
           command="cat old.log")
    assert open_items(tmp_path, t) == []


def test_the_call_alone_opens_nothing_only_its_acknowledgement_does(tmp_path):
    t = Transcript()
    t.user("go")
    t.assistant({"type": "tool_use", "id": "toolu_bg", "name": "Bash",
                 "input": {"command": "sleep 9", "run_in_background": True}}, stop="tool_use")
    assert open_items(tmp_path, t) == []


def test_a_pending_wakeup_closes_only_on_its_own_firing(tmp_path):
    t = Transcript()
    launch(t, "toolu_agent", "Agent", AGENT_ACK, prompt="look around", description="d")
    launch(t, "toolu_wake", "ScheduleWakeup", "scheduled", delaySeconds=60, reason="r",
           prompt="check the build")
    items = open_items(tmp_path / "a", t)
    assert [(i.kind, i.label) for i in items] == [("agent", "Agent m2"), ("wakeup", "ScheduleWakeup m6")]
    assert items[0].task_id == "a0123456789abcdef"
    # /clear and other slash commands write meta records: they are not the wake-up firing
    t.user("<command-name>/clear</command-name>", isMeta=True)
    t.user("Caveat: the messages below were generated by the user", isMeta=True)
    assert [i.kind for i in open_items(tmp_path / "b", t)] == ["agent", "wakeup"]
    t.user("check the build", isMeta=True)
    assert [i.kind for i in open_items(tmp_path / "c", t)] == ["agent"]


def test_what_a_swap_cannot_carry_is_named():
    shell = cc_lhc.BackgroundItem("shell", "Bash", 4, "toolu_1", {"command": "x"}, "b1",
                                  "/tmp/b1.output")
    blind = cc_lhc.BackgroundItem("monitor", "Monitor", 9, "toolu_2", {"ws": {"url": "wss://x"}})
    assert cc_lhc.uncarriable(shell) == ""
    assert "WebSocket" in cc_lhc.uncarriable(blind)
    unwatched = cc_lhc.BackgroundItem("shell", "Bash", 4, "toolu_3", {"command": "x"}, "b2")
    assert "no output file" in cc_lhc.uncarriable(unwatched)
    # a monitor's command is relaunched by cc-lhc: no output file of Claude's is needed
    relaunched = cc_lhc.BackgroundItem("monitor", "Monitor", 9, "toolu_4", {"command": "tail -f x"}, "b3")
    assert cc_lhc.uncarriable(relaunched) == ""
    assert "platform" in cc_lhc.uncarriable(shell, posix=False)
    for kind in ("workflow", "wakeup", "agent"):
        assert cc_lhc.uncarriable(cc_lhc.BackgroundItem(kind, "X", 1, "t", {})) == ""


OVER = {"input_tokens": 365_000, "output_tokens": 5}


def assessed(tmp_path, t: Transcript):
    cap = captured(tmp_path, t)
    try:
        home = cap.home
        hostdb = cc_lhc.HostDB(home)
        a = cc_lhc.assess(home, hostdb, cap.store, "thread-1", "sess-1",
                          cc_lhc.load_policy(str(tmp_path), {}), swap=True)
        outcome = hostdb.db.execute("SELECT outcome FROM cc_governor_receipts WHERE id = ?",
                                    (a.receipt,)).fetchone()[0]
        return a, outcome
    finally:
        cap.stop()


def test_a_seam_with_an_item_a_swap_cannot_carry_is_skipped_with_a_receipt_saying_why(tmp_path):
    t = Transcript()
    launch(t, "toolu_ws", "Monitor", "Monitor started", description="events", timeout_ms=60000,
           ws={"url": "wss://example.invalid/feed"})
    t.user("and now?")
    t.assistant(text("over the trigger"), usage=OVER)
    a, outcome = assessed(tmp_path, t)
    assert not a.go and "Monitor m2" in a.reason and "WebSocket" in a.reason
    assert outcome.startswith("skipped: background work open: Monitor m2")


def test_a_seam_with_only_carriable_work_open_goes_ahead(tmp_path):
    t = Transcript()
    launch(t, "toolu_bg", "Bash", SHELL_ACK.format(id="b1"), command="sleep 30", run_in_background=True)
    launch(t, "toolu_agent", "Agent", AGENT_ACK, prompt="look around", description="d")
    t.user("and now?")
    t.assistant(text("over the trigger"), usage=OVER)
    a, _ = assessed(tmp_path, t)
    assert [i.kind for i in cc_lhc.background_items(captured(tmp_path / "x", t).store)] == ["shell", "agent"]
    assert a.go, a.reason


def test_what_claude_was_not_told_is_kept_for_the_next_launch_of_the_thread(tmp_path):
    home = a_home(tmp_path)

    session = a_session(home)
    carry = cc_lhc.BackgroundCarry(session)
    carry.notes.append("[runtime note] the job finished after the last prompt")
    carry.close()
    assert (tmp_path / "lhc" / "continuity" / "thread-1" / "undelivered.json").exists()
    kept = tmp_path / "lhc" / "continuity" / "thread-1" / "undelivered.json"
    again = cc_lhc.BackgroundCarry(session)
    assert list(again.notes) == ["[runtime note] the job finished after the last prompt"]
    assert kept.exists()  # until it is told: a crash before that keeps it for the next launch
    assert again.next_note(lambda: True) == "[runtime note] the job finished after the last prompt"
    assert kept.exists()  # typed, but kept until Claude's transcript shows it as a prompt


def test_notes_are_kept_as_they_come_so_a_killed_cc_lhc_loses_none(tmp_path):
    home = a_home(tmp_path)

    session = a_session(home)
    kept = tmp_path / "lhc" / "continuity" / "thread-1" / "undelivered.json"
    carry = cc_lhc.BackgroundCarry(session)
    carry.next_note(lambda: False)
    assert not (tmp_path / "lhc" / "continuity").exists()  # nothing to keep, nothing made
    wake = cc_lhc.BackgroundItem("wakeup", "ScheduleWakeup", 3, "toolu_w", {"reason": "r",
                                 "prompt": "check the build"})
    carry.wakeups.append((4102444800.0, wake))   # due in 2100
    carry.notes.append("[runtime note] the job finished")
    carry.next_note(lambda: False)  # not at a seam: nothing typed, but both are on disk now
    saved = json.loads(kept.read_text())
    assert saved[0] == "[runtime note] the job finished"
    assert "a wake-up was still pending" in saved[1] and "check the build" in saved[1]
    # (no close(): the process is gone) the next launch of the thread tells them
    after = cc_lhc.BackgroundCarry(session)
    assert list(after.notes) == saved


def test_the_recorded_monitor_launch_opens_an_item_named_by_its_task(tmp_path):
    # The records the real CLI wrote for Monitor: the acknowledgement names the task and
    # no output file; each event is its own notification, none terminal.
    cap, _path, _lines = recorded(tmp_path, "monitor-2.1.328.jsonl", None)
    try:
        (item,) = cc_lhc.background_items(cap.store)
    finally:
        cap.stop()
    assert (item.kind, item.task_id, item.output_file) == ("monitor", "bdz3tukym", "")
    assert item.command.startswith("for i in") and cc_lhc.uncarriable(item) == ""


def test_a_monitor_closes_on_its_completed_notification(tmp_path):
    t = Transcript()
    launch(t, "toolu_mon", "Monitor", "Monitor started (task bm1, expires in 1m)", description="d",
           timeout_ms=60000, command="tail -f log")
    assert [i.task_id for i in open_items(tmp_path / "a", t)] == ["bm1"]
    t.user("<task-notification>\n<task-id>bm1</task-id>\n<summary>Monitor event</summary>\n"
           "<event>x</event>\n</task-notification>")
    assert [i.task_id for i in open_items(tmp_path / "b", t)] == ["bm1"]  # an event is no end
    t.user("<task-notification>\n<task-id>bm1</task-id>\n<status>completed</status>\n</task-notification>")
    assert open_items(tmp_path / "c", t) == []


def test_the_recorded_workflow_launch_opens_an_item_with_its_run_and_script(tmp_path):
    # The records the real CLI wrote for Workflow{script}: the launch acknowledgement names
    # the task, the run (its id has a dash) and the saved script; the notification ends it.
    cap, path, lines = recorded(tmp_path, "workflow-2.1.328.jsonl", 2)
    try:
        (item,) = cc_lhc.background_items(cap.store)
        assert item.kind == "workflow" and item.task_id == ""
        assert re.fullmatch(r"wf_[0-9a-f]{8}-[0-9a-f]{3}", item.run_id)
        assert item.script.endswith(f"/workflows/scripts/probe-{item.run_id}.js")
        with open(path, "a") as f:
            f.write("".join(lines[2:]))
        cap.catch_up()
        assert cc_lhc.background_items(cap.store) == []
    finally:
        cap.stop()


RUN = "wf_7d1c2e00-a1b"
WORKFLOW_ACK = (f"Workflow launched in background. Task ID: w1234abcd\nSummary: nightly\n"
                f"Transcript dir: /p/sess-1/subagents/workflows/{RUN}\n"
                f"Script file: /p/sess-1/workflows/scripts/nightly-{RUN}.js\nRun ID: {RUN}\n")


def test_the_manifest_of_carried_work_is_written_into_the_rebuilt_session(tmp_path):
    """Workflows, wake-ups and agents go on from lines in the rebuilt session itself, and at
    the switch Claude is told only what changed since (here: nothing)."""
    t = Transcript()
    launch(t, "toolu_wf", "Workflow", WORKFLOW_ACK, **{"name": "nightly-check", "script": "steps"})
    launch(t, "toolu_wake", "ScheduleWakeup", "scheduled", delaySeconds=120, reason="look again",
           prompt="check the build")
    launch(t, "toolu_agent", "Agent", AGENT_ACK, prompt="look around", description="d")
    t.user("and now?")
    t.assistant(text("over the trigger"), usage=OVER)
    cap = captured(tmp_path, t)
    home = cap.home

    session = a_session(home)
    carry = cc_lhc.BackgroundCarry(session)
    old = tmp_path / "proj" / "sess-1.jsonl"
    try:
        items = cc_lhc.background_items(cap.store)
        lines = carry.plan(items, "sess-1", str(old), cap.store)
        assert len(lines) == 3
        assert "workflow nightly-check" in lines[0] and "carries its journal" in lines[0]
        assert (f'Workflow({{scriptPath: "/p/sess-1/workflows/scripts/nightly-{RUN}.js", '
                f'resumeFromRunId: "{RUN}"}})') in lines[0]
        assert "a wake-up you scheduled (look again) is still pending" in lines[1]
        assert "SendMessage(a0123456789abcdef)" in lines[2] and "interrupted" in lines[2]
        plan = cc_lhc.plan_rebuild(home, cap.store, "thread-1", cc_lhc.load_policy(str(tmp_path), {}),
                                   "new-sess", str(tmp_path), projects_root=str(tmp_path / "p"),
                                   now="2026-12-01T10:00:00Z", manifest=lines)
    finally:
        cap.stop()
    records = [json.loads(line) for line in plan.data.decode().splitlines()]
    held = records[-2]["message"]["content"]
    assert records[-2]["type"] == "user" and held == cc_lhc.render_manifest(lines)
    assert all(f"- {line}" in held for line in lines)
    assert records[-1]["type"] == "assistant"  # the session still ends on Claude's side
    assert records[-2]["parentUuid"] == records[-3]["uuid"]
    said = carry.take(items, "sess-1", str(old))
    assert said == (f"carried across the swap: workflow {RUN} (resume offered), wake-up, "
                    "agent a0123456789abcdef (interrupted, resume offered)")
    assert not carry.notes  # all of it is in the rebuilt session already
    # from now on they are cc-lhc's: the thread holds them as carried, open no more, so a
    # later launch of the thread (another process, no memory of this one) never takes them
    # for work still running in Claude
    store = cc_lhc.ThreadStore(home, "thread-1")
    try:
        assert cc_lhc.background_items(store) == []
    finally:
        store.close()
    # once the old Claude has ended, the run's journal follows into the new session's folder
    journal = tmp_path / "proj" / "sess-1" / "subagents" / "workflows" / RUN
    journal.mkdir(parents=True)
    (journal / "journal.jsonl").write_text('{"type":"launched"}\n')
    (journal / "agent-a1.jsonl").write_text("{}\n")
    # ... and so does the interrupted agent's transcript, which SendMessage resumes it from
    agent = tmp_path / "proj" / "sess-1" / "subagents" / "agent-a0123456789abcdef.jsonl"
    agent.write_text('{"type":"user"}\n')
    new = tmp_path / "proj" / "new-sess.jsonl"
    carry.carry_journals(str(old), str(new))
    moved = tmp_path / "proj" / "new-sess" / "subagents" / "workflows" / RUN
    assert sorted(p.name for p in moved.iterdir()) == ["agent-a1.jsonl", "journal.jsonl"]
    assert (moved.parent.parent / agent.name).read_text() == '{"type":"user"}\n'
    assert (moved / "journal.jsonl").read_text() == '{"type":"launched"}\n'
    assert not carry.notes
    # a later swap carries nothing anew, but its rebuilt session still names what goes
    # on: no manifest is ever captured, so the next replacement learns it only from there
    store = cc_lhc.ThreadStore(home, "thread-1")
    try:
        again = carry.plan(cc_lhc.background_items(store), "new-sess", str(new), store)
    finally:
        store.close()
    assert again[:2] == lines[:2]  # the workflow and the wake-up still pending, as before,
    assert again[2] == ("background agent a0123456789abcdef was interrupted by an earlier swap; "
                        "resume it with SendMessage(a0123456789abcdef)")  # and the agent
    said = carry.take([], "new-sess", str(new))
    # the journal follows once more, and the agent's transcript
    assert [i.kind for i in carry.journals] == ["workflow", "agent"] and not carry.notes
    # once Claude resumed the workflow (in the session it was carried into), it is no
    # longer offered
    t.user("resume it")
    t.assistant({"type": "tool_use", "id": "toolu_resume", "name": "Workflow",
                 "input": {"scriptPath": "/p/x.js", "resumeFromRunId": RUN}}, stop="tool_use")
    t.tool_result(("toolu_resume", "Workflow launched in background."))
    t.assistant(text("resumed"))
    cap = captured(tmp_path, t)
    try:
        later = carry.plan(cc_lhc.background_items(cap.store), "third", str(tmp_path / "third.jsonl"),
                           cap.store)
    finally:
        cap.stop()
    assert later[:2] == again[1:] and lines[0] not in later  # (the resumed run is an item of its own)


def test_a_workflow_journal_that_cannot_be_carried_is_told(tmp_path):
    home = a_home(tmp_path)

    session = a_session(home)
    carry = cc_lhc.BackgroundCarry(session)
    carry.journals = [cc_lhc.BackgroundItem("workflow", "Workflow", 2, "toolu_wf", {}, run_id=RUN)]
    carry.carry_journals(str(tmp_path / "old.jsonl"), str(tmp_path / "new.jsonl"))  # no such folder
    (note,) = carry.notes
    assert f"journal of workflow run {RUN} could not be carried" in note


def test_a_typed_note_is_kept_until_claude_takes_it_as_a_prompt(tmp_path):
    """A note typed into a Claude that was already exiting never became a prompt: it is
    kept for the next launch, and one Claude did take is not told twice."""
    home = a_home(tmp_path)
    transcript = tmp_path / "t.jsonl"
    transcript.write_text(json.dumps({"type": "user", "message": {"role": "user", "content": "hi"}}) + "\n")

    session = a_session(home, path=transcript)
    kept = tmp_path / "lhc" / "continuity" / "thread-1" / "undelivered.json"
    carry = cc_lhc.BackgroundCarry(session)
    carry.notes.append("[runtime note] monitor b1 (tail -f x) event: FIRST")
    assert carry.next_note(lambda: True).endswith("event: FIRST")
    assert json.loads(kept.read_text()) == ["[runtime note] monitor b1 (tail -f x) event: FIRST"]
    with open(transcript, "a") as f:  # Claude took it: its prompt is in the transcript
        f.write(json.dumps({"type": "user", "message": {"role": "user", "content": [
            {"type": "text", "text": "[runtime note] monitor b1 (tail -f x) event: FIRST"}]}}) + "\n")
    carry.poll()
    assert carry.inflight == [] and not kept.exists()
    carry.notes.append("[runtime note] monitor b1 (tail -f x) event: SECOND")
    carry.next_note(lambda: True)  # typed as Claude was exiting: it never shows up
    carry.close()
    assert json.loads(kept.read_text()) == ["[runtime note] monitor b1 (tail -f x) event: SECOND"]
    again = cc_lhc.BackgroundCarry(session)
    assert list(again.notes) == ["[runtime note] monitor b1 (tail -f x) event: SECOND"]


def test_what_a_carry_guard_kept_is_taken_in_by_the_next_launch_and_then_removed(tmp_path):
    """The guard writes its own file, never undelivered.json: a launch may be rewriting
    that one while the guard still stops jobs."""
    home = a_home(tmp_path)
    folder = tmp_path / "lhc" / "continuity" / "thread-1"
    folder.mkdir(parents=True)
    (folder / "undelivered.json").write_text(json.dumps(["[runtime note] told before"]))
    (folder / "guard-4242.json").write_text(json.dumps(["[runtime note] stopped by the guard"]))

    session = a_session(home)
    carry = cc_lhc.BackgroundCarry(session)
    assert list(carry.notes) == ["[runtime note] told before", "[runtime note] stopped by the guard"]
    assert json.loads((folder / "undelivered.json").read_text()) == list(carry.notes)
    assert not (folder / "guard-4242.json").exists()  # safe in undelivered.json now


def test_notes_are_typed_without_keys_claude_would_act_on():
    # a job's output with a progress bar (CR), colours (ESC) and tabs
    typed = cc_lhc.typeable("[runtime note] done:\r\n50%\r100%\t\x1b[32mok\x1b[0m")
    assert typed == "[runtime note] done:\n50%\n100%    \\x1b[32mok\\x1b[0m"
    assert not any(ord(ch) < 32 and ch != "\n" for ch in typed)


def test_an_at_sign_starting_a_word_in_a_note_attaches_no_file():
    """Claude reads `@path` in a prompt as a file to attach; a job's output is words."""
    typed = cc_lhc.typeable("see @README and mail a@b.c\n@src/x.py\tnpm @types/node")
    assert typed == "see \\@README and mail a@b.c\n\\@src/x.py    npm \\@types/node"


def test_after_clear_the_notes_still_to_tell_go_with_the_new_thread(tmp_path):
    home = a_home(tmp_path)
    session = a_session(home)
    capture = session.capture
    carry = cc_lhc.BackgroundCarry(session)
    carry.notes.append("[runtime note] the job finished")
    carry.next_note(lambda: False)
    first = tmp_path / "lhc" / "continuity" / "thread-1" / "undelivered.json"
    assert json.loads(first.read_text()) == ["[runtime note] the job finished"]
    capture.thread_id = "thread-2"  # /clear: the session follows Claude into a new thread
    carry.next_note(lambda: False)
    second = tmp_path / "lhc" / "continuity" / "thread-2" / "undelivered.json"
    assert json.loads(second.read_text()) == ["[runtime note] the job finished"]
    assert not first.exists()  # held once, by the thread the session is on


def test_a_continuity_folder_that_cannot_be_written_does_not_end_the_session(tmp_path):
    home = a_home(tmp_path)
    (tmp_path / "lhc" / "continuity").write_text("a file where the folder belongs")

    session = a_session(home)
    carry = cc_lhc.BackgroundCarry(session)
    carry.notes.append("[runtime note] the job finished")
    assert carry.next_note(lambda: False) == ""  # no exception into the relay loop
    assert list(carry.notes) == ["[runtime note] the job finished"]  # still held, told later


def test_an_unreadable_kept_notes_file_is_set_aside_not_overwritten(tmp_path):
    home = a_home(tmp_path)
    folder = tmp_path / "lhc" / "continuity" / "thread-1"
    folder.mkdir(parents=True)
    (folder / "undelivered.json").write_text("{not json")
    carry = cc_lhc.BackgroundCarry(a_session(home))
    carry.notes.append("[runtime note] the job finished")
    carry.next_note(lambda: False)
    (aside,) = folder.glob("undelivered.json.*.unreadable")
    assert aside.read_text() == "{not json"
    assert json.loads((folder / "undelivered.json").read_text()) == ["[runtime note] the job finished"]


def test_what_reached_the_old_claude_after_the_seam_is_told_to_its_replacement(tmp_path):
    """A monitor event that reached the Claude a swap then ended (the records the real CLI
    wrote for one), and a tool it called about it: the replacement runs on the seam's view
    and would learn neither, so both are told to it."""
    cap, path, lines = recorded(tmp_path, "monitor-2.1.328.jsonl", 3)
    try:
        seam = cap.store.db.execute("SELECT max(n) FROM turns").fetchone()[0]
        assert cc_lhc.after_seam_note(cap.store, seam, "sess-1") == ""  # nothing came after it
        event = json.loads(lines[5])
        acted = {"parentUuid": event["uuid"], "isSidechain": False, "type": "assistant",
                 "uuid": "0c0ffee0-0000-4000-8000-000000000001", "sessionId": event["sessionId"],
                 "timestamp": event["timestamp"], "cwd": event.get("cwd"),
                 "message": {"id": "msg_acted", "type": "message", "role": "assistant",
                             "model": "claude-opus-5-5", "stop_reason": "tool_use",
                             "content": [{"type": "tool_use", "id": "toolu_acted", "name": "Bash",
                                          "input": {"command": "cat counter.log"}}]}}
        with open(path, "a") as f:
            f.write("".join(lines[3:]) + json.dumps(acted) + "\n")
        cap.catch_up()
        assert cap.store.interrupt_open_turn("sess-1", "swapped") == seam + 1
        assert cc_lhc.after_seam_note(cap.store, seam, "sess-1") == (
            "[runtime note] These monitor events reached only the previous Claude process, just "
            "before cc-lhc replaced it for Smart Compact: monitor bdz3tukym (count) reported EVT-1. "
            f"The previous Claude process had begun acting on what reached it then and was stopped "
            f"part-way: t{seam + 1} (it called Bash). Read it back with cc-lhc get-turns before you go on.")
        assert cc_lhc.after_seam_note(cap.store, seam + 1, "sess-1") == ""  # a later seam saw it
        assert cc_lhc.after_seam_note(cap.store, seam, "replacement") == ""  # not that session's
    finally:
        cap.stop()


def test_a_job_that_ended_after_the_seam_is_left_to_the_carry_to_tell(tmp_path):
    t = Transcript("sess-1")
    launch(t, "toolu_bg", "Bash", SHELL_ACK.format(id="b1"), command="make", run_in_background=True)
    t.user(notification("toolu_bg", "completed"), origin={"kind": "task-notification"})
    cap = captured(tmp_path, t)
    try:
        seam = cap.store.db.execute("SELECT max(n) FROM turns").fetchone()[0] - 1
        # the carry tells a finished job's result itself: said here too, it would come twice
        assert cc_lhc.after_seam_note(cap.store, seam, "sess-1") == ""
    finally:
        cap.stop()


def test_a_note_given_to_the_carry_is_kept_for_the_next_launch_until_typed(tmp_path):
    home = a_home(tmp_path)
    carry = cc_lhc.BackgroundCarry(a_session(home))
    carry.tell("[runtime note] something")
    kept = json.loads(Path(cc_lhc.kept_notes_path(home, "thread-1")).read_text())
    assert kept == ["[runtime note] something"] and list(carry.notes) == kept


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="/proc")
def test_the_old_claudes_copy_of_a_quoted_monitor_command_is_found():
    """Claude runs a monitor's command under eval '<command>' with each ' written '"'"';
    its copy must be found (and stopped at a swap) with quotes in the command too."""
    import subprocess
    command = "echo 'QSTART-71'; sleep 30; echo 'QLATE'"
    quoted = command.replace("'", "'\"'\"'")
    child = subprocess.Popen(["bash", "-c", f"eval '{quoted}'", "--"], stdout=subprocess.DEVNULL)
    try:
        assert cc_lhc._children_running(os.getpid(), command) == [child.pid]
        assert cc_lhc._children_running(os.getpid(), "echo 'ANOTHER'") == []
    finally:
        child.kill()
        child.wait()


def test_work_an_earlier_claude_process_left_open_is_closed_before_a_launch(tmp_path):
    """Before a launch starts its Claude, what the thread holds as open was started by a
    Claude process that is gone (killed before it wrote how the work ended): a later swap
    of this launch must not carry it (a monitor started again, a job named as running)."""
    cap, _path, _lines = recorded(tmp_path, "bash-run-in-background-2.1.328.jsonl", 2)
    try:
        assert [i.task_id for i in cc_lhc.background_items(cap.store)] == ["b2i3ux1l7"]
        cc_lhc.close_orphaned_background(cap.home, cap.store)
        assert cc_lhc.background_items(cap.store) == []
        cc_lhc.close_orphaned_background(cap.home, cap.store)  # (nothing open: nothing to do)
    finally:
        cap.stop()
    [logged] = [json.loads(line) for line in (tmp_path / "lhc" / "wrapper.log").read_text().splitlines()
                if '"background_orphaned"' in line]
    assert logged["items"] == ["Bash m1"]



def test_a_sendmessage_that_resumed_an_agent_opens_it_again_and_one_that_queued_does_not():
    """SendMessage to a stopped agent runs it again in the background (its acknowledgement
    names the agent it resumed); to a running one, or refused, it starts nothing."""
    resumed = '{"success":true,"message":"Resuming agent a50c920","resumedAgentId":"a50c920d1","pin":{}}'
    revived = '{"success":true,"message":"Resuming agent x","revivedAgentId":"a77"}'
    assert cc_lhc._launched("SendMessage", {"to": "a50c920d1"}, resumed)["task_id"] == "a50c920d1"
    assert cc_lhc._launched("SendMessage", {"to": "a77"}, revived)["kind"] == "agent"
    for ack in ('{"success":true,"message":"Message queued for delivery to a50c920d1"}',
                '{"success":false,"message":"Agent \\"a1\\" could not be resumed: No transcript found"}',
                "not json", '{"success":true,"resumedAgentId":""}'):
        assert cc_lhc._launched("SendMessage", {"to": "a1"}, ack) is None, ack


def test_subagent_transcripts_are_copied_into_a_rebuilt_session_without_taking_anything_away(tmp_path, iso_env):
    """Every agent transcript of the thread's sessions goes into the rebuilt session's
    folder (the newest session's copy of one), Claude's compaction agents aside; a copy the
    new session's Claude has written to since is never overwritten, one it has not is
    brought up to date."""
    home = cc_lhc.StateHome()
    old, older, new = (tmp_path / f"{n}.jsonl" for n in ("old", "older", "new"))
    for session, files in ((older, {"agent-a1.jsonl": b"1\n", "agent-a2.jsonl": b"x\n"}),
                           (old, {"agent-a1.jsonl": b"1\n2\n", "agent-a1.meta.json": b"{}",
                                  "agent-acompact-9.jsonl": b"c\n", "notes.txt": b"n"})):
        folder = tmp_path / session.stem / "subagents"
        folder.mkdir(parents=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
    assert cc_lhc.carry_subagents(home, [str(older), str(old)], str(new)) == 3
    copied = tmp_path / "new" / "subagents"
    assert sorted(p.name for p in copied.iterdir()) == ["agent-a1.jsonl", "agent-a1.meta.json", "agent-a2.jsonl"]
    assert (copied / "agent-a1.jsonl").read_bytes() == b"1\n2\n"
    # the old Claude wrote more since: brought up to date
    (tmp_path / "old" / "subagents" / "agent-a1.jsonl").write_bytes(b"1\n2\n3\n")
    assert cc_lhc.carry_subagents(home, [str(old)], str(new)) == 1
    assert (copied / "agent-a1.jsonl").read_bytes() == b"1\n2\n3\n"
    # the new Claude resumed the agent (its copy is no longer a start of the old one): kept
    (copied / "agent-a1.jsonl").write_bytes(b"1\n2\nR\n")
    (tmp_path / "old" / "subagents" / "agent-a1.jsonl").write_bytes(b"1\n2\n3\n4\n")
    assert cc_lhc.carry_subagents(home, [str(old)], str(new)) == 0
    assert (copied / "agent-a1.jsonl").read_bytes() == b"1\n2\nR\n"


def test_an_agent_run_again_is_not_taken_for_finished_by_the_answer_of_its_run_before(tmp_path):
    """SendMessage runs a finished agent again; until the new run's first records are
    written, its transcript ends on the answer of the run before. Built at that moment, a
    swap's manifest said the agent "had finished" while the carry, a moment later, offered
    to resume it. An answer older than the agent's launch is not this run's."""
    t = Transcript()
    launch(t, "toolu_agent", "Agent", AGENT_ACK, prompt="look around", description="d")
    cap = captured(tmp_path, t)
    (item,) = cc_lhc.background_items(cap.store)
    launched = cc_lhc.record_time(cap.store.db.execute("SELECT created FROM messages WHERE seq = ?",
                                                       (item.seq,)).fetchone()[0])
    cap.stop()
    carry = cc_lhc.BackgroundCarry(a_session(cc_lhc.StateHome(tmp_path / "lhc")))
    old = tmp_path / "projects" / "s.jsonl"
    folder = old.parent / "s" / "subagents"
    folder.mkdir(parents=True)

    def answered_at(when):
        stamp = datetime.datetime.fromtimestamp(when, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
        (folder / f"agent-{item.task_id}.jsonl").write_text(json.dumps(
            {"type": "assistant", "timestamp": stamp, "message": {"role": "assistant", "stop_reason": "end_turn",
                                                                  "content": [{"type": "text", "text": "FOUND IT"}]}})
            + "\n")
        return carry._agent_report(item, "s", str(old))
    assert answered_at(launched + 5).endswith("had finished; its final result: FOUND IT")
    assert "was interrupted by the swap" in answered_at(launched - 60)  # the run before's answer


def test_a_note_ending_in_a_backslash_is_sent_by_the_enter_after_it():
    """Claude takes backslash-Enter for a new line: a job's output ending in one (a path,
    a continued command line) left the note unsent in the box, and the person's next words
    joined it. A space after the last backslash lets the Enter send it; others stay."""
    assert cc_lhc.typeable("dir is C:\\temp\\") == "dir is C:\\temp\\ "
    assert cc_lhc.typeable("gcc -o app main.c \\\n  -lm") == "gcc -o app main.c \\\n  -lm"
    assert cc_lhc.typeable("done") == "done"


@pytest.mark.skipif(not hasattr(os, "getsid"), reason="POSIX sessions")
def test_a_carried_job_is_over_when_its_shell_ends_though_a_process_it_started_runs_on(tmp_path):
    """A command that starts something in the background and returns (`server &`): the
    process it left holds the output file for long after, and the job was taken to run on
    until that ended (plain Claude tells it done when its shell ends)."""
    import subprocess
    home = a_home(tmp_path)
    carry = cc_lhc.BackgroundCarry(a_session(home))
    out, release = tmp_path / "b1.output", tmp_path / "release"
    with open(out, "wb") as f:
        shell = subprocess.Popen(["sh", "-c", f"while [ ! -e {release} ]; do sleep 0.05; done; "
                                  "(sleep 30; echo LATE) & echo PARENT-DONE-77"],
                                 stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        item = cc_lhc.BackgroundItem("shell", "Bash", 3, "toolu_bg", {"command": "serve"}, task_id="b1",
                                     output_file=str(out))
        job = cc_lhc.CarriedJob(item, cc_lhc._holders(str(out)), output=str(out))
        assert job.root == shell.pid
        carry.jobs.append(job)
        carry._poll_job(job, 0.0)
        assert not job.finished and not carry.notes
        release.touch()
        shell.wait(timeout=10)
        assert any(cc_lhc._alive(p) for p in cc_lhc._holders(str(out)))  # (the sleep holds it still)
        carry._poll_job(job, 0.0)
        assert job.finished and "PARENT-DONE-77" in carry.notes[-1] and "has finished" in carry.notes[-1]
    finally:
        for pid in cc_lhc._holders(str(out)):
            cc_lhc._stop_job(pid, None)
        shell.wait(timeout=10)


# (both scripts below: the processes that ended under this one and were never collected)
OURS_ENDED = r"""
def ours_ended(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[:2] == ["Z", str(os.getpid())]
    except OSError:
        return False
"""

SUBREAPER_SCRIPT = r"""
import os, signal, subprocess, sys, time
import cc_lhc
""" + OURS_ENDED + r"""
# a stand-in for Claude: it starts a background command in a session of its own (which
# starts a helper of its own in the background) and another process, and prints their pids
claude = subprocess.Popen([sys.executable, "-c", '''
import subprocess, sys, time
job = subprocess.Popen(["sh", "-c", "sleep 2.5 & sleep 2; exit 3"], start_new_session=True)
helper = subprocess.Popen(["sleep", "0.5"])
print(job.pid, helper.pid, flush=True)
time.sleep(60)
'''], stdout=subprocess.PIPE, start_new_session=True)
job, helper = map(int, claude.stdout.readline().split())
taken = cc_lhc.children_of(claude.pid)  # (what LiveHandoff._end_old does as a swap ends Claude)
assert set(taken) == {job, helper}, taken
assert cc_lhc.set_subreaper(True)
claude.kill()
claude.wait()
assert cc_lhc.set_subreaper(False)
time.sleep(1)  # the helper has ended, the job not yet
codes = {}
cc_lhc.reap_taken_in(taken, codes)  # the helper ended: collected; the job still runs
print(sorted(taken) == [job], helper in codes, job in codes)
time.sleep(3)  # the job has ended (and so has the sleep it left, which init took in)
cc_lhc.reap_taken_in(taken, codes)
zombies = [p for p in (job, helper) if os.path.exists(f"/proc/{p}")]
zombies += [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if ours_ended(p)]
print(codes[job], taken, zombies)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_a_carried_command_ends_under_cc_lhc_which_tells_its_exit_status_and_leaves_no_zombie(tmp_path):
    """Claude, ended by a swap, leaves its background command running; the command then
    failed, and with no parent of cc-lhc's its exit status was lost (the note said only "has
    finished"). cc-lhc takes in what that Claude started as it ends (a child subreaper for
    that moment only), reads the status of the command's shell, and collects the others, so
    none stays a zombie; what those leave later goes to init as before."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", SUBREAPER_SCRIPT], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(Path(cc_lhc.__file__).parent)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["True True False", "3 {} []"]


@pytest.mark.parametrize("argv, at", [
    (["-p", "--max-turns", "3"], None),                                   # the prompt on stdin
    (["--continue", "--output-format", "stream-json", "--verbose", "--input-format", "stream-json",
      "--permission-prompt-tool", "stdio", "-p"], None),                 # the Agent SDK's argv
    (["-p", "hi", "-n", "hi"], 1),                                        # a value that reads the same
    (["--resume", "0b0e6a52-37a3-4a35-9e37-7e16b4a3b0c8", "-p", "--max-turns", "3", "do it"], 5),
    (["-p", "--", "-x looks like an option"], 2),
])
def test_kept_notes_go_ahead_of_the_prompt_never_into_an_options_value(tmp_path, argv, at):
    """The notes kept for a thread's next launch go ahead of a one-shot's prompt. They were
    put in front of the last argument that read as a prompt: with an option cc-lhc did not
    know to take a value (--max-turns 3, --permission-prompt-tool stdio), into its value,
    and Claude failed ("must be a number", "MCP tool ... not found")."""
    home = a_home(tmp_path)
    Path(cc_lhc.kept_notes_path(home, "thread-1")).write_text(json.dumps(["[runtime note] stopped"]))
    spec = types.SimpleNamespace(child_argv=["claude", *argv])
    given = cc_lhc.give_kept_notes_to_prompt(spec, home, "thread-1")
    if at is None:
        assert given is None and spec.child_argv == ["claude", *argv]  # kept for a launch that can say them
        return
    assert given is not None
    changed = [i for i, (a, b) in enumerate(zip(spec.child_argv[1:], argv)) if a != b]
    assert changed == [at] and spec.child_argv[at + 1] == f"[runtime note] stopped\n\n{argv[at]}"


END_OLD_SCRIPT = r"""
import os, signal, sys, time, types
import ptyprocess, cc_lhc
""" + OURS_ENDED + r"""
CLAUDE = '''
import subprocess, sys, time
job = subprocess.Popen(["sh", "-c", "sleep 1.5; exit 3"], start_new_session=True)
mcp = subprocess.Popen(["sh", "-c", "sleep 4 & read x; exit 0"], stdin=subprocess.PIPE)
print(job.pid, mcp.pid, flush=True)
time.sleep(60)
'''
child = ptyprocess.PtyProcess.spawn([sys.executable, "-c", CLAUDE])
line = b""
while not line.endswith(b"\n"):
    line += child.read(100)
job, mcp = map(int, line.split()[-2:])
time.sleep(0.3)
carry = cc_lhc.BackgroundCarry.__new__(cc_lhc.BackgroundCarry)
carry.taken_in, carry.exit_codes, carry.taken_sessions = {}, {}, []
handoff = types.SimpleNamespace(carry=carry, session=types.SimpleNamespace(
    home=types.SimpleNamespace(log=lambda *a, **k: None), survivors=[], announce=lambda *a: None))
cc_lhc.LiveHandoff._end_old(handoff, child, signal.SIGKILL)
time.sleep(2)
carry.take_in_left()
cc_lhc.reap_taken_in(carry.taken_in, carry.exit_codes)
print(carry.exit_codes.get(job), [p for p in map(int, filter(str.isdigit, os.listdir("/proc"))) if ours_ended(p)])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_what_the_hangup_of_an_ended_claudes_terminal_ends_is_collected_too():
    """As the swap's SIGKILL ends the old Claude, the hangup of its terminal ends what ran in
    its foreground (an MCP server's shell, say), and what those had started comes to cc-lhc
    while it takes in Claude's processes: it stayed a zombie under cc-lhc until it exited."""
    import subprocess
    for _ in range(3):  # (a race by nature: a few times)
        out = subprocess.run([sys.executable, "-c", END_OLD_SCRIPT], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "PYTHONPATH": str(Path(cc_lhc.__file__).parent)})
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[0] == "3 []"
