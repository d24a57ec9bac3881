"""Issue 4's acceptance through the real Claude Code CLI and the fake API's request log:
a rebuilt rollout resumes with exactly the view; the model's own Bash calls to
`cc-lhc get-turns / get-messages / search` return the exact record (and a forged or stale
descriptor a refusal); `cc-lhc measure` counts without printing content.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import uuid

import pytest

import cc_lhc
from conftest import REPO
from fakeapi import text_reply, thinking_reply, tool_use_reply

sys.path.insert(0, str(REPO / "scripts"))
from gen_transcript import generate  # noqa: E402

HEADER_START = "[cc-lhc] This conversation was rebuilt by Smart Compact from thread "
OMITTED_RE = re.compile(r"^turns t(\d+)\u2013t(\d+) not in view; use get-turns$", re.M)
STUB_RE = re.compile(r"^\[output of Bash m(\d+): (\d+) lines, [\d.]+ (?:B|KB|MB) \u00b7 "
                     r"cc-lhc get-messages m\1\]$")


def lhc(rc, *args, **kw):
    proc = rc.run_lhc(*args, **kw)
    assert proc.returncode == 0, proc.stderr
    return proc


def bash(command):
    return tool_use_reply("Bash", {"command": command, "description": "run it"})


def long_text(tag, n=1500):
    words = f"{tag} lorem ipsum dolor sit amet consectetur ".split()
    return " ".join(words[i % len(words)] for i in range(n // 6))


def signature(tag):
    return f"EqoBCkYIBxABGAIiQ{tag}" + "x9Yz+/=" * 30


def the_thread(home):
    rows = cc_lhc.Registry(home).threads()
    assert len(rows) == 1
    return rows[0][0]


def blocks(message):
    content = message["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def tool_result_text(block):
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content or [])


def assert_api_pairs(messages):
    """The request as the API checks it: each assistant tool_use answered in the very next
    user message, each tool_result answering the assistant message just before it."""
    for i, m in enumerate(messages):
        uses = [b["id"] for b in blocks(m) if b.get("type") == "tool_use"]
        results = [b["tool_use_id"] for b in blocks(m) if b.get("type") == "tool_result"]
        if m["role"] == "assistant":
            assert not results
            if uses:
                nxt = [b["tool_use_id"] for b in blocks(messages[i + 1]) if b.get("type") == "tool_result"]
                assert set(nxt) == set(uses), (i, uses, nxt)
        elif results:
            prev = messages[i - 1]
            assert prev["role"] == "assistant"
            assert set(results) == {b["id"] for b in blocks(prev) if b.get("type") == "tool_use"}


@pytest.fixture
def recorded(real_claude):
    """A longer session recorded through cc-lhc: signed thinking, large Bash outputs, a
    short failing command, long prompts and answers."""
    rc, api = real_claude, real_claude.api
    api.script([text_reply(long_text("zero-answer"))])
    sid = json.loads(lhc(rc, "-p", "prompt zero " + long_text("zero"), "--output-format",
                         "json").stdout)["session_id"]
    runs = [
        ("prompt one " + long_text("one"),
         [thinking_reply("thinking one", long_text("one-answer"), signature=signature("ONE"))]),
        ("prompt two " + long_text("two"),
         [bash("seq 1 4000"), thinking_reply("thinking two", long_text("two-answer"),
                                             signature=signature("TWO"))]),
        ("prompt three " + long_text("three"),
         [bash("seq 100000 104000"), bash("ls /nonexistent-dir-for-cc-lhc-test"),
          text_reply(long_text("three-answer"))]),
        ("prompt four " + long_text("four"),
         [bash("seq 1 2500"), thinking_reply("thinking four", long_text("four-answer"),
                                             signature=signature("FOUR"))]),
        ("prompt five", [thinking_reply("thinking five", "answer five", signature=signature("FIVE"))]),
    ]
    for prompt, replies in runs:
        api.script(replies)
        lhc(rc, "--resume", sid, "-p", prompt, "--allowedTools", "Bash")
        assert api.pending == 0
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    return rc, home, the_thread(home), sid


def choose_budget(home, thread_id):
    """The smallest budget whose view has every band, a stub and signed thinking in full;
    and a short error output verbatim, in a lean part if any budget gives that (views
    counted exactly may not for this session; tests/test_views.py covers the rule)."""
    store = cc_lhc.ThreadStore(home, thread_id)
    try:
        turns = cc_lhc.load_turns(store)
        summaries = cc_lhc.thread_summaries(store, turns)
        fallback = None
        for budget in range(500, 40_000, 100):
            view, _header = cc_lhc.serve_view(thread_id, turns, budget, "default", summaries)
            bands = set(view.bands.values()) | {b for runs in view.pieces.values() for _, _, b in runs}
            if not {"full", "lean", "summary", "omitted"} <= bands:
                continue
            served = [(t, m, stub) for t in turns for m, stub in cc_lhc.turn_items(view, t)[1]]
            stubbed = any(stub for _t, _m, stub in served)
            signed = any(m["kind"] == "thinking" for _t, m, _s in served)
            error_kept = any(m["kind"] == "tool_result" and m["is_error"] and stub is None
                             and view.band_of(t.n, m["seq"]) == "lean" for t, m, stub in served)
            if stubbed and signed and error_kept:
                return budget, view, turns
            error_served = any(m["kind"] == "tool_result" and m["is_error"] and stub is None
                               for _t, m, stub in served)
            if stubbed and signed and error_served and fallback is None:
                fallback = (budget, view, turns)
        if fallback is not None:
            return fallback
    finally:
        store.close()
    raise AssertionError("no budget gives every band")


# -- (1) a rebuilt rollout resumes with exactly the view ------------------------------------

def test_rebuilt_rollout_resumes_with_exactly_the_view(recorded):
    rc, home, thread_id, old_sid = recorded
    api = rc.api
    budget, view, turns = choose_budget(home, thread_id)
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(
        {"lowerBoundTokens": budget, "upperBoundTokens": 1_000_000, "minRunwayTokens": 1000}))
    old = rc.project_dir / f"{old_sid}.jsonl"
    new_sid = str(uuid.uuid4())
    out = lhc(rc, "rollout", "write", "--thread-id", thread_id[:8], "--session-id", new_sid,
              "--envelope-from", str(old))
    path = out.stdout.strip()
    assert path == str(rc.project_dir / f"{new_sid}.jsonl") and os.stat(path).st_mode & 0o077 == 0
    records = [json.loads(line) for line in open(path, encoding="utf-8")]
    header = records[0]["message"]["content"]
    assert header.startswith(HEADER_START + thread_id)
    # the replayed prefix is remembered, and the new session is the thread's current alias
    hostdb = cc_lhc.HostDB(home)
    assert hostdb.session(new_sid)["replayed_prefix_bytes"] == os.path.getsize(path)
    assert cc_lhc.Registry(home).current_session(thread_id) == new_sid

    n_before = len(api.message_requests)
    api.script(["resumed fine"])
    proc = rc.run_claude("--resume", new_sid, "-p", "next")
    assert proc.returncode == 0 and "resumed fine" in proc.stdout, proc.stderr
    (request,) = api.message_requests[n_before:]
    assert request["session_id"] == new_sid
    messages = request["body"]["messages"]

    # header first
    first = blocks(messages[0])[0]
    assert messages[0]["role"] == "user" and first["text"].startswith(HEADER_START + thread_id)
    assert first["text"].rstrip("\n") == header.rstrip("\n")
    # omitted ranges named, as the view left them out
    omitted = view.turns_in("omitted")
    named = [n for a, b in OMITTED_RE.findall(header) for n in range(int(a), int(b) + 1)]
    assert omitted and named == omitted
    # the envelope came along: no empty system turn, the date is there
    systems = [m for m in messages if m["role"] == "system"]
    assert systems and all(m["content"] for m in systems)
    assert any("Today's date is" in json.dumps(m) for m in systems)
    # no unpaired tool blocks
    assert_api_pairs(messages)

    flat = [(m["role"], b) for m in messages for b in blocks(m)]
    results = [b for _, b in flat if b.get("type") == "tool_result"]
    stubs = [b for b in results if STUB_RE.match(tool_result_text(b))]
    assert stubs, "lean stubs reach the model"
    # every lean / full turn's content is in the request, in order, exactly
    store = cc_lhc.ThreadStore(home, thread_id)
    by_seq = {m["seq"]: m for m in store.messages()}
    at = 0
    for t in turns:
        for m in t.messages:  # nothing of a summarised or omitted turn or part is replayed
            if view.band_of(t.n, m["seq"]) not in ("full", "lean") and \
                    m["kind"] in ("assistant_text", "tool_result") and len(m["text"] or "") > 200:
                assert m["text"] not in json.dumps(messages, ensure_ascii=False)
        for m, stub in cc_lhc.turn_items(view, t)[1]:
            band = view.band_of(t.n, m["seq"])
            want = json.loads(m["data"]) if m["kind"] in ("thinking", "tool_call") else None
            while True:
                role, b = flat[at]
                at += 1
                if m["kind"] == "thinking" and b == want:
                    assert band == "full" and b["signature"].startswith("EqoBCkYIBxABGAIiQ")
                    break
                if m["kind"] == "tool_call" and b.get("type") == "tool_use" and b["id"] == want["id"]:
                    assert b["input"] == want["input"] and b["name"] == want["name"]
                    break
                if m["kind"] == "tool_result" and b.get("type") == "tool_result" \
                        and b["tool_use_id"] == m["tool_use_id"]:
                    assert tool_result_text(b) == (stub if stub is not None else m["text"])
                    if stub is not None:
                        seq = int(STUB_RE.match(stub).group(1))
                        assert by_seq[seq]["tool_use_id"] == m["tool_use_id"]
                    break
                if m["kind"] in ("user_text", "assistant_text") and b.get("type") == "text" \
                        and b["text"] == m["text"]:
                    break
    # signed thinking of full turns went out verbatim; none of lean turns did
    sent = {b["signature"] for _, b in flat if b.get("type") == "thinking"}
    full_sigs = {json.loads(m["data"])["signature"] for t in turns for m in t.messages
                 if m["kind"] == "thinking" and view.band_of(t.n, m["seq"]) == "full"}
    lean_sigs = {json.loads(m["data"])["signature"] for t in turns for m in t.messages
                 if m["kind"] == "thinking" and view.band_of(t.n, m["seq"]) != "full"}
    assert full_sigs and sent == full_sigs and not sent & lean_sigs
    # a short failing command stays verbatim even in a lean turn
    errors = [m for m in by_seq.values() if m["kind"] == "tool_result" and m["is_error"]
              and view.band_of(m["turn"], m["seq"]) in ("full", "lean")]
    assert errors
    for m in errors:
        assert any(tool_result_text(b) == m["text"] for b in results)
    store.close()


def test_rollout_write_refusals(real_claude):
    rc = real_claude
    rc.api.script(["a short answer"])
    old_sid = json.loads(lhc(rc, "-p", "a short session", "--output-format", "json").stdout)["session_id"]
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    thread_id = the_thread(home)
    prefix = thread_id[:8]
    # the session id is already bound (to this thread, through its recorded session)
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", old_sid)
    assert proc.returncode == 2 and "already bound" in proc.stderr
    # ... or to another thread
    other_sid = str(uuid.uuid4())
    cc_lhc.Registry(home).create_thread(other_sid, str(rc.cwd), "test")
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", other_sid)
    assert proc.returncode == 2 and "already bound" in proc.stderr
    # the rollout file exists
    new_sid = str(uuid.uuid4())
    target = rc.project_dir / f"{new_sid}.jsonl"
    target.write_text("someone else's file\n")
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", new_sid)
    assert proc.returncode == 2 and "already exists" in proc.stderr
    assert target.read_text() == "someone else's file\n"
    assert cc_lhc.Registry(home).thread_for_session(new_sid) is None
    # ... in another folder's sessions: Claude finds a session by its id in any of them
    elsewhere_sid = str(uuid.uuid4())
    other_folder = rc.project_dir.parent / "-some-other-project"
    other_folder.mkdir()
    (other_folder / f"{elsewhere_sid}.jsonl").write_text("another folder's conversation\n")
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", elsewhere_sid)
    assert proc.returncode == 2 and f"already exists: {other_folder}" in proc.stderr
    assert cc_lhc.Registry(home).thread_for_session(elsewhere_sid) is None
    # a projects root that is no folder (a typo) is refused, never made
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", str(uuid.uuid4()),
                      "--projects-root", str(rc.cwd / "no-such-root"))
    assert proc.returncode == 2 and "is not a folder" in proc.stderr and not (rc.cwd / "no-such-root").exists()
    # an empty view: a thread with nothing captured, and a budget too small for any turn
    empty = cc_lhc.Registry(home).create_thread(str(uuid.uuid4()), str(rc.cwd), "test")
    proc = rc.run_lhc("rollout", "write", "--thread-id", empty, "--session-id", str(uuid.uuid4()))
    assert proc.returncode == 2 and "nothing to put in a view" in proc.stderr
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(
        {"lowerBoundTokens": 1, "upperBoundTokens": 1_000_000, "minRunwayTokens": 1000}))
    proc = rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", str(uuid.uuid4()))
    assert proc.returncode == 2 and "within the target of 1 tokens holds no turn" in proc.stderr
    assert "give a larger target" in proc.stderr
    # not a uuid; no such thread
    assert rc.run_lhc("rollout", "write", "--thread-id", prefix, "--session-id", "nope").returncode == 2
    proc = rc.run_lhc("rollout", "write", "--thread-id", "zzzz", "--session-id", str(uuid.uuid4()))
    assert proc.returncode == 2 and "no thread matches" in proc.stderr
    # nothing was written by any refusal
    assert sorted(p.name for p in rc.project_dir.glob("*.jsonl")) == \
        sorted([f"{old_sid}.jsonl", f"{new_sid}.jsonl"])


def test_a_session_written_where_claude_does_not_look_is_written_again_on_resume(real_claude, tmp_path):
    """`rollout write --projects-root` can put the thread's current session in a folder this
    Claude never reads sessions from; the next resume writes the conversation again from
    the thread into Claude's own folder instead of handing Claude a session it cannot find."""
    rc = real_claude
    rc.api.script(["Noted: the code word is ASTRAY-7731."])
    lhc(rc, "-p", "remember the code word ASTRAY-7731")
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    thread_id = the_thread(home)
    root, new_sid = tmp_path / "elsewhere", str(uuid.uuid4())
    root.mkdir()
    (rc.cwd / ".cc-lhc.json").write_text('{"bogusField": 1}')
    proc = rc.run_lhc("rollout", "write", "--thread-id", thread_id, "--session-id", new_sid,
                      "--projects-root", str(root))
    assert proc.returncode == 0, proc.stderr
    assert cc_lhc.MSG_CONFIG_FALLBACK in proc.stderr and "bogusField" in proc.stderr  # (said, as a launch says it)
    rc.api.script(["The code word was ASTRAY-7731."])
    proc = rc.run_lhc("-p", "-c", "what was the code word?")
    assert proc.returncode == 0, proc.stderr
    assert "where Claude Code does not look for sessions" in proc.stderr
    assert "ASTRAY-7731" in json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    assert cc_lhc.Registry(home).current_session(thread_id) not in (new_sid, None)


