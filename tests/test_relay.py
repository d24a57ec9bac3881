"""The terminal relay and the interactive host, with real children on real PTYs.

The first half drives ``cc_lhc.Relay`` directly (its descriptors and size functions are
passed in); Relay.run installs signal handlers, so it runs in the main thread while a
helper thread plays the user. The second half runs the whole of cc-lhc in tmux with
tests/fake_claude.py as Claude, and kills wrappers to prove their children go with them.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import cc_lhc
from conftest import CC_LHC, FAKE_CLAUDE

ptyprocess = pytest.importorskip("ptyprocess")
pytestmark = [pytest.mark.skipif(os.name != "posix", reason="POSIX PTYs"),
              pytest.mark.timeout(60)]

Relay = cc_lhc.Relay


# -- helpers ------------------------------------------------------------------------------

def burst_bytes(n: int) -> bytes:
    """What fake_claude's {"burst": n} step writes."""
    data, i = bytearray(), 0
    while len(data) < n:
        data += b"burst line %08d ..........................................\n" % i
        i += 1
    return bytes(data[:n])


def spawn(script, dims=(24, 80), echo=True, argv=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_CLAUDE_")}
    env["FAKE_CLAUDE_SCRIPT"] = json.dumps(script)
    return ptyprocess.PtyProcess.spawn(argv or [sys.executable, str(FAKE_CLAUDE)], env=env,
                                       dimensions=dims, echo=echo)


class Sink:
    """The user's screen: a pipe the relay writes to, read by a thread."""

    def __init__(self, nonblocking=False, hold=None, piece=1 << 16):
        self.r, self.w = os.pipe()
        if nonblocking:
            os.set_blocking(self.w, False)
        self.data = bytearray()
        self.cond = threading.Condition()
        self.hold = hold      # an Event the reader waits for before reading anything
        self.piece = piece
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        if self.hold is not None:
            self.hold.wait(20)
        while True:
            chunk = os.read(self.r, self.piece)
            if not chunk:
                break
            with self.cond:
                self.data += chunk
                self.cond.notify_all()
        os.close(self.r)

    def wait_for(self, needle: bytes, timeout=10) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: needle in self.data, timeout)

    def close(self) -> bytes:
        os.close(self.w)
        self.thread.join(20)
        return bytes(self.data)


class TrackedBuffer(bytearray):
    """A relay buffer that remembers how large it ever got."""

    def __init__(self):
        super().__init__()
        self.peak = 0
        self.reached_high_water = threading.Event()

    def __iadd__(self, other):
        bytearray.__iadd__(self, other)
        self.peak = max(self.peak, len(self))
        if len(self) >= Relay.HIGH_WATER:
            self.reached_high_water.set()
        return self


def child_status(child) -> int:
    child.wait()
    return 128 + child.signalstatus if child.signalstatus is not None else child.exitstatus


