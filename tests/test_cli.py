"""The command line as a user meets it: cc-lhc's own flags, what reaches Claude unchanged,
session selectors, one-shot detection, exit statuses and a clean stdout.

Claude is played by tests/fake_claude.py (CC_LHC_CLAUDE_BIN), which records the argv and
environment it was started with, so every test can see exactly what the wrapper launched.
"""

from __future__ import annotations

import json
import uuid
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

import cc_lhc
from conftest import CC_LHC, FAKE_CLAUDE, REPO
from test_registry_rebuild import transcript_steps

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
SID_A = "11111111-2222-4333-8444-555555555555"
SID_B = "66666666-7777-4888-9999-000000000000"


# -- helpers ------------------------------------------------------------------------------

def lhc(fake, *args, script=None, env=None, cwd=None, input=None, timeout=30):
    """Run `python3 cc_lhc.py args...` with fake_claude as Claude; output as bytes."""
    full_env = {**fake.env, **(env or {})}
    if script is not None:
        full_env["FAKE_CLAUDE_SCRIPT"] = json.dumps(script)
    return subprocess.run([sys.executable, str(CC_LHC), *args], env=full_env,
                          cwd=cwd or fake.cwd, input=input, capture_output=True, timeout=timeout,
                          stdin=None if input is not None else subprocess.DEVNULL)


def err(p) -> str:
    return p.stderr.decode("utf-8", "replace")


def out(p) -> str:
    return p.stdout.decode("utf-8", "replace")


def only_launch(fake) -> dict:
    launches = fake.launches()
    assert len(launches) == 1, f"expected one Claude launch, got {len(launches)}"
    return launches[0]


def log_events(iso_env, event=None) -> list[dict]:
    path = iso_env.lhc / "wrapper.log"
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [r for r in rows if event is None or r["event"] == event]


def burst_bytes(n: int) -> bytes:
    """What fake_claude's {"burst": n} step writes."""
    data, i = bytearray(), 0
    while len(data) < n:
        data += b"burst line %08d ..........................................\n" % i
        i += 1
    return bytes(data[:n])


def env_vars_read_by_source() -> set[str]:
    """Every environment variable cc_lhc.py reads, found by reading its source."""
    text = CC_LHC.read_text()
    patterns = (
        r"os\.environ\.get\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']",
        r"os\.getenv\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']",
        r"os\.environ\[\s*[\"']([A-Z][A-Z0-9_]*)[\"']\s*\](?!\s*=[^=])",
        r"\benv(?:iron)?\.get\(\s*[\"']([A-Z][A-Z0-9_]*)[\"']",
        r"[\"'](CC_LHC_[A-Z0-9_]+)[\"']",  # a name kept in a constant is read somewhere too
    )
    names = set()
    for pattern in patterns:
        names.update(re.findall(pattern, text))
    return names


# -- cc-lhc's own flags -------------------------------------------------------------------

def test_lhc_version_names_version_and_git_identity(fake_claude):
    p = lhc(fake_claude, "--lhc-version")
    assert p.returncode == 0, err(p)
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    line = out(p).strip()
    assert cc_lhc.VERSION in line
    assert head[:12] in line
    assert ("modified" if dirty else "clean") in line
    assert fake_claude.launches() == []  # never launches Claude
    assert err(p) == ""


def _git(repo, *args):
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                    *args], check=True, capture_output=True)


def test_lhc_version_tells_clean_from_modified_and_unknown(tmp_path, fake_claude):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "checkout"
    repo.mkdir()
    shutil.copy(CC_LHC, repo / "cc_lhc.py")
    _git(repo, "init", "-q")
    _git(repo, "add", "cc_lhc.py")
    _git(repo, "commit", "-q", "-m", "x")
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()

    def version(path):
        p = subprocess.run([sys.executable, str(path), "--lhc-version"], env=fake_claude.env,
                           cwd=tmp_path, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip()

    clean = version(repo / "cc_lhc.py")
    assert commit[:12] in clean and "clean" in clean and "modified" not in clean
    with open(repo / "cc_lhc.py", "a") as f:
        f.write("\n# a local edit\n")
    modified = version(repo / "cc_lhc.py")
    assert commit[:12] in modified and "modified" in modified
    loose = tmp_path / "loose"
    loose.mkdir()
    shutil.copy(CC_LHC, loose / "cc_lhc.py")
    unknown = version(loose / "cc_lhc.py")
    assert cc_lhc.VERSION in unknown and "unknown" in unknown
    assert fake_claude.launches() == []


def test_lhc_help_lists_every_flag_and_every_environment_variable(fake_claude):
    p = lhc(fake_claude, "--lhc-help")
    assert p.returncode == 0, err(p)
    text = out(p)
    for flag in cc_lhc.LHC_FLAGS:
        assert flag in text, f"--lhc-help does not list {flag}"
    names = env_vars_read_by_source()
    # The grep itself must keep working, or this test would pass on an empty list.
    assert {"CC_LHC_HOME", "CC_LHC_CLAUDE_BIN", "CLAUDE_CONFIG_DIR", "XDG_CONFIG_HOME"} <= names
    missing = sorted(n for n in names if not re.search(rf"\b{n}\b", text))
    assert not missing, f"--lhc-help does not document environment variables {missing}"
    for field in cc_lhc.BUILTIN_POLICY:
        assert field in text, f"--lhc-help does not name config field {field}"
    assert fake_claude.launches() == []


@pytest.mark.parametrize("argv", [
    ["--lhc-bogus"],
    ["--lhc-bogus=3"],
    ["-p", "hello", "--lhc-bogus"],
    ["--model", "x", "--lhc-bogus", "--", "--lhc-help"],
])
def test_unknown_lhc_flag_exits_2_with_one_line_naming_it(fake_claude, argv):
    p = lhc(fake_claude, *argv)
    assert p.returncode == 2
    lines = err(p).strip().splitlines()
    assert len(lines) == 1 and "--lhc-bogus" in lines[0], err(p)
    assert "Traceback" not in err(p)
    assert p.stdout == b""
    assert fake_claude.launches() == []


@pytest.mark.parametrize("argv, word", [
    (["--lhc-target"], "--lhc-target"),
    (["--lhc-help=yes"], "--lhc-help"),
    (["--lhc-version=1"], "--lhc-version"),
    (["--lhc-target", "1000", "--lhc-target=2000", "-p", "hi"], "--lhc-target is given twice"),
])
def test_malformed_lhc_flag_exits_2_before_spawn(fake_claude, argv, word):
    p = lhc(fake_claude, *argv)
    assert p.returncode == 2
    assert word in err(p) and len(err(p).strip().splitlines()) == 1
    assert fake_claude.launches() == []


@pytest.mark.parametrize("mode", [[], ["-p"]])
def test_lhc_lookalikes_after_double_dash_reach_claude(fake_claude, mode):
    p = lhc(fake_claude, *mode, "--", "--lhc-bogus", "--lhc-help", "--", "x")
    assert p.returncode == 0, err(p)
    argv = only_launch(fake_claude)["argv"]
    assert argv[-4:] == ["--lhc-bogus", "--lhc-help", "--", "x"]
    assert "cc-lhc" not in out(p)  # no help text: the flag was Claude's


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-h"], ["-v"],
                                  ["mcp", "list"], ["--model", "x", "--help"]])
