"""The cc-lhc mod's pure parts: its folder, the version gate, the handshake checks."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

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


def test_the_mod_files_are_private_and_doctor_leaves_claudes_own_alone(iso_env, capsys, fake_claude):
    """cc-lhc's own mod files are 0600 like every file of the state folder (an older 0644 one
    is made so); what Claude lays beside them with its own modes (types, a tsconfig.json,
    public) is no warning of doctor's, while a loose file of cc-lhc's is."""
    old = os.umask(0o022)
    try:
        home = cc_lhc.StateHome()
        folder = Path(cc_lhc.install_mod(home))
        module = folder / "hooks" / "register.js"
        assert {oct((folder / name).stat().st_mode & 0o777) for name in cc_lhc.MOD_FILES} == {"0o600"}
        types = folder / ".claude-plugin" / "types"
        types.mkdir(mode=0o755)
        (types / "index.d.ts").write_text("// theirs\n")
        (folder / "tsconfig.json").write_text("{}\n")
        os.chmod(types, 0o755)
        assert cc_lhc.main(["doctor"]) == 0
        assert "readable by others" not in capsys.readouterr().out
        os.chmod(module, 0o644)  # (as an earlier cc-lhc wrote it)
        assert cc_lhc.main(["doctor"]) == 0
        assert f"readable by others: {module}" in capsys.readouterr().out
        cc_lhc.install_mod(home)
        assert module.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)


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
    for off in ("0", "OFF", "false", "No"):  # (0 and OFF left the mod on without a word)
        monkeypatch.setenv("CC_LHC_MOD", off)
        assert cc_lhc.mod_refusal(_spec(new)) == f"CC_LHC_MOD={off}"


def test_an_environment_switch_set_to_another_word_stays_on_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(cc_lhc, "_env_said", set())
    for value in ("on", "1", "TRUE", "yes", ""):
        monkeypatch.setenv("CC_LHC_SUMMARIES", value)
        assert not cc_lhc.env_off("CC_LHC_SUMMARIES")
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("CC_LHC_SUMMARIES", "disabled")
    assert not cc_lhc.env_off("CC_LHC_SUMMARIES") and not cc_lhc.env_off("CC_LHC_SUMMARIES")
    assert capsys.readouterr().err.count("CC_LHC_SUMMARIES='disabled' is neither on nor off") == 1


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


def test_a_rebound_descriptor_keeps_its_shim_folder_and_a_dead_owners_is_removed(iso_env):
    """/clear and /resume rebind the descriptor at its path under a new token: the mod's
    commands (mod-hello, mod-compact) and the sweep of a dead owner's descriptors find its
    shim folder by the file's name, not by the new token (a folder named for it is none)."""
    home = cc_lhc.StateHome()
    hostdb = cc_lhc.HostDB(home)
    first = cc_lhc.create_descriptor(home, hostdb, "thread", "sid-1")
    cc_lhc.revoke_descriptor(home, hostdb, first, "Claude moved to another session")
    rebound = cc_lhc.rebind_descriptor(home, hostdb, first, "thread-2", "sid-2")
    assert rebound["shim_dir"] == first["shim_dir"] == cc_lhc.shim_dir_of(rebound["path"])
    assert cc_lhc.descriptor_paths(os.path.dirname(rebound["path"]), rebound["token"])[1] != first["shim_dir"]
    dead = json.dumps({"pid": 2 ** 22 + 7, "start": 1})
    hostdb.db.execute("UPDATE descriptors SET owner = ?", (dead,))
    hostdb.db.commit()
    assert cc_lhc.remove_stale_descriptors(home, hostdb) >= 1
    assert not os.path.exists(first["shim_dir"]) and not os.path.exists(first["path"])


def test_rows_of_descriptors_withdrawn_long_ago_go_at_a_launch(iso_env):
    """Every launch records a descriptor and withdraws it at its end: a launch a minute (a CI
    job) added rows for ever. Those withdrawn more than DESCRIPTOR_ROWS_KEPT_DAYS ago go;
    a recent one still tells a Claude holding it why retrieval was withdrawn."""
    home = cc_lhc.StateHome()
    hostdb = cc_lhc.HostDB(home)
    old, recent = (cc_lhc.create_descriptor(home, hostdb, "thread", sid) for sid in ("sid-1", "sid-2"))
    for d in (old, recent):
        cc_lhc.revoke_descriptor(home, hostdb, d, "the session ended")
    hostdb.db.execute("UPDATE descriptors SET revoked = '2026-01-01T00:00:00.000Z the session ended' "
                      "WHERE token = ?", (old["token"],))
    hostdb.db.commit()
    cc_lhc.remove_stale_descriptors(home, hostdb)
    left = [token for (token,) in hostdb.db.execute("SELECT token FROM descriptors")]
    assert left == [recent["token"]]
    assert "the session ended" in cc_lhc._withdrawn(home, [recent["path"]])


