"""Context policy configuration: builtin < user < project < launch flags, and bad
configuration that falls back field by field, says so once, and never stops a session."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import cc_lhc
from conftest import CC_LHC

MSG = "Invalid compact configuration. Default configuration used. Please fix or update the configuration."
BUILTIN = cc_lhc.BUILTIN_POLICY


# -- helpers ------------------------------------------------------------------------------

def user_config(iso_env):
    return iso_env.xdg / "cc-lhc" / "config.json"


def write_user(iso_env, data) -> str:
    path = user_config(iso_env)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(path)


def write_project(folder, data) -> str:
    path = folder / ".cc-lhc.json"
    path.write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())
    return str(path)


def policy(cwd, *flags):
    """The policy a launch with these cc-lhc flags would use (in-process)."""
    parsed, _ = cc_lhc.parse_launch(list(flags))
    return cc_lhc.load_policy(str(cwd), cc_lhc.policy_flag_values(parsed))


def launch(fake, *args, cwd=None):
    p = subprocess.run([sys.executable, str(CC_LHC), *args], env=fake.env, cwd=cwd or fake.cwd,
                       capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    return p


def log_events(iso_env, event):
    path = iso_env.lhc / "wrapper.log"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []
    return [r for r in rows if r["event"] == event]


# -- precedence ---------------------------------------------------------------------------

def test_builtin_policy_when_nothing_is_configured(iso_env):
    p = policy(iso_env.work)
    assert p.values == BUILTIN and not p.fell_back
    assert (p["lowerBoundTokens"], p["upperBoundTokens"], p["minRunwayTokens"]) == (180_000, 360_000, 50_000)
    assert set(p.sources.values()) == {"builtin"}


def test_precedence_builtin_user_project_flags(iso_env):
    user = write_user(iso_env, {"lowerBoundTokens": 100_000, "upperBoundTokens": 300_000,
                                "profile": "balanced", "pruneEnabled": True})
    project = write_project(iso_env.work, {"upperBoundTokens": 320_000, "profile": "historical"})
    deep = iso_env.work / "src" / "pkg"
    deep.mkdir(parents=True)
    p = policy(deep, "--lhc-target", "90000")  # project file found from a subfolder
    assert not p.fell_back, p.problems
    assert p.values == {**BUILTIN, "lowerBoundTokens": 90_000, "upperBoundTokens": 320_000,
                        "profile": "historical", "pruneEnabled": True}
    assert p.sources["lowerBoundTokens"] == "launch flag --lhc-target"
    assert p.sources["upperBoundTokens"] == project
    assert p.sources["pruneEnabled"] == user
    assert p.sources["minRunwayTokens"] == "builtin"


def test_every_launch_flag_overrides_config(iso_env):
    write_project(iso_env.work, {"lowerBoundTokens": 100_000, "upperBoundTokens": 300_000,
                                 "minRunwayTokens": 20_000, "profile": "balanced"})
    p = policy(iso_env.work, "--lhc-target=150000", "--lhc-trigger", "400000",
               "--lhc-min-runway", "60000", "--lhc-profile", "historical")
    assert not p.fell_back, p.problems
    assert (p["lowerBoundTokens"], p["upperBoundTokens"], p["minRunwayTokens"], p["profile"]) == \
        (150_000, 400_000, 60_000, "historical")
    assert p.effective_target == 150_000


def test_nearest_project_file_wins(iso_env):
    write_project(iso_env.work, {"lowerBoundTokens": 100_000})
    inner = iso_env.work / "inner"
    inner.mkdir()
    nearest = write_project(inner, {"lowerBoundTokens": 120_000})
    p = policy(inner)
    assert (p["lowerBoundTokens"], p.sources["lowerBoundTokens"]) == (120_000, nearest)


def test_user_config_defaults_to_home_dot_config(iso_env, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    path = iso_env.home / ".config" / "cc-lhc" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": "balanced"}))
    p = policy(iso_env.work)
    assert (p["profile"], p.sources["profile"]) == ("balanced", str(path))


def test_effective_target_keeps_the_runway_clear_of_the_trigger(iso_env):
    p = policy(iso_env.work, "--lhc-target", "300000", "--lhc-trigger", "320000")
    assert not p.fell_back
    assert p.effective_target == 320_000 - 50_000


# -- per-field fallback -------------------------------------------------------------------

@pytest.mark.parametrize("layer, field, words", [
    ({"lowerBoundTokenz": 5}, "lowerBoundTokenz", "unknown field"),
    ({"upperBoundTokens": "400000"}, "upperBoundTokens", "positive whole number"),
    ({"upperBoundTokens": 400000.5}, "upperBoundTokens", "positive whole number"),
    ({"minRunwayTokens": True}, "minRunwayTokens", "positive whole number"),
    ({"lowerBoundTokens": 0}, "lowerBoundTokens", "positive whole number"),
    ({"pruneTargetTokens": -5}, "pruneTargetTokens", "positive whole number"),
    ({"profile": "fancy"}, "profile", "default, balanced, historical"),
    ({"profile": None}, "profile", "default, balanced, historical"),
    ({"pruneEnabled": "yes"}, "pruneEnabled", "true or false"),
    ({"nativeCompact": 1}, "nativeCompact", "true or false"),
])
@pytest.mark.parametrize("where", ["user", "project"])
def test_bad_field_falls_back_alone_naming_field_and_source(iso_env, layer, field, words, where):
    good = {"pruneThresholdTokens": 280_000} if field != "pruneThresholdTokens" else {}
    data = {**good, **layer}
    source = write_user(iso_env, data) if where == "user" else write_project(iso_env.work, data)
    p = policy(iso_env.work)
    assert p.fell_back
    assert len(p.problems) == 1, p.problems
    problem = p.problems[0]
    assert field in problem and source in problem and words in problem, problem
    if field in BUILTIN:
        assert (p[field], p.sources[field]) == (BUILTIN[field], "builtin")
    assert field not in p.values or field in BUILTIN  # an unknown field never gets in
    assert p["pruneThresholdTokens"] == 280_000  # the good field beside it still counts
    assert p.sources["pruneThresholdTokens"] == source


@pytest.mark.parametrize("value", ["\u0661\u0662\u0660\u0660\u0660\u0660", "\uff11\uff12\uff10\uff10\uff10\uff10",
                                   " 120000", "+120000"])
def test_a_launch_flag_number_is_ascii_digits(iso_env, value):
    """Other scripts' digits, a space or a plus sign are no number of a bound (int() took
    them); marked digit groups are."""
    p = policy(iso_env.work, f"--lhc-target={value}")
    assert p.fell_back and "lowerBoundTokens" in p.problems[0], p.problems
    assert p["lowerBoundTokens"] == BUILTIN["lowerBoundTokens"]
    for grouped in ("120,000", "120_000"):
        p = policy(iso_env.work, f"--lhc-target={grouped}")
        assert not p.fell_back and p["lowerBoundTokens"] == 120_000


@pytest.mark.parametrize("value", ["", "relative/xdg", "."])
def test_a_relative_xdg_config_home_is_ignored(iso_env, monkeypatch, value):
    """The XDG rules: a relative XDG_CONFIG_HOME is ignored, so the user config is
    ~/.config's wherever cc-lhc runs (it was read against the working folder)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", value)
    path = iso_env.home / ".config" / "cc-lhc" / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": "balanced"}))
    decoy = iso_env.work / "relative" / "xdg" / "cc-lhc" / "config.json"
    decoy.parent.mkdir(parents=True)
    decoy.write_text(json.dumps({"profile": "historical"}))
    (iso_env.work / "cc-lhc").symlink_to(decoy.parent)
    monkeypatch.chdir(iso_env.work)
    p = policy(iso_env.work)
    assert (p["profile"], p.sources["profile"]) == ("balanced", str(path))