# -- (2) the model retrieves through Bash ---------------------------------------------------

def recall_text(thread_id, request, body):
    return f'<cc-lhc-recall thread="{thread_id[:8]}" request="{request}">\n{body}</cc-lhc-recall>'


def test_model_retrieval_through_bash_is_exact_and_forgeries_are_refused(real_claude, tmp_path):
    rc, api = real_claude, real_claude.api
    secret = "quetzalcoatl-" + uuid.uuid4().hex[:6]
    api.script([bash("seq 1 2000; echo caf\u00e9 \u6771\u4eac \U0001f600"),
                text_reply(f"the password is {secret}")])
    sid = json.loads(lhc(rc, "-p", "remember a password", "--output-format", "json",
                         "--allowedTools", "Bash").stdout)["session_id"]
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    thread_id = the_thread(home)
    store = cc_lhc.ThreadStore(home, thread_id)
    first = list(store.messages(1, 1))
    output = next(m for m in first if m["kind"] == "tool_result")
    store.close()

    runtime = rc.iso.lhc / "runtime"
    forged_outside = tmp_path / "forged.json"
    forged_outside.write_text(json.dumps({"version": 1, "token": "0" * 32, "thread_id": thread_id,
                                          "session_id": sid}))
    os.chmod(forged_outside, 0o600)
    forged_inside = runtime / "forged-inside.json"
    # stale: a copy of this very session's descriptor, made by the model before the forgeries
    commands = [
        "cc-lhc get-turns t1",
        f"cc-lhc get-messages m{output['seq']}",
        f"cc-lhc search {secret}",
        f'cp "$CC_LHC_RUNTIME_DESCRIPTOR" {runtime}/stale-copy.json && echo copied',
        f"CC_LHC_RUNTIME_DESCRIPTOR={forged_outside} cc-lhc get-turns t1",
        # the same descriptor with another token, placed where real ones live
        f"python3 -c \"import json,os,sys; d=json.load(open(os.environ['CC_LHC_RUNTIME_DESCRIPTOR'])); "
        f"d['token']='f'*32; fd=os.open('{forged_inside}', os.O_WRONLY|os.O_CREAT, 0o600); "
        f"os.write(fd, json.dumps(d).encode())\" && CC_LHC_RUNTIME_DESCRIPTOR={forged_inside} "
        f"cc-lhc get-turns t1",
    ]
    api.script([bash(c) for c in commands] + ["all done"])
    n_before = len(api.message_requests)
    lhc(rc, "--resume", sid, "-p", "recall things", "--allowedTools", "Bash")
    last = api.message_requests[-1]["body"]["messages"]
    assert len(api.message_requests) - n_before == len(commands) + 1
    ids = {b["input"]["command"]: b["id"] for m in last for b in blocks(m) if b.get("type") == "tool_use"}
    got = {b["tool_use_id"]: b for m in last for b in blocks(m) if b.get("type") == "tool_result"}
    result = {c: got[ids[c]] for c in commands}

    # get-turns t1: the exact original content of turn 1
    body = "=== t1 (prompt, closed) ===\n" + "".join(cc_lhc.render_message_body(m) for m in first)
    assert tool_result_text(result[commands[0]]) == recall_text(thread_id, "get-turns t1", body)
    assert f"the password is {secret}" in body and output["text"] in body
    assert "\U0001f600" in output["text"]
    # get-messages mN: the exact tool output
    assert tool_result_text(result[commands[1]]) == recall_text(
        thread_id, f"get-messages m{output['seq']}", cc_lhc.render_message_body(output))
    # search: the labels that mention the word
    found = tool_result_text(result[commands[2]])
    answer = next(m for m in first if m["kind"] == "assistant_text")
    assert f"m{answer['seq']} (t1, assistant_text, " in found and ", exact): " in found
    assert "\u00bb" + secret + "\u00ab" in found
    assert not result[commands[2]].get("is_error")
    assert tool_result_text(result[commands[3]]) == "copied"
    # forged descriptors are refused
    for c, reason in zip(commands[4:], ("is not one of this state home's runtime descriptors",
                                        "was revoked or never issued")):
        refused = tool_result_text(result[c])
        assert result[c].get("is_error") is True
        assert f"cc-lhc: retrieval refused: the descriptor {reason}" in refused, refused
        assert "=== t1" not in refused and secret not in refused

    # the impressions of the three good retrievals, for this session
    store = cc_lhc.ThreadStore(home, thread_id)
    rows = store.db.execute("SELECT session, command, labels FROM impressions ORDER BY id").fetchall()
    store.close()
    assert [(s, c) for s, c, _ in rows] == [(sid, "get-turns"), (sid, "get-messages"), (sid, "search")]

    # a stale descriptor (the last session's, copied while it lived) is swept by the next
    # launch, its owner being gone, and refused there
    stale = runtime / "stale-copy.json"
    assert stale.exists()
    api.script([bash(f"CC_LHC_RUNTIME_DESCRIPTOR={stale} cc-lhc get-turns t1"), "ok"])
    lhc(rc, "--resume", sid, "-p", "try the old one", "--allowedTools", "Bash")
    assert not stale.exists()
    last = api.message_requests[-1]["body"]["messages"]
    refusal = [b for m in last[-3:] for b in blocks(m) if b.get("type") == "tool_result"][-1]
    assert refusal.get("is_error") is True
    assert "cc-lhc: retrieval refused: the descriptor is missing" in tool_result_text(refusal)


