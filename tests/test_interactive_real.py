"""Interactive sessions as a person uses them, in tmux, with the real Claude Code CLI."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

import cc_lhc
from realcli import (CC_LHC, OVER_USAGE, PROMPT, exit_cleanly, log_events, message_mid_turn, thread_turns,
                     type_line, wait_for_log, wait_until)
from tmuxdrive import TmuxTimeout

def oneshot(rc, prompt: str, reply: str) -> str:
    rc.api.script([reply])
    p = rc.run([sys.executable, CC_LHC, "-p", prompt, "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["session_id"]


def test_bare_resume_offers_this_folders_threads(real_claude, tmux):
    first = oneshot(real_claude, "the first topic", "noted, first")
    second = oneshot(real_claude, "the second topic", "noted, second")
    n_before = len(real_claude.api.message_requests)
    real_claude.api.script(["back in the first thread"])
    t = tmux([sys.executable, CC_LHC, "--resume"], cols=120, rows=30, env=real_claude.env,
             cwd=real_claude.cwd)
    screen = t.wait_for("Resume which?")
    # newest first: the second thread is 1, the first is 2, each with its last prompt
    assert screen.index("the second topic") < screen.index("the first topic")
    type_line(t, "2")
    t.wait_for(PROMPT)
    type_line(t, "where were we")
    t.wait_for("back in the first thread")
    exit_cleanly(t)
    (request,) = real_claude.api.message_requests[n_before:]
    assert request["session_id"] == first != second


def test_the_picker_marks_a_thread_in_use_and_offers_the_newest_free_one(real_claude, tmux):
    first = oneshot(real_claude, "the first topic", "noted, first")
    oneshot(real_claude, "the second topic", "noted, second")
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    by_session = {r[4]: r[0] for r in cc_lhc.Registry(home).threads()}
    newest = next(t for s, t in by_session.items() if s != first)
    lease = cc_lhc.Lease(home, newest)
    lease.acquire()  # as another live cc-lhc would hold it
    try:
        real_claude.api.script(["back in the first thread"])
        t = tmux([sys.executable, CC_LHC, "--resume"], cols=120, rows=30, env=real_claude.env,
                 cwd=real_claude.cwd)
        screen = t.wait_for("Resume which?")
        assert f"the second topic  (in use by cc-lhc pid {os.getpid()})" in screen
        assert "Resume which? [2]" in screen
        t.send_keys("Enter")  # the default: the first thread, free
        t.wait_for(PROMPT)
        type_line(t, "where were we")
        t.wait_for("back in the first thread")
        exit_cleanly(t)
    finally:
        lease.release()
    assert real_claude.api.message_requests[-1]["session_id"] == first


def test_the_picker_shows_prompts_inert_and_end_of_input_chooses_nothing(real_claude, tmux):
    """A prompt holding terminal controls (a pasted log) is listed with them escaped, never
    written to the terminal; ctrl-d at the question launches nothing and exits 2."""
    oneshot(real_claude, "look \x1b[2J\x1b]0;pwned\x07 here", "noted")
    n_before = len(real_claude.api.message_requests)
    t = tmux(f"{sys.executable} {CC_LHC} -p 'reply briefly' --resume; echo EXIT=$?", cols=120, rows=30,
             env=real_claude.env, cwd=real_claude.cwd)
    screen = t.wait_for("Resume which?")
    assert "look \\x1b[2J\\x1b]0;pwned\\x07 here" in screen
    t.send_keys("C-d")
    screen = t.wait_for("EXIT=")
    assert "EXIT=2" in screen and "nothing chosen" in screen
    assert len(real_claude.api.message_requests) == n_before  # Claude was never started



def test_continue_and_the_picker_keep_a_thread_whose_transcript_claude_deleted(real_claude, tmux):
    """Claude Code deletes old transcripts (cleanupPeriodDays): the thread still holds the
    conversation, so `--continue` goes on with it (written again from the thread) and the
    picker offers it, by when its record was last written (it started a new, empty thread;
    the picker said the folder had none)."""
    rc = real_claude
    gone = oneshot(rc, "remember PELICAN-42", "noted PELICAN-42")
    (rc.project_dir / f"{gone}.jsonl").unlink()
    rc.api.script(["it was PELICAN-42"])
    p = rc.run([sys.executable, CC_LHC, "-c", "-p", "what did I ask you to remember?"])
    assert p.returncode == 0, p.stderr
    assert "PELICAN-42" in json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert len(cc_lhc.Registry(cc_lhc.StateHome(rc.env["CC_LHC_HOME"])).threads()) == 1
    (gone,) = [s for s in (r[4] for r in cc_lhc.Registry(cc_lhc.StateHome(rc.env["CC_LHC_HOME"])).threads())]
    (rc.project_dir / f"{gone}.jsonl").unlink()
    rc.api.script(["picked"])
    t = tmux(f"{sys.executable} {CC_LHC} -p 'go on' --resume; echo EXIT=$?", cols=120, rows=30,
             env=rc.env, cwd=rc.cwd)
    screen = t.wait_for("Resume which?")
    assert "remember PELICAN-42" in screen or "what did I ask" in screen
    t.send_keys("Enter")
    assert "EXIT=0" in t.wait_for("EXIT=")
    assert "PELICAN-42" in json.dumps(rc.api.message_requests[-1]["body"]["messages"])



def test_continue_is_not_taken_by_a_fresh_session_that_wrote_nothing_yet(real_claude, tmux):
    """Another cc-lhc of this folder just opened, nothing typed: its thread holds no
    conversation and no transcript yet, so `--continue` goes on with the newest one that
    does, as `claude --continue` does (it took the fresh one, and was refused: in use)."""
    rc = real_claude
    first = oneshot(rc, "remember OTTER-7", "noted OTTER-7")
    t = tmux([sys.executable, CC_LHC], cols=120, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    wait_until(lambda: len(cc_lhc.Registry(home).threads()) == 2, "the fresh thread registered")
    try:
        rc.api.script(["it was OTTER-7"])
        p = rc.run([sys.executable, CC_LHC, "-c", "-p", "what did I ask you to remember?"])
        assert p.returncode == 0, p.stderr
        assert rc.api.message_requests[-1]["session_id"] == first
    finally:
        exit_cleanly(t)

def test_the_picker_names_a_damaged_thread_and_offers_the_others(real_claude, tmux):
    """One thread file of the folder damaged: the picker names it (as `cc-lhc threads`
    does) and offers the rest (it failed outright, listing none)."""
    rc = real_claude
    first = oneshot(rc, "the first topic", "noted, first")
    second = oneshot(rc, "the second topic", "noted, second")
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    by_session = {r[4]: r[0] for r in cc_lhc.Registry(home).threads()}
    with open(home.path("threads", f"{by_session[first]}.sqlite"), "r+b") as f:
        f.write(b"GARBAGE" * 200)
    rc.api.script(["back in the second thread"])
    t = tmux(f"{sys.executable} {CC_LHC} -p 'go on' --resume; echo EXIT=$?", cols=160, rows=30,
             env=rc.env, cwd=rc.cwd)
    t.wait_for("Resume which?")
    screen = t.capture(history=True).replace("\n", "")  # (the long line wraps)
    assert f"thread {by_session[first][:8]} left out of this list" in screen
    assert "the second topic" in screen and "the first topic" not in screen
    t.send_keys("Enter")
    assert "EXIT=0" in t.wait_for("EXIT=")
    assert rc.api.message_requests[-1]["session_id"] == second



def test_the_picker_names_a_damaged_thread_whose_transcript_claude_deleted(real_claude, tmux):
    """A thread whose transcript Claude Code deleted and whose record cannot be read is
    named by the picker (it was left out without a word, and the folder said to have no
    threads); with nothing else to offer the launch ends (exit 1)."""
    rc = real_claude
    session = oneshot(rc, "a topic", "noted")
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    (thread,) = [r[0] for r in cc_lhc.Registry(home).threads()]
    (rc.project_dir / f"{session}.jsonl").unlink()
    with open(home.path("threads", f"{thread}.sqlite"), "r+b") as f:
        f.write(b"GARBAGE" * 200)
    t = tmux(f"{sys.executable} {CC_LHC} -p 'go on' --resume; echo EXIT=$?", cols=160, rows=30,
             env=rc.env, cwd=rc.cwd)
    t.wait_for("EXIT=")
    screen = t.capture(history=True).replace("\n", "")  # (the long line wraps, its start scrolled up)
    assert f"thread {thread[:8]} left out of this list" in screen and "EXIT=1" in screen
    assert "no cc-lhc threads in this folder" not in screen

def test_a_resume_of_a_thread_whose_record_and_transcript_are_gone_makes_no_empty_record(real_claude):
    """Record and transcript both gone: the launch is refused (exit 1) and makes no new,
    empty record (which listed the thread with 0 turns and hid the loss from doctor)."""
    rc = real_claude
    session = oneshot(rc, "a topic", "noted")
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    (thread,) = [r[0] for r in cc_lhc.Registry(home).threads()]
    record = Path(home.path("threads", f"{thread}.sqlite"))
    record.unlink()
    (rc.project_dir / f"{session}.jsonl").unlink()
    n_before = len(rc.api.message_requests)
    p = rc.run([sys.executable, CC_LHC, "--resume", session, "-p", "go on"])
    assert p.returncode == 1, p.stderr
    assert "there is nothing to resume" in p.stderr and "cc-lhc doctor" in p.stderr
    assert not record.exists() and len(rc.api.message_requests) == n_before
    doctor = rc.run([sys.executable, CC_LHC, "doctor"])
    assert doctor.returncode == 1 and thread in doctor.stdout

def test_resume_by_session_name_as_claude_reads_it(real_claude):
    """`claude --resume <name>` resumes the session named so (`--name`, /rename): so does cc-lhc,
    landing on that session's thread, whatever case the name is typed in."""
    rc = real_claude
    rc.api.script(["noted: the failing test is test_parse_dates"])
    p = rc.run([sys.executable, CC_LHC, "-p", "--name", "build-fix", "the failing test is test_parse_dates",
                "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    named = json.loads(p.stdout)["session_id"]
    oneshot(rc, "another topic entirely", "noted, another")
    rc.api.script(["it was test_parse_dates"])
    p = rc.run([sys.executable, CC_LHC, "-p", "--resume", " Build-Fix ", "which test was failing?",
                "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["session_id"] == named
    assert "test_parse_dates" in json.dumps(rc.api.message_requests[-1]["body"]["messages"][0])
    # a name no session has is no session: the picker's search, which finds nothing here
    p = rc.run([sys.executable, CC_LHC, "-p", "--resume", "no-such-name", "hi"])
    assert p.returncode == 2 and "matches 'no-such-name'" in p.stderr
    # a name two threads' sessions have: refused naming both, as Claude refuses it (it
    # said that nothing matched)
    rc.api.script(["noted, the other build"])
    p = rc.run([sys.executable, CC_LHC, "-p", "--name", "Build-Fix", "a second build fix", "--output-format", "json"])
    other = json.loads(p.stdout)["session_id"]
    p = rc.run([sys.executable, CC_LHC, "-p", "--resume", "build-fix", "which one?"])
    assert p.returncode == 2 and "names 2 sessions of different threads" in p.stderr, p.stderr
    assert named in p.stderr and other in p.stderr


def test_interactive_session_is_summarised_in_the_background(real_claude, tmux):
    env = dict(real_claude.env, CC_LHC_SUMMARIES="on")

    def answer(body):
        if body.get("tools") == []:  # the isolated summariser asks with no tools
            return "SUMMARY: the user asked about the build; Claude said it passes."
        return "The build passes."

    real_claude.api.responder = answer
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "does the build pass?")
    t.wait_for("The build passes.")
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    ((thread_id, *_),) = registry.threads()
    deadline = time.monotonic() + 60
    while True:
        store = cc_lhc.ThreadStore(home, thread_id)
        try:
            text, source = cc_lhc.turn_summary(store, 1)
            cost = cc_lhc.derivation_cost(store)
        finally:
            store.close()
        if source == "model" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    exit_cleanly(t)
    assert source == "model" and text.startswith("SUMMARY:")
    assert cost["calls"] == 1 and cost["input_tokens"] > 0
    # the summariser's own session never became a thread
    assert len(registry.threads()) == 1


def _over_trigger_thread(rc) -> str:
    from fakeapi import text_reply
    rc.api.script([text_reply("an answer that filled the context", usage={
        "input_tokens": 370_000, "cache_creation_input_tokens": 500, "cache_read_input_tokens": 500,
        "output_tokens": 5})])
    p = rc.run([sys.executable, CC_LHC, "-p", "fill it up", "--output-format", "json"])
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["session_id"]


def test_interactive_resume_over_the_trigger_opens_the_rebuilt_session(real_claude, tmux):
    old = _over_trigger_thread(real_claude)
    n_before = len(real_claude.api.message_requests)
    real_claude.api.script(["answered on the rebuilt session"])
    t = tmux([sys.executable, CC_LHC, "--resume", old], cols=120, rows=30, env=real_claude.env,
             cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "carry on")
    t.wait_for("answered on the rebuilt session")
    exit_cleanly(t)
    (request,) = real_claude.api.message_requests[n_before:]
    new = request["session_id"]
    assert new != old
    first = request["body"]["messages"][0]["content"]
    first = first if isinstance(first, str) else first[0]["text"]
    assert first.startswith("[cc-lhc] This conversation was rebuilt by Smart Compact")
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    assert cc_lhc.Registry(home).current_session(thread_id) == new


def test_interactive_resume_is_accepted_once_claude_opens_the_rebuild(real_claude, tmux):
    # Claude 2.1.328 writes its own records as soon as it opens a resumed session, so the
    # rebuild is observed accepting even if the user leaves without typing: the thread
    # moves on to it then (not only at the session's end), and nothing is left pending.
    old = _over_trigger_thread(real_claude)
    t = tmux([sys.executable, CC_LHC, "--resume", old], cols=120, rows=30, env=real_claude.env,
             cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    wait_until(lambda: cc_lhc.Registry(home).db.execute(
        "SELECT status FROM rebuilds").fetchone() == ("accepted",), "the rebuild accepted while Claude runs")
    exit_cleanly(t)
    registry = cc_lhc.Registry(home)
    ((thread_id, *_),) = registry.threads()
    ((session, status),) = registry.db.execute("SELECT session_id, status FROM rebuilds").fetchall()
    assert status == "accepted" and registry.current_session(thread_id) == session != old


def _wait_for_settled(rc, timeout: float = 30) -> None:
    """Until the only thread's record ends at a settled seam (its last turn closed)."""
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    deadline = time.monotonic() + timeout
    while True:
        threads = cc_lhc.Registry(home).threads() if (Path(rc.env["CC_LHC_HOME"]) / "registry.sqlite").exists() else []
        if threads:
            store = cc_lhc.ThreadStore(home, threads[0][0])
            try:
                if not cc_lhc.unsettled_reason(store) and store.db.execute(
                        "SELECT count(*) FROM turns").fetchone()[0]:
                    return
            finally:
                store.close()
        assert time.monotonic() < deadline, f"the thread did not settle in {timeout}s"
        time.sleep(0.05)


def test_a_running_session_over_the_trigger_is_handed_to_a_rebuilt_one(real_claude, tmux):
    from fakeapi import text_reply
    real_claude.api.script([text_reply("a very long answer", usage=OVER_USAGE), "after the swap"])
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "go long")
    t.wait_for("a very long answer")
    wait_for_log(real_claude, "handoff_spawned")
    t.send_text("typed while it swaps")  # dropped, and said so: it is never delivered late
    # a /clear typed alone meanwhile is dropped too: Claude never gets it, so no advisory
    t.send_keys("C-u")
    t.send_text("/clear")
    t.send_keys("Enter")
    log = (Path(real_claude.env["CC_LHC_HOME"]) / "wrapper.log").read_text()
    spawned = next(json.loads(line) for line in log.splitlines() if "handoff_spawned" in line)
    # the replacement continues with the effort and permission mode Claude last recorded
    assert "--effort" in spawned["argv"] and "--permission-mode" in spawned["argv"]
    # and keeps the rules that let retrieval run without a permission prompt
    # the allow rules for retrieval lead the replacement's own arguments (after the mod's)
    argv = spawned["argv"]
    rules = cc_lhc.retrieval_allow_args()
    at = argv.index(rules[0])
    assert argv[at:at + len(rules)] == rules and at < argv.index("--resume")
    wait_for_log(real_claude, "handoff_switched")
    # the replacement's own first frame is on screen: the rebuilt conversation, and the
    # notice at its foot while the person has not typed again (Claude's alternate screen
    # keeps no history for it to scroll into)
    t.wait_for("This conversation was rebuilt by Smart Compact")
    t.wait_for(cc_lhc.LiveHandoff.NOTICE)
    assert [e for e in log_events(real_claude, "notice") if e["text"] == cc_lhc.LiveHandoff.NOTICE]
    t.wait_for(PROMPT)
    type_line(t, "next one")
    t.wait_for("after the swap")
    exit_cleanly(t)
    screen = t.capture(history=True).replace("\n", "")
    assert "input typed during compaction was not delivered \u2014 please resend" in screen
    assert cc_lhc.LIFECYCLE_NOTES["clear"][:40] not in screen
    assert not [e for e in log_events(real_claude, "notice") if e["text"] == cc_lhc.LIFECYCLE_NOTES["clear"]]
    first, second = real_claude.api.message_requests
    assert first["session_id"] != second["session_id"]
    opening = second["body"]["messages"][0]["content"]
    opening = opening if isinstance(opening, str) else opening[0]["text"]
    assert opening.startswith("[cc-lhc] This conversation was rebuilt by Smart Compact")
    sent = json.dumps(second["body"]["messages"])
    assert "typed while it swaps" not in sent and "go long" in sent and "next one" in sent
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    ((thread_id, *_),) = registry.threads()
    assert registry.current_session(thread_id) == second["session_id"]
    assert [r[0] for r in registry.db.execute("SELECT status FROM rebuilds")] == ["accepted"]
    export = json.loads(real_claude.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    assert [m.get("text") for m in export] == ["go long", "a very long answer", "next one",
                                               "after the swap"]


@pytest.mark.parametrize("mod", ["on", "off"])
def test_a_turn_stopped_with_esc_over_the_trigger_is_compacted_while_idle(real_claude, tmux, mod):
    """Esc during a long tool call, the context over the trigger: the seam it leaves (no
    usage in its records) is Smart Compacted while Claude sits idle, in process with the
    mod and by a swap without, before the next prompt goes out (it went out whole, and
    only the answer after it was compacted)."""
    from fakeapi import text_reply, tool_use_reply
    real_claude.api.script([
        tool_use_reply("Bash", {"command": "python3 -c 'import time; time.sleep(60)'",
                                "description": "the slow thing"}, usage=OVER_USAGE),
        text_reply("answer after Esc"),
    ])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Bash(python3:*)"],
             cols=120, rows=30,
             env={**real_claude.env, "CC_LHC_MOD": mod}, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "run the slow thing")
    wait_until(lambda: real_claude.api.message_requests, "the first request")
    t.wait_for("the slow thing")
    time.sleep(1)  # (the tool is running)
    t.send_keys("Escape")
    t.wait_for("Interrupted")
    wait_for_log(real_claude, "smart_compact_rebuilt" if mod == "off" else "in_process_compact_served", timeout=60)
    if mod == "off":
        wait_for_log(real_claude, "handoff_switched", timeout=60)
    t.wait_for(PROMPT)
    type_line(t, "what now")
    t.wait_for("answer after Esc", timeout=60)
    sent = real_claude.api.message_requests[-1]
    opening = sent["body"]["messages"][0]["content"]
    opening = opening if isinstance(opening, str) else opening[0]["text"]
    assert opening.startswith("[cc-lhc] This conversation was rebuilt by Smart Compact"), opening[:200]
    exit_cleanly(t)


@pytest.mark.parametrize("choice", ["No", "Yes"])
def test_a_permission_answered_with_its_number_key_leaves_no_draft_to_wait_for(real_claude, tmux, choice):
    """Claude's permission dialog takes an option's number without an Enter: that digit is
    no message in the box, so the seam over the trigger after it is Smart Compacted (the
    digit counted as a draft, and Smart Compact waited for it until the next Enter)."""
    from fakeapi import text_reply, tool_use_reply
    real_claude.api.script([
        tool_use_reply("Bash", {"command": "rm -rf ./nothing-here-xyz", "description": "the risky thing"},
                       usage=OVER_USAGE),
        text_reply("all done now", usage=OVER_USAGE),
        text_reply("next answer"),
    ])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=120, rows=30,
             env={**real_claude.env, "CC_LHC_MOD": "off"}, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "run the risky thing")
    t.wait_for("Do you want to proceed", timeout=60)
    time.sleep(1)  # (the dialog takes keys once it has drawn its options)
    screen = t.wait_for(re.compile(r"\d\. " + choice))
    t.send_keys(re.search(r"(\d)\. " + choice, screen).group(1))  # (the option's number, as the dialog shows it)
    wait_for_log(real_claude, "handoff_switched", timeout=60)
    assert not log_events(real_claude, "handoff_waits_for_person")
    t.wait_for(PROMPT)
    exit_cleanly(t)


def test_a_digit_typed_while_an_allowed_tool_runs_is_a_draft_smart_compact_waits_for(real_claude, tmux):
    """A digit typed while a tool runs that needed no permission is the start of a message
    (no dialog was shown): Smart Compact at the seam after it waits, so no swap loses it."""
    from fakeapi import text_reply, tool_use_reply
    real_claude.api.script([
        tool_use_reply("Bash", {"command": "sleep 4", "description": "the slow thing"}, usage=OVER_USAGE),
        text_reply("all done now", usage=OVER_USAGE),
    ])
    t = tmux([sys.executable, CC_LHC, "--allowedTools", "Bash"], cols=120, rows=30,
             env={**real_claude.env, "CC_LHC_MOD": "off"}, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "run the slow thing")
    t.wait_for("the slow thing")
    time.sleep(1)
    t.send_keys("2")
    t.wait_for("all done now", timeout=30)
    wait_for_log(real_claude, "handoff_waits_for_person", timeout=30)
    time.sleep(1)
    assert not log_events(real_claude, "handoff_switched")
    assert re.search(r"❯\s*2", t.capture())  # (still in the box)
    # Erased without a send, the draft holds nothing back: the seam is Smart Compacted
    # then (it waited for the next answer's seam)
    t.send_keys("BSpace")
    wait_for_log(real_claude, "handoff_switched", timeout=60)
    t.wait_for(PROMPT)
    exit_cleanly(t)


def test_rebuilds_that_cannot_even_be_prepared_raise_an_alarm_that_says_so(real_claude, tmux):
    """When cc-lhc fails before any replacement starts (here its runtime folder is replaced
    by a file, so no retrieval descriptor can be written), the alarm after repeated failures
    does not blame the installed Claude; the session is still relaunched with Claude's own
    compaction allowed, and goes on."""
    import shutil
    from fakeapi import text_reply
    real_claude.api.responder = lambda body: text_reply("still the original child", usage=OVER_USAGE)
    t = tmux([sys.executable, CC_LHC], cols=140, rows=30, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    runtime = Path(real_claude.env["CC_LHC_HOME"]) / "runtime"
    shutil.rmtree(runtime)
    runtime.write_text("not a folder")
    for n in range(1, 4):
        type_line(t, f"prompt {n}")
        wait_for_log(real_claude, "handoff_failed", count=n)
    wait_for_log(real_claude, "survival_relaunched")
    (alarm,) = log_events(real_claude, "handoff_alarm")
    assert alarm["message"].startswith("cc-lhc failed 3 times before a replacement started (last: could not "
                                       "prepare the rebuild: ")
    assert "compatibility" not in alarm["message"]
    t.wait_for(PROMPT)
    type_line(t, "prompt 4")
    t.wait_for(re.compile(r"prompt 4\s[\s\S]*?● still the original child"))
    exit_cleanly(t)
    screen = t.capture(history=True).replace("\n", "")
    assert "Claude's own compaction is back on for this session" in screen
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    (message,) = [r[0] for r in registry.db.execute("SELECT message FROM thread_alarms")]
    assert message == alarm["message"]


def test_replacements_that_will_not_load_leave_the_session_running_and_raise_the_alarm(
        real_claude, tmux, tmp_path):
    from fakeapi import text_reply
    # A claude that will not load a rebuilt session while the block file exists: every
    # replacement dies, while resuming an ordinary session still works.
    block = tmp_path / "block-resume"
    block.touch()
    shim = tmp_path / "claude"
    shim.write_text(f"""#!/bin/sh
prev= ; sid=
for a; do [ "$prev" = --resume ] && sid=$a; prev=$a; done
if [ -n "$sid" ] && [ -e {block} ] && \\
   grep -qs 'This conversation was rebuilt' "$CLAUDE_CONFIG_DIR"/projects/*/"$sid".jsonl; then
    echo 'refusing to load' >&2; exit 3
fi
exec {real_claude.claude} "$@"
""")
    shim.chmod(0o755)
    env = dict(real_claude.env, CC_LHC_CLAUDE_BIN=str(shim))
    real_claude.api.responder = lambda body: text_reply("still the original child", usage=OVER_USAGE)
    t = tmux([sys.executable, CC_LHC], cols=140, rows=30, env=env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    for n in range(1, 4):  # each settled seam over the trigger tries once more
        type_line(t, f"prompt {n}")
        wait_for_log(real_claude, "handoff_failed", count=n)
    # then the same session is relaunched with Claude native Compact allowed
    wait_for_log(real_claude, "survival_relaunched")
    log = (Path(real_claude.env["CC_LHC_HOME"]) / "wrapper.log").read_text()
    relaunched = next(json.loads(line) for line in log.splitlines() if "survival_relaunched" in line)
    environ = Path(f"/proc/{relaunched['new_pid']}/environ").read_bytes().split(b"\0")
    assert not any(v.startswith(b"DISABLE_AUTO_COMPACT=") for v in environ)
    t.wait_for(PROMPT)
    type_line(t, "prompt 4")
    # answered and drawn; the relaunched CLI may print one of its own notices in between
    t.wait_for(re.compile(r"prompt 4\s[\s\S]*?● still the original child"))
    exit_cleanly(t)
    screen = t.capture(history=True).replace("\n", "")
    assert ("cc-lhc rebuilt sessions are not loading \u2014 likely a compatibility problem with "
            "the installed Claude version") in screen
    assert "ended over the Smart Compact trigger" in screen
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    registry = cc_lhc.Registry(home)
    ((thread_id, *_),) = registry.threads()
    sessions = {r["session_id"] for r in real_claude.api.message_requests}
    assert len(sessions) == 1 and registry.current_session(thread_id) in sessions
    assert [r[0] for r in registry.db.execute("SELECT status FROM rebuilds")] == ["abandoned"] * 3
    # the relaunched child runs without DISABLE_AUTO_COMPACT, and the alarm stands
    log = (Path(real_claude.env["CC_LHC_HOME"]) / "wrapper.log").read_text()
    assert '"event": "survival_relaunched"' in log
    assert registry.db.execute("SELECT count(*) FROM thread_alarms").fetchone()[0] == 1
    # once Claude loads rebuilds again, the next resume runs Smart Compact before it starts
    block.unlink()
    old = registry.current_session(thread_id)
    p = real_claude.run([sys.executable, CC_LHC, "--resume", old, "-p", "go on"], env=env)
    assert p.returncode == 0, p.stderr
    assert "rebuilt sessions are not loading" in p.stderr  # the standing alarm, until...
    assert real_claude.api.message_requests[-1]["session_id"] != old
    # ...a rebuild is accepted again, which ends it
    assert registry.db.execute("SELECT count(*) FROM thread_alarms").fetchone()[0] == 0


def test_claude_searches_the_thread_from_an_interactive_session(real_claude, tmux):
    # As a person would: Claude runs `cc-lhc search` in the default permission mode, with
    # no prompt (cc-lhc allows exactly its retrieval commands), and gets the labels back.
    from fakeapi import tool_results, tool_use_reply
    real_claude.api.script(["The number is 31337.",
                            tool_use_reply("Bash", {"command": "cc-lhc search 31337",
                                                    "description": "look it up"}),
                            "Found it in m2."])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=110, rows=34,
             env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "pick a number")
    t.wait_for("31337")
    type_line(t, "what was it? search for it")
    t.wait_for("Found it in m2.")
    assert "Do you want to proceed?" not in t.capture(history=True)
    exit_cleanly(t)
    (result,) = tool_results(real_claude.api.message_requests[-1]["body"])
    content = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert "m2 (t1, assistant_text, " in content and "\u00bb31337\u00ab" in content


def test_the_control_panel_shows_status_and_gives_claude_its_screen_back(real_claude, tmux):
    real_claude.api.script(["first answer", "second answer"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("first answer")
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    for attempt in range(20):  # Claude writes its record a moment after it draws the answer
        type_line(t, "/status")
        try:
            screen = t.wait_for("context: provider-reported context 100", timeout=1)
            break
        except TmuxTimeout:
            if attempt == 19:
                raise
    assert "policy: target 180,000, trigger 360,000" in screen and "retrieval: ready" in screen
    assert "first answer" not in screen  # an alternate screen: Claude's is out of sight
    type_line(t, "/bounds 1000 500")
    t.wait_for("nothing changed")
    t.send_text("/allo")
    t.send_keys("Tab")
    type_line(t, "balanced")
    t.wait_for("profile balanced for the rest of this session")
    type_line(t, "/details")
    t.wait_for(re.compile(r"profile\s+\"balanced\"\s+panel"))
    t.send_keys("Escape")
    screen = t.wait_for("first answer")  # Claude's screen is back as it was
    assert "cc-lhc control panel" not in screen
    type_line(t, "and again")
    t.wait_for("second answer")
    exit_cleanly(t)
    # nothing typed into the panel reached Claude
    sent = json.dumps([r["body"]["messages"] for r in real_claude.api.message_requests])
    assert "/status" not in sent and "/bounds" not in sent and "and again" in sent


def _small_answer_settled(rc, tmux):
    """cc-lhc with one small answer drawn and its turn's end recorded: Claude draws its
    answer a moment before it writes the turn's end, and a manual Smart Compact needs that
    settled seam, so this waits for it as a person would see the idle prompt."""
    rc.api.script(["a small answer", "answered on the rebuilt session"])
    t = tmux([sys.executable, CC_LHC], cols=110, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("a small answer")
    _wait_for_settled(rc)
    return t


def _smart_compact_from_the_panel_and_carry_on(rc, t) -> None:
    t.send_keys("C-]")
    t.wait_for("cc-lhc control panel")
    type_line(t, "/smart-compact")
    wait_for_log(rc, "handoff_switched")
    t.wait_for("This conversation was rebuilt by Smart Compact")
    t.wait_for(PROMPT)
    type_line(t, "carry on")
    t.wait_for("answered on the rebuilt session")
    exit_cleanly(t)


def test_smart_compact_from_the_panel_hands_over_under_the_trigger(real_claude, tmux):
    t = _small_answer_settled(real_claude, tmux)
    _smart_compact_from_the_panel_and_carry_on(real_claude, t)
    first, second = real_claude.api.message_requests
    assert first["session_id"] != second["session_id"]


def test_after_context_and_model_the_seam_is_still_settled_for_a_smart_compact(real_claude, tmux):
    """/context writes its output for the model as a record of its own, /model only system
    records: neither is a turn the model still owes, so Smart Compact runs at once after them."""
    rc = real_claude
    t = _small_answer_settled(rc, tmux)
    type_line(t, "/context")
    t.wait_for("Context usage")
    wait_until(lambda: ("command", "closed", "local_command") in thread_turns(rc)[0],
               "a settled /context turn")
    t.send_keys("Escape")
    type_line(t, "/model")
    t.wait_for("Select model")
    t.send_keys("Escape")
    t.wait_for("Kept model as")
    assert thread_turns(rc)[1] == ""  # settled
    _smart_compact_from_the_panel_and_carry_on(rc, t)
    assert [kind for kind, _, _ in thread_turns(rc)[0]] == ["human", "command", "human"]


def test_a_too_long_rejection_is_compacted_and_continued_once(real_claude, tmux):
    from fakeapi import error_reply, tool_use_reply
    too_long = error_reply(400, "prompt is too long: 1050000 tokens > 1000000 maximum")
    real_claude.api.script([
        "ready",
        tool_use_reply("Bash", {"command": "echo read-the-first-pdf", "description": "read"}),
        too_long,                          # the request after that tool call is too big
        "continuing from the note",        # the one automatic continuation is answered
    ])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default", "--allowedTools", "Bash"],
             cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("ready")
    type_line(t, "now read every pdf")
    wait_for_log(real_claude, "too_long_continued")
    t.wait_for("continuing from the note")
    requests = real_claude.api.message_requests
    last = requests[-1]
    assert last["session_id"] != requests[0]["session_id"]  # it ran on the rebuilt session
    users = [m for m in last["body"]["messages"] if m["role"] == "user"]
    note = json.dumps(users[-1])
    assert "[runtime note]" in note and "Bash m4" in note  # the call that ran before the refusal
    # a second rejection stops with a note instead of continuing again
    real_claude.api.script([too_long])
    type_line(t, "and the rest")
    wait_for_log(real_claude, "too_long_again")
    exit_cleanly(t)
    screen = t.capture(history=True).replace("\n", "")
    assert "split the task into smaller steps" in screen
    log = (Path(real_claude.env["CC_LHC_HOME"]) / "wrapper.log").read_text()
    assert log.count('"event": "too_long_continued"') == 1


def test_a_too_long_rejection_in_a_session_with_stop_hooks_is_compacted_and_continued(real_claude, tmux):
    """A Stop hook configured (the thread waits for its report after each final answer):
    Claude writes the too-long refusal as an answer and runs no Stop hook after it, so
    nothing ever reports that turn's end; the refusal is still compacted and continued."""
    from fakeapi import error_reply
    settings = json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": "true"}]}]}})
    too_long = error_reply(400, "prompt is too long: 1050000 tokens > 1000000 maximum")
    real_claude.api.script(["ready", too_long, "continuing from the note"])
    t = tmux([sys.executable, CC_LHC, "--settings", settings], cols=110, rows=32, env=real_claude.env,
             cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("ready")
    wait_until(lambda: thread_turns(real_claude)[1] == "", "the hook's report of the first turn")
    type_line(t, "now read every pdf")
    wait_for_log(real_claude, "too_long_continued")
    t.wait_for("continuing from the note")
    exit_cleanly(t)


def test_at_exit_the_way_back_through_cc_lhc_follows_claudes_own_resume_line(real_claude, tmux):
    """Claude's last words name `claude --resume <session>`: a person who follows them goes on
    without cc-lhc. cc-lhc's way back follows them, naming the same session; a session in
    which nothing was typed has nothing to go back to, and gets none."""
    rc = real_claude
    rc.api.script(["first answer"])
    t = tmux([sys.executable, CC_LHC], cols=140, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    type_line(t, "hello")
    t.wait_for("first answer")
    exit_cleanly(t)
    screen = t.capture(history=True)
    (session,) = re.findall(r"claude --resume ([0-9a-f-]{36})", screen)
    assert screen.index(f"claude --resume {session}") < screen.index(
        f"cc-lhc: to go on with this conversation under cc-lhc: cc-lhc --resume {session}"), screen
    t = tmux([sys.executable, CC_LHC], cols=140, rows=32, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    exit_cleanly(t)
    assert "to go on with this conversation" not in t.capture(history=True)


SHOWN_COUNTED = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import pytest

import cc_lhc
built = []
real = cc_lhc.TokenCounter._load
cc_lhc.TokenCounter._load = lambda self: (built.append(1), real(self))[1]
home = cc_lhc.StateHome()
((thread_id, *_),) = cc_lhc.Registry(home).threads()
store = cc_lhc.ThreadStore(home, thread_id)
texts = [cc_lhc.shown_text(m, None) for m in store.messages() if m["kind"] != "api_error"]
counted = cc_lhc.TOKENS.count_many(texts)
print(json.dumps({"texts": texts, "built": bool(built), "exact": cc_lhc.TOKENS.exact}))
"""


def test_an_interactive_session_leaves_what_it_captured_counted_for_the_next_launch(real_claude, tmux):
    # The live host counts what it captures ahead of its seams, and its end waits for
    # that to be done: a later process finds every text a view shows already counted.
    real_claude.api.script(["The counted answer, unique 4711."])
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "count me ahead")
    t.wait_for("unique 4711")
    exit_cleanly(t)
    probe = real_claude.run([sys.executable, "-c", SHOWN_COUNTED, str(Path(CC_LHC).parent)])
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen["exact"] and not seen["built"]
    assert "count me ahead" in seen["texts"] and "The counted answer, unique 4711." in seen["texts"]
    log = (Path(real_claude.env["CC_LHC_HOME"]) / "wrapper.log").read_text()
    assert "count_ahead_failed" not in log and "count_ahead_unfinished" not in log


def test_a_message_typed_while_claude_works_is_captured_in_the_turn_it_joined(real_claude, tmux):
    """Claude Code hands a message sent mid-turn to the model inside the running turn and
    writes it only as a queued_command attachment: it is the person's own words, so the
    thread holds it (export, search, get-messages), in that turn."""
    import threading
    from fakeapi import tool_use_reply
    hold = threading.Event()
    real_claude.api.script([dict(tool_use_reply("Bash", {"command": "echo ran"}), hold=hold),
                            "answered both", "later"])
    t = tmux([sys.executable, CC_LHC, "--allowedTools", "Bash"], cols=100, rows=30,
             env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    message_mid_turn(real_claude, t, hold)
    second = real_claude.api.message_requests[1]
    assert "QUEUED-WORDS" in json.dumps(second["body"]["messages"])  # the model had it in this turn
    exit_cleanly(t)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    export = json.loads(real_claude.run([sys.executable, CC_LHC, "export", thread_id]).stdout)
    queued = [m for m in export if "QUEUED-WORDS" in (m.get("text") or "")]
    assert [(m["role"], m["kind"], m["text"]) for m in queued] == [
        ("user", "user_text", "QUEUED-WORDS also check the date")]
    assert [m["turn"] for m in export if m.get("text") == "run the thing"] == [queued[0]["turn"]]
    found = real_claude.run([sys.executable, CC_LHC, "search", "--thread", thread_id, "check the date"])
    assert found.returncode == 0 and queued[0]["label"] in found.stdout


def test_a_message_typed_mid_turn_is_in_the_rebuilt_session_a_swap_resumes(real_claude, tmux):
    """The swap's rebuilt session holds the message sent mid-turn as a user record of its
    turn, and the replacement Claude resumes it and sends it on."""
    import threading
    from fakeapi import text_reply, tool_use_reply
    hold = threading.Event()
    real_claude.api.script([dict(tool_use_reply("Bash", {"command": "echo ran"}), hold=hold),
                            text_reply("answered both", usage=OVER_USAGE), "after the swap"])
    t = tmux([sys.executable, CC_LHC, "--allowedTools", "Bash"], cols=100, rows=30,
             env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    message_mid_turn(real_claude, t, hold)
    wait_for_log(real_claude, "handoff_switched", timeout=60)
    t.wait_for(PROMPT)
    type_line(t, "next one")
    t.wait_for("after the swap")
    last = real_claude.api.message_requests[-1]
    sent = json.dumps(last["body"]["messages"])
    assert last["session_id"] != real_claude.api.message_requests[0]["session_id"]  # the replacement
    assert "QUEUED-WORDS also check the date" in sent and "run the thing" in sent
    exit_cleanly(t)


def _install_plugin(rc, name, hooks):
    """Install a plugin the way a person does, from a marketplace folder, with the real CLI."""
    market = rc.iso.root / "market"
    plugin = market / "plugins" / name
    (market / ".claude-plugin").mkdir(parents=True)
    (plugin / ".claude-plugin").mkdir(parents=True)
    (plugin / "hooks").mkdir()
    (market / ".claude-plugin" / "marketplace.json").write_text(json.dumps(
        {"name": "localmarket", "owner": {"name": "tests"},
         "plugins": [{"name": name, "source": f"./plugins/{name}", "description": "test"}]}))
    (plugin / ".claude-plugin" / "plugin.json").write_text(json.dumps(
        {"name": name, "version": "1.0.0", "description": "test"}))
    (plugin / "hooks" / "hooks.json").write_text(json.dumps({"hooks": hooks}))
    for args in (["plugin", "marketplace", "add", str(market)], ["plugin", "install", f"{name}@localmarket"]):
        p = rc.run_claude(*args)
        assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("how", ["after-a-report", "first-turn", "installed-plugin"])
def test_a_swap_waits_until_the_stop_hooks_have_run(real_claude, tmux, how):
    """A Stop hook runs after Claude's final answer and may send it back to work: once the
    thread knows it runs one (its settings or an installed plugin name one, or it wrote
    stop_hook_summary), a seam over the trigger is taken only after the hooks reported, so a
    swap never ends Claude while a hook runs; also on the thread's very first turn."""
    import datetime
    import os
    from fakeapi import text_reply
    from realcli import wait_until
    rc = real_claude
    runs, done = rc.iso.root / "hook-runs", rc.iso.root / "hook-done"
    hook = rc.iso.root / "stop-hook.sh"
    first = how != "after-a-report"
    slow_run = 1 if first else 2
    hook.write_text(f"#!/bin/sh\necho run >> {runs}\n"
                    f"if [ \"$(wc -l < {runs})\" -eq {slow_run} ]; then sleep 2; touch {done}; fi\nexit 0\n")
    hook.chmod(0o755)
    stop = {"Stop": [{"hooks": [{"type": "command", "command": str(hook)}]}]}
    if how == "installed-plugin":
        _install_plugin(rc, "stopper", stop)
        args = []
    else:
        settings = rc.iso.root / "hook-settings.json"
        settings.write_text(json.dumps({"hooks": stop}))
        args = ["--settings", str(settings)]
    rc.api.script(([] if first else ["first answer"])
                  + [text_reply("a very long answer", usage=OVER_USAGE), "after the swap"])
    t = tmux([sys.executable, CC_LHC, *args], cols=100, rows=30, env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT)
    if not first:
        type_line(t, "one")
        t.wait_for("first answer")
        [path] = rc.transcripts()
        wait_until(lambda: "stop_hook_summary" in path.read_text(), "the hooks' first report")
    type_line(t, "go long")
    t.wait_for("a very long answer")
    wait_for_log(rc, "handoff_spawned")
    when = datetime.datetime.fromisoformat(log_events(rc, "handoff_spawned")[0]["ts"].replace("Z", "+00:00"))
    assert done.exists(), "the swap began while the Stop hook still ran"
    assert when.timestamp() >= os.stat(done).st_mtime - 0.05
    wait_for_log(rc, "handoff_switched")
    t.wait_for(PROMPT)
    type_line(t, "next one")
    t.wait_for("after the swap")
    exit_cleanly(t)


@pytest.mark.parametrize("erase", ["C-w", "M-BSpace"])
def test_a_draft_erased_word_by_word_does_not_hold_smart_compact_back(real_claude, tmux, erase):
    """Words typed into Claude's box while it works, then erased with ctrl-w or
    alt-backspace, leave the box empty: the seam over the trigger swaps as usual."""
    import threading
    from fakeapi import text_reply
    rc = real_claude
    hold = threading.Event()
    rc.api.script([dict(text_reply("LONG-ANSWER", usage=OVER_USAGE), hold=hold)])
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=110, rows=32, env=rc.env,
             cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    type_line(t, "go long")
    rc.api.wait_for_requests(1, answered=False)
    t.send_text("draft words")
    t.wait_for("draft words")
    t.send_keys(erase)
    t.wait_for(re.compile(r"^❯\s+draft\s*$", re.M))  # (the box begins with a no-break space)
    t.send_keys(erase)
    t.wait_for(re.compile(r"^❯\s*$", re.M))
    hold.set()
    t.wait_for("LONG-ANSWER", timeout=30)
    wait_for_log(rc, "handoff_switched", timeout=30)
    assert not log_events(rc, "handoff_waits_for_person")
    exit_cleanly(t)


def test_a_prompt_piped_into_an_interactive_launch_is_answered_and_the_keyboard_still_works(real_claude, tmux):
    """`echo words | cc-lhc` in a terminal: Claude takes the piped words as its prompt and
    goes on reading the keyboard, as plain `claude` does there; the session is captured."""
    rc = real_claude
    rc.api.script(["answered the piped prompt", "answered from the keyboard"])
    t = tmux(f"echo 'the piped prompt' | {sys.executable} {CC_LHC}; echo EXIT=$?", cols=100, rows=30,
             env=rc.env, cwd=rc.cwd)
    t.wait_for("answered the piped prompt", timeout=30)
    t.wait_for(PROMPT)
    type_line(t, "typed at the keyboard")
    t.wait_for("answered from the keyboard", timeout=30)
    type_line(t, "/exit")
    screen = t.wait_for("EXIT=", timeout=30)
    assert "EXIT=0" in screen, screen
    (thread,) = json.loads(rc.run([sys.executable, CC_LHC, "threads", "--json"]).stdout)
    record = json.loads(rc.run([sys.executable, CC_LHC, "export", thread["id"]]).stdout)
    texts = [m["text"] for m in record if m["kind"] in ("user_text", "assistant_text")]
    assert texts == ["the piped prompt\n", "answered the piped prompt", "typed at the keyboard",
                     "answered from the keyboard"]


def test_a_terminal_closed_under_a_shell_that_ignores_sighup_ends_the_session(real_claude, tmux, tmp_path):
    """The shell cc-lhc runs under ignores SIGHUP (trap : HUP), so none reaches cc-lhc when
    the terminal closes; plain claude sees its terminal gone and exits. cc-lhc ran on with
    its Claude for good, and the thread stayed held: `cc-lhc -c` was refused."""
    import shlex
    from fakeapi import text_reply
    rc = real_claude
    rc.api.responder = lambda body: text_reply("answered")
    status = tmp_path / "status"
    t = tmux(f"trap : HUP; {shlex.quote(sys.executable)} {shlex.quote(CC_LHC)}; echo $? > {shlex.quote(str(status))}",
             env=rc.env, cwd=rc.cwd)
    t.wait_for(PROMPT, timeout=60)
    type_line(t, "hello")
    t.wait_for("answered")
    (child,) = log_events(rc, "child_started")
    t._tmux("kill-server", check=False)  # the terminal is gone
    try:
        wait_until(lambda: status.exists() and status.read_text().strip(), "cc-lhc to end", 30)
        wait_until(lambda: log_events(rc, "child_exited"), "its Claude to end", 10)
        rc.api.script([text_reply("again")])
        p = rc.run_lhc("-c", "-p", "once more")
        assert p.returncode == 0 and "again" in p.stdout, p.stderr
    finally:
        try:
            os.kill(child["child_pid"], 9)
        except ProcessLookupError:
            pass