@pytest.mark.parametrize("flags, field", [
    (["--lhc-target", "lots"], "lowerBoundTokens"),
    (["--lhc-trigger", "0"], "upperBoundTokens"),
    (["--lhc-min-runway=-1"], "minRunwayTokens"),  # the = form: a separate "-1" reads as an option
    (["--lhc-profile", "fancy"], "profile"),
])
def test_bad_launch_flag_falls_back_naming_it(iso_env, flags, field):
    below = {"lowerBoundTokens": 170_000, "upperBoundTokens": 370_000,
             "minRunwayTokens": 40_000, "profile": "balanced"}
    write_user(iso_env, {field: below[field]})
    p = policy(iso_env.work, *flags)
    assert len(p.problems) == 1 and field in p.problems[0] and flags[0].split("=")[0] in p.problems[0], p.problems
    # the field falls back to the builtin default, as the fallback message says, not to
    # the user file's value below the flag (that is not what the flag asked for either)
    assert (p[field], p.sources[field]) == (BUILTIN[field], "builtin")


def test_a_bad_project_value_falls_back_to_the_builtin_not_the_user_value(iso_env):
    write_user(iso_env, {"lowerBoundTokens": 100_000, "minRunwayTokens": 40_000})
    (iso_env.work / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": "bad"}))
    p = policy(iso_env.work)
    assert p.fell_back and len(p.problems) == 1 and "lowerBoundTokens" in p.problems[0]
    assert (p["lowerBoundTokens"], p.sources["lowerBoundTokens"]) == (BUILTIN["lowerBoundTokens"], "builtin")
    assert (p["minRunwayTokens"], p.sources["minRunwayTokens"]) == (40_000, str(user_config(iso_env)))
    # a flag above the bad layer still has its say
    assert policy(iso_env.work, "--lhc-target", "90000")["lowerBoundTokens"] == 90_000


@pytest.mark.parametrize("content, words", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe{}", "cannot read"),
    (b'["lowerBoundTokens", 1]', "JSON object"),
    (b"", "not valid JSON"),
])
@pytest.mark.parametrize("where", ["user", "project"])
def test_unparseable_file_falls_back_naming_it(iso_env, content, words, where):
    source = write_user(iso_env, content) if where == "user" else write_project(iso_env.work, content)
    p = policy(iso_env.work, "--lhc-profile", "balanced")
    assert p.fell_back and len(p.problems) == 1
    assert source in p.problems[0] and words in p.problems[0], p.problems
    assert p["profile"] == "balanced"  # the flags still apply
    assert p["lowerBoundTokens"] == BUILTIN["lowerBoundTokens"]


