"""The private state home: where it is, who may read it, and its append-only log."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import cc_lhc
from conftest import CC_LHC, REAL_HOME

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX modes")


def launch(fake, *args, env=None, umask=None):
    def preexec():
        if umask is not None:
            os.umask(umask)
    return subprocess.run([sys.executable, str(CC_LHC), *args], env={**fake.env, **(env or {})},
                          cwd=fake.cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                          timeout=30, preexec_fn=preexec)


def tree_modes(root: Path) -> dict[str, int]:
    modes = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        modes[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return modes


def log_lines(home: Path) -> list[dict]:
    return [json.loads(line) for line in (home / "wrapper.log").read_text().splitlines()]


def snapshot(path: Path):
    """Names, sizes and mtimes under path (None when it does not exist)."""
    if not path.exists():
        return None
    out = {}
    for p in [path, *path.rglob("*")]:
        try:
            st = p.lstat()
        except OSError:
            continue
        out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_state_home_created_private_on_first_use(fake_claude, iso_env, umask):
    home = iso_env.root / "fresh" / "state"
    assert not home.exists()
    p = launch(fake_claude, "-p", "hi", env={"CC_LHC_HOME": str(home)}, umask=umask)
    assert p.returncode == 0, p.stderr
    modes = tree_modes(home)
    for name in ("wrapper.log", "registry.sqlite"):
        assert name in modes, f"{name} missing from the state home: {sorted(modes)}"
    loose = {name: oct(mode) for name, mode in modes.items()
             if mode != (0o700 if (home / name).is_dir() else 0o600)}
    assert not loose, f"state home entries not private (dirs 0700, files 0600): {loose}"


def test_state_home_with_interactive_launch_is_private(fake_claude, iso_env):
    home = iso_env.root / "state-interactive"
    p = launch(fake_claude, env={"CC_LHC_HOME": str(home)}, umask=0o022)
    assert p.returncode == 0, p.stderr
    loose = {n: oct(m) for n, m in tree_modes(home).items()
             if m != (0o700 if (home / n).is_dir() else 0o600)}
    assert not loose


def test_wrapper_log_gets_one_json_line_per_launch(fake_claude, iso_env):
    sessions = []
    for args in (["-p", "one"], ["-p", "two"], []):
        assert launch(fake_claude, *args).returncode == 0
        sessions.append(fake_claude.launches()[-1]["argv"][1])
    lines = log_lines(iso_env.lhc)  # every line is one JSON object
    launches = [e for e in lines if e["event"] == "launch"]
    assert [e["session"] for e in launches] == sessions
    # (no terminal here: without -p too, Claude runs as a plain child, as claude alone would)
    assert [e["mode"] for e in launches] == ["oneshot", "oneshot", "oneshot"]
    for e in launches:
        assert e["version"] == cc_lhc.VERSION and e["cwd"] == str(iso_env.work)
        assert e["ts"].endswith("Z") and isinstance(e["pid"], int)
    exits = [e for e in lines if e["event"] == "child_exited"]
    assert [e["status"] for e in exits] == [0, 0, 0]


def test_wrapper_log_is_append_only(fake_claude, iso_env):
    assert launch(fake_claude, "-p", "one").returncode == 0
    before = (iso_env.lhc / "wrapper.log").read_bytes()
    fake_claude.script({"exit": 5})
    assert launch(fake_claude, "-p", "two").returncode == 5
    after = (iso_env.lhc / "wrapper.log").read_bytes()
    assert after.startswith(before) and len(after) > len(before)
    assert [e["status"] for e in log_lines(iso_env.lhc) if e["event"] == "child_exited"] == [0, 5]


def test_cc_lhc_home_override_is_the_only_place_written(fake_claude, iso_env):
    chosen = iso_env.root / "elsewhere"
    assert launch(fake_claude, "-p", "hi", env={"CC_LHC_HOME": str(chosen)}).returncode == 0
    assert (chosen / "wrapper.log").exists()
    assert not (iso_env.home / ".cc-lhc").exists()
    assert list(iso_env.lhc.iterdir()) == []  # the fixture's CC_LHC_HOME was not used either


def test_default_state_home_is_dot_cc_lhc_in_home(fake_claude, iso_env):
    env = {k: v for k, v in fake_claude.env.items() if k != "CC_LHC_HOME"}
    p = subprocess.run([sys.executable, str(CC_LHC), "-p", "hi"], env=env, cwd=fake_claude.cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert p.returncode == 0, p.stderr
    default = iso_env.home / ".cc-lhc"
    assert (default / "wrapper.log").exists()
    assert stat.S_IMODE(default.stat().st_mode) == 0o700


def test_state_home_class_honours_override_and_creates_private_folders(iso_env, monkeypatch):
    target = iso_env.root / "in-process"
    monkeypatch.setenv("CC_LHC_HOME", str(target))
    home = cc_lhc.StateHome()
    assert home.root == str(target)
    sub = home.ensure("threads")
    assert stat.S_IMODE(os.stat(sub).st_mode) == 0o700
    assert stat.S_IMODE(target.stat().st_mode) == 0o700
    home.log("test_event", detail="x")
    assert stat.S_IMODE((target / "wrapper.log").stat().st_mode) == 0o600
    assert log_lines(target)[-1]["event"] == "test_event"


def test_unwritable_state_home_never_breaks_logging(iso_env, tmp_path):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")
    home = cc_lhc.StateHome(str(blocker / "state"))
    home.log("anything")  # must not raise: logging never breaks a session


def test_nothing_is_written_to_the_real_home(fake_claude, iso_env):
    watched = [REAL_HOME / ".cc-lhc", REAL_HOME / ".config" / "cc-lhc", REAL_HOME / ".claude"]
    if REAL_HOME.resolve() == iso_env.home.resolve():
        pytest.skip("HOME is not isolated from the real one")
    before = [snapshot(p) for p in watched]
    bad = iso_env.root / "cfg"
    (bad / "cc-lhc").mkdir(parents=True)
    (bad / "cc-lhc" / "config.json").write_text("{bad")
    assert launch(fake_claude, "-p", "hi").returncode == 0
    assert launch(fake_claude).returncode == 0
    assert launch(fake_claude, "-p", "hi", env={"XDG_CONFIG_HOME": str(bad)}).returncode == 0
    assert launch(fake_claude, "threads").returncode == 0
    env = {k: v for k, v in fake_claude.env.items()
           if k not in ("CC_LHC_HOME", "XDG_CONFIG_HOME", "CLAUDE_CONFIG_DIR")}
    p = subprocess.run([sys.executable, str(CC_LHC), "-p", "hi"], env=env, cwd=fake_claude.cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert p.returncode == 0, p.stderr
    assert [snapshot(p) for p in watched] == before
    # and the defaults landed in the isolated home instead
    assert (iso_env.home / ".cc-lhc" / "wrapper.log").exists()
    # the child saw the isolated locations, never the real ones
    for launch_ in fake_claude.launches():
        assert launch_["env"]["HOME"] == str(iso_env.home)


def test_a_full_wrapper_log_is_moved_aside_once_and_logging_goes_on(tmp_path, monkeypatch):
    home = cc_lhc.StateHome(str(tmp_path / "home"))
    monkeypatch.setattr(cc_lhc.StateHome, "LOG_ROTATE_BYTES", 300)
    for i in range(8):
        home.log("event", n=i, pad="x" * 40)
    log, older = Path(home.path("wrapper.log")), Path(home.path("wrapper.log.1"))
    kept = [json.loads(line)["n"] for path in (older, log) if path.exists()
            for line in path.read_text().splitlines()]
    assert older.exists() and older.stat().st_size > 300 and log.stat().st_size <= 300 + 120
    assert kept == list(range(8))[-len(kept):] and kept[-1] == 7  # in order, newest last
    assert stat.S_IMODE(log.stat().st_mode) == stat.S_IMODE(older.stat().st_mode) == 0o600


def test_a_log_another_writer_moved_aside_meanwhile_is_not_moved_again(tmp_path):
    """Two writers both saw the log full: the first moved it and started a new one; the
    second, holding the old file open, must not move that new one over the full one."""
    path = tmp_path / "wrapper.log"
    path.write_bytes(b"x" * 1000)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.replace(path, str(path) + ".1")  # the first writer's move
        path.write_bytes(b"new\n")          # and its next line, in a new file
        cc_lhc.StateHome._rotate_log(fd, str(path))
    finally:
        os.close(fd)
    assert path.read_bytes() == b"new\n" and Path(str(path) + ".1").read_bytes() == b"x" * 1000


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="/proc start times")
def test_a_claude_pid_file_left_by_an_earlier_process_of_the_same_pid_is_not_believed(iso_env):
    """Claude keeps sessions/<pid>.json while it runs and leaves it behind when killed; a
    later process can get the same pid. The file names its writer's start time (procStart),
    so one written by another process is no word on which session this one is on."""
    pid, sid = os.getpid(), "11111111-2222-4333-8444-555555555555"
    folder = iso_env.config / "sessions"
    folder.mkdir(parents=True, exist_ok=True)
    mine = str(cc_lhc.process_start_time(pid))

    def says(**body):
        (folder / f"{pid}.json").write_text(json.dumps({"pid": pid, "sessionId": sid, **body}))
        return cc_lhc.claude_session_of(pid)
    assert says(procStart=mine) == sid
    assert says() == sid                                  # (older versions wrote no start)
    assert says(procStart=str(int(mine) - 1)) is None     # another process of this pid wrote it
    assert says(procStart="Mon Dec  7 03:00:00 2026") == sid  # (macOS's `ps` start: not compared)
