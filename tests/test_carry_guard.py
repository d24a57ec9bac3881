"""The carry guard (cc_lhc.CarryGuard, run_carry_guard): the process that stops carried
background work when cc-lhc itself is killed, with plain `sleep` processes as the jobs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import cc_lhc

pytestmark = pytest.mark.skipif(os.name != "posix", reason="the guard is POSIX only")


@pytest.fixture
def home(tmp_path):
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    return home


@pytest.fixture
def sleeps():
    """Start `sleep` jobs, each in a group of its own as Claude starts them; all reaped after."""
    started = []

    def start(command="sleep 300"):
        p = subprocess.Popen(["/bin/sh", "-c", command], start_new_session=True)
        started.append(p)
        return p
    yield start
    for p in started:
        try:
            os.killpg(p.pid, 9)  # the whole group: a pipeline may outlive its shell
        except OSError:
            pass
        p.wait()


def wait_for(check, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "did not happen in time"
        time.sleep(0.02)
    return check()


def job(pid, key="toolu_1", kind="shell", output="/tmp/x.output", start=None):
    item = SimpleNamespace(tool_use_id=key, kind=kind, task_id=f"b{key[-1]}", label=f"Bash {key}",
                           command="sleep 300")
    carried = cc_lhc.CarriedJob(item, [pid], output=output)
    if start is not None:
        carried.starts[pid] = start
    return carried


def kept(home, thread="thread-1") -> list:
    """What the next launch of the thread will be told (undelivered.json and guards' files)."""
    return cc_lhc.kept_notes(home, thread)[0]


def events(home, event) -> list:
    log = Path(home.root) / "wrapper.log"
    return [json.loads(line) for line in log.read_text().splitlines() if f'"event": "{event}"' in line]


def wrapper_dies(guard) -> int:
    """What the guard sees when cc-lhc is SIGKILLed: its pipe ends without the clean "end"."""
    process = guard.process
    process.stdin.close()
    return process.wait(timeout=30)


def exited(p) -> bool:
    return p.wait(timeout=10) is not None


def test_it_starts_only_with_the_first_carried_process_on_a_pipe_no_child_inherits(home, sleeps):
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([])
    assert guard.process is None  # nothing carried, nothing started
    p = sleeps()
    guard.sync([job(p.pid)])
    assert guard.process is not None
    assert not os.get_inheritable(guard.process.stdin.fileno())
    assert os.getsid(guard.process.pid) == guard.process.pid  # its own session: no SIGHUP
    guard.end()


def test_when_the_wrapper_dies_the_guard_stops_its_jobs_and_keeps_a_note(home, sleeps):
    path = Path(cc_lhc.kept_notes_path(home, "thread-1"))
    path.write_text(json.dumps(["[runtime note] an earlier note"]))
    a, b = sleeps(), sleeps()
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([job(a.pid, "toolu_1", output="/tmp/a.output"), job(b.pid, "toolu_2")])
    assert wrapper_dies(guard) == 0
    assert exited(a) and exited(b)
    stopped = events(home, "carried_job_stopped_by_guard")
    assert sorted(e["pids"][0] for e in stopped) == sorted([a.pid, b.pid])
    notes = kept(home)
    assert notes[0] == "[runtime note] an earlier note"  # merged, not replaced
    assert len(notes) == 3 and all("was stopped when the previous cc-lhc session ended" in n
                                   for n in notes[1:])
    assert "/tmp/a.output" in notes[1]
    # the next launch of the thread reads them as BackgroundCarry always has
    session = SimpleNamespace(home=home, capture=SimpleNamespace(thread_id="thread-1"))
    assert list(cc_lhc.BackgroundCarry(session).notes) == notes


def test_each_jobs_note_goes_to_the_thread_whose_swap_carried_it(home, sleeps):
    """A session launched on one thread that moved (/clear) and carried a job in the next:
    the guard's note goes to the thread that carried it, as a clean end's would (it went to
    the thread the session was launched on, whose Claude never knew of the job)."""
    later = "22222222-3333-4444-8555-666666666666"
    a, b = sleeps(), sleeps()
    first, second = job(a.pid, "toolu_1"), job(b.pid, "toolu_2")
    second.thread = later
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([first, second])
    assert wrapper_dies(guard) == 0
    assert exited(a) and exited(b)
    assert len(kept(home)) == 1 and "toolu_1" not in kept(home, later)[0]
    [note] = kept(home, later)
    assert "was stopped when the previous cc-lhc session ended" in note


def test_a_clean_end_leaves_everything_as_it_is(home, sleeps):
    p = sleeps()
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([job(p.pid)])
    process = guard.process
    guard.end()
    assert process.returncode == 0
    assert p.poll() is None and kept(home) == []
    assert not events(home, "carried_job_stopped_by_guard")


def test_a_job_the_wrapper_said_was_done_is_not_touched(home, sleeps):
    p, q = sleeps(), sleeps()
    guard = cc_lhc.CarryGuard(home, "thread-1")
    done, other = job(p.pid, "toolu_1"), job(q.pid, "toolu_2")
    guard.sync([done, other])
    done.finished = True
    guard.sync([done, other])
    wrapper_dies(guard)
    assert p.poll() is None and exited(q)
    assert len(kept(home)) == 1 and "b2" in kept(home)[0]


def test_a_process_with_another_start_time_is_never_signalled(home, sleeps):
    """The same pid with another start time is another process (the pid was reused)."""
    p = sleeps()
    real = cc_lhc.process_start_time(p.pid)
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([job(p.pid, start=real + 1)])
    wrapper_dies(guard)
    assert p.poll() is None
    (logged,) = events(home, "carried_job_stopped_by_guard")
    assert logged["pids"] == []


def test_a_job_whose_start_time_is_unknown_is_not_guarded(home, sleeps):
    p = sleeps()
    carried = job(p.pid)
    carried.starts[p.pid] = None
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([carried])
    assert guard.process is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads process groups from /proc")
def test_what_a_monitor_leaves_in_its_group_when_its_shell_died_first_is_stopped(home, sleeps):
    """A relaunched monitor's shell dies with the wrapper (its death link); the pipeline it
    ran is left in its group, and the guard stops that group."""
    monitor = sleeps("sleep 300 | cat")
    guard = cc_lhc.CarryGuard(home, "thread-1")
    guard.sync([job(monitor.pid, kind="monitor")])
    members = wait_for(lambda: len(_group(monitor.pid)) == 3)
    os.kill(monitor.pid, 9)
    monitor.wait()
    assert _group(monitor.pid), "the pipeline outlives its shell"
    wrapper_dies(guard)
    assert not _group(monitor.pid)
    assert members and "was stopped when the previous cc-lhc session ended" in kept(home)[0]


def _group(group: int) -> list:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(pid))
    return found


def test_the_guard_runs_from_this_program_without_the_tokenizer_or_a_thread_store(home):
    code = ("import sys; sys.path[0] = sys.argv.pop(1); import cc_lhc; "
            "rc = cc_lhc.main(['__carry-guard', sys.argv[1], 'thread-1']); "
            "print(rc, sorted(m for m in ('tiktoken', 'sqlite3') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(Path(cc_lhc.__file__).parent), home.root],
                         input=b"", capture_output=True, timeout=60)
    assert out.stdout.decode().split() == ["0", "[]"], out.stderr
