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

import atexit
import json
import re
import shutil
import tempfile
import uuid

import pytest

from pathlib import Path

import cc_lhc
from fakeapi import block_text, text_reply, tool_results, tool_use_reply

SMALL = {"input_tokens": 1_500, "cache_creation_input_tokens": 300,
         "cache_read_input_tokens": 200, "output_tokens": 5}
OVER = {"input_tokens": 119_000, "cache_creation_input_tokens": 600,
        "cache_read_input_tokens": 400, "output_tokens": 5}   # over the 100k trigger below

# Filler replies: each a long answer (about 1,500 tokens verbatim, ~100 summarised).
FILLER = " ".join(f"filler sentence {i} about nothing in particular." for i in range(140))

# band of t1's Read -> (filler turns after the Read, a long first prompt). Lean keeps a
# prompt verbatim, so only a turn whose prompt is long is cheaper summarised than lean.
# The view target that puts the Read in the band is then found by building the view
# in process (see target_for), so the test does not hang on exact token counts.
BANDS = {
    "full": (0, False),
    "lean": (6, True),
    "summary": (6, True),
    "omitted": (14, True),
}
CONFIG = {"upperBoundTokens": 100_000, "minRunwayTokens": 30_000}


def target_for(rc, sid: str, band: str, read_seq: int = 3) -> int:
    """A view target (well inside the widest run of them) that puts the Read's result in
    ``band``, found with the same planner cc-lhc runs before the next launch."""
    home = cc_lhc.StateHome(str(rc.iso.lhc))
    thread = cc_lhc.Registry(home).thread_for_session(sid)
    store = cc_lhc.ThreadStore(home, thread)
    runs, current = [], []
    try:
        for target in range(500, 65_000, 250):
            (rc.cwd / ".cc-lhc.json").write_text(json.dumps(dict(CONFIG, lowerBoundTokens=target)))
            policy = cc_lhc.load_policy(str(rc.cwd), {})
            plan = cc_lhc.plan_rebuild(home, store, thread, policy, str(uuid.uuid4()), str(rc.cwd),
                                       projects_root=str(rc.iso.root / "scratch-projects"))
            if plan.view.band_of(1, read_seq) == band:
                current.append(target)
            elif current:
                runs.append(current)
                current = []
    finally:
        store.close()
    runs.append(current)
    widest = max(runs, key=len)
    assert widest, f"no view target puts the Read in the {band} band"
    # three quarters up the run: away from its edges, and as large as that allows, since
    # the carried file-state pairs get a share of the target
    return widest[len(widest) * 3 // 4]


def ok(p):
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout}\nstderr: {p.stderr}"
    return p


def band_of(header: str, n: int, m: int = 3) -> str:
    """The band the header puts turn n in; for a turn served in parts, the band of the
    part holding message m (the Read's result in these sessions)."""
    words = {"verbatim": "full", "lean": "lean", "summarised": "summary"}
    lines = header.splitlines()
    for i, line in enumerate(lines):
        if line == f"t{n} is long, so it is in view in parts:":
            for part in lines[i + 1:]:
                hit = re.match(r"  m(\d+)(?:\u2013m(\d+))? (.*)", part)
                if not hit:
                    break
                a, b = int(hit.group(1)), int(hit.group(2) or hit.group(1))
                if a <= m <= b:
                    rest = hit.group(3)
                    if rest.startswith("not in view"):
                        return "omitted"
                    return next(band for word, band in words.items() if rest.startswith(word))
        ranges = [(int(a), int(b or a)) for a, b in re.findall(r"t(\d+)(?:\u2013t(\d+))?", line)]
        if not any(a <= n <= b for a, b in ranges) or line.startswith(f"t{n} is long"):
            continue
        if "not in view" in line:
            return "omitted"
        for word, band in words.items():
            if line.startswith("In view, " + word):
                return band
    raise AssertionError(f"t{n} is not named in the header:\n{header}")


