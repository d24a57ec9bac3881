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
