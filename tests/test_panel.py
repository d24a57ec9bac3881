"""The control panel's keys, in process (the tmux tests drive it with the real CLI)."""

from __future__ import annotations

import types

import pytest

import cc_lhc


class FakeChild:
    def __init__(self):
        self.sizes = []

    def setwinsize(self, rows, cols):
        self.sizes.append((rows, cols))


def panel(monkeypatch, leader=None, policy=None, found=None, home=None):
    if leader is None:
        monkeypatch.delenv("CC_LHC_LEADER", raising=False)
    else:
        monkeypatch.setenv("CC_LHC_LEADER", leader)
    found = found or {}
    # a real (isolated) state home: /details reads the thread's boundary and thinking arm
    home = home or cc_lhc.StateHome()
    session = types.SimpleNamespace(capture=types.SimpleNamespace(thread_id="t" * 36),
                                    spec=types.SimpleNamespace(session_id="s" * 36, found=found,
                                                               autocompact=bool(found), mod=None),
                                    home=home, alarms=[], descriptor=None, show_notices=lambda relay: None,
                                    policy=policy or cc_lhc.Policy(dict(cc_lhc.BUILTIN_POLICY),
                                                                     dict.fromkeys(cc_lhc.BUILTIN_POLICY, "builtin"), []))
    host = types.SimpleNamespace(size=lambda: (24, 80), child=FakeChild())
    p = cc_lhc.ControlPanel(session, host, handoff=None)
    p.relay = cc_lhc.Relay(0, None, 1)
    return p


def press_esc(p) -> bytes:
    """The Esc key, alone in a read: the panel waits briefly for more, then closes."""
    out = p.on_input(b"\x1b")
    assert p.open and p.hold_until is not None  # it could still be the start of a sequence
    p.hold_until = 0.0  # nothing came within the wait
    p.on_tick(p.relay)
    return out


@pytest.mark.parametrize("leader", [b"\x1d", b"\x1b[93;5u", b"\x1b[27;5;93~"])
def test_every_encoding_of_ctrl_bracket_opens_the_panel(monkeypatch, leader):
    p = panel(monkeypatch)
    assert p.on_input(b"abc" + leader + b"/he") == b"abc"  # what came before still reaches Claude
    assert p.open and p.line == "/he"
    assert p.on_input(b"lp\r") == b""  # typed into the panel, never into Claude
    assert "/smart-compact" in p.output[0]
    assert press_esc(p) == b"" and not p.open
    assert p.on_input(b"hello") == b"hello"


def win32(vk, sc, uc, down, cs=0, rc=1) -> bytes:
    """One Windows Terminal win32-input-mode key event: ESC [ Vk;Sc;Uc;Kd;Cs;Rc _"""
    return f"\x1b[{vk};{sc};{uc};{int(down)};{cs};{rc}_".encode()


CTRL_BRACKET_DOWN = win32(221, 27, 29, True, cs=0x0008)   # left ctrl held
CTRL_BRACKET_UP = win32(221, 27, 29, False, cs=0x0008)


def test_the_win32_input_encoding_of_ctrl_bracket_opens_and_closes_the_panel(monkeypatch):
    p = panel(monkeypatch)
    ctrl_down = win32(17, 29, 0, True, cs=0x0008)
    # ctrl pressed, then the leader's release alone: neither opens the panel, both reach Claude
    assert p.on_input(ctrl_down + CTRL_BRACKET_UP) == ctrl_down + CTRL_BRACKET_UP and not p.open
    assert p.on_input(b"ab" + CTRL_BRACKET_DOWN + CTRL_BRACKET_UP) == b"ab" and p.open
    # keys typed in win32 mode edit the panel's line; releases type nothing
    keys = b"".join(win32(0, 0, ord(c), True) + win32(0, 0, ord(c), False) for c in "/help")
    p.on_input(keys + win32(13, 28, 13, True) + win32(13, 28, 13, False))
    assert "/smart-compact" in p.output[0] and p.open
    p.on_input(CTRL_BRACKET_DOWN)
    assert not p.open
    assert p.on_input(b"hello") == b"hello"


@pytest.mark.parametrize("event", [
    win32(221, 27, 0, True, cs=0x0004),           # right ctrl, a layout giving no character
    b"\x1b[221;27;29;1;8_",                      # repeat count left out
    win32(221, 27, 29, True, cs=0x0008, rc=2),
])
def test_win32_leader_variants_open_the_panel(monkeypatch, event):
    p = panel(monkeypatch)
    assert p.on_input(event) == b"" and p.open