def read_then_compact_then_edit(rc, band: str, edit_first=False):
    """Read a file outside the project, push that turn into ``band``, Smart Compact, Edit.

    With ``edit_first`` the turn after the Read edits the file too (beta -> BETA), and
    the Edit after the rebuild changes gamma instead. Returns (path, the Edit's
    tool_result, the first request body of the rebuilt session)."""
    fillers, long_prompt = BANDS[band]
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(dict(CONFIG, lowerBoundTokens=60_000)))
    # A folder whose path is the same length in every run: the path is part of what the
    # view holds, and a few bytes more or less would move the turn across a band edge.
    outside = Path(tempfile.mkdtemp(prefix="lhc-read-", dir="/tmp"))
    atexit.register(shutil.rmtree, outside, True)
    path = outside / "notes.txt"
    # ~9 KB: too big for the full band of a 3,000-token view, so a lean turn stubs it
    body = "".join(f"line {i}: some text that makes this file long enough\n" for i in range(170))
    path.write_text("alpha\nbeta\ngamma\n" + body)

    rc.api.script([tool_use_reply("Read", {"file_path": str(path)}, usage=SMALL),
                   text_reply("I read the notes.", usage=OVER if not fillers else SMALL)])
    prompt = "read the notes" + (f". Background: {FILLER}" if long_prompt else "")
    first = ok(rc.run_lhc("-p", prompt, "--output-format", "json",
                          "--allowedTools", "Read"))
    sid = json.loads(first.stdout)["session_id"]
    if edit_first:
        rc.api.script([tool_use_reply("Edit", {"file_path": str(path), "old_string": "beta",
                                               "new_string": "BETA"}, usage=SMALL),
                       text_reply("edited it", usage=SMALL)])
        ok(rc.run_lhc("--resume", sid, "-p", "edit the notes", "--allowedTools", "Read,Edit"))
    for i in range(fillers):
        last = i == fillers - 1
        rc.api.script([text_reply(f"answer {i}: {FILLER}", usage=OVER if last else SMALL)])
        ok(rc.run_lhc("--resume", sid, "-p", f"filler question {i}"))

    target = target_for(rc, sid, band)
    (rc.cwd / ".cc-lhc.json").write_text(json.dumps(dict(CONFIG, lowerBoundTokens=target)))
    n = len(rc.api.message_requests)
    old, new = ("gamma", "GAMMA") if edit_first else ("beta", "BETA")
    rc.api.script([tool_use_reply("Edit", {"file_path": str(path), "old_string": old,
                                           "new_string": new}, usage=SMALL),
                   text_reply("edited", usage=SMALL)])
    p = ok(rc.run_lhc("--resume", sid, "-p", f"change {old} to {new} in the notes",
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


@pytest.mark.real_cli
@pytest.mark.parametrize("band", list(BANDS))
def test_a_file_read_before_smart_compact_can_be_edited_after(real_claude, band):
    path, result, body = read_then_compact_then_edit(real_claude, band)
    assert not result.get("is_error"), block_text(result)
    assert "has been updated successfully" in block_text(result)
    assert path.read_text().startswith("alpha\nBETA\ngamma\n")
    # the file's text is not put back into the model's view beyond what the band allows
    sent = json.dumps(body["messages"])
    assert ("line 100: some text" in sent) == (band == "full")


@pytest.mark.real_cli
def test_a_file_read_and_then_edited_before_smart_compact_can_be_edited_after(real_claude):
    # The newest call on the file is the Edit: carrying only the older Read would leave
    # Claude Code believing the file changed since it was read.
    path, result, _body = read_then_compact_then_edit(real_claude, "omitted", edit_first=True)
    assert not result.get("is_error"), block_text(result)
    assert path.read_text().startswith("alpha\nBETA\nGAMMA\n")


# -- in process: what the rebuilt records carry --------------------------------------------

NOW = "2026-05-01T12:00:00.000Z"


def message(seq, kind, text="", **kw):
    row = {"seq": seq, "turn": kw.pop("turn", 1), "segment": 0, "kind": kind, "text": text,
           "data": None, "tool_use_id": None, "tool_name": None, "is_error": 0,
           "response_id": None, "model": None, "source_session": "s", "source_uuid": f"u{seq}",
           "block": 0, "line": seq, "created": f"2026-05-01T10:00:{seq:02d}.000Z"}
    row.update(kw)
    row["role"] = "assistant" if kind in ("tool_call", "assistant_text") else "user"
    return row


def tool_turn(n, seq, name, args, output):
    """A turn that calls one tool on a file and answers."""
    tid = f"toolu_{n}"
    call = {"type": "tool_use", "id": tid, "name": name, "input": args}
    result = {"type": "tool_result", "tool_use_id": tid, "content": output}
    return cc_lhc.Turn(n, "prompt", "closed", [
        message(seq, "user_text", f"prompt {n}", turn=n),
        message(seq + 1, "tool_call", json.dumps(args), data=json.dumps(call), tool_use_id=tid,
                tool_name=name, response_id=f"msg_{n}a", model="m", turn=n),
        message(seq + 2, "tool_result", output, data=json.dumps(result), tool_use_id=tid, turn=n),
        message(seq + 3, "assistant_text", f"answer {n}", response_id=f"msg_{n}b", model="m", turn=n),
    ])


def records_for(turns, bands, budget=100_000):
    carried, _ = cc_lhc.carried_file_state(turns, budget)
    view = cc_lhc.View("thread", bands, {}, budget, "default", {})
    return cc_lhc.view_records(view, turns, "header", "sess", "/p", NOW, carried=carried)


def tool_uses(records):
    return [b for r in records if r["type"] == "assistant" for b in r["message"]["content"]
            if b.get("type") == "tool_use"]


def test_a_read_still_in_view_is_not_carried_twice():
    turns = [tool_turn(1, 1, "Read", {"file_path": "/x/a.txt"}, "1\tx\n" * 500),
             tool_turn(2, 5, "Read", {"file_path": "/x/b.txt"}, "1\ty\n" * 500)]
    records = records_for(turns, {1: "summary", 2: "lean"})
    assert [b["id"] for b in tool_uses(records)] == ["toolu_1", "toolu_2"]  # t1 carried, t2 in view
    carried_result = records[2]
    assert carried_result["timestamp"] == turns[0].messages[2]["created"]  # the time it was read
    [block] = carried_result["message"]["content"]
    assert block["tool_use_id"] == "toolu_1" and block["content"].startswith("[output of Read m3:")
    parents = [r["parentUuid"] for r in records]
    assert parents == [None] + [r["uuid"] for r in records[:-1]]          # one unbroken chain


def test_the_newest_call_that_fits_is_carried_within_its_share():
    big_edit = {"file_path": "/x/a.txt", "old_string": "o" * 2_000, "new_string": "n"}
    turns = [tool_turn(1, 1, "Read", {"file_path": "/x/a.txt"}, "1\tx\n" * 500),
             tool_turn(2, 5, "Edit", {"file_path": "/x/a.txt", "old_string": "x", "new_string": "y"},
                       "The file /x/a.txt has been updated successfully."),
             tool_turn(3, 9, "Edit", big_edit, "The file /x/a.txt has been updated successfully.")]
    [(call, _result, stub)], cost = cc_lhc.carried_file_state(turns, 100_000)
    assert call["tool_use_id"] == "toolu_2" and stub is None   # the Edit too big to carry is skipped
    assert 0 < cost <= 100_000 * cc_lhc.CARRY_SHARE
    files = [tool_turn(n, 4 * n, "Read", {"file_path": f"/x/f{n}.txt"}, "1\tz\n" * 100)
             for n in range(1, 21)]
    pairs, cost = cc_lhc.carried_file_state(files, 10_000)
    assert 0 < len(pairs) < 20 and cost <= 10_000 * cc_lhc.CARRY_SHARE
