"""Capture, part 3: through the real Claude Code CLI, with cc-lhc in front of it.

Every test runs ``cc-lhc`` as a user would (``python3 cc_lhc.py ...``) against the pinned
real CLI talking to the fake API, then reads the result back with ``cc-lhc threads`` and
``cc-lhc export``.
"""

from __future__ import annotations

import io
import json
import re
from contextlib import redirect_stderr, redirect_stdout

import cc_lhc
from fakeapi import block_text, tool_results, user_texts


# -- helpers ------------------------------------------------------------------------------

def lhc(rc, *args, ok=True, **kw):
    p = rc.run_lhc(*args, **kw)
    if ok:
        assert p.returncode == 0, f"cc-lhc {' '.join(args)} -> {p.returncode}\n{p.stderr}"
    return p


def read_in_process(*args: str) -> str:
    """`cc-lhc threads/export ...` run in this process (same CC_LHC_HOME): fast reads
    between launches. The launches themselves, and some reads, run as real processes."""
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = cc_lhc.main(list(args))
    assert status == 0, err.getvalue()
    return out.getvalue()


def threads(rc) -> list[dict]:
    return json.loads(read_in_process("threads", "--json"))


def export(rc, prefix: str, *extra: str) -> list[dict]:
    return json.loads(read_in_process("export", prefix, "--format", "json", *extra))


def conversation(records: list[dict]) -> list[tuple]:
    """What a reader cares about in an export: who said what, in order."""
    out = []
    for r in records:
        if r["kind"] in ("user_text", "assistant_text"):
            out.append((r["kind"], r["text"]))
        elif r["kind"] == "thinking":
            out.append(("thinking", r["text"], r["signature"]))
        elif r["kind"] == "tool_call":
            out.append(("tool_call", r["tool"], r["input"]["command"], r["tool_use_id"]))
        elif r["kind"] == "tool_result":
            out.append(("tool_result", block_text({"content": r["output"]}), r["tool_use_id"]))
    return out


def transcript_uuids(path) -> list[str]:
    return [json.loads(line).get("uuid") for line in path.read_text().splitlines() if line.strip()]


# -- one thread across several launches ----------------------------------------------------

def test_prompts_and_resumes_give_one_thread_holding_everything_in_order(real_claude):
    rc, api = real_claude, real_claude.api
    api.script(["first reply ✓"])
    p = lhc(rc, "-p", "first prompt — ünïcødé", "--output-format", "json")
    session = json.loads(p.stdout)["session_id"]
    [row] = threads(rc)
    assert row["current_session"] == session
    thread = row["id"]

    api.script([
        {"content": [{"type": "thinking", "thinking": "Run it with Bash.", "signature": "c2lnLXJlYWw="},
                     {"type": "tool_use", "id": "toolu_real_1", "name": "Bash",
                      "input": {"command": "echo real-$((6*7))", "description": "multiply"}}]},
        lambda body: "Saw: " + block_text(tool_results(body)[0]),
    ])
    p = lhc(rc, "--resume", session, "-p", "second prompt: run the tool", "--allowedTools", "Bash")
    assert p.stdout.strip() == "Saw: real-42"
    api.script(["third reply"])
    lhc(rc, f"-r{session}", "-p", "third prompt")  # the short option's value written onto it
    # every request of every launch went to the one session
    assert {r["session_id"] for r in api.message_requests} == {session}

    # read back as a user would, by real cc-lhc processes
    [row] = json.loads(lhc(rc, "threads", "--json").stdout)
    records = json.loads(lhc(rc, "export", thread[:8], "--format", "json").stdout)
    assert records == export(rc, thread)
    assert conversation(records) == [
        ("user_text", "first prompt — ünïcødé"),
        ("assistant_text", "first reply ✓"),
        ("user_text", "second prompt: run the tool"),
        ("thinking", "Run it with Bash.", "c2lnLXJlYWw="),
        ("tool_call", "Bash", "echo real-$((6*7))", "toolu_real_1"),
        ("tool_result", "real-42", "toolu_real_1"),
        ("assistant_text", "Saw: real-42"),
        ("user_text", "third prompt"),
        ("assistant_text", "third reply"),
    ]
    assert len(records) == 9  # nothing else, nothing twice
    # labels are stable and in order; each prompt opened a turn
    assert [r["label"] for r in records] == [f"m{i}" for i in range(1, len(records) + 1)]
    prompt_turns = [r["turn"] for r in records if r["kind"] == "user_text"]
    assert prompt_turns == ["t1", "t2", "t3"]
    assert all(r["source_session"] == session for r in records)
    [path] = rc.transcripts()
    assert {r["source_uuid"] for r in records} <= set(transcript_uuids(path))

    # cc-lhc threads: the fields a user reads
    assert row["id"] == thread and row["cwd"] == str(rc.cwd)
    assert row["current_session"] == session
    assert row["turns"] == 3 and row["messages"] == len(records)
    assert row["captured_bytes"] == path.stat().st_size
    assert row["degraded"] is False and not row["degraded_reason"]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", row["last_activity"])
    listing = lhc(rc, "threads").stdout
    [line] = [ln for ln in listing.splitlines() if ln.startswith(thread[:8])]
    assert session in line and str(rc.cwd) in line and "DEGRADED" not in line

    # --from/--to select whole turns; markdown is a readable transcript with labels
    t2 = export(rc, thread, "--from", "t2", "--to", "t2")
    assert [r["label"] for r in t2] == [r["label"] for r in records if r["turn"] == "t2"]
    assert conversation(t2)[0] == ("user_text", "second prompt: run the tool")
    assert [r["turn"] for r in export(rc, thread, "--from", "3")] == ["t3", "t3"]
    assert {r["turn"] for r in export(rc, thread, "--to", "t1")} == {"t1"}
    md = lhc(rc, "export", thread[:8], "--format", "markdown").stdout
    for needle in ("## t1", "## t2", "## t3", "first prompt — ünïcødé", "first reply ✓",
                   "tool call Bash", "toolu_real_1", "real-42", "Saw: real-42", "third reply",
                   "Run it with Bash."):
        assert needle in md, needle
    assert md.index("first prompt") < md.index("real-42") < md.index("third prompt")
    labels = re.findall(r"\bm(\d+)\b", md)
    assert sorted(set(map(int, labels))) == list(range(1, len(records) + 1))
    md2 = read_in_process("export", thread[:8], "--format", "markdown", "--from", "t3")
    assert "third prompt" in md2 and "first prompt" not in md2