@pytest.mark.parametrize("where", ["user", "project"])
def test_unreadable_file_falls_back_naming_it(iso_env, where):
    # Tests may run as root, where chmod 000 still reads: a folder in place of the file
    # cannot be read by anyone.
    path = user_config(iso_env) if where == "user" else iso_env.work / ".cc-lhc.json"
    path.mkdir(parents=True)
    p = policy(iso_env.work)
    assert p.fell_back and len(p.problems) == 1
    assert str(path) in p.problems[0] and "cannot read" in p.problems[0], p.problems
    assert p.values == BUILTIN


def test_a_config_file_in_a_folder_that_cannot_be_looked_into_is_reported_not_skipped(iso_env, monkeypatch):
    """~/.config/cc-lhc made unsearchable (chmod 000, not root): lexists said no file, so the
    user's settings were left out without a word. It is reported as a file that cannot be read."""
    path = user_config(iso_env)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"profile": "balanced"}))
    real_lstat, real_read = os.lstat, cc_lhc.read_small_file

    def lstat(name, *args, **kwargs):  # (as the kernel answers a non-root user)
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_lstat(name, *args, **kwargs)

    def read(name, *args, **kwargs):
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(name, *args, **kwargs)
    monkeypatch.setattr(os, "lstat", lstat)
    monkeypatch.setattr(cc_lhc, "read_small_file", read)
    p = policy(iso_env.work)
    assert p.fell_back and len(p.problems) == 1, p.problems
    assert str(path) in p.problems[0] and "cannot read" in p.problems[0], p.problems


def test_utf8_bom_is_accepted(iso_env):
    write_project(iso_env.work, b"\xef\xbb\xbf" + json.dumps({"profile": "balanced"}).encode())
    p = policy(iso_env.work)
    assert not p.fell_back, p.problems
    assert p["profile"] == "balanced"