def test_claude_help_version_and_subcommands_reach_claude_unchanged(fake_claude, args):
    p = lhc(fake_claude, *args, script=[{"print": "claude says hi"}])
    assert p.returncode == 0, err(p)
    assert only_launch(fake_claude)["argv"] == args  # no --session-id injected
    assert out(p) == "claude says hi\n"


def test_claudes_own_doctor_is_reached_after_a_double_dash(fake_claude):
    p = lhc(fake_claude, "--", "doctor", script=[{"print": "claude's doctor"}])
    assert p.returncode == 0, err(p)
    assert only_launch(fake_claude)["argv"] == ["doctor"] and out(p) == "claude's doctor\n"


def test_reserved_subcommands_are_never_forwarded(fake_claude):
    for name in cc_lhc.LHC_SUBCOMMANDS:
        args = [name, "write"] if name == "rollout" else [name]
        seen = len(fake_claude.launches())
        p = lhc(fake_claude, *args)
        text = err(p)
        assert "Traceback" not in text, f"{name}: {text}"
        started = fake_claude.launches()[seen:]
        if name not in cc_lhc.COMMANDS:
            assert p.returncode == 2, f"{name}: {p.returncode} {text}"
            assert "not available" in text and name in text, f"{name}: {text}"
            assert len(text.strip().splitlines()) == 1
            assert started == [], f"{name} reached Claude"
        else:
            # An implemented command may consult Claude (doctor asks for its version),
            # but never hands Claude the command or starts a session.
            assert p.returncode in (0, 2), f"{name}: {p.returncode} {text}"
            for launch in started:
                assert name not in launch["argv"] and "--session-id" not in launch["argv"], launch


def test_threads_and_export_work(fake_claude):
    p = lhc(fake_claude, "threads")
    assert (p.returncode, out(p).strip()) == (0, "no threads yet")
    assert lhc(fake_claude, "-p", "hello").returncode == 0
    # the stand-in wrote no transcript: nothing to keep, so no empty thread is left
    assert json.loads(lhc(fake_claude, "threads", "--json").stdout) == []
    assert lhc(fake_claude, "-p", "hello", script=transcript_steps("hello", fake_claude.cwd)).returncode == 0
    session = fake_claude.launches()[-1]["argv"][1]
    p = lhc(fake_claude, "threads", "--json")
    assert p.returncode == 0, err(p)
    threads = json.loads(p.stdout)
    assert [t["current_session"] for t in threads] == [session]
    p = lhc(fake_claude, "export", threads[0]["id"][:8])
    assert p.returncode == 0, err(p)
    assert [m["text"] for m in json.loads(p.stdout)] == ["hello", "answer to hello"]
    assert len(fake_claude.launches()) == 2


def test_double_dash_sends_a_reserved_word_to_claude(fake_claude):
    p = lhc(fake_claude, "-p", "--", "doctor")
    assert p.returncode == 0, err(p)
    # After a Claude argument the `--` is Claude's: `doctor` is the prompt, not its command.
    assert only_launch(fake_claude)["argv"][-3:] == ["-p", "--", "doctor"]


@pytest.mark.parametrize("args", [["-p", "--", "-5 degrees: is that cold?"],
                                  ["-p", "--allowedTools", "Bash", "--", "hello"],
                                  ["--model", "x", "--", "--lhc-target", "hi"]])
def test_a_double_dash_after_claude_arguments_is_claudes(fake_claude, args):
    """`claude -p -- "-5 degrees"` takes the words after `--` as the prompt; so does
    Claude through cc-lhc, which passes that `--` on instead of taking it as its own."""
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    argv = only_launch(fake_claude)["argv"]
    assert argv[-len(args):] == args


@pytest.mark.parametrize("args,expected", [
    # (-c with nothing to continue: a one-shot starts a new session, as claude -p -c does)
    (["-cp", "more"], ["-p", "more"]),
    (["-pc", "more"], ["-p", "more"]),
    (["-pr", SID_A, "more"], ["-p", "-r", SID_A, "more"]),
    ([f"-pr{SID_A}", "more"], ["-p", f"-r{SID_A}", "more"]),
    (["-pn", "name", "more"], ["-p", "-n", "name", "more"]),
    (["-px", "more"], ["-px", "more"]),               # a letter Claude does not know: as written
    (["-p", "--", "-cp"], ["-p", "--", "-cp"]),       # after `--`: words, not options
    (["-p", "-n", "-cv", "more"], ["-p", "-n", "-cv", "more"]),  # an option's value, as Claude reads it
    (["-pn", "-cv", "more"], ["-p", "-n", "-cv", "more"]),
])
def test_a_run_of_one_letter_options_is_read_as_claude_reads_it(fake_claude, args, expected):
    """Claude reads -cp as -c -p (and -pr <id> as -p -r <id>): the selector and the print
    flag in such a run are found (a one-shot, no session id of cc-lhc's added)."""
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    argv = only_launch(fake_claude)["argv"]
    assert argv[-len(expected):] == expected
    options = expected[:expected.index("--")] if "--" in expected else expected
    chooses = any(a == "-c" or a.startswith("-r") for a in options)
    assert ("--session-id" in argv) == (not chooses)  # cc-lhc names a session only for a new one


# -- doctor and a damaged thread file ---------------------------------------------------

def _two_threads_one_damaged(fake_claude, iso_env):
    for prompt in ("one", "two"):
        assert lhc(fake_claude, "-p", prompt, script=transcript_steps(prompt, fake_claude.cwd)).returncode == 0
    good, bad = sorted(p.stem for p in (iso_env.lhc / "threads").glob("*.sqlite"))
    path = iso_env.lhc / "threads" / f"{bad}.sqlite"
    for extra in ("-wal", "-shm"):
        (iso_env.lhc / "threads" / f"{bad}.sqlite{extra}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database, it was overwritten" * 100)
    return good, bad, path


