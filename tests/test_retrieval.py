"""Retrieval (contract, "Retrieval"): the runtime descriptor's rules, the 24,000-byte
stdout ceiling with continuation receipts, labels and ranges, search, impressions.

In process: cc_lhc.main([...]) with stdout/stderr captured, against threads read in by
capture (tests/test_views.py builds them) and descriptors made by create_descriptor.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

import cc_lhc
from conftest import CC_LHC, REPO
from test_views import Transcript, grant, intake, intake_transcript, retrieve, text, tool_use

CEILING = cc_lhc.RETRIEVAL_CEILING
HUGE = "\n".join(f"{i:06d} the quick brown fox jumps over the lazy dog \u00e9\u20ac" for i in range(6000))
SECRET = "zanzibarquokka"


@pytest.fixture
def thread(tmp_path):
    tr = Transcript()
    tr.prompt("hello there")
    tr.response(text("hi, how can I help"))
    tr.prompt(f"remember the word {SECRET} for later")
    tr.response(text(f"noted: {SECRET}"))
    tr.prompt("show me the big log")
    c = tr.response(tool_use("Bash", command="cat big.log"), stop="tool_use")
    tr.results((c[0]["id"], HUGE, False))
    tr.response(text("that was long"))
    tr.prompt("what was the word?")
    tr.response(text(f"the word was {SECRET}"))
    for i in range(5, 9):
        tr.prompt(f"turn {i} question")
        tr.response(text(f"turn {i} answer"))
    return intake_transcript(tr, tmp_path)


def impressions(thread):
    return thread.store.db.execute("SELECT session, command, labels, turns, bytes FROM impressions "
                                   "ORDER BY id").fetchall()


def run_main(capsysbinary, *argv):
    capsysbinary.readouterr()
    status = cc_lhc.main(list(argv))
    out = capsysbinary.readouterr()
    return status, out.out, out.err.decode()


COMMANDS = [("get-turns", "t1"), ("get-messages", "m2"), ("search", SECRET)]


# -- descriptor rules -------------------------------------------------------------------

def _forge(desc, **changes):
    """A copy of a valid descriptor in the runtime folder (0600), with fields changed."""
    with open(desc["path"]) as f:
        body = json.load(f)
    body.update(changes)
    path = os.path.join(os.path.dirname(desc["path"]), "forged.json")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
    return path


def _setup_missing(thread, desc, monkeypatch, tmp_path):
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV)


def _setup_malformed(thread, desc, monkeypatch, tmp_path):
    with open(desc["path"], "w") as f:
        f.write('{"token": "abc", "thread_id": ')


def _setup_not_an_object(thread, desc, monkeypatch, tmp_path):
    with open(desc["path"], "w") as f:
        f.write('["token", "thread_id", "session_id"]')


def _setup_permissions(thread, desc, monkeypatch, tmp_path):
    os.chmod(desc["path"], 0o644)


def _setup_outside_runtime(thread, desc, monkeypatch, tmp_path):
    copy = tmp_path / "elsewhere.json"
    shutil.copy(desc["path"], copy)
    os.chmod(copy, 0o600)
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, str(copy))


def _setup_dead_owner(thread, desc, monkeypatch, tmp_path):
    # a descriptor written by a wrapper process that has since exited
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cc_lhc; "
            "home = cc_lhc.StateHome(); "
            "print(cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), sys.argv[2], sys.argv[3])['path'])")
    out = subprocess.run([sys.executable, "-c", code, str(REPO), thread.id, thread.session_id],
                         capture_output=True, text=True, check=True, env=dict(os.environ))
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, out.stdout.strip())


def _setup_revoked(thread, desc, monkeypatch, tmp_path):
    with open(desc["path"], "rb") as f:
        saved = f.read()
    cc_lhc.remove_descriptor(thread.home, cc_lhc.HostDB(thread.home), desc, "session ended")
    assert not os.path.exists(desc["path"])
    fd = os.open(desc["path"], os.O_WRONLY | os.O_CREAT, 0o600)  # a copy kept by someone
    os.write(fd, saved)
    os.close(fd)


def _setup_session_mismatch(thread, desc, monkeypatch, tmp_path):
    cc_lhc.Registry(thread.home).add_alias("99999999-8888-4777-8666-555555555555", thread.id,
                                           current=True)


def _setup_forged_token(thread, desc, monkeypatch, tmp_path):
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, _forge(desc, token="f" * 32))


def _setup_forged_thread(thread, desc, monkeypatch, tmp_path):
    other = cc_lhc.Registry(thread.home).create_thread("77777777-8888-4777-8666-555555555555",
                                                       "/x", "test")
    # creating a thread writes its file (the registry copy); the test proves retrieval
    # never opens or creates one for a forged thread id, so start without it
    os.unlink(thread.home.path("threads", f"{other}.sqlite"))
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, _forge(desc, thread_id=other))


def _setup_forged_owner(thread, desc, monkeypatch, tmp_path):
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, _forge(desc, owner=cc_lhc.process_identity(os.getppid())))


REFUSALS = {
    "missing_env": (_setup_missing, "CC_LHC_RUNTIME_DESCRIPTOR is not set"),
    "malformed_json": (_setup_malformed, "missing or malformed"),
    "not_an_object": (_setup_not_an_object, "malformed"),
    "permissions_0644": (_setup_permissions, "permissions are wrong"),
    "outside_runtime": (_setup_outside_runtime, "not one of this state home's runtime descriptors"),
    "dead_owner": (_setup_dead_owner, "owned this session is gone"),
    "revoked": (_setup_revoked, "revoked or never issued"),
    "session_mismatch": (_setup_session_mismatch, "is no longer the thread's current session"),
    "forged_token": (_setup_forged_token, "revoked or never issued"),
    "forged_thread": (_setup_forged_thread, "does not match what this host issued"),
    "forged_owner": (_setup_forged_owner, "does not match what this host issued"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_descriptors_are_refused_before_any_read_or_impression(
        case, thread, monkeypatch, tmp_path, capsysbinary):
    desc = grant(thread, monkeypatch)
    setup, reason = REFUSALS[case]
    setup(thread, desc, monkeypatch, tmp_path)
    for command, label in COMMANDS:
        if case == "missing_env" and command == "search":
            continue  # with no descriptor at all, search is the people's search (tests/test_search.py)
        status, out, err = run_main(capsysbinary, command, label)
        assert status == cc_lhc.EXIT_USAGE, (case, command, err)
        assert out == b""
        assert err.startswith("cc-lhc: retrieval refused: ") and reason in err, err
        assert SECRET not in err
    assert impressions(thread) == []
    # no thread store was opened (or created) for a forged thread id either
    assert all(name.startswith(thread.id) for name in os.listdir(thread.home.path("threads")))


def test_a_valid_descriptor_works_and_is_refused_once_removed(thread, monkeypatch, capsysbinary):
    desc = grant(thread, monkeypatch)
    status, out, _ = run_main(capsysbinary, "get-turns", "t2")
    assert status == 0 and f"noted: {SECRET}".encode() in out
    cc_lhc.remove_descriptor(thread.home, cc_lhc.HostDB(thread.home), desc, "session ended")
    status, out, err = run_main(capsysbinary, "get-turns", "t2")
    assert status == 2 and out == b"" and "retrieval refused" in err
    assert len(impressions(thread)) == 1


def test_refusal_through_the_command_line(thread, tmp_path):
    env = {k: v for k, v in os.environ.items() if k != cc_lhc.RUNTIME_ENV}
    bogus = tmp_path / "bogus.json"
    bogus.write_text("{}")
    for extra in ({}, {cc_lhc.RUNTIME_ENV: str(bogus)}):
        proc = subprocess.run([sys.executable, str(CC_LHC), "get-turns", "t1"], capture_output=True,
                              text=True, env={**env, **extra}, stdin=subprocess.DEVNULL, timeout=30)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr.startswith("cc-lhc: retrieval refused: ")
    assert impressions(thread) == []


# -- the ceiling and continuation ---------------------------------------------------------

def test_huge_output_stays_under_the_ceiling_and_continues_exactly(thread, monkeypatch,
                                                                   capsysbinary):
    grant(thread, monkeypatch)
    big = next(m for m in thread.store.messages() if m["text"] == HUGE)
    body, calls = retrieve(capsysbinary, "get-messages", f"m{big['seq']}")
    assert body == cc_lhc.render_message_body(big).encode("utf-8")
    assert calls >= len(HUGE.encode()) // CEILING + 1
    # each call's impression is the bytes it wrote, each within the ceiling
    rows = impressions(thread)
    assert len(rows) == calls and all(0 < r[4] <= CEILING for r in rows)
    # get-turns of the whole turn too
    body, _ = retrieve(capsysbinary, "get-turns", f"t{big['turn']}")
    assert HUGE.encode() in body


def test_reading_the_open_turn_page_by_page_gives_it_as_it_was_at_the_first_page(tmp_path, monkeypatch,
                                                                                  capsysbinary):
    """Claude's own retrieval calls join the turn that is open while it reads it page by
    page: the continuation names the newest message of the first answer (--through), so
    the pieces join into that answer and end, and the turn reads as open throughout."""
    tr = Transcript()
    tr.prompt("start")
    tr.response(text("ok"))
    tr.prompt("read the log")
    (c,) = tr.response(tool_use("Bash", command="cat big.log"), stop="tool_use")
    tr.results((c["id"], HUGE, False))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    thread = intake(path, tr.session_id, tr.cwd)
    grant(thread, monkeypatch)
    first = thread.store.db.execute("SELECT n FROM turns WHERE status = 'open'").fetchone()[0]
    expected = f"=== t{first} (prompt, open) ===\n".encode() + b"".join(
        cc_lhc.render_message_body(m).encode() for m in thread.store.messages(first, first))
    pages = [0]

    def claude_reads_on():  # (its retrieval call and answer are written into the open turn)
        pages[0] += 1
        (call,) = tr.response(tool_use("Bash", command=f"cc-lhc get-turns t{first}"), stop="tool_use")
        tr.results((call["id"], "x" * 30_000, False))
        if pages[0] == 3:
            tr.response(text("read it all"))  # (the turn closes meanwhile)
        tr.write(path)
        cap = cc_lhc.Capture(thread.home, thread.id, tr.session_id, str(path))
        cap.catch_up()
        cap.stop()
    body, calls = retrieve(capsysbinary, "get-turns", f"t{first}", between=claude_reads_on, limit_calls=50)
    assert body == expected and calls == pages[0] + 1
    body, _ = retrieve(capsysbinary, "get-turns", f"t{first}")  # (read again, it holds the calls too)
    assert body.startswith(f"=== t{first} (prompt, closed) ===".encode()) and body.count(b"cc-lhc get-turns") >= 3


def test_a_retrieval_of_a_locked_thread_answers_without_waiting_for_its_note(thread, monkeypatch, capsysbinary):
    """The note of what a retrieval showed is a hint for later views: while another process
    holds the thread locked (a long index build), the answer does not wait seconds for it."""
    import sqlite3
    import time
    grant(thread, monkeypatch)
    holder = sqlite3.connect(thread.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        started = time.monotonic()
        status, out, _ = run_main(capsysbinary, "get-turns", "t1")
        assert status == 0 and b"hello there" in out
        assert time.monotonic() - started < 1.0  # (the search's own wait is 2 s)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert impressions(thread) == []


def test_an_output_of_one_text_with_fields_for_the_api_reads_as_its_text(tmp_path, monkeypatch, capsysbinary):
    """One text block with a field for the API (cache_control), long enough to be stored
    once: it reads back as its text, never as the store's stand-in for it; a text block
    whose text is null is no text and no lost line."""
    long_text = "line of output " * 40
    tr = Transcript()
    tr.prompt("run it")
    (c,) = tr.response(tool_use("Bash", command="run"), stop="tool_use")
    tr.results((c["id"], [{"type": "text", "text": long_text, "cache_control": {"type": "ephemeral"}}], False))
    (c2,) = tr.response(tool_use("Bash", command="run again"), stop="tool_use")
    tr.results((c2["id"], [{"type": "text", "text": None}, {"type": "text", "text": "NULL-TEXT-NEIGHBOUR"}], False))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    assert thread.store.db.execute("SELECT count(*) FROM raw_lines").fetchone() == (0,)
    grant(thread, monkeypatch)
    first, second = [m for m in thread.store.messages() if m["kind"] == "tool_result"]
    body, _ = retrieve(capsysbinary, "get-messages", f"m{first['seq']}")
    assert body.decode().split("\n", 1)[1] == long_text + "\n"
    body, _ = retrieve(capsysbinary, "get-messages", f"m{second['seq']}")
    assert body.decode().split("\n", 1)[1] == '{"type":"text","text":null}\nNULL-TEXT-NEIGHBOUR\n'


@pytest.mark.parametrize("through", ["m-1", "m1-m3", "m2,m9", "t4", "57", "m" + "9" * 30])  # (m0: see below)
def test_through_takes_one_message_label(thread, monkeypatch, capsysbinary, through):
    grant(thread, monkeypatch)
    status, out, err = run_main(capsysbinary, "get-turns", "--from", "10", "--through", through, "t1")
    assert status == cc_lhc.EXIT_USAGE and out == b"" and "--through" in err


def test_an_output_of_other_blocks_reads_back_whole(tmp_path, monkeypatch, capsysbinary):
    """A tool output holding an MCP search_result, an image or several texts: retrieval gives
    each text block's text and every other block whole as JSON (the text column only names
    them), so what search points at can be read."""
    blocks = [{"type": "text", "text": "first part"},
              {"type": "search_result", "source": "https://docs.example/p", "title": "PAGE",
               "content": [{"type": "text", "text": "SEARCH-RESULT-BODY"}], "citations": {"enabled": True}},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
              {"type": "text", "text": "last part", "cache_control": {"type": "ephemeral"}}]
    tr = Transcript()
    tr.prompt("look it up")
    (c,) = tr.response(tool_use("mcp__docs__search", query="p"), stop="tool_use")
    tr.results((c["id"], blocks, False))
    (c2,) = tr.response(tool_use("Bash", command="echo one"), stop="tool_use")
    tr.results((c2["id"], [{"type": "text", "text": "just one text"}], False))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    results = [m for m in thread.store.messages() if m["kind"] == "tool_result"]
    body, _ = retrieve(capsysbinary, "get-messages", f"m{results[0]['seq']}")
    shown = body.decode().split("\n", 1)[1]
    assert shown == "first part\n" + "\n".join(json.dumps(b, separators=(",", ":")) for b in blocks[1:3]) + \
        "\nlast part\n"  # (a text's fields for the API, cache_control, are no part of what it says)
    body, _ = retrieve(capsysbinary, "get-messages", f"m{results[1]['seq']}")
    assert body.decode().split("\n", 1)[1] == "just one text\n"


@pytest.mark.parametrize("char", ["\u00e9", "\u20ac", "\U0001f600", "a\u0301\U0001f680\u6771"])
@pytest.mark.parametrize("lead", [0, 1, 2, 3])
def test_cuts_inside_multibyte_text_join_back_exactly(char, lead, tmp_path, monkeypatch,
                                                      capsysbinary):
    content = "x" * lead + char * (90_000 // len(char.encode()))
    tr = Transcript()
    tr.prompt("emit")
    c = tr.response(tool_use("Bash", command="emit"), stop="tool_use")
    tr.results((c[0]["id"], content, False))
    tr.response(text("ok"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    m = next(m for m in thread.store.messages() if m["text"] == content)
    body, calls = retrieve(capsysbinary, "get-messages", f"m{m['seq']}")
    assert body == cc_lhc.render_message_body(m).encode("utf-8")
    assert calls <= len(content.encode()) // (CEILING - 1000) + 2  # no tiny pieces


def test_slice_body_pieces_are_whole_utf8_and_join_exactly():
    for lead in range(8):
        data = (b"h" * lead) + ("\U0001f600\u20ac\u00e9z" * 3000).encode()
        for room in (64, 100, 1001, 5000):
            start, joined, pieces = 0, b"", 0
            while True:
                piece, nxt = cc_lhc.slice_body(data, start, room)
                piece.decode("utf-8")
                assert len(piece) <= room
                joined += piece
                pieces += 1
                if nxt is None:
                    break
                assert nxt > start
                start = nxt
            assert joined == data and pieces <= len(data) // (room - 8) + 2


def test_from_past_the_end_says_nothing_is_left(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    status, out, _ = run_main(capsysbinary, "get-turns", "--from", "999999", "t1")
    assert status == 0 and b"[nothing after that offset]" in out


def test_many_labels_stay_within_the_ceiling(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    labels = [f"m{n}" for n in range(1, 400, 2)]  # a long request, every label named apart
    status, out, _ = run_main(capsysbinary, "get-messages", *labels)
    assert status == 0 and len(out) <= CEILING and out.endswith(b"</cc-lhc-recall>\n")
    # a request too long to answer within the ceiling is refused, not overrun
    labels = [f"m{n}" for n in range(1, 8000, 2)]
    status, out, err = run_main(capsysbinary, "get-messages", *labels)
    assert status == 2 and out == b"" and "ceiling" in err
    status, out, _ = run_main(capsysbinary, "get-turns", "t1-t8", "t1")
    assert status == 0 and len(out) <= CEILING
    assert b'request="get-turns t1-t8"' in out


# -- labels -------------------------------------------------------------------------------

def test_label_ranges_parse():
    assert cc_lhc.parse_labels(["t3-t5"], "t") == [3, 4, 5]
    assert cc_lhc.parse_labels(["t3\u2013t5"], "t") == [3, 4, 5]
    assert cc_lhc.parse_labels(["t3-5", "t9", "t4"], "t") == [3, 4, 5, 9]
    assert cc_lhc.parse_labels(["m7,m9..m10"], "m") == [7, 9, 10]
    for bad in (["t5-t3"], ["m3"], ["t"], ["3"], ["t3-m5"], [], ["t1-t20000"]):
        with pytest.raises(cc_lhc.LhcError) as e:
            cc_lhc.parse_labels(bad, "t")
        assert e.value.status == cc_lhc.EXIT_USAGE
    with pytest.raises(cc_lhc.LhcError, match="at most 10,000 labels past its first"):
        cc_lhc.parse_labels(["m1-m100000"], "m")  # says why, so the asker can split it
    with pytest.raises(cc_lhc.LhcError, match="the first label comes first"):
        cc_lhc.parse_labels(["t5-t3"], "t")


def test_a_request_naming_too_many_labels_in_all_is_refused_at_once():
    import time
    started = time.monotonic()
    with pytest.raises(cc_lhc.LhcError, match="more than 100,000 labels") as e:
        cc_lhc.parse_labels(["t1-t10001"] * 3000, "t")  # each range allowed, the whole not
    assert e.value.status == cc_lhc.EXIT_USAGE
    assert len(cc_lhc.parse_labels(["m1-m10001"] * 9, "m")) == 10001  # repeats: within the bound
    assert time.monotonic() - started < 30  # (never the gigabytes a full expansion took)


def test_markdown_export_fences_outlast_any_backticks_in_the_content():
    m = {"seq": 7, "kind": "tool_result", "tool_use_id": "toolu_1", "is_error": 0, "agent": None,
         "text": "before\n```\n## t99\n**m99 \u00b7 user \u00b7 prompt**\n````` five\nafter"}
    md = cc_lhc.render_markdown_message(m)
    fence = "``````"  # one longer than the longest run inside
    assert md.split("\n")[2] == fence and md.rstrip("\n").endswith("\n" + fence)
    assert md.count(fence) == 2 and m["text"] in md
    call = dict(m, kind="tool_call", tool_name="Bash", text='{"command": "echo ok"}')
    assert "\n```json\n" in cc_lhc.render_markdown_message(call)  # three when nothing needs more


def test_markdown_export_shows_terminal_controls_as_escapes_and_keeps_lines_and_tabs():
    text = "\x1b[2J\x1b]0;owned\x07red \x1b[31mFAIL\x1b[0m\r\nok\tdone\x9b"
    m = {"seq": 7, "kind": "tool_result", "tool_use_id": "toolu_1", "is_error": 0, "agent": None, "text": text}
    md = cc_lhc.render_markdown_message(m)
    assert not cc_lhc.MARKDOWN_CONTROL.search(md)
    assert "\\x1b[2J\\x1b]0;owned\\x07red \\x1b[31mFAIL\\x1b[0m\\x0d\nok\tdone\\x9b" in md


@pytest.mark.parametrize("spec", ["t3-t5", "t3\u2013t5", "t3-5"])
def test_get_turns_with_a_range(spec, thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    body, _ = retrieve(capsysbinary, "get-turns", spec)
    heads = [line for line in body.decode().splitlines() if line.startswith("=== t")]
    assert heads == ["=== t3 (prompt, closed) ===", "=== t4 (prompt, closed) ===",
                     "=== t5 (prompt, closed) ==="]
    assert f"the word was {SECRET}".encode() in body and HUGE.encode() in body
    turns = {row[3] for row in impressions(thread)}
    assert turns == {"3,4,5"}


def test_unknown_labels_are_named_not_invented(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    status, out, _ = run_main(capsysbinary, "get-turns", "t99")
    assert status == 0 and b"=== t99: no such turn in this thread ===" in out
    status, out, _ = run_main(capsysbinary, "get-messages", "m9999")
    assert status == 0 and b"--- m9999: no such message in this thread" in out
    status, out, err = run_main(capsysbinary, "get-turns", "m3")
    assert status == 2 and out == b"" and "not a turn label" in err


def test_a_range_past_the_threads_end_is_named_once(thread, monkeypatch, capsysbinary):
    """t5-t10000 of a thread of a few turns: the turns there are, then one line naming the
    rest and what the thread holds (it was a line for each label: 9,990 lines, 19 pieces
    for Claude to read on through)."""
    grant(thread, monkeypatch)
    top = thread.store.db.execute("SELECT max(n) FROM turns").fetchone()[0]
    body, _ = retrieve(capsysbinary, "get-turns", "t5-t10000")
    text = body.decode()
    assert f"=== t{top + 1}-t10000: no such turns in this thread (it holds t1-t{top}) ===" in text
    assert text.count("no such turn") == 1 and len(body) < cc_lhc.RETRIEVAL_CEILING
    assert f"=== t{top} (" in text
    top_m = thread.store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    status, out, _ = run_main(capsysbinary, "get-messages", f"m{top_m}-m{top_m + 5000}", "m1")
    assert status == 0
    assert out.decode().count("no such message") == 1
    assert f"--- m{top_m + 1}-m{top_m + 5000}: no such messages in this thread (it holds m1-m{top_m})" in out.decode()


HUGE_LABELS = [("get-turns", "t99999999999999999999"), ("get-messages", "m9223372036854775808"),
               ("get-turns", "t" + "9" * 5000), ("get-turns", "t1-t99999999999999999999"),
               ("get-messages", "m" + "1" * 5000 + "-m" + "2" * 5000)]


@pytest.mark.parametrize("command, label", HUGE_LABELS)
def test_a_label_past_64_bits_is_a_usage_error_with_nothing_printed(command, label, thread, monkeypatch,
                                                                     capsysbinary):
    grant(thread, monkeypatch)
    status, out, err = run_main(capsysbinary, command, label)
    assert status == cc_lhc.EXIT_USAGE and out == b""
    assert len(err.strip().splitlines()) == 1 and "out of range" in err, err
    assert len(err) < 200  # a 5,000-digit label is not echoed back whole
    assert impressions(thread) == []


@pytest.mark.parametrize("command, label", [("get-turns", "x" * 100_000), ("get-messages", "m1-m" + "q" * 50_000),
                                            ("get-messages", "m9-m" + "1" * 9)])
def test_a_long_argument_that_is_no_label_is_not_echoed_back_whole(command, label, thread, monkeypatch,
                                                                    capsysbinary):
    grant(thread, monkeypatch)
    status, out, err = run_main(capsysbinary, command, label)
    assert status == cc_lhc.EXIT_USAGE and out == b"" and len(err) < 300, err[:300]


@pytest.mark.parametrize("argv", [["search", "--limit", "9" * 5000, "x"], ["export", "abc", "--from=" + "x" * 5000],
                                  ["rollout", "write", "--thread-id", "a", "--session-id", "u" * 5000],
                                  ["measure", "a.jsonl", "b" * 5000]])
def test_a_long_option_value_or_argument_is_not_echoed_back_whole(argv, capsysbinary):
    status, out, err = run_main(capsysbinary, *argv)
    assert status == cc_lhc.EXIT_USAGE and len(err) < 300, err[:300]


def test_the_largest_label_sqlite_holds_is_still_a_label(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    top = (1 << 63) - 1
    status, out, _ = run_main(capsysbinary, "get-messages", f"m{top}")
    assert status == 0 and f"--- m{top}: no such message in this thread".encode() in out


@pytest.mark.parametrize("option", ["--from", "--to"])
@pytest.mark.parametrize("label", ["t99999999999999999999", "t" + "7" * 5000])
def test_export_refuses_a_huge_turn_before_printing_anything(option, label, thread, capsysbinary):
    status, out, err = run_main(capsysbinary, "export", thread.id, option, label)
    assert status == cc_lhc.EXIT_USAGE and out == b""
    assert len(err.strip().splitlines()) == 1 and "out of range" in err, err


def test_a_fifo_as_descriptor_is_refused_without_blocking(thread):
    runtime = thread.home.ensure("runtime")
    fifo = os.path.join(runtime, "fifo.json")
    os.mkfifo(fifo, 0o600)
    env = {**os.environ, cc_lhc.RUNTIME_ENV: fifo}
    proc = subprocess.run([sys.executable, str(CC_LHC), "get-turns", "t1"], capture_output=True,
                          text=True, env=env, stdin=subprocess.DEVNULL, timeout=15)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "cc-lhc: retrieval refused: the descriptor is not a regular file\n"


def test_a_withdrawn_descriptor_says_why(thread, monkeypatch, capsysbinary):
    """Claude moved to a session whose thread another cc-lhc holds: the window's retrieval
    is withdrawn, and Claude is told that, not that something is broken."""
    desc = grant(thread, monkeypatch)
    hostdb = cc_lhc.HostDB(thread.home)
    reason = "Claude moved to session S, whose thread abcd1234 is held by another cc-lhc"
    cc_lhc.revoke_descriptor(thread.home, hostdb, desc, reason)
    status, out, err = run_main(capsysbinary, "get-turns", "t1")
    assert status == 2 and out == b""
    assert err == f"cc-lhc: retrieval refused: retrieval in this window was withdrawn: {reason}\n"


def test_a_withdrawn_descriptor_says_why_through_a_linked_state_folder(tmp_path, monkeypatch, capsysbinary):
    """The state folder reached through a link (macOS's /tmp, a linked home): the reason is
    found by the path the descriptor was issued at, not only by its resolved one."""
    real, link = tmp_path / "real-home", tmp_path / "linked-home"
    real.mkdir()
    link.symlink_to(real, target_is_directory=True)
    monkeypatch.setenv("CC_LHC_HOME", str(link))
    home = cc_lhc.StateHome()
    home.ensure()
    hostdb = cc_lhc.HostDB(home)
    desc = cc_lhc.create_descriptor(home, hostdb, "thread-x", "session-x")
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, desc["path"])
    cc_lhc.revoke_descriptor(home, hostdb, desc, "Claude left session S")
    status, out, err = run_main(capsysbinary, "get-turns", "t1")
    assert status == 2 and "withdrawn: Claude left session S" in err, err


def test_an_oversized_descriptor_is_refused(thread, monkeypatch, capsysbinary):
    desc = grant(thread, monkeypatch)
    with open(desc["path"], "ab") as f:
        f.write(b" " * (cc_lhc.DESCRIPTOR_FILE_LIMIT + 1))
    status, out, err = run_main(capsysbinary, "get-turns", "t1")
    assert status == 2 and out == b"" and "missing or malformed" in err


# -- search ---------------------------------------------------------------------------------

def test_search_finds_a_word_and_returns_labels(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    status, out, _ = run_main(capsysbinary, "search", SECRET)
    assert status == 0 and len(out) <= CEILING
    text_ = out.decode()
    labels = {line.split(" ", 1)[0] for line in text_.splitlines() if line.startswith("m")}
    by_seq = {f"m{m['seq']}": m for m in thread.store.messages()}
    hits = {label for label, m in by_seq.items() if SECRET in (m["text"] or "")}
    assert labels == hits and len(hits) == 3
    for label in labels:
        assert f"{label} (t{by_seq[label]['turn']}, " in text_
    assert "cc-lhc get-messages" in text_
    row = impressions(thread)[-1]
    assert row[1] == "search" and set(row[2].split(",")) == labels and row[4] == len(out)
    status, out, _ = run_main(capsysbinary, "search", "nowhere-to-be-found-xyzzy")
    assert status == 0 and b"no messages match" in out


def test_search_output_stays_within_the_ceiling_and_continues(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    for i in range(150):
        tr.prompt(f"needle {i} " + " ".join(f"word{j}" for j in range(60)) + " needle")
        tr.response(text(f"needle answer {i} " + "filler " * 40 + "needle"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    body, calls = retrieve(capsysbinary, "search", "--limit", "200", "needle")
    assert calls >= 2  # did not fit in one output
    assert len([ln for ln in body.decode().splitlines() if ln.startswith("m")]) == 200


def test_impressions_recorded_per_retrieval(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    status, out1, _ = run_main(capsysbinary, "get-turns", "t2", "t7")
    status, out2, _ = run_main(capsysbinary, "get-messages", "m1", "m4")
    rows = impressions(thread)
    assert rows == [(thread.session_id, "get-turns", "t2,t7", "2,7", len(out1)),
                    (thread.session_id, "get-messages", "m1,m4", "1,2", len(out2))]
    assert cc_lhc.recent_impression_turns(thread.store) == {1, 2, 7}


# -- the descriptor works only inside its session's process tree -------------------------------------

def test_descends_from_follows_the_chain_of_parents():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert cc_lhc.descends_from(os.getpid(), os.getpid()) is True
        assert cc_lhc.descends_from(child.pid, os.getpid()) is True
        assert cc_lhc.descends_from(os.getpid(), child.pid) is False
    finally:
        child.kill()
        child.wait()


def test_a_descriptor_used_outside_its_sessions_process_tree_is_refused(fake_claude, iso_env):
    """Another terminal of the same user points at a live session's descriptor: refused.
    A tool Claude runs inside that session is served (the real CLI case is in
    tests/test_smart_compact_real.py::test_retrieval_works_inside_the_rebuilt_oneshot)."""
    fake_claude.script([{"run": ["cc-lhc", "get-turns", "t1"]}, {"print": "INSIDE DONE"},
                        {"sleep": None}])
    wrapper = subprocess.Popen([sys.executable, str(CC_LHC), "-p", "hi"], env=fake_claude.env,
                               cwd=fake_claude.cwd, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        inside = ""
        while "INSIDE DONE" not in inside:
            line = wrapper.stdout.readline()
            assert line, wrapper.stderr.read()
            inside += line
        assert "retrieval refused" not in inside, inside
        path = fake_claude.launches()[0]["env"][cc_lhc.RUNTIME_ENV]
        outside = subprocess.run([sys.executable, str(CC_LHC), "get-turns", "t1"],
                                 env={**fake_claude.env, cc_lhc.RUNTIME_ENV: path},
                                 cwd=fake_claude.cwd, capture_output=True, text=True, timeout=30)
        assert outside.returncode == cc_lhc.EXIT_USAGE
        assert outside.stderr.startswith("cc-lhc: retrieval refused: this process does not run "
                                         "inside the cc-lhc session"), outside.stderr
        assert outside.stdout == ""
    finally:
        wrapper.terminate()
        wrapper.communicate(timeout=30)


def test_a_negative_offset_is_refused(thread, monkeypatch, capsysbinary):
    grant(thread, monkeypatch)
    status, out, err = run_main(capsysbinary, "get-turns", "--from=-5", "t1")
    assert status == cc_lhc.EXIT_USAGE and "--from: -5 is out of range (0 or more)" in err and out == b""


def test_export_raw_lines_gives_back_what_the_record_could_not_read(tmp_path, capsysbinary):
    from test_views import intake
    tr = Transcript()
    tr.prompt("before the damage")
    tr.response(text("fine"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    torn, foreign = b'{"type":"user","uuid":"torn-in-the-mid', b'\xff\xfe not utf-8 {'
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:1] + [torn + b"\n", foreign + b"\n"] + lines[1:]))
    thread = intake(str(path), tr.session_id, tr.cwd)
    status, out, err = run_main(capsysbinary, "export", thread.id, "--format", "raw-lines")
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["line"], r["reason"]) for r in rows] == [(2, "malformed_line"), (3, "malformed_line")]
    assert rows[0]["raw"].encode() == torn and rows[0]["session"] == tr.session_id
    import base64
    assert base64.b64decode(rows[1]["raw_base64"]) == foreign and "raw" not in rows[1]
    # the messages around them are all there, and the format takes no turn range
    assert [m["text"] for m in thread.store.messages()] == ["before the damage", "fine"]
    status, out, err = run_main(capsysbinary, "export", thread.id, "--format", "raw-lines", "--from", "t1")
    assert status == cc_lhc.EXIT_USAGE and out == b""


@pytest.mark.parametrize("text, fenced", [
    ("look at this:\n```python\nprint(1)\n", True),                # a fence left open
    ("it said\n## t99\n**m1 \u00b7 user \u00b7 user_text**\nhi", True),  # the export's own headings
    ("## Plan\n```sh\nmake\n```\ndone", False),                    # Markdown of its own, whole
    ("````python\nprint(1)\n```\nafter", True),                     # a shorter fence closes nothing
    ("```python\nx = 1\n```bash\n", True),                          # a fence with words opens one
    ("```js\nlet a\n~~~\n", True),                                  # nor does another character
    ("~~~\ncode\n~~~~\nand `inline` text", False),                 # a longer one of its own does
    ("a log\n<!-- begin", True),                                   # HTML blocks run to their end
    ("<pre>\nsome text", True),
    ("<!--\n```\n-->\nThen:\n```\nprint(1)", True),               # no fence is read inside one
    ("<div>\n```\n</div>\n\n```\nx", True),
    ("<!-- a note -->\ntext", True),                                # (one is reason enough)
    ("see <!-- here, and 1 < 2", False),                            # (not where a line starts)
])
def test_a_message_whose_markdown_would_run_on_is_fenced_in_the_export(text, fenced):
    m = {"seq": 1, "kind": "user_text", "role": "user", "text": text, "agent": None, "data": None}
    md = cc_lhc.render_markdown_message(m)
    body = md.split("\n\n", 1)[1].rstrip("\n")
    assert (body != text) == fenced and text in md
    if fenced:
        fence = cc_lhc.code_fence(text)
        assert body == f"{fence}\n{text}\n{fence}"


@pytest.mark.parametrize("thought, fenced", [("## t99\nfake turn heading", True),
                                             ("**m99 \u00b7 user \u00b7 user_text**", True),
                                             ("# Thread 00000000\nmore", True),
                                             ("plain ## thoughts, and a ```fence", False)])
def test_a_thinking_message_never_passes_for_the_exports_own_headings(thought, fenced):
    """Thinking is written as a quote, where a line like the export's headings would still
    read as one: such a thinking is fenced instead."""
    m = {"seq": 1, "kind": "thinking", "role": "assistant", "text": thought, "agent": None, "data": None}
    body = cc_lhc.render_markdown_message(m).split("\n\n", 1)[1].rstrip("\n")
    fence = cc_lhc.code_fence(thought)
    assert (body == f"{fence}\n{thought}\n{fence}") == fenced
    assert fenced or body == "> " + thought.replace("\n", "\n> ")


def test_raw_lines_are_one_line_each_for_every_reader():
    """U+2028, U+2029 and U+0085 are line breaks to some readers (Python's splitlines):
    the raw-lines export writes them as escapes, so each kept line is one line everywhere."""
    record = cc_lhc.raw_line_record("s", 1, 0, "malformed_line", "a\u2028b\u2029c\x85d".encode(), "t")
    line = cc_lhc.one_line_json(record)
    assert len(line.splitlines()) == 1 and json.loads(line) == record


def test_export_of_turns_the_thread_does_not_hold_says_which_it_holds(thread, capsysbinary):
    top = thread.store.db.execute("SELECT max(n) FROM turns").fetchone()[0]
    for argv in (["--from", f"t{top + 5}"], ["--from", f"t{top + 1}", "--to", f"t{top + 9}"]):
        status, out, err = run_main(capsysbinary, "export", thread.id, *argv)
        assert status == cc_lhc.EXIT_USAGE and out == b"", out
        assert f"it holds t1\u2013t{top}" in err, err
    status, out, err = run_main(capsysbinary, "export", thread.id, "--from", f"t{top}", "--to", f"t{top + 9}")
    assert status == 0 and json.loads(out) and {m["turn"] for m in json.loads(out)} == {f"t{top}"}


def test_export_of_a_one_turn_thread_says_it_holds_only_that_turn(tmp_path, capsysbinary):
    tr = Transcript()
    tr.prompt("only")
    tr.response(text("one"))
    single = intake_transcript(tr, tmp_path)
    status, out, err = run_main(capsysbinary, "export", single.id, "--from", "t4")
    assert status == cc_lhc.EXIT_USAGE and "it holds only t1" in err, err


def test_export_refuses_a_range_that_ends_before_it_starts(thread, capsysbinary):
    status, out, err = run_main(capsysbinary, "export", thread.id, "--from", "t3", "--to", "t2")
    assert status == cc_lhc.EXIT_USAGE and out == b"" and "not a usable range" in err


# -- every label range cc-lhc names is one retrieval takes --------------------------------------

def test_every_range_a_header_or_a_receipt_names_is_one_retrieval_takes():
    """A range longer than get-turns and get-messages take (10,000 labels past its first)
    is never written: the header's omitted turns and a receipt's request are cut as they
    take them (a receipt joined two adjacent ranges back into one it then refused)."""
    from test_prune import uniform_turns
    assert cc_lhc._request_text("m", range(1, 10005)) == "m1-m10001 m10002-m10004"
    assert cc_lhc._request_text("t", [3, 4, 5, 9]) == "t3-t5 t9"
    turns = uniform_turns(10_400, out_bytes=8)
    _view, header = cc_lhc.serve_view("thread-x", turns, 3_000, "default", {})
    omitted = [line for line in header.splitlines() if "not in view" in line]
    assert len(omitted) >= 2
    for line in omitted:
        a, b = line.split()[1].split("\u2013")
        assert cc_lhc.parse_labels([f"{a}-{b}"], "t")  # (refused: ValueError or a usage error)


def test_a_receipt_of_a_thread_that_held_no_message_is_followed(tmp_path, monkeypatch, capsysbinary):
    import re
    import uuid
    home = cc_lhc.StateHome()
    home.ensure()
    sid = str(uuid.uuid4())
    thread = cc_lhc.Registry(home).create_thread(sid, str(tmp_path), "test")
    desc = cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), thread, sid)
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, desc["path"])
    # (labels apart from each other, each named on a line of its own: an answer past the ceiling)
    status, out, err = run_main(capsysbinary, "get-turns", *(f"t{n}" for n in range(1, 6000, 2)))
    rest = re.search(rb"cc-lhc (get-turns --from \d+ --through m0 [^\n\]]+)", out)
    assert status == 0 and rest, (out[-300:], err)
    status, out, err = run_main(capsysbinary, *rest.group(1).decode().split())
    assert status == 0 and b"no such turn" in out, err


def test_retrieval_names_a_thread_record_that_is_gone_and_makes_none(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    tr.prompt("hello")
    tr.response(text("world"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    thread.store.close()
    path = thread.home.path("threads", f"{thread.id}.sqlite")
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            os.unlink(path + suffix)
    for command in (["get-turns", "t1"], ["search", "hello"]):
        status, out, err = run_main(capsysbinary, *command)
        assert status != 0 and out == b"" and "is missing" in err, err
    assert not os.path.exists(path)


def test_retrieval_with_its_output_closed_says_so_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, str(CC_LHC), "get-turns", "t1"], capture_output=False,
                          stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=30,
                          preexec_fn=lambda: os.close(1), env={**os.environ, "CC_LHC_HOME": str(tmp_path)})
    assert proc.returncode == cc_lhc.EXIT_ERROR and "standard output is closed" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("raw", [
    b"\x00" * (3 << 20) + b"\n",                                              # a crash's run of NULs
    ("\u00e9\u4e2d\U0001f389\u2028" * 300_000).encode(),                     # characters split by the pieces
    b"\xff" + b"\x00" * (2 << 20) + "\u00e9".encode() * 10,                 # not UTF-8: base64
    b"ok" * 20,
])
def test_a_kept_line_of_megabytes_is_written_in_pieces_as_it_would_be_whole(raw):
    """The raw-lines export writes a large kept line a piece at a time (a 200 MB run of NULs
    took 2.9 GB, its escapes made whole twice), and the line reads back exactly as the
    record of it made whole."""
    import io
    whole = cc_lhc.one_line_json(cc_lhc.raw_line_record("s", 7, 99, "malformed_line", raw, "t")) + "\n"
    out = io.StringIO()
    cc_lhc.write_raw_line(out, "s", 7, 99, "malformed_line", raw, "t")
    assert out.getvalue() == whole and len(out.getvalue().splitlines()) == 1


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_the_raw_lines_export_of_a_large_kept_line_takes_memory_near_its_size(tmp_path):
    child = subprocess.run([sys.executable, "-c", r"""
import io, os, sys
import cc_lhc
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
raw = b"\x00" * (40 << 20)
before = hwm()
with open(os.devnull, "w") as out:
    cc_lhc.write_raw_line(out, "s", 1, 0, "malformed_line", raw, "t")
print(hwm() - before)
"""], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert child.returncode == 0, child.stderr
    assert int(child.stdout) < 2 * (40 << 20)  # (whole, a NUL's six-character escape took 12 times the line)


@pytest.mark.parametrize("label", ["t00000000000000000001", "m" + "0" * 40 + "2"])
def test_a_zero_padded_label_is_read_by_its_value(label):
    """Leading zeros counted toward the length past which a label is out of range: a
    20-digit t00000000000000000001 was refused, as if past 9,223,372,036,854,775,807."""
    assert cc_lhc.parse_labels([label], label[0]) == [int(label[1:])]


@pytest.mark.parametrize("command", ["get-turns", "get-messages", "search"])
def test_a_descriptor_variable_set_but_empty_is_refused(iso_env, monkeypatch, capsysbinary, command):
    """CC_LHC_RUNTIME_DESCRIPTOR set to nothing was "not set" to get-turns and get-messages,
    and made search a person's search of this folder's threads (from inside Claude's
    session, another thread's text): it names no session, and every retrieval refuses it."""
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, "")
    status = cc_lhc.main([command, "t1" if command == "get-turns" else "m1" if command == "get-messages" else "x"])
    out, err = capsysbinary.readouterr()
    assert status == cc_lhc.EXIT_USAGE and out == b"" and b"is set but empty" in err, err
