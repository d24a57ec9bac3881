"""Hostile files and arguments (issue 9, items 4, 5, 8 and 9): nothing hangs, nothing
prints a traceback, and bad input ends in the documented fallback or refusal.

Every case runs cc-lhc as a subprocess with a timeout, so a regression that blocks on a
FIFO fails the test instead of hanging the suite. Claude is tests/fake_claude.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import cc_lhc
from conftest import CC_LHC, REPO

MSG = cc_lhc.MSG_CONFIG_FALLBACK
SID = "11111111-2222-4333-8444-555555555555"
TIMEOUT = 15  # seconds; every case here finishes in well under one


def _limit_memory():
    # Reading /dev/zero without a bound would eat the machine; a ceiling turns that
    # regression into a quick MemoryError the test sees.
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def lhc(fake, *args, cwd=None, env=None):
    return subprocess.run([sys.executable, str(CC_LHC), *args], env={**fake.env, **(env or {})},
                          cwd=cwd or fake.cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=TIMEOUT, preexec_fn=_limit_memory)


def user_config(iso_env):
    path = iso_env.xdg / "cc-lhc" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def transcript_path(iso_env, sid=SID):
    folder = iso_env.config / "projects" / cc_lhc.project_slug(str(iso_env.work))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{sid}.jsonl"


def logged_policy(iso_env):
    rows = [json.loads(line) for line in (iso_env.lhc / "wrapper.log").read_text().splitlines()]
    return [r for r in rows if r["event"] == "launch"][-1]["policy"]


def assert_fell_back_and_ran(p, fake, *words):
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(MSG) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for word in words:
        assert word in p.stderr, p.stderr
    assert len(fake.launches()) == 1


def assert_refused(p, fake, *words):
    assert p.returncode == cc_lhc.EXIT_USAGE, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert p.stdout == ""
    assert fake.launches() == []


# -- 4. non-regular files where cc-lhc reads --------------------------------------------

@pytest.mark.parametrize("where", ["user", "project"])
def test_a_fifo_as_config_falls_back_instead_of_hanging(fake_claude, iso_env, where):
    path = user_config(iso_env) if where == "user" else iso_env.work / ".cc-lhc.json"
    os.mkfifo(path)
    p = lhc(fake_claude, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, str(path), "FIFO")
    assert logged_policy(iso_env)["upperBoundTokens"] == cc_lhc.BUILTIN_POLICY["upperBoundTokens"]


def test_a_config_linked_to_dev_zero_is_refused_without_reading_it(fake_claude, iso_env):
    os.symlink("/dev/zero", user_config(iso_env))
    p = lhc(fake_claude, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, "config.json", "character device")


def test_an_oversized_config_falls_back(fake_claude, iso_env):
    user_config(iso_env).write_bytes(b"{" + b" " * (cc_lhc.CONFIG_FILE_LIMIT + 10) + b"}")
    p = lhc(fake_claude, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, "config.json", "larger than")


def test_a_fifo_as_the_resumed_transcript_is_refused(fake_claude, iso_env):
    os.mkfifo(transcript_path(iso_env))
    p = lhc(fake_claude, "--resume", SID, "-p", "hi")
    assert_refused(p, fake_claude, SID, "FIFO", "not a regular file")
    assert cc_lhc.Registry(cc_lhc.StateHome()).thread_for_session(SID) is None  # nothing adopted


def test_a_known_session_whose_transcript_became_a_fifo_is_refused(fake_claude, iso_env):
    path = transcript_path(iso_env)
    path.write_text(json.dumps({"type": "user", "uuid": "u1", "sessionId": SID,
                                "message": {"role": "user", "content": "hello"}}) + "\n")
    assert lhc(fake_claude, "--resume", SID, "-p", "hi").returncode == 0  # adopted
    fake_claude.argv_file.unlink()
    path.unlink()
    os.mkfifo(path)
    p = lhc(fake_claude, "--resume", SID, "-p", "again")
    assert_refused(p, fake_claude, SID, "FIFO")


def test_a_fifo_as_envelope_source_is_refused(fake_claude, iso_env, tmp_path):
    home = cc_lhc.StateHome()
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(SID, str(iso_env.work), "test")
    fifo = tmp_path / "envelope.jsonl"
    os.mkfifo(fifo)
    p = lhc(fake_claude, "rollout", "write", "--thread-id", thread, "--session-id",
            "22222222-2222-4333-8444-555555555555", "--envelope-from", str(fifo))
    assert_refused(p, fake_claude, "--envelope-from", "FIFO")


def test_open_regular_refuses_a_fifo_and_a_folder_at_once(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # run in a child: a regression that blocks on the FIFO then fails by timeout
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cc_lhc\n"
            "for path in sys.argv[2:]:\n"
            "    try: cc_lhc.open_regular(path)\n"
            "    except cc_lhc.NotRegularFile as e: print(e.reason)\n")
    out = subprocess.run([sys.executable, "-c", code, str(CC_LHC.parent), str(fifo), str(tmp_path)],
                         capture_output=True, text=True, timeout=TIMEOUT)
    assert out.stdout.splitlines() == ["is a FIFO (named pipe), not a regular file",
                                       "is a folder, not a regular file"], out.stderr


# -- 5. input Python's JSON and int readers choke on ------------------------------------

@pytest.mark.parametrize("content, words", [
    ("[" * 100_000, "nested deeper"),
    ('{"upperBoundTokens": ' + "9" * 5000 + "}", "too many digits"),
])
@pytest.mark.parametrize("where", ["user", "project"])
def test_config_that_python_cannot_read_falls_back(fake_claude, iso_env, content, words, where):
    path = user_config(iso_env) if where == "user" else iso_env.work / ".cc-lhc.json"
    path.write_text(content)
    p = lhc(fake_claude, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, str(path), words)


def test_a_transcript_nested_too_deep_on_its_first_line_is_adopted_not_a_crash(fake_claude, iso_env):
    path = transcript_path(iso_env)
    deep = "[" * 100_000 + "]" * 100_000
    path.write_text(deep + "\n" + json.dumps({"type": "user", "uuid": "u1", "sessionId": SID,
                                              "message": {"role": "user", "content": "hello"}}) + "\n")
    p = lhc(fake_claude, "--resume", SID, "-p", "hi")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert len(fake_claude.launches()) == 1
    thread = cc_lhc.Registry(cc_lhc.StateHome()).thread_for_session(SID)
    store = cc_lhc.ThreadStore(cc_lhc.StateHome(), thread)
    assert [m["text"] for m in store.messages()] == ["hello"]  # the line after it was captured


# -- 8. an option value that is another option --------------------------------------------

@pytest.mark.parametrize("argv, flag, value", [
    (["--lhc-target", "--resume", SID, "-p", "next"], "--lhc-target", "--resume"),
    (["--lhc-trigger", "-p", "hi"], "--lhc-trigger", "-p"),
    (["--lhc-min-runway", "--model", "x"], "--lhc-min-runway", "--model"),
    (["--lhc-profile", "--lhc-help"], "--lhc-profile", "--lhc-help"),
])
def test_an_lhc_flag_value_that_looks_like_an_option_is_refused(fake_claude, argv, flag, value):
    p = lhc(fake_claude, *argv)
    assert_refused(p, fake_claude, flag, repr(value), "looks like an option")


@pytest.mark.parametrize("argv, option", [
    (["measure", "x.jsonl", "--profile", "--target", "5000"], "--profile"),
    (["export", "abc", "--format", "--from", "t1"], "--format"),
    (["export", "abc", "--from", "--to", "t3"], "--from"),
    (["rollout", "write", "--thread-id", "abc", "--session-id", SID, "--cwd", "--envelope-from", "x"],
     "--cwd"),
    (["search", "--limit", "--from", "words"], "--limit"),
])
def test_a_command_option_value_that_looks_like_an_option_is_refused(fake_claude, argv, option):
    p = lhc(fake_claude, *argv)
    assert_refused(p, fake_claude, option, "looks like an option")


@pytest.mark.parametrize("argv", [["__watchdog", "1", "x"], ["__watchdog", "-1", "2"], ["__watchdog", "\u00b2", "1"],
                                  ["__watchdog", "9" * 20, "1"], ["__watchdog", "999999", "0"]])
def test_an_internal_command_given_nonsense_is_refused_without_a_traceback(fake_claude, argv):
    assert_refused(lhc(fake_claude, *argv), fake_claude, "two process ids")


def test_the_equals_form_still_carries_a_dash_value(iso_env):
    flags, rest = cc_lhc.parse_launch(["--lhc-min-runway=-1", "-p", "x"])
    assert flags == {"--lhc-min-runway": "-1"} and rest == ["-p", "x"]


# -- 9. token counts out of any sane range ------------------------------------------------

@pytest.mark.parametrize("value", [10 ** 30, cc_lhc.TOKEN_FIELD_MAX + 1])
def test_a_config_trigger_no_context_can_reach_falls_back(fake_claude, iso_env, value):
    user_config(iso_env).write_text(json.dumps({"upperBoundTokens": value, "profile": "balanced"}))
    p = lhc(fake_claude, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, "upperBoundTokens", "10,000,000")
    used = logged_policy(iso_env)
    assert used["upperBoundTokens"] == cc_lhc.BUILTIN_POLICY["upperBoundTokens"]
    assert used["profile"] == "balanced"  # the good field beside it still counts


def test_a_27_digit_trigger_flag_falls_back(fake_claude, iso_env):
    p = lhc(fake_claude, "--lhc-trigger", "9" * 27, "-p", "hi")
    assert_fell_back_and_ran(p, fake_claude, "--lhc-trigger", "upperBoundTokens")
    assert logged_policy(iso_env)["upperBoundTokens"] == cc_lhc.BUILTIN_POLICY["upperBoundTokens"]


@pytest.mark.parametrize("field", cc_lhc._TOKEN_FIELDS)
def test_every_token_field_has_the_same_range(field):
    assert "10,000,000" in cc_lhc._check_field(field, cc_lhc.TOKEN_FIELD_MAX + 1)
    assert cc_lhc._check_field(field, cc_lhc.TOKEN_FIELD_MAX) is None
    assert cc_lhc._check_field(field, cc_lhc.TOKEN_FIELD_MIN) is None


def test_measure_refuses_an_unreachable_target(fake_claude, tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("")
    p = lhc(fake_claude, "measure", str(path), "--target", str(10 ** 30))
    assert_refused(p, fake_claude, "--target", "10,000,000")


def test_panel_bounds_refuse_an_unreachable_trigger():
    policy = cc_lhc.resolve_policy([])
    session = types.SimpleNamespace(policy=policy, home=None)
    host = types.SimpleNamespace(size=lambda: (24, 80))
    panel = cc_lhc.ControlPanel(session, host, handoff=None)
    with pytest.raises(cc_lhc.LhcError) as e:
        panel.cmd_bounds(["150000", str(10 ** 27)])
    assert e.value.status == cc_lhc.EXIT_USAGE and "10,000,000" in str(e.value)
    assert policy["upperBoundTokens"] == cc_lhc.BUILTIN_POLICY["upperBoundTokens"]


def test_lhc_help_names_the_token_range_and_the_equals_form(fake_claude):
    p = lhc(fake_claude, "--lhc-help")
    assert p.returncode == 0
    assert "1 to 10,000,000" in p.stdout and "--lhc-target=VALUE" in p.stdout


def test_measure_names_a_file_that_is_no_transcript_and_one_that_is_empty(fake_claude, tmp_path):
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00 not json\nmore junk\n")
    (tmp_path / "empty.jsonl").write_bytes(b"")
    p = lhc(fake_claude, "measure", str(tmp_path / "bin.jsonl"))
    assert p.returncode == 1 and p.stdout == "" and "not a Claude Code transcript record" not in p.stderr
    assert "none of its lines is a Claude Code transcript record" in p.stderr
    p = lhc(fake_claude, "measure", str(tmp_path), "--json")
    assert p.returncode == 1 and "bin.jsonl" in p.stderr and "empty.jsonl holds no conversation" in p.stderr
    assert [s["messages"] for s in json.loads(p.stdout)["sessions"]] == [0]   # the empty one, counted


def test_measure_of_a_folder_holding_a_name_that_is_not_utf8_measures_the_rest(fake_claude, tmp_path):
    sample = (Path(__file__).parent / "fixtures" / "samples" / "02_tool_roundtrip_thinking.jsonl").read_bytes()
    (tmp_path / "good.jsonl").write_bytes(sample)
    (Path(os.fsdecode(bytes(tmp_path))) / os.fsdecode(b"caf\xe9.jsonl")).write_bytes(sample)
    p = lhc(fake_claude, "measure", str(tmp_path), "--json")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "its name is not UTF-8 text" in p.stderr
    assert [s["messages"] for s in json.loads(p.stdout)["sessions"]] == [6]


@pytest.mark.parametrize("content", [b'{"a": 1}\n{"b": 2}\n', b"QUJD" * 200_000, b'["type", "user"]\n'])
def test_measure_names_json_that_is_no_transcript(fake_claude, tmp_path, content):
    """Lines of JSON that Claude Code never writes (no record type, no uuid or session) are
    another file, not a session with no conversation yet."""
    (tmp_path / "other.jsonl").write_bytes(content)
    p = lhc(fake_claude, "measure", str(tmp_path / "other.jsonl"))
    assert p.returncode == 1 and p.stdout == ""
    assert "none of its lines is a Claude Code transcript record" in p.stderr


def test_measure_of_a_subagents_folder_says_to_measure_its_session(fake_claude, tmp_path):
    agents = tmp_path / "session" / "subagents"
    agents.mkdir(parents=True)
    (agents / "agent-a1.jsonl").write_text('{"type": "user", "uuid": "u1", "isSidechain": true}\n')
    p = lhc(fake_claude, "measure", str(agents))
    assert p.returncode == 2 and "holds only subagents' transcripts" in p.stderr


@pytest.mark.skipif(os.name != "posix" or (os.geteuid() == 0 and not shutil.which("setpriv")),
                    reason="root enters any folder, unless setpriv takes that power away")
@pytest.mark.parametrize("unfit", ["fifo", "dev-zero"])
def test_a_subagents_meta_file_that_is_no_file_neither_hangs_nor_fills_memory(fake_claude, tmp_path, unfit):
    """The .meta.json beside a subagent's file names the call that started it; a FIFO there
    (whose open waits for a writer) or a link to /dev/zero (which never ends) is no such
    file: the agent is linked by its prompt instead, and the session is measured."""
    session = "21390000-0000-4000-8000-000000000003"
    folder = tmp_path / "projects" / "p"
    shutil.copytree(REPO / "tests" / "fixtures" / "versions" / "2.1.39", folder)
    meta = folder / session / "subagents" / "agent-a2139one.meta.json"
    os.mkfifo(meta) if unfit == "fifo" else meta.symlink_to("/dev/zero")
    proc = lhc(fake_claude, "measure", str(folder / f"{session}.jsonl"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sessions"][0]["subagents"] >= 2


def test_stale_descriptor_and_lease_files_that_are_fifos_hang_neither_a_launch_nor_doctor(fake_claude, iso_env):
    """A FIFO named like a descriptor in runtime/ (swept at every launch) or like a lease's
    note in owners/ (which doctor reads) is never opened to wait for a writer."""
    home = Path(fake_claude.env["CC_LHC_HOME"])
    for folder in ("runtime", "owners"):
        (home / folder).mkdir(parents=True, exist_ok=True)
        os.mkfifo(home / folder / "stale.json")
    proc = lhc(fake_claude, "-p", "hello")
    assert proc.returncode == 0, proc.stderr
    assert not (home / "runtime" / "stale.json").exists()  # (no live owner named in it: swept)
    proc = lhc(fake_claude, "doctor")
    assert "leases" in proc.stdout and "Traceback" not in proc.stderr


def test_measure_of_a_folder_counts_a_linked_session_once_and_names_a_link_to_nothing(fake_claude, tmp_path):
    folder = tmp_path / "sessions"
    folder.mkdir()
    shutil.copy(REPO / "tests" / "fixtures" / "versions" / "2.1.39" / "21390000-0000-4000-8000-000000000003.jsonl",
                folder / "a.jsonl")
    (folder / "link.jsonl").symlink_to(folder / "a.jsonl")
    (folder / "dangling.jsonl").symlink_to(tmp_path / "gone.jsonl")
    proc = lhc(fake_claude, "measure", str(folder), "--json")
    assert proc.returncode == 1 and "dangling.jsonl" in proc.stderr and "link to nothing" in proc.stderr
    assert len(json.loads(proc.stdout)["sessions"]) == 1


def test_measure_of_a_file_in_a_folder_it_cannot_enter_says_so(fake_claude, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "t.jsonl").write_text("")
    locked.chmod(0)
    argv = [sys.executable, str(CC_LHC), "measure", str(locked / "t.jsonl")]
    if os.geteuid() == 0:  # (as root: without the capabilities that pass over permissions)
        argv = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
                "--bounding-set=-dac_override,-dac_read_search"] + argv
    try:
        p = subprocess.run(argv, env=fake_claude.env, cwd=fake_claude.cwd, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=TIMEOUT)
    finally:
        locked.chmod(0o700)
    assert p.returncode == 1 and "Permission denied" in p.stderr


# -- names that are not UTF-8, and a state folder that is not one -------------------------

NOT_UTF8 = os.fsdecode(b"caf\xe9-\xff")


def test_a_prompt_holding_bytes_that_are_not_utf8_still_reaches_claude(fake_claude, iso_env):
    p = lhc(fake_claude, "-p", "say " + NOT_UTF8)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert os.fsencode(NOT_UTF8) in os.fsencode(fake_claude.launches()[0]["argv"][-1])
    assert "launch" in (iso_env.lhc / "wrapper.log").read_text()  # logged, as an escape


@pytest.mark.parametrize("where", ["working folder", "CC_LHC_HOME", "CLAUDE_CONFIG_DIR"])
def test_a_folder_whose_name_is_not_utf8_is_refused_before_anything_is_written(fake_claude, iso_env, where):
    folder = (iso_env.work if where == "working folder" else iso_env.root) / NOT_UTF8
    folder.mkdir()
    env = {} if where == "working folder" else {where: str(folder)}
    p = lhc(fake_claude, "-p", "hi", cwd=folder if where == "working folder" else None, env=env)
    assert_refused(p, fake_claude, "not UTF-8 text", r"caf\xe9-\xff")
    assert not (iso_env.lhc / "registry.sqlite").exists()


@pytest.mark.parametrize("home", ["a file", "/dev/null"])
@pytest.mark.parametrize("args", [["-p", "hi"], ["threads"], ["search", "needle", "--all"]])
def test_a_state_folder_that_is_a_file_is_named_not_listed_as_empty(fake_claude, iso_env, home, args):
    if home == "a file":
        home = str(iso_env.root / "lhc-file")
        open(home, "w").close()
    p = lhc(fake_claude, *args, env={"CC_LHC_HOME": home})
    assert p.returncode == cc_lhc.EXIT_ERROR and p.stdout == "" and fake_claude.launches() == []
    assert p.stderr == f"cc-lhc: the state folder {home} is not a folder; point CC_LHC_HOME at a " \
                       "folder (cc-lhc doctor checks it)\n"
    p = lhc(fake_claude, "doctor", env={"CC_LHC_HOME": home})
    assert p.returncode == cc_lhc.EXIT_ERROR and f"{home} is not a folder" in p.stdout


@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-v"], ["--", "--help"], ["--lhc-version"]])
def test_help_and_version_answer_whatever_the_state_folder(fake_claude, iso_env, args):
    """Claude's --help and --version (and cc-lhc's own) keep nothing, so a state folder that
    is a file does not stop them (they printed "FileExistsError: ..." and never ran Claude)."""
    home = str(iso_env.root / "lhc-file")
    open(home, "w").close()
    p = lhc(fake_claude, *args, env={"CC_LHC_HOME": home})
    assert p.returncode == 0 and "Error" not in p.stderr, p.stderr
    if args != ["--lhc-version"]:
        assert [launch["argv"][-1] for launch in fake_claude.launches()] == [args[-1]]


def test_a_prompt_after_claudes_separator_is_no_question_for_help(fake_claude, iso_env):
    """`cc-lhc -p -- -v` asks Claude about "-v": a launch like any other, so the state folder
    is checked first (the -v let it skip that check)."""
    home = str(iso_env.root / "lhc-file")
    open(home, "w").close()
    p = lhc(fake_claude, "-p", "--", "-v", env={"CC_LHC_HOME": home})
    assert p.returncode == cc_lhc.EXIT_ERROR and fake_claude.launches() == []
    assert p.stderr == f"cc-lhc: the state folder {home} is not a folder; point CC_LHC_HOME at a " \
                       "folder (cc-lhc doctor checks it)\n"


def test_a_relative_state_folder_is_the_same_folder_for_claude_and_its_tools(fake_claude, iso_env):
    p = lhc(fake_claude, "-p", "hi", env={"CC_LHC_HOME": "rel-home"})
    assert p.returncode == 0, p.stderr
    (launch,) = fake_claude.launches()
    assert launch["env"]["CC_LHC_HOME"] == str(iso_env.work / "rel-home")
    assert (iso_env.work / "rel-home" / "registry.sqlite").exists()


def test_a_fifo_where_the_log_goes_neither_hangs_a_launch_nor_goes_unnamed(fake_claude, iso_env):
    os.mkfifo(iso_env.lhc / "wrapper.log")
    p = lhc(fake_claude, "-p", "hi")
    assert p.returncode == 0 and len(fake_claude.launches()) == 1, p.stderr
    p = lhc(fake_claude, "doctor")
    assert "[fail] log" in p.stdout and "is not a regular file" in p.stdout


def test_a_full_disk_is_the_error_a_transaction_reports(tmp_path):
    import sqlite3
    db = sqlite3.connect(tmp_path / "small.db", isolation_level=None)
    db.execute("CREATE TABLE t (x)")
    db.execute("PRAGMA max_page_count = 8")  # the database cannot grow past 8 pages
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        with cc_lhc.Tx(db):
            db.execute("INSERT INTO t VALUES (?)", (b"x" * 100_000,))
    assert not db.in_transaction and db.execute("SELECT count(*) FROM t").fetchone() == (0,)


def test_a_scratch_home_is_private_and_gone_after_its_command(tmp_path, monkeypatch):
    """measure's throwaway store lives in a folder of its own under the temporary folder,
    readable by no one else, and nothing of it stays, also when the command fails."""
    base = tmp_path / "tmp"
    base.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setenv("TEMP", str(base))
    with cc_lhc.ScratchHome("measure") as home:
        assert home.scratch and Path(home.root).parent == base
        if os.name == "posix":
            assert Path(home.root).stat().st_mode & 0o777 == 0o700
        store = cc_lhc.ThreadStore(home, "t")
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 0  # (a throwaway: never waits for the disk)
        store.close()
    kept = cc_lhc.ThreadStore(cc_lhc.StateHome(str(tmp_path / "state")), "t")
    assert kept.db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL for every other store
    kept.close()
    assert list(base.iterdir()) == []
    with pytest.raises(RuntimeError):
        with cc_lhc.ScratchHome("measure") as home:
            Path(home.ensure("threads"), "x").write_text("half made")
            raise RuntimeError("the command failed")
    assert list(base.iterdir()) == []
    path = REPO / "tests" / "fixtures"
    sample = next(p for p in sorted(path.rglob("*.jsonl")) if p.stat().st_size > 2000)
    assert cc_lhc.measure_transcript(str(sample), "default", 180_000)["messages"] > 0
    assert list(base.iterdir()) == []


@pytest.mark.parametrize("where", ["imports", "early", "late"])
def test_ctrl_c_while_the_program_loads_ends_quietly(where, tmp_path):
    """A ctrl-c while cc_lhc.py is still being loaded (its module body runs for a tenth of a
    second) ends the program with 130 and no traceback, as one during a command does. The
    signal is sent from inside the load: as its first modules are imported, at a line near
    its start, or near its end."""
    source = Path(CC_LHC).read_text(encoding="utf-8").splitlines()
    line = {"imports": source.index(next(x for x in source if x.startswith("import collections"))) + 1,
            "early": 120, "late": len(source) - 10}[where]
    driver = tmp_path / "driver.py"
    driver.write_text(f"""