# -- (3) measure ------------------------------------------------------------------------------

MARK = "xylophonequasar"


def measured_files(tmp_path):
    folder = tmp_path / f"proj-{MARK}"
    folder.mkdir()
    a = folder / f"session-{MARK}-a.jsonl"
    stats = generate(str(a), size_mb=0.25, seed=41, thinking=True, cwd=f"/home/u/{MARK}")
    last = [r["uuid"] for r in map(json.loads, a.read_text().splitlines()) if r.get("uuid")][-1]
    with open(a, "a", encoding="utf-8") as f:  # a distinctive prompt and tool output in it
        rec = {"parentUuid": last, "isSidechain": False, "type": "user", "uuid": str(uuid.uuid4()),
               "timestamp": "2027-01-01T00:00:00.000Z", "sessionId": stats["session_id"],
               "message": {"role": "user", "content": f"please say {MARK} out loud"}}
        f.write(json.dumps(rec) + "\n")
    b = folder / f"session-{MARK}-b.jsonl"
    generate(str(b), size_mb=0.15, seed=42, cwd=f"/home/u/{MARK}")
    sub = folder / "x" / "subagents"
    sub.mkdir(parents=True)
    shutil.copy(b, sub / "agent-1.jsonl")  # subagent transcripts are not sessions
    return folder, a, stats


