"""The cc-lhc mod's session.compact hook (MOD_FILES' register.js) run by Node on its own,
with a stand-in for the mod runtime: which messages it hands back for a prepared view."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

import cc_lhc

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="no node on PATH")

DRIVER = r"""
import { register } from "./register.mjs"
const [viewJson, messagesJson] = process.argv.slice(2)
const files = { "/rt/d.json": JSON.stringify({ token: "tok" }), "/rt/bin-d/mod-view.json": viewJson }
const written = []
const $ = {
  env: { get: async k => (k === "CC_LHC_RUNTIME_DESCRIPTOR" ? "/rt/d.json" : undefined) },
  session: { id: async () => "sid" },
  fs: {
    read: async p => { if (!(p in files)) throw new Error("ENOENT " + p); return files[p] },
    exists: async p => p in files,
    write: async (p, t) => { written.push([p, JSON.parse(t)]); files[p] = t },
    stat: async p => ({ size: (files[p] || "").length }),
  },
  clock: { now: async () => 0, sleep: async () => {} },
  process: { run: async () => ({ exitCode: 1, stdout: "" }) },
}
const hooks = {}
register((name, fn) => { hooks[name] = fn }, {})
const e = { trigger: "auto", messages: JSON.parse(messagesJson) }
const out = await hooks["session.compact"]($, e, async () => ({ next: true }))
console.log(JSON.stringify({ out, written }))
"""


def compact(tmp_path, view_messages, conversation):
    (tmp_path / "register.mjs").write_text(cc_lhc.MOD_FILES["hooks/register.js"])
    (tmp_path / "driver.mjs").write_text(DRIVER)
    view = {"token": "tok", "session_id": "sid", "key": "k1", "messages": view_messages}
    p = subprocess.run(["node", "driver.mjs", json.dumps(view), json.dumps(conversation)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


CONVERSATION = [{"handle": h, "role": r} for h, r in (("h1", "user"), ("h2", "assistant"),
                                                     ("h3", "user"), ("h4", "assistant"))]


def test_the_view_is_handed_back_with_its_text_and_the_messages_it_names(tmp_path):
    got = compact(tmp_path, [{"role": "user", "text": "[cc-lhc] header"}, {"handle": "h3"}, {"handle": "h4"}],
                  CONVERSATION)
    assert [m.get("handle") or m["text"] for m in got["out"]["messages"]] == ["[cc-lhc] header", "h3", "h4"]
    assert got["written"] == [["/rt/bin-d/mod-view.json", {"key": "k1", "taken": True}]]


def test_messages_claude_added_after_the_view_was_made_are_kept_after_it(tmp_path):
    # the view was made at the seam after h2; Claude then sent a prompt it had queued (h3)
    # and got its answer (h4) before the compact ran: they stay, as they are, in order
    got = compact(tmp_path, [{"role": "user", "text": "[cc-lhc] header"}, {"handle": "h1"}, {"handle": "h2"}],
                  CONVERSATION)
    assert [m.get("handle") or m["text"] for m in got["out"]["messages"]] == [
        "[cc-lhc] header", "h1", "h2", "h3", "h4"]


def test_a_view_naming_a_message_claude_does_not_hold_is_declined(tmp_path):
    got = compact(tmp_path, [{"handle": "h1"}, {"handle": "gone"}], CONVERSATION)
    assert got["out"] == {"skip": "cc-lhc: message gone is not in this conversation"}
    assert got["written"] == [["/rt/bin-d/mod-view.json",
                               {"key": "k1", "declined": "message gone is not in this conversation"}]]


RUN_DRIVER = r"""
import { register } from "./register.mjs"
const ran = []
const $ = { process: { run: async (argv) => { ran.push(argv); return { exitCode: 0, stdout: "ok" } } } }
const hooks = {}
register((name, filter, fn) => { hooks[name + ":" + ((filter && filter.tool) || "")] = fn || filter }, {})
for (const e of JSON.parse(process.argv[2])) await hooks["tool.run:" + e.tool]($, e, async () => ({}))
console.log(JSON.stringify(ran))
"""


def test_the_native_tools_continue_an_answer_as_its_last_line_says(tmp_path):
    """A cut answer ends with the command that reads on (--from N --through mN): the mod's
    tools take both, so the rest continues the same answer (search takes --from alone)."""
    (tmp_path / "register.mjs").write_text(cc_lhc.MOD_FILES["hooks/register.js"])
    (tmp_path / "run.mjs").write_text(RUN_DRIVER)
    calls = [{"tool": "lhc_get_turns", "turns": ["t2"], "from": 6000, "through": "m57"},
             {"tool": "lhc_get_messages", "messages": ["m3-m9"], "from": 12, "through": "m80"},
             {"tool": "lhc_get_turns", "turns": ["t1"]},
             {"tool": "lhc_search", "text": "x", "from": 5, "through": "m9"}]
    p = subprocess.run(["node", "run.mjs", json.dumps(calls)], cwd=tmp_path, capture_output=True, text=True,
                       timeout=30)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout) == [["cc-lhc", "get-turns", "t2", "--from", "6000", "--through", "m57"],
                                    ["cc-lhc", "get-messages", "m3-m9", "--from", "12", "--through", "m80"],
                                    ["cc-lhc", "get-turns", "t1"],
                                    ["cc-lhc", "search", "--from", "5", "--", "x"]]
    tools = {t["name"]: t for t in mod_tools()}
    assert "through" in tools["lhc_get_turns"]["inputSchema"]["properties"]


def mod_tools() -> list:
    """The mod's tool list as JSON, read by Node from the file it ships in."""
    import os
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "register.mjs"), "w") as f:
            f.write(cc_lhc.MOD_FILES["hooks/register.js"])
        with open(os.path.join(d, "list.mjs"), "w") as f:
            f.write('import { register } from "./register.mjs"\nconst hooks = {}\n'
                    'register((name, filter, fn) => { hooks[name] = fn || filter }, {})\n'
                    'const out = await hooks["tool.list"]({}, {}, async () => ({ value: [] }))\n'
                    'console.log(JSON.stringify(out.value))\n')
        p = subprocess.run(["node", "list.mjs"], cwd=d, capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)