def gone(pid: int) -> bool:
    """The process is dead (absent, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def wait_until(predicate, timeout=10, what="condition"):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def wait_for_exit(child, timeout) -> bool:
    deadline = time.monotonic() + timeout
    while child.isalive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def wait_launch(fake, count=1, timeout=10) -> dict:
    wait_until(lambda: len(fake.launches()) >= count, timeout, "Claude to start")
    return fake.launches()[count - 1]


# -- Relay with real children -------------------------------------------------------------

def test_burst_arrives_complete_through_a_slow_reader_with_bounded_memory():
    size = 5_000_000
    child = spawn([{"burst": size}])
    tracked = TrackedBuffer()
    # The screen reads nothing until the relay's buffer is full, then reads in small pieces.
    sink = Sink(nonblocking=True, hold=tracked.reached_high_water, piece=4096)
    relay = Relay(child.fd, None, sink.w)
    relay.to_user = tracked
    try:
        relay.run()
    finally:
        child.kill(signal.SIGKILL) if child.isalive() else None
    got = sink.close()
    assert child_status(child) == 0
    assert tracked.reached_high_water.is_set(), "the reader was never slower than the child"
    assert tracked.peak <= Relay.HIGH_WATER + Relay.CHUNK, tracked.peak
    # The child's terminal turns \n into \r\n (ONLCR); everything else is byte for byte.
    assert got.replace(b"\r\n", b"\n") == burst_bytes(size)


def test_input_reaches_the_child_in_order_with_partial_writes():
    lines = [b"line %05d %s" % (i, b"x" * (i % 90)) for i in range(6000)]  # ~330 KB
    payload = b"".join(line + b"\n" for line in lines) + b"\x04"  # ^D: end of input
    child = spawn([{"echo": True}, {"exit": 3}], echo=False)
    in_r, in_w = os.pipe()
    sink = Sink()

    def type_everything():
        with os.fdopen(in_w, "wb") as f:
            f.write(payload)

    typist = threading.Thread(target=type_everything, daemon=True)
    typist.start()
    try:
        Relay(child.fd, in_r, sink.w).run()
    finally:
        child.kill(signal.SIGKILL) if child.isalive() else None
        os.close(in_r)
    got = sink.close().replace(b"\r\n", b"\n")
    assert child_status(child) == 3
    assert got == b"".join(b"ECHO " + line + b"\n" for line in lines)


def test_child_exit_ends_the_relay_while_input_stays_open():
    child = spawn([{"print": "goodbye screen"}, {"exit": 7}])
    in_r, in_w = os.pipe()  # the user never types and never closes the terminal
    sink = Sink()
    watched = (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)
    before = [signal.getsignal(s) for s in watched]
    try:
        Relay(child.fd, in_r, sink.w).run()  # returns on EIO from the master
    finally:
        child.kill(signal.SIGKILL) if child.isalive() else None
        os.close(in_r)
        os.close(in_w)
    assert b"goodbye screen" in sink.close()
    assert child_status(child) == 7
    assert [signal.getsignal(s) for s in watched] == before, "signal handlers not restored"


def test_a_terminal_that_goes_away_without_a_sighup_ends_the_session_as_one_would():
    """A shell that ignores SIGHUP (trap : HUP, a disowned job) keeps it from cc-lhc when its
    terminal closes; reads of the terminal then fail. cc-lhc took that for input that had
    ended (as a pipe's does) and ran on with its Claude for good, holding the thread. The
    end of a terminal's input is its hangup: on_signal hears SIGHUP; a pipe's end is not."""
    import pty
    child = spawn([{"print": "READY"}, {"sleep": None}])
    master, slave = pty.openpty()
    sink = Sink()
    heard = []

    def on_signal(signum, relay):  # (SIGCHLD comes this way too)
        heard.append(signum)
        if signum == signal.SIGHUP:
            child.kill(signal.SIGHUP)

    def hang_up():
        if sink.wait_for(b"READY", 20):
            os.close(master)  # the terminal window is closed
        else:
            child.kill(signal.SIGKILL)

    closer = threading.Thread(target=hang_up, daemon=True)
    closer.start()
    try:
        Relay(child.fd, slave, sink.w, on_signal=on_signal).run()
    finally:
        child.kill(signal.SIGKILL) if child.isalive() else None
        os.close(slave)
    sink.close()
    assert heard.count(signal.SIGHUP) == 1
    child2 = spawn([{"print": "READY"}, {"exit": 0}])
    in_r, in_w = os.pipe()
    os.close(in_w)  # `cc-lhc < /dev/null`-like: input over at once, no hangup
    heard.clear()
    sink = Sink()
    try:
        Relay(child2.fd, in_r, sink.w, on_signal=on_signal).run()
    finally:
        os.close(in_r)
    assert b"READY" in sink.close() and signal.SIGHUP not in heard


def test_regular_files_as_terminal_input_and_output(tmp_path):
    # `cc-lhc < file > log`: epoll refuses regular files; the relay must still work.
    (tmp_path / "in").write_bytes(b"from a file\n\x04")
    child = spawn([{"echo": True}, {"exit": 0}], echo=False)
    with open(tmp_path / "in", "rb") as fin, open(tmp_path / "out", "wb") as fout:
        try:
            Relay(child.fd, fin.fileno(), fout.fileno()).run()
        finally:
            child.kill(signal.SIGKILL) if child.isalive() else None
    assert child_status(child) == 0
    assert b"ECHO from a file" in (tmp_path / "out").read_bytes()


def test_sigwinch_pushes_the_new_size_and_sigterm_reaches_on_signal():
    child = spawn([{"winch": True}, {"print": "READY"}, {"sleep": None}], dims=(24, 80))
    sink = Sink()
    size = [(24, 80)]
    pushed, signals = [], []

    def set_child_size(rows, cols):
        pushed.append((rows, cols))
        child.setwinsize(rows, cols)

    def on_signal(signum, relay):
        signals.append(signum)
        if signum == signal.SIGTERM:
            child.kill(signal.SIGTERM)

    problems = []

    def user():
        try:
            # READY only arrives through the relay, so its handlers are installed by now.
            if not sink.wait_for(b"READY", 20):
                problems.append("the child's READY never came through")
                return
            size[0] = (40, 120)
            os.kill(os.getpid(), signal.SIGWINCH)
            if not sink.wait_for(b"WINCH 120x40", 20):
                problems.append("the child never saw the new size")
                return
            os.kill(os.getpid(), signal.SIGTERM)
            if not wait_for_exit(child, 20):
                problems.append("SIGTERM did not reach on_signal")
        finally:
            if child.isalive():  # never leave the relay (in the main thread) hanging
                child.kill(signal.SIGKILL)

    helper = threading.Thread(target=user, daemon=True)
    helper.start()
    try:
        Relay(child.fd, None, sink.w, get_size=lambda: size[0], set_child_size=set_child_size,
              on_signal=on_signal).run()
    finally:
        helper.join(30)  # before touching the child here: only one thread may reap it
        child.kill(signal.SIGKILL) if child.isalive() else None
    got = sink.close()
    assert problems == [], got
    assert pushed == [(40, 120)]
    assert b"WINCH 120x40" in got
    # SIGCHLD also reaches on_signal when the child ends; the relay itself never exits on it.
    assert [s for s in signals if s != signal.SIGCHLD] == [signal.SIGTERM]
    assert child_status(child) == 128 + signal.SIGTERM


# -- the interactive host in tmux ---------------------------------------------------------

def lhc_cmd():
    return [sys.executable, str(CC_LHC)]


def test_interactive_size_resize_input_exit_status_and_terminal_restored(tmux, fake_claude):
    fake_claude.script([{"size": True}, {"winch": True}, {"print": "READY"}, {"echo": True},
                        {"exit": 42}])
    t = tmux(lhc_cmd(), cols=90, rows=25, env=fake_claude.env, cwd=fake_claude.cwd)
    screen = t.wait_for("READY")
    assert "SIZE 90x25" in screen
    t.resize(70, 20)
    t.wait_for("WINCH 70x20")
    t.resize(120, 40)
    t.wait_for("WINCH 120x40")
    t.send_text("typed line")
    t.send_keys("Enter")
    t.wait_for("ECHO typed line")
    t.send_keys("C-d")
    assert t.wait_exit() == 42
    assert t.stty_before == t.stty_after, t.stty_after_all
    launch = fake_claude.launches()[0]
    assert launch["tty"] == {"stdin": True, "stdout": True, "stderr": True}
    assert launch["env"]["DISABLE_AUTO_COMPACT"] == "1"
    assert launch["argv"][0] == "--session-id"


def test_ctrl_c_goes_to_claude_not_the_wrapper(tmux, fake_claude):
    fake_claude.script([{"print": "READY"}, {"sleep": None}])
    t = tmux(lhc_cmd(), env=fake_claude.env, cwd=fake_claude.cwd)
    t.wait_for("READY")
    t.send_keys("C-c")  # raw mode: a byte for Claude's terminal, which signals Claude
    assert t.wait_exit() == 128 + signal.SIGINT
    assert t.stty_before == t.stty_after, t.stty_after_all


def test_terminal_restored_when_claude_is_killed(tmux, fake_claude):
    fake_claude.script([{"print": "READY"}, {"sleep": None}])
    t = tmux(lhc_cmd(), env=fake_claude.env, cwd=fake_claude.cwd)
    t.wait_for("READY")
    os.kill(wait_launch(fake_claude)["pid"], signal.SIGKILL)
    assert t.wait_exit() == 128 + signal.SIGKILL
    assert t.stty_before == t.stty_after, t.stty_after_all


def test_sigterm_to_the_wrapper_ends_claude_and_restores_the_terminal(tmux, fake_claude):
    fake_claude.script([{"print": "READY"}, {"sleep": None}])
    t = tmux(lhc_cmd(), env=fake_claude.env, cwd=fake_claude.cwd)
    t.wait_for("READY")
    launch = wait_launch(fake_claude)
    os.kill(launch["ppid"], signal.SIGTERM)  # Claude's parent is cc-lhc itself
    assert t.wait_exit() == 128 + signal.SIGTERM
    assert t.stty_before == t.stty_after, t.stty_after_all
    wait_until(lambda: gone(launch["pid"]), 5, "Claude to exit")


# -- children die with the wrapper --------------------------------------------------------

STUBBORN = """\
import os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)   # survives its terminal going away
signal.signal(signal.SIGINT, signal.SIG_IGN)
with open(os.environ["STUBBORN_PID_FILE"], "w") as f:
    f.write(str(os.getpid()))