import os, signal, sys
sys.path.insert(0, {str(Path(CC_LHC).parent)!r})
sent = []
def trace(frame, event, arg):
    if frame.f_code.co_filename.endswith("cc_lhc.py") and frame.f_code.co_name == "<module>":
        if event == "line" and frame.f_lineno >= {line} and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)
        return trace
    return None
sys.settrace(trace)
import cc_lhc
sys.settrace(None)
print("loaded", signal.getsignal(signal.SIGINT) is signal.default_int_handler)
""")
    p = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True,
                       stdin=subprocess.DEVNULL, timeout=60, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert p.returncode == 130, (p.returncode, p.stdout, p.stderr)
    assert p.stderr == "" and p.stdout == ""


def test_a_program_importing_cc_lhc_keeps_its_ctrl_c(tmp_path):
    """Once loaded, ctrl-c is a KeyboardInterrupt again (main() turns it into 130); a program
    that set its own handler before importing keeps it."""
    p = subprocess.run([sys.executable, "-c", f"""
import signal, sys
sys.path.insert(0, {str(Path(CC_LHC).parent)!r})
import cc_lhc
print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)
mine = lambda s, f: None
signal.signal(signal.SIGINT, mine)
import importlib; importlib.reload(cc_lhc)
print(signal.getsignal(signal.SIGINT) is mine)
"""], capture_output=True, text=True, timeout=60)
    assert p.stdout.split() == ["True", "True"], p.stderr


def test_a_thread_whose_launch_was_killed_before_claude_wrote_is_dropped_by_the_next(fake_claude, iso_env):
    """cc-lhc SIGKILLed while its Claude had written nothing: the thread it made holds
    nothing, and the next launch (in any folder) removes it, as the launch itself would
    have at its end (it stayed for good: an empty row in `threads`, a session Claude
    never had)."""
    import signal
    import time
    fake_claude.script([{"sleep": None}])
    p = subprocess.Popen([sys.executable, str(CC_LHC), "-p", "hi"], env=fake_claude.env, cwd=fake_claude.cwd,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + TIMEOUT
    while not fake_claude.launches() and time.monotonic() < deadline:
        time.sleep(0.05)
    [launch] = fake_claude.launches()
    p.kill()
    p.wait(TIMEOUT)
    os.kill(launch["pid"], signal.SIGKILL)
    listed = lhc(fake_claude, "threads", "--json")
    [left] = json.loads(listed.stdout)
    assert list((iso_env.lhc / "recovery").glob("new-thread-*.json"))
    # A later launch elsewhere, whose Claude writes its session: the empty thread goes.
    fake_claude.script([])
    elsewhere = iso_env.root / "elsewhere"
    elsewhere.mkdir()
    assert lhc(fake_claude, "-p", "again", cwd=elsewhere).returncode == 0
    assert left["id"] not in lhc(fake_claude, "threads", "--json").stdout
    assert not (iso_env.lhc / "threads" / f"{left['id']}.sqlite").exists()
    assert not list((iso_env.lhc / "recovery").glob("new-thread-*.json"))


def test_a_killed_launchs_thread_that_holds_turns_is_kept(fake_claude, iso_env):
    """The mark a killed launch leaves is only a question: a thread whose session Claude
    wrote is kept, and the mark goes."""
    import cc_lhc as lhc_module
    home = lhc_module.StateHome(str(iso_env.lhc))
    home.ensure()
    session = "12345678-1234-4234-8234-123456789abc"
    transcript = transcript_path(iso_env, session)
    transcript.write_text(json.dumps({"type": "user", "uuid": "u1", "sessionId": session,
                                      "message": {"role": "user", "content": "kept"}}) + "\n")
    registry = lhc_module.Registry(home)
    thread = registry.create_thread(session, str(iso_env.work), "fresh")
    lhc_module.mark_new_thread(home, (thread, session, str(transcript), None))
    registry.db.close()
    fake_claude.script([])
    assert lhc(fake_claude, "-p", "again").returncode == 0
    assert thread in lhc(fake_claude, "threads", "--json").stdout
    assert not list((iso_env.lhc / "recovery").glob("new-thread-*.json"))
