"""Helpers shared by the tests that drive cc-lhc and the real Claude Code CLI in tmux.

Plain functions over the fixtures' objects (``rc``: conftest's RealClaude, ``t``: a
tmuxdrive.Tmux), so every real-CLI test reads, waits and types the same way:

- ``type_line(t, text)``, ``exit_cleanly(t)``: what a person does at the keyboard.
- ``log_events(rc, event)``, ``wait_for_log(rc, event, count, timeout)``: cc-lhc's own
  account of a session, in $CC_LHC_HOME/wrapper.log.
- ``wait_until(check, what, timeout)``: poll any condition, failing with what did not happen.
- ``running(needle)``: the processes of a command still running.
- ``requests_holding(rc, text)``, ``new_input(request)``: what reached the fake API.
- ``thread_turns(rc)``: the turns of the one thread cc-lhc captured, and whether its seam settled.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

CC_LHC = str(Path(__file__).resolve().parents[1] / "cc_lhc.py")
PROMPT = re.compile(r"^❯", re.M)  # Claude's input line: it is idle and takes typing
# A provider-reported context just over the default trigger (360,000): the next settled
# seam swaps.
OVER_USAGE = {"input_tokens": 365_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
              "output_tokens": 5}
POLL = 0.05


def type_line(t, text: str) -> None:
    """Type a line into the pane and press Enter, as a person would."""
    t.send_text(text)
    t.send_keys("Enter")


def exit_cleanly(t) -> None:
    """/exit ends Claude, cc-lhc exits 0, and the terminal is as it was before."""
    type_line(t, "/exit")
    assert t.wait_exit() == 0
    assert t.stty_before == t.stty_after


def log_events(rc, event: str) -> list[dict]:
    """Every wrapper.log line of ``event``, oldest first ([] before cc-lhc wrote any)."""
    log = Path(rc.env["CC_LHC_HOME"]) / "wrapper.log"
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if f'"event": "{event}"' in line]


def wait_for_log(rc, event: str, count: int = 1, timeout: float = 30) -> None:
    """Until wrapper.log holds ``count`` lines of ``event``."""
    log = Path(rc.env["CC_LHC_HOME"]) / "wrapper.log"
    deadline = time.monotonic() + timeout
    while True:
        seen = log.read_text().count(f'"event": "{event}"') if log.exists() else 0
        if seen >= count:
            return
        assert time.monotonic() < deadline, (f"no {event!r} in wrapper.log after {timeout}s; "
                                             f"it holds:\n{log_story(log)}")
        time.sleep(POLL)


def log_story(log: Path, last: int = 40) -> str:
    """wrapper.log's newest events, one short line each, for a failure's message."""
    try:
        lines = log.read_text().splitlines()[-last:]
    except OSError as e:
        return f"(unreadable: {e})"
    return "\n".join(line[:300] for line in lines) or "(empty)"


def wait_until(check, what: str, timeout: float = 30):
    """Poll ``check()`` until it returns something true, and return that."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout}s"
        time.sleep(POLL)


def running(needle: str) -> list[int]:
    """Pids of this test's live processes whose command line holds ``needle``.

    This test's: run with the CC_LHC_HOME the fixtures gave it (every child of cc-lhc and
    of Claude inherits it), so the same command run by a test beside it under xdist is
    not counted. A zombie has ended (only its parent has not reaped it yet), so it is not
    counted either; nor is a process whose parent matches too: a shell forks before each
    command it runs, and until the fork has exec'd, the child still shows the shell's
    own command line, which is the same job, not a second copy of it.
    """
    ours = f"\0CC_LHC_HOME={os.environ['CC_LHC_HOME']}\0".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            if needle not in cmd or ours not in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                continue
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(pid)] = int(fields[1])
    return sorted(pid for pid, parent in found.items() if parent not in found)


def end_all_of_this_test(settle: float = 2.0) -> None:
    """SIGKILL every process left running with this test's CC_LHC_HOME (not this one), as
    long as new ones appear for ``settle`` seconds: Claude's background daemon starts
    processes of its own (a pty host, spares) after the session it was given, under no
    process of the test's, which outlived the test run after run."""
    import signal
    import time
    ours = f"\0CC_LHC_HOME={os.environ['CC_LHC_HOME']}\0".encode()
    quiet_until, give_up = time.monotonic() + settle, time.monotonic() + 5 * settle
    while time.monotonic() < min(quiet_until, give_up):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if int(pid) == os.getpid():
                continue
            try:
                if ours not in b"\0" + Path(f"/proc/{pid}/environ").read_bytes():
                    continue
                os.kill(int(pid), signal.SIGKILL)
                quiet_until = time.monotonic() + settle
            except OSError:
                continue
        time.sleep(0.1)


def requests_holding(rc, text: str) -> list[dict]:
    """The API requests whose messages hold ``text`` anywhere (history included)."""
    return [r for r in rc.api.message_requests if text in json.dumps(r["body"]["messages"])]


def new_input(request: dict) -> str:
    """What a request brings after the model's last answer: the prompt it was sent for.

    Not ``messages[-1]``: the real CLI sometimes appends a system-role message after the
    last user message (a list of deferred tools that became available).
    """
    messages = request["body"]["messages"]
    answers = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    return json.dumps(messages[answers[-1] + 1 if answers else 0:])


def thread_turns(rc) -> tuple[list[tuple], str]:
    """(kind, status, stop_reason) of each turn of the one thread cc-lhc captured, and why
    its seam is unsettled ('': it is settled)."""
    import cc_lhc
    home = cc_lhc.StateHome(rc.env["CC_LHC_HOME"])
    ((thread_id, *_),) = cc_lhc.Registry(home).threads()
    store = cc_lhc.ThreadStore(home, thread_id)
    try:
        return (store.db.execute("SELECT kind, status, stop_reason FROM turns ORDER BY n").fetchall(),
                cc_lhc.unsettled_reason(store))
    finally:
        store.close()


QUEUED = "QUEUED-WORDS also check the date"


def message_mid_turn(rc, t, hold) -> None:
    """A prompt whose tool call the fake API holds, then a message typed while Claude works
    (Claude writes it as a queued_command attachment), then the turn on to the answer the
    script gives as "answered both"."""
    type_line(t, "run the thing")
    rc.api.wait_for_requests(1, answered=False)
    type_line(t, QUEUED)
    t.wait_for("QUEUED-WORDS")
    hold.set()
    t.wait_for("answered both")
