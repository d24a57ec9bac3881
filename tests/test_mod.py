"""The cc-lhc mod's pure parts: its folder, the version gate, the handshake checks."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cc_lhc


def test_the_mod_folder_is_versioned_by_hash_and_rewritten_when_tampered(iso_env):
    home = cc_lhc.StateHome()
    folder = Path(cc_lhc.install_mod(home))
    assert folder.name == f"{cc_lhc.MOD_VERSION}-{cc_lhc.mod_digest()[:12]}"
    module = folder / "hooks" / "register.js"
    module.write_text("export function register() {}\n")
    # Claude lays its type declarations into a folder it hot-reloads: they stay.
    extra = folder / ".claude-plugin" / "types" / "claude-code" / "index.d.ts"
    extra.parent.mkdir(parents=True)
    extra.write_text("// theirs\n")
    assert Path(cc_lhc.install_mod(home)) == folder
    assert module.read_text() == cc_lhc.MOD_FILES["hooks/register.js"]
    assert extra.read_text() == "// theirs\n"


def _spec(binary, *args):
    spec = cc_lhc.LaunchSpec()
    spec.claude_args = list(args)
    spec.child_argv = [str(binary), *args]
    return spec


def _npm_claude(tmp_path, version):
    pkg = tmp_path / "node_modules" / "@anthropic-ai" / "claude-code"
    (pkg / "bin").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": "@anthropic-ai/claude-code", "version": version}))
    exe = pkg / "bin" / "claude.exe"
    exe.write_text("")
    return exe


def test_the_mod_is_offered_only_to_a_claude_at_least_as_new_as_the_one_measured(tmp_path, monkeypatch):
    assert cc_lhc.claude_version_of(str(_npm_claude(tmp_path / "a", "2.1.328"))) == (2, 1, 328)
    assert cc_lhc.mod_refusal(_spec(_npm_claude(tmp_path / "b", "2.1.330"))) == ""
    assert "older than 2.1.328" in cc_lhc.mod_refusal(_spec(_npm_claude(tmp_path / "c", "2.1.200")))
    native = tmp_path / "versions" / "2.1.328"
    native.parent.mkdir()
    native.write_text("")
    assert cc_lhc.claude_version_of(str(native)) == (2, 1, 328)
    unknown = tmp_path / "claude"
    unknown.write_text("")
    assert cc_lhc.mod_refusal(_spec(unknown)) == "the installed Claude's version could not be read"
    new = _npm_claude(tmp_path / "d", "2.1.328")
    assert cc_lhc.mod_refusal(_spec(new, "--bare")) == "--bare loads no plugins"
    assert cc_lhc.mod_refusal(_spec(new, "--safe-mode")) == "--safe-mode loads no plugins"
    monkeypatch.setenv("CC_LHC_MOD", "off")
    assert cc_lhc.mod_refusal(_spec(new)) == "CC_LHC_MOD=off"


class _Session:
    def __init__(self, descriptor, sid):
        self.descriptor = descriptor
        self.spec = type("S", (), {"session_id": sid})()


def _hello(descriptor, **body):
    Path(descriptor["shim_dir"], cc_lhc.MOD_HELLO_FILE).write_text(
        json.dumps({"token": descriptor["token"], **body}))


def test_a_handshake_counts_only_from_the_current_child_and_its_bound_session(iso_env):
    home = cc_lhc.StateHome()
    descriptor = cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), "thread", "sid-1")
    bridge = cc_lhc.ModBridge(home, "/mods/x", "")
    bridge.expect(os.getpid())
    session = _Session(descriptor, "sid-1")
    assert bridge.on_tick(session, os.getpid()) is None and bridge.waiting
    _hello(dict(descriptor, token="forged"), session_id="sid-1", pid=os.getpid())
    assert bridge.on_tick(session, os.getpid()) is None and bridge.waiting  # another token
    _hello(descriptor, session_id="sid-1", pid=os.getpid())
    bridge.on_tick(session, os.getpid())
    assert bridge.active and bridge.details().startswith("active")
    # the same process reporting another session: Claude moved (/resume), follow it
    _hello(descriptor, session_id="sid-2", pid=os.getpid())
    assert bridge.on_tick(session, os.getpid()) == "sid-2"
    # a handshake from a process outside the child's tree is not the mod's
    _hello(descriptor, session_id="sid-1", pid=1)
    assert bridge.on_tick(session, os.getpid()) is None and not bridge.active
    assert "outside the current Claude process" in bridge.details()


def test_no_handshake_in_time_falls_back_and_says_so(iso_env, monkeypatch):
    home = cc_lhc.StateHome()
    descriptor = cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), "thread", "sid-1")
    bridge = cc_lhc.ModBridge(home, "/mods/x", "")
    monkeypatch.setattr(cc_lhc.ModBridge, "HELLO_SECONDS", -1.0)
    bridge.expect(os.getpid())
    bridge.on_tick(_Session(descriptor, "sid-1"), os.getpid())
    assert not bridge.waiting and "no handshake" in bridge.details()
    assert "Smart Compact swaps the Claude process" in bridge.details()