def test_measure_counts_without_printing_content(iso_env, tmp_path):
    folder, a, stats = measured_files(tmp_path)
    argv = [sys.executable, str(REPO / "cc_lhc.py"), "measure"]

    def run(*args, env=None):
        proc = subprocess.run(argv + list(args), capture_output=True, text=True, timeout=120,
                              env={**iso_env.env, **(env or {})}, cwd=tmp_path,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        assert MARK not in proc.stdout + proc.stderr, "measure printed text or a path"
        return proc.stdout

    report = json.loads(run(str(a), "--json", "--target", "20000"))
    (row,) = report["sessions"]
    assert report["target"] == 20000 and report["profile"] == "default"
    assert row["tool_calls"] == stats["tool_calls"] and row["messages"] > row["tool_calls"]
    assert row["exact"] is True and row["counting"] == "exact o200k_base"
    assert row["tokens"] > row["lean_tokens"] > 0 and 0 < row["lean_cut_pct"] < 100
    assert row["smart_compact_tokens"] <= 20000 * 1.2 + 2000
    # (the prompt added last has no answer: the view leaves that open turn out, as a rebuild would)
    assert row["settled"] is False and row["open_turn_left_out"] is True
    assert sum(row["bands"].values()) == row["turns"] - 1
    # over a folder: one row a session (subagents skipped), median and p90
    many = json.loads(run(str(folder), "--json"))
    assert len(many["sessions"]) == 2 and many["sessions"][0]["tokens"] == row["tokens"]
    for key in ("median_lean_cut_pct", "p90_lean_cut_pct", "median_smart_compact_cut_pct",
                "p90_smart_compact_cut_pct"):
        assert isinstance(many[key], float)
    text_ = run(str(folder))
    assert "exact o200k_base" in text_ and f"{row['tokens']:,}" in text_
    median = many["median_lean_cut_pct"]
    assert f"median: lean -{median:.1f}%" in text_ and "; at p90: lean -" in text_
    md = run(str(folder), "--markdown", "--profile", "historical").splitlines()
    assert md[0].startswith("| session | messages | tool calls | tokens |")
    assert md[1].startswith("| --- |") and len([ln for ln in md if ln.startswith("| ")]) == 4
    # what follows the table is apart from it: a line right under it would read as a row
    assert md[4] == "" and md[5] and not md[5].startswith("|")
    # approximate counts are labelled as such: corrupted data, and no data at all
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(b"not the o200k_base ranks\n")
    approx = json.loads(run(str(a), "--json", env={"CC_LHC_TOKENIZER_FILE": str(bad)}))["sessions"][0]
    assert approx["exact"] is False and approx["counting"].startswith("approximate")
    assert approx["tool_calls"] == row["tool_calls"]
    assert "approximate" in run(str(a), env={"CC_LHC_TOKENIZER_FILE": str(bad)})
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    shutil.copy(REPO / "cc_lhc.py", lonely / "cc_lhc.py")
    argv[1] = str(lonely / "cc_lhc.py")
    missing = json.loads(run(str(a), "--json", env={"CC_LHC_TOKENIZER_FILE": str(tmp_path / "no")}))
    assert missing["sessions"][0]["exact"] is False


def test_measure_prints_the_same_bytes_for_the_same_input(iso_env, tmp_path):
    # The header counted into the view names the thread; a random id there (and a timing
    # column) made two runs over one transcript print different figures.
    folder, a, _stats = measured_files(tmp_path)
    copy = tmp_path / "elsewhere.jsonl"
    shutil.copy(a, copy)

    def run(*args):
        proc = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), "measure", *args,
                               "--target", "20000"], capture_output=True, timeout=120,
                              env=iso_env.env, cwd=tmp_path, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    for args in ([str(a)], [str(a), "--json"], [str(folder), "--markdown"]):
        assert run(*args) == run(*args)
    assert run(str(copy), "--json") == run(str(a), "--json")