print("READY", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and PR_SET_PDEATHSIG")
@pytest.mark.parametrize("mode", [["-p", "hi"], []])
def test_claude_dies_when_the_wrapper_is_killed(fake_claude, tmp_path, mode):
    stubborn = tmp_path / "stubborn-claude"
    stubborn.write_text(f"#!{sys.executable}\n{STUBBORN}")
    stubborn.chmod(0o755)
    pid_file = tmp_path / "pid"
    env = {**fake_claude.env, "CC_LHC_CLAUDE_BIN": str(stubborn), "STUBBORN_PID_FILE": str(pid_file)}
    wrapper = subprocess.Popen([*lhc_cmd(), *mode], env=env, cwd=fake_claude.cwd,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    child = None
    try:
        assert b"READY" in wrapper.stdout.readline()
        child = int(pid_file.read_text())
        assert not gone(child)
        wrapper.kill()  # SIGKILL: no cleanup code in the wrapper runs
        wrapper.wait(10)
        wait_until(lambda: gone(child), 5, f"Claude (pid {child}) to die with its wrapper")
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        if child and not gone(child):
            os.kill(child, signal.SIGKILL)
        wrapper.stdout.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_one_shot_burst_through_a_slow_pipe_reader(fake_claude):
    size = 4_000_000
    fake_claude.script([{"burst": size}])
    wrapper = subprocess.Popen([*lhc_cmd(), "-p", "hi"], env=fake_claude.env, cwd=fake_claude.cwd,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE)
    digest, total = hashlib.sha256(), 0
    try:
        while chunk := wrapper.stdout.read(4096):  # small reads: the writer has to wait
            digest.update(chunk)
            total += len(chunk)
        assert wrapper.wait(20) == 0
    finally:
        if wrapper.poll() is None:
            wrapper.kill()
            wrapper.wait()
        wrapper.stdout.close()
        wrapper.stderr.close()
    assert total == size
    assert digest.hexdigest() == hashlib.sha256(burst_bytes(size)).hexdigest()


def test_the_draft_watch_tells_a_message_being_written_from_one_sent():
    d = cc_lhc.DraftWatch()
    d.feed(b"\x1b[I\x1b[D\x1bOC\x1b[<35;1;1M", 1.0)  # focus, left and right, a mouse move: no text
    assert not d.pending and d.sent_at is None
    d.feed(b"line one\\", 2.0)
    d.feed(b"\r", 2.1)  # backslash-Enter: a new line in the box, nothing sent
    assert d.pending and d.sent_at is None
    d.feed(b"line two", 2.2)
    d.feed(b"\r", 3.0)
    assert not d.pending and d.sent_at == 3.0
    d.feed(b"\x1b[200~pasted\rlines\x1b[201~", 4.0)  # a paste's newlines send nothing
    assert d.pending and d.sent_at == 3.0
    d.feed(b"\x03", 4.5)  # ctrl-c empties the box
    assert not d.pending
    d.feed(b"/context\r", 5.0)  # a command is no prompt: no turn for the transcript to show
    assert not d.pending and d.sent_at == 3.0
    d.feed(b"\r", 6.0)  # Enter on an empty box sends nothing
    assert d.sent_at == 3.0
    d.feed(b"typo\x7f\x7f\x7f\x7f", 7.0)  # typed, then erased key by key
    assert not d.pending
    d.feed("h\u00e9llo".encode(), 7.5)
    assert d.chars == 5
    d.feed(b"\x15", 7.6)  # ctrl-u erases a one-line draft
    assert not d.pending
    d.feed(b"one\\\rtwo\x15", 8.0)  # ...but only the line the cursor is on of a longer one
    assert d.pending and d.lines == 1
    assert d.feed(b"\r\x1b[I", 9.0) and d.sent_at == 9.0  # sent, whatever follows in the read


def test_backspace_over_a_new_line_leaves_a_one_line_draft_that_ctrl_w_can_empty():
    """The box as typed, new lines included: backspace takes the new line back (not a
    character of the line before it), so what is left is one line again, and the keys
    that only work on one line (ctrl-w, ctrl-u) empty it."""
    d = cc_lhc.DraftWatch()
    d.feed(b"ab\n", 1.0)  # ctrl-j: a new line
    assert (d.chars, d.lines) == (2, 1)
    d.feed(b"\x7f", 1.1)
    assert (d.chars, d.lines) == (2, 0)
    d.feed(b"\x17", 1.2)  # ctrl-w: the word "ab"
    assert not d.pending
    d.feed("x\u00e9\x1b\r".encode(), 2.0)  # alt-Enter, then two backspaces: the new line, then the é
    d.feed(b"\x7f\x7f", 2.1)
    assert (d.chars, d.lines) == (1, 0)
    d.feed(b"\x15", 2.2)
    assert not d.pending


def test_a_draft_whose_cursor_left_its_end_is_held_until_it_is_sent_or_emptied():
    """Backspace at the start of the box erases nothing: after Left, Home, ctrl-a, ctrl-b or
    alt-b the keys no longer tell what the box holds, so no count of them may say it is
    empty. On an empty box, moving the cursor holds nothing back."""
    for move in (b"\x1b[D", b"\x1bOD", b"\x1b[1;5D", b"\x1b[H", b"\x1b[1~", b"\x01", b"\x02", b"\x1bb"):
        d = cc_lhc.DraftWatch()
        d.feed(b"abc" + move * 3 + b"\x7f\x7f\x7f", 1.0)
        assert d.pending, move
        d.feed(b"\x03", 2.0)  # ctrl-c empties the box
        assert not d.pending, move
        d.feed(move + b"\x1b[C", 3.0)
        assert not d.pending, move
        d.feed(b"x" + move + b"\r", 4.0)  # sent with the cursor anywhere
        assert not d.pending and d.sent_at == 4.0, move


def test_a_dialog_claude_opens_over_the_box_holds_smart_compact_back_until_it_closes():
    # keys typed into the /model picker or the ctrl-o transcript view go there, not to the box
    d = cc_lhc.DraftWatch()
    for opened, closed in ((b"/model\r", b"\x1b[B\r"), (b"/model\r", b"\x1b"), (b"/mod", None),
                           (b"\x0f", b"\x0f"), (b"/config\r", b"\x03")):
        d.feed(opened, 1.0)
        if closed is None:  # the command's name arrives in two reads
            d.feed(b"el\r", 1.1)
            closed = b"\r"
        assert d.dialog and d.pending, opened
        assert d.feed(closed, 2.0) is False and not d.dialog and not d.pending, closed
    d.feed(b"/model opus\r", 3.0)  # with an argument: no picker opens
    d.feed(b"/model\x7f\x7f\x7f\x7f\x7fclear\r", 3.5)  # corrected to /clear before Enter
    assert not d.pending and d.sent_at is None


def test_smart_compact_waits_for_a_draft_and_for_a_prompt_just_sent(monkeypatch, tmp_path):
    import time
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    session = types.SimpleNamespace(home=cc_lhc.StateHome(), detached="", pending=None,
                                    spec=types.SimpleNamespace(mod=None, session_id="s"))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.candidate, h.submit_at, h.continue_note = session, None, None, None
    h.inproc = types.SimpleNamespace(pending=None, usable=False)
    h.draft, recorded = cc_lhc.DraftWatch(), [False]
    h._sent_prompt_recorded = lambda: recorded[0]
    begun = []
    h._begin = lambda relay, manual, prune, urgent=False: begun.append(manual)
    h.draft.feed(b"half a thought", 0.0)
    assert h.start(None) == cc_lhc.LiveHandoff.DRAFT_WAITS and h.start(None, manual=True) and not begun
    h.draft.feed(b"\r", time.monotonic())
    assert "just sent" in h.start(None) and not begun  # its turn is not recorded yet
    recorded[0] = True  # now it is (and answered: a settled seam again)
    assert h.start(None) == "" and begun == [False]
    recorded[0], begun[:] = False, []
    h.draft.sent_at -= cc_lhc.LiveHandoff.SENT_SETTLE_SECONDS  # or no turn came in time
    assert h.start(None) == "" and begun == [False]
    h.continue_note = "[runtime note] ..."  # the too-long recovery does not wait
    h.draft.feed(b"more", 0.0)
    assert h.start(None, manual=True) == "" and begun == [False, True]
    h.continue_note = None  # nor the rebuild after the API refused replayed thinking
    assert h.start(None, manual=True, urgent=True) == "" and begun == [False, True, True]
    assert h.start(None) == cc_lhc.LiveHandoff.DRAFT_WAITS and len(begun) == 3
    logged = (tmp_path / "wrapper.log").read_text()
    assert logged.count('"handoff_waits_for_person"') == 4
    # a runtime note about carried work is not typed into the draft either
    told = []
    h.submit_at, h.last_input = None, 0.0
    h.carry = types.SimpleNamespace(next_note=lambda settled: told.append(1) or "[runtime note] x")
    relay = types.SimpleNamespace(to_child=bytearray())
    h._tell_carried(relay)
    assert not told and relay.to_child == b""
    h.draft.clear()
    h._last_turn = lambda: 9
    h._tell_carried(relay)
    assert told and relay.to_child == b"[runtime note] x"


def test_the_persons_own_compact_holds_the_seam_until_claude_takes_it(monkeypatch, tmp_path):
    """A /compact the person sent while Claude was answering waits in Claude's queue until
    the turn ends. cc-lhc typed its own /compact at that seam too: the mod's hook served
    cc-lhc's view for the person's command (their words lost), and cc-lhc's then ran as a
    second command, "Not compacted". The seam is left to the person's /compact until the
    hook asks for it or a turn newer than the send is recorded, for at most
    PERSON_COMPACT_SECONDS."""
    import time
    import types
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    d = cc_lhc.DraftWatch()
    for keys, taken in ((b"/compact keep the auth notes\r", True), (b"/compact\r", True),
                        (b"/compac\r", True), (b"/comp\t\r", True),  # (Claude's menu finishes it)
                        (b"/comp\tkeep the auth notes\r", True), (b"/comp\t keep\r", True),
                        (b"/cle\t\r", False), (b"/co\tx\r", False),
                        (b"/co\r", False), (b"/comp x\r", False),
                        (b"/compactify\r", False), (b"/clear\r", False), (b"compact\r", False),
                        (b"/compact\x7f\x7f\x7f\x7f\x7f\x7f\x7fclear\r", False),
                        (b"/compact a\x1b\rb\r", False), (b"\x1b[A\r", False)):
        d.compact_sent_at = None
        d.feed(keys, 5.0)
        assert (d.compact_sent_at == 5.0) is taken, keys
    session = types.SimpleNamespace(home=cc_lhc.StateHome(), detached="", pending=None,
                                    spec=types.SimpleNamespace(mod=None, session_id="s"))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.candidate, h.submit_at, h.continue_note, h.held = session, None, None, None, None
    h.retry_at = h.repaint_at = h.reshow_at = None
    h.inproc = types.SimpleNamespace(pending=None, usable=False, on_tick=lambda relay: None)
    h.draft, h.last_input, h.sent_mark = cc_lhc.DraftWatch(), 0.0, (0, 0.0)
    command = [None]  # the newest command turn's first record's timestamp
    h._newest = lambda sql: command[0] if "command" in sql else 0
    h._last_prompt = lambda: 0
    begun = []
    h._begin = lambda relay, manual, prune, urgent=False: begun.append(manual)
    h._tell_carried = lambda relay: None
    relay = types.SimpleNamespace(on_input=None, drop_input=False, in_drop_tail=lambda data: False,
                                  to_user=bytearray(), hold_output=False, child_alt_screen=False)
    session.overlay_done = session.overlay_cleared = lambda *a: False
    h.listen(relay)
    command[0] = cc_lhc.utc_now_iso()  # (a /context run before)
    time.sleep(0.1)
    relay.on_input(b"/compact keep the auth notes\r")  # (Claude is answering: it queues it)
    clock[0] += 20
    assert h.start(relay) == h.PERSON_COMPACT and not begun and h.held is False
    clock[0] += h.QUIET_SECONDS
    h.on_tick(relay)
    assert not begun  # not asked again while it is on its way
    command[0] = cc_lhc.utc_now_iso()  # Claude ran it: its records are a command turn of their own
    clock[0] += 1
    h.on_tick(relay)
    assert begun == [False] and h.draft.compact_sent_at is None  # (that seam is asked again)
    assert h.start(relay) == "" and begun == [False, False]
    # one that never comes (eaten by a dialog, say) holds the seams back only so long
    time.sleep(0.1)  # (a command turn written before the send is not it)
    relay.on_input(b"/compact\r")
    assert h.start(relay) == h.PERSON_COMPACT
    clock[0] += h.PERSON_COMPACT_SECONDS - 1
    assert h.start(relay) == h.PERSON_COMPACT
    clock[0] += 1
    assert h.start(relay) == "" and len(begun) == 3
    assert (tmp_path / "wrapper.log").read_text().count('"person_compact_not_seen"') == 1
    # a prompt sent after it is no sign it ran: Claude queues the prompt behind it
    relay.on_input(b"/compact\r")
    assert h.start(relay) == h.PERSON_COMPACT
    clock[0] += 5
    relay.on_input(b"what now\r")
    h._sent_prompt_recorded = lambda: True
    assert h.start(relay) == h.PERSON_COMPACT and len(begun) == 3
    h.person_compact_done()
    # the mod's hook asking for the person's view is their /compact come
    relay.on_input(b"/compact\r")
    assert h.start(relay) == h.PERSON_COMPACT
    h.person_compact_done()
    assert h.start(relay) == "" and len(begun) == 4
    # keys dropped during a compaction never reached Claude: no /compact of theirs is coming
    relay.drop_input = True
    relay.on_input(b"/compact\r")
    assert h.draft.compact_sent_at is None


def test_the_draft_watch_reads_the_keyboard_encodings_claude_turns_on_and_cut_reads():
    d = cc_lhc.DraftWatch()
    d.feed(b"one\x1b\r", 0.0)  # alt- or shift-Enter as ESC CR: a new line
    d.feed(b"two\n", 0.1)      # ctrl-j: a new line too
    assert d.pending and d.lines == 2 and d.sent_at is None
    d.feed(b"\x1b[99;5u", 0.2)  # ctrl-c in the kitty encoding empties the box
    assert not d.pending
    d.feed(b"abc\x1b[117;5u", 0.3)  # ctrl-u (kitty) on a one-line draft
    assert not d.pending
    d.feed(b"x\x1b[13;2u", 0.4)  # shift-Enter (kitty): a new line, nothing sent
    assert d.pending and d.sent_at is None
    assert d.feed(b"y\x1b[13u", 0.5) and d.sent_at == 0.5 and not d.pending  # Enter (kitty) sends
    d.feed(b"z\x1b[27;5;99~", 0.6)  # ctrl-c in xterm's modifyOtherKeys encoding
    assert not d.pending
    # a paste's end cut by the reads is still its end: the Enter after it sends
    d.feed(b"\x1b[200~abc\ndef\x1b[20", 1.0)
    d.feed(b"1~", 1.1)
    assert d.feed(b"\r", 1.2) and not d.pending
    d.feed(b"\x1b[200~never ended", 2.0)
    d.feed(b"\x03", 2.1)  # ctrl-c ends a paste that never said so, with the box
    assert d.feed(b"q\r", 2.2)
    d.feed(b"typed\x1b", 3.0)  # an ESC that ends a read: the next read says what it was
    d.feed(b"[A", 3.1)  # an arrow
    assert d.chars == 5


def test_the_draft_watch_takes_a_recalled_prompt_for_a_draft_until_it_is_undone_or_sent():
    """Up brings back an earlier prompt (one of several lines, maybe, that ctrl-u would not
    clear): the box holds a draft the keys never showed."""
    d = cc_lhc.DraftWatch()
    for up, down in ((b"\x1b[A", b"\x1b[B"), (b"\x1bOA", b"\x1bOB"), (b"\x1b[1;2A", b"\x1b[1;2B")):
        d.feed(up, 1.0)
        assert d.pending
        d.feed(up + down, 1.1)
        assert d.pending  # one Up is still not undone
        d.feed(down, 1.2)
        assert not d.pending  # back where it began: the empty box
    d.feed(b"\x10", 1.3)  # ctrl-p is Claude's Up (and ctrl-n its Down), also in the kitty form
    assert d.pending
    d.feed(b"\x1b[110;5u", 1.4)
    assert not d.pending
    d.feed(b"\x1b[B\x1b[B", 1.5)  # Down on the empty box brings nothing back
    assert not d.pending
    d.feed(b"\x1b[A\x15", 2.0)  # ctrl-u clears one line of what came back, maybe not all
    assert d.pending
    assert d.feed(b"\r", 2.1) and d.sent_at == 2.1 and not d.pending  # Enter sent what came back
    d.feed(b"\x1b[A\x03", 3.0)  # ctrl-c empties the box
    assert not d.pending and d.recalled == 0
    d.feed(b"\x12", 4.0)  # ctrl-r: a history search fills the box out of sight
    assert d.pending
    d.feed(b"\x03\x19", 5.0)  # ctrl-y: the last text cut comes back
    assert d.pending
    assert d.feed(b"\r", 5.1) and not d.pending
    d.feed(b"draft\x1b[A\x1b[B", 6.0)  # up and down inside a draft leave it as it was
    assert d.pending and d.chars == 5 and d.recalled == 0
    d.clear()
    assert not d.pending


def test_the_draft_watch_follows_word_erasing_and_esc_esc():
    """ctrl-w and alt-backspace erase a word of the box, and Esc twice empties it, in
    Claude as in the draft watch: a box emptied so does not hold Smart Compact back."""
    for erase in (b"\x17", b"\x1b\x7f"):
        d = cc_lhc.DraftWatch()
        d.feed(b"draft words", 1.0)
        d.feed(erase, 1.1)
        assert d.pending and d.chars == len("draft ")
        d.feed(erase, 1.2)
        assert not d.pending, erase
        d.feed("caf\u00e9 au lait  ".encode(), 1.3)
        d.feed(erase, 1.4)
        assert d.chars == len("caf\u00e9 au ")
    d = cc_lhc.DraftWatch()
    d.feed(b"half a thought", 2.0)
    d.feed(b"\x1b", 2.1)
    assert d.pending  # one Esc leaves the box as it is
    d.feed(b"\x1b", 2.2)
    assert not d.pending
    d.feed(b"again", 3.0)
    d.feed(b"\x1b", 3.1)
    d.feed(b"x", 3.2)  # Esc then a key: no pair
    assert d.pending
    d.feed(b"\x03/todos\r", 4.0)  # not a dialog in the Claude Code this is tested with
    assert not d.pending


def test_what_a_terminal_reports_is_not_counted_as_input_typed_during_a_swap():
    """Keys typed while a swap is under way are dropped and the person is asked to resend;
    a focus report (switching windows) or a mouse report is no typing and asks for nothing."""
    assert cc_lhc.typed_bytes(b"\x1b[O\x1b[I") == 0
    assert cc_lhc.typed_bytes(b"\x1b[<35;10;5M\x1b[<35;11;5M") == 0
    assert cc_lhc.typed_bytes(b"\x1b]11;rgb:0000/0000/0000\x1b\\\x1b[?1;2c") == 0
    assert cc_lhc.typed_bytes(b"hi\x1b[O") == 2
    assert cc_lhc.typed_bytes(b"x\x1b[<35;1") == 1  # (the rest of a report a read cut)
    # Keys that write nothing are nothing to type again: Esc (closing the panel as the
    # swap begins asked the person to resend), arrows, Enter, ctrl-c
    assert cc_lhc.typed_bytes(b"\x1b") == 0 and cc_lhc.typed_bytes(b"\x1b[A\x1b[B") == 0
    assert cc_lhc.typed_bytes(b"\r\x03\x7f") == 0
    assert cc_lhc.typed_bytes("fix it, café\r".encode()) == len("fix it, café".encode())


def _screen_rows(data: bytes, rows: int, cols: int) -> list:
    """The rows of a screen after ``data``, for the few sequences overlay_lines writes."""
    import re
    screen = [[" "] * cols for _ in range(rows)]
    r = c = saved = 0
    for m in re.finditer(rb"\x1b7|\x1b8|\x1b\[(\d+);(\d+)H|\x1b\[2K|\x1b\[\d*m|(.)", data, re.S):
        tok = m.group(0)
        if tok == b"\x1b7":
            saved = (r, c)
        elif tok == b"\x1b8":
            r, c = saved
        elif m.group(1):
            r, c = int(m.group(1)) - 1, int(m.group(2)) - 1
        elif tok == b"\x1b[2K":
            screen[r] = [" "] * cols
        elif m.group(3):
            if c < cols:
                screen[r][c] = m.group(3).decode("latin-1")
            c += 1
    return ["".join(row).rstrip() for row in screen]


def test_cc_lhcs_lines_over_claudes_screen_stack_wrap_and_leave_the_cursor():
    """Each line cc-lhc writes over Claude's screen is whole (wrapped, not cut), a second one
    a moment later does not write over the first, and a terminal that reports no size gets
    a usable default, not one cell on row 0."""
    import types
    out = cc_lhc.overlay_lines(["first notice", "x" * 100], (10, 40))
    assert out.startswith(b"\x1b7") and out.endswith(b"\x1b8")  # (the cursor put back)
    rows = _screen_rows(out, 10, 40)
    assert rows[6] == "cc-lhc: first notice" and "".join(rows[7:]).count("x") == 100
    assert b"\x1b[24;1H" in cc_lhc.overlay_lines(["no size"], (0, 0))
    # a long line is cut between words, not in one (a task id split over two rows)
    said = "carried across the swap: shell b332equbj (pid 1217, 1318), monitor bq8x2k (relaunched)"
    rows = [r for r in _screen_rows(cc_lhc.overlay_lines([said], (10, 40)), 10, 40) if r]
    assert " ".join(rows) == "cc-lhc: " + said and all(len(r) <= 39 for r in rows)
    rows = [r for r in _screen_rows(cc_lhc.overlay_lines(["a" * 31 + "  next word here"], (10, 40)), 10, 40) if r]
    assert rows == ["cc-lhc: " + "a" * 31, "next word here"]  # (no row starts with the space between)
    session = cc_lhc.ManagedSession.__new__(cc_lhc.ManagedSession)
    session._to_show, session.announced = __import__("collections").deque(), []
    session.on_screen = __import__("collections").deque(maxlen=6)
    relay = types.SimpleNamespace(to_user=bytearray(), get_size=lambda: (10, 60), hold_output=False)
    for text in ("input typed during compaction was not delivered", "Smart Compact did not complete"):
        session._to_show.append(text)
        session.show_notices(relay)
    rows = _screen_rows(bytes(relay.to_user), 10, 60)
    assert rows[-2:] == ["cc-lhc: input typed during compaction was not delivered",
                         "cc-lhc: Smart Compact did not complete"]
    # a line a swap writes in its own first frame stacks with one said a moment later (what
    # the swap carried), which wrote over it before
    session.on_screen.clear()
    frame = session.shown_in_frame("input typed during compaction was not delivered", (10, 60))
    relay.to_user[:] = frame
    session._to_show.append("carried across the swap: shell b1")
    session.show_notices(relay)
    rows = _screen_rows(bytes(relay.to_user), 10, 60)
    assert rows[-2:] == ["cc-lhc: input typed during compaction was not delivered",
                         "cc-lhc: carried across the swap: shell b1"]


@pytest.mark.parametrize("newest, stamp, recorded", [
    (4, "2026-12-07T10:00:00.250Z", False),        # no prompt newer than the one at the send
    (5, "2026-12-07T09:59:40.000Z", False),        # newer, but sent before: captured late (cc-lhc stopped)
    (5, "2026-12-07T10:00:00.250Z", True),         # the prompt just sent
    (5, "2026-12-07T12:00:00.250+02:00", True),    # the same moment written with an offset
    (5, "2026-12-07T11:59:40.000+02:00", False),
    (5, "not a time", True),                       # (no time to tell by: newer is enough)
])
def test_a_prompt_just_sent_is_recorded_once_claude_wrote_it_after_the_send(tmp_path, monkeypatch, newest,
                                                                              stamp, recorded):
    """The prompt sent is recorded once capture holds a prompt newer than the newest at the
    send that Claude wrote at or after it; a prompt from before the send that capture took in
    only since (cc-lhc stopped while it went) is not it."""
    import datetime
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    home = cc_lhc.StateHome()
    home.ensure()
    store = cc_lhc.ThreadStore(home, "thread")
    with cc_lhc.Tx(store.db) as db:
        db.execute("INSERT INTO turns (n, kind, first_seq) VALUES (1, 'prompt', 4)")
        for seq, created in ((4, "2026-12-07T09:59:00.000Z"), (newest, stamp)):
            db.execute("INSERT OR REPLACE INTO messages (seq, turn, segment, role, kind, text, created) "
                       "VALUES (?, 1, 0, 'user', 'user_text', 'p', ?)", (seq, created))
    store.close()
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session = types.SimpleNamespace(home=home, capture=types.SimpleNamespace(thread_id="thread"))
    sent = datetime.datetime(2026, 12, 7, 10, 0, 0, tzinfo=datetime.timezone.utc).timestamp()
    h.sent_mark = (4, sent)
    assert h._sent_prompt_recorded() == recorded


def test_a_swap_the_person_asked_for_given_up_before_the_switch_is_said(tmp_path, monkeypatch):
    """A state folder that cannot take the new session gives the swap up before the terminal
    moves; a Smart Compact asked for from the panel says it did not complete (the request
    was forgotten before the step that failed, and the screen cleared for the switch stayed
    blank)."""
    import sqlite3
    import types
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path))
    said = []

    def full(*_a, **_k):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(cc_lhc, "new_capture", full)
    monkeypatch.setattr(cc_lhc, "_close_child", lambda child: None)
    monkeypatch.setattr(cc_lhc, "remove_descriptor", lambda *a, **k: None)
    monkeypatch.setattr(cc_lhc, "abandon", lambda *a, **k: None)
    monkeypatch.setattr(cc_lhc, "Receipts", lambda *a, **k: types.SimpleNamespace(outcome=lambda *a: None))
    session = types.SimpleNamespace(home=cc_lhc.StateHome(), hostdb=None, policy=None, descriptor=None,
                                    spec=types.SimpleNamespace(), capture=types.SimpleNamespace(thread_id="t" * 36),
                                    announce=lambda text, relay=None: said.append(text))
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.survival, h.asked = session, False, "Smart Compact"
    h.candidate = types.SimpleNamespace(fd=-1, pid=1)
    h.pending = types.SimpleNamespace(session_id="p", path="x", descriptor=None, receipt=None)
    h.host = types.SimpleNamespace(child=types.SimpleNamespace(pid=2))
    h.continue_note, h.carrying, h.failures, h.unprepared = None, [], 0, 0
    h._repaint = lambda: None
    relay = types.SimpleNamespace(remove_reader=lambda name: None, timeout=None, drop_input=True, dropped=0)
    h._switch(relay)
    assert h.candidate is None and h.failures == 0  # (the replacement was not at fault)
    assert [s for s in said if s.startswith("Smart Compact did not complete (cc-lhc's state folder")], said