@pytest.mark.parametrize("lower, upper", [(400_000, 300_000), (300_000, 300_000)])
def test_target_not_below_trigger_both_fall_back(iso_env, lower, upper):
    source = write_project(iso_env.work, {"lowerBoundTokens": lower, "upperBoundTokens": upper,
                                          "profile": "balanced"})
    p = policy(iso_env.work)
    assert (p["lowerBoundTokens"], p["upperBoundTokens"]) == (180_000, 360_000)
    assert p["profile"] == "balanced"
    assert len(p.problems) == 1
    for word in ("lowerBoundTokens", "upperBoundTokens", source, str(lower)):
        assert word in p.problems[0], p.problems


def test_target_over_builtin_trigger_falls_back(iso_env):
    p = policy(iso_env.work, "--lhc-target", "500000")
    assert (p["lowerBoundTokens"], p["upperBoundTokens"]) == (180_000, 360_000)
    assert "launch flag --lhc-target" in p.problems[0] and "builtin" in p.problems[0]


def test_runway_not_below_trigger_both_fall_back(iso_env):
    source = write_user(iso_env, {"upperBoundTokens": 300_000, "minRunwayTokens": 300_000})
    p = policy(iso_env.work)
    assert (p["upperBoundTokens"], p["minRunwayTokens"]) == (360_000, 50_000)
    assert len(p.problems) == 1 and "minRunwayTokens" in p.problems[0] and source in p.problems[0]


def test_prune_target_not_below_threshold_both_fall_back(iso_env):
    write_user(iso_env, {"pruneTargetTokens": 300_000, "pruneThresholdTokens": 200_000})
    p = policy(iso_env.work)
    assert (p["pruneTargetTokens"], p["pruneThresholdTokens"]) == (150_000, 300_000)
    assert len(p.problems) == 1


def test_fallback_never_leaves_an_incoherent_policy(iso_env):
    # The trigger falls back with the bad runway; the target that was fine against the
    # configured trigger is not fine against the builtin one and must follow.
    write_user(iso_env, {"lowerBoundTokens": 370_000, "upperBoundTokens": 400_000,
                         "minRunwayTokens": 450_000})
    p = policy(iso_env.work)
    assert p["lowerBoundTokens"] < p["upperBoundTokens"]
    assert p["minRunwayTokens"] < p["upperBoundTokens"]
    assert p.values == BUILTIN
    assert len(p.problems) == 2


def test_problems_from_every_layer_are_all_named(iso_env):
    user = write_user(iso_env, {"colour": "blue"})
    project = write_project(iso_env.work, {"profile": 3})
    p = policy(iso_env.work, "--lhc-trigger", "x")
    text = "\n".join(p.problems)
    assert len(p.problems) == 3
    for word in ("colour", user, "profile", project, "upperBoundTokens", "--lhc-trigger"):
        assert word in text


# -- what the user sees at launch ---------------------------------------------------------

BAD_SETUPS = {
    "unknown field": lambda iso: write_user(iso, {"lowerBoundTokens": 170_000, "triggr": 1}),
    "wrong type": lambda iso: write_project(iso.work, {"upperBoundTokens": "400k"}),
    "unreadable file": lambda iso: (iso.xdg / "cc-lhc" / "config.json").mkdir(parents=True),
    "not json": lambda iso: write_project(iso.work, b"{'single': 'quotes'}"),
    "lower >= upper": lambda iso: write_project(iso.work, {"lowerBoundTokens": 400_000,
                                                           "upperBoundTokens": 390_000}),
    "everything at once": lambda iso: (write_user(iso, {"nope": 1}),
                                       write_project(iso.work, {"profile": "x"})),
}
EXPECT_NAMED = {
    "unknown field": ["triggr", "config.json"],
    "wrong type": ["upperBoundTokens", ".cc-lhc.json"],
    "unreadable file": ["config.json"],
    "not json": [".cc-lhc.json"],
    "lower >= upper": ["lowerBoundTokens", "upperBoundTokens", ".cc-lhc.json"],
    "everything at once": ["nope", "profile", "config.json", ".cc-lhc.json"],
}