def test_measure_refuses_bad_arguments(iso_env, tmp_path):
    path = tmp_path / "s.jsonl"
    generate(str(path), size_mb=0.05, seed=5)
    for args, says in (([str(tmp_path / "nowhere.jsonl")], "neither"), ([], "usage"),
                       (["--profile", "weird", str(path)], "--profile"), (["--target", "0", str(path)], "--target"),
                       # int() would read these as 1000 and 12345
                       (["--target", "1_000", str(path)], "'1_000' is not valid"),
                       (["--target=\u0661\u0662\u0663\u0664\u0665", str(path)], "is not valid"),
                       (["--target", " 5000", str(path)], "is not valid")):
        proc = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), "measure", *args],
                              capture_output=True, text=True, env=iso_env.env, timeout=60,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 2 and says in proc.stderr and proc.stdout == "", (args, proc.stderr)


def test_measure_of_a_folder_it_cannot_list_prints_no_empty_report(monkeypatch, capsys, tmp_path):
    def walk(top, onerror=None):
        onerror(PermissionError(13, "Permission denied", str(top)))
        return iter(())
    monkeypatch.setattr(cc_lhc.os, "walk", walk)
    assert cc_lhc.cmd_measure([str(tmp_path), "--json"]) == cc_lhc.EXIT_ERROR
    out, err = capsys.readouterr()
    assert out == "" and f"{tmp_path} could not be read (Permission denied)" in err