def test_doctor_names_a_damaged_thread_file_says_how_to_fix_it_and_exits_1(fake_claude, iso_env):
    good, bad, path = _two_threads_one_damaged(fake_claude, iso_env)
    p = lhc(fake_claude, "doctor")
    assert p.returncode == 1, out(p)
    lines = out(p).splitlines()
    (named,) = [i for i, line in enumerate(lines) if line.startswith("[fail]") and bad in line]
    assert str(path) in lines[named] and "damaged" in lines[named]
    assert lines[named + 1].strip().startswith("fix: move its files aside")
    assert "[fail] thread files: 2 checked, 1 unusable" in out(p)
    assert good not in out(p)  # the sound thread is not named
    assert "Traceback" not in err(p)


def test_a_thread_whose_record_is_gone_is_named_and_never_made_again_empty(fake_claude, iso_env):
    """A registry entry whose thread file was deleted: doctor fails on it with a fix line;
    --repair, threads and rollout write do not put an empty record in its place (which
    would hide the loss for good)."""
    good, gone, path = _two_threads_one_damaged(fake_claude, iso_env)
    path.unlink()
    p = lhc(fake_claude, "doctor")
    assert p.returncode == 1, out(p)
    lines = out(p).splitlines()
    (named,) = [i for i, line in enumerate(lines) if line.startswith("[fail]") and gone in line]
    assert "is gone" in lines[named] and lines[named + 1].strip().startswith("fix: put the file back")
    assert lhc(fake_claude, "doctor", "--repair").returncode == 1
    assert lhc(fake_claude, "threads").returncode == 1
    p = lhc(fake_claude, "rollout", "write", "--thread-id", gone, "--session-id", str(uuid.uuid4()))
    assert p.returncode == 1 and "is missing" in err(p)
    assert not path.exists()
    assert "Traceback" not in err(p)


def test_threads_lists_the_rest_and_names_a_damaged_thread_file(fake_claude, iso_env):
    good, bad, _path = _two_threads_one_damaged(fake_claude, iso_env)
    p = lhc(fake_claude, "threads", "--json")
    assert p.returncode == 1
    assert [t["id"] for t in json.loads(p.stdout)] == [good]
    (line,) = err(p).strip().splitlines()
    assert bad[:8] in line and "cc-lhc doctor" in line
    p = lhc(fake_claude, "threads")
    assert p.returncode == 1 and good[:8] in out(p) and bad[:8] not in out(p)


def test_doctor_exits_1_when_claude_cannot_be_found_even_before_any_state(fake_claude, tmp_path):
    p = lhc(fake_claude, "doctor", env={"CC_LHC_CLAUDE_BIN": str(tmp_path / "no-claude"),
                                        "CC_LHC_HOME": str(tmp_path / "never-used")})
    assert p.returncode == 1
    assert "(not created yet)" in out(p)
    assert "[fail] claude" in out(p) and "fix: install Claude Code" in out(p)


def test_doctor_exits_0_when_everything_is_sound(fake_claude):
    assert lhc(fake_claude, "-p", "one", script=transcript_steps("one", fake_claude.cwd)).returncode == 0
    p = lhc(fake_claude, "doctor")
    assert p.returncode == 0, out(p)
    assert "[fail]" not in out(p) and "[  ok] thread files: 1 checked" in out(p)


def test_doctor_reads_odd_state_without_tracebacks_or_writes(fake_claude, iso_env, tmp_path):
    """A lease holding JSON that is no object, an empty registry, a damaged cc-lhc.sqlite:
    each is named, the checks after it still run, and doctor writes nothing."""
    assert lhc(fake_claude, "-p", "one").returncode == 0
    (iso_env.lhc / "owners" / "odd.json").write_text("[1]")
    registry = iso_env.lhc / "registry.sqlite"
    for extra in ("-wal", "-shm"):
        (iso_env.lhc / f"registry.sqlite{extra}").unlink(missing_ok=True)
    registry.write_bytes(b"")
    host = iso_env.lhc / "cc-lhc.sqlite"
    for extra in ("-wal", "-shm"):
        (iso_env.lhc / f"cc-lhc.sqlite{extra}").unlink(missing_ok=True)
    host.write_bytes(b"not a database at all " * 200)
    p = lhc(fake_claude, "doctor")
    assert p.returncode == 1 and "Traceback" not in err(p), err(p)
    assert "[fail] schema registry.sqlite" in out(p) and "is empty" in out(p)
    assert "[fail] runtime descriptors: cc-lhc.sqlite cannot be read" in out(p)
    assert "] registry:" in out(p)  # the last check ran all the same
    assert registry.stat().st_size == 0  # read only: no schema was written into it
    lone = tmp_path / "a-file"
    lone.write_text("x")
    p = lhc(fake_claude, "doctor", env={"CC_LHC_HOME": str(lone)})
    assert p.returncode == 1 and f"[fail] state home: {lone} is not a folder" in out(p)


# -- finding Claude -----------------------------------------------------------------------

def test_claude_bin_override_pointing_nowhere_exits_127(fake_claude, tmp_path):
    missing = tmp_path / "no-such-claude"
    p = lhc(fake_claude, "-p", "hi", env={"CC_LHC_CLAUDE_BIN": str(missing)})
    assert p.returncode == 127
    assert str(missing) in err(p) and "CC_LHC_CLAUDE_BIN" in err(p)
    assert "Traceback" not in err(p)
    assert len(err(p).strip().splitlines()) == 1


def test_claude_bin_override_not_executable_exits_127(fake_claude, tmp_path):
    plain = tmp_path / "claude.txt"
    plain.write_text("not a program\n")
    plain.chmod(0o644)
    p = lhc(fake_claude, "--version", env={"CC_LHC_CLAUDE_BIN": str(plain)})
    assert p.returncode == 127, err(p)
    assert str(plain) in err(p) and "Traceback" not in err(p)


def _path_with(tmp_path, with_claude: bool) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    os.symlink(sys.executable, bindir / "python3")  # fake_claude's #! looks python3 up on PATH
    if with_claude:
        os.symlink(FAKE_CLAUDE, bindir / "claude")
    return str(bindir)


