#!/usr/bin/env python3
"""cc-lhc: a Long Horizon Context host for the Claude Code CLI.

cc-lhc runs the closed ``claude`` program as its child (in a pseudo-terminal for
interactive sessions, as a plain child for ``-p`` one-shots), keeps every line of
Claude's transcript in a lossless SQLite thread, and rebuilds the session from that
thread when the context grows too large, so nothing said in a session is ever lost.

The file reads top to bottom; ``grep -n '^# == ' cc_lhc.py`` prints these rooms:

 1. Constants, user-facing strings, errors
 2. Pure helpers: ids, labels, slugs, token counting
 3. Config: builtin < user < project < launch flags
 4. Rollout parsing (pure): transcript line -> canonical records
 5. Thread store: SQLite files, migrations, the append-only record
 6. Views (pure): fidelity bands and the served view
 7. Rollout writing: a view -> a transcript Claude can resume
 8. Governor (pure): pressure, states, decisions, receipts
 9. Derivations: the work queue and isolated summarisers
10. Processes: identity, leases, descriptors, spawning, death-linking
11. Capture: tailing the live transcript into the store
12. Terminal relay
13. Hosts: interactive and one-shot
14. Recovery at launch
15. Commands, argument parsing, main

Pure sections take data and return data (no clock, no filesystem); the I/O lives in
thin shells around them. Platform modules (pty, termios, fcntl, winpty) are imported
only inside the sections that need them.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import sys
import uuid

# == 1. Constants, user-facing strings, errors ==================================

VERSION = "0.1.0"
SOURCE_STAMP = None  # build/build.py replaces this line

PROG = "cc-lhc"

# Exit statuses cc-lhc itself chooses (Claude's own status passes through unchanged).
EXIT_OK = 0
EXIT_ERROR = 1        # an unexpected failure inside cc-lhc
EXIT_USAGE = 2        # bad arguments, refusals, "not available", conflicts
EXIT_NOT_FOUND = 127  # the claude binary cannot be found or executed

# Exact strings the product contract quotes; tests compare against these.
MSG_CONFIG_FALLBACK = (
    "Invalid compact configuration. Default configuration used. "
    "Please fix or update the configuration."
)

# Claude Code subcommands: a launch naming one of these is not a session, so it is
# passed through untouched (no session id, no capture). `doctor` is ours.
CLAUDE_SUBCOMMANDS = frozenset(
    "agents attach auth auto-mode gateway import install logs mcp plugin plugins "
    "purge respawn rm setup-token stop kill ultrareview update upgrade".split()
)

# The wrapper's own subcommands. They are never forwarded to Claude.
LHC_SUBCOMMANDS = (
    "get-turns", "get-messages", "search", "backfill-labels", "rollout",
    "measure", "threads", "export", "doctor",
)


class LhcError(Exception):
    """The one error type cc-lhc raises on purpose; main() turns it into a status."""

    def __init__(self, message: str, status: int = EXIT_ERROR):
        super().__init__(message)
        self.status = status


def usage_error(message: str) -> LhcError:
    return LhcError(message, EXIT_USAGE)


# == 2. Pure helpers: ids, labels, slugs, token counting ========================

UUID_RE = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def is_uuid(text: str) -> bool:
    return bool(UUID_RE.match(text or ""))


def new_session_id() -> str:
    return str(uuid.uuid4())


def _java_string_hash(text: str) -> int:
    """Java's String.hashCode over UTF-16 code units, as Claude Code computes it."""
    h = 0
    data = text.encode("utf-16-le")
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | (data[i + 1] << 8))) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


def project_slug(cwd: str) -> str:
    """The folder name Claude Code uses under projects/ for a working directory.

    Every character outside [A-Za-z0-9] becomes '-', runs are kept; a slug longer
    than 200 characters is cut and suffixed with a base-36 hash of the path.
    """
    slug = re.sub(r"[^A-Za-z0-9]", "-", cwd)
    if len(slug) > 200:
        slug = slug[:200] + "-" + _base36(abs(_java_string_hash(cwd)))
    return slug


def utc_now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


TOKENIZER_FILE_NAME = "o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _program_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _read_tokenizer_bytes():
    """The o200k_base rank file from wherever this copy of cc-lhc carries it.

    Looked up in order: $CC_LHC_TOKENIZER_FILE, a PyInstaller bundle's data folder,
    the zipapp archive, a checkout's .cache/tokenizer/. Returns (bytes, where) or
    (None, None). Never touches the network: the tiktoken download host is not
    reachable for many users and must never be needed.
    """
    candidates = []
    if os.environ.get("CC_LHC_TOKENIZER_FILE"):
        candidates.append(os.environ["CC_LHC_TOKENIZER_FILE"])
    if getattr(sys, "_MEIPASS", None):
        candidates.append(os.path.join(sys._MEIPASS, "cc_lhc_data", TOKENIZER_FILE_NAME))
    candidates.append(os.path.join(_program_dir(), ".cache", "tokenizer", TOKENIZER_FILE_NAME))
    for path in candidates:
        try:
            with open(path, "rb") as f:
                return f.read(), path
        except OSError:
            continue
    archive = _program_dir()
    if os.path.isfile(archive):  # running from a zipapp: __file__ is inside the archive
        import zipfile
        try:
            with zipfile.ZipFile(archive) as z:
                return z.read("cc_lhc_data/" + TOKENIZER_FILE_NAME), archive
        except (OSError, KeyError, zipfile.BadZipFile):
            pass
    return None, None