def test_a_prompt_sent_while_the_thread_file_cannot_be_read_still_reaches_claude():
    """Noting a prompt as sent reads the thread; a thread file another tool holds locked
    for long made that read raise on the relay's path, which would end the session. The
    keys go on to Claude, and the mark keeps the newest prompt it knew."""
    import types

    def locked():
        raise cc_lhc.LhcError("thread.sqlite cannot be opened (database is locked)")
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.draft, h.sent_mark, h.held, h.last_input = cc_lhc.DraftWatch(), (7, 0.0), None, 0.0
    h._last_prompt = locked
    relay = types.SimpleNamespace(on_input=None, drop_input=False, in_drop_tail=lambda data: False)
    h.listen(relay)
    assert relay.on_input(b"a prompt\r") == b"a prompt\r"
    assert h.sent_mark[0] == 7 and h.sent_mark[1] > 0


def test_keys_typed_on_from_a_dropped_run_are_dropped_until_the_person_pauses(monkeypatch):
    """A sentence typed through the start of a compaction: its first keys are dropped while
    the compaction runs, and the rest, typed on without a pause once it ends, went into
    Claude's box ("eck the deploy script now"), to be sent clipped with one Enter. The run
    is dropped whole, Enter too, until the person stops typing for a moment; a report the
    terminal sends meanwhile is no typing and passes."""
    import time
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    relay = Relay.__new__(Relay)
    relay.last_drop = None
    assert not relay.in_drop_tail(b"x")  # nothing was dropped: keys pass
    for key in (b"e", b"c", b"k", b" ", b"\x7f", b"now", b"\r"):
        relay.last_drop = clock[0]  # (the relay notes each key it drops)
        clock[0] += 0.15
        assert relay.in_drop_tail(key), key
    clock[0] += 0.1
    assert not relay.in_drop_tail(b"\x1b[I")  # a focus report: passes, and is no typing
    clock[0] += relay.DROP_PAUSE_SECONDS  # the person stopped, read the notice
    assert not relay.in_drop_tail(b"resend")


