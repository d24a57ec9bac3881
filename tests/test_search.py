"""`cc-lhc search` (issue 11, parts 4 and 5): any exact string is found, exact matches come
before messages that only share the words, each hit names its label, turn and time with a
line of context; outside a session people search this folder's threads, one, or all.

In process against threads read in by capture (tests/test_views.py builds them), on a
generated real-CLI-shaped session with hard strings spliced in, and once through the real
CLI, whose Bash runs `cc-lhc search` inside a session.
"""

from __future__ import annotations

import bisect
import os
import itertools
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

import cc_lhc
from conftest import CC_LHC, REPO
from test_views import Transcript, grant, intake, intake_transcript, text, thinking, tool_use

sys.path.insert(0, str(REPO / "scripts"))
from gen_transcript import generate  # noqa: E402

HIT_RE = re.compile(r"^(?:(?P<thread>[0-9a-f]{8}) )?m(?P<seq>\d+) \(t(?P<turn>\d+), (?P<what>[^,]+), "
                    r"(?P<when>[^,]+), (?P<how>exact|words)\): (?P<context>.*)$")

GREP = r'grep -n "^def \|^class " pylib/ipaddress.py'
MD5_ERROR = "AssertionError: 'd41d8cd98f00b204e9800998ecf8427e'"
HARD = [GREP, r"sed -i 's/\(foo\)\*/\1+/g' a.txt", 'jq -r \'.items[] | "\\(.name): \\(.id)"\' x.json',
        "NEAR(one two) AND ^start* OR col:value", 'say "hi" \\\\ there', "a\\\"quoted\\\" b"]


def hits_of(out: str):
    return [HIT_RE.match(line).groupdict() for line in out.splitlines() if HIT_RE.match(line)]


def search(capsysbinary, *argv):
    capsysbinary.readouterr()
    status = cc_lhc.main(["search", *argv])
    out = capsysbinary.readouterr()
    return status, out.out.decode(), out.err.decode()


def assert_found_first_exactly(capsysbinary, needles) -> None:
    """Each needle's search (in the granted session) answers with an exact hit first, whose
    line shows it as the thread holds it."""
    for needle in needles:
        status, out, _ = search(capsysbinary, needle)
        assert status == 0 and hits_of(out) and hits_of(out)[0]["how"] == "exact", (needle, out)
        assert needle in out


@pytest.fixture
def hard(tmp_path):
    """A thread whose tool inputs, outputs and thinking hold strings full of FTS syntax."""
    tr = Transcript()
    tr.prompt("look at the module")
    calls = tr.response(thinking("I think the\tparser \x1b[31mfails\x1b[0m on NEAR(one two) AND ^start* OR col:value here"),
                        tool_use("Bash", command=GREP, description="definitions for the parser"),
                        stop="tool_use")
    tr.results((calls[1]["id"], "12:def ip_address(address):\n40:class IPv4Address:", False))
    calls = tr.response(tool_use("Bash", command=HARD[1]), tool_use("Bash", command=HARD[2]),
                        tool_use("Bash", command=HARD[4]), tool_use("Bash", command=HARD[5]),
                        stop="tool_use")
    tr.results(*[(c["id"], "ok", False) for c in calls])
    calls = tr.response(tool_use("Bash", command="python -m pytest -q tests/test_md5.py"), stop="tool_use")
    tr.results((calls[0]["id"], f"F\n>       assert digest == ''\nE       {MD5_ERROR}\n1 failed", True))
    tr.response(text("the digest of the empty input is wrong; ok"))
    tr.prompt("and the class parser: is it fine?")
    tr.response(text("the class parser is fine"))
    return intake_transcript(tr, tmp_path)


def test_exact_strings_with_fts_syntax_are_found_first(hard, monkeypatch, capsysbinary):
    grant(hard, monkeypatch)
    messages = hard.messages()
    for needle in HARD + [MD5_ERROR, "\\(", "'", "d41d8cd98f00b204"]:  # short ones are scanned
        status, out, err = search(capsysbinary, "--limit", "3", needle)
        assert status == 0, err
        found = hits_of(out)
        assert found and found[0]["how"] == "exact", (needle, out)
        m = messages[int(found[0]["seq"])]
        assert needle in _visible(m), (needle, m)
        assert f"t{m['turn']}" == "t" + found[0]["turn"]
        assert found[0]["when"].startswith("2026-05-01 ") and found[0]["when"].endswith(" UTC")
    status, out, _ = search(capsysbinary, GREP)
    (first, *_rest) = hits_of(out)
    assert first["what"] == "tool_call Bash"
    assert first["context"] == "\u00bb" + GREP + "\u00ab\u2026"  # the command, then its description
    # thinking text is searched too, and its context is one line with the controls escaped
    status, out, _ = search(capsysbinary, "\x1b[31mfails")
    (hit,) = [h for h in hits_of(out) if h["how"] == "exact"]
    assert hit["what"] == "thinking" and "\n" not in hit["context"]
    assert hit["context"] == "I think the\\tparser \u00bb\\x1b[31mfails\u00ab\\x1b[0m on NEAR(one two) AND ^start* OR col:value here"


def _visible(m) -> str:
    """A message's content as Claude saw it: a tool call's input values, decoded."""
    if m["kind"] == "tool_call":
        return "\n".join(v for v in _strings(json.loads(m["text"])))
    return m["text"] or ""


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_words_rank_only_a_vague_query(hard, monkeypatch, capsysbinary):
    grant(hard, monkeypatch)
    status, out, _ = search(capsysbinary, "class parser")
    found = hits_of(out)
    assert [(h["what"], h["how"]) for h in found] == [("assistant_text", "exact"), ("user_text", "exact")]
    # words that never stand so together: the word index finds and ranks what holds them all
    status, out, _ = search(capsysbinary, "parser class")
    found = hits_of(out)
    assert {h["how"] for h in found} == {"words"} and len(found) == 3
    assert "tool_call Bash" in {h["what"] for h in found}  # the description holds "parser"
    status, out, _ = search(capsysbinary, "digest empty wrong")
    (hit,) = hits_of(out)
    assert hit["how"] == "words" and hit["what"] == "assistant_text"
    assert hit["context"] == "the \u00bbdigest\u00ab of the \u00bbempty\u00ab input is \u00bbwrong\u00ab; ok"
    status, out, _ = search(capsysbinary, "()")  # no words, no match: an answer, not an error
    assert status == 0 and "no messages match" in out


def test_words_are_read_from_a_calls_values_not_its_json(hard, monkeypatch, capsysbinary):
    """The word index holds a tool call's string values, as Claude wrote them: the input's
    keys ("command", "description") are no words of it, and the context is decoded."""
    grant(hard, monkeypatch)
    status, out, _ = search(capsysbinary, "description command")
    assert status == 0 and "no messages match" in out, out
    status, out, _ = search(capsysbinary, "definitions grep")
    (hit,) = hits_of(out)
    assert hit["how"] == "words" and hit["what"] == "tool_call Bash"
    assert hit["context"].startswith("»grep« -n \"^def \\|^class \" pylib/ipaddress.py"), hit


def test_the_envelope_names_a_request_with_quotes_or_newlines_on_one_line(hard, monkeypatch, capsysbinary):
    grant(hard, monkeypatch)
    for needle, shown in (('say "hi" \\\\ there', "search 'say &quot;hi&quot; \\\\\\\\ there'"),
                          ("a\\nb", "search 'a\\\\nb'"),            # a backslash and an n, not a newline
                          ("one\n\ttwo <x>", "search 'one\\n\\ttwo &lt;x>'")):
        status, out, _ = search(capsysbinary, needle)
        opening = out.split("\n", 1)[0]
        assert status == 0 and opening == f'<cc-lhc-recall thread="{hard.id[:8]}" request="{shown}">', opening