@pytest.mark.parametrize("args", [["-p", "hi"], ["--version"], []])
def test_claude_missing_from_path_exits_127(fake_claude, tmp_path, args):
    env = {k: v for k, v in fake_claude.env.items() if k != "CC_LHC_CLAUDE_BIN"}
    env["PATH"] = _path_with(tmp_path, with_claude=False)
    p = subprocess.run([sys.executable, str(CC_LHC), *args], env=env, cwd=fake_claude.cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert p.returncode == 127
    assert "claude" in p.stderr and "PATH" in p.stderr and "Traceback" not in p.stderr


def test_claude_found_on_path_by_default(fake_claude, tmp_path):
    env = {k: v for k, v in fake_claude.env.items() if k != "CC_LHC_CLAUDE_BIN"}
    env["PATH"] = _path_with(tmp_path, with_claude=True)
    env["FAKE_CLAUDE_SCRIPT"] = json.dumps([{"print": "from PATH"}])
    p = subprocess.run([sys.executable, str(CC_LHC), "-p", "hi"], env=env, cwd=fake_claude.cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert (p.returncode, p.stdout) == (0, "from PATH\n"), p.stderr


# -- session selectors --------------------------------------------------------------------

def test_fresh_launch_gets_a_new_session_id_prepended(fake_claude):
    for _ in range(2):
        p = lhc(fake_claude, "-p", "hello", "--model", "opus")
        assert p.returncode == 0, err(p)
    first, second = (launch["argv"] for launch in fake_claude.launches())
    assert first[0] == "--session-id" and UUID.match(first[1])
    assert first[2:] == ["-p", "hello", "--model", "opus"]
    assert second[1] != first[1], "two fresh launches got the same session"


def test_fresh_interactive_launch_gets_a_session_id_too(fake_claude):
    p = lhc(fake_claude)
    assert p.returncode == 0, err(p)
    argv = only_launch(fake_claude)["argv"]
    assert argv[0] == "--session-id" and UUID.match(argv[1]) and len(argv) == 2


@pytest.mark.parametrize("args", [
    ["--resume", SID_A, "-p", "hi"],
    ["-r", SID_A, "-p", "hi"],
    [f"--resume={SID_A}", "-p", "hi"],
    ["--session-id", SID_A, "-p", "hi"],
    ["-p", "hi", "--session-id", SID_A],
])
def test_user_session_selectors_pass_unchanged(fake_claude, args):
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    assert only_launch(fake_claude)["argv"] == args


@pytest.mark.parametrize("print_flag", [["-p"], []], ids=["-p", "output-not-a-terminal"])
def test_a_one_shot_continue_with_nothing_to_continue_starts_a_captured_session(fake_claude, iso_env, print_flag):
    """`claude -p -c` where the folder has no session starts a new conversation (so does
    `claude -c` whose output is no terminal: a one-shot all the same); under cc-lhc that
    one is managed: named by cc-lhc, captured, a thread of its own."""
    p = lhc(fake_claude, "-c", *print_flag, "hi")
    assert p.returncode == 0, err(p)
    argv = only_launch(fake_claude)["argv"]
    assert "-c" not in argv and "--continue" not in argv and argv[-1] == "hi"
    sid = argv[argv.index("--session-id") + 1]
    [launch] = log_events(iso_env, "launch")
    assert launch["session"] == sid and launch["thread"]  # (managed: a thread, capture)


@pytest.mark.parametrize("args", [
    ["--resume", SID_A, "--session-id", SID_B],
    ["--session-id", SID_B, "--resume", SID_A],
    ["-c", "--resume", SID_A],
    ["--continue", "-r", SID_A],
    ["-c", "--session-id", SID_B],
    ["--resume", SID_A, "--resume", SID_B],
    ["--session-id", "not-a-uuid"],
    ["--session-id"],
    ["-p", "hi", "--resume", SID_A, "--session-id", SID_B],
    ["-p", "hi", "-c", "--resume", SID_A],
    ["-cr", SID_A],
    [f"-pcr{SID_A}", "hi"],
])
def test_conflicting_selectors_exit_2_before_spawn(fake_claude, iso_env, args):
    p = lhc(fake_claude, *args)
    assert p.returncode == 2, err(p)
    assert "Traceback" not in err(p) and len(err(p).strip().splitlines()) == 1
    assert fake_claude.launches() == [], "Claude was started despite the conflict"
    assert log_events(iso_env, "launch") == []


# -- one-shot and interactive -------------------------------------------------------------

@pytest.mark.parametrize("args", [["-p", "hi"], ["--print", "hi"], ["-p=hi"], ["--print=hi"],
                                  ["--model", "x", "-p"], ["--", "-p", "hi"]])
def test_every_print_form_is_a_one_shot(fake_claude, iso_env, args):
    p = lhc(fake_claude, *args, script=[{"print": "answer"}])
    assert (p.returncode, out(p)) == (0, "answer\n"), err(p)
    launch = only_launch(fake_claude)
    # One-shot: Claude inherits our (piped) stdio instead of getting a terminal.
    assert launch["tty"] == {"stdin": False, "stdout": False, "stderr": False}
    assert [e["mode"] for e in log_events(iso_env, "launch")] == ["oneshot"]


def test_without_print_and_without_a_terminal_claude_runs_as_a_plain_child(fake_claude, iso_env):
    """Output to a pipe or file, -p or not: Claude answers and exits, as claude alone does
    there (in a PTY it would wait for keys nobody types)."""
    p = lhc(fake_claude, "hello", script=[{"print": "answer"}])
    assert p.returncode == 0, err(p)
    assert only_launch(fake_claude)["tty"]["stdout"] is False
    assert out(p) == "answer\n"
    assert [e["mode"] for e in log_events(iso_env, "launch")] == ["oneshot"]


def test_one_shot_passes_piped_stdin_to_claude(fake_claude):
    p = lhc(fake_claude, "-p", script=[{"echo": True}], input=b"first\nsecond\n")
    assert (p.returncode, out(p)) == (0, "ECHO first\nECHO second\n"), err(p)


@pytest.mark.parametrize("args, disabled", [
    (["-p", "hi"], "1"),
    ([], "1"),
    (["--autocompact", "auto", "-p", "hi"], None),
    (["--autocompact=200000", "-p", "hi"], None),
    (["--autocompact", "auto"], None),
])
def test_auto_compact_disabled_unless_user_asks(fake_claude, args, disabled):
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    launch = only_launch(fake_claude)
    assert launch["env"].get("DISABLE_AUTO_COMPACT") == disabled
    if disabled is None:
        assert "--autocompact" in " ".join(launch["argv"])  # passed through unchanged


@pytest.mark.parametrize("args, given", [
    (["--autocompact", "auto", "-p", "hi"], "--autocompact auto"),
    (["-p", "hi", "--autocompact=200000"], "--autocompact=200000"),
])
def test_the_autocompact_argument_is_kept_as_written_for_details(args, given):
    assert cc_lhc.scan_claude_args(args)["autocompact_arg"] == given


@pytest.mark.parametrize("args", [["--no-session-persistence", "-p", "hi"], ["--no-session-persistence"]])
def test_no_session_persistence_runs_unmanaged_with_claude_compaction_on(fake_claude, args):
    """No transcript: nothing to capture or rebuild, so Claude's own compaction stays on."""
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    launch = only_launch(fake_claude)
    assert "DISABLE_AUTO_COMPACT" not in launch["env"]
    assert cc_lhc.MSG_UNGOVERNED in err(p) and err(p).count(cc_lhc.MSG_UNGOVERNED) == 1
    assert "--no-session-persistence" in launch["argv"]


@pytest.mark.parametrize("args", [["--bg", "do it"], ["--background", "--resume", "6f3c1a8e-1111-4222-8333-444455556666"]])
def test_a_session_claude_runs_in_the_background_is_unmanaged_with_claude_compaction_on(fake_claude, args):
    """--bg hands the session to Claude's own daemon once the launch has ended: no cc-lhc is
    there to capture or compact it, so Claude's own compaction must stay on (with it off,
    the session had no compaction at all), and no descriptor of an ended cc-lhc is left."""
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    launch = only_launch(fake_claude)
    assert "DISABLE_AUTO_COMPACT" not in launch["env"] and cc_lhc.RUNTIME_ENV not in launch["env"]
    assert err(p).count(cc_lhc.MSG_BACKGROUND) == 1 and launch["retrieval_rules"] == []
    assert args[0] in launch["argv"]


@pytest.mark.parametrize("arg", ["-r=6f3c1a8e-1111-4222-8333-444455556666", "-pr=6f3c1a8e-1111-4222-8333-444455556666"])
def test_r_with_an_equals_sign_is_refused_as_claude_would_read_it(fake_claude, arg):
    """Claude reads everything after -r as its value, the "=" too: "-r=<id>" names no session
    (Claude opened its own picker, and cc-lhc had bound the thread of <id> meanwhile)."""
    p = lhc(fake_claude, arg)
    assert p.returncode == 2 and not fake_claude.launches()
    assert "write -r 6f3c1a8e-1111-4222-8333-444455556666 or --resume=6f3c1a8e-1111-4222-8333-444455556666" in err(p)


RETRIEVAL_RULES = ["--allowedTools=Bash(cc-lhc get-turns:*)", "--allowedTools=Bash(cc-lhc get-messages:*)",
                   "--allowedTools=Bash(cc-lhc search:*)"]


@pytest.mark.parametrize("args", [["-p", "hi"], [], ["--allowedTools", "Bash(git:*)", "-p", "fix it"]])
def test_managed_children_may_run_exactly_the_retrieval_commands(fake_claude, args):
    """Each rule is one `=` argument ahead of the user's own, which follow unchanged."""
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    launch = only_launch(fake_claude)
    assert launch["retrieval_rules"] == RETRIEVAL_RULES
    assert launch["argv"][2:] == args  # after the --session-id pair


@pytest.mark.parametrize("args", [["--no-session-persistence", "-p", "hi"], ["mcp", "list"], ["--version"]])
def test_children_without_retrieval_get_no_allow_rules(fake_claude, args):
    p = lhc(fake_claude, *args)
    assert p.returncode == 0, err(p)
    assert only_launch(fake_claude)["retrieval_rules"] == []


# -- exit statuses ------------------------------------------------------------------------

@pytest.mark.parametrize("code", [0, 1, 3, 42])
@pytest.mark.parametrize("mode", [["-p", "hi"], []])
def test_claude_exit_status_is_cc_lhc_exit_status(fake_claude, code, mode):
    p = lhc(fake_claude, *mode, script=[{"exit": code}])
    assert p.returncode == code, err(p)
    assert "Traceback" not in err(p)


@pytest.mark.parametrize("sig", ["TERM", "HUP", "USR1"])
@pytest.mark.parametrize("mode", [["-p", "hi"], []])
def test_claude_killed_by_signal_gives_128_plus_n(fake_claude, sig, mode):
    p = lhc(fake_claude, *mode, script=[{"signal": sig}])
    assert p.returncode == 128 + getattr(signal, "SIG" + sig), err(p)


def test_sigterm_to_one_shot_wrapper_reaches_claude(fake_claude):
    fake_claude.script([{"print": "READY"}, {"sleep": None}])
    proc = subprocess.Popen([sys.executable, str(CC_LHC), "-p", "hi"], env=fake_claude.env,
                            cwd=fake_claude.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout.readline() == b"READY\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


GRACEFUL_CLAUDE = """\
import signal, sys, time
def stop(*_):
    time.sleep(0.3)  # finishing up takes a moment; the wrapper must wait for it
    print("saved and stopped", flush=True)
    sys.exit(5)
signal.signal(signal.SIGINT, stop)
print("READY", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("to_group", [True, False])
def test_ctrl_c_during_one_shot_is_claudes_to_handle(fake_claude, tmp_path, to_group):
    """ctrl-c in a shell signals the whole foreground process group: Claude and cc-lhc.
    Claude decides what it means; cc-lhc waits for it and reports Claude's status. A
    SIGINT sent to cc-lhc alone (a supervisor's kill -INT <pid>) is passed on, once."""
    graceful = tmp_path / "graceful-claude"
    graceful.write_text(f"#!{sys.executable}\n{GRACEFUL_CLAUDE}")
    graceful.chmod(0o755)
    env = {**fake_claude.env, "CC_LHC_CLAUDE_BIN": str(graceful)}
    proc = subprocess.Popen([sys.executable, str(CC_LHC), "-p", "hi"], env=env,
                            cwd=fake_claude.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"READY\n"
        if to_group:
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == b"saved and stopped\n"
        assert proc.wait(timeout=10) == 5
        assert proc.stdout.read() == b""  # stopped once
        assert b"Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _oneshot_spec(tmp_path, argv):
    from types import SimpleNamespace
    return SimpleNamespace(child_argv=argv, cwd=str(tmp_path), session_id=SID_A, after_spawn=None)


@pytest.fixture
def caught_signals():
    """While a test runs run_oneshot in this process, a signal that its handlers do not
    take is recorded here instead of ending (or interrupting) the test run."""
    caught = []
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {s: signal.signal(s, lambda n, _f: caught.append(n)) for s in watched}
    yield caught
    for s, handler in before.items():
        signal.signal(s, handler)


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
@pytest.mark.parametrize("sig", ["TERM", "HUP", "INT"])
def test_a_signal_before_claude_starts_means_it_is_not_started(tmp_path, monkeypatch, sig,
                                                               caught_signals):
    """A signal that reaches a one-shot cc-lhc in the moment before Claude is started has
    no Claude to go to: Claude is not started (it would run on unasked), the status is the
    signal's, and cc-lhc's own handlers are put back."""
    signum = getattr(signal, "SIG" + sig)
    marker = tmp_path / "started"
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def environment(_spec):
        os.kill(os.getpid(), signum)  # delivered (its handler run) before kill returns
        return dict(os.environ)
    monkeypatch.setattr(cc_lhc, "child_environment", environment)
    spec = _oneshot_spec(tmp_path, [sys.executable, "-c", f"open({str(marker)!r}, 'w')"])
    home = cc_lhc.StateHome(str(tmp_path / "home"))
    assert cc_lhc.run_oneshot(spec, home) == 128 + signum
    assert not marker.exists()
    assert caught_signals == []
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.skipif(os.name != "posix", reason="POSIX signals")
def test_a_signal_while_claude_is_being_started_reaches_it(tmp_path, monkeypatch, caught_signals):
    """A SIGTERM that arrives while Claude is being started (the fork done, cc-lhc not yet
    holding it) is passed on as soon as Claude is known, not lost and not fatal to cc-lhc."""
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        child = real_popen(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGTERM)  # cc-lhc does not hold the child yet
        return child
    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(cc_lhc, "child_environment", lambda _spec: dict(os.environ))
    spec = _oneshot_spec(tmp_path, [sys.executable, "-c", "import time; time.sleep(5)"])
    home = cc_lhc.StateHome(str(tmp_path / "home"))
    # (unpassed, Claude would sleep its time out and end with 0)
    assert cc_lhc.run_oneshot(spec, home) == 128 + signal.SIGTERM
    assert caught_signals == []


# -- stdout belongs to Claude -------------------------------------------------------------

def test_cc_lhc_lines_go_to_stderr_only(fake_claude, iso_env):
    # A bad config makes cc-lhc talk; none of it may land in Claude's stdout.
    (iso_env.work / ".cc-lhc.json").write_text('{"lowerBoundTokens": "lots"}')
    p = lhc(fake_claude, "-p", "hi", "--output-format", "json",
            script=[{"print": '{"type":"result","result":"ok"}'}, {"stderr": "claude's own"}])
    assert p.returncode == 0
    assert p.stdout == b'{"type":"result","result":"ok"}\n'
    assert cc_lhc.MSG_CONFIG_FALLBACK in err(p) and "claude's own" in err(p)


def test_large_burst_through_a_pipe_arrives_byte_for_byte(fake_claude):
    size = 6_000_000
    started = time.monotonic()
    p = lhc(fake_claude, "-p", "hi", script=[{"burst": size}], timeout=60)
    assert p.returncode == 0, err(p)
    assert len(p.stdout) == size
    assert p.stdout == burst_bytes(size)
    assert err(p) == ""
    assert time.monotonic() - started < 20


def test_a_state_folder_this_user_cannot_use_is_refused_not_read_as_empty(iso_env, monkeypatch, capsys):
    """Read as empty, a state folder another user owns would say "no threads yet" of one
    full of them: cc-lhc refuses it (1) and doctor fails on it with a fix line. (The tests
    run as root, whom every folder lets in: the permission is made to fail here.)"""
    home = cc_lhc.StateHome()
    home.ensure()
    cc_lhc.Registry(home).create_thread(str(uuid.uuid4()), str(iso_env.work), "test")
    real = os.access
    monkeypatch.setattr(cc_lhc.os, "access", lambda path, mode, **kw: (
        False if os.path.realpath(path) == os.path.realpath(home.root) else real(path, mode, **kw)))
    assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
    assert "cannot be read and written by this user" in capsys.readouterr().err
    assert cc_lhc.main(["search", "--all", "x"]) == cc_lhc.EXIT_ERROR
    capsys.readouterr()
    assert cc_lhc.main(["doctor"]) == cc_lhc.EXIT_ERROR
    said = capsys.readouterr().out
    assert "[fail] state home" in said and "chown -R" in said
    assert cc_lhc.main(["--lhc-version"]) == 0  # help and version need no state folder


def test_a_state_folder_that_cannot_be_made_or_is_read_only_is_said_so(iso_env, tmp_path, monkeypatch, capsys):
    """A state folder named under a file, or on a read-only file system: every command
    refuses it (1), naming what is wrong, and doctor fails on it (it passed one not made
    yet, and the launch then died on a bare NotADirectoryError)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("CC_LHC_HOME", str(blocker / "state"))
    assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
    assert f"cannot be made: {blocker} is not a folder" in capsys.readouterr().err
    assert cc_lhc.main(["doctor"]) == cc_lhc.EXIT_ERROR
    assert "[fail] state home" in capsys.readouterr().out
    monkeypatch.setenv("CC_LHC_HOME", str(iso_env.lhc))
    cc_lhc.StateHome().ensure()
    monkeypatch.setattr(cc_lhc, "_read_only_fs", lambda path: True)
    assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
    err = capsys.readouterr().err
    assert "is on a read-only file system" in err and "chown" not in err


def test_the_checkouts_launcher_runs_cc_lhc_from_any_folder_with_cached_bytecode(tmp_path):
    """bin/cc-lhc (the README's alias) imports cc_lhc.py, so Python compiles it once and
    keeps the bytecode (and, like any script run by path, never reads modules from the
    folder it runs in)."""
    import subprocess
    launcher = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bin", "cc-lhc")
    (tmp_path / "json.py").write_text("raise SystemExit('the folder shadowed json')\n")
    cache = tmp_path / "pycache"
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(cache)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, launcher, "--lhc-help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "cc-lhc" in proc.stdout, proc.stderr
    assert list(cache.rglob("cc_lhc.*.pyc"))  # compiled once, kept


def test_a_full_disk_met_by_a_command_is_said_with_the_state_folder(iso_env, monkeypatch, capsys):
    """SQLite's "database or disk is full" names no file: the answer says what keeps the
    state folder from use (it was the bare error)."""
    import sqlite3

    def full(_args):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setitem(cc_lhc.COMMANDS, "threads", full)
    monkeypatch.setattr(cc_lhc, "_free_bytes", lambda folder: 512)
    assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
    err = capsys.readouterr().err
    assert "database or disk is full; the state folder " in err and "its disk is full (512 bytes free)" in err
    monkeypatch.setattr(cc_lhc, "_free_bytes", lambda folder: 10 << 30)  # (not the disk: said as it was)
    assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
    assert capsys.readouterr().err.strip().endswith("OperationalError: database or disk is full")
    for error, said in ((sqlite3.OperationalError("database is locked"), "has kept a database of the state folder"),
                        (sqlite3.DatabaseError("database disk image is malformed"), "cc-lhc doctor names it")):
        def fails(_args, error=error):
            raise error
        monkeypatch.setitem(cc_lhc.COMMANDS, "threads", fails)
        assert cc_lhc.main(["threads"]) == cc_lhc.EXIT_ERROR
        assert said in capsys.readouterr().err

def test_a_database_kept_from_sqlite_by_its_surroundings_is_not_called_damaged(iso_env, tmp_path, monkeypatch):
    """A full disk, a read-only file system or a file this user cannot read keep SQLite from
    a file that may be whole: cc-lhc says which, and never advises throwing the file away."""
    import sqlite3
    path = tmp_path / "registry.sqlite"
    sqlite3.connect(path).execute("CREATE TABLE t (x)").connection.close()
    full = sqlite3.OperationalError("disk I/O error")
    monkeypatch.setattr(cc_lhc, "_free_bytes", lambda folder: 512)
    assert cc_lhc._why_unopened(str(path), full) == \
        ": its disk is full (512 bytes free); the file is not known to be damaged"
    assert cc_lhc._why_unopened(str(path), sqlite3.DatabaseError("file is not a database")) == ""

    def refuse(*_a, **_k):
        raise full
    monkeypatch.setattr(sqlite3, "connect", refuse)
    status, _what, detail, fix = cc_lhc.store_file_check(str(path), "registry", [])
    assert status == "fail" and "disk is full" in detail and "not known to be damaged" in fix
    assert "restore" not in fix and "recover" not in fix
    monkeypatch.undo()
    monkeypatch.setattr(cc_lhc, "_read_only_fs", lambda folder: True)
    assert "is on a read-only file system" in cc_lhc._why_unopened(str(path), sqlite3.OperationalError(
        "attempt to write a readonly database"))
    real = os.access
    monkeypatch.setattr(cc_lhc.os, "access", lambda p, mode, **kw: False if str(p) == str(path) else real(p, mode, **kw))
    assert "cannot read and write it (chmod 600" in cc_lhc._why_unopened(
        str(path), sqlite3.OperationalError("unable to open database file"))


def test_a_threads_folder_that_cannot_be_listed_is_named_not_every_thread_called_gone(iso_env, monkeypatch, capsys):
    home = cc_lhc.StateHome()
    home.ensure()
    cc_lhc.Registry(home).create_thread(str(uuid.uuid4()), str(iso_env.work), "test")
    real = os.listdir

    def listdir(path="."):
        if os.path.realpath(path) == os.path.realpath(home.path("threads")):
            raise PermissionError(13, "Permission denied", path)
        return real(path)
    monkeypatch.setattr(cc_lhc.os, "listdir", listdir)
    assert cc_lhc.main(["doctor"]) == cc_lhc.EXIT_ERROR
    said = capsys.readouterr().out
    assert "cannot be listed (Permission denied)" in said and "chmod u+rwx" in said
    assert "is gone" not in said


def test_doctor_says_to_install_tiktoken_when_that_is_what_is_missing(iso_env, monkeypatch, capsys):
    """The zipapp (or a checkout) on a Python without tiktoken: the fix is tiktoken, not
    another copy of cc-lhc."""
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tiktoken" else real(name, *a))
    monkeypatch.setattr(cc_lhc, "TOKENS", types_namespace_tokens())
    cc_lhc.main(["doctor"])
    said = capsys.readouterr().out
    assert "[warn] token counts" in said and "pip install tiktoken" in said


def types_namespace_tokens():
    import types
    return types.SimpleNamespace(encoding=lambda: None, exact=False, reason="tiktoken is not installed")


def test_a_thread_record_that_is_a_fifo_is_named_as_such_not_as_emptied(iso_env, capsys):
    """A named pipe (or another special file) where a thread's record belongs is said to be
    that, by `threads`, `export` and `doctor`: it was called empty, "what it held is gone"."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no named pipes here")
    home = cc_lhc.StateHome()
    registry = cc_lhc.Registry(home)
    thread = registry.create_thread(str(uuid.uuid4()), str(iso_env.root), "fresh")
    record = home.path("threads", f"{thread}.sqlite")
    for tail in ("", "-wal", "-shm"):
        if os.path.exists(record + tail):
            os.unlink(record + tail)
    os.mkfifo(record)
    for argv in (["threads"], ["export", thread], ["doctor"]):
        assert cc_lhc.main(argv) == cc_lhc.EXIT_ERROR
        out = capsys.readouterr()
        said = out.out + out.err
        assert "is a FIFO (named pipe), not a regular file" in said, (argv, said)
        assert "is empty" not in said


@pytest.mark.parametrize("argv", [["--lhc-help"], ["doctor"], ["threads"]])
def test_a_reader_that_stops_early_ends_cc_lhc_quietly(iso_env, argv):
    """`cc-lhc --lhc-help | true`: the reader is gone before cc-lhc writes; the flush at
    exit raised BrokenPipeError again and Python printed it (status 120). Quiet now, 1."""
    env = {k: v for k, v in iso_env.env.items() if k != "PYTHONUNBUFFERED"}  # (as a person runs it)
    p = subprocess.Popen([sys.executable, str(CC_LHC), *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=iso_env.work)
    p.stdout.close()  # (the reader gone before a byte is written)
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) in (0, 1) and "BrokenPipeError" not in err and "Exception ignored" not in err, err


def test_output_left_in_the_buffer_for_a_reader_that_has_gone_ends_quietly(iso_env):
    """The bundle's `--lhc-help | true` and `doctor | true` ended with status 120 and
    Python's "Exception ignored ... BrokenPipeError": the answer, still buffered when
    main() returned, was flushed at exit into a pipe nobody read. cli() flushes it itself."""
    code = ("import cc_lhc; cc_lhc.main = lambda argv=None: print('answer ' * 50) or 0; cc_lhc.cli()")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env={**{k: v for k, v in iso_env.env.items() if k != "PYTHONUNBUFFERED"},
                              "PYTHONPATH": str(REPO)}, cwd=iso_env.work)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 1 and err == "", err


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_standard_streams_started_closed_get_the_null_device_and_no_file_takes_their_place(fake_claude, iso_env):
    """`cc-lhc ... 2>&-` (or `<&-`, `>&-`): the first file cc-lhc opened took the stream's
    number, and its messages raised (exit 1 for a usage error, no Claude at all after a
    notice). Each such stream is the null device now, for cc-lhc and the Claude it starts:
    messages go nowhere, as they would have, and everything else works."""
    def closed(stream, *args, script=None):
        env = {**fake_claude.env, "FAKE_CLAUDE_SCRIPT": json.dumps(script or [])}
        return subprocess.run(["sh", "-c", f'exec "$0" "$@" {stream}>&-', sys.executable, str(CC_LHC), *args],
                              env=env, cwd=fake_claude.cwd, capture_output=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    p = closed(2, "--lhc-bogus")
    assert p.returncode == 2 and p.stdout == b""
    for stream in (2, 0):
        script = [{"run": ["sh", "-c", f"readlink /proc/$PPID/fd/{stream}"]}, {"stderr": "to Claude's stderr"},
                  {"print": "answered"}]
        for args in (["-p", "hi"], ["--lhc-target", "abc", "-p", "hi"]):  # (the second says a notice first)
            p = closed(stream, *args, script=script)
            assert p.returncode == 0 and p.stdout.decode().split("\n")[0] == "/dev/null", p
            assert b"answered" in p.stdout
    p = closed(1, "threads")
    assert p.returncode == 1 and b"standard output is closed" in p.stderr
    assert subprocess.run([sys.executable, str(CC_LHC), "doctor"], env=fake_claude.env, capture_output=True,
                          cwd=fake_claude.cwd, timeout=60).stdout.count(b"[fail]") == 0


@pytest.mark.parametrize("home_is", ["a file", "read-only"])
def test_usage_and_preview_answer_whatever_the_state_folder(fake_claude, iso_env, home_is):
    """`cc-lhc <command> --help` and `cc-lhc preview` keep nothing in the state folder: they
    answered "the state folder ... is not a folder" (or read-only) with exit 1."""
    home = iso_env.root / "lhc-odd"
    if home_is == "a file":
        home.write_text("")
    else:
        home.mkdir()
        os.chmod(home, 0o500)
    try:
        for args in (["threads", "--help"], ["search", "--help"], ["measure", "-h"], ["export", "--help"],
                     ["get-turns", "--help"], ["preview", "--list"]):
            p = lhc(fake_claude, *args, env={"CC_LHC_HOME": str(home)})
            assert p.returncode == 0 and out(p), (args, err(p))
        if home_is == "a file" or os.geteuid() != 0:  # (root writes a read-only folder all the same)
            p = lhc(fake_claude, "threads", env={"CC_LHC_HOME": str(home)})
            assert p.returncode == 1 and "state folder" in err(p)
    finally:
        if home.is_dir():
            os.chmod(home, 0o700)


def test_a_claude_config_folder_that_is_a_file_is_said_and_leaves_no_thread(fake_claude, iso_env):
    """CLAUDE_CONFIG_DIR naming a file: Claude answers and keeps no transcript. cc-lhc said it
    could not write its own record (a NotADirectoryError read as a failing store) and left an
    empty thread flagged DEGRADED for good. It says what is wrong, and keeps no thread."""
    config = iso_env.root / "not-a-folder"
    config.write_text("x")
    p = lhc(fake_claude, "-p", "hi", script=[{"sleep": 0.3}, {"print": "answered"}],
            env={"CLAUDE_CONFIG_DIR": str(config)})
    assert p.returncode == 0 and "answered" in out(p), err(p)
    assert f"Claude's config folder {config} (CLAUDE_CONFIG_DIR) is not a folder" in err(p)
    assert "cannot write its record" not in err(p)
    assert json.loads(out(lhc(fake_claude, "threads", "--json"))) == []


def test_doctor_warns_of_a_current_session_whose_transcript_was_cut(iso_env, capsys):
    """Capture found the transcript of a thread's current session cut under it: `threads`
    said DEGRADED, doctor said all was well. It warns (exit 0: the thread keeps every record,
    and the next launch writes the session again from it)."""
    from test_capture_parse import Transcript, text
    sid = "11111111-2222-4333-8444-555555555555"
    t = Transcript(sid)
    t.user("first prompt")
    t.assistant(text("first answer"))
    t.user("second prompt")
    t.assistant(text("second answer"))
    path = t.write(iso_env.root / f"{sid}.jsonl")
    home = cc_lhc.StateHome()
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(sid, str(iso_env.work), "fresh")
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    cap.catch_up()
    path.write_bytes(b"".join(line + b"\n" for line in t.lines[2:]))  # the first turn cut away
    cap.catch_up()
    cap.stop()
    assert cc_lhc.main(["doctor"]) in (0, 1)
    said = capsys.readouterr().out
    assert f"[warn] thread {thread}: the transcript of session {sid} was cut after cc-lhc captured it" in said
    assert "the next launch of the session writes it again from the thread" in said
    assert f"thread {thread}" not in said.split("[warn] thread", 1)[0]  # (named once, as a warning)


def test_doctor_writes_nothing_without_repair_even_to_read_a_threads_current_session(fake_claude, iso_env):
    """doctor's look at each thread's current session opened the registry as a launch does
    (migrations, rebuilt from the thread files when missing): `cc-lhc doctor` made a new
    registry.sqlite where the README says only --repair writes."""
    assert lhc(fake_claude, "-p", "one", script=transcript_steps("one", fake_claude.cwd)).returncode == 0
    for tail in ("", "-wal", "-shm"):
        (iso_env.lhc / f"registry.sqlite{tail}").unlink(missing_ok=True)
    p = lhc(fake_claude, "doctor")
    assert "[warn] registry" in out(p) and not (iso_env.lhc / "registry.sqlite").exists(), out(p)


def test_utf8_streams_keep_the_error_handling_they_were_given(monkeypatch):
    """Made UTF-8, a stream kept 'strict' where it had 'backslashreplace' (stderr) or
    'surrogateescape': a message naming a path of undecodable bytes was then dropped whole."""
    import io
    err = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="backslashreplace")
    monkeypatch.setattr(sys, "stderr", err)
    cc_lhc.write_utf8()
    assert err.encoding == "utf-8" and err.errors == "backslashreplace"
    cc_lhc.say("a folder named caf\udcc3\udca9")
    err.flush()
    assert b"caf\\udcc3\\udca9" in err.buffer.getvalue()


def test_a_working_folder_too_deep_to_name_holds_no_config_file(monkeypatch):
    import errno
    monkeypatch.setattr(os, "lstat", lambda path: (_ for _ in ()).throw(OSError(errno.ENAMETOOLONG, "File name too long")))
    assert not cc_lhc.config_file_there("/deep/.cc-lhc.json")