class TokenCounter:
    """Counts tokens with tiktoken's o200k_base when it can, bytes/4 otherwise.

    ``exact`` says which: every figure cc-lhc shows carries that label, because an
    approximate count must never pass for an exact one.
    """

    def __init__(self):
        self._encoding = None
        self._loaded = False
        self.exact = False
        self.reason = "not loaded yet"

    def _load(self):
        self._loaded = True
        data, where = _read_tokenizer_bytes()
        if data is None:
            self.reason = "o200k_base data not found (counts are approximate)"
            return
        import hashlib
        if hashlib.sha256(data).hexdigest() != O200K_SHA256:
            self.reason = f"o200k_base data at {where} failed its checksum (counts are approximate)"
            return
        try:
            import base64
            import tiktoken
            import tiktoken_ext.openai_public as public
        except ImportError:
            self.reason = "tiktoken is not installed (counts are approximate)"
            return
        ranks = {}
        for line in data.splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        # tiktoken's own o200k_base() would download the ranks; hand it ours instead so
        # the split pattern and special tokens still come from tiktoken itself.
        original = public.load_tiktoken_bpe
        public.load_tiktoken_bpe = lambda *_a, **_k: ranks
        try:
            spec = public.o200k_base()
        finally:
            public.load_tiktoken_bpe = original
        self._encoding = tiktoken.Encoding(**spec)
        self.exact = True
        self.reason = f"o200k_base from {where}"

    def count(self, text: str) -> int:
        if not self._loaded:
            self._load()
        if self._encoding is not None:
            return len(self._encoding.encode(text, disallowed_special=()))
        return (len(text.encode("utf-8")) + 3) // 4


TOKENS = TokenCounter()


# == 3. Config: builtin < user < project < launch flags =========================

BUILTIN_POLICY = {
    "lowerBoundTokens": 180_000,
    "upperBoundTokens": 360_000,
    "profile": "default",
    "pruneEnabled": False,
    "pruneThresholdTokens": 300_000,
    "pruneTargetTokens": 150_000,
    "minRunwayTokens": 50_000,
}
PROFILES = ("default", "balanced", "historical")
_TOKEN_FIELDS = ("lowerBoundTokens", "upperBoundTokens", "pruneThresholdTokens",
                 "pruneTargetTokens", "minRunwayTokens")
# Pairs that must stay coherent; when one is broken both fall back together.
_COHERENT_PAIRS = (
    ("lowerBoundTokens", "upperBoundTokens", "the target must be below the trigger"),
    ("pruneTargetTokens", "pruneThresholdTokens", "the prune target must be below the prune threshold"),
    ("minRunwayTokens", "upperBoundTokens", "the minimum runway must be below the trigger"),
)


class Policy:
    """The resolved context policy: values, the source of each, and any fallbacks."""

    def __init__(self, values: dict, sources: dict, problems: list):
        self.values = values
        self.sources = sources
        self.problems = problems  # ["field from source: why", ...]

    def __getitem__(self, key):
        return self.values[key]

    @property
    def fell_back(self) -> bool:
        return bool(self.problems)

    @property
    def effective_target(self) -> int:
        """The view budget: the lower target, kept clear of the trigger by the runway."""
        return min(self.values["lowerBoundTokens"],
                   self.values["upperBoundTokens"] - self.values["minRunwayTokens"])


def _check_field(name, value):
    """Return an error sentence for a bad value, or None."""
    if name in _TOKEN_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            return f"expected a positive whole number of tokens, got {json.dumps(value)}"
    elif name == "profile":
        if value not in PROFILES:
            return f"expected one of {', '.join(PROFILES)}, got {json.dumps(value)}"
    elif name == "pruneEnabled":
        if not isinstance(value, bool):
            return f"expected true or false, got {json.dumps(value)}"
    return None