@pytest.mark.parametrize("case", list(BAD_SETUPS))
@pytest.mark.parametrize("mode", [["-p", "hi"], []])
def test_bad_config_warns_once_logs_and_session_still_starts(fake_claude, iso_env, case, mode):
    BAD_SETUPS[case](iso_env)
    fake_claude.script([{"stderr": "CLAUDE-STARTED"}, {"print": "answer"}])
    p = launch(fake_claude, *mode)
    assert p.returncode == 0, p.stderr
    assert p.stderr.count(MSG) == 1, p.stderr
    assert MSG not in p.stdout and "answer" in p.stdout
    # (no terminal here, so with -p or without Claude is a plain child sharing our stderr:
    # the order shows the warning came first)
    assert p.stderr.index(MSG) < p.stderr.index("CLAUDE-STARTED")
    head = p.stderr[:p.stderr.index("CLAUDE-STARTED")]
    for word in EXPECT_NAMED[case]:
        assert word in head, f"{word!r} not named in:\n{head}"
    assert "Traceback" not in p.stderr
    launches = fake_claude.launches()
    assert len(launches) == 1 and launches[0]["env"]["DISABLE_AUTO_COMPACT"] == "1"
    logged = log_events(iso_env, "config_fallback")
    assert len(logged) == 1 and logged[0]["message"] == MSG
    assert any(EXPECT_NAMED[case][0] in problem for problem in logged[0]["problems"])


def test_bad_launch_flag_value_warns_and_session_starts(fake_claude, iso_env):
    p = launch(fake_claude, "--lhc-profile", "fancy", "-p", "hi")
    assert p.returncode == 0 and p.stderr.count(MSG) == 1
    assert "--lhc-profile" in p.stderr and "fancy" in p.stderr
    assert len(fake_claude.launches()) == 1


def test_good_config_prints_nothing(fake_claude, iso_env):
    write_user(iso_env, {"lowerBoundTokens": 150_000, "upperBoundTokens": 340_000,
                         "profile": "balanced", "pruneEnabled": False})
    write_project(iso_env.work, {"minRunwayTokens": 40_000})
    fake_claude.script([{"print": "answer"}])
    p = launch(fake_claude, "--lhc-trigger", "350000", "-p", "hi")
    assert (p.returncode, p.stdout, p.stderr) == (0, "answer\n", "")
    assert log_events(iso_env, "config_fallback") == []
    used = log_events(iso_env, "launch")[0]["policy"]
    assert used == {"lowerBoundTokens": 150_000, "upperBoundTokens": 350_000,
                    "minRunwayTokens": 40_000, "profile": "balanced"}


def test_launch_uses_the_fallback_values(fake_claude, iso_env):
    write_project(iso_env.work, {"lowerBoundTokens": 400_000, "upperBoundTokens": 390_000,
                                 "profile": "historical"})
    assert launch(fake_claude, "-p", "hi").returncode == 0
    used = log_events(iso_env, "launch")[0]["policy"]
    assert used == {"lowerBoundTokens": 180_000, "upperBoundTokens": 360_000,
                    "minRunwayTokens": 50_000, "profile": "historical"}


def test_control_characters_in_a_project_file_reach_no_terminal(iso_env):
    """A field name in a cloned project's .cc-lhc.json is anyone's: its escape sequences
    (a window title, a screen clear) are shown as text in the fallback's lines."""
    write_project(iso_env.work, {"\u001b]0;PWNED\u0007\u001b[2Jx": 1})
    p = policy(iso_env.work)
    [problem] = p.problems
    assert "\x1b" not in problem and "\x07" not in problem
    assert "\\x1b]0;PWNED\\x07\\x1b[2Jx" in problem


def test_doctor_checks_the_configuration_a_launch_here_would_read(iso_env, capsys, monkeypatch):
    """doctor said nothing of a configuration only a launch (or measure) found wrong."""
    monkeypatch.chdir(iso_env.work)
    write_project(iso_env.work, json.dumps({"profile": "nonsense"}).encode())
    cc_lhc.main(["doctor"])
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "] configuration" in line)
    assert line.startswith("[warn] configuration") and "profile" in line and ".cc-lhc.json" in line, out
    write_project(iso_env.work, json.dumps({"profile": "balanced"}).encode())
    cc_lhc.main(["doctor"])
    out = capsys.readouterr().out
    assert "[  ok] configuration: the files a launch here reads are valid" in out, out
