"""Drive a full-screen program inside a private, detached tmux server.

    t = Tmux(["claude"], cols=100, rows=30, env=env, cwd=work)
    t.wait_for("? for shortcuts")          # polls capture-pane every 50 ms
    t.send_text("hello"); t.send_keys("Enter")
    t.resize(80, 24)                        # the program gets SIGWINCH
    status = t.wait_exit()                  # the program's exit status
    t.stty_before == t.stty_after           # `stty -g` around the program: terminal restored?
    t.kill()

Each instance starts its own tmux server on a socket in a private temp folder (``-S``) with
``-f /dev/null``, so tests never see or touch the user's tmux server or configuration. The program runs under a
small ``sh`` wrapper that records ``stty -g`` before and after it, then its exit status, in
files of a private folder; ``after`` adds shell commands to run once the program ended (they
run before the status is written, so their output is complete when ``wait_exit`` returns).
``remain-on-exit`` keeps the pane (and its last screen) readable after the program ended.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

POLL = 0.05
_serial = itertools.count(1)


class TmuxTimeout(AssertionError):
    """A wait ran out; the message holds the last screen."""


class Tmux:
    def __init__(self, cmd: Sequence[str] | str, *, cols: int = 100, rows: int = 30,
                 env: Mapping[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 after: str = "", term: str = "xterm-256color", history: int = 5000):
        if shutil.which("tmux") is None:
            raise RuntimeError("tmux is not installed")
        self.dir = Path(tempfile.mkdtemp(prefix="tmuxdrive-"))
        # A socket inside our private folder: nothing else can attach, and cleanup is rmtree.
        self.socket = str(self.dir / f"tmux-{next(_serial)}.sock")
        self.target = "t"
        command = cmd if isinstance(cmd, str) else shlex.join(str(c) for c in cmd)
        d = shlex.quote(str(self.dir))
        script = self.dir / "run.sh"
        script.write_text(
            "#!/bin/sh\n"
            f"stty -g > {d}/stty.before 2>/dev/null\n"
            f"{command}\n"
            "status=$?\n"
            f"stty -g > {d}/stty.after 2>/dev/null\n"
            f"stty -a > {d}/stty.after.all 2>/dev/null\n"
            f"{after}\n"
            f"echo $status > {d}/exit.tmp && mv {d}/exit.tmp {d}/exit\n")
        script.chmod(0o755)
        self._env = dict(os.environ if env is None else env)
        # tmux refuses to start nested when TMUX is set; the pane gets its own TERM below.
        self._env.pop("TMUX", None)
        self._env.pop("TMUX_PANE", None)
        self._env.setdefault("TERM", term)
        self._tmux(
            "start-server", ";",
            "set-option", "-g", "remain-on-exit", "on", ";",
            "set-option", "-g", "default-terminal", term, ";",
            "set-option", "-g", "history-limit", str(history), ";",
            "set-option", "-g", "status", "off", ";",
            "set-option", "-g", "focus-events", "on", ";",
            "new-session", "-d", "-s", self.target, "-x", str(cols), "-y", str(rows),
            "-c", str(cwd or os.getcwd()), str(script))
        self.alive = True

    # -- raw tmux -----------------------------------------------------------------------
    def _tmux(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(["tmux", "-S", self.socket, "-f", "/dev/null", *args],
                              env=self._env, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=20, check=check)

    # -- input --------------------------------------------------------------------------
    def send_keys(self, *keys: str) -> None:
        """tmux key names: "Enter", "C-d", "Escape", "Up", "S-Tab", ..."""
        self._tmux("send-keys", "-t", self.target, *keys)

    def send_text(self, text: str) -> None:
        """Type text literally (no key-name lookup)."""
        self._tmux("send-keys", "-t", self.target, "-l", "--", text)

    # -- output -------------------------------------------------------------------------
    def capture(self, history: bool = False) -> str:
        """The visible pane text (with the scrollback when history=True)."""
        args = ["capture-pane", "-p", "-t", self.target]
        if history:
            args += ["-S", "-"]
        return self._tmux(*args).stdout

    def wait_for(self, pattern: str | re.Pattern, timeout: float = 15, history: bool = False) -> str:
        """Poll the pane until it shows ``pattern`` (substring or regex); return the screen."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture(history=history)
            if (pattern.search(screen) if isinstance(pattern, re.Pattern) else pattern in screen):
                return screen
            if time.monotonic() > deadline:
                raise TmuxTimeout(f"timed out after {timeout}s waiting for {pattern!r}; "
                                  f"screen:\n{screen}")
            time.sleep(POLL)

    def wait_gone(self, pattern: str | re.Pattern, timeout: float = 15) -> str:
        """Poll until the pane no longer shows ``pattern``."""
        deadline = time.monotonic() + timeout
        while True:
            screen = self.capture()
            if not (pattern.search(screen) if isinstance(pattern, re.Pattern) else pattern in screen):
                return screen
            if time.monotonic() > deadline:
                raise TmuxTimeout(f"timed out after {timeout}s waiting for {pattern!r} to go; "
                                  f"screen:\n{screen}")
            time.sleep(POLL)

    # -- geometry and process -----------------------------------------------------------
    def resize(self, cols: int, rows: int) -> None:
        """Resize the window; the program in the pane gets SIGWINCH."""
        self._tmux("resize-window", "-t", self.target, "-x", str(cols), "-y", str(rows))

    def size(self) -> tuple[int, int]:
        out = self._tmux("display-message", "-p", "-t", self.target,
                         "#{pane_width} #{pane_height}").stdout.split()
        return int(out[0]), int(out[1])

    @property
    def pane_pid(self) -> int:
        """Pid of the sh wrapper running in the pane (the program is its child)."""
        return int(self._tmux("display-message", "-p", "-t", self.target, "#{pane_pid}").stdout)

    def exit_status(self) -> int | None:
        """The program's exit status once it ended, else None."""
        try:
            return int((self.dir / "exit").read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def wait_exit(self, timeout: float = 15) -> int:
        """Wait until the program ended; return its exit status (128+N after signal N)."""
        deadline = time.monotonic() + timeout
        while (status := self.exit_status()) is None:
            if time.monotonic() > deadline:
                raise TmuxTimeout(f"program still running after {timeout}s; screen:\n"
                                  f"{self.capture()}")
            time.sleep(POLL)
        return status

    @property
    def stty_before(self) -> str:
        return (self.dir / "stty.before").read_text().strip()

    @property
    def stty_after(self) -> str:
        return (self.dir / "stty.after").read_text().strip()

    @property
    def stty_after_all(self) -> str:
        """``stty -a`` after the program ended (human readable, for messages)."""
        return (self.dir / "stty.after.all").read_text()

    def kill(self) -> None:
        if self.alive:
            self._tmux("kill-server", check=False)
            self.alive = False
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Tmux":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