def test_win32_escape_closes_the_panel_and_a_custom_leader_is_matched_by_its_character(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d")
    p.on_input(win32(27, 1, 27, True))
    assert not p.open
    p = panel(monkeypatch, "ctrl-g")
    assert p.on_input(CTRL_BRACKET_DOWN) == CTRL_BRACKET_DOWN and not p.open
    assert p.on_input(win32(71, 34, 7, True, cs=0x0008)) == b"" and p.open


def test_cc_lhc_leader_changes_the_key(monkeypatch):
    p = panel(monkeypatch, "ctrl-g")
    assert p.on_input(b"\x1d") == b"\x1d"  # ctrl-] goes to Claude now
    assert p.on_input(b"\x07") == b"" and p.open
    # ...in the encodings Claude turns on too: kitty's CSI-u and xterm's modifyOtherKeys
    for pressed in (b"\x1b[103;5u", b"\x1b[27;5;103~"):
        p = panel(monkeypatch, "ctrl-g")
        assert p.on_input(pressed) == b"" and p.open
        assert panel(monkeypatch, "ctrl-g").on_input(b"\x1b[93;5u") == b"\x1b[93;5u"  # (ctrl-] now Claude's)


@pytest.mark.parametrize("given", ["ctrl-m", "ctrl-j", "ctrl-i", "ctrl-[", "^h", "ctrl-@"])
def test_a_leader_that_is_enter_tab_esc_or_backspace_is_refused(monkeypatch, given):
    """As the leader, each Enter (Tab, Esc...) would open the panel, and a focus report
    (ESC [ O) would open it by itself: ctrl-] stays the key, and the panel says why."""
    monkeypatch.setenv("CC_LHC_LEADER", given)
    leader, name, why = cc_lhc.leader_key()
    assert (leader, name) == (b"\x1d", "ctrl-]") and "must not take" in why


def test_partial_names_complete_and_unknown_ones_are_named(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/intro\t")
    assert p.line == "/introduction "
    p.on_input(b"\x7f\x7f\x7f\r")  # backspaces, then Enter on "/introduct": completes
    assert p.line == "/introduction "
    p.on_input(b"\r")
    assert "Smart Compact rebuilds" in p.output[0]
    p.on_input(b"/sta\r")
    assert p.output == ["/sta: could be /status, /stats"]
    p.on_input(b"/nope\r")
    assert p.output == ["unknown command /nope; /help lists them"]
    # what was typed after a partial name stays with the completed one
    p.on_input(b"/bo 150000 300000\r")
    assert p.line == "/bounds 150000 300000"
    p.on_input(b"\x03/smart-p 120000\t")  # (ctrl-c clears the line)
    assert p.line == "/smart-prune 120000"


def test_arrow_keys_do_not_type_into_the_panel(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/he\x1b[A\x1b[Dlp")
    assert p.line == "/help" and p.open


def test_the_configuration_fallback_is_said_on_the_first_opening_only(monkeypatch, tmp_path):
    (tmp_path / ".cc-lhc.json").write_text('{"upperBoundTokens": "lots"}')
    policy = cc_lhc.load_policy(str(tmp_path), {})
    assert policy.fell_back
    p = panel(monkeypatch, policy=policy)
    p.on_input(b"\x1d")
    first = p.output[0]
    assert first.startswith(cc_lhc.MSG_CONFIG_FALLBACK) and "upperBoundTokens" in first
    press_esc(p)
    p.on_input(b"\x1d")
    assert not any(cc_lhc.MSG_CONFIG_FALLBACK in line for line in p.output)
    p.on_input(b"/details\r")
    assert cc_lhc.MSG_CONFIG_FALLBACK in p.output[0]  # still in /details whenever asked


def test_autocompact_gives_one_advisory_and_details_names_the_argument_and_the_way_back(monkeypatch):
    p = panel(monkeypatch, found={"autocompact": True, "autocompact_arg": "--autocompact auto"})
    p.on_input(b"\x1d")
    advisories = [line for line in p.output if "Claude native Compact may run before Smart Compact" in line]
    assert len(advisories) == 1 and "--autocompact auto" in advisories[0]
    p.on_input(b"/details\r")
    assert "the launch gave --autocompact auto" in p.output[0]
    assert "relaunch without --autocompact" in p.output[0]
    quiet = panel(monkeypatch)
    quiet.on_input(b"\x1d")
    assert not any("may run before" in line for line in quiet.output)


def test_a_standing_alarm_from_an_earlier_process_is_on_the_panel(monkeypatch, iso_env):
    home = cc_lhc.StateHome(str(iso_env.lhc))
    home.ensure()
    registry = cc_lhc.Registry(home)
    thread = registry.create_thread("s" * 36, str(iso_env.work), "fresh")
    with cc_lhc.Tx(registry.db) as db:
        db.execute("INSERT INTO thread_alarms VALUES (?, ?, ?)", (thread, "rebuilds not loading", "now"))
    p = panel(monkeypatch, home=home)
    p.session.capture.thread_id = thread
    p.on_input(b"\x1d")
    assert "alarm: rebuilds not loading" in p.output


def test_the_served_view_reads_as_markdown_with_every_block_kind():
    records = [
        {"type": "user", "message": {"role": "user", "content": "the opening message"}},
        {"type": "assistant", "message": {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "first\nsecond", "signature": "sig"},
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}},
        {"type": "user", "message": {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
             "content": [{"type": "text", "text": "no such file"}]}]}},
        {"type": "permission-mode", "permissionMode": "default"},
    ]
    data = b"\n".join(cc_lhc.json.dumps(r).encode() for r in records) + b"\n"
    text = cc_lhc.served_view_markdown(data, "t" * 36)
    assert text.startswith("# Served view of thread " + "t" * 36)
    assert text.count("## user") == 2 and text.count("## assistant") == 1
    assert "the opening message" in text and "> (thinking) first\n> second" in text
    assert "**tool call Bash** (`toolu_1`)" in text and '"command": "ls"' in text
    assert "**tool result · error** (`toolu_1`)" in text and "no such file" in text
    assert "permission-mode" not in text  # bookkeeping records are not part of the reading


# What a terminal answers to the queries Claude Code 2.1.328 sends as it starts (its version,
# device attributes, a colour, the kitty keyboard flags, a mode), and a focus report.
TERMINAL_REPLIES = [b"\x1bP>|tmux 3.3a\x1b\\", b"\x1b[?1;2c", b"\x1b]11;rgb:0000/0000/0000\x07",
                    b"\x1b]11;rgb:ffff/ffff/ffff\x1b\\", b"\x1b[?0u", b"\x1b[?2026;2$y", b"\x1b[I"]


@pytest.mark.parametrize("reply", TERMINAL_REPLIES, ids=repr)
def test_the_terminals_answers_to_claude_pass_through_the_open_panel(monkeypatch, reply):
    p = panel(monkeypatch)
    assert p.on_input(b"\x1d/he" + reply + b"lp") == reply  # Claude asked: Claude gets it
    assert p.open and p.line == "/help"
    # cut anywhere by the reads, even right after its ESC, it is still one answer and the
    # panel stays open
    for cut in range(1, len(reply)):
        p = panel(monkeypatch)
        p.on_input(b"\x1d")
        got = p.on_input(b"/a" + reply[:cut]) + p.on_input(reply[cut:] + b"b")
        assert got == reply and p.open and p.line == "/ab", cut


def test_mouse_reports_neither_close_the_open_panel_nor_reach_claude(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d")
    assert p.on_input(b"\x1b[<35;10;5M/st\x1b[<0;10;5m") == b"" and p.open and p.line == "/st"
    assert press_esc(p) == b"" and not p.open  # Esc itself still closes it
    assert p.on_input(b"x") == b"x"


def test_a_command_that_closes_the_panel_leaves_nothing_for_claude(monkeypatch):
    p = panel(monkeypatch)
    p.cmd_smart_compact = lambda args: (p._hide(), "Smart Compact started")[1]  # as it does once started
    assert p.on_input(b"\x1d/smart-compact\r") == b"" and not p.open


def test_an_esc_that_ends_a_read_waits_for_what_follows_it(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/st")
    assert p.on_input(b"\x1b") == b"" and p.open and p.wants_tick  # Esc, or an answer cut short
    p.hold_until += 3600  # (its wait is not over yet, however slow this machine is)
    p.on_tick(p.relay)
    assert p.open and p.hold_until is not None
    assert p.on_input(b"[?1;2c") == b"\x1b[?1;2c" and p.open and p.line == "/st"  # it was an answer
    assert not p.wants_tick
    # the Esc key then typing for Claude, the two in one read or the second in the next
    assert p.on_input(b"\x1b") == b"" and p.open
    assert p.on_input(b"hi") == b"hi" and not p.open and p.cut == b""
    p.on_input(b"\x1d")
    assert p.on_input(b"\x1bho") == b"ho" and not p.open


def test_keys_after_the_leader_that_closes_the_panel_are_claudes(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/st")
    assert p.on_input(b"\x1dnext") == b"next" and not p.open
    assert p.on_input(b"\x1d\x1d") == b"" and not p.open  # opened and closed again


def test_a_paste_full_of_leaders_opens_and_closes_the_panel_without_end(monkeypatch):
    p = panel(monkeypatch)
    assert p.on_input(b"\x1d" * 5001) == b"" and p.open  # an odd number: open at the end
    # closed by the first; then alt-x typed to Claude, opened, Esc closes, x typed, ...
    assert p.on_input(b"\x1d" + b"\x1bx\x1d" * 3000) == b"\x1bx" + b"x" * 2999 and p.open


def test_a_sequence_never_completed_is_taken_for_keys_once_its_wait_is_over(monkeypatch):
    """Esc, then (in the next read) a key that would begin a terminal string: nothing
    ends that string, so after a moment it was the Esc key and the keys after it."""
    p = panel(monkeypatch)
    p.on_input(b"\x1d")
    p.on_input(b"\x1b")
    started = p.cut_at
    assert p.on_input(b"P") == b"" and p.open and p.cut == b"\x1bP"
    assert p.on_input(b"/help\r") == b"" and p.open  # still held: it could be an answer
    assert p.cut_at == started  # typing on does not put the end off
    assert p.hold_until == pytest.approx(started + cc_lhc.ControlPanel.CUT_WAIT_SECONDS)
    p.hold_until = 0.0
    p.on_tick(p.relay)
    assert not p.open and bytes(p.relay.to_child) == b"P/help\r" and p.cut == b""
    # the same with the leader typed meanwhile: it is one of the keys, and reopens the panel
    q = panel(monkeypatch)
    q.on_input(b"\x1d")
    q.on_input(b"\x1b]")
    q.on_input(b"\x1d")
    q.hold_until = 0.0
    q.on_tick(q.relay)
    assert q.open and bytes(q.relay.to_child) == b"]"


def test_a_leader_of_ones_own_is_the_key_the_panel_names(monkeypatch):
    p = panel(monkeypatch, leader="ctrl-g")
    assert p.on_input(b"x\x07") == b"x" and p.open
    assert p.output[-1] == "Type a command (/help lists them); Esc or ctrl-g returns to Claude."
    assert p.on_input(b"\x07") == b"" and not p.open           # the same key closes it
    assert p.on_input(b"\x1d") == b"\x1d"                      # ctrl-] is Claude's again


def test_a_leader_that_names_no_key_falls_back_and_the_panel_says_so(monkeypatch):
    p = panel(monkeypatch, leader="hyper-x")
    assert p.on_input(b"\x1d") == b"" and p.open
    assert p.output[0].startswith("CC_LHC_LEADER='hyper-x' names no control key")
    assert p.output[-1].endswith("Esc or ctrl-] returns to Claude.")
    assert press_esc(p) == b"" and not p.open
    p.on_input(b"\x1d")
    assert not any("CC_LHC_LEADER" in line for line in p.output)  # said once


def test_allocation_takes_the_profile_names_as_the_help_writes_them(monkeypatch):
    p = panel(monkeypatch)
    p.on_input(b"\x1d/allocation Balanced\r")
    assert p.output[-1] == "profile balanced for the rest of this session"
    assert p.session.policy["profile"] == "balanced"


@pytest.mark.parametrize("why, kept", [
    (cc_lhc.LiveHandoff.JUST_SENT + "; Smart Compact waits for it to be recorded", False),
    (cc_lhc.LiveHandoff.DRAFT_WAITS, False),
    ("under the trigger", True),
])
def test_a_smart_compact_asked_for_at_a_passing_moment_says_to_ask_again(why, kept):
    """The panel's /smart-compact is not remembered: when what holds it back passes by
    itself (a prompt being recorded, a draft), the answer says to ask again then."""
    import types
    policy = cc_lhc.resolve_policy([])
    session = types.SimpleNamespace(policy=policy, home=None)
    host = types.SimpleNamespace(size=lambda: (24, 80))
    handoff = types.SimpleNamespace(start=lambda relay, manual: why)
    panel = cc_lhc.ControlPanel(session, host, handoff)
    panel._nothing_yet = lambda: False
    said = panel.cmd_smart_compact([])
    assert said.startswith(f"Smart Compact did not start: {why}")
    assert ("run /smart-compact again" in said) is not kept


def test_a_smart_compact_of_a_session_with_nothing_captured_yet_is_not_started(iso_env):
    """Before the first prompt a rebuild would be cc-lhc's header over nothing."""
    import types
    import uuid
    home = cc_lhc.StateHome()
    home.ensure()
    thread = cc_lhc.Registry(home).create_thread(str(uuid.uuid4()), "/w", "fresh")
    session = types.SimpleNamespace(policy=cc_lhc.resolve_policy([]), home=home,
                                    capture=types.SimpleNamespace(thread_id=thread, session_id=str(uuid.uuid4()),
                                                                  path=str(home.path("no-transcript.jsonl"))))
    started = []
    handoff = types.SimpleNamespace(start=lambda relay, manual, prune=None: started.append(prune) or "")
    panel = cc_lhc.ControlPanel(session, types.SimpleNamespace(size=lambda: (24, 80)), handoff)
    assert panel.cmd_smart_compact([]) == "Smart Compact did not start: nothing is captured in this session yet"
    assert panel.cmd_smart_prune([]) == "Smart Prune did not start: nothing is captured in this session yet"
    assert started == []


def panel_over_a_transcript(tmp_path, start):
    """A panel on a thread whose transcript holds one answered prompt (not captured yet);
    ``start`` plays the handoff's. Returns (panel, home, thread, session, transcript path)."""
    import uuid
    from test_capture_parse import Transcript, text
    home = cc_lhc.StateHome()
    home.ensure()
    sid = str(uuid.uuid4())
    thread = cc_lhc.Registry(home).create_thread(sid, "/w", "fresh")
    t = Transcript(sid)
    t.user("hello")
    t.assistant(text("an answer on the screen"))
    path = t.write(tmp_path / "t.jsonl")
    return panel_on(home, thread, sid, path, start), home, thread, sid, path


def panel_on(home, thread, sid, path, start):
    """A panel on that thread and session (its transcript at path); ``start`` plays the handoff's."""
    import types
    session = types.SimpleNamespace(policy=cc_lhc.resolve_policy([]), home=home,
                                    capture=types.SimpleNamespace(thread_id=thread, session_id=sid, path=str(path)))
    panel = cc_lhc.ControlPanel(session, types.SimpleNamespace(size=lambda: (24, 80)),
                                types.SimpleNamespace(start=start))
    panel._hide = lambda: None
    return panel


def captured_thread(tmp_path, write):
    """A new thread whose transcript ``write(transcript)`` fills, captured:
    (home, thread, session, transcript path)."""
    import uuid
    from test_capture_parse import Transcript
    home = cc_lhc.StateHome()
    home.ensure()
    sid = str(uuid.uuid4())
    thread = cc_lhc.Registry(home).create_thread(sid, "/w", "fresh")
    t = Transcript(sid)
    write(t)
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    cap.catch_up()
    cap.stop()
    return home, thread, sid, path


def test_a_smart_compact_asked_while_capture_is_behind_waits_for_it(iso_env, monkeypatch, tmp_path):
    """An answer on the screen a moment ago may not be in the thread yet: while the
    transcript holds more than capture took in, capture gets a moment, and the request goes
    ahead once it has (on a loaded machine it was refused as "nothing captured yet")."""
    import threading
    started = []
    panel, home, thread, sid, path = panel_over_a_transcript(
        tmp_path, lambda relay, manual, prune=None: started.append(prune) or "")
    monkeypatch.setattr(cc_lhc.ControlPanel, "CAPTURE_WAIT", 0.3)
    assert panel.cmd_smart_compact([]) == "Smart Compact did not start: nothing is captured in this session yet"

    def capture_later():
        cap = cc_lhc.Capture(home, thread, sid, str(path))
        try:
            cap.catch_up()
        finally:
            cap.stop()
    monkeypatch.setattr(cc_lhc.ControlPanel, "CAPTURE_WAIT", 5.0)
    later = threading.Timer(0.2, capture_later)
    later.start()
    try:
        assert panel.cmd_smart_compact([]) == "Smart Compact started"
    finally:
        later.join()
    assert started == [None]


def test_a_smart_compact_asked_as_a_turn_ends_waits_for_it_to_be_over(iso_env, monkeypatch, tmp_path):
    """Claude writes a turn's end a moment after its answer shows: a request made at once
    is given that moment (it was refused as not at a settled seam), and one whose turn
    stays open is still refused with the reason once the wait runs out."""
    unsettled = f"{cc_lhc.UNSETTLED} (the transcript was left mid-turn (t1 is still open))"
    answers = [unsettled, unsettled, ""]
    panel, home, thread, sid, path = panel_over_a_transcript(
        tmp_path, lambda relay, manual, prune=None: answers.pop(0) if answers else unsettled)
    cap = cc_lhc.Capture(home, thread, sid, str(path))
    cap.catch_up()
    cap.stop()
    assert panel.cmd_smart_compact([]) == "Smart Compact started" and answers == []
    monkeypatch.setattr(cc_lhc.ControlPanel, "SETTLE_WAIT", 0.3)
    assert panel.cmd_smart_compact([]).startswith(f"Smart Compact did not start: {cc_lhc.UNSETTLED}")


def test_allocation_with_more_than_one_name_is_refused(monkeypatch):
    """/allocation takes one profile: "/allocation balanced historical" set balanced and
    said nothing of the rest, where /bounds and /smart-prune refuse extra words."""
    p = panel(monkeypatch)
    p.on_input(b"\x1d/allocation balanced historical\r")
    assert "usage: /allocation" in p.output[-1] and "nothing changed" in p.output[-1]
    assert p.session.policy["profile"] == "default"


@pytest.mark.parametrize("target, trigger, ok", [
    ("150000", "300000", True), ("150,000", "300_000", True), ("1,500,000", "3,000,000", True),
    ("\uff13\uff10\uff10\uff10\uff10", "100000", False),   # fullwidth digits
    ("\u0663\u0660\u0660\u0660\u0660", "100000", False),   # Arabic-Indic digits
    ("+40000", "100000", False), ("5,0,0,0", "100000", False), ("180,00", "300000", False),
    ("1_5_0_000", "300000", False),
])
def test_bounds_read_numbers_as_the_launch_flags_do(monkeypatch, target, trigger, ok):
    """/bounds takes ASCII digits, in groups of three marked by , or _ if at all, as the
    launch flags do; other scripts' digits, a sign, or marks that are no grouping of three
    are refused (5,0,0,0 was read as 5000, 180,00 as 18000)."""
    p = panel(monkeypatch)
    p.on_input(f"\x1d/bounds {target} {trigger}\r".encode())
    if ok:
        assert p.output[-1].startswith("target ") and p.session.policy["lowerBoundTokens"] == \
            int(target.replace(",", "").replace("_", ""))
    else:
        assert "nothing changed" in p.output[-1] and p.session.policy["lowerBoundTokens"] == 180_000


@pytest.mark.parametrize("value, expected", [
    ("150000", 150000), ("150,000", 150000), ("150_000", 150000),
    ("5,0,0,0", "5,0,0,0"), ("180,00", "180,00"), ("+40000", "+40000"), ("\uff13\uff10", "\uff13\uff10")])
def test_launch_flags_read_grouped_digits_only_in_groups_of_three(value, expected):
    assert cc_lhc.policy_flag_values({"--lhc-target": value}) == {"lowerBoundTokens": ("--lhc-target", expected)}
    policy = cc_lhc.resolve_policy([("--lhc-target", {"lowerBoundTokens": cc_lhc.token_count_text(value)})])
    assert policy.fell_back == isinstance(expected, str)


def test_bounds_and_status_show_the_target_views_are_built_to(monkeypatch):
    """With the 50k runway, /bounds 80000 100000 builds views to 50,000: the answer said
    "target 80,000" and nothing showed the figure in effect."""
    p = panel(monkeypatch)
    p.on_input(b"\x1d/bounds 80000 100000\r")
    assert p.output[-1] == ("target 80,000 (50,000 in effect: the trigger less the runway), "
                            "trigger 100,000 for the rest of this session")
    assert cc_lhc.describe_target(p.session.policy) == "80,000 (50,000 in effect: the trigger less the runway)"
    p.on_input(b"/bounds 40000 100000\r")
    assert p.output[-1] == "target 40,000, trigger 100,000 for the rest of this session"


def test_hundreds_of_configuration_problems_are_listed_in_part(monkeypatch):
    """A project file of 300 unknown fields listed all 300 at the panel's first opening
    (cut at the screen's foot, its last line with it) and over Claude's screen (covering it,
    the fallback sentence scrolled away): the first few are listed, then how many more."""
    layer = {f"field{i}": i for i in range(300)}
    layer["x" * 5000] = 1
    policy = cc_lhc.resolve_policy([("/p/.cc-lhc.json", layer)])
    assert len(policy.problems) == 301 and all(len(x) < 200 for x in policy.problems)
    p = panel(monkeypatch, policy=policy)
    p.on_input(b"\x1d")
    first = p.output[0].split("\n")
    assert first[0] == cc_lhc.MSG_CONFIG_FALLBACK and len(first) == 1 + cc_lhc.POLICY_PROBLEMS_SHOWN + 1
    assert first[-1] == f"  and {301 - cc_lhc.POLICY_PROBLEMS_SHOWN} more (wrapper.log names every one)"
    assert p.output[-1].startswith("Type a command")


def test_a_long_line_over_claudes_screen_takes_a_few_rows_and_says_it_was_cut():
    from test_relay import _screen_rows
    out = cc_lhc.overlay_lines([cc_lhc.MSG_CONFIG_FALLBACK + " (" + "problem; " * 500 + ")"], (24, 80))
    rows = _screen_rows(out, 24, 80)
    used = [r for r in rows if r]
    assert len(used) == cc_lhc.OVERLAY_ROWS and used[0].startswith("cc-lhc: " + cc_lhc.MSG_CONFIG_FALLBACK[:40])
    assert out.endswith("\u2026\x1b[0m\x1b8".encode())  # (its last row marked as cut)


def test_a_live_smart_compact_with_no_room_for_a_turn_is_said_once_and_logged_each_time():
    """At every seam over the trigger Smart Compact asks again; a target too small for a
    turn is said on the terminal the first time only, and a Smart Compact asked for from
    the panel answers with the reason instead."""
    import types
    said, logged, outcomes = [], [], []
    session = types.SimpleNamespace(home=types.SimpleNamespace(log=lambda event, **kw: logged.append(event)),
                                    capture=types.SimpleNamespace(thread_id="t" * 36), said_no_room=set(),
                                    announce=lambda text, relay=None: said.append(text),
                                    policy=cc_lhc.resolve_policy([("test", {"lowerBoundTokens": 100})]))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session = session
    h._last_turn = lambda: 3
    a = types.SimpleNamespace(outcome=outcomes.append)
    e = cc_lhc.ViewHoldsNoTurn("a view of thread t within the target of 100 tokens holds no turn", 100, 80)
    for _ in range(3):
        assert h._no_rebuild(None, a, e, manual=False) == str(e)
    assert h._no_rebuild(None, a, e, manual=True) == str(e)
    assert said == [f"Smart Compact did not run: {e}"]
    assert logged == ["view_holds_no_turn"] * 4 and len(outcomes) == 4
    assert h._no_rebuild(None, a, cc_lhc.PruneUnchanged("nothing to prune"), manual=False) == "nothing to prune"
    assert logged[-1] == "prune_unchanged" and len(said) == 1
    # the header grows with the thread: the same target, a larger header, still said once
    e2 = cc_lhc.ViewHoldsNoTurn("a view of thread t within the target of 100 tokens holds no turn (its header "
                                "alone is 90)", 100, 90)
    h._no_rebuild(None, a, e2, manual=False)
    assert len(said) == 1 and h.no_room == ("t" * 36, 100, 3, str(e2))


def test_a_target_known_to_hold_no_turn_is_not_tried_again_at_each_seam(monkeypatch, tmp_path):
    """Once no turn fitted the view at a target, later seams answer at once, until the
    target changes: the in-process attempt typed /compact into Claude (clearing what the
    person had in its box) at every seam, to be refused each time."""
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    policy = cc_lhc.resolve_policy([("test", {"lowerBoundTokens": 100, "upperBoundTokens": 100_000})])
    tried = []
    session = types.SimpleNamespace(home=cc_lhc.StateHome(), policy=policy, capture=types.SimpleNamespace(
        thread_id="t" * 36), spec=types.SimpleNamespace(session_id="s"))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.host, h.continue_note = session, types.SimpleNamespace(stopping=None), None
    h.inproc = types.SimpleNamespace(usable=True, start=lambda relay, manual, prune: tried.append(1) or "tried")
    newest = [3]
    h._last_turn = lambda: newest[0]
    h.no_room = ("t" * 36, 100, 3, "no turn fits 100")
    assert h._begin(None) == "no turn fits 100" and tried == []
    assert h._begin(None, prune=50_000) == "tried"  # (Smart Prune's own target)
    newest[0] = 4  # (a new turn, which may be small enough to fit)
    assert h._begin(None) == "tried" and len(tried) == 2
    newest[0] = 3
    policy.values["lowerBoundTokens"] = 5_000  # (/bounds changed it)
    assert h._begin(None) == "tried" and len(tried) == 3
    policy.values["lowerBoundTokens"] = 100
    session.capture.thread_id = "u" * 36  # (a /clear: another thread)
    assert h._begin(None) == "tried" and len(tried) == 4
    # a header over the target on its own: no newer turn can fit, so none is tried for
    h.no_room, newest[0] = ("u" * 36, 100, None, "the header alone is over 100"), 9
    assert h._begin(None) == "the header alone is over 100" and len(tried) == 4
    e = cc_lhc.ViewHoldsNoTurn("its header alone is 250", 100, 250)
    session.announce, session.said_no_room = (lambda text, relay=None: None), set()
    h._no_rebuild(None, types.SimpleNamespace(outcome=lambda why: None), e, manual=False)
    assert h.no_room == ("u" * 36, 100, None, str(e))


@pytest.mark.parametrize("how", ["seam", "too-long", "thinking"])
def test_a_recovery_after_a_refused_request_does_not_wait_for_a_thread_another_process_writes(
        monkeypatch, tmp_path, how):
    """A seam met while another process writes the thread waits for a later one; a rebuild
    after the API refused a request (too long, replayed thinking refused) cannot: nothing
    goes on in that session until it is rebuilt, and it was dropped, said as under way."""
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    monkeypatch.setattr(cc_lhc, "thread_busy", lambda home, thread: True)
    monkeypatch.setattr(cc_lhc, "assess", lambda *a, **k: types.SimpleNamespace(go=False, reason="went on"))
    session = types.SimpleNamespace(home=cc_lhc.StateHome(), policy=cc_lhc.resolve_policy([]), hostdb=None,
                                    capture=types.SimpleNamespace(thread_id="t" * 36),
                                    spec=types.SimpleNamespace(session_id="s"))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.host, h.no_room = session, types.SimpleNamespace(stopping=None), None
    h.continue_note = "[runtime note] continue" if how == "too-long" else None
    h.inproc = types.SimpleNamespace(usable=True, start=lambda relay, manual, prune: "went on")
    assert h._begin(None, manual=how != "seam", urgent=how == "thinking") == (
        cc_lhc.LiveHandoff.THREAD_BUSY if how == "seam" else "went on")


def test_the_fallback_said_over_claudes_screen_names_the_first_problem_and_how_many_more(monkeypatch, tmp_path):
    """Said again over Claude's screen at startup, the fallback held every problem joined
    in one line (300 unknown fields covered the screen): the first, then how many more."""
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    for layer, said in (({"a": 1}, "a from p: unknown field)"),
                        ({"a": 1, "b": 2, "c": 3}, "a from p: unknown field; and 2 more: ctrl-] shows them)")):
        spec = types.SimpleNamespace(said_at_start=[])
        cc_lhc.announce_policy(cc_lhc.resolve_policy([("p", layer)]), cc_lhc.StateHome(), spec)
        assert spec.said_at_start == [f"{cc_lhc.MSG_CONFIG_FALLBACK} ({said}"]
    # the key that opens the panel is the one the person chose
    monkeypatch.setenv("CC_LHC_LEADER", "ctrl-g")
    spec = types.SimpleNamespace(said_at_start=[])
    cc_lhc.announce_policy(cc_lhc.resolve_policy([("p", {"a": 1, "b": 2})]), cc_lhc.StateHome(), spec)
    assert spec.said_at_start[0].endswith("; and 1 more: ctrl-g shows them)")


@pytest.mark.parametrize("why", [cc_lhc.LiveHandoff.DRAFT_WAITS, cc_lhc.UNSETTLED + " (t2 is still open)"])
def test_a_smart_prune_asked_for_at_a_passing_moment_says_to_ask_again(why):
    """A refused /smart-prune said "Smart Compact waits for it", and never ran: the panel's
    requests are not kept, which it now says, as /smart-compact's do."""
    import types
    session = types.SimpleNamespace(policy=cc_lhc.resolve_policy([]), home=None)
    panel = cc_lhc.ControlPanel(session, types.SimpleNamespace(size=lambda: (24, 80)),
                                types.SimpleNamespace(start=lambda relay, manual, prune=None: why))
    panel._nothing_yet = lambda: False
    panel.SETTLE_WAIT = 0
    said = panel.cmd_smart_prune(["1000"])
    assert said.startswith(f"Smart Prune did not hand over: {why}") and "run /smart-prune again" in said


def test_a_thread_holding_only_the_clear_that_began_it_has_nothing_to_compact(iso_env, tmp_path):
    """/clear, then /smart-compact at once: the thread held the /clear command's own records,
    and a rebuild of a session holding only `/clear` ran."""
    def write(t):
        t.user("<command-name>/clear</command-name>\n<command-message>clear</command-message>\n"
               "<command-args></command-args>")
        t.user("<local-command-stdout></local-command-stdout>")
    home, thread, sid, path = captured_thread(tmp_path, write)
    store = cc_lhc.ThreadStore(home, thread)
    assert store.db.execute("SELECT count(*) FROM messages").fetchone()[0] > 0
    assert {k for (k,) in store.db.execute("SELECT kind FROM turns")} == {cc_lhc.COMMAND_TURN}
    store.close()
    started = []
    panel = panel_on(home, thread, sid, path, lambda relay, manual, prune=None: started.append(1) or "")
    assert panel.cmd_smart_compact([]) == "Smart Compact did not start: nothing is captured in this session yet"
    assert started == []


def test_output_cut_to_the_terminals_height_says_so_and_the_cursor_shows_where_one_types(monkeypatch):
    p = panel(monkeypatch)
    p.relay.modes.dec[25] = False  # (Claude hid the terminal's cursor, drawing its own)
    p._show()
    p.output = ["\n".join(f"line {i}" for i in range(40))]
    p.relay.to_user.clear()
    p._render()
    frame = bytes(p.relay.to_user).decode()
    rows = 24
    assert "line 19\r\n" in frame and "line 20" not in frame  # (title, blank, 20 lines, the note: 23 rows)
    assert "\u2026 lines 1\u201320 of 40: \u2191 \u2193 PgUp PgDn scroll" in frame and rows == 24
    p.relay.to_user.clear()
    p.on_input(b"\x1b[6~")  # (a page down, then a line up: the rest shows)
    p.on_input(b"\x1b[A")
    frame = bytes(p.relay.to_user).decode().rsplit("\x1b[H\x1b[2J", 1)[1]
    assert "line 38\r\n" in frame and "line 19\r\n" in frame and "line 18\r\n" not in frame
    assert "lines 20\u201339 of 40" in frame
    p.on_input(b"\x1b[B" * 5)  # (down past the end: the last lines stay)
    assert "line 39\r\n" in bytes(p.relay.to_user).decode().rsplit("\x1b[H\x1b[2J", 1)[1]
    assert frame.endswith("\x1b[?25h")  # (shown at the input line)
    p.relay.to_user.clear()
    p._hide()
    assert b"\x1b[?25l" in bytes(p.relay.to_user)  # (hidden again, as Claude left it)


def test_the_running_operation_names_an_in_process_one_and_a_prune():
    from types import SimpleNamespace as NS
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.candidate, h.retry_at, h.pruning = None, None, None
    h.inproc = NS(pending=None, prune=None, replayed=None)
    assert h.running() == "none"
    h.inproc.pending = object()
    assert h.running() == "Smart Compact in process under way (Claude is taking the view in)"
    h.inproc.prune, h.inproc.replayed = 3000, 7
    assert h.running() == "Smart Prune in process: the view is in; Claude's next request settles it"
    h.inproc.pending, h.candidate, h.pruning = None, object(), None
    assert h.running() == "Smart Compact handoff under way (a replacement Claude is starting)"


def test_a_notice_said_while_the_panel_is_open_waits_for_it_to_close(monkeypatch):
    """cc-lhc's lines were written over the open panel (its input line too), and stood there
    until the next key redrew it. They wait, and are written once the panel closes."""
    import collections
    p = panel(monkeypatch)
    s = cc_lhc.ManagedSession.__new__(cc_lhc.ManagedSession)
    s._to_show, s.announced, s.on_screen = collections.deque(), [], collections.deque(maxlen=6)
    s.overlay_until = s.overlay_drawn_at = None
    p.session.show_notices = lambda relay: s.show_notices(relay)
    p._show()
    s._to_show.append("Smart Compact did not run: a reason")
    p.relay.to_user.clear()
    s.show_notices(p.relay)
    assert bytes(p.relay.to_user) == b"" and list(s._to_show) == ["Smart Compact did not run: a reason"]
    p._hide()
    assert b"Smart Compact did not run: a reason" in bytes(p.relay.to_user) and not s._to_show


def test_the_cursor_claude_hid_is_hidden_again_once_the_panels_frames_reached_the_terminal(monkeypatch):
    """The relay's record of the terminal's modes holds what was written: the panel's own
    frames show the cursor, so the record read at closing time said it was shown, and the
    cursor stayed on over Claude's screen. What Claude had is taken as the panel opens."""
    import os
    r, w = os.pipe()
    os.set_blocking(r, False)
    p = panel(monkeypatch)
    p.relay = cc_lhc.Relay(0, None, w)
    p.relay.to_user += b"\x1b[?25l"  # (Claude hides it, and that reaches the terminal)
    p.relay._to_user()
    p._show()
    p.relay._to_user()  # (the panel's frame reaches it too)
    os.read(r, 1 << 20)
    p.relay.to_user.clear()
    p._hide()
    out = bytes(p.relay.to_user)
    assert out.rfind(b"\x1b[?25l") > out.rfind(b"\x1b[?25h")
    os.close(r)
    os.close(w)


def test_a_notice_held_for_the_panel_is_said_at_the_end_when_the_panel_never_closed(monkeypatch):
    import collections
    said = []
    monkeypatch.setattr(cc_lhc, "say", lambda text: said.append(text))
    s = cc_lhc.ManagedSession.__new__(cc_lhc.ManagedSession)
    s._to_show, s.announced, s.on_screen = collections.deque(), [], collections.deque(maxlen=6)
    s.overlay_until = s.overlay_drawn_at = None
    s.notices, s.alarms, s.said_before, s.control_w = [], [], set(), 1
    s.home = type("H", (), {"log": staticmethod(lambda *a, **k: None)})()
    p = panel(monkeypatch)
    p._show()
    s.announce("in-process Smart Compact was refused (a reason)", p.relay)
    assert list(s._to_show)  # (held: the panel is open, and Claude then ends)
    s._last_words()
    assert said == ["in-process Smart Compact was refused (a reason)"]


def test_a_thread_of_commands_the_model_answered_is_conversation(iso_env, tmp_path):
    """A skill or custom command (/review) is a turn of kind command that the model answers:
    /smart-compact and /smart-prune refused such a thread as holding nothing yet."""
    from test_capture_parse import text

    def write(t):
        t.user("<command-name>/review</command-name>\n<command-message>review</command-message>")
        t.user("Review the change on this branch.", isMeta=True)
        t.assistant(text("reviewed: it looks fine"))
    home, thread, sid, path = captured_thread(tmp_path, write)
    started = []
    p = panel_on(home, thread, sid, path, lambda relay, manual, prune=None: started.append(prune) or "")
    assert p.cmd_smart_prune(["1000"]).startswith("Smart Prune started") and started == [1000]

def test_tab_completes_as_far_as_the_commands_it_could_be_agree(monkeypatch):
    p = panel(monkeypatch)
    p._show()
    for typed, completed in (("/sm", "/smart-"), ("/st", "/stat"), ("/s", "/s"), ("/b", "/bounds ")):
        p.line = ""
        p.on_input(typed.encode() + b"\t")
        assert p.line == completed, (typed, p.line)