def resolve_policy(layers) -> Policy:
    """Merge config layers, lowest precedence first, with per-field fallback.

    ``layers`` is a list of ``(source_name, dict_or_LhcError)``. A layer that could not
    be read is an LhcError; an unknown field, a malformed value or an incoherent pair
    falls back to the builtin value for the fields involved, named with its source.
    Nothing here can turn Smart Compact off.
    """
    values = dict(BUILTIN_POLICY)
    sources = {k: "builtin" for k in values}
    problems = []
    for source, layer in layers:
        if isinstance(layer, LhcError):
            problems.append(f"{source}: {layer}")
            continue
        if not isinstance(layer, dict):
            problems.append(f"{source}: expected a JSON object")
            continue
        for name, value in layer.items():
            if name not in BUILTIN_POLICY:
                problems.append(f"{name} from {source}: unknown field")
                continue
            why = _check_field(name, value)
            if why:
                problems.append(f"{name} from {source}: {why}")
                continue
            values[name] = value
            sources[name] = source
    for low, high, why in _COHERENT_PAIRS:
        if values[low] >= values[high]:
            problems.append(f"{low} ({values[low]} from {sources[low]}) and {high} "
                            f"({values[high]} from {sources[high]}): {why}")
            for name in (low, high):
                values[name] = BUILTIN_POLICY[name]
                sources[name] = "builtin"
    return Policy(values, sources, problems)


def user_config_path(env=None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cc-lhc", "config.json")


def project_config_path(cwd: str):
    """The nearest .cc-lhc.json at or above cwd, or None."""
    here = os.path.abspath(cwd)
    while True:
        candidate = os.path.join(here, ".cc-lhc.json")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


def _read_config_file(path):
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        return LhcError(f"cannot read the file ({e.__class__.__name__}: {e})")
    except json.JSONDecodeError as e:
        return LhcError(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})")


def load_policy(cwd: str, flag_values: dict) -> Policy:
    layers = []
    user = user_config_path()
    if os.path.exists(user):
        layers.append((user, _read_config_file(user)))
    project = project_config_path(cwd)
    if project:
        layers.append((project, _read_config_file(project)))
    for name, (flag, value) in flag_values.items():
        layers.append((f"launch flag {flag}", {name: value}))
    return resolve_policy(layers)


# == 4. Rollout parsing (pure): transcript line -> canonical records ============

# == 5. Thread store: SQLite files, migrations, the append-only record ==========

# == 6. Views (pure): fidelity bands and the served view ========================

# == 7. Rollout writing: a view -> a transcript Claude can resume ===============

# == 8. Governor (pure): pressure, states, decisions, receipts ==================

# == 9. Derivations: the work queue and isolated summarisers ====================

# == 10. Processes: identity, leases, descriptors, spawning, death-linking ======