# -- adopting a session cc-lhc never saw ---------------------------------------------------

def test_resume_of_a_session_never_seen_adopts_its_whole_transcript(real_claude):
    rc, api = real_claude, real_claude.api
    api.script([
        {"content": [{"type": "tool_use", "id": "toolu_old_1", "name": "Bash",
                      "input": {"command": "echo before-lhc"}}]},
        "old reply",
    ])
    p = rc.run_claude("-p", "made without cc-lhc", "--output-format", "json", "--allowedTools", "Bash")
    assert p.returncode == 0, p.stderr
    session = json.loads(p.stdout)["session_id"]
    assert threads(rc) == []

    api.script(["adopted reply"])
    lhc(rc, "--resume", session, "-p", "now through cc-lhc")
    [row] = threads(rc)
    assert row["current_session"] == session
    [path] = rc.transcripts()
    assert row["captured_bytes"] == path.stat().st_size and row["degraded"] is False
    assert conversation(export(rc, row["id"])) == [
        ("user_text", "made without cc-lhc"),
        ("tool_call", "Bash", "echo before-lhc", "toolu_old_1"),
        ("tool_result", "before-lhc", "toolu_old_1"),
        ("assistant_text", "old reply"),
        ("user_text", "now through cc-lhc"),
        ("assistant_text", "adopted reply"),
    ]
    # the adopted history really was the conversation Claude continued
    assert any("made without cc-lhc" in t for t in user_texts(api.message_requests[-1]["body"]))

    # resuming it again lands on the same thread
    api.script(["again"])
    lhc(rc, "--resume", session, "-p", "once more")
    [row] = threads(rc)
    assert conversation(export(rc, row["id"]))[-2:] == [("user_text", "once more"),
                                                        ("assistant_text", "again")]


def test_resume_repairs_a_torn_last_line_before_claude_appends(real_claude):
    """A transcript cut off mid-line (a crash, a full disk) is trimmed before Claude resumes
    it, the fragment kept aside, so the record stays clean."""
    rc, api = real_claude, real_claude.api
    api.script(["before the tear"])
    session = json.loads(lhc(rc, "-p", "first", "--output-format", "json").stdout)["session_id"]
    [path] = rc.transcripts()
    fragment = b'{"parentUuid":"x","isSidechain":false,"type":"assistant","message":{"content":[{"ty'
    whole = path.read_bytes()
    with open(path, "ab") as f:
        f.write(fragment)
    api.script(["after the repair"])
    lhc(rc, "--resume", session, "-p", "second")
    [row] = threads(rc)
    assert row["degraded"] is False, row["degraded_reason"]
    assert row["captured_bytes"] == path.stat().st_size
    assert conversation(export(rc, row["id"])) == [
        ("user_text", "first"), ("assistant_text", "before the tear"),
        ("user_text", "second"), ("assistant_text", "after the repair")]
    assert fragment not in path.read_bytes()
    [saved] = (rc.iso.lhc / "torn-lines").iterdir()
    assert saved.read_bytes() == fragment
    # and the thread keeps the fragment too, where it was in the file
    [kept] = [json.loads(line) for line in read_in_process("export", row["id"], "--format", "raw-lines").splitlines()]
    assert kept["raw"].encode() == fragment and kept["reason"] == cc_lhc.TORN_LINE
    assert (kept["line"], kept["offset"]) == (whole.count(b"\n") + 1, len(whole))