def cut_after_a_tool_call(path):
    """Append to a transcript the response of a turn killed while its tool ran: a call with
    no result."""
    last = [r for r in map(json.loads, path.read_text().splitlines()) if r.get("type") in ("user", "assistant")][-1]
    rec = {"parentUuid": last["uuid"], "isSidechain": False, "type": "assistant", "uuid": str(uuid.uuid4()),
           "timestamp": "2027-01-01T00:00:00.000Z", "sessionId": last["sessionId"],
           "message": {"id": "msg_cut", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                       "content": [{"type": "tool_use", "id": "toolu_cut", "name": "Bash",
                                    "input": {"command": "make test"}}],
                       "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 5}}}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec) + "\n")


def test_measure_of_a_session_left_mid_turn_says_so_and_serves_what_a_rebuild_would(iso_env, tmp_path):
    """A rebuild made before a launch leaves out a turn the file left open; measure's figure
    does too, and it says the seam is not settled (Smart Compact would wait for it)."""
    path = tmp_path / "s.jsonl"
    generate(str(path), size_mb=0.5, seed=9)
    whole = cc_lhc.measure_transcript(str(path), "default", 10_000)
    assert whole["settled"] is True and whole["unsettled_reason"] is None and not whole["open_turn_left_out"]
    cut_after_a_tool_call(path)
    row = cc_lhc.measure_transcript(str(path), "default", 10_000)
    assert row["settled"] is False and row["open_turn_left_out"] is True
    assert "1 tool call(s) still waiting for results" in row["unsettled_reason"]
    assert row["tool_calls"] == whole["tool_calls"] + 1

    home = cc_lhc.StateHome(str(tmp_path / "lhc"))
    home.ensure()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    cap = cc_lhc.Capture(home, cc_lhc.name_uuid(f"measure/{digest}"), "s", str(path))
    cap.catch_up()
    policy = cc_lhc.resolve_policy([("test", {"lowerBoundTokens": 10_000})])
    plan = cc_lhc.plan_rebuild(home, cap.store, cap.thread_id, policy, str(uuid.uuid4()), "/w", idle=True)
    turns = cc_lhc.load_turns(cap.store, closed_only=True)
    carried, _reserve = cc_lhc.carried_file_state(turns, 10_000)
    served = plan.view.tokens + cc_lhc.carried_pairs_tokens(plan.view, turns, carried, cc_lhc.ViewCounter())
    assert max(plan.view.bands) < max(t.n for t in cc_lhc.load_turns(cap.store, closed_only=False))
    cap.stop()
    assert row["smart_compact_tokens"] == served

    proc = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), "measure", str(path), "--target", "10000"],
                          capture_output=True, text=True, env=iso_env.env, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr
    assert ("session 1: not at a settled seam (the transcript was left mid-turn: t" in proc.stdout
            and "Smart Compact would wait for the turn to end; its open turn is left out" in proc.stdout)


def test_measure_predicts_the_view_a_rebuild_serves(iso_env, tmp_path):
    """`measure` sets the carried file-state pairs aside as a rebuild does, so the size it
    predicts is the size Smart Compact serves."""
    path = tmp_path / "s.jsonl"
    generate(str(path), size_mb=1, seed=7)
    target = 10_000  # the whole session is about 31k tokens
    row = cc_lhc.measure_transcript(str(path), "default", target)
    assert row["exact"] and row["carried_file_state_tokens"] > 0
    assert row["smart_compact_tokens"] <= target

    home = cc_lhc.StateHome(str(tmp_path / "lhc"))
    home.ensure()
    # the thread id measure writes into the header: with it, the two views are the same
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    thread_id = cc_lhc.name_uuid(f"measure/{digest}")
    cap = cc_lhc.Capture(home, thread_id, "s", str(path))
    cap.catch_up()
    policy = cc_lhc.resolve_policy([("test", {"lowerBoundTokens": target})])
    plan = cc_lhc.plan_rebuild(home, cap.store, cap.thread_id, policy, str(uuid.uuid4()), "/w", idle=True)
    turns = cc_lhc.load_turns(cap.store, closed_only=False)
    carried, _reserve = cc_lhc.carried_file_state(turns, target)
    served = plan.view.tokens + cc_lhc.carried_pairs_tokens(plan.view, turns, carried, cc_lhc.ViewCounter())
    cap.stop()
    assert served <= target
    assert row["smart_compact_tokens"] == served