class StateHome:
    """The private state folder (~/.cc-lhc or $CC_LHC_HOME) and its log."""

    def __init__(self, root=None):
        self.root = os.path.abspath(root or os.environ.get("CC_LHC_HOME")
                                    or os.path.join(os.path.expanduser("~"), ".cc-lhc"))

    def path(self, *parts) -> str:
        return os.path.join(self.root, *parts)

    def ensure(self, *parts) -> str:
        """Create a folder under the home (0700 on POSIX) and return its path."""
        path = self.path(*parts)
        if not os.path.isdir(path):
            os.makedirs(path, mode=0o700, exist_ok=True)
            if os.name == "posix":
                os.chmod(path, 0o700)
        return path

    def log(self, event: str, **fields) -> None:
        """Append one line to wrapper.log. Logging never breaks a session."""
        try:
            self.ensure()
            line = json.dumps({"ts": utc_now_iso(), "pid": os.getpid(), "event": event, **fields},
                              ensure_ascii=False, sort_keys=False)
            fd = os.open(self.path("wrapper.log"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, (line + "\n").encode("utf-8"))
            finally:
                os.close(fd)
        except OSError:
            pass


def claude_config_dir() -> str:
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def find_claude_binary() -> str:
    """The child binary: $CC_LHC_CLAUDE_BIN, else `claude` on PATH."""
    import shutil
    override = os.environ.get("CC_LHC_CLAUDE_BIN")
    if override:
        if os.path.isfile(override) and os.access(override, os.X_OK):
            return override
        found = shutil.which(override)
        if found:
            return found
        raise LhcError(f"CC_LHC_CLAUDE_BIN points at {override!r}, which is not an executable file",
                       EXIT_NOT_FOUND)
    found = shutil.which("claude")
    if not found:
        raise LhcError("cannot find the `claude` program on PATH; install Claude Code "
                       "or set CC_LHC_CLAUDE_BIN to its path", EXIT_NOT_FOUND)
    return found


PR_SET_PDEATHSIG = 1


def _death_link_preexec(parent_pid: int):
    """A preexec_fn that makes the child die with the wrapper (Linux).

    prctl(PR_SET_PDEATHSIG) fires when the parent thread dies; the getppid() check
    closes the race where the wrapper died between fork and prctl.
    """
    def link():
        if sys.platform.startswith("linux"):
            try:
                import ctypes
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            except (OSError, AttributeError):
                pass
        if os.getppid() != parent_pid:
            os._exit(EXIT_ERROR)
    return link


def start_watchdog(child_pid: int):
    """Where the kernel cannot tie a child to us (macOS), a small process does it.

    It runs this same program as `cc-lhc __watchdog <wrapper> <child>`, so it works
    from a checkout, the zipapp and the frozen bundle alike.
    """
    if sys.platform.startswith("linux") or os.name != "posix":
        return None
    import subprocess
    return subprocess.Popen(self_command() + ["__watchdog", str(os.getpid()), str(child_pid)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def run_watchdog(wrapper_pid: int, child_pid: int) -> int:
    import time
    while True:
        try:
            os.kill(wrapper_pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        try:
            os.kill(child_pid, 0)
        except ProcessLookupError:
            return 0
        time.sleep(0.5)
    try:
        os.kill(child_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    return 0


def self_command() -> list:
    """argv that runs this same cc-lhc (frozen bundle, zipapp or source file)."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, os.path.abspath(sys.argv[0] if sys.argv and sys.argv[0].endswith(".pyz")
                                            else __file__)]


def child_environment(spec) -> dict:
    """The environment every managed Claude child gets."""
    env = dict(os.environ)
    if not spec.autocompact:
        # Claude native Compact would replace the conversation with a summary behind our
        # back; Smart Compact does this job losslessly instead.
        env["DISABLE_AUTO_COMPACT"] = "1"
    return env


def exit_status_from_wait(status: int) -> int:
    """A waitpid status as a shell would report it (128+N for a signal)."""
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status)
    return EXIT_ERROR


# == 11. Capture: tailing the live transcript into the store ====================

# == 12. Terminal relay ==========================================================


class Relay:
    """Copies bytes between the user's terminal and the child's PTY master.

    Done the careful way: non-blocking master, one buffer each way with a high-water
    mark (a slow terminal stops us reading the child rather than growing memory),
    partial writes sliced, EIO on the master read as end-of-file, and signals through
    a self-pipe so SIGWINCH and SIGTERM wake the loop instead of interrupting a write.
    All file descriptors and the size function are passed in, so tests can drive it.
    """

    HIGH_WATER = 1 << 20
    CHUNK = 1 << 16

    def __init__(self, master_fd, in_fd, out_fd, get_size=None, set_child_size=None,
                 on_signal=None):
        self.master_fd = master_fd
        self.in_fd = in_fd
        self.out_fd = out_fd
        self.get_size = get_size
        self.set_child_size = set_child_size
        self.on_signal = on_signal
        self.to_child = bytearray()
        self.to_user = bytearray()
        self.input_open = in_fd is not None
        self.stop_requested = None

    def run(self) -> None:
        import selectors
        os.set_blocking(self.master_fd, False)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        watched = (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD)
        previous = {s: signal.signal(s, lambda *_: None) for s in watched}
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        sel = selectors.DefaultSelector()
        try:
            sel.register(wake_r, selectors.EVENT_READ, "wake")
            self._loop(sel, wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for s, handler in previous.items():
                signal.signal(s, handler)
            sel.close()
            os.close(wake_r)
            os.close(wake_w)

    def _interest(self, sel, fd, events, tag):
        if events:
            try:
                sel.modify(fd, events, tag)
            except KeyError:
                sel.register(fd, events, tag)
        else:
            try:
                sel.unregister(fd)
            except KeyError:
                pass

    def _loop(self, sel, wake_r):
        import selectors
        master_open = True
        while master_open and not self.stop_requested:
            m_events = 0
            if len(self.to_user) < self.HIGH_WATER:
                m_events |= selectors.EVENT_READ
            if self.to_child:
                m_events |= selectors.EVENT_WRITE
            self._interest(sel, self.master_fd, m_events, "master")
            if self.input_open:
                self._interest(sel, self.in_fd,
                               selectors.EVENT_READ if len(self.to_child) < self.HIGH_WATER else 0,
                               "in")
            self._interest(sel, self.out_fd, selectors.EVENT_WRITE if self.to_user else 0, "out")
            for key, mask in sel.select():
                tag = key.data
                if tag == "wake":
                    self._drain_signals(wake_r)
                elif tag == "master":
                    if mask & selectors.EVENT_READ:
                        try:
                            data = os.read(self.master_fd, self.CHUNK)
                        except BlockingIOError:
                            data = None
                        except OSError:  # EIO: the child side closed
                            data = b""
                        if data == b"":
                            master_open = False
                            break
                        if data:
                            self.to_user += data
                    if mask & selectors.EVENT_WRITE and self.to_child:
                        self._write_some(self.master_fd, self.to_child)
                elif tag == "in":
                    try:
                        data = os.read(self.in_fd, self.CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        self.input_open = False
                        self._interest(sel, self.in_fd, 0, "in")
                    else:
                        self.to_child += data
                elif tag == "out":
                    self._write_some(self.out_fd, self.to_user)
        self._flush_user()

    @staticmethod
    def _write_some(fd, buf: bytearray) -> None:
        try:
            n = os.write(fd, bytes(buf[: Relay.CHUNK]))
        except BlockingIOError:
            return
        except OSError:
            buf.clear()  # the reader went away; nothing more can be delivered
            return
        del buf[:n]

    def _flush_user(self):
        """Deliver what the child wrote before it exited (its goodbye screen)."""
        try:
            while True:
                data = os.read(self.master_fd, self.CHUNK)
                if not data:
                    break
                self.to_user += data
        except OSError:
            pass
        blocking = os.get_blocking(self.out_fd)
        os.set_blocking(self.out_fd, True)
        try:
            while self.to_user:
                self._write_some(self.out_fd, self.to_user)
        finally:
            os.set_blocking(self.out_fd, blocking)

    def _drain_signals(self, wake_r):
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGWINCH and self.get_size and self.set_child_size:
                size = self.get_size()
                if size:
                    self.set_child_size(*size)
            elif self.on_signal:
                self.on_signal(signum, self)


def terminal_size(fd):
    """(rows, cols) of a terminal, or None when fd is not one."""
    try:
        size = os.get_terminal_size(fd)
        return size.lines, size.columns
    except OSError:
        return None


class RawTerminal:
    """Puts the user's terminal in raw mode and always puts it back."""

    def __init__(self, fd):
        self.fd = fd
        self.saved = None

    def __enter__(self):
        import termios
        import tty
        if os.isatty(self.fd):
            self.saved = termios.tcgetattr(self.fd)
            tty.setraw(self.fd, termios.TCSANOW)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            import termios
            # TCSAFLUSH: drop input typed for the dead child instead of handing it to the shell.
            termios.tcsetattr(self.fd, termios.TCSAFLUSH, self.saved)
        return False


# == 13. Hosts: interactive and one-shot =========================================


def run_interactive(spec, home: StateHome) -> int:
    """Run Claude in a PTY on the user's terminal until it exits."""
    if os.name != "posix":
        return run_interactive_windows(spec, home)
    try:
        import ptyprocess
    except ImportError:
        raise LhcError("interactive sessions need the ptyprocess package "
                       "(pip install ptyprocess==0.7.0)")
    in_fd, out_fd = sys.stdin.fileno(), sys.stdout.fileno()
    size = terminal_size(out_fd) or terminal_size(in_fd) or (24, 80)
    try:
        child = ptyprocess.PtyProcess.spawn(
            spec.child_argv, cwd=spec.cwd, env=child_environment(spec), dimensions=size,
            preexec_fn=_death_link_preexec(os.getpid()))
    except (OSError, FileNotFoundError) as e:
        raise LhcError(f"cannot start {spec.child_argv[0]}: {e}", EXIT_NOT_FOUND)
    home.log("child_started", mode="interactive", child_pid=child.pid,
             session=spec.session_id, argv=spec.child_argv[1:])
    watchdog = start_watchdog(child.pid)

    def on_signal(signum, relay):
        if signum in (signal.SIGTERM, signal.SIGHUP):
            # The user's terminal is going away or we were asked to stop: pass it on
            # and keep relaying until the child has said its last words.
            try:
                child.kill(signum)
            except OSError:
                pass

    relay = Relay(child.fd, in_fd if _readable(in_fd) else None, out_fd,
                  get_size=lambda: terminal_size(out_fd),
                  set_child_size=lambda rows, cols: child.setwinsize(rows, cols),
                  on_signal=on_signal)
    try:
        with RawTerminal(in_fd):
            relay.run()
    finally:
        status = _reap(child)
        if watchdog:
            watchdog.kill()
    home.log("child_exited", mode="interactive", child_pid=child.pid, status=status)
    return status


def _readable(fd) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _reap(child) -> int:
    """Wait for a ptyprocess child and turn its end into an exit status."""
    import time
    deadline = time.monotonic() + 5
    while child.isalive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if child.isalive():
        child.terminate(force=True)
    try:
        child.close(force=True)
    except OSError:
        pass
    if child.signalstatus is not None:
        return 128 + child.signalstatus
    return child.exitstatus if child.exitstatus is not None else EXIT_ERROR


def run_interactive_windows(spec, home: StateHome) -> int:  # pragma: no cover - Windows only
    """The Windows interactive host: pywinpty's ConPTY in place of a POSIX PTY."""
    try:
        from winpty import PtyProcess
    except ImportError:
        raise LhcError("interactive sessions on Windows need the pywinpty package")
    import shutil
    import threading
    import msvcrt
    cols, rows = shutil.get_terminal_size((80, 24))
    child = PtyProcess.spawn(spec.child_argv, cwd=spec.cwd, env=child_environment(spec),
                             dimensions=(rows, cols))
    home.log("child_started", mode="interactive", child_pid=child.pid, session=spec.session_id)

    def pump_input():
        while child.isalive():
            ch = msvcrt.getwch()
            child.write(ch)

    threading.Thread(target=pump_input, daemon=True).start()
    last_size = (cols, rows)
    while child.isalive():
        try:
            data = child.read(4096)
        except EOFError:
            break
        sys.stdout.write(data)
        sys.stdout.flush()
        size = shutil.get_terminal_size((80, 24))
        if (size.columns, size.lines) != last_size:
            last_size = (size.columns, size.lines)
            child.setwinsize(size.lines, size.columns)
    status = child.exitstatus if child.exitstatus is not None else EXIT_ERROR
    home.log("child_exited", mode="interactive", child_pid=child.pid, status=status)
    return status


def run_oneshot(spec, home: StateHome) -> int:
    """Run `claude -p` as a plain child sharing our stdin, stdout and stderr."""
    import subprocess
    kwargs = {}
    if os.name == "posix":
        kwargs["preexec_fn"] = _death_link_preexec(os.getpid())
    try:
        child = subprocess.Popen(spec.child_argv, cwd=spec.cwd, env=child_environment(spec), **kwargs)
    except OSError as e:
        raise LhcError(f"cannot start {spec.child_argv[0]}: {e}", EXIT_NOT_FOUND)
    home.log("child_started", mode="oneshot", child_pid=child.pid, session=spec.session_id,
             argv=spec.child_argv[1:])
    watchdog = start_watchdog(child.pid)

    def forward(signum, _frame):
        try:
            child.send_signal(signum)
        except OSError:
            pass

    # ctrl-c reaches Claude through the shared process group; the wrapper only waits.
    previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN)}
    for s in (signal.SIGTERM, signal.SIGHUP):
        previous[s] = signal.signal(s, forward)
    try:
        returncode = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if watchdog:
            watchdog.kill()
    status = 128 - returncode if returncode < 0 else returncode
    home.log("child_exited", mode="oneshot", child_pid=child.pid, status=status)
    return status


# == 14. Recovery at launch ======================================================

# == 15. Commands, argument parsing, main ========================================

# Claude options and how their values are written, so the wrapper can find the
# session selectors and the print flag without guessing where a value ends.
# "value": <v> required; "optional": [v]; "variadic": <v...>; anything else is a flag.
CLAUDE_VALUE_OPTIONS = {
    **{o: "value" for o in (
        "--agent", "--agents", "--append-system-prompt", "--autocompact", "--debug-file",
        "--effort", "--environment", "--fallback-model", "--input-format", "--json-schema",
        "--max-budget-usd", "--model", "-n", "--name", "--output-format", "--permission-mode",
        "--permission-prompts", "--plugin-dir", "--plugin-url",
        "--remote-control-session-name-prefix", "--session-id", "--setting-sources",
        "--settings", "--system-prompt", "--system-prompt-snapshot", "--system-prompt-file",
        "--append-system-prompt-file")},
    **{o: "optional" for o in (
        "-r", "--resume", "-d", "--debug", "--cloud", "--from-pr", "--prompt-suggestions",
        "--remote-control", "--teleport", "-w", "--worktree")},
    **{o: "variadic" for o in (
        "--add-dir", "--allowedTools", "--allowed-tools", "--betas", "--disallowedTools",
        "--disallowed-tools", "--file", "--mcp-config", "--tools")},
}


class LaunchSpec:
    """What one launch will run: the child's argv and what the wrapper knows of it."""

    def __init__(self):
        self.claude_args = []
        self.child_argv = []
        self.print_mode = False
        self.passthrough = False      # a Claude subcommand, --help or --version
        self.resume = None            # session id given with --resume
        self.resume_picker = False    # bare --resume (or with a search term)
        self.continue_ = False
        self.session_id = None        # the session this launch will write
        self.assigned_session = False
        self.fork = False
        self.autocompact = False
        self.positionals = []
        self.cwd = os.getcwd()
        self.flags = {}               # lhc launch flags: name -> value


def scan_claude_args(args):
    """Walk Claude's argv once and describe it (pure; the argv is never changed).

    Returns a dict: print_mode, resume (value or True for bare), continue_,
    session_id, fork, autocompact, help_or_version, positionals.
    """
    found = {"print_mode": False, "resume": None, "continue_": False, "session_id": None,
             "fork": False, "autocompact": False, "help_or_version": False,
             "positionals": [], "selectors": []}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            found["positionals"].extend(args[i + 1:])
            break
        if not a.startswith("-") or a == "-":
            found["positionals"].append(a)
            i += 1
            continue
        name, eq, inline = a.partition("=")
        kind = CLAUDE_VALUE_OPTIONS.get(name)
        value = inline if eq else None
        consumed = 1
        if not eq and kind == "value" and i + 1 < len(args):
            value, consumed = args[i + 1], 2
        elif not eq and kind == "optional" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            value, consumed = args[i + 1], 2
        elif not eq and kind == "variadic":
            j = i + 1
            while j < len(args) and not args[j].startswith("-"):
                j += 1
            consumed = max(1, j - i)
        if name in ("-p", "--print"):
            found["print_mode"] = True
        elif name in ("-r", "--resume"):
            found["selectors"].append(a)
            if found["resume"] is not None:
                raise usage_error("--resume is given more than once")
            found["resume"] = value if value is not None else True
        elif name in ("-c", "--continue"):
            found["selectors"].append(a)
            found["continue_"] = True
        elif name == "--session-id":
            found["selectors"].append(a)
            if value is None:
                raise usage_error("--session-id needs a session id (a UUID)")
            if not is_uuid(value):
                raise usage_error(f"--session-id {value!r} is not a UUID")
            found["session_id"] = value
        elif name == "--fork-session":
            found["fork"] = True
        elif name == "--autocompact":
            found["autocompact"] = True
        elif name in ("-h", "--help", "-v", "--version"):
            found["help_or_version"] = True
        i += consumed
    return found


def normalize_session(spec: LaunchSpec, found: dict) -> None:
    """Decide which session this launch writes, refusing ambiguous selectors."""
    resume, cont, sid = found["resume"], found["continue_"], found["session_id"]
    if resume is not None and cont:
        raise usage_error("--continue and --resume both choose a session; give only one")
    if sid and cont and not found["fork"]:
        raise usage_error("--continue and --session-id both choose a session; give only one")
    if sid and resume is not None and not found["fork"]:
        raise usage_error("--resume and --session-id both choose a session; give only one")
    spec.continue_ = cont
    spec.fork = found["fork"]
    if isinstance(resume, str) and is_uuid(resume):
        spec.resume = resume
        spec.session_id = resume
    elif resume is not None:
        spec.resume_picker = True
    if sid:
        spec.session_id = sid
    elif spec.fork and (spec.resume or cont or spec.resume_picker):
        # A fork writes a new session; name it so capture knows where it will be.
        spec.session_id = new_session_id()
        spec.assigned_session = True
    elif not (spec.resume or cont or spec.resume_picker):
        spec.session_id = new_session_id()
        spec.assigned_session = True


LHC_FLAGS = {
    # flag: (policy field or None, takes a value, help)
    "--lhc-help": (None, False, "show this help and exit"),
    "--lhc-version": (None, False, "show cc-lhc's version and source identity and exit"),
    "--lhc-target": ("lowerBoundTokens", True, "Smart Compact target in tokens (default 180000)"),
    "--lhc-trigger": ("upperBoundTokens", True, "context size that triggers Smart Compact (default 360000)"),
    "--lhc-min-runway": ("minRunwayTokens", True, "tokens kept free between the view and the trigger (default 50000)"),
    "--lhc-profile": ("profile", True, "allocation profile: default, balanced or historical"),
    "--lhc-no-notifier": (None, False, "do not warn about typed /resume, /clear or /compact"),
}


def parse_launch(argv) -> tuple:
    """Split our argv into the wrapper's own flags and Claude's arguments.

    Everything after the first standalone `--` belongs to Claude untouched.
    """
    flags, claude_args = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            claude_args.extend(argv[i + 1:])
            break
        if a.startswith("--lhc-"):
            name, eq, inline = a.partition("=")
            if name not in LHC_FLAGS:
                raise usage_error(f"unknown cc-lhc flag {name} (see cc-lhc --lhc-help)")
            field, takes_value, _ = LHC_FLAGS[name]
            if takes_value:
                if eq:
                    value = inline
                elif i + 1 < len(argv):
                    value = argv[i + 1]
                    i += 1
                else:
                    raise usage_error(f"{name} needs a value")
                flags[name] = value
            elif eq:
                raise usage_error(f"{name} takes no value")
            else:
                flags[name] = True
            i += 1
            continue
        claude_args.append(a)
        i += 1
    return flags, claude_args


def policy_flag_values(flags: dict) -> dict:
    """Launch flags as a config layer; values are checked by resolve_policy."""
    out = {}
    for flag, value in flags.items():
        field = LHC_FLAGS[flag][0]
        if field is None:
            continue
        if field in _TOKEN_FIELDS:
            try:
                value = int(str(value).replace("_", "").replace(",", ""))
            except ValueError:
                pass  # left as text so the fallback names what was wrong
        out[field] = (flag, value)
    return out


HELP_TEXT = """\
cc-lhc {version}: runs Claude Code with a lossless, self-compacting context.

Usage:
  cc-lhc [cc-lhc flags] [claude arguments...]
  cc-lhc [cc-lhc flags] -- [claude arguments...]
  cc-lhc <command> [arguments...]

Everything that is not a cc-lhc flag goes to Claude, including --help and
--version. After a standalone `--` nothing is read by cc-lhc, so a prompt or
option that looks like a cc-lhc flag reaches Claude as written.

cc-lhc flags:
{flags}

Commands (handled by cc-lhc, never passed to Claude):
  threads [--json]               list captured threads
  export <thread> [...]          print a thread's record
  get-turns [--from N] <tN>...   give back whole turns (used by Claude itself)
  get-messages [--from N] <mN>...  give back single messages (used by Claude)
  search <text>                  search the thread (used by Claude)
  measure <transcript|folder>    what Smart Compact would do, counts only
  rollout write ...              write a thread's view as a Claude session
  backfill-labels <thread>       add stable labels to older stored renderings
  doctor                         check this installation

Environment:
  CC_LHC_HOME          state folder (default ~/.cc-lhc)
  CC_LHC_CLAUDE_BIN    the claude program to run (default: claude on PATH)
  CC_LHC_TOKENIZER_FILE  o200k_base rank file for exact token counts
  CLAUDE_CONFIG_DIR    Claude's own folder (default ~/.claude)
  XDG_CONFIG_HOME      where config.json is looked for (cc-lhc/config.json)

Configuration: ~/.config/cc-lhc/config.json, then .cc-lhc.json in the project,
then the flags above. Fields: lowerBoundTokens, upperBoundTokens, profile,
pruneEnabled, pruneThresholdTokens, pruneTargetTokens, minRunwayTokens.

Exit status: Claude's own status when Claude ran; 2 for a usage error or a
refusal; 127 when claude cannot be found; 1 for an internal error.
"""


def render_help() -> str:
    rows = []
    for flag, (_field, takes_value, text) in LHC_FLAGS.items():
        left = f"{flag} N" if takes_value and flag != "--lhc-profile" else (
            f"{flag} NAME" if takes_value else flag)
        rows.append(f"  {left:<22} {text}")
    return HELP_TEXT.format(version=VERSION, flags="\n".join(rows))


def source_identity() -> dict:
    """Where this copy came from: the build stamp, else git, else unknown."""
    if SOURCE_STAMP:
        return dict(SOURCE_STAMP, origin="stamped")
    import subprocess
    here = _program_dir()
    try:
        commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=5)
        if commit.returncode == 0:
            status = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"],
                                    capture_output=True, text=True, timeout=5)
            return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip()),
                    "origin": "git"}
    except (OSError, subprocess.SubprocessError):
        pass
    return {"commit": None, "dirty": None, "origin": "unknown"}