def test_keys_dropped_as_the_tail_of_a_drop_are_no_draft_in_claudes_box(monkeypatch):
    """The draft watch hears only keys that reach Claude: keys dropped as the tail of a drop
    made cc-lhc believe Claude's box held a draft (holding Smart Compact back), or, with
    their Enter, that a prompt had just been sent."""
    import types
    handoff = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    handoff.draft = cc_lhc.DraftWatch()
    handoff.last_input = 0
    relay = types.SimpleNamespace(on_input=None, drop_input=False, in_drop_tail=lambda data: True)
    handoff.listen(relay)
    for key in (b"e", b"c", b"k", b"\r"):
        assert relay.on_input(key) == key  # (the relay drops it)
    assert not handoff.draft.pending and handoff.draft.sent_at is None
    relay.in_drop_tail = lambda data: False
    relay.on_input(b"hi")
    assert handoff.draft.pending


def test_lines_claude_clears_its_screen_over_while_they_stand_are_written_again(monkeypatch):
    """cc-lhc's lines over Claude's screen (the startup ones, said once Claude has gone quiet)
    were lost when Claude then drew its whole screen anew (a first frame that came late on
    a loaded machine): written again once, after such a clear, while they still have time
    to stand; not for a clear before them, nor once their time is up, nor over the panel."""
    import collections
    import time
    import types
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    session = cc_lhc.ManagedSession.__new__(cc_lhc.ManagedSession)
    session._to_show, session.announced = collections.deque(), []
    session.on_screen = collections.deque(maxlen=6)
    session.overlay_until = session.overlay_drawn_at = session.pending = None
    session.home = types.SimpleNamespace(log=lambda *a, **k: None)
    relay = types.SimpleNamespace(to_user=bytearray(), get_size=lambda: (10, 60), child_cleared_at=99.0,
                                  hold_output=False, child_alt_screen=True)
    h = cc_lhc.LiveHandoff.__new__(cc_lhc.LiveHandoff)
    h.session, h.candidate, h.submit_at, h.retry_at, h.repaint_at, h.reshow_at = session, None, None, None, None, None
    h.held, h.draft, h.last_input = None, cc_lhc.DraftWatch(), 0
    h.inproc = types.SimpleNamespace(on_tick=lambda relay: None)
    h._tell_carried = lambda relay: None
    session._to_show.append("Invalid compact configuration. Default configuration used.")
    session.show_notices(relay)  # at 100.0, after Claude's clear at 99.0: nothing to write again
    written = bytes(relay.to_user)
    h.on_tick(relay)
    clock[0] += 1
    h.on_tick(relay)
    assert bytes(relay.to_user) == written
    relay.child_cleared_at = 101.5  # Claude's first whole frame, late
    clock[0] = 101.6
    h.on_tick(relay)
    clock[0] += h.RESHOW_SECONDS
    h.on_tick(relay)
    assert bytes(relay.to_user).count(b"Invalid compact configuration") == 2
    clock[0] += 1
    h.on_tick(relay)  # (once per clear)
    assert bytes(relay.to_user).count(b"Invalid compact configuration") == 2
    relay.hold_output, relay.child_cleared_at = True, 102.5  # the panel is open: not over it
    clock[0] = 102.6
    h.on_tick(relay)
    clock[0] += h.RESHOW_SECONDS
    h.on_tick(relay)
    assert bytes(relay.to_user).count(b"Invalid compact configuration") == 2