# -- In-process Smart Compact: the pure parts ------------------------------------------

def _rec(rtype, content, **extra):
    return {"type": rtype, "message": {"role": rtype, "content": content}, **extra}


def test_in_process_view_keeps_the_newest_records_by_handle_from_a_prompt_and_renders_the_rest():
    records = [
        _rec("user", cc_lhc.REBUILT_MARKER + " from thread T."),
        _rec("user", "old prompt"),
        _rec("assistant", [{"type": "thinking", "thinking": "old thought", "signature": "S0"}]),
        _rec("assistant", [{"type": "text", "text": "old answer"}]),
        _rec("user", "lean prompt"),
        _rec("assistant", [{"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "ls"}}]),
        _rec("user", [{"type": "tool_result", "tool_use_id": "tu1", "content": "[output of Bash m7 · ...]"}]),
        _rec("user", "new prompt"),
        _rec("assistant", [{"type": "thinking", "thinking": "new thought", "signature": "S1"}]),
        _rec("assistant", [{"type": "text", "text": "new answer"}]),
    ]
    sources = [None, ("u1", True, 1), ("a1", True, 1), ("a2", True, 1), ("u2", True, 1),
               ("a3", True, 1), ("u3", False, 1), ("u4", True, 1), ("a4", True, 1), ("a5", True, 1)]
    # u1..a2 were written before the session's last compaction: Claude has no handle for them
    handles = {"u2": 1, "a3": 1, "u3": 1, "u4": 1, "a4": 1, "a5": 1}
    out = cc_lhc.in_process_messages(records, sources, handles, instructions="keep the plan")
    assert [m.get("handle") for m in out] == [None, None, "u4", "a4", "a5", None]
    header = out[0]["text"]
    assert header.startswith(cc_lhc.REBUILT_MARKER) and "keep the plan" in header
    # the older records are in the header as text, the stubbed result as cc-lhc rendered it,
    # and no thinking that could not go back signed
    assert "old answer" in header and "[output of Bash m7" in header and "old thought" not in header
    assert out[1] == {"role": "assistant", "text": cc_lhc.IN_PROCESS_ACK}
    assert out[-1] == {"role": "assistant", "text": cc_lhc.IN_PROCESS_VIEW_END}


def test_a_newest_turn_too_long_for_its_prompt_keeps_its_newest_responses_by_handle():
    # one long agentic turn: its prompt and first call are lean, the rest is verbatim
    records = [
        _rec("user", cc_lhc.REBUILT_MARKER + " from thread T."),
        _rec("user", "do the long job"),
        _rec("assistant", [{"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "a"}}]),
        _rec("user", [{"type": "tool_result", "tool_use_id": "tu1", "content": "[output of Bash m3 · ...]"}]),
        _rec("assistant", [{"type": "thinking", "thinking": "t", "signature": "S2"}]),
        _rec("assistant", [{"type": "tool_use", "id": "tu2", "name": "Bash", "input": {"command": "b"}}]),
        _rec("user", [{"type": "tool_result", "tool_use_id": "tu2", "content": "full output b"}]),
        _rec("assistant", [{"type": "text", "text": "done", "signature": "SIG-LAST"}]),
    ]
    sources = [None, ("p", False, 1), ("a1", False, 1), ("r1", False, 1),
               ("a2", True, 1), ("a3", True, 1), ("r2", True, 1), ("a4", True, 1)]
    handles = {k: 1 for k in ("p", "a1", "r1", "a2", "a3", "r2", "a4")}
    out = cc_lhc.in_process_messages(records, sources, handles)
    # the header (user side) is followed directly by the first verbatim response: no
    # acknowledgement between, so roles alternate and the tool calls keep their results
    assert [m.get("handle") for m in out] == [None, "a2", "a3", "r2", "a4", None]
    assert "do the long job" in out[0]["text"] and "[output of Bash m3" in out[0]["text"]
    assert not any(m.get("text") == cc_lhc.IN_PROCESS_ACK for m in out)


def test_a_saved_output_is_not_counted_among_the_messages_a_handle_holds(iso_env):
    store = cc_lhc.ThreadStore(cc_lhc.StateHome(), "thread")
    with cc_lhc.Tx(store.db) as db:
        for seq, kind in ((1, "user_text"), (2, "tool_result"), (3, cc_lhc.SAVED_OUTPUT)):
            db.execute("INSERT INTO messages (seq, turn, segment, source_session, source_uuid, block, "
                       "kind, role, text) VALUES (?, 1, 0, 's', ?, ?, ?, 'user', 'x')",
                       (seq, "u" if seq == 1 else "r", seq, kind))
    assert cc_lhc.live_handles(store, "s") == {"u": 1, "r": 1}


def test_a_record_holding_more_than_the_view_shows_is_not_handed_back():
    records = [_rec("user", cc_lhc.REBUILT_MARKER), _rec("user", "p"), _rec("assistant", [{"type": "text", "text": "a"}])]
    sources = [None, ("u", True, 1), ("a", True, 1)]
    out = cc_lhc.in_process_messages(records, sources, {"u": 1, "a": 2})  # "a" holds a block the view left out
    assert not any("handle" in m for m in out) and "[assistant]\na" in out[0]["text"]


def test_the_view_names_the_mod_tools_only_when_asked_and_is_unchanged_otherwise():
    m = {"seq": 57, "text": "x\ny\n"}
    assert cc_lhc.tool_stub(m, "Bash") == "[output of Bash m57: 2 lines, 4 B · cc-lhc get-messages m57]"
    assert cc_lhc.tool_stub(m, "Bash", native=True) == "[output of Bash m57: 2 lines, 4 B · lhc_get_messages m57]"
    view = cc_lhc.View("T", {1: "full"}, {}, 0, "default", {})
    plain, native = cc_lhc.render_header(view, [], False), cc_lhc.render_header(view, [], False, True)
    assert "run these through Bash:" in plain and "cc-lhc get-turns tN tM" in plain
    # (placeholders: a label such as m57 may not exist in the thread, and reads as one to open)
    read_back = [line for line in (plain + "\n" + native).splitlines() if "get-" in line or "get_" in line]
    assert len(read_back) == 6 and not re.search(r"\b[tm]\d+\b", "\n".join(read_back))
    assert "lhc_get_turns" in native and "cc-lhc get-" not in native
    assert len(native) <= len(plain)  # the header's reserve is measured on the Bash wording


def _line(**rec):
    return json.dumps({"uuid": rec.pop("uuid"), "parentUuid": rec.pop("parent", None),
                       "timestamp": "2026-01-01T00:00:00Z", "sessionId": "sess-1", **rec}).encode()


def test_a_view_served_in_process_is_a_rebuild_of_the_thread_even_across_a_restart(tmp_path):
    lines = [
        _line(uuid="p1", type="user", message={"role": "user", "content": "first prompt"}),
        _line(uuid="a1", parent="p1", type="assistant",
              message={"id": "r1", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                       "content": [{"type": "text", "text": "first answer"}]}),
        _line(uuid="b", type="system", subtype="compact_boundary", content="Conversation compacted"),
        _line(uuid="h", parent="b", type="user",
              message={"role": "user", "content": cc_lhc.REBUILT_MARKER + " from thread T."}),
        _line(uuid="p1b", parent="h", type="user", message={"role": "user", "content": "first prompt"}),
        _line(uuid="a1b", parent="p1b", type="assistant",
              message={"id": "r1", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                       "content": [{"type": "text", "text": "first answer"}]}),
        _line(uuid="e", parent="a1b", type="assistant",
              message={"id": "x", "role": "assistant", "model": "<synthetic>",
                       "content": [{"type": "text", "text": cc_lhc.IN_PROCESS_VIEW_END}]}),
        _line(uuid="p2", parent="e", type="user", message={"role": "user", "content": "second prompt"}),
        _line(uuid="a2", parent="p2", type="assistant",
              message={"id": "r2", "role": "assistant", "model": "m", "stop_reason": "end_turn",
                       "content": [{"type": "text", "text": "second answer"}]}),
    ]
    transcript = tmp_path / "sess-1.jsonl"
    home = cc_lhc.StateHome(str(tmp_path / "lhc"))
    home.ensure()
    events = []
    # capture stops inside the view (a kill), and a new capture picks up from the record
    for part in (lines[:5], lines[5:]):
        with open(transcript, "ab") as f:
            f.write(b"\n".join(part) + b"\n")
        capture = cc_lhc.Capture(home, "thread-1", "sess-1", str(transcript), None,
                                 on_event=lambda event, _c: events.append(event))
        capture.catch_up()
        said = [(m["kind"], m["text"]) for m in capture.store.messages()]
        capture.stop()
    assert said == [("user_text", "first prompt"), ("assistant_text", "first answer"),
                    ("user_text", "second prompt"), ("assistant_text", "second answer")]
    assert [e[0] for e in events] == ["in_process_view"]


def test_mod_compact_refuses_bad_arguments_and_a_missing_descriptor(iso_env, capsys, monkeypatch):
    assert cc_lhc.main(["mod-compact", "not-a-session"]) == cc_lhc.EXIT_USAGE
    assert "usage: cc-lhc mod-compact" in capsys.readouterr().err
    monkeypatch.delenv(cc_lhc.RUNTIME_ENV, raising=False)
    assert cc_lhc.main(["mod-compact", "0" * 8 + "-0000-0000-0000-" + "0" * 12, "manual"]) == cc_lhc.EXIT_USAGE
    err = capsys.readouterr().err
    assert "retrieval refused" in err and "Traceback" not in err


def _bound_view(monkeypatch):
    home = cc_lhc.StateHome()
    sid = "11111111-2222-4333-8444-555555555555"
    thread = cc_lhc.Registry(home).create_thread(sid, os.getcwd(), "test")
    descriptor = cc_lhc.create_descriptor(home, cc_lhc.HostDB(home), thread, sid)
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, descriptor["path"])
    return sid, descriptor, Path(descriptor["shim_dir"])


def test_mod_compact_waits_for_the_view_cc_lhc_is_building_and_takes_it_once(iso_env, capsys, monkeypatch):
    import time
    sid, descriptor, folder = _bound_view(monkeypatch)
    view = folder / cc_lhc.MOD_VIEW_FILE
    bound = {"token": descriptor["token"], "session_id": sid}
    cc_lhc._write_private_json(str(view), {**bound, "preparing": True})
    built = {**bound, "key": sid + "#k", "messages": [{"role": "user", "text": "the view"}]}
    waits = []

    def wait(seconds):  # the wrapper finishes building while the hook waits
        waits.append(seconds)
        cc_lhc._write_private_json(str(view), built)

    monkeypatch.setattr(time, "sleep", wait)
    assert cc_lhc.main(["mod-compact", sid, "manual"]) == cc_lhc.EXIT_OK
    assert json.loads(capsys.readouterr().out) == {"messages": built["messages"]}
    assert len(waits) == 1 and not view.exists()  # taken: no later compaction finds it
    assert not (folder / cc_lhc.MOD_REQUEST_FILE).exists()  # never asked as a person's /compact


def test_mod_compact_passes_on_a_compaction_cc_lhc_gave_up(iso_env, capsys, monkeypatch):
    sid, descriptor, folder = _bound_view(monkeypatch)
    cc_lhc._write_private_json(str(folder / cc_lhc.MOD_VIEW_FILE), {
        "token": descriptor["token"], "session_id": sid, "refused": "its view could not be written"})
    assert cc_lhc.main(["mod-compact", sid, "manual"]) == cc_lhc.EXIT_OK
    # the hook leaves the conversation as it is rather than letting Claude summarise it
    assert json.loads(capsys.readouterr().out) == {"refused": "its view could not be written"}
    assert not (folder / cc_lhc.MOD_REQUEST_FILE).exists()


class _Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _waiting_handoff(tmp_path, monkeypatch, answers):
    """A LiveHandoff whose start() answers from ``answers`` (its session and relay are not
    needed for the retry), on a clock the test moves."""
    import time
    from types import SimpleNamespace
    clock = _Clock()
    monkeypatch.setattr(time, "monotonic", clock)
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.candidate, h.submit_at = SimpleNamespace(home=home, overlay_until=None, pending=None,
                                                          overlay_done=lambda now: False,
                                                          overlay_cleared=lambda at: False), None, None
    h.retry_at = h.retry_until = h.retry_prune = None
    h.accept_failed = False
    h.held = None  # (no automatic Smart Compact a draft held back)
    h.inproc = SimpleNamespace(on_tick=lambda relay: None, wants_tick=False)
    h._tell_carried = lambda relay: None
    asked = []
    h.prunes = []  # (the prune target each start was asked for)
    h.start = lambda relay, manual=False, prune=None: (asked.append(clock.now), h.prunes.append(prune),
                                                       answers.pop(0))[2]
    return h, clock, asked, home


def _events(home) -> list[str]:
    return [json.loads(line)["event"] for line in Path(home.root, "wrapper.log").read_text().splitlines()]


def test_a_swap_refused_for_an_unsettled_seam_is_tried_again_until_the_seam_settles(tmp_path, monkeypatch):
    """The in-process path was refused while Claude still writes the /compact it declined:
    the swap that must serve the seam waits for it to settle instead of being dropped."""
    unsettled = f"{cc_lhc.UNSETTLED} (the transcript was left mid-turn (t3 is still open))"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch, [unsettled, unsettled, ""])
    h.swap_soon(None)
    assert h.wants_tick and len(asked) == 1
    h.on_tick(None)
    assert len(asked) == 1  # not before its time
    clock.now += h.SEAM_RETRY_SECONDS
    h.on_tick(None)
    clock.now += h.SEAM_RETRY_SECONDS
    h.on_tick(None)
    assert len(asked) == 3 and not h.wants_tick  # started: nothing more to retry
    clock.now += 5
    h.on_tick(None)
    assert len(asked) == 3
    assert _events(home).count("handoff_waits_for_seam") == 1


def test_a_swap_waits_for_its_seam_only_so_long_and_never_for_another_reason(tmp_path, monkeypatch):
    unsettled = f"{cc_lhc.UNSETTLED} (the transcript was left mid-turn (t4 is still open))"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch, [unsettled] * 1000)
    h.swap_soon(None)
    while h.wants_tick:
        clock.now += h.SEAM_RETRY_SECONDS
        h.on_tick(None)
    # tried about every SEAM_RETRY_SECONDS for SEAM_WAIT_SECONDS, then left to the next seam
    assert len(asked) == round(h.SEAM_WAIT_SECONDS / h.SEAM_RETRY_SECONDS) + 1
    assert _events(home)[-1] == "handoff_seam_wait_over"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch, ["under the trigger"])
    h.swap_soon(None)
    assert not h.wants_tick and len(asked) == 1


def test_a_swap_waits_out_the_person_as_it_waits_out_the_seam(tmp_path, monkeypatch):
    """After a refused in-process compact the swap that serves it finds a draft in Claude's
    box, then a prompt just sent: it tries again, as for an unsettled seam, not never."""
    just_sent = cc_lhc.LiveHandoff.JUST_SENT + "; Smart Compact waits for it to be recorded"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch,
                                             [cc_lhc.LiveHandoff.DRAFT_WAITS, just_sent, ""])
    h.swap_soon(None)
    for _ in range(2):
        assert h.wants_tick
        clock.now += h.SEAM_RETRY_SECONDS
        h.on_tick(None)
    assert len(asked) == 3 and not h.wants_tick


@pytest.mark.parametrize("prune", [None, 40_000])
def test_a_seam_asking_while_an_in_process_compact_waits_is_asked_again_as_it_asked(prune, tmp_path, monkeypatch):
    """An automatic Smart Compact or Smart Prune asked for while an in-process compact waits
    for acceptance is remembered (a manual one is the person's to repeat) and asked again,
    the same kind with the same target, once that compact is accepted."""
    from types import SimpleNamespace
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.candidate, h.missed = SimpleNamespace(home=home), None, None
    h.inproc = SimpleNamespace(pending=object())
    assert h.start(None, manual=True, prune=prune) == "a Smart Compact is already under way"
    assert h.missed is None
    assert h.start(None, prune=prune) == "a Smart Compact is already under way"
    assert h.missed == (("prune", prune) if prune else ("compact", None))

    asked, accepted = [], []
    h.start = lambda relay, manual=False, prune=None: asked.append(prune) or ""
    ipc = cc_lhc.InProcessCompact.__new__(cc_lhc.InProcessCompact)
    ipc.session = SimpleNamespace(home=home, capture=SimpleNamespace(thread_id="T"),
                                  spec=SimpleNamespace(session_id="S", mod=None), views_replayed=[7])
    ipc.handoff, ipc.pending, ipc.replayed = h, SimpleNamespace(session_id="K"), 7

    class _Store:
        def __init__(self, *_a):
            self.db = SimpleNamespace(execute=lambda *_a: SimpleNamespace(fetchone=lambda: (1,)))

        def close(self):
            pass
    monkeypatch.setattr(cc_lhc, "ThreadStore", _Store)
    monkeypatch.setattr(cc_lhc, "accept_in_process", lambda *a: accepted.append(a))
    ipc.on_tick(None)
    assert len(accepted) == 1 and ipc.pending is None
    assert asked == [prune] and h.missed is None
    assert _events(home)[-1] == "handoff_asked_again"
    ipc.on_tick(None)
    assert asked == [prune]  # once


def test_the_relay_ticks_often_only_while_a_handoff_the_mod_or_the_person_may_need_it():
    """Claude idle at its prompt with the mod loaded: the relay looks twice a second, not ten
    times; a tenth of a second while the person types or Claude draws (a /compact's hook asks
    right after), while the mod's handshake is awaited or a handoff runs; the panel's pace
    while it is open."""
    from types import SimpleNamespace as NS
    class Handoff:  # LiveHandoff's say: its own timers, and the in-process path's
        busy, last_input = False, 100.0

        @property
        def wants_tick(self):
            return self.busy or self.inproc.wants_tick
    mod, handoff = NS(active=True, waiting=False), Handoff()
    inproc = cc_lhc.InProcessCompact.__new__(cc_lhc.InProcessCompact)
    inproc.handoff, inproc.pending, inproc.refused = handoff, None, ""
    inproc.session = NS(spec=NS(mod=mod), descriptor={"shim_dir": "/nowhere"})
    handoff.inproc, panel = inproc, NS(wants_tick=False)
    idle, quick, listen = cc_lhc.SessionFollower.POLL_SECONDS, 0.1, cc_lhc.InProcessCompact.LISTEN_SECONDS
    assert idle == 0.5 and not inproc.wants_tick

    def tick(output_at, now):
        return cc_lhc.tick_seconds(panel, handoff, mod, output_at, now)
    assert tick(None, 101.0) == quick  # typed a moment ago
    assert tick(None, 100.0 + listen + 0.1) == idle  # nothing since: Claude is idle
    assert tick(100.0 + listen, 100.0 + listen + 0.1) == quick  # Claude drew just now
    mod.waiting = True  # the handshake is awaited
    assert tick(None, 200.0) == quick
    mod.waiting = False
    inproc.refused = "refused before"  # no view is asked of this mod any more
    assert tick(None, 101.0) == idle
    inproc.refused, inproc.pending = "", object()  # a view is being served
    assert inproc.wants_tick and tick(None, 200.0) == quick
    inproc.pending, handoff.busy = None, True  # a swap under way
    assert tick(None, 200.0) == quick
    panel.wants_tick = True
    assert tick(None, 200.0) == 0.05
    assert cc_lhc.tick_seconds(NS(wants_tick=False), NS(wants_tick=False, last_input=100.0, inproc=NS(
        listening=lambda now, at: False)), None, None, 101.0) == idle  # no mod


def test_a_prune_the_mod_declines_is_carried_out_by_the_swap_even_after_waiting_for_its_seam(tmp_path, monkeypatch):
    """The mod declined a Smart Prune (CC_LHC_MOD_COMPACT=decline, or a hook that never took
    the view): the swap that took over ran a plain Smart Compact, and said so. It prunes,
    also when it first waits for the seam to settle, and a later swap is a Smart Compact."""
    unsettled = f"{cc_lhc.UNSETTLED} (the transcript was left mid-turn (t3 is still open))"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch, [unsettled, "", ""])
    h.swap_soon(None, prune=3000)
    clock.now += h.SEAM_RETRY_SECONDS
    h.on_tick(None)
    h.swap_soon(None)
    assert h.prunes == [3000, 3000, None]


def test_a_swap_asked_for_after_a_waiting_prune_is_what_it_was_asked_to_be(tmp_path, monkeypatch):
    """A prune's swap waiting for its seam must not turn a later Smart Compact asked for
    meanwhile (a /resume's rewrite) into a prune."""
    unsettled = f"{cc_lhc.UNSETTLED} (t3 is still open)"
    h, clock, asked, home = _waiting_handoff(tmp_path, monkeypatch, [unsettled, "", ""])
    h.swap_soon(None, prune=3000)
    h.swap_soon(None)
    assert h.prunes == [3000, None]