def render_version() -> str:
    ident = source_identity()
    if ident["commit"]:
        state = "modified" if ident["dirty"] else "clean"
        extra = f", built {ident['build_date']}" if ident.get("build_date") else ""
        return f"{PROG} {VERSION} (source {ident['commit'][:12]} {state}, {ident['origin']}{extra})"
    return f"{PROG} {VERSION} (source unknown: not stamped and not a git checkout)"


def say(message: str) -> None:
    """cc-lhc's own lines go to stderr, so Claude's stdout stays Claude's."""
    sys.stderr.write(f"{PROG}: {message}\n")
    sys.stderr.flush()


def announce_policy(policy: Policy, home: StateHome) -> None:
    if not policy.fell_back:
        return
    say(MSG_CONFIG_FALLBACK)
    for problem in policy.problems:
        say(f"  {problem}")
    home.log("config_fallback", message=MSG_CONFIG_FALLBACK, problems=policy.problems)


def build_launch(argv) -> LaunchSpec:
    flags, claude_args = parse_launch(argv)
    spec = LaunchSpec()
    spec.flags = flags
    spec.claude_args = claude_args
    found = scan_claude_args(claude_args)
    spec.print_mode = found["print_mode"]
    spec.autocompact = found["autocompact"]
    spec.positionals = found["positionals"]
    first = found["positionals"][0] if found["positionals"] else None
    if found["help_or_version"] or (first in CLAUDE_SUBCOMMANDS and claude_args
                                    and claude_args[0] == first):
        spec.passthrough = True
        spec.child_argv = [find_claude_binary()] + claude_args
        return spec
    normalize_session(spec, found)
    extra = ["--session-id", spec.session_id] if spec.assigned_session else []
    spec.child_argv = [find_claude_binary()] + extra + claude_args
    return spec