def test_claudes_own_searches_come_after_what_they_found(tmp_path, monkeypatch, capsysbinary):
    """A string Claude searched for is also in its search's call and in the answer it got
    back: those come last, in the session and for people, so searching again still
    shows the original first, and a page of hits is not filled with searches."""
    tr = Transcript()
    tr.prompt("read the secret")
    calls = tr.response(tool_use("Bash", command="cat secret.txt"), stop="tool_use")
    tr.results((calls[0]["id"], "the value is UNIQUEXYZ_marker_1234 ok", False))
    tr.response(text("read it"))
    for n in range(3):
        tr.prompt(f"search {n}")
        calls = tr.response(tool_use("Bash", command="cc-lhc search --limit 3 UNIQUEXYZ_marker_1234"),
                            stop="tool_use")
        tr.results((calls[0]["id"], '<cc-lhc-recall thread="abcd1234" request="search UNIQUEXYZ_marker_1234">\n'
                    "m3 (t1, tool_result, ...): the value is \u00bbUNIQUEXYZ_marker_1234\u00ab ok\n"
                    "</cc-lhc-recall>\n", False))
        calls = tr.response(tool_use("lhc_search", text="UNIQUEXYZ_marker_1234"), stop="tool_use")
        tr.results((calls[0]["id"], '<cc-lhc-recall thread="abcd1234" request="search UNIQUEXYZ_marker_1234">'
                    "\n</cc-lhc-recall>\n", False))
        tr.response(text("found it"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    (original,) = [m for m in thread.messages().values() if m["kind"] == "tool_result" and
                   m["text"].startswith("the value is")]
    for how in ("UNIQUEXYZ_marker_1234", "marker UNIQUEXYZ"):  # exactly, and by its words
        status, out, _ = search(capsysbinary, "--limit", "3", how)
        found = hits_of(out)
        assert found[0]["seq"] == str(original["seq"]), out
    status, out, _ = search(capsysbinary, "--limit", "20", "UNIQUEXYZ_marker_1234")
    found = hits_of(out)
    assert len(found) == 13 and found[0]["seq"] == str(original["seq"])
    own = [int(h["seq"]) for h in found[1:]]
    assert own == sorted(own, reverse=True)  # newest first among them too


def test_claudes_own_search_holding_the_text_leaves_the_words_and_other_forms_to_find(tmp_path, monkeypatch,
                                                                                    capsysbinary):
    """Claude's search call is recorded before it runs, so it always holds the text exactly:
    it must not count as the exact match that leaves out the messages holding the text's
    words, or holding it in another Unicode normal form (they come first, the call last)."""
    import unicodedata
    tr = Transcript()
    tr.prompt(unicodedata.normalize("NFD", "report from Zoë's server"))
    tr.response(text("The database connection timed out after 30 seconds."))
    for query in ("database timed connection", unicodedata.normalize("NFC", "Zoë")):
        tr.prompt("look it up")
        tr.response(tool_use("Bash", command=f"cc-lhc search '{query}'"), stop="tool_use")
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    for query, want in (("database timed connection", "words"), (unicodedata.normalize("NFC", "Zoë"), "exact")):
        status, out, _ = search(capsysbinary, query)
        found = hits_of(out)
        assert status == 0 and found[0]["seq"] in ("1", "2") and f", {want})" in out.splitlines()[1], out
        assert "tool_call Bash" in out  # (the call itself: after them)
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV)
    status, out, _ = search(capsysbinary, "--thread", thread.id, "database timed connection")
    assert status == 0 and out.splitlines()[0].startswith(f"{thread.id[:8]} m2 "), out


def test_a_retrieval_piped_through_a_filter_still_comes_after_the_original(tmp_path, monkeypatch, capsysbinary):
    """Claude often cuts a retrieval's answer down (`cc-lhc get-messages m3 | grep ...`):
    the output then holds no envelope, yet it is the answer of a retrieval call, and comes
    after the original like any other."""
    tr = Transcript()
    tr.prompt("run the tests")
    calls = tr.response(tool_use("Bash", command="pytest -q"), stop="tool_use")
    tr.results((calls[0]["id"], "FAILED test_x.py::test_y - AssertionError: PIPED_NEEDLE_4711 != 3", False))
    tr.response(text("it failed"))
    for command in ("cc-lhc get-messages m3 | grep -n PIPED", "cc-lhc get-turns t1 | tail -n 5",
                    "cc-lhc get-messages m3 2>&1 | grep -B1 -A1 Assertion"):
        tr.prompt("look again")
        calls = tr.response(tool_use("Bash", command=command), stop="tool_use")
        tr.results((calls[0]["id"], "3:FAILED test_x.py::test_y - AssertionError: PIPED_NEEDLE_4711 != 3", False))
        tr.response(text("seen"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    (original,) = [m for m in thread.messages().values() if m["kind"] == "tool_result"
                   and m["text"].startswith("FAILED")]
    status, out, _ = search(capsysbinary, "--limit", "3", "PIPED_NEEDLE_4711")
    assert [h["seq"] for h in hits_of(out)][0] == str(original["seq"]), out
    status, out, _ = search(capsysbinary, "--limit", "20", "PIPED_NEEDLE_4711")
    assert len(hits_of(out)) == 4 and hits_of(out)[0]["seq"] == str(original["seq"])


def test_a_call_that_only_names_a_retrieval_is_no_retrieval_and_its_exact_match_comes_first(
        tmp_path, monkeypatch, capsysbinary):
    """A file Claude writes about `cc-lhc search`, a grep for the words, a commit message
    naming them: none runs a retrieval, so their exact match is shown first and labelled
    exact, above the messages that only hold the words. A command line that runs one (after
    a cd, with a variable set, by its path, piped on) is Claude's own and comes last."""
    tr = Transcript()
    tr.prompt("write the doc")
    doc = "The signing key QZ-88-ALPHA rotates nightly. To find old sessions, run cc-lhc search with the key."
    calls = tr.response(tool_use("Write", file_path="docs/keys.md", content=doc), stop="tool_use")
    tr.results((calls[0]["id"], "File created successfully at: docs/keys.md", False))
    calls = tr.response(tool_use("Bash", command='grep -rn "cc-lhc search" docs/ # GREP-ONLY-5521'),
                        stop="tool_use")
    tr.results((calls[0]["id"], "docs/keys.md:1: GREP-ONLY-5521 noted", False))
    tr.response(text("written"))
    for n in range(4):
        tr.prompt(f"job {n}")
        tr.response(text(f"job {n}: ALPHA key (QZ 88) rotates nightly"))
    own = ["cd /work && cc-lhc search 'ALPHA rotates nightly' | head -5",
           "LC_ALL=C ~/.local/bin/cc-lhc get-messages m2", "cc-lhc get-turns t1; echo GREP-ONLY-5521"]
    for command in own:
        tr.prompt("look it up")
        tr.response(tool_use("Bash", command=command), stop="tool_use")
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    rows = thread.messages().values()
    (write,) = [m for m in rows if m["kind"] == "tool_call" and m["tool_name"] == "Write"]
    (grep,) = [m for m in rows if m["kind"] == "tool_call" and "grep -rn" in (m["text"] or "")]
    status, out, _ = search(capsysbinary, "--limit", "3", "ALPHA rotates nightly")
    assert status == 0 and hits_of(out)[0]["seq"] == str(write["seq"]), out
    assert re.search(rf"^m{write['seq']} \(t1, tool_call Write, [^)]*, exact\): ", out, re.M), out
    status, out, _ = search(capsysbinary, "--limit", "3", "GREP-ONLY-5521")
    assert [h["seq"] for h in hits_of(out)][:2] == [str(grep["seq"] + 1), str(grep["seq"])], out
    for command in own + ["timeout 30 cc-lhc search x", "timeout -s KILL 10 cc-lhc search x",
                          "env CC_LHC_HOME=/a cc-lhc search x", '"$HOME/.local/bin/cc-lhc" search x',
                          "nice -n 5 cc-lhc get-turns t1", "echo m1 | xargs -n1 cc-lhc get-messages",
                          "cat <<EOF > f\nhello\nEOF\ncc-lhc search x"]:
        assert cc_lhc._retrieval_call("Bash", json.dumps({"command": command})) == 1, command
    for command in ('grep -rn "cc-lhc search" docs/', "echo run cc-lhc get-turns t3", "man cc-lhc-search",
                    "cat > notes.md <<'EOF'\nsome text\ncc-lhc search 'X' finds things\nEOF",
                    "cat > n.md <<-END\n\tcc-lhc get-turns t1\n\tEND\necho done"):
        assert cc_lhc._retrieval_call("Bash", json.dumps({"command": command})) == 0, command
    assert cc_lhc._retrieval_call("Write", json.dumps({"content": "cc-lhc search x"})) == 0
    assert cc_lhc._retrieval_call("lhc_search", json.dumps({"text": "x"})) == 1


def test_claudes_own_retrieval_found_exactly_and_by_its_words_is_labelled_exact(tmp_path, monkeypatch,
                                                                               capsysbinary):
    """Nothing but Claude's own search holds the text exactly, and other messages hold its
    words: the search call is shown last, and as what it is, an exact match."""
    tr = Transcript()
    tr.prompt("what about the nightly rotation")
    tr.response(text("the ALPHA key rotates every night"))
    tr.prompt("look it up")
    tr.response(tool_use("Bash", command="cc-lhc search 'ALPHA key rotates nightly'"), stop="tool_use")
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    status, out, _ = search(capsysbinary, "ALPHA key rotates nightly")
    lines = [line for line in out.splitlines() if line.startswith("m")]
    assert status == 0 and "tool_call Bash" in lines[-1] and ", exact): " in lines[-1], out


def test_a_calls_tool_name_and_an_answers_citations_are_found(tmp_path, monkeypatch, capsysbinary):
    """Each hit line names a call's tool, so the name is searched too; an answer's citations
    (the text cited, its url and title) are kept with it and searched with its text. The
    stand-in the store keeps for the block's text is never a hit."""
    tr = Transcript()
    tr.prompt("what does the page say")
    (call,) = tr.response(tool_use("mcp__calc__run_once", expr="1+1"), stop="tool_use")
    tr.results((call["id"], "2", False))
    tr.response({"type": "text", "text": "as the page says", "citations": [
        {"type": "web_search_result_location", "cited_text": "CITED-TEXT-9913 of the page",
         "url": "https://docs.example/cite-9913", "title": "CITE-TITLE-9913", "encrypted_index": "Eo8B"}]})
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, ("mcp__calc__run_once", "CITED-TEXT-9913", "docs.example/cite-9913",
                                              "CITE-TITLE-9913"))
    for absent in ("cc-lhc:text", "web_search_result_location", "Eo8B"):  # (a stand-in, a kind, opaque data)
        status, out, _ = search(capsysbinary, absent)
        assert "no messages match" in out, (absent, out)


def test_lines_kept_as_written_are_searched_too(tmp_path, monkeypatch, capsysbinary):
    """A record the thread keeps only as its line (one without a uuid, a damaged one) holds
    words nothing else does: search names its line, in a session and for people, in
    whichever way JSON spelled the text (an escaped newline, a quote)."""
    tr = Transcript()
    tr.prompt("one")
    tr.response(text("two"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    odd = {"type": "assistant", "sessionId": tr.session_id, "message": {"role": "assistant", "content": [
        {"type": "text", "text": 'RAW-NEEDLE-5521 said "quoted"\nnext line'}]}}
    with path.open("a") as f:
        f.write(json.dumps(odd) + "\n" + '{"type": "user", "torn RAW-TORN-7731' + "\n")
    thread = intake(path, tr.session_id, tr.cwd)
    grant(thread, monkeypatch)
    for needle in ("RAW-NEEDLE-5521", 'said "quoted"\nnext', "RAW-TORN-7731"):
        status, out, _ = search(capsysbinary, needle)
        assert status == 0 and "no messages match" in out and "kept as written" in out, (needle, out)
        assert re.search(r"line [34] of session", out), out
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV)
    status, out, _ = search(capsysbinary, "--thread", thread.id, "RAW-NEEDLE-5521")
    assert status == 0 and f"{thread.id[:8]} line 3 of session" in out and "--format raw-lines" in out
    for absent in ("nowhere-at-all-0000", "parentUuid", "sessionId"):  # (a line's keys are no text of it)
        status, out, _ = search(capsysbinary, "--thread", thread.id, absent)
        assert "kept as written" not in out, (absent, out)


def test_a_kept_line_that_is_no_json_or_half_an_emoji_is_searched_as_written(tmp_path, monkeypatch, capsysbinary):
    """A torn line holds its text as JSON spelled it (a quote escaped, a newline as \\n);
    a line holding half an emoji (whose record is a message, mended) is found as that
    message, not twice, and never breaks the answer."""
    tr = Transcript()
    tr.prompt("one")
    tr.response(text("two"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    mended = {"type": "user", "uuid": "half-1", "parentUuid": None, "sessionId": tr.session_id,
              "timestamp": "2026-12-01T10:00:00.000Z", "message": {"role": "user", "content": "HALF-EMOJI-3317 X"}}
    with path.open("ab") as f:
        f.write(b'{"type": "user", "torn TORN said \\"quoted\\"\\nnext' + b"\n")
        f.write(json.dumps(mended).replace("X", "\\ud83d").encode() + b"\n")
    thread = intake(path, tr.session_id, tr.cwd)
    assert {r for (r,) in thread.store.db.execute("SELECT reason FROM raw_lines")} == {"malformed_line", "text_repaired"}
    grant(thread, monkeypatch)
    for needle in ('said "quoted"', 'quoted"\nnext'):
        status, out, _ = search(capsysbinary, needle)
        assert status == 0 and "line 3 of session" in out, (needle, out)
    status, out, _ = search(capsysbinary, "HALF-EMOJI-3317")
    assert status == 0 and hits_of(out) and "kept as written" not in out
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV)
    status, out, _ = search(capsysbinary, "--thread", thread.id, "HALF-EMOJI-3317")
    assert status == 0 and hits_of(out) and "kept as written" not in out


def test_a_text_block_without_text_is_searched_by_its_other_fields(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    tr.prompt("what does it say")
    tr.response({"type": "text", "text": None, "citations": [{"type": "char_location",
                                                              "cited_text": "NULLTEXT-CITED-4242"}]})
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, ("NULLTEXT-CITED-4242",))


def test_a_threads_older_float_spelling_is_found_as_well():
    """A thread captured before floats kept JavaScript's spelling holds 1.234e-05 (and shows
    it so): search reads both spellings of it."""
    values = cc_lhc._call_values('{"lr":1.234e-05,"n":0.5,"s":"1e-05 as text"}')
    assert values.split("\n") == ["0.00001234", "1.234e-05", "0.5", "1e-05 as text"]


def test_text_pasted_in_another_unicode_normal_form_is_found(tmp_path, monkeypatch, capsysbinary):
    """An accented letter is one character or a letter and a mark (macOS writes file names
    so): what is typed or pasted in one form finds the thread's text in the other, exactly
    when it is held so, by its words otherwise."""
    import unicodedata
    composed, decomposed = "caf\u00e9_cr\u00e8me_\u03a942", unicodedata.normalize("NFD", "na\u00efve_zo\u00eb_77")
    tr = Transcript()
    tr.prompt(f"open {composed}")
    tr.response(text(f"the file {decomposed} is there"))
    tr.prompt("and the r\u00e9sum\u00e9 of it")
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    for query in (unicodedata.normalize("NFD", composed), unicodedata.normalize("NFC", decomposed)):
        assert query not in (composed, decomposed)
        status, out, _ = search(capsysbinary, query)
        assert hits_of(out) and hits_of(out)[0]["how"] == "exact", (query, out)
    status, out, _ = search(capsysbinary, unicodedata.normalize("NFD", "r\u00e9sum\u00e9 of"))
    assert hits_of(out) and hits_of(out)[0]["how"] in ("exact", "words"), out


def test_a_large_output_with_little_repetition_is_scanned_not_indexed(tmp_path, monkeypatch, capsysbinary):
    """base64 costs the trigram index seconds a megabyte (with the write lock held): such
    an output is left out of it and scanned, found exactly as any other, in label order
    among the indexed hits; a log of the same size is indexed."""
    import base64
    blob = base64.b64encode(random.Random(7).randbytes(300 * 1024)).decode()
    needle = blob[200_000:200_024]
    log = "".join(f"12:00:{i % 60:02d} worker-{i % 8} did item {i}\n" for i in range(12_000))
    assert cc_lhc.costly_to_index(log[:130_000] + blob)  # base64 after an ordinary head counts too
    assert not cc_lhc.costly_to_index(log) and not cc_lhc.costly_to_index(blob[:200_000])
    tr = Transcript()
    tr.prompt(f"find {needle} in the dump")
    calls = tr.response(tool_use("Bash", command="base64 dump.bin"), stop="tool_use")
    tr.results((calls[0]["id"], blob, False))
    calls = tr.response(tool_use("Bash", command="cat worker.log"), stop="tool_use")
    tr.results((calls[0]["id"], log, False))
    tr.response(text(f"it is there: {needle}"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    status, out, _ = search(capsysbinary, needle)
    found = hits_of(out)
    by_kind = [(h["what"], h["how"]) for h in found]
    assert by_kind == [("assistant_text", "exact"), ("tool_result", "exact"), ("user_text", "exact")], out
    assert [int(h["seq"]) for h in found] == sorted((int(h["seq"]) for h in found), reverse=True)
    store = cc_lhc.ThreadStore(thread.home, thread.id)
    (big,) = [m["seq"] for m in thread.messages().values() if m["text"] == blob]
    assert store.exact_scanned() == [big]
    # a query with a character base64 never holds does not read the dump at all
    assert store.exact_scanned(needle) == [big] and store.exact_scanned("no such text") == []
    indexed = {r for (r,) in store.db.execute("SELECT rowid FROM messages_exact WHERE messages_exact MATCH ?",
                                              (cc_lhc.exact_query(needle),))}
    assert big not in indexed and len(indexed) == 2
    store.close()
    status, out, _ = search(capsysbinary, "worker-3 did item 11995")  # the log, through the index
    assert [h["what"] for h in hits_of(out)] == ["tool_result"]


def test_a_scanned_output_is_named_by_its_alphabet():
    assert cc_lhc.scan_alphabet("deadBEEF0012\n") == "hex" and cc_lhc.scan_alphabet("dead BEEF") == ""
    assert cc_lhc.scan_alphabet("QUJD+/ZA==\n") == "base64"
    assert cc_lhc.scan_alphabet("QUJD ZA==") == "" and cc_lhc.scan_alphabet("QUJD\u00e9") == ""
    assert cc_lhc.could_hold("hex", "beef") and not cc_lhc.could_hold("hex", "beefy")
    assert cc_lhc.could_hold("base64", "QUJD") and not cc_lhc.could_hold("base64", "QU JD")
    assert cc_lhc.could_hold("", "anything at all \u00e9")   # '' (and a thread from before): any text


def test_words_in_a_large_tool_output_show_the_line_that_holds_them(tmp_path, monkeypatch, capsysbinary):
    # one 300 KB output holding the words 20,000 times: the hit's line is cut around the
    # first of them (FTS5's snippet() took seconds to minutes on such a message)
    tr = Transcript()
    tr.prompt("run it")
    calls = tr.response(tool_use("Bash", command="./noisy"), stop="tool_use")
    tr.results((calls[0]["id"], "starting up\n" + "line of output\n" * 20000 + "done", False))
    tr.response(text("it ran"))
    grant(intake_transcript(tr, tmp_path), monkeypatch)
    status, out, _ = search(capsysbinary, "output line")
    (hit,) = hits_of(out)
    assert status == 0 and hit["how"] == "words" and hit["what"] == "tool_result"
    assert hit["context"] == "\u2026\u00bbline\u00ab of \u00bboutput\u00ab\u2026"


def test_a_thread_from_before_the_index_is_filled_when_opened(hard, monkeypatch, capsysbinary):
    # As a thread written by the previous version looks: no substring index yet.
    db = hard.store.db
    db.execute("DROP TABLE messages_exact")
    db.execute("DELETE FROM meta WHERE key = 'exact_upto'")
    names = [name for name, _ in cc_lhc.THREAD_MIGRATIONS]
    before = names.index("007_exact_search")
    db.executemany("DELETE FROM migrations WHERE name = ?", [(n,) for n in names[before:]])
    db.execute(f"PRAGMA user_version = {before}")
    hard.store.close()
    grant(hard, monkeypatch)
    status, out, _ = search(capsysbinary, MD5_ERROR)
    assert hits_of(out)[0]["how"] == "exact"
    store = cc_lhc.ThreadStore(hard.home, hard.id)
    assert store.has_exact_index()
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(cc_lhc.THREAD_MIGRATIONS)
    top = store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    assert store.db.execute("SELECT value FROM meta WHERE key = 'exact_upto'").fetchone() == (str(top),)


def test_without_trigrams_search_scans_and_the_index_comes_later(tmp_path, monkeypatch, capsysbinary):
    real = cc_lhc.trigram_available
    monkeypatch.setattr(cc_lhc, "trigram_available", lambda: False)
    tr = Transcript()
    tr.prompt("run it")
    calls = tr.response(tool_use("Bash", command=GREP), stop="tool_use")
    tr.results((calls[0]["id"], MD5_ERROR, True))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    assert not thread.store.has_exact_index()
    grant(thread, monkeypatch)
    for needle in (GREP, MD5_ERROR, "d4"):
        status, out, _ = search(capsysbinary, needle)
        assert hits_of(out)[0]["how"] == "exact", needle
    monkeypatch.setattr(cc_lhc, "trigram_available", real)  # it has them: the next search builds the index
    status, out, _ = search(capsysbinary, GREP)
    assert hits_of(out)[0]["what"] == "tool_call Bash"
    assert thread.store.has_exact_index()


def test_exact_query_quotes_every_trigram():
    assert cc_lhc.exact_query("ab") is None
    assert cc_lhc.exact_query('a"b') == '"a""b"'
    assert cc_lhc.exact_query("abcdefg") == '"abc" AND "def" AND "efg"'
    long = cc_lhc.exact_query("x" * 10 + "".join(chr(0x4e00 + i) for i in range(500)))
    assert long.count(" AND ") < cc_lhc.EXACT_QUERY_TERMS


# -- the target: any unique string of 8+ characters in the top 3 -----------------------------

def _splice_hard_strings(path: Path, rng: random.Random) -> None:
    """Put shell commands and error lines people really search for into the older half of a
    generated transcript, where a generated command or output stood."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(lines) * 2 // 5  # well inside the older half of the turns
    commands = [f"{c} # {i}" for i, c in enumerate(HARD)] + [
        f"grep -rn \"TODO\\|FIXME\" src/m{i}/ | awk -F: '{{print $1}}' | sort -u" for i in range(6)]
    errors = [f"AssertionError: '{rng.getrandbits(128):032x}'" for _ in range(6)] + [
        f"E   KeyError: \"cfg[{i}]['x']\" (C:\\\\tmp\\\\f{i}.py:12)" for i in range(4)]
    for i in rng.sample(range(half), half):
        if not commands and not errors:
            break
        rec = json.loads(lines[i])
        content = (rec.get("message") or {}).get("content")
        if not isinstance(content, list):
            continue
        for block in content:
            if commands and block.get("type") == "tool_use" and block.get("name") == "Bash":
                block["input"]["command"] = commands.pop()
            elif errors and block.get("type") == "tool_result" and isinstance(block.get("content"), str):
                body = block["content"].split("\n")
                body.insert(len(body) // 2, errors.pop())
                block["content"] = "\n".join(body)
        lines[i] = json.dumps(rec, ensure_ascii=False) + "\n"
    assert not commands and not errors
    path.write_text("".join(lines), encoding="utf-8")


def _samples(messages, rng, older_than):
    """Strings people look for: commands, paths, hashes, error lines, output lines."""
    out = []
    for m in messages:
        if m["turn"] > older_than:
            continue
        body = _visible(m)
        if m["kind"] == "tool_call":
            out += [v for v in _strings(json.loads(m["text"]))]
        out += re.findall(r"[\w.~-]*/[\w./-]+", body)                  # paths
        out += re.findall(r"\b[0-9a-f]{7,40}\b", body)                  # hashes
        out += [ln.strip() for ln in body.split("\n") if "Error" in ln]  # error lines
        lines = [ln for ln in body.split("\n") if ln.strip()]
        out += rng.sample(lines, min(2, len(lines)))                    # any line
    return out


def test_every_unique_string_of_the_older_half_is_in_the_top_3(tmp_path, monkeypatch, capsysbinary):
    rng = random.Random(11)
    path = tmp_path / "big.jsonl"
    stats = generate(str(path), size_mb=6, seed=5, thinking=True)
    _splice_hard_strings(path, rng)
    thread = intake(path, stats["session_id"])
    grant(thread, monkeypatch)
    messages = list(thread.store.messages())
    bodies = [_visible(m) for m in messages]
    last_turn = messages[-1]["turn"]
    candidates = sorted({s for s in _samples(messages, rng, last_turn // 2) if len(s) >= 8})
    everything = "\x00".join(bodies)
    starts = list(itertools.accumulate([0] + [len(b) + 1 for b in bodies[:-1]]))
    unique = {}
    for s in candidates:
        if everything.count(s) == 1:
            unique[s] = messages[bisect.bisect_right(starts, everything.find(s)) - 1]["seq"]
    picked = rng.sample(sorted(unique), min(300, len(unique)))
    for needle in HARD[:2] + [GREP]:
        assert any(needle in s for s in unique), needle  # the spliced commands are among them
    assert sum(1 for s in picked if '"' in s or "\\" in s) >= 5
    missed = []
    for s in picked:
        status, out, err = search(capsysbinary, "--limit", "3", "--", s)
        assert status == 0, err
        if f"m{unique[s]}" not in [f"m{h['seq']}" for h in hits_of(out)]:
            missed.append(s)
    assert missed == [], f"{len(missed)} of {len(picked)} unique strings not in the top 3"


# -- for people, outside a session ----------------------------------------------------------

@pytest.fixture
def two_folders(tmp_path, monkeypatch):
    """Two threads captured in folder a, one in folder b; no descriptor in the environment."""
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV, raising=False)
    folders = {name: tmp_path / name for name in ("a", "b")}
    for f in folders.values():
        f.mkdir()
    threads = {}
    for key, folder, word in (("a1", "a", "alpha"), ("a2", "a", "alpha"), ("b1", "b", "alpha")):
        tr = Transcript(cwd=str(folders[folder]))
        tr.prompt(f"the {word} word in {key}: look for \"{key}\\{word}\"")
        tr.response(text(f"seen {key}"))
        threads[key] = intake_transcript(tr, tmp_path)
    return folders, threads


def test_outside_a_session_search_covers_this_folder_one_thread_or_all(two_folders, monkeypatch,
                                                                      capsysbinary):
    folders, threads = two_folders
    monkeypatch.chdir(folders["a"])
    status, out, _ = search(capsysbinary, "alpha word")
    found = hits_of(out)
    assert status == 0 and {h["thread"] for h in found} == {threads["a1"].id[:8], threads["a2"].id[:8]}
    assert all(h["when"].startswith("2026-05-01 ") for h in found)
    assert "cc-lhc export <thread> --from tN --to tN" in out
    status, out, _ = search(capsysbinary, "--all", "alpha word")
    assert {h["thread"] for h in hits_of(out)} == {t.id[:8] for t in threads.values()}
    status, out, _ = search(capsysbinary, "--thread", threads["b1"].id[:8], '"b1\\alpha"')
    (hit,) = hits_of(out)
    assert hit["thread"] == threads["b1"].id[:8] and hit["how"] == "exact" and hit["seq"] == "1"
    # no impressions: those are the session's record of what Claude read
    for t in threads.values():
        assert t.store.db.execute("SELECT count(*) FROM impressions").fetchone() == (0,)
    monkeypatch.chdir(folders["a"].parent)
    status, out, _ = search(capsysbinary, "alpha")
    assert status == 0 and "no thread was captured in" in out and "--all" in out


def test_export_shows_the_turn_a_hit_names(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    monkeypatch.chdir(folders["b"])
    status, out, _ = search(capsysbinary, "seen b1")
    (hit,) = hits_of(out)
    capsysbinary.readouterr()
    turn = f"t{hit['turn']}"
    assert cc_lhc.main(["export", hit["thread"], "--from", turn, "--to", turn]) == 0
    records = json.loads(capsysbinary.readouterr().out)
    assert {"label": f"m{hit['seq']}", "text": "seen b1"}.items() <= records[-1].items()


@pytest.mark.parametrize("argv, message", [
    (["--all", "--thread", "x", "alpha"], "not both"),
    (["--from", "10", "alpha"], "--from continues a search inside a session"),
    (["--thread", "zzzz", "alpha"], "no thread matches"),
    ([], "usage: cc-lhc search"),
    (["alpha", "--bogus", "--all"], "unknown option --bogus (to search for text that starts with --, put -- before it"),
])
def test_bad_arguments_outside_a_session(two_folders, capsysbinary, argv, message):
    status, out, err = search(capsysbinary, *argv)
    assert status == cc_lhc.EXIT_USAGE and out == "" and message in err


def test_inside_a_session_search_stays_on_the_sessions_thread(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    grant(threads["a1"], monkeypatch)
    status, out, _ = search(capsysbinary, "alpha")
    assert status == 0 and out.startswith(f'<cc-lhc-recall thread="{threads["a1"].id[:8]}"')
    assert {h["thread"] for h in hits_of(out)} == {None}
    status, out, err = search(capsysbinary, "--all", "alpha")
    assert status == cc_lhc.EXIT_USAGE and "--thread and --all are for use outside one" in err


def test_people_search_through_the_command_line(two_folders, iso_env):
    folders, threads = two_folders
    env = {k: v for k, v in iso_env.env.items() if k != cc_lhc.RUNTIME_ENV}
    proc = subprocess.run([sys.executable, str(CC_LHC), "search", '"a2\\alpha"'], cwd=folders["a"],
                          env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    assert proc.returncode == 0, proc.stderr
    (hit,) = hits_of(proc.stdout)
    assert hit["thread"] == threads["a2"].id[:8] and hit["how"] == "exact"


def test_no_threads_yet(tmp_path, monkeypatch, capsysbinary):
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV, raising=False)
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "empty"))
    status, out, _ = search(capsysbinary, "anything")
    assert status == 0 and out == "no threads yet\n"


# -- the real CLI: Claude's Bash runs cc-lhc search inside a session ------------------------

def test_claude_finds_a_quoted_command_through_bash(real_claude):
    from fakeapi import text_reply, tool_use_reply
    rc, api = real_claude, real_claude.api
    (rc.cwd / "pylib").mkdir()
    (rc.cwd / "pylib" / "ipaddress.py").write_text("def ip_address(a):\n    pass\nclass IPv4Address:\n    pass\n")
    api.script([tool_use_reply("Bash", {"command": GREP, "description": "find the definitions"}),
                text_reply("two definitions")])
    first = rc.run_lhc("-p", "list the definitions", "--output-format", "json", "--allowedTools", "Bash")
    assert first.returncode == 0, first.stderr
    sid = json.loads(first.stdout)["session_id"]
    query = "cc-lhc search --limit 3 '" + GREP.replace("'", "'\\''") + "'"
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    (thread_id,) = [t[0] for t in cc_lhc.Registry(home).threads()]
    store = cc_lhc.ThreadStore(home, thread_id)
    call = next(m for m in store.messages() if m["kind"] == "tool_call" and GREP in _visible(m))
    store.close()
    # Claude looks the same command up three times: its own searches (the call running,
    # the ones before and what they answered) hold it too, and come after the original.
    for _ in range(3):
        api.script([tool_use_reply("Bash", {"command": query, "description": "look it up"}),
                    text_reply("found it")])
        again = rc.run_lhc("--resume", sid, "-p", "which command did you run?", "--allowedTools", "Bash")
        assert again.returncode == 0, again.stderr
        last = api.message_requests[-1]["body"]["messages"]
        (result,) = [b for b in last[-1]["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
        body = result["content"] if isinstance(result["content"], str) else "".join(
            b.get("text", "") for b in result["content"])
        assert not result.get("is_error"), body
        assert body.startswith(f'<cc-lhc-recall thread="{thread_id[:8]}"')
        found = hits_of(body)
        assert found[0]["seq"] == str(call["seq"]), body
    hit = found[0]
    assert hit["how"] == "exact" and hit["what"] == "tool_call Bash"
    assert "\u00bb" + GREP + "\u00ab" in hit["context"]
    # the output the command printed is found as exactly, by a person outside the session
    person = rc.run_lhc("search", "--all", "3:class IPv4Address:")
    assert person.returncode == 0, person.stderr
    (out_hit,) = hits_of(person.stdout)
    assert out_hit["thread"] == thread_id[:8] and out_hit["what"] == "tool_result"


def test_live_capture_keeps_the_substring_index_up_to_date(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    tr.prompt("first")
    tr.response(text("one"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(tr.session_id, tr.cwd, "test")
    cap = cc_lhc.Capture(home, thread_id, tr.session_id, str(path))
    cap.catch_up()
    tr.prompt("run the check")
    calls = tr.response(tool_use("Bash", command=GREP), stop="tool_use")
    tr.results((calls[0]["id"], MD5_ERROR, True))
    tr.write(path)  # the same lines and the new ones after them, as Claude appends
    cap.catch_up()
    db = cap.store.db
    top = db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    assert db.execute("SELECT value FROM meta WHERE key = 'exact_upto'").fetchone() == (str(top),)
    assert db.execute("SELECT rowid FROM messages_exact WHERE messages_exact MATCH ?",
                      (cc_lhc.exact_query(MD5_ERROR),)).fetchall() == [(top,)]
    cap.stop()


def test_a_thread_this_version_cannot_open_is_named_and_skipped(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    threads["a1"].store.db.execute("PRAGMA user_version = 99")
    monkeypatch.chdir(folders["a"])
    status, out, err = search(capsysbinary, "alpha")
    # the others' hits all the same, and the exit status says the answer is not whole
    assert status == 1 and {h["thread"] for h in hits_of(out)} == {threads["a2"].id[:8]}
    assert f"thread {threads['a1'].id[:8]} skipped: " in err and "newer cc-lhc" in err


def test_text_that_looks_like_an_option_continues_as_text(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    for i in range(200):
        tr.prompt(f"--all of them, number {i}: " + "padding words " * 30)
        tr.response(text("ok"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    status, out, _ = search(capsysbinary, "--limit", "200", "--", "--all of them")
    receipt = re.search(r"cc-lhc search --from (\d+) --through (m\d+) --limit 200 -- '--all of them'\]", out)
    assert receipt, out[-300:]
    status, more, err = search(capsysbinary, "--from", receipt.group(1), "--through", receipt.group(2),
                               "--limit", "200", "--", "--all of them")
    assert status == 0, err
    assert len(hits_of(out)) + len(hits_of(more)) >= 199  # a line cut at the seam is in neither


@pytest.mark.parametrize("body, text, shown", [
    ("first a long opening line about other things entirely, " * 4 + "then a na\u00efve plan for it",
     "naive", "\u00bbna\u00efve\u00ab plan"),
    ("x " * 200 + "the CAF\u00c9 opens", "cafe hours", "\u00bbCAF\u00c9\u00ab opens"),
    ("y " * 200 + "with a decomposed cafe\u0301 here", "cafes caf\u00e9", "\u00bbcafe\u0301\u00ab here"),
])
def test_a_words_hit_without_its_accents_shows_the_word(body, text, shown):
    """The word index reads letters without accents, so "naive" finds "naïve": the hit's
    line is the one holding it, marked (it was the message's first 120 characters)."""
    line = cc_lhc.word_context(body, text)
    assert shown in line, line


@pytest.mark.parametrize("how", ["exact", "words"])
def test_a_continued_search_joins_into_its_first_answer(tmp_path, monkeypatch, capsysbinary, how):
    """Messages holding the text that come between the pieces (a prompt, Claude's answer,
    its next calls) are left out of the continuation, which reads on in the answer as it was
    (they came first in the newest-first list: a hit line torn in two, hits twice, others
    never shown)."""
    from test_views import retrieve
    tr = Transcript()
    needle = "needle-42" if how == "exact" else "stitched fabric"
    for i in range(230):
        tr.prompt(f"look at {needle} number {i}: " + "padding words " * 30 if how == "exact"
                  else f"fabric number {i} was stitched: " + "padding words " * 30)
        tr.response(text("ok"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    thread = intake(path, tr.session_id, tr.cwd)
    grant(thread, monkeypatch)
    before, _ = retrieve(capsysbinary, "search", "--limit", "200", needle)
    assert before.count(b"\n") > 200

    def more_come():
        tr.prompt(f"and one more {needle}: " + "new words " * 40)
        tr.response(text(f"the {needle} again"))
        tr.write(path)
        cap = cc_lhc.Capture(thread.home, thread.id, tr.session_id, str(path))
        cap.catch_up()
        cap.stop()
    joined, calls = retrieve(capsysbinary, "search", "--limit", "200", needle, between=more_come)
    assert calls > 1 and joined == before
    assert b"new words" not in joined


def test_a_continued_words_search_reads_on_in_the_answer_as_it_was(tmp_path, monkeypatch, capsysbinary):
    """The word index ranks by figures of the whole thread (how many messages hold each
    word, how long they are): Claude's own call and the piece it read, recorded between the
    pieces, reorder hits found again. The continuation reads on in the answer kept from the
    first piece (hits repeated and others never shown)."""
    from test_views import retrieve
    rnd = random.Random(7)
    tr = Transcript()
    for i in range(230):
        tr.prompt(f"item {i}: " + "stitched " * rnd.randint(1, 6) + "fabric " * rnd.randint(1, 6)
                  + "padding words " * rnd.randint(5, 60))
        tr.response(text("ok"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    thread = intake(path, tr.session_id, tr.cwd)
    grant(thread, monkeypatch)
    before, _ = retrieve(capsysbinary, "search", "--limit", "200", "fabric stitched")

    def claude_reads_on():
        [call] = tr.response(tool_use("Bash", command="cc-lhc search --limit 200 'fabric stitched'"),
                             stop="tool_use")
        tr.results((call["id"], before[:23000].decode("utf-8", "ignore") + " fabric stitched" * 50, False))
        tr.write(path)
        cap = cc_lhc.Capture(thread.home, thread.id, tr.session_id, str(path))
        cap.catch_up()
        cap.stop()
    joined, calls = retrieve(capsysbinary, "search", "--limit", "200", "fabric stitched", between=claude_reads_on)
    assert calls > 1 and joined == before


@pytest.mark.parametrize("available, line", [(True, "[  ok] exact-string search: SQLite "),
                                             (False, "[warn] exact-string search: SQLite ")])
def test_doctor_says_whether_search_has_its_index(available, line, monkeypatch, capsys):
    monkeypatch.setattr(cc_lhc, "trigram_available", lambda: available)
    cc_lhc.main(["doctor"])
    out = capsys.readouterr().out
    assert line in out and ("scans" in out) == (not available)


def test_search_finds_threads_once_the_registry_is_lost(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    home = cc_lhc.StateHome()
    for t in threads.values():
        t.store.close()
    os.unlink(home.path("registry.sqlite"))
    status, out, _ = search(capsysbinary, "--all", "alpha word")
    assert status == 0 and {h["thread"] for h in hits_of(out)} == {t.id[:8] for t in threads.values()}


def test_a_thread_whose_file_is_gone_or_unopenable_is_named_not_made_anew(two_folders, monkeypatch,
                                                                          capsysbinary):
    """Read-only commands never create an empty record where a thread's file was: the
    loss is said, and the other threads still answer."""
    folders, threads = two_folders
    home = cc_lhc.StateHome()
    for t in threads.values():
        t.store.close()
    gone = Path(home.path("threads", f"{threads['a1'].id}.sqlite"))
    gone.unlink()
    Path(home.path("threads", f"{threads['b1'].id}.sqlite")).unlink()
    Path(home.path("threads", f"{threads['b1'].id}.sqlite")).mkdir()  # cannot be opened at all
    status, out, err = search(capsysbinary, "--all", "alpha word")
    assert status == 1 and {h["thread"] for h in hits_of(out)} == {threads["a2"].id[:8]}
    assert f"thread {threads['a1'].id[:8]} skipped: " in err and "is missing" in err
    assert f"thread {threads['b1'].id[:8]} skipped: " in err
    assert not gone.exists()
    capsysbinary.readouterr()
    assert cc_lhc.main(["threads"]) == 1 and not gone.exists()
    assert b"is missing" in capsysbinary.readouterr().err
    with pytest.raises(cc_lhc.LhcError, match="is missing"):
        cc_lhc.cmd_export([threads["a1"].id[:8]])
    assert not gone.exists()
    gone.write_bytes(b"")  # emptied: the same
    with pytest.raises(cc_lhc.LhcError, match="is empty"):
        cc_lhc.cmd_export([threads["a1"].id[:8]])
    assert gone.stat().st_size == 0


def test_an_argument_that_is_not_utf8_is_refused_plainly(two_folders, capsysbinary):
    bad = os.fsdecode(b"\xff\xfe")
    for argv in (["search", bad], ["export", bad], ["search", "--thread", bad, "x"]):
        capsysbinary.readouterr()
        assert cc_lhc.main(argv) == cc_lhc.EXIT_USAGE, argv
        assert b"is not UTF-8 text" in capsysbinary.readouterr().err


@pytest.mark.parametrize("argv, said", [(["--limit", "0"], "--limit: 0 is out of range (from 1 to 200)"),
                                        (["--limit", "201"], "--limit: 201 is out of range (from 1 to 200)"),
                                        (["--limit=-3"], "--limit: -3 is out of range"),
                                        (["--from=-1"], "--from: -1 is out of range (0 or more)")])
def test_a_number_out_of_range_is_refused_not_moved_into_it(argv, said, hard, monkeypatch, capsysbinary):
    grant(hard, monkeypatch)
    status, out, err = search(capsysbinary, *argv, "parser")
    assert status == cc_lhc.EXIT_USAGE and said in err and out == ""
    # the edges themselves are taken
    status, out, err = search(capsysbinary, "--limit", "200", "parser")
    assert status == 0, err


def test_text_after_a_nul_is_found_exactly(tmp_path, monkeypatch, capsysbinary):
    """FTS5 reads a text only up to a NUL: output such as `find -print0`'s is indexed with
    its NULs as spaces, so what follows one is found as exactly as what comes before."""
    tr = Transcript()
    tr.prompt("list the files")
    calls = tr.response(tool_use("Bash", command="find . -print0"), stop="tool_use")
    out = "./a.txt\x00./src/zq_main.py\x00./b.txt\x00"
    tr.results((calls[0]["id"], out, False))
    tr.response(text("three files"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    (result,) = [m for m in thread.messages().values() if m["kind"] == "tool_result"]
    assert result["text"] == out  # kept as it was
    for needle in ("./a.txt", "./src/zq_main.py", "src/zq_ma", "zq_main", "./b.txt"):
        status, found, err = search(capsysbinary, "--limit", "3", "--", needle)
        hits = hits_of(found)
        assert status == 0 and hits and hits[0]["how"] == "exact", (needle, found, err)
        assert int(hits[0]["seq"]) == result["seq"]


def test_text_that_looks_like_an_option_is_searched_after_a_double_dash(two_folders, capsysbinary):
    status, out, err = search(capsysbinary, "--all", "--", "--bogus")
    assert status == 0 and "unknown option" not in err
    status, out, err = search(capsysbinary, "--all", "a phrase --with a dash inside")  # one argument: text
    assert status == 0 and "unknown option" not in err


def test_a_pasted_log_excerpt_asks_the_word_index_for_its_longest_words_only(tmp_path, monkeypatch,
                                                                             capsysbinary):
    """A log excerpt that matches nowhere exactly falls back to words; hundreds of them, each
    a phrase matched position by position in a large output, took minutes and gigabytes.
    The dozen longest distinct ones are asked, and the log's message is still found."""
    log = "".join(f"2026-11-30 12:{i // 60 % 60:02d}:{i % 60:02d} INFO worker[{i % 17}] processed batch {i} ok\n"
                  for i in range(20_000))
    tr = Transcript()
    tr.prompt("run the workers")
    calls = tr.response(tool_use("Bash", command="./workers"), stop="tool_use")
    tr.results((calls[0]["id"], log, False))
    tr.response(text("they ran"))
    grant(intake_transcript(tr, tmp_path), monkeypatch)
    excerpt = log.splitlines()[100:140]
    query = "\n".join(line.replace(" ok", " OK!") for line in excerpt)  # nowhere as written
    words = cc_lhc.search_words(query)
    assert len(words) == cc_lhc.SEARCH_WORDS_MAX and len(set(words)) == len(words)
    assert all(len(w) >= len(v) for w, v in zip(words, words[1:]))
    assert cc_lhc.fts_query(query).count('"') == 2 * cc_lhc.SEARCH_WORDS_MAX
    status, out, _ = search(capsysbinary, query)
    (hit,) = hits_of(out)
    assert status == 0 and hit["how"] == "words" and hit["what"].startswith("tool_result")


def test_more_hits_than_the_largest_limit_ask_for_a_longer_string(tmp_path, monkeypatch, capsysbinary):
    """At the largest limit there is no larger one to offer: the line says to narrow the search."""
    tr = Transcript()
    for i in range(cc_lhc.SEARCH_LIMIT_MAX + 5):
        tr.prompt(f"note {i}: the widget needs polish")
        tr.response(text(f"noted {i}"))
    grant(intake_transcript(tr, tmp_path), monkeypatch)
    status, out, _ = search(capsysbinary, "--limit", str(cc_lhc.SEARCH_LIMIT_MAX), "widget needs polish")
    assert status == 0 and len(hits_of(out)) == cc_lhc.SEARCH_LIMIT_MAX
    assert f"more messages match than the {cc_lhc.SEARCH_LIMIT_MAX} shown: search for a longer string" in out
    assert "--limit" not in out.split("more messages match")[1].splitlines()[0]


def test_more_hits_than_the_limit_are_said(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    monkeypatch.chdir(folders["a"])
    status, out, _ = search(capsysbinary, "--limit", "1", "alpha")
    assert status == 0 and len(hits_of(out)) == 1 and "more messages match than the 1 shown: --limit 200" in out
    status, out, _ = search(capsysbinary, "--limit", "2", "alpha")
    assert len(hits_of(out)) == 2 and "more messages match" not in out


def test_a_long_text_no_thread_holds_is_named_shortly(two_folders, monkeypatch, capsysbinary):
    folders, _threads = two_folders
    monkeypatch.chdir(folders["a"])
    status, out, _ = search(capsysbinary, "q" * 100_000)
    assert status == 0 and out.startswith("no messages match 'qqq") and len(out) < 300


@pytest.mark.parametrize("argv", [["--limit", "2", "--limit", "3", "alpha"], ["--all", "--all", "alpha"],
                                  ["--thread", "a", "--thread=b", "alpha"]])
def test_an_option_given_twice_is_said_to_be(two_folders, capsysbinary, argv):
    status, out, err = search(capsysbinary, *argv)
    assert status == cc_lhc.EXIT_USAGE and out == "" and f"{argv[0]} is given more than once" in err


@pytest.mark.parametrize("command", ["search", "export", "measure", "threads", "doctor", "rollout",
                                     "backfill-labels", "preview", "get-turns", "get-messages"])
def test_help_of_a_command_is_its_usage(command, capsysbinary):
    capsysbinary.readouterr()
    assert cc_lhc.main([command, "--help"]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert out.startswith(f"usage: cc-lhc {command}")
    # after --, it is only text
    assert cc_lhc.main(["search", "--", "--help"]) in (0, 1)


def test_a_search_for_words_with_a_short_help_flag_among_them_searches(two_folders, monkeypatch, capsysbinary):
    folders, _threads = two_folders
    monkeypatch.chdir(folders["a"])
    status, out, _ = search(capsysbinary, "du", "-h")
    assert status == 0 and out.startswith("no messages match 'du -h'")


def _blocks_thread(tmp_path):
    tr = Transcript()
    tr.prompt("look it up")
    calls = tr.response(tool_use("mcp__docs__search", query="where is the pager", options={"max": 123456789}),
                        tool_use("Read", file_path="/srv/app/pager.py", offset=987654321), stop="tool_use")
    tr.results((calls[0]["id"], [
        {"type": "text", "text": "two results for the pager"},
        {"type": "search_result", "source": "https://docs.example/pager", "title": "Pager duty rotation 7",
         "content": [{"type": "text", "text": "the pager rotates every Monday at 09:00 UTC"}]},
        {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                        "data": "escalate to the on-call lead after 15 minutes"}},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgoAAAANSUhEUg=="}},
        {"type": "tool_reference", "tool_name": "mcp__pager__page_someone"},
    ], False), (calls[1]["id"], "def page(): ...", False))
    tr.response(text("found it"))
    return intake_transcript(tr, tmp_path)


STRINGS_IN_BLOCKS = ["Pager duty rotation 7", "rotates every Monday at 09:00 UTC",
                     "escalate to the on-call lead", "mcp__pager__page_someone", "123456789", "987654321"]


def test_strings_in_a_tool_outputs_other_blocks_and_a_calls_numbers_are_found(tmp_path, monkeypatch, capsysbinary):
    """An MCP tool's search_result and document blocks and a tool_reference are part of
    the output the model read, though its text names them only by type; a call's numbers
    (a Read's offset) are part of its input. An image's base64 is not searched."""
    thread = _blocks_thread(tmp_path)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, STRINGS_IN_BLOCKS)
    status, out, _ = search(capsysbinary, "iVBORw0KGgoAAAANSUhEUg")
    assert not [h for h in hits_of(out) if h["how"] == "exact"]


def test_a_thread_indexed_before_reads_the_other_blocks_once_opened(tmp_path, monkeypatch, capsysbinary):
    """A thread whose indexes were filled by the previous version (migrations up to 010):
    opening it makes them again, so the strings they lacked are found."""
    thread = _blocks_thread(tmp_path)
    db = thread.store.db
    names = [name for name, _ in cc_lhc.THREAD_MIGRATIONS]
    before = names.index("011_values_and_result_blocks")
    old_body = ("CASE WHEN m.kind = 'tool_call' AND json_valid(m.text) THEN (SELECT group_concat(j.value, "
                "char(10)) FROM json_tree(m.text) j WHERE j.type = 'text') WHEN m.text IS NOT NULL THEN "
                "lhc_text(m.text) END")
    db.execute("DROP TABLE messages_fts")
    db.execute("DROP VIEW messages_plain")
    db.execute(f"CREATE VIEW messages_plain AS SELECT m.seq AS seq, {old_body} AS text FROM messages m")
    db.execute("CREATE VIRTUAL TABLE messages_fts USING fts5 (text, content='messages_plain', content_rowid='seq')")
    db.execute("INSERT INTO messages_exact (messages_exact) VALUES ('delete-all')")
    db.execute("INSERT INTO messages_exact (rowid, body) SELECT m.seq, " + old_body + " FROM messages m")
    db.execute("DELETE FROM meta WHERE key = 'fts_upto'")
    thread.store.index_search()
    db.executemany("DELETE FROM migrations WHERE name = ?", [(n,) for n in names[before:]])
    db.execute(f"PRAGMA user_version = {before}")
    thread.store.close()
    grant(thread, monkeypatch)
    for needle in STRINGS_IN_BLOCKS:
        status, out, _ = search(capsysbinary, needle)
        assert hits_of(out) and hits_of(out)[0]["how"] == "exact", (needle, out)


def test_a_search_for_kilobytes_of_pasted_output_is_answered_in_a_session(tmp_path, monkeypatch, capsysbinary):
    """A model may search for a whole block it saw (a traceback, a repr full of quotes):
    the envelope shows the request by its start, so the answer fits the output ceiling;
    a get-turns cut short still names its whole request in the receipt."""
    block = "AssertionError: [" + ", ".join(f"'k{i:04d}'" for i in range(1200)) + "]"
    tr = Transcript()
    tr.prompt("run the tests")
    calls = tr.response(tool_use("Bash", command="pytest -q"), stop="tool_use")
    tr.results((calls[0]["id"], "x" * 30_000 + "\n" + block + "\n1 failed", True))
    tr.response(text("one test fails"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    assert len(block) > 8_000
    status, out, err = search(capsysbinary, block)
    assert status == 0, err
    assert len(out.encode()) <= cc_lhc.RETRIEVAL_CEILING
    assert hits_of(out)[0]["how"] == "exact"
    opening = out.split("\n", 1)[0]
    assert "more characters)" in opening and len(opening) < 1000
    capsysbinary.readouterr()
    assert cc_lhc.main(["get-turns", "t1"]) == 0
    out = capsysbinary.readouterr().out.decode()
    assert len(out.encode()) <= cc_lhc.RETRIEVAL_CEILING and "cc-lhc get-turns --from " in out
    assert out.rstrip().splitlines()[-2].endswith(" t1]")


def test_with_no_threads_an_unknown_thread_is_refused_and_all_says_there_are_none(tmp_path, monkeypatch, capsysbinary):
    """--thread names a thread that does not exist: the same refusal whether the state
    folder holds threads or none yet; --all with none says so, not "use --all"."""
    monkeypatch.chdir(tmp_path)
    status, out, err = search(capsysbinary, "--thread", "abc", "alpha")
    assert status == cc_lhc.EXIT_USAGE and "no thread matches 'abc'" in err
    status, out, err = search(capsysbinary, "--all", "alpha")
    assert status == 0 and out == "no threads yet\n"
    home = cc_lhc.StateHome()
    home.ensure()
    cc_lhc.Registry(home)  # a registry, but no thread in it
    status, out, err = search(capsysbinary, "--all", "alpha")
    assert status == 0 and out == "no threads yet\n"


@pytest.mark.parametrize("label", ["t\u0662", "t\uff11", "m\u0663", "t1-t\u0662"])
def test_labels_are_ascii_digits(two_folders, capsysbinary, label):
    """A label reads as it prints: t and ASCII digits (Python's \\d would take any script's)."""
    _folders, threads = two_folders
    with pytest.raises(cc_lhc.LhcError):
        cc_lhc.parse_labels([label], label[0])
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", threads["a1"].id, "--from", label]) == cc_lhc.EXIT_USAGE


def test_a_calls_numbers_are_found_as_written(tmp_path, monkeypatch, capsysbinary):
    """SQLite's JSON reader spells numbers its own way (3.14159265358979, 1.0e+21,
    1.23456789012346e+19): search reads them as the transcript and the export write them."""
    tr = Transcript()
    tr.prompt("compute")
    (call,) = tr.response(tool_use("mcp__calc__run", pi=3.141592653589793, big=12345678901234567890,
                                   huge=1e21, flag=True), stop="tool_use")
    tr.results((call["id"], "ok", False))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, ("3.141592653589793", "12345678901234567890", "1e+21"))


# Floats as Claude Code's JSON.stringify writes them, where Python's repr writes them otherwise.
JS_FLOATS = {"small": ("0.00001234", 1.234e-05), "tiny": ("1.2345e-7", 1.2345e-07),
             "edge": ("0.000001", 1e-06), "neg": ("-0.000056789", -5.6789e-05), "nine": ("5e-9", 5e-09)}


def test_a_calls_small_floats_keep_the_spelling_claude_code_wrote(tmp_path, monkeypatch, capsysbinary):
    """Claude Code writes 0.00001234 and 1.2345e-7 where Python's repr writes 1.234e-05 and
    1.2345e-07: the thread keeps the transcript's spelling, so search finds what the
    transcript shows and the export gives it back as it was."""
    tr = Transcript()
    tr.prompt("fit it")
    (call,) = tr.response(tool_use("mcp__fit__run", **{k: v for k, (_js, v) in JS_FLOATS.items()},
                                   note="e-05 stays as it is in a string"), stop="tool_use")
    tr.results((call["id"], "ok", False))
    tr.response(text("done"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    raw = path.read_text()
    for key, (js, value) in JS_FLOATS.items():
        raw = raw.replace(f'"{key}": {value!r}', f'"{key}": {js}').replace(f'"{key}":{value!r}', f'"{key}":{js}')
        assert f'"{key}": {js}' in raw or f'"{key}":{js}' in raw, key
    path.write_text(raw)
    thread = intake(path, tr.session_id, tr.cwd)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, [js for js, _v in JS_FLOATS.values()])
    status, out, _ = search(capsysbinary, "1.234e-05")
    assert "no messages match" in out
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV, raising=False)
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", thread.id, "--format", "json"]) == 0
    (exported,) = [m for m in json.loads(capsysbinary.readouterr().out.decode()) if m["kind"] == "tool_call"]
    line = next(line for line in raw.splitlines() if "mcp__fit__run" in line)
    assert exported["input"] == json.loads(line)["message"]["content"][0]["input"]
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", thread.id, "--format", "json"]) == 0
    printed = capsysbinary.readouterr().out.decode()
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", thread.id, "--format", "markdown"]) == 0
    markdown = capsysbinary.readouterr().out.decode()
    for key, (js, value) in JS_FLOATS.items():
        assert f'"{key}": {js},' in printed and repr(value) not in printed
        assert re.search(f'"{key}": ?{re.escape(js)},', markdown) and repr(value) not in markdown
    assert exported["input"]["note"] == "e-05 stays as it is in a string"


def test_floats_are_spelled_as_javascript_spells_them():
    """js_float_text against JavaScript itself (node, which Claude Code runs on) over
    100,000 floats of every size, and a few by hand where it is not there."""
    import shutil
    cases = [("0.00001234", 1.234e-05), ("1.2345e-7", 1.2345e-07), ("1e-7", 1e-07), ("0.000001", 1e-06),
             ("0.0001", 1e-4), ("1e-10", 1e-10), ("5e-324", 5e-324), ("1e+21", 1e21), ("1.5e+300", 1.5e300),
             ("0.1", 0.1), ("-0.00001", -1e-05), ("10000000000000000", 1e16), ("123456789012345680000", 1.2345678901234568e20)]
    node = shutil.which("node")
    if node:
        script = ("const o=[];for(let i=0;i<100000;i++){const e=Math.floor(Math.random()*80)-50;"
                  "const d=Math.floor(Math.random()*17)+1;const v=Number((Math.random()*10).toPrecision(d))*10**e;"
                  "if(!Number.isInteger(v))o.push(JSON.stringify(v));}console.log(JSON.stringify(o))")
        written = json.loads(subprocess.run([node, "-e", script], capture_output=True, text=True, check=True).stdout)
        cases += [(js, float(js)) for js in written]
    for js, value in cases:
        assert cc_lhc.js_float_text(value) == js, (js, value)
        if abs(value) < 1e16 or abs(value) >= 1e21:  # (JavaScript writes whole numbers between as ints)
            assert cc_lhc._dump({"v": [value]}) == f'{{"v":[{js}]}}'
    assert cc_lhc._dump({"s": "1.5e-05", "n": 1.5e-05}) == '{"s":"1.5e-05","n":0.000015}'


def test_other_blocks_are_found_beside_a_text_block_that_names_the_marker(tmp_path, monkeypatch, capsysbinary):
    """A tool output's text that happens to hold cc-lhc's own marker word is no marker: the
    strings of its other blocks are still searched, and the Markdown export shows them."""
    tr = Transcript()
    tr.prompt("look it up")
    (call,) = tr.response(tool_use("mcp__docs__search", query="pager"), stop="tool_use")
    tr.results((call["id"], [
        {"type": "text", "text": "notes on cc-lhc:text markers"},
        {"type": "search_result", "source": "https://docs.example/b", "title": "PAIR-TITLE-B",
         "content": [{"type": "text", "text": "PAIR-BODY-B"}]}], False))
    tr.prompt([{"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "DOC-PROMPT-TEXT"}},
               {"type": "text", "text": "read that"}])
    tr.response(text("read"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    assert_found_first_exactly(capsysbinary, ("PAIR-TITLE-B", "PAIR-BODY-B", "DOC-PROMPT-TEXT"))
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV, raising=False)
    capsysbinary.readouterr()
    assert cc_lhc.main(["export", thread.id, "--format", "markdown"]) == 0
    assert "PAIR-BODY-B" in capsysbinary.readouterr().out.decode()


def test_a_thread_that_cannot_be_read_is_named_and_nothing_said_to_match(two_folders, monkeypatch, capsysbinary):
    folders, threads = two_folders
    home = cc_lhc.StateHome()
    threads["a1"].store.close()
    path = Path(home.path("threads", f"{threads['a1'].id}.sqlite"))
    path.write_bytes(path.read_bytes()[:1000])  # torn
    status, out, err = search(capsysbinary, "--thread", threads["a1"].id[:8], "alpha word")
    assert status == 1 and "skipped" in err and "no messages match" not in out


def test_a_hit_line_shows_bidirectional_overrides_and_invisible_marks_as_escapes():
    """A right-to-left override in a message would make its hit line read in another order
    than the message holds; a zero-width space or a byte-order mark would hide."""
    assert cc_lhc.escape_controls("ok\u202eevil\u202c \u200bx\ufeff \u2066y\u2069") == \
        "ok\\u202eevil\\u202c \\u200bx\\ufeff \\u2066y\\u2069"
    assert cc_lhc.escape_controls("👨\u200d👩 \u05e9\u05dc\u05d5\u05dd") == "👨\u200d👩 \u05e9\u05dc\u05d5\u05dd"  # joined emoji, Hebrew
    assert cc_lhc.escape_controls("soft\u00adhyphen \u2060 tag\U000e0041") == "soft\\xadhyphen \\u2060 tag\\U000e0041"
    england = "\U0001f3f4\U000e0067\U000e0062\U000e0065\U000e006e\U000e0067\U000e007f"
    assert cc_lhc.escape_controls(f"{england} \u0601\u0662") == f"{england} \u0601\u0662"  # a flag, an Arabic year mark


def _with_a_prompt_not_yet_indexed(tmp_path):
    """A thread of two turns: the first (OLD-NEEDLE) indexed, the second (LATE-NEEDLE)
    stored and not yet in the search indexes."""
    tr = Transcript()
    tr.prompt("first question OLD-NEEDLE")
    tr.response(text("first answer"))
    path = tmp_path / f"{tr.session_id}.jsonl"
    thread = intake(tr.write(path), tr.session_id)
    tr.prompt("LATE-NEEDLE in a later prompt")
    tr.response(text("later answer"))
    tr.write(path)
    cap = cc_lhc.Capture(thread.home, thread.id, tr.session_id, str(path))
    cap.catch_up(index=False)
    cap.store.close()
    return thread


def test_a_search_that_cannot_take_the_threads_write_lock_scans_what_the_index_lacks(tmp_path, monkeypatch, capsysbinary):
    """Another process holding the thread's write lock (a long index build) kept a search
    waiting 30 s for it and then failing; it now waits SEARCH_LOCK_WAIT_MS and reads the
    messages the index does not cover yet by a scan."""
    import sqlite3
    import time
    thread = _with_a_prompt_not_yet_indexed(tmp_path)
    holder = sqlite3.connect(thread.store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        monkeypatch.setattr(cc_lhc, "SEARCH_LOCK_WAIT_MS", 200)
        grant(thread, monkeypatch)
        started = time.monotonic()
        assert_found_first_exactly(capsysbinary, ["LATE-NEEDLE"])
        assert time.monotonic() - started < 10
        # the retrieval's note of what it showed could not be written: said in the log
        log = Path(thread.home.path("wrapper.log")).read_text()
        assert '"event": "impression_not_recorded"' in log
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_calls_values_never_its_keys_and_no_redacted_thinking(tmp_path, monkeypatch, capsysbinary):
    """A call's keys are never searched, even one with no values; a redacted thinking
    block's encrypted data is not text anyone can look for."""
    assert cc_lhc._call_values('{"a": {}, "b": null, "c": true}') is None
    assert cc_lhc._call_values('{"file_path": "/x", "n": 1.50}') == "/x\n1.50"
    assert cc_lhc._call_values("not json {") == "not json {"
    tr = Transcript()
    tr.prompt("redact")
    tr.response({"type": "redacted_thinking", "data": "ENCRYPTED-BLOB-QQQ=="}, text("answer"))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    status, out, _ = search(capsysbinary, "ENCRYPTED-BLOB-QQQ")
    assert not [h for h in hits_of(out) if h["how"] == "exact"], out


def test_a_search_behind_its_index_misses_nothing_the_index_takes_in_meanwhile(tmp_path, monkeypatch):
    """The process holding the lock commits an index chunk between the index's query and the
    scan of what it did not cover: those messages are found once, not lost between the two."""
    import sqlite3
    thread = _with_a_prompt_not_yet_indexed(tmp_path)
    store = thread.store
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's index build holds the lock
    monkeypatch.setattr(cc_lhc, "SEARCH_LOCK_WAIT_MS", 200)
    real, calls = store.has_exact_index, []

    def has_exact_index():
        calls.append(1)
        if len(calls) == 2:  # after the index's query: the other process commits its chunk
            holder.execute("ROLLBACK")
            other = cc_lhc.ThreadStore(thread.home, thread.id)
            other.index_search()
            other.close()
        return real()
    monkeypatch.setattr(store, "has_exact_index", has_exact_index)
    try:
        hits = cc_lhc.search_thread(store, "-NEEDLE", 10)
    finally:
        holder.close()
    assert len(calls) >= 2 and sorted(h.seq for h in hits) == [1, 3], [(h.seq, h.how) for h in hits]


INDEX_MEMORY_CHILD = r"""
import base64, json, os, sys, uuid
import cc_lhc
def hwm():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
root, sid = sys.argv[1], "11111111-2222-4333-8444-555555555555"
path = os.path.join(root, sid + ".jsonl")
blob = base64.b64encode(os.urandom(12_000_000)).decode()
base = {"sessionId": sid, "timestamp": "2026-01-01T00:00:00Z"}
recs = [dict(base, type="user", uuid="u1", parentUuid=None, message={"role": "user", "content": "hi"}),
        dict(base, type="assistant", uuid="a1", parentUuid="u1", message={
            "id": "m1", "role": "assistant", "model": "m", "stop_reason": "tool_use",
            "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {"file_path": "/x.png"}}]}),
        dict(base, type="user", uuid="u2", parentUuid="a1", message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": blob}},
                {"type": "search_result", "title": "TITLE-OF-THE-RESULT", "source": "https://example.com/x",
                 "content": [{"type": "text", "text": "what it says"}]}]}]})]
with open(path, "w") as f:
    f.write("".join(json.dumps(r) + "\n" for r in recs))
home = cc_lhc.StateHome(os.path.join(root, "lhc"))
home.ensure()
tid = str(uuid.uuid4())
cap = cc_lhc.Capture(home, tid, sid, path)
cap.catch_up(index=False)
before = hwm()
cap.store.index_search()
growth = hwm() - before
db = cap.store.db
found = [seq for (seq,) in db.execute("SELECT seq FROM messages_plain WHERE instr(text, ?)",
                                      ("TITLE-OF-THE-RESULT",))]
print(json.dumps({"line": len(blob), "growth": growth, "found": found,
                  "blob_indexed": db.execute("SELECT count(*) FROM messages_plain WHERE instr(text, ?)",
                                             (blob[5000:5040],)).fetchone()[0]}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads VmHWM from /proc")
def test_indexing_a_tool_output_with_a_large_image_takes_memory_near_its_size(tmp_path):
    """The strings of a tool output's other blocks were read by SQLite's json_tree, which
    held about 12 times the block's size (1.2 GB for a 60 MB image): they are read in one
    pass now, and still found (the image's base64 data is not searched)."""
    child = subprocess.run([sys.executable, "-c", INDEX_MEMORY_CHILD, str(tmp_path)], capture_output=True,
                           text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert child.returncode == 0, child.stderr
    got = json.loads(child.stdout)
    assert got["found"] and got["blob_indexed"] == 0
    assert got["growth"] < 4 * got["line"], got


# What the word index's view read before migration 014, in SQLite's JSON functions.
BODY_BEFORE_014 = """CASE
 WHEN m.kind = 'tool_call' THEN coalesce(lhc_values(m.text) || char(10), '') || coalesce(m.tool_name, '')
 WHEN m.kind = 'tool_result' AND instr(m.data, '"content":[{') AND NOT instr(m.data, '"\\u0000cc-lhc:text"')
   AND json_valid(m.data)
   THEN coalesce(lhc_text(m.text), '') || coalesce(char(10) || (SELECT group_concat(j.value, char(10))
   FROM json_each(m.data, '$.content') b, json_tree(b.value) j WHERE b.type = 'object'
   AND json_extract(b.value, '$.type') IS NOT 'text' AND j.type = 'text'
   AND j.key NOT IN ('type', 'signature', 'media_type')
   AND NOT (j.key = 'data' AND json_extract(b.value, j.path || '.type') = 'base64')), '')
 WHEN m.text IS NOT NULL AND m.data IS NOT NULL AND m.kind IN ('assistant_text', 'user_text', 'user_meta', 'api_error')
   THEN lhc_text(m.text) || coalesce(char(10) || lhc_block_values(m.data), '')
 WHEN m.text IS NOT NULL THEN lhc_text(m.text)
 WHEN json_valid(m.data) THEN (SELECT group_concat(j.value, char(10)) FROM json_tree(m.data) j
   WHERE j.type = 'text' AND j.key IS NOT 'signature'
   AND NOT (j.key = 'data' AND json_extract(m.data, j.path || '.type') IN ('base64', 'redacted_thinking')))
 END"""


def test_the_python_reading_of_blocks_is_the_one_sqlite_made(tmp_path):
    """Migration 014 keeps the indexes because the new reading gives every message the
    text the old one gave: checked here over every kind of block the tests make."""
    tr = Transcript()
    tr.prompt("look it up")
    tr._record("user", message={"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
        {"type": "document", "title": "Spec \u00e9 \"quoted\"", "source": {"type": "base64", "media_type":
                                                                       "application/pdf", "data": "JVBERi0x"}}]})
    tr.response({"type": "redacted_thinking", "data": "EqQBCkgIAR"},
                {"type": "thinking", "thinking": "weighing it", "signature": "SIG"}, text("ok"))
    calls = tr.response(tool_use("mcp__x__y", q="z"), stop="tool_use")
    tr.results((calls[0]["id"], [{"type": "search_result", "title": "T", "source": "s", "content": [
        {"type": "text", "text": "nested"}, {"type": "text", "text": "twice", "citations": [{"n": 1, "u": "url"}]}],
        "meta": {"list": ["a", ["b", {"type": "base64", "data": "hidden", "other": "shown"}]]}},
        {"type": "text", "text": "plain"}, "not a block", 7, {"no_type": "kept"}], False))
    tr.response(text("done"))
    (tmp_path / "more").mkdir()
    more = intake_transcript(tr, tmp_path / "more")
    thread = _blocks_thread(tmp_path)
    rows = []
    for db in (thread.store.db, more.store.db):
        rows += db.execute(f"SELECT m.seq, {BODY_BEFORE_014}, {cc_lhc.SEARCH_BODY_SQL} FROM messages m").fetchall()
    assert len(rows) > 12 and [(seq, old) for seq, old, _new in rows] == [(seq, new) for seq, _old, new in rows]


def test_a_thread_of_the_version_before_keeps_its_indexes_and_reads_blocks_in_python(tmp_path, monkeypatch,
                                                                                       capsysbinary):
    """A thread file of the previous version (migrations up to 013): its word index's view
    read a tool output's other blocks with SQLite's json_tree; opened now, the view reads
    them in Python, and the indexes, which held the same text, are kept, not filled again."""
    thread = _blocks_thread(tmp_path)
    db = thread.store.db
    thread.store.index_search()
    names = [name for name, _ in cc_lhc.THREAD_MIGRATIONS]
    before = names.index("014_block_strings_in_python")
    filled = dict(db.execute("SELECT key, value FROM meta WHERE key IN ('fts_upto', 'exact_upto')").fetchall())
    db.executemany("DELETE FROM migrations WHERE name = ?", [(n,) for n in names[before:]])
    db.execute(f"PRAGMA user_version = {before}")
    db.execute("DROP VIEW messages_plain")
    db.execute(f"CREATE VIEW messages_plain AS SELECT m.seq AS seq, {BODY_BEFORE_014} AS text FROM messages m")
    thread.store.close()
    store = cc_lhc.ThreadStore(thread.home, thread.id)
    view = store.db.execute("SELECT sql FROM sqlite_master WHERE name = 'messages_plain'").fetchone()[0]
    assert "lhc_result_body" in view and "json_tree" not in view
    assert dict(store.db.execute("SELECT key, value FROM meta WHERE key IN ('fts_upto', 'exact_upto')")
                .fetchall()) == filled
    store.close()
    grant(thread, monkeypatch)
    for needle in STRINGS_IN_BLOCKS:
        status, out, _ = search(capsysbinary, needle)
        assert hits_of(out) and hits_of(out)[0]["how"] == "exact", (needle, out)


def test_a_launchs_catch_up_leaves_indexing_past_its_deadline_to_the_next_read(tmp_path, monkeypatch):
    """A launch bounds its catch-up (CATCHUP_SECONDS) so Claude is not kept waiting; the
    search indexes it built afterwards were not bounded (a 70 MB first resume started
    Claude 12.8 s after launch against the 10 s). Past the deadline they stop between
    chunks, and the next read (a capture opening the thread) goes on from there."""
    import time
    tr = Transcript()
    for i in range(1200):  # (more messages than one chunk of the index)
        tr.prompt(f"prompt number {i}")
        tr.response(text(f"answer number {i}"))
    path = tr.write(tmp_path / f"{tr.session_id}.jsonl")
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(tr.session_id, "/home/u/proj", "test")
    cap = cc_lhc.Capture(home, thread_id, tr.session_id, str(path))
    asked = []
    real = cc_lhc.ThreadStore.index_search
    monkeypatch.setattr(cc_lhc.ThreadStore, "index_search",
                        lambda self, deadline=None: asked.append(deadline) or real(self, deadline))
    deadline = time.monotonic() + 60
    cap.catch_up(deadline=deadline)
    cap.stop()
    assert asked[-1] == deadline
    monkeypatch.setattr(cc_lhc.ThreadStore, "index_search", real)
    store = cc_lhc.ThreadStore(home, thread_id)
    with cc_lhc.Tx(store.db):
        store.db.execute("DELETE FROM meta WHERE key IN ('fts_upto', 'exact_upto')")
        store.db.execute("DELETE FROM messages_fts")
        store.db.execute("INSERT INTO messages_exact (messages_exact) VALUES ('delete-all')")
    assert store.index_search(deadline=time.monotonic() - 1) == 0  # (past it: not one chunk)
    assert store.db.execute("SELECT count(*) FROM meta WHERE key IN ('fts_upto', 'exact_upto')").fetchone() == (0,)
    store.close()
    store = cc_lhc.ThreadStore(home, thread_id)
    top = store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
    with cc_lhc.Tx(store.db):  # (the word index whole, the substring index not begun)
        store.db.execute("INSERT INTO meta VALUES ('fts_upto', ?)", (str(top),))
    store.index_search(deadline=time.monotonic() - 1)
    assert store.db.execute("SELECT value FROM meta WHERE key = 'exact_upto'").fetchone() is None
    with cc_lhc.Tx(store.db):
        store.db.execute("DELETE FROM meta WHERE key = 'fts_upto'")
    store.close()
    # a capture that opens the thread within a launch's deadline, already over: nothing built
    late = cc_lhc.Capture(home, thread_id, tr.session_id, str(path))
    late.catch_up(deadline=time.monotonic() - 1)
    assert late.store.db.execute("SELECT count(*) FROM meta WHERE key IN ('fts_upto', 'exact_upto')").fetchone() == (0,)
    late.stop()
    again = cc_lhc.Capture(home, thread_id, tr.session_id, str(path))
    again.catch_up()
    marks = dict(again.store.db.execute("SELECT key, value FROM meta WHERE key IN ('fts_upto', 'exact_upto')"))
    again.stop()
    assert marks == {"fts_upto": str(top), "exact_upto": str(top)}


def test_output_is_utf8_whatever_encoding_the_streams_were_given(tmp_path):
    """A stream set to ASCII (PYTHONIOENCODING=ascii, or a C locale with PYTHONUTF8=0):
    search's hit lines (their »« marks), export and a non-ASCII word ended in a traceback.
    cc-lhc writes UTF-8; and an argument Python read as ASCII, though its bytes are UTF-8,
    is refused as that, with the way out, not as bytes that are not UTF-8."""
    tr = Transcript()
    tr.prompt("hello café")
    tr.response(text("hello there, naïve world"))
    thread = intake_transcript(tr, tmp_path)

    def run(*args, **env):
        return subprocess.run([sys.executable, str(CC_LHC), *args], capture_output=True, timeout=60,
                              env={**os.environ, **env})
    p = run("search", "--thread", thread.id, "hello", PYTHONIOENCODING="ascii")
    assert p.returncode == 0 and "\u00bbhello\u00ab".encode() in p.stdout and b"Traceback" not in p.stderr, p.stderr
    p = run("export", thread.id, PYTHONIOENCODING="ascii")
    assert p.returncode == 0 and "naïve".encode() in p.stdout, p.stderr
    p = run("search", "--thread", thread.id, "café", LC_ALL="C", PYTHONUTF8="0", LANG="C")
    if sys.getfilesystemencoding() == "utf-8" and p.returncode == 0:
        pytest.skip("this interpreter reads arguments as UTF-8 even so")
    assert p.returncode == 2 and b"PYTHONUTF8" in p.stderr and b"Traceback" not in p.stderr, p.stderr
