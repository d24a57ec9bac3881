"""The test rig proves itself: the fake API, the stand-in CLI, tmux driving, and the real
Claude Code CLI running isolated against the fake API (no cc-lhc involved here)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKE_CLAUDE, REAL_HOME, TESTS, project_slug
from fakeapi import DEFAULT_TEXT, FakeAPI, block_text, error_reply, tool_results, user_texts

PROMPT = re.compile(r"^❯", re.M)  # the real CLI's input line, drawn once it takes input


# -- helpers ------------------------------------------------------------------------------

def post(api: FakeAPI, body: dict, path: str = "/v1/messages?beta=true",
         headers: dict | None = None) -> tuple[int, str, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=10)
    conn.request("POST", path, json.dumps(body),
                 {"content-type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("content-type", ""), data


def sse_events(data: bytes) -> list[tuple[str, dict]]:
    events = []
    for chunk in data.decode().split("\n\n"):
        if chunk.strip():
            lines = dict(line.split(": ", 1) for line in chunk.splitlines())
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# -- the fake API -------------------------------------------------------------------------

def test_fake_api_streams_every_block_kind(fake_api):
    fake_api.script([{"content": [
        {"type": "thinking", "thinking": "let me think", "signature": "sig-1"},
        {"type": "text", "text": "x" * 100},
        {"type": "tool_use", "name": "Bash", "input": {"command": "ls"}}],
        "usage": {"input_tokens": 370000, "cache_read_input_tokens": 5}}])
    status, ctype, data = post(fake_api, {"model": "m1", "stream": True, "messages": [
        {"role": "system", "content": "env"}, {"role": "user", "content": "hi"}]},
        headers={"x-claude-code-session-id": "sess-1"})
    assert status == 200 and ctype.startswith("text/event-stream")
    events = sse_events(data)
    names = [name for name, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 3
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert "".join(d.get("thinking", "") for d in deltas) == "let me think"
    assert {"type": "signature_delta", "signature": "sig-1"} in deltas
    assert "".join(d.get("text", "") for d in deltas) == "x" * 100
    assert json.loads("".join(d.get("partial_json", "") for d in deltas)) == {"command": "ls"}
    start = events[0][1]["message"]
    assert start["model"] == "m1"
    tool_start = [d for n, d in events if n == "content_block_start"][2]["content_block"]
    assert tool_start["id"].startswith("toolu_") and tool_start["name"] == "Bash"
    final = events[-2][1]
    assert final["delta"]["stop_reason"] == "tool_use"
    assert final["usage"]["input_tokens"] == 370000
    assert final["usage"]["cache_read_input_tokens"] == 5
    assert final["usage"]["output_tokens"] == 10  # defaults fill what the script left out
    [req] = fake_api.requests
    assert req["session_id"] == "sess-1" and req["query"] == "beta=true"
    assert req["body"]["messages"][0]["role"] == "system"


def test_fake_api_plain_json_default_reply_and_responder(fake_api):
    status, ctype, data = post(fake_api, {"model": "m", "messages": []})
    assert status == 200 and ctype == "application/json"
    msg = json.loads(data)
    assert msg["content"] == [{"type": "text", "text": DEFAULT_TEXT}]
    assert msg["stop_reason"] == "end_turn"
    fake_api.responder = lambda body: "echo: " + user_texts(body)[-1]
    msg = json.loads(post(fake_api, {"messages": [{"role": "user", "content": "ping"}]})[2])
    assert msg["content"][0]["text"] == "echo: ping"
    fake_api.push(lambda body: None)  # a queued callable with no opinion gets the default
    msg = json.loads(post(fake_api, {"messages": []})[2])
    assert msg["content"][0]["text"] == DEFAULT_TEXT


def test_fake_api_errors_and_other_paths(fake_api):
    fake_api.push(error_reply(400, "prompt is too long: 300000 tokens > 200000 maximum"))
    status, _, data = post(fake_api, {"stream": True, "messages": []})
    assert status == 400
    assert json.loads(data) == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 300000 tokens > 200000 maximum"}}
    status, _, data = post(fake_api, {}, path="/v1/complete")
    assert status == 404 and json.loads(data)["error"]["type"] == "not_found_error"
    status, _, data = post(fake_api, {"messages": []}, path="/v1/messages/count_tokens")
    assert status == 200 and json.loads(data)["input_tokens"] > 0
    for method in ("GET", "HEAD"):
        conn = http.client.HTTPConnection("127.0.0.1", fake_api.port, timeout=10)
        conn.request(method, "/")
        assert conn.getresponse().status == 200
        conn.close()
    assert [r["kind"] for r in fake_api.requests] == ["messages", "other", "count_tokens"]


def test_fake_api_runs_standalone():
    proc = subprocess.Popen([sys.executable, str(TESTS / "fakeapi.py"), "--port", "0",
                             "--reply", "standalone says hi"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = re.search(r"http://127\.0\.0\.1:(\d+)", proc.stdout.readline())
        conn = http.client.HTTPConnection("127.0.0.1", int(url.group(1)), timeout=10)
        conn.request("POST", "/v1/messages", json.dumps({"messages": []}))
        assert json.loads(conn.getresponse().read())["content"][0]["text"] == "standalone says hi"
    finally:
        proc.terminate()
        proc.wait(10)


# -- the stand-in CLI and tmux ------------------------------------------------------------

def test_fake_claude_records_launch_and_exits_as_told(fake_claude):
    fake_claude.script([{"print": "hi"}, {"stderr": "oops"}, {"exit": 7}])
    p = fake_claude.run([FAKE_CLAUDE, "--session-id", "abc", "-p", "x"],
                        env={"DISABLE_AUTO_COMPACT": "1"})
    assert (p.returncode, p.stdout, p.stderr) == (7, "hi\n", "oops\n")
    fake_claude.script({"signal": "TERM"})
    assert fake_claude.run([FAKE_CLAUDE]).returncode == -15
    fake_claude.script([{"burst": 300_000}])
    assert len(fake_claude.run([FAKE_CLAUDE]).stdout) == 300_000
    fake_claude.script([{"echo": True}])
    assert fake_claude.run([FAKE_CLAUDE], input="a\nb\n").stdout == "ECHO a\nECHO b\n"
    first = fake_claude.launches()[0]
    assert first["argv"] == ["--session-id", "abc", "-p", "x"]
    assert first["env"]["DISABLE_AUTO_COMPACT"] == "1"
    assert first["env"]["CC_LHC_HOME"] == os.environ["CC_LHC_HOME"]
    assert len(fake_claude.launches()) == 4


def test_fake_claude_transcript_step(fake_claude, iso_env):
    fake_claude.script({"transcript": {"path": "{config_dir}/projects/x/{session_id}.jsonl",
                                       "record": {"type": "user", "n": 1}}})
    assert fake_claude.run([FAKE_CLAUDE, "--resume", "s1"]).returncode == 0
    assert read_jsonl(iso_env.config / "projects/x/s1.jsonl") == [{"type": "user", "n": 1}]


def test_tmux_sees_size_resize_exit_status_and_terminal_mode(tmux, fake_claude):
    fake_claude.script([{"size": True}, {"winch": True}, {"print": "ready"}, {"echo": True},
                        {"exit": 3}])
    t = tmux([FAKE_CLAUDE], cols=90, rows=25, env=fake_claude.env, cwd=fake_claude.cwd)
    t.wait_for("ready")
    assert "SIZE 90x25" in t.capture()
    t.resize(70, 20)
    t.wait_for("WINCH 70x20")
    t.send_text("typed line")
    t.send_keys("Enter")
    t.wait_for("ECHO typed line")
    t.send_keys("C-d")
    assert t.wait_exit() == 3
    assert t.stty_before == t.stty_after
    assert fake_claude.launches()[0]["tty"] == {"stdin": True, "stdout": True, "stderr": True}


def test_project_slug_rule():
    assert project_slug("/home/u/my proj") == "-home-u-my-proj"
    assert project_slug("/a/b.c_d") == "-a-b-c-d"
    long = project_slug("/x" * 150)
    assert len(long) > 200 and long[:200] == "-x" * 100 and re.fullmatch(r"-[0-9a-z]+", long[200:])


# -- the real CLI, isolated, against the fake API -----------------------------------------

def test_real_cli_print_json_round_trip(real_claude):
    p = real_claude.run_claude("-p", "hello", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["result"] == DEFAULT_TEXT and out["is_error"] is False
    session = out["session_id"]
    requests = real_claude.api.message_requests
    assert requests and all(r["session_id"] == session for r in requests)
    assert any("hello" in text for text in user_texts(requests[-1]["body"]))
    # the transcript lands in the isolated config dir under the slug of the cwd
    [transcript] = real_claude.transcripts()
    assert transcript.name == f"{session}.jsonl"
    assistant = [r for r in read_jsonl(transcript) if r.get("type") == "assistant"]
    assert assistant[-1]["message"]["content"] == [{"type": "text", "text": DEFAULT_TEXT}]
    # and nothing in the developer's real ~/.claude
    real_projects = REAL_HOME / ".claude" / "projects"
    assert not (real_projects / project_slug(real_claude.cwd)).exists()
    assert not list(real_projects.glob(f"*/{session}.jsonl"))
    assert not (REAL_HOME / ".claude.json").exists() or session not in (
        REAL_HOME / ".claude.json").read_text()


def test_real_cli_tool_round_trip_with_thinking(real_claude):
    api = real_claude.api
    api.script([
        {"content": [{"type": "thinking", "thinking": "I should run it.", "signature": "sig-A"},
                     {"type": "tool_use", "id": "toolu_rig_1", "name": "Bash",
                      "input": {"command": "echo rig-$((6*7))", "description": "multiply"}}],
         "usage": {"input_tokens": 370000}},
        lambda body: "Saw: " + block_text(tool_results(body)[0]),
    ])
    p = real_claude.run_claude("-p", "run it", "--output-format", "json", "--allowedTools", "Bash")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["result"] == "Saw: rig-42"
    first, second = api.message_requests
    [result] = tool_results(second["body"])
    assert result["tool_use_id"] == "toolu_rig_1" and block_text(result) == "rig-42"
    # the signed thinking block is sent back verbatim with the turn
    sent_back = [m for m in second["body"]["messages"] if m["role"] == "assistant"][-1]["content"]
    assert {"type": "thinking", "thinking": "I should run it.", "signature": "sig-A"} in sent_back
    records = read_jsonl(real_claude.transcripts()[0])
    usage = [r["message"]["usage"]["input_tokens"] for r in records if r.get("type") == "assistant"]
    assert 370000 in usage  # the fake usage is believed verbatim


@pytest.mark.parametrize("exit_keys", ["/exit", "ctrl-d twice"])
def test_real_cli_interactive_in_tmux(real_claude, tmux, exit_keys):
    t = tmux([real_claude.claude], cols=100, rows=30, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    t.send_text("say hi")
    t.send_keys("Enter")
    t.wait_for(DEFAULT_TEXT)
    if exit_keys == "/exit":
        t.send_text("/exit")
        t.send_keys("Enter")
    else:
        t.send_keys("C-d")
        t.wait_for("Press Ctrl-D again to exit")
        t.send_keys("C-d")
    assert t.wait_exit() == 0
    assert t.stty_before == t.stty_after, t.stty_after_all
    [request] = real_claude.api.message_requests
    assert any("say hi" in text for text in user_texts(request["body"]))
    [transcript] = real_claude.transcripts()
    assert transcript.stem == request["session_id"]