def cmd_launch(argv) -> int:
    flags, _ = parse_launch(argv)
    if "--lhc-help" in flags:
        sys.stdout.write(render_help())
        return EXIT_OK
    if "--lhc-version" in flags:
        print(render_version())
        return EXIT_OK
    spec = build_launch(argv)
    home = StateHome()
    home.ensure()
    if spec.passthrough:
        return run_oneshot(spec, home)
    policy = load_policy(spec.cwd, policy_flag_values(spec.flags))
    announce_policy(policy, home)
    home.log("launch", version=VERSION, mode="oneshot" if spec.print_mode else "interactive",
             session=spec.session_id, resume=spec.resume, cwd=spec.cwd,
             policy={k: policy.values[k] for k in ("lowerBoundTokens", "upperBoundTokens",
                                                   "minRunwayTokens", "profile")})
    if spec.print_mode:
        return run_oneshot(spec, home)
    return run_interactive(spec, home)


def cmd_not_yet(name: str) -> int:
    raise usage_error(f"`cc-lhc {name}` is not available in this version yet")


COMMANDS = {}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv and argv[0] == "__watchdog" and len(argv) == 3:
            return run_watchdog(int(argv[1]), int(argv[2]))
        if argv and argv[0] in LHC_SUBCOMMANDS:
            handler = COMMANDS.get(argv[0])
            if handler is None:
                return cmd_not_yet(argv[0])
            return handler(argv[1:])
        return cmd_launch(argv)
    except LhcError as e:
        say(str(e))
        return e.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_ERROR


def cli() -> None:
    sys.exit(main())


if __name__ == "__main__":
    cli()
