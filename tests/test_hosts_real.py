"""cc-lhc's hosts with the real Claude Code CLI as the child (against the fake API), and
with tests/fake_claude.py where the real CLI cannot show what the wrapper did."""

from __future__ import annotations

import json
import re
import selectors
import subprocess
import sys
import threading
import uuid

import pytest

import cc_lhc
from conftest import CC_LHC
from fakeapi import DEFAULT_TEXT, error_reply, user_texts

PROMPT = re.compile(r"^❯", re.M)  # the real CLI's input line, drawn once it takes input

# Fields of `claude -p --output-format json` that differ between any two runs.
VOLATILE = {"session_id", "uuid", "total_cost_usd", "costUSD"}


def comparable(value):
    """A result object without its per-run fields (ids, timings, cost)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()
                if k not in VOLATILE and not k.endswith("_ms")}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def session_id_after(argv: list[str]) -> str | None:
    for i, arg in enumerate(argv):
        if arg == "--session-id" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--session-id="):
            return arg.split("=", 1)[1]
    return None


def is_uuid(text: str | None) -> bool:
    try:
        return str(uuid.UUID(text)) == text
    except (TypeError, ValueError):
        return False


# -- one-shot -----------------------------------------------------------------------------

def test_oneshot_json_is_what_claude_prints(real_claude):
    args = ("-p", "hello", "--output-format", "json")
    direct = real_claude.run_claude(*args)
    n_direct = len(real_claude.api.message_requests)
    wrapped = real_claude.run_lhc(*args)
    assert (wrapped.returncode, direct.returncode) == (0, 0), wrapped.stderr
    ours, theirs = json.loads(wrapped.stdout), json.loads(direct.stdout)  # stdout is only JSON
    assert ours["result"] == DEFAULT_TEXT
    assert comparable(ours) == comparable(theirs)
    # the wrapped run is its own session, and its requests say so
    wrapped_requests = real_claude.api.message_requests[n_direct:]
    assert wrapped_requests
    assert {r["session_id"] for r in wrapped_requests} == {ours["session_id"]}
    assert ours["session_id"] != theirs["session_id"]
    assert f"{ours['session_id']}.jsonl" in [p.name for p in real_claude.transcripts()]


def test_no_session_persistence_runs_unmanaged(real_claude):
    """The real CLI writes no transcript here: cc-lhc says so once and keeps no thread."""
    p = real_claude.run_lhc("--no-session-persistence", "-p", "hello", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"] == DEFAULT_TEXT
    assert "cannot capture" in p.stderr and "Traceback" not in p.stderr
    assert real_claude.transcripts() == []
    listed = real_claude.run_lhc("threads", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout or "[]") == []


def test_oneshot_api_error_exit_status_passes_through(real_claude):
    # The CLI retries a 400 a few times, then reports it and exits 1.
    real_claude.api.responder = lambda body: error_reply(400, "invalid request from the fake API")
    args = ("-p", "hello", "--output-format", "json")
    direct = real_claude.run_claude(*args)
    wrapped = real_claude.run_lhc(*args)
    assert direct.returncode == 1
    assert wrapped.returncode == direct.returncode, wrapped.stderr
    ours, theirs = json.loads(wrapped.stdout), json.loads(direct.stdout)
    assert ours["is_error"] is True and "invalid request from the fake API" in ours["result"]
    assert comparable(ours) == comparable(theirs)


def test_oneshot_stream_json_passes_through_line_by_line(real_claude):
    args = ("-p", "hello", "--output-format", "stream-json", "--verbose")
    direct = real_claude.run_claude(*args)
    assert direct.returncode == 0, direct.stderr
    kinds = [(e["type"], e.get("subtype")) for e in map(json.loads, direct.stdout.splitlines())]

    # Hold the API reply: the init line must reach our stdout while Claude still waits,
    # so a wrapper that buffers until the child exits fails here.
    release = threading.Event()
    real_claude.api.push({"text": DEFAULT_TEXT, "hold": release})
    n_before = len(real_claude.api.message_requests)
    proc = subprocess.Popen(real_claude.lhc_argv(*args), env=real_claude.env,
                            cwd=real_claude.cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        real_claude.api.wait_for_requests(n_before + 1, answered=False)
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(timeout=20), "no stream-json line while the request was in flight"
        first = json.loads(proc.stdout.readline())
        assert (first["type"], first.get("subtype")) == ("system", "init")
    finally:
        release.set()
        rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    events = [first, *map(json.loads, rest.splitlines())]
    assert [(e["type"], e.get("subtype")) for e in events] == kinds
    assert events[-1]["result"] == DEFAULT_TEXT


def test_oneshot_prompt_from_piped_stdin(real_claude):
    p = real_claude.run_lhc("-p", "--output-format", "json", input="hi from a pipe\n")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"] == DEFAULT_TEXT
    [request] = real_claude.api.message_requests
    assert any("hi from a pipe" in text for text in user_texts(request["body"]))


# -- interactive --------------------------------------------------------------------------

def test_interactive_prompt_resize_exit_and_terminal_restored(real_claude, tmux):
    real_claude.api.script(["First reply.", "Second reply, after the resize."])
    t = tmux([sys.executable, CC_LHC], cols=100, rows=30, env=real_claude.env,
             cwd=real_claude.cwd)
    screen = t.wait_for(PROMPT)
    assert re.search(r"^─{100}$", screen, re.M), screen  # Claude drew for our width
    t.send_text("say hi")
    t.send_keys("Enter")
    t.wait_for("First reply.")
    # Wider, so old lines cannot match: a 120-wide rule proves Claude re-rendered.
    t.resize(120, 32)
    t.wait_for(re.compile(r"^─{120}$", re.M))
    t.send_text("and again")
    t.send_keys("Enter")
    t.wait_for("Second reply, after the resize.")
    t.send_text("/exit")
    t.send_keys("Enter")
    assert t.wait_exit() == 0
    assert t.stty_before == t.stty_after, t.stty_after_all
    requests = real_claude.api.message_requests
    assert len(requests) == 2 and is_uuid(requests[0]["session_id"])
    assert f"{requests[0]['session_id']}.jsonl" in [p.name for p in real_claude.transcripts()]


def test_interactive_child_sees_size_and_resize(fake_claude, tmux):
    fake_claude.script([{"size": True}, {"winch": True}, {"print": "ready"}, {"echo": True},
                        {"exit": 5}])
    t = tmux([sys.executable, CC_LHC], cols=90, rows=25, env=fake_claude.env,
             cwd=fake_claude.cwd)
    t.wait_for("ready")
    assert "SIZE 90x25" in t.capture()
    t.resize(70, 20)
    t.wait_for("WINCH 70x20")
    t.send_text("typed through the relay")
    t.send_keys("Enter")
    t.wait_for("ECHO typed through the relay")
    t.send_keys("C-d")
    assert t.wait_exit() == 5  # Claude's status is the wrapper's status
    assert t.stty_before == t.stty_after, t.stty_after_all
    launch = fake_claude.launches()[0]
    assert launch["tty"] == {"stdin": True, "stdout": True, "stderr": True}


def test_interactive_fresh_launch_gets_session_id_and_no_autocompact(fake_claude, tmux):
    t = tmux([sys.executable, CC_LHC], env=fake_claude.env, cwd=fake_claude.cwd)
    assert t.wait_exit() == 0
    launch = fake_claude.launches()[0]
    assert is_uuid(session_id_after(launch["argv"])), launch["argv"]
    assert launch["env"].get("DISABLE_AUTO_COMPACT") == "1"


# -- what the wrapper hands the child (seen by the stand-in) -------------------------------

def test_oneshot_child_env_and_session_id(fake_claude):
    p = fake_claude.run_lhc("-p", "hello")
    assert p.returncode == 0, p.stderr
    launch = fake_claude.launches()[0]
    assert launch["env"].get("DISABLE_AUTO_COMPACT") == "1"
    assert is_uuid(session_id_after(launch["argv"])), launch["argv"]
    assert launch["argv"].count("--session-id") == 1
    assert "-p" in launch["argv"] and "hello" in launch["argv"]
    assert launch["tty"]["stdout"] is False  # a one-shot child is a plain process


@pytest.mark.parametrize("flag", [["--autocompact", "auto"], ["--autocompact=200000"]])
def test_autocompact_flag_keeps_native_compact(fake_claude, flag):
    p = fake_claude.run_lhc(*flag, "-p", "hello")
    assert p.returncode == 0, p.stderr
    launch = fake_claude.launches()[0]
    assert "DISABLE_AUTO_COMPACT" not in launch["env"]
    argv = launch["argv"]
    i = argv.index(flag[0])  # the user's flag reaches Claude unchanged
    assert argv[i:i + len(flag)] == flag


def test_explicit_session_id_is_used_as_given(fake_claude):
    wanted = str(uuid.uuid4())
    p = fake_claude.run_lhc("--session-id", wanted, "-p", "hello")
    assert p.returncode == 0, p.stderr
    launch = fake_claude.launches()[0]
    assert session_id_after(launch["argv"]) == wanted
    assert launch["argv"].count("--session-id") == 1


@pytest.mark.parametrize("status", [0, 3, 42])
def test_oneshot_exit_status_passes_through(fake_claude, status):
    fake_claude.script([{"print": "claude says hi"}, {"exit": status}])
    p = fake_claude.run_lhc("-p", "hello")
    assert p.returncode == status, p.stderr
    assert p.stdout == "claude says hi\n"


def test_a_session_sent_to_the_background_keeps_claudes_own_compaction(real_claude):
    """--bg: Claude's daemon runs the session after cc-lhc has ended. It must not inherit
    cc-lhc's switch-off of Claude's own compaction (nor a descriptor of a cc-lhc that is
    gone): with it, the session had no compaction of any kind."""
    import time
    from pathlib import Path
    from realcli import end_all_of_this_test, running
    real_claude.api.responder = lambda body: DEFAULT_TEXT
    p = real_claude.run_lhc("--bg", "do the thing")
    try:
        assert p.returncode == 0, p.stderr
        assert cc_lhc.MSG_BACKGROUND in p.stderr and "Traceback" not in p.stderr
        deadline = time.monotonic() + 30
        while not running("daemon") and time.monotonic() < deadline:
            time.sleep(0.1)
        daemons = running("daemon")
        assert daemons, "no background daemon of Claude's to look at"
        for pid in daemons:
            raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            env = dict(x.decode("utf-8", "replace").split("=", 1) for x in raw if b"=" in x)
            assert "DISABLE_AUTO_COMPACT" not in env and cc_lhc.RUNTIME_ENV not in env
    finally:
        end_all_of_this_test()  # (the daemon and what it started, under no process of ours)
