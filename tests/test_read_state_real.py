"""A file Claude read before a Smart Compact stays editable after it (real CLI, fake API).

Claude Code 2.1.328 refuses an Edit of a file outside the project with "File has not been
read yet" unless its read-file state knows the file; on --resume it rebuilds that state
from the Read/Edit/Write calls paired with a successful result in the transcript. Inside
the project it does not ask for a Read at all, so every file here lives outside it.

Each test reads a file (scripted), pushes that turn into one band of the rebuilt view
(a small target in the project's .cc-lhc.json, filler turns), lets a one-shot over the
trigger run Smart Compact, and then has the scripted model Edit the file.
"""

from __future__ import annotations

import json
import re

import pytest

import cc_lhc
from fakeapi import block_text, text_reply, tool_results, tool_use_reply

pytestmark = pytest.mark.real_cli

SMALL = {"input_tokens": 1_500, "cache_creation_input_tokens": 300,
         "cache_read_input_tokens": 200, "output_tokens": 5}
OVER = {"input_tokens": 119_000, "cache_creation_input_tokens": 600,
        "cache_read_input_tokens": 400, "output_tokens": 5}   # over the 100k trigger below

# Filler replies: each a long answer (about 1,500 tokens verbatim, ~100 summarised).
FILLER = " ".join(f"filler sentence {i} about nothing in particular." for i in range(140))

# band of t1 -> (view target in tokens, filler turns after the Read)
BANDS = {
    "full": (60_000, 0),
    "lean": (3_000, 0),
    "summary": (3_000, 2),
    "omitted": (3_000, 14),
}


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def band_of(header: str, n: int) -> str:
    """The band the header puts turn n in."""
    words = {"verbatim": "full", "lean": "lean", "summarised": "summary"}
    for line in header.splitlines():
        ranges = [(int(a), int(b or a)) for a, b in re.findall(r"t(\d+)(?:\u2013t(\d+))?", line)]
        if not any(a <= n <= b for a, b in ranges):
            continue
        if "not in view" in line:
            return "omitted"
        for word, band in words.items():
            if line.startswith("In view, " + word):
                return band
    raise AssertionError(f"t{n} is not named in the header:\n{header}")


def read_then_compact_then_edit(rc, band: str):
    target, fillers = BANDS[band]
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(
        {"lowerBoundTokens": target, "upperBoundTokens": 100_000, "minRunwayTokens": 30_000}))
    outside = rc.iso.root / "elsewhere"
    outside.mkdir(exist_ok=True)
    path = outside / "notes.txt"
    # ~9 KB: too big for the full band of a 3,000-token view, so a lean turn stubs it
    body = "".join(f"line {i}: some text that makes this file long enough\n" for i in range(170))
    path.write_text("alpha\nbeta\ngamma\n" + body)

    rc.api.script([tool_use_reply("Read", {"file_path": str(path)}, usage=SMALL),
                   text_reply("I read the notes.", usage=OVER if not fillers else SMALL)])
    first = ok(rc.run_lhc("-p", "read the notes", "--output-format", "json",
                          "--allowedTools", "Read"))
    sid = json.loads(first.stdout)["session_id"]
    for i in range(fillers):
        last = i == fillers - 1
        rc.api.script([text_reply(f"answer {i}: {FILLER}", usage=OVER if last else SMALL)])
        ok(rc.run_lhc("--resume", sid, "-p", f"filler question {i}"))

    n = len(rc.api.message_requests)
    rc.api.script([tool_use_reply("Edit", {"file_path": str(path), "old_string": "beta",
                                           "new_string": "BETA"}, usage=SMALL),
                   text_reply("edited", usage=SMALL)])
    p = ok(rc.run_lhc("--resume", sid, "-p", "change beta to BETA in the notes",
                      "--allowedTools", "Read,Edit"))
    assert "Smart Compact" in p.stderr, p.stderr
    sent = rc.api.message_requests[n:]
    assert len(sent) == 2 and sent[0]["session_id"] != sid    # ran on the rebuilt session
    header = sent[0]["body"]["messages"][0]["content"]
    header = header if isinstance(header, str) else block_text(header[0])
    assert header.startswith(cc_lhc.REBUILT_MARKER)
    assert band_of(header, 1) == band, header
    [result] = tool_results(sent[1]["body"])
    return path, result, sent[0]["body"]


@pytest.mark.parametrize("band", list(BANDS))
def test_a_file_read_before_smart_compact_can_be_edited_after(real_claude, band):
    path, result, body = read_then_compact_then_edit(real_claude, band)
    assert not result.get("is_error"), block_text(result)
    assert "has been updated successfully" in block_text(result)
    assert path.read_text().startswith("alpha\nBETA\ngamma\n")
    # the file's text is not put back into the model's view beyond what the band allows
    sent = json.dumps(body["messages"])
    assert ("line 100: some text" in sent) == (band == "full")
