"""Derivations: extractive summaries, the durable work queue, and isolated summarisers."""

from __future__ import annotations

import json
import types
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import cc_lhc
from fakeapi import text_reply, user_texts


# -- helpers ------------------------------------------------------------------------------

def msg(seq, turn, kind, text, role=None, tool_use_id=None, tool_name=None, is_error=0):
    role = role or ("assistant" if kind in ("assistant_text", "tool_call", "thinking") else "user")
    return {"seq": seq, "turn": turn, "segment": 0, "role": role, "kind": kind, "text": text,
            "data": None, "tool_use_id": tool_use_id, "tool_name": tool_name, "is_error": is_error,
            "response_id": None, "model": None, "source_session": "s", "source_uuid": f"u{seq}",
            "block": 0, "line": seq, "created": "2026-01-01T00:00:00.000Z"}


def sample_turn(turn=1, first=1, prompt="Please fix the crash in /src/quux.py when dividing"):
    s = first
    return [
        msg(s, turn, "user_text", prompt),
        msg(s + 1, turn, "thinking", "SECRET-THINKING should never be summarised"),
        msg(s + 2, turn, "tool_call", json.dumps({"file_path": "/src/quux.py"}),
            tool_use_id=f"c{s}a", tool_name="Read"),
        msg(s + 3, turn, "tool_result", "def f(x):\n    return 1 / x\n", tool_use_id=f"c{s}a"),
        msg(s + 4, turn, "tool_call", json.dumps({"command": "python3 -m pytest tests/test_quux.py",
                                                  "description": "run tests"}),
            tool_use_id=f"c{s}b", tool_name="Bash"),
        msg(s + 5, turn, "tool_result", "ZeroDivisionError: division by zero", tool_use_id=f"c{s}b",
            is_error=1),
        msg(s + 6, turn, "tool_call", json.dumps({"pattern": "def f\\(", "path": "/src"}),
            tool_use_id=f"c{s}c", tool_name="Grep"),
        msg(s + 7, turn, "tool_result", "/src/quux.py:1", tool_use_id=f"c{s}c"),
        msg(s + 8, turn, "assistant_text", "Fixed: f() now returns 0 when x == 0; 12 tests pass."),
    ]


def new_store(home, messages_by_turn, statuses=None):
    """A thread store holding the given turns (status closed unless said otherwise)."""
    thread_id = str(uuid.uuid4())
    store = cc_lhc.ThreadStore(home, thread_id)
    with cc_lhc.Tx(store.db) as db:
        for turn, messages in messages_by_turn.items():
            status = (statuses or {}).get(turn, "closed")
            db.execute("INSERT INTO turns (n, kind, status, first_seq, last_seq) VALUES (?, 'prompt', ?, ?, ?)",
                       (turn, status, messages[0]["seq"], messages[-1]["seq"]))
            db.executemany(f"INSERT INTO messages ({', '.join(cc_lhc.MESSAGE_COLUMNS)}) VALUES "
                           f"({', '.join('?' * len(cc_lhc.MESSAGE_COLUMNS))})",
                           [tuple(m.get(c) for c in cc_lhc.MESSAGE_COLUMNS) for m in messages])
    return store


def work_row(store, turn):
    row = store.db.execute("SELECT status, attempts, expiries, owner, error, not_before FROM work "
                           "WHERE turn = ?", (turn,)).fetchone()
    return dict(zip(("status", "attempts", "expiries", "owner", "error", "not_before"), row))


