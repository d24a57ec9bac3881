"""Which background items a live swap would lose (cc_lhc.open_background_work)."""

from __future__ import annotations

import cc_lhc
from test_capture_parse import Transcript, text, tool_use


def captured(tmp_path, t: Transcript):
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    cap = cc_lhc.Capture(home, "thread-1", "sess-1", str(t.write(tmp_path / "t.jsonl")))
    cap.catch_up()
    return cap


def launch(t: Transcript, tid: str, name: str, **inp):
    t.user("go")
    t.assistant({"type": "tool_use", "id": tid, "name": name, "input": inp}, stop="tool_use")
    t.tool_result((tid, "launched"))
    t.assistant(text("started"))


def notification(tid: str, status: str) -> str:
    return (f"<task-notification><task-id>b1</task-id><tool-use-id>{tid}</tool-use-id>"
            f"<status>{status}</status><summary>done</summary></task-notification>")


def test_a_background_shell_job_is_open_until_its_completion_is_notified(tmp_path):
    t = Transcript()
    launch(t, "toolu_bg", "Bash", command="sleep 30", run_in_background=True)
    cap = captured(tmp_path / "a", t)
    assert cc_lhc.open_background_work(cap.store) == ["Bash m2"]
    cap.stop()
    t.user(notification("toolu_bg", "completed"))
    t.assistant(text("it finished"))
    cap = captured(tmp_path / "b", t)
    assert cc_lhc.open_background_work(cap.store) == []
    cap.stop()


def test_a_running_notice_is_not_terminal_evidence(tmp_path):
    t = Transcript()
    launch(t, "toolu_mon", "Monitor", command="tail -f log", timeout_ms=60000, description="watch")
    t.user(notification("toolu_mon", "running"))
    cap = captured(tmp_path, t)
    assert cc_lhc.open_background_work(cap.store) == ["Monitor m2"]
    cap.stop()


def test_foreground_work_and_failed_launches_are_not_open(tmp_path):
    t = Transcript()
    launch(t, "toolu_fg", "Bash", command="ls")
    launch(t, "toolu_agent", "Agent", prompt="look", description="d", run_in_background=False)
    t.user("go")
    t.assistant(tool_use("toolu_bad", "sleep 9"), stop="tool_use")
    t.tool_result(("toolu_bad", "could not start", True))
    t.assistant(text("failed"))
    cap = captured(tmp_path, t)
    assert cc_lhc.open_background_work(cap.store) == []
    cap.stop()


def test_agents_are_background_by_default_and_wakeups_wait_for_their_wakeup(tmp_path):
    t = Transcript()
    launch(t, "toolu_agent", "Agent", prompt="look around", description="d")
    launch(t, "toolu_wake", "ScheduleWakeup", delaySeconds=60, reason="r", prompt="p")
    cap = captured(tmp_path / "a", t)
    assert cc_lhc.open_background_work(cap.store) == ["Agent m2", "ScheduleWakeup m6"]
    cap.stop()
    t.user("wake up", isMeta=True)
    cap = captured(tmp_path / "b", t)
    assert cc_lhc.open_background_work(cap.store) == ["Agent m2"]
    cap.stop()