def test_measure_uses_the_target_smart_compact_would_use_here(iso_env, tmp_path):
    """Without --target and --profile, measure takes them from the configuration of the
    folder it runs in, as Smart Compact there would; the flags still win."""
    path = tmp_path / "s.jsonl"
    generate(str(path), size_mb=0.25, seed=3)
    project = tmp_path / "project"
    (project / "sub").mkdir(parents=True)
    (project / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": 20_000, "profile": "historical"}))

    def measure(*args, cwd):
        p = subprocess.run([sys.executable, str(REPO / "cc_lhc.py"), "measure", str(path), "--json", *args],
                           capture_output=True, text=True, timeout=120, env=iso_env.env, cwd=cwd,
                           stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout), p.stderr

    here, _ = measure(cwd=project / "sub")
    assert (here["target"], here["profile"]) == (20_000, "historical")
    flagged, _ = measure("--target", "30000", "--profile", "balanced", cwd=project)
    assert (flagged["target"], flagged["profile"]) == (30_000, "balanced")
    elsewhere, _ = measure(cwd=tmp_path)
    assert (elsewhere["target"], elsewhere["profile"]) == (cc_lhc.BUILTIN_POLICY["lowerBoundTokens"], "default")
    (project / ".cc-lhc.json").write_text(json.dumps({"lowerBoundTokens": "lots"}))
    fallback, err = measure(cwd=project)
    assert fallback["target"] == cc_lhc.BUILTIN_POLICY["lowerBoundTokens"]
    assert cc_lhc.MSG_CONFIG_FALLBACK in err
    (problem,) = [line for line in err.splitlines() if "lowerBoundTokens" in line]  # each problem named
    assert ".cc-lhc.json" in problem
    assert "config_fallback" in (iso_env.lhc / "wrapper.log").read_text()


def test_retrieval_works_from_a_tool_run_with_another_home(real_claude, tmp_path):
    """The state folder under $HOME (no CC_LHC_HOME): a command Claude runs with another HOME
    (`HOME=/tmp/x cc-lhc get-turns t1`) still reaches the session's own thread."""
    rc = real_claude
    env = {"CC_LHC_HOME": ""}
    rc.api.script(["noted: the colour is TEAL-4417"])
    p = rc.run_lhc("-p", "remember the colour TEAL-4417", "--output-format", "json", env=env)
    assert p.returncode == 0, p.stderr
    sid = json.loads(p.stdout)["session_id"]
    assert (rc.iso.home / ".cc-lhc" / "registry.sqlite").exists()
    other = tmp_path / "another-home"
    other.mkdir()
    rc.api.script([bash(f"HOME={other} cc-lhc get-turns t1"), "done"])
    p = rc.run_lhc("--resume", sid, "-p", "what was the colour?", "--allowedTools", "Bash", env=env)
    assert p.returncode == 0, p.stderr
    last = rc.api.message_requests[-1]["body"]["messages"]
    [answer] = [b for m in last for b in blocks(m) if b.get("type") == "tool_result"]
    assert "TEAL-4417" in tool_result_text(answer) and not answer.get("is_error"), tool_result_text(answer)


def short_thread(rc, answer="a short answer"):
    """(state home, thread id, session id) of a one-turn thread captured by a one-shot."""
    rc.api.script([answer])
    sid = json.loads(lhc(rc, "-p", "a short session", "--output-format", "json").stdout)["session_id"]
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    return home, the_thread(home), sid


def go_on(rc):
    """The thread's next launch (a one-shot --continue), which settles what was left half-way."""
    p = rc.run_lhc("-p", "and then?", "--continue", "--output-format", "json")
    assert p.returncode == 0, p.stderr
    return p


@pytest.mark.parametrize("point", ["after-pending-record", "after-rollout-written"])
def test_a_rollout_write_killed_before_the_thread_moved_leaves_nothing_behind(real_claude, point):
    """`rollout write` is one rebuild like any other: killed after its file is written and
    before the thread moved onto it, the next launch of the thread rolls it back (the file
    out of Claude's folder), and the thread goes on where it was."""
    rc = real_claude
    home, thread_id, old_sid = short_thread(rc, "a short answer")
    new_sid = str(uuid.uuid4())
    proc = rc.run_lhc("rollout", "write", "--thread-id", thread_id, "--session-id", new_sid,
                      env={"CC_LHC_FAILPOINT": point})
    assert proc.returncode == -9
    assert cc_lhc.Registry(home).current_session(thread_id) == old_sid
    rc.api.script(["the thread goes on"])
    p = go_on(rc)
    assert json.loads(p.stdout)["session_id"] == old_sid
    assert not (rc.project_dir / f"{new_sid}.jsonl").exists()  # rolled back, not left for Claude's picker
    if point == "after-rollout-written":
        assert "was rolled back" in p.stderr
        assert list((rc.iso.lhc / "abandoned-rebuilds").rglob(f"{new_sid}.jsonl"))
    # and the next rollout write of the thread works
    again = str(uuid.uuid4())
    w = rc.run_lhc("rollout", "write", "--thread-id", thread_id, "--session-id", again)
    assert w.returncode == 0, w.stderr
    assert cc_lhc.Registry(home).current_session(thread_id) == again


def test_a_rollout_write_that_failed_can_be_run_again_under_the_same_id(real_claude, tmp_path):
    """A write that failed (the projects folder unusable) or was killed rolls back, and the
    same --session-id is free again; one written under --projects-root outside Claude's
    folder is rolled back (moved to abandoned-rebuilds/) all the same."""
    rc = real_claude
    home, thread_id, old_sid = short_thread(rc, "a short answer")
    root = tmp_path / "other-config" / "projects"
    root.mkdir(parents=True)
    blocker = root / rc.project_dir.name
    blocker.write_text("a file where the project's folder would go\n")
    sid = str(uuid.uuid4())
    args = ("rollout", "write", "--thread-id", thread_id, "--session-id", sid, "--projects-root", str(root))
    failed = rc.run_lhc(*args)
    assert failed.returncode == 1 and "could not be written" in failed.stderr
    blocker.unlink()
    killed = rc.run_lhc(*args, env={"CC_LHC_FAILPOINT": "after-rollout-written"})
    assert killed.returncode == -9 and (root / rc.project_dir.name / f"{sid}.jsonl").exists()
    rc.api.script(["the thread goes on"])
    p = go_on(rc)
    assert json.loads(p.stdout)["session_id"] == old_sid
    assert "an interrupted rollout write of thread" in p.stderr
    assert not (root / rc.project_dir.name / f"{sid}.jsonl").exists()
    assert list((rc.iso.lhc / "abandoned-rebuilds").rglob(f"{sid}.jsonl"))
    again = rc.run_lhc(*args)
    assert again.returncode == 0, again.stderr
    assert cc_lhc.Registry(home).current_session(thread_id) == sid


def test_a_second_rollback_under_the_same_session_id_keeps_the_first_file(real_claude):
    rc = real_claude
    home, thread_id, old_sid = short_thread(rc, "a short answer ALPHA")
    sid = str(uuid.uuid4())
    args = ("rollout", "write", "--thread-id", thread_id, "--session-id", sid)
    k1 = rc.run_lhc(*args, env={"CC_LHC_FAILPOINT": "after-rollout-written"})
    assert k1.returncode == -9
    rc.api.script(["second answer BRAVO"])
    go_on(rc)
    [first] = list((rc.iso.lhc / "abandoned-rebuilds").rglob(f"{sid}*"))
    first_bytes = first.read_bytes()
    assert b"BRAVO" not in first_bytes
    k2 = rc.run_lhc(*args, env={"CC_LHC_FAILPOINT": "after-rollout-written"})
    assert k2.returncode == -9, k2.stderr
    rc.api.script(["third answer CHARLIE"])
    go_on(rc)
    kept = list((rc.iso.lhc / "abandoned-rebuilds").rglob("*"))
    contents = [f.read_bytes() for f in kept if f.is_file()]
    assert first_bytes in contents, "the first rolled-back rollout write's file was overwritten"


@pytest.mark.parametrize("elsewhere", [False, True])
def test_a_killed_rollout_write_claude_then_worked_in_is_taken_up_wherever_it_was_written(real_claude, tmp_path, elsewhere):
    """rollout write killed before the thread moved; the person opens the written session
    with Claude anyway (under --projects-root: Claude with that config folder) and works in
    it. The next launch of the thread should treat both the same way (recover_thread:
    Claude held a turn in it -> the move is completed), not move the worked-in file away."""
    rc = real_claude
    home, thread_id, old_sid = short_thread(rc, "a short answer ALPHA")
    sid = str(uuid.uuid4())
    args = ["rollout", "write", "--thread-id", thread_id, "--session-id", sid]
    env = {}
    if elsewhere:
        other = tmp_path / "other-config"
        (other / "projects").mkdir(parents=True)
        shutil.copy(rc.config_file, other / ".claude.json")
        args += ["--projects-root", str(other / "projects")]
        env = {"CLAUDE_CONFIG_DIR": str(other)}
    k = rc.run_lhc(*args, env={"CC_LHC_FAILPOINT": "after-rollout-written"})
    assert k.returncode == -9, k.stderr
    rc.api.script(["worked in the written session ZULU"])
    c = rc.run_claude("-p", "work here", "--resume", sid, env=env)
    assert c.returncode == 0, c.stderr
    written = (tmp_path / "other-config" / "projects" if elsewhere else rc.iso.config / "projects")
    [f] = list(written.rglob(f"{sid}.jsonl"))
    assert b"ZULU" in f.read_bytes()
    rc.api.script(["the thread goes on"])
    p = go_on(rc)
    assert f.exists(), "the session Claude worked in was moved away"
    assert "an interrupted rollout write of thread" in p.stderr and "was completed" in p.stderr
    assert "ZULU" in json.dumps(rc.api.message_requests[-1]["body"]["messages"])
    if not elsewhere:
        assert json.loads(p.stdout)["session_id"] == sid, p.stderr
    else:  # (where Claude does not look: the conversation is written again from the thread)
        assert "where Claude Code does not look" in p.stderr


@pytest.mark.real_cli
def test_a_run_summarised_in_the_middle_of_a_long_turn_is_noted_where_it_was_in_what_claude_is_sent(real_claude):
    """A long turn whose large middle exchange is summarised while the calls before and after
    it stay verbatim: the real CLI, resumed on the rebuilt session, sends the turn's prompt,
    the first call and its result, then the note naming the run left out, then the last call."""
    rc, api = real_claude, real_claude.api
    api.script([text_reply("first answer")])
    sid = json.loads(lhc(rc, "-p", "first prompt", "--output-format", "json").stdout)["session_id"]
    big = "true # " + " ".join(f"word{i}" for i in range(6000))
    api.script([bash("echo small-one"), bash(big), bash("echo small-two"), text_reply("LAST-ANSWER done")])
    lhc(rc, "--resume", sid, "-p", "PROMPT-OF-LONG-TURN go", "--allowedTools", "Bash")
    assert api.pending == 0
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    tid = the_thread(home)
    store = cc_lhc.ThreadStore(home, tid)
    turns = cc_lhc.load_turns(store)
    summaries = cc_lhc.thread_summaries(store, turns)
    chosen = None
    for budget in range(1_500, 12_000, 100):  # a target that keeps the first call and leaves out the big one
        view, _header = cc_lhc.serve_view(tid, turns, budget, "default", summaries)
        runs = view.pieces.get(turns[-1].n)
        if runs and runs[0][2] == "full" and any(band not in ("full", "lean") for _a, _b, band in runs):
            chosen = budget
            break
    store.close()
    assert chosen, "no target splits the turn that way"
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(
        {"lowerBoundTokens": chosen + 200, "upperBoundTokens": 1_000_000, "minRunwayTokens": 1_000}))
    new_sid = str(uuid.uuid4())
    lhc(rc, "rollout", "write", "--thread-id", tid[:8], "--session-id", new_sid,
        "--envelope-from", str(rc.project_dir / f"{sid}.jsonl"))
    before = len(api.message_requests)
    api.script(["resumed fine"])
    proc = rc.run_claude("--resume", new_sid, "-p", "next")
    assert proc.returncode == 0 and "resumed fine" in proc.stdout, proc.stderr
    (request,) = api.message_requests[before:]
    messages = request["body"]["messages"]
    assert_api_pairs(messages)
    said = [(m["role"], b.get("text") or json.dumps(b.get("content") or b.get("input"))) for m in messages
            for b in blocks(m)]
    note = next(i for i, (_r, t) in enumerate(said) if t.startswith("[cc-lhc] t2 goes on here after m"))
    prompt = next(i for i, (_r, t) in enumerate(said) if "PROMPT-OF-LONG-TURN" in t)
    first = next(i for i, (_r, t) in enumerate(said) if "small-one" in t and _r == "user")
    last = next(i for i, (_r, t) in enumerate(said) if "echo small-two" in t)
    assert prompt < first < note < last
    assert not any(t.startswith("[cc-lhc] t2 continues here") for _r, t in said)