# -- --continue, and prefixes -------------------------------------------------------------

def test_a_run_of_one_letter_options_continues_as_claude_reads_it(real_claude):
    """`cc-lhc -cp "..."` is `claude -c -p "..."`: the folder's thread goes on, one-shot."""
    rc, api = real_claude, real_claude.api
    api.script(["first reply"])
    lhc(rc, "-p", "the first prompt")
    [row] = threads(rc)
    api.script(["second reply"])
    p = rc.run_lhc("-cp", "the second prompt")
    assert p.returncode == 0 and "second reply" in p.stdout, p.stderr
    assert api.message_requests[-1]["session_id"] == row["current_session"]
    assert [r["id"] for r in threads(rc)] == [row["id"]]
    assert conversation(export(rc, row["id"]))[-2:] == [("user_text", "the second prompt"),
                                                        ("assistant_text", "second reply")]


def test_continue_resolves_to_this_folders_most_recent_thread(real_claude):
    rc, api = real_claude, real_claude.api
    other = rc.cwd / "elsewhere"
    other.mkdir()
    api.script(["reply A"])
    lhc(rc, "-p", "thread A")
    api.script(["reply B"])
    lhc(rc, "-p", "thread B")
    api.script(["reply C"])
    lhc(rc, "-p", "thread C in another folder", cwd=other)
    rows = {export(rc, r["id"])[0]["text"]: r for r in threads(rc)}
    assert set(rows) == {"thread A", "thread B", "thread C in another folder"}
    assert rows["thread C in another folder"]["cwd"] == str(other)

    api.script(["continued reply"])
    lhc(rc, "--continue", "-p", "continue here")
    # the request went to B's session, and B's thread holds it; no new thread
    assert api.message_requests[-1]["session_id"] == rows["thread B"]["current_session"]
    after = threads(rc)
    assert len(after) == 3
    assert conversation(export(rc, rows["thread B"]["id"])) == [
        ("user_text", "thread B"), ("assistant_text", "reply B"),
        ("user_text", "continue here"), ("assistant_text", "continued reply")]
    assert [r["text"] for r in export(rc, rows["thread A"]["id"])] == ["thread A", "reply A"]

    # a prefix that matches several threads is refused, naming each of them
    registry = cc_lhc.Registry(cc_lhc.StateHome())
    ids = [r["id"] for r in after]
    while len({i[0] for i in ids}) == len(ids):  # until two ids share a first character
        ids.append(registry.create_thread(cc_lhc.new_session_id(), str(rc.cwd), "fresh"))
    registry.db.close()
    shared = next(a[0] for a in ids if sum(b[0] == a[0] for b in ids) > 1)
    p = lhc(rc, "export", shared, ok=False)
    assert p.returncode == 2 and p.stdout == ""
    named = set(re.findall(r"[0-9a-f]{8}-[0-9a-f-]{27}", p.stderr))
    assert named == {i for i in ids if i.startswith(shared)}
    p = lhc(rc, "export", "zzzz", ok=False)
    assert p.returncode == 2 and "no thread matches" in p.stderr


def test_without_p_and_without_a_terminal_claude_answers_and_exits(real_claude):
    """`cc-lhc "x" > out`, a pipe, a CI job: no terminal, so Claude answers and exits as
    claude alone does there, and the turn is captured; nothing waits for keys."""
    real_claude.api.script(["piped answer", "stdin answer"])
    p = lhc(real_claude, "the argv prompt", timeout=60)
    assert p.stdout == "piped answer\n"
    p = lhc(real_claude, input="the stdin prompt\n", timeout=60)
    assert p.stdout == "stdin answer\n"
    texts = sorted([m.get("text") for m in json.loads(read_in_process("export", t["id"]))]
                   for t in threads(real_claude))  # two launches, two new sessions
    assert texts == [["the argv prompt", "piped answer"], ["the stdin prompt\n", "stdin answer"]]


def test_a_sigint_to_cc_lhc_alone_interrupts_a_one_shot(real_claude):
    """A supervisor's kill -INT <cc-lhc pid> stops the one-shot as it stops claude -p."""
    import os
    import signal
    import subprocess
    import threading
    hold = threading.Event()
    real_claude.api.script([{"text": "NEVER-SHOWN", "hold": hold}])
    proc = subprocess.Popen(real_claude.lhc_argv("-p", "a long one"), env=real_claude.env,
                            cwd=real_claude.cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        real_claude.api.wait_for_requests(1, answered=False)
        proc.send_signal(signal.SIGINT)
        out, _err = proc.communicate(timeout=20)
    finally:
        hold.set()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert b"NEVER-SHOWN" not in out
    (thread,) = threads(real_claude)
    assert [m.get("text") for m in json.loads(read_in_process("export", thread["id"]))][0] == "a long one"