def dead_identity():
    """The identity of a process that ran and is gone (reaped, so not even a zombie)."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    ident = cc_lhc.process_identity(child.pid)
    assert cc_lhc.identity_alive(ident)
    child.communicate(b"")
    assert not cc_lhc.identity_alive(ident)
    return ident


def log_lines(home):
    path = Path(home.path("wrapper.log"))
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture
def home(iso_env):
    return cc_lhc.StateHome(str(iso_env.lhc))


# -- extractive summary (pure) ------------------------------------------------------------

def test_extractive_summary_names_prompt_tools_errors_and_reply():
    text = cc_lhc.extractive_summary(sample_turn())
    assert text.startswith("(extractive summary)\n")
    assert "Asked (m1): Please fix the crash in /src/quux.py" in text
    assert "Read m3 /src/quux.py" in text
    assert "Bash m5 python3 -m pytest tests/test_quux.py" in text
    assert "Grep m7 def f\\(" in text
    assert "Errors (1): Bash m6: ZeroDivisionError: division by zero" in text
    assert "Answered (m9): Fixed: f() now returns 0 when x == 0; 12 tests pass." in text
    assert "SECRET-THINKING" not in text


def test_extractive_summary_is_deterministic_and_bounded():
    calls = []
    for i in range(60):
        calls.append(msg(100 + 2 * i, 1, "tool_call", json.dumps({"command": f"make target{i} " + "x" * 500}),
                         tool_use_id=f"k{i}", tool_name="Bash"))
        calls.append(msg(101 + 2 * i, 1, "tool_result", "failure " * 400, tool_use_id=f"k{i}", is_error=1))
    huge = [msg(1, 1, "user_text", "word " * 20000)] + calls + [
        msg(999, 1, "assistant_text", "The end " * 5000)]
    first = cc_lhc.extractive_summary(huge)
    assert first == cc_lhc.extractive_summary([dict(m) for m in huge])
    assert len(first) <= cc_lhc.EXTRACTIVE_MAX_CHARS
    assert "Tools (60):" in first and "Errors (60):" in first
    assert "Answered (m999): The end" in first  # the reply survives the caps of the lines above


def test_a_line_cut_to_a_limit_reads_only_what_the_limit_takes_and_says_the_same():
    """A 12 MB prompt was split into all its words to keep a few hundred characters (100 MB
    for one extractive summary). The line cut to a limit is the whole line's, cut."""
    import random
    random.seed(11)
    pieces = ["word", " ", "\n\n", "\t", "   " * 50, "\u00e9t\u00e9", "x" * 300, "\u3000", ""]
    for _ in range(2000):
        text = "".join(random.choice(pieces) for _ in range(random.randint(0, 120)))
        for limit in (1, 5, 60, 80, 300):
            assert cc_lhc._clip(cc_lhc._one_line(text, limit), limit) == cc_lhc._clip(cc_lhc._one_line(text), limit)
    big = [msg(1, 1, "user_text", "      \n" * 400_000 + "the prompt " * 300_000),
           msg(2, 1, "assistant_text", "done " * 300_000)]
    import tracemalloc
    tracemalloc.start()
    summary = cc_lhc.extractive_summary(big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert "Asked (m1): the prompt the prompt" in summary and "Answered (m2): done done" in summary
    assert peak < 20_000_000, peak  # (the texts are 6 MB; all their words were 60 MB and more)


def test_extractive_summary_of_a_turn_without_text():
    text = cc_lhc.extractive_summary([msg(4, 2, "tool_call", "{}", tool_use_id="a", tool_name="Task")])
    assert text.startswith(cc_lhc.EXTRACTIVE_MARKER)
    assert "Tools (1): Task m4" in text and "no text reply" in text


def test_a_part_of_a_long_turn_is_not_summarised_as_the_whole_turn():
    """A long turn is cut into parts; a summarised part is not the turn, so it never says
    the turn had no reply (its answer is in a later part), and its last words are what
    was said there, not the turn's answer."""
    calls = [msg(4, 2, "tool_call", "{}", tool_use_id="a", tool_name="Bash")]
    text = cc_lhc.extractive_summary(calls, part=True)
    assert "Tools (1): Bash m4" in text and "Answered" not in text and "no text reply" not in text
    text = cc_lhc.extractive_summary(calls + [msg(6, 2, "assistant_text", "step 2 done")], part=True)
    assert "Said last (m6): step 2 done" in text and "Answered" not in text


def test_summariser_input_is_labelled_and_capped():
    rendered = cc_lhc.render_turn_for_summary(sample_turn())
    assert "[m1 user]\nPlease fix" in rendered
    assert "[m6 tool result of Bash, error]\nZeroDivisionError" in rendered
    assert "SECRET-THINKING" not in rendered
    long_turn = [msg(1, 1, "user_text", "the opening prompt")] + [
        msg(i, 1, "assistant_text", f"step {i} " + "y" * 5000) for i in range(2, 80)] + [
        msg(80, 1, "assistant_text", "the closing answer")]
    capped = cc_lhc.render_turn_for_summary(long_turn)
    assert len(capped) <= cc_lhc.SUMMARY_INPUT_MAX_CHARS
    assert "the opening prompt" in capped and "the closing answer" in capped
    assert "messages left out" in capped and "characters left out" in capped


@pytest.mark.parametrize("status, stdout, problem", [
    (1, "", "exit status 1"),
    (0, "this is not json", "not a JSON result"),
    (1, json.dumps({"type": "result", "is_error": True, "result": "API Error: 500"}), "API Error: 500"),
    (0, json.dumps({"type": "result", "is_error": False, "result": "  "}), "no summary text"),
])
def test_summariser_output_failures(status, stdout, problem):
    with pytest.raises(cc_lhc.SummariserError, match=problem):
        cc_lhc.parse_summariser_output(status, stdout, "")


def test_summariser_output_counts_every_input_token():
    out = json.dumps({"result": " A summary. ", "is_error": False, "modelUsage": {"claude-x": {}},
                      "usage": {"input_tokens": 7, "cache_creation_input_tokens": 5,
                                "cache_read_input_tokens": 3, "output_tokens": 9}})
    assert cc_lhc.parse_summariser_output(0, "noise\n" + out, "") == {
        "text": "A summary.", "model": "claude-x", "input_tokens": 15, "output_tokens": 9}


# -- the work queue -----------------------------------------------------------------------

def test_queue_claim_finish_and_summary_sources(home):
    store = new_store(home, {1: sample_turn(1, 1), 2: sample_turn(2, 20), 3: sample_turn(3, 40)},
                      statuses={2: "interrupted", 3: "open"})
    assert cc_lhc.queue_summaries(store) == 2  # the open turn waits until it settles
    assert cc_lhc.queue_summaries(store) == 0
    me = cc_lhc.process_identity()
    first = cc_lhc.claim_work(store, me)
    second = cc_lhc.claim_work(store, me)
    assert (first["turn"], first["attempts"]) == (1, 1) and second["turn"] == 2
    assert cc_lhc.claim_work(store, me) is None
    cc_lhc.finish_work(store, first["id"], {"text": "Model summary of t1.", "model": "m",
                                            "input_tokens": 120, "output_tokens": 30})
    assert cc_lhc.turn_summary(store, 1) == ("Model summary of t1.", "model")
    text, source = cc_lhc.turn_summary(store, 2)
    assert source == "extractive" and text == cc_lhc.extractive_summary(sample_turn(2, 20))
    assert store.db.execute("SELECT count(*) FROM derivations").fetchone()[0] == 1  # never stored
    assert cc_lhc.derivation_cost(store) == {"calls": 1, "input_tokens": 120, "output_tokens": 30}
    assert work_row(store, 1)["status"] == "done"
    assert cc_lhc.queue_summaries(store, turns=[1, 2]) == 0
    # a view reads them all at once, as turn_summary gives each: the newest model-written one
    store.db.execute("INSERT INTO derivations (turn, kind, text, source) VALUES (1, ?, 'Newer summary.', 'model')",
                     (cc_lhc.SUMMARY_KIND,))
    turns = [types.SimpleNamespace(n=n, messages=sample_turn(n, s)) for n, s in ((1, 1), (2, 20))]
    assert cc_lhc.thread_summaries(store, turns) == {1: ("Newer summary.", "model"), 2: (text, "extractive")}
    assert cc_lhc.turn_summary(store, 1) == ("Newer summary.", "model")


def test_claims_of_dead_owners_are_retried_once_then_failed_with_a_warning(home):
    store = new_store(home, {1: sample_turn()})
    cc_lhc.queue_summaries(store)
    assert cc_lhc.claim_work(store, dead_identity())["attempts"] == 1  # claimed, then "crashed"

    # A second process (still running while it claims) picks up the crashed item...
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    dead2 = cc_lhc.process_identity(child.pid)
    again = cc_lhc.claim_work(store, dead2)
    assert again["turn"] == 1 and again["attempts"] == 2 and again["expiries"] == 1
    row = work_row(store, 1)
    assert row["error"] == "claim_expired" and json.loads(row["owner"])["pid"] == child.pid
    assert cc_lhc.claim_work(store, cc_lhc.process_identity()) is None  # a live owner keeps it

    # ...and crashes too: the item is given up instead of being tried a third time.
    child.communicate(b"")
    assert cc_lhc.claim_work(store, cc_lhc.process_identity()) is None
    row = work_row(store, 1)
    assert row["status"] == "failed" and row["error"] == "claim_expired_repeatedly"
    warnings = [e for e in log_lines(home) if e["event"] == "derivation_failed"]
    assert len(warnings) == 1
    assert warnings[0]["level"] == "warning" and warnings[0]["error"] == "claim_expired_repeatedly"
    assert warnings[0]["turn"] == 1 and warnings[0]["thread"] == store.thread_id
    assert cc_lhc.turn_summary(store, 1)[1] == "extractive"  # a view still gets its summary


def test_release_hands_claims_back_without_counting_an_attempt(home):
    store = new_store(home, {1: sample_turn(1, 1), 2: sample_turn(2, 20)})
    cc_lhc.queue_summaries(store)
    me, other = cc_lhc.process_identity(), {**cc_lhc.process_identity(), "worker": "other"}
    cc_lhc.claim_work(store, me)
    cc_lhc.claim_work(store, other)
    assert cc_lhc.release_work(store, me) == 1
    assert work_row(store, 1) == {"status": "queued", "attempts": 0, "expiries": 0, "owner": None,
                                  "error": None, "not_before": None}
    assert work_row(store, 2)["status"] == "claimed"  # somebody else's claim is left alone
    assert cc_lhc.claim_work(store, me)["attempts"] == 1


def test_failed_attempts_wait_then_retry_up_to_the_bound(home):
    store = new_store(home, {1: sample_turn()})
    cc_lhc.queue_summaries(store)
    me = cc_lhc.process_identity()
    now = "2026-03-01T10:00:00.000Z"
    item = cc_lhc.claim_work(store, me, now=now)
    assert cc_lhc.fail_work(store, item["id"], "boom 1", now=now) == "queued"
    assert work_row(store, 1)["not_before"] == "2026-03-01T10:00:30.000Z"
    assert cc_lhc.claim_work(store, me, now="2026-03-01T10:00:29.000Z") is None
    later = "2026-03-01T11:00:00.000Z"
    assert cc_lhc.claim_work(store, me, now=later)["attempts"] == 2
    assert cc_lhc.fail_work(store, item["id"], "boom 2", spent={"input_tokens": 50, "output_tokens": 0},
                            now=later) == "queued"
    much_later = "2026-03-02T00:00:00.000Z"
    assert cc_lhc.claim_work(store, me, now=much_later)["attempts"] == 3
    assert cc_lhc.fail_work(store, item["id"], "boom 3", now=much_later) == "failed"
    assert cc_lhc.claim_work(store, me, now="2027-01-01T00:00:00.000Z") is None
    assert work_row(store, 1)["error"] == "boom 3"
    assert cc_lhc.derivation_cost(store) == {"calls": 1, "input_tokens": 50, "output_tokens": 0}


# -- summarisers --------------------------------------------------------------------------

def test_summariser_end_to_end_with_the_real_cli(real_claude, home):
    store = new_store(home, {1: sample_turn()})
    summary = "User asked to fix /src/quux.py; ZeroDivisionError fixed, 12 tests pass."
    real_claude.api.script([text_reply(summary, usage={"input_tokens": 900, "cache_creation_input_tokens": 0,
                                                       "cache_read_input_tokens": 100, "output_tokens": 40})])
    worker = cc_lhc.DerivationWorker(home, store.thread_id)
    assert worker.run_pending() == 1 and worker.done == 1

    (request,) = real_claude.api.message_requests
    body = request["body"]
    assert body.get("tools", []) == []
    prompt = "\n".join(user_texts(body))
    assert "[m1 user]\nPlease fix the crash in /src/quux.py" in prompt
    assert "ZeroDivisionError: division by zero" in prompt and "SECRET-THINKING" not in prompt
    assert cc_lhc.turn_summary(store, 1) == (summary, "model")
    model = store.db.execute("SELECT source, model, input_tokens, output_tokens FROM derivations").fetchone()
    assert model[0] == "model" and model[1] and model[2:] == (1000, 40)
    assert cc_lhc.derivation_cost(store) == {"calls": 1, "input_tokens": 1000, "output_tokens": 40}
    # No transcript anywhere: not for the private cwd, not for the user's project folder.
    assert list((real_claude.config_dir / "projects").rglob("*.jsonl")) == []
    assert not real_claude.project_dir.exists()
    # ...and the CLI wrote none to begin with (the clean-up after each run had nothing to do).
    assert not [e for e in log_lines(home) if e["event"] == "summariser_transcript_removed"]
    assert Path(home.path("derivations", "work")).is_dir()
    assert list(Path(home.path("derivations", "work")).iterdir()) == []


def test_real_cli_flags_still_mean_what_we_rely_on(real_claude, home):
    """Without --no-session-persistence / --tools "" the same CLI would write a transcript
    and offer tools: proves the two checks above can fail."""
    cwd = Path(home.ensure("derivations", "work"))
    result = real_claude.run_claude("-p", "hello", "--output-format", "json", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert list((real_claude.config_dir / "projects" / cc_lhc.project_slug(str(cwd))).glob("*.jsonl"))
    assert real_claude.api.message_requests[0]["body"].get("tools")


def test_failing_summariser_leaves_the_extractive_summary(fake_claude, home, monkeypatch):
    monkeypatch.setenv("FAKE_CLAUDE_SCRIPT", json.dumps([{"stderr": "no network"}, {"exit": 1}]))
    monkeypatch.setenv("CC_LHC_SOMETHING_PRIVATE", "must not leak")
    store = new_store(home, {1: sample_turn()})
    worker = cc_lhc.DerivationWorker(home, store.thread_id)
    assert worker.run_pending() == 1 and worker.failed == 1  # did not raise
    row = work_row(store, 1)
    assert row["status"] == "queued" and row["attempts"] == 1 and row["not_before"]
    assert "exit status 1" in row["error"] and "no network" in row["error"]
    text, source = cc_lhc.turn_summary(store, 1)
    assert source == "extractive" and text.startswith(cc_lhc.EXTRACTIVE_MARKER)
    assert cc_lhc.derivation_cost(store)["calls"] == 0  # no usage reported, nothing spent

    (launch,) = fake_claude.launches()
    assert launch["cwd"] == home.path("derivations", "work")
    assert "--no-session-persistence" in launch["argv"]
    assert launch["argv"][-2:] == ["--tools", ""]
    assert not [k for k in launch["env"] if k.startswith("CC_LHC_")]
    assert launch["env"]["DISABLE_AUTO_COMPACT"] == "1"
    assert launch["tty"] == {"stdin": False, "stdout": False, "stderr": False}
    assert any(e["event"] == "derivation_attempt_failed" for e in log_lines(home))


def test_missing_claude_is_a_failed_attempt_not_a_crash(home, monkeypatch, tmp_path):
    monkeypatch.setenv("CC_LHC_CLAUDE_BIN", str(tmp_path / "no-such-claude"))
    store = new_store(home, {1: sample_turn()})
    worker = cc_lhc.DerivationWorker(home, store.thread_id)
    assert worker.run_pending() == 1
    assert "not an executable file" in work_row(store, 1)["error"]


def test_worker_thread_stop_ends_the_run_and_releases_its_claim(fake_claude, home, monkeypatch):
    monkeypatch.setenv("FAKE_CLAUDE_SCRIPT", json.dumps([{"sleep": None}]))
    store = new_store(home, {1: sample_turn()})
    worker = cc_lhc.DerivationWorker(home, store.thread_id, idle_seconds=0.05).start()
    deadline = time.monotonic() + 10
    while not fake_claude.launches() or worker._proc is None:
        assert time.monotonic() < deadline, "the summariser never started"
        time.sleep(0.02)
    assert work_row(store, 1)["status"] == "claimed"
    started = time.monotonic()
    worker.stop()
    assert time.monotonic() - started < 5
    assert not worker._thread.is_alive()
    row = work_row(store, 1)
    assert row["status"] == "queued" and row["attempts"] == 0 and row["owner"] is None
    assert worker.failed == 0


def test_ids_are_the_uuids_the_uuid_module_makes():
    """cc-lhc makes its UUIDs without the uuid module (which imports platform at every
    start): a name-based one equals uuid.uuid5's, byte for byte, and a random one is a
    well-formed version 4 UUID, a new one each time."""
    namespace = uuid.UUID(bytes=cc_lhc.ROLLOUT_NAMESPACE)
    for name in ("", "measure/abc", "3f2a9c1e-77b0-4c1e-9f3e-0d5f5e8b2a11/17", "é\u4e2d\U0001f600"):
        assert cc_lhc.name_uuid(name) == str(uuid.uuid5(namespace, name))
    made = {cc_lhc.new_session_id() for _ in range(200)}
    assert len(made) == 200
    for text in made:
        parsed = uuid.UUID(text)
        assert str(parsed) == text and parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert cc_lhc.is_uuid(text)


def test_importing_cc_lhc_does_not_import_uuid_or_platform():
    proc = subprocess.run([sys.executable, "-c", "import sys; import cc_lhc; "
                           "print(sorted(m for m in ('uuid', 'platform') if m in sys.modules))"],
                          cwd=Path(cc_lhc.__file__).parent, capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"
