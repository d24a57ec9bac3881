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
 8. Governor (pure): pressure, states, decisions
 9. Derivations: the work queue and isolated summarisers
10. Processes: identity, leases, descriptors, spawning, death-linking
11. Capture: tailing the live transcript into the store
12. Smart Compact: the one mechanism (assess, rebuild, accept, abandon)
13. Terminal relay
14. Hosts: the managed interactive session and the one-shot
15. Live Smart Compact: the swap, the in-process path, session changes
16. Background work carried across a swap
17. Recovery at launch
18. Launch: argument parsing, help, the managed launch
19. Commands: threads, export, retrieval, search, measure, doctor, main

Pure sections take data and return data (no clock, no filesystem); the I/O lives in
thin shells around them. Platform modules (pty, termios, fcntl, winpty) are imported
only inside the sections that need them.
"""

from __future__ import annotations

import os  # (loaded with the interpreter, as signal is: the handler below comes before the rest)
import signal


def _interrupted_while_loading(signum, frame):
    os._exit(130)  # (nothing is written yet: no state to close, no buffer to flush)


# A ctrl-c in the tenth of a second this file takes to load ends the program as one during
# a command does (130, quietly), not with a traceback of the import under way; main() takes
# it over from the end of this file on. Only where Python's own handler is on, which a
# program importing cc_lhc (a test) may have changed.
try:
    _LOADING_INTERRUPT = (signal.getsignal(signal.SIGINT) is signal.default_int_handler
                          and signal.signal(signal.SIGINT, _interrupted_while_loading))
except ValueError:  # (imported in a thread other than the main one: signals are not its own)
    _LOADING_INTERRUPT = False

import collections  # noqa: E402 - (after the handler: a ctrl-c while these load ends quietly)
import collections.abc  # noqa: E402
import datetime  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import operator  # noqa: E402 - (already loaded: collections imports it)
import re  # noqa: E402
import stat  # noqa: E402
import sys  # noqa: E402

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

# --no-session-persistence leaves no transcript: the launch runs, but outside cc-lhc's care.
MSG_PIPED_INPUT = ("input is a pipe, not a terminal: Claude takes it as the prompt and runs as a plain "
                   "child, without cc-lhc's control panel; Smart Compact, when due, runs before the "
                   "next launch")
MSG_UNGOVERNED = ("--no-session-persistence: Claude keeps no transcript, so cc-lhc cannot capture "
                  "or Smart Compact this session; it runs unmanaged, with Claude's own "
                  "compaction left on")
# --bg hands the session to Claude's own background daemon, under a session id of its own,
# after this launch has ended: nothing of cc-lhc is there to capture or compact it.
MSG_BACKGROUND = ("--bg: Claude runs this session in its own background process, beyond cc-lhc's "
                  "reach, so cc-lhc cannot capture or Smart Compact it; it runs unmanaged, with "
                  "Claude's own compaction left on (`cc-lhc --resume <id>` later captures what it wrote)")

# Claude Code subcommands: a launch naming one of these is not a session, so it is
# passed through untouched (no session id, no capture). `doctor` is ours, and Claude's
# after `--` (cc-lhc -- doctor).
CLAUDE_SUBCOMMANDS = frozenset(
    "agents attach auth auto-mode gateway import install logs mcp plugin plugins "
    "purge respawn rm setup-token stop kill ultrareview update upgrade".split()
)

# The wrapper's own subcommands. They are never forwarded to Claude.
LHC_SUBCOMMANDS = (
    "get-turns", "get-messages", "search", "backfill-labels", "rollout",
    "measure", "threads", "export", "doctor", "mod-hello", "mod-compact", "preview",
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
    """A random UUID (version 4), as text. The uuid module is not imported: it brings the
    platform module with it, 2 ms of every command's start."""
    return _uuid_text(os.urandom(16), 4)


def name_uuid(name: str) -> str:
    """The name-based UUID (version 5, as uuid.uuid5 makes it) of ``name`` in cc-lhc's
    namespace (ROLLOUT_NAMESPACE), as text."""
    import hashlib
    return _uuid_text(hashlib.sha1(ROLLOUT_NAMESPACE + name.encode("utf-8")).digest(), version=5)


def _uuid_text(raw: bytes, version: int) -> str:
    """16 bytes as a UUID of this version (its version and variant bits set), as text."""
    n = int.from_bytes(raw[:16], "big") & ~(0xF000 << 64 | 0xC000 << 48) | version << 76 | 0x8000 << 48
    h = f"{n:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


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
    # Claude Code works on UTF-16 code units: a character outside the BMP is two dashes.
    slug = re.sub(r"[^A-Za-z0-9]", lambda m: "-" * (2 if ord(m.group()) > 0xFFFF else 1), cwd)
    if len(slug) > 200:
        slug = slug[:200] + "-" + _base36(abs(_java_string_hash(cwd)))
    return slug


# A label's number is looked up in SQLite, whose integers are signed 64-bit; anything
# longer is no label at all (and Python refuses to convert over 4,300 digits anyway).
LABEL_NUMBER_MAX = (1 << 63) - 1


def label_number(digits: str, label: str) -> int:
    """The number of a tN/mN label; a usage error when no thread could hold it."""
    digits = digits.lstrip("0") or "0"  # (t0001 is t1: only the value counts)
    if len(digits) > len(str(LABEL_NUMBER_MAX)) or int(digits) > LABEL_NUMBER_MAX:
        raise usage_error(f"{shown_arg(label)} is out of range: label numbers stop at {LABEL_NUMBER_MAX:,}")
    return int(digits)


def shown_arg(text: str) -> str:
    """An argument as an error names it: quoted, and cut when it is long (a pasted output)."""
    return repr(text if len(text) <= 24 else f"{text[:12]}... ({len(text)} characters)")


class UnfitFile(OSError):
    """A path cc-lhc will not read; ``reason`` says why without repeating the path."""

    def __init__(self, path, reason: str):
        super().__init__(f"{path} {reason}")
        self.reason = reason


class NotRegularFile(UnfitFile):
    """A path naming a FIFO, device, socket or folder where cc-lhc expected a file."""


class FileTooLarge(UnfitFile):
    """A small file (config, descriptor) that is far larger than any real one."""


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO (named pipe)"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
                       (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def open_regular(path):
    """Open a file for binary reading, refusing anything that is not a regular file.

    Opening a FIFO for reading waits for a writer that may never come, and a device such
    as /dev/zero never ends; either can sit (or be linked) where cc-lhc reads a config,
    a descriptor or a transcript. O_NONBLOCK makes the open itself return at once, the
    kind is checked on the open descriptor (so no swap can slip in between), and reads
    go back to blocking for the regular file that remains. Windows has neither FIFOs
    nor the flag. Raises OSError; NotRegularFile says what the path really is.
    """
    nonblock = getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_BINARY", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, f"is a {_file_kind(mode)}, not a regular file")
        if nonblock:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small_file(path, limit: int) -> bytes:
    """All of a regular file that should be small; FileTooLarge past ``limit`` bytes."""
    with open_regular(path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(path, f"is larger than {limit:,} bytes")
    return data


class BadJson(ValueError):
    """Text that cannot be read as JSON; the message says why in a few words."""


def load_json(text):
    """json.loads for text cc-lhc did not write, failing only with BadJson.

    Python's reader raises RecursionError on deep nesting and a bare ValueError on an
    integer of more than 4,300 digits; both are ordinary bad input here, not crashes.
    """
    try:
        return json.loads(text)
    except RecursionError:
        raise BadJson("nested deeper than cc-lhc reads") from None
    except json.JSONDecodeError as e:
        raise BadJson(f"not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from None
    except UnicodeDecodeError:
        raise BadJson("not UTF-8 text") from None
    except ValueError:
        raise BadJson("holds a number with too many digits to read") from None


def json_record(raw):
    """One transcript line as a dict, or None when it is not a JSON object (skip it)."""
    try:
        rec = load_json(raw)
    except BadJson:
        return None
    return rec if isinstance(rec, dict) else None


def whole_record(raw: bytes, any_value: bool = False) -> bool:
    """Whether the bytes a file ends on without a newline are a whole record (``any_value``:
    any whole JSON value), read as capture reads a line: bytes that are not UTF-8 as U+FFFD
    (it keeps such a line, so a record holding one is no torn fragment)."""
    def whole(text) -> bool:
        try:
            value = load_json(text)
        except BadJson:
            return False
        return any_value or isinstance(value, dict)
    if whole(raw):
        return True
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return whole(raw.decode("utf-8", "replace"))


def record_time(stamp):
    """A record's timestamp as seconds since the epoch (any ISO 8601 offset, "Z" too), or
    None when it is none."""
    if not isinstance(stamp, str):
        return None
    try:
        when = datetime.datetime.fromisoformat(stamp[:-1] + "+00:00" if stamp.endswith("Z") else stamp)
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def utc_now_iso() -> str:
    return utc_iso(datetime.datetime.now(datetime.timezone.utc))


def utc_iso(when) -> str:
    """A UTC time as cc-lhc writes times: ISO 8601 to the millisecond, with "Z"."""
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


TOKENIZER_FILE_NAME = "o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"


def _program_dir() -> str:
    return os.path.dirname(os.path.abspath(__file__))


def _tokenizer_location():
    """Where this copy of cc-lhc carries the o200k_base rank file: (path, member).

    Looked up in order: $CC_LHC_TOKENIZER_FILE, a PyInstaller bundle's data folder, a
    checkout's .cache/tokenizer/, the zipapp archive (``member`` then names the file
    inside it; None for a plain file). (None, None) when there is none. Never the
    network: the tiktoken download host is not reachable for many users and must never
    be needed.
    """
    if os.environ.get("CC_LHC_TOKENIZER_FILE"):
        # Named explicitly: that file or nothing, never a silent fall-through elsewhere.
        path = os.environ["CC_LHC_TOKENIZER_FILE"]
        return (path, None) if os.path.isfile(path) else (None, None)
    candidates = []
    if getattr(sys, "_MEIPASS", None):
        candidates.append(os.path.join(sys._MEIPASS, "cc_lhc_data", TOKENIZER_FILE_NAME))
    candidates.append(os.path.join(_program_dir(), ".cache", "tokenizer", TOKENIZER_FILE_NAME))
    for path in candidates:
        if os.path.isfile(path):
            return path, None
    archive = _program_dir()
    if os.path.isfile(archive):  # running from a zipapp: __file__ is inside the archive
        return archive, "cc_lhc_data/" + TOKENIZER_FILE_NAME
    return None, None


def _read_tokenizer_bytes(path, member):
    """The bytes of a file (member None) or of a zipapp's member, as _tokenizer_location()
    names the rank file; None when there is none to read."""
    if path is None:
        return None
    if member is None:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError:
            return None
    import zipfile
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(member)
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def _tokenizer_stamp(path, member) -> str | None:
    """What identifies the rank file as it is now (path, size, mtime, inode): a rank file
    whose checksum passed under the same stamp is not read and hashed again."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return f"{path}\0{member or ''}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"


O200K_TOKENS = 199_998  # ranks 0..199,997 (the two special tokens come after them)


# o200k_base's split pattern and special tokens, as tiktoken_ext.openai_public defines them
# (a test holds the two equal). With them tiktoken's compiled core is built straight from
# its own file, without importing the tiktoken package: that import (concurrent.futures,
# logging) is about 35 ms of a first count, the core itself about 1 ms.
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
O200K_SPECIAL = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


def _tiktoken_core():
    """tiktoken's compiled core (the module tiktoken._tiktoken), loaded from the folder an
    import of tiktoken would use (the first on the path) without running the package
    itself; None when that folder does not hold it (then the package is imported as usual).
    It is registered under its own name, so a later `import tiktoken` takes this very
    module instead of initialising the extension a second time."""
    import importlib.machinery
    import importlib.util
    name = "tiktoken._tiktoken"
    if name in sys.modules:
        return sys.modules[name]
    for entry in sys.path:
        folder = os.path.join(entry or os.curdir, "tiktoken")
        if not os.path.isdir(folder):
            continue
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_tiktoken" + suffix)
            if os.path.isfile(path):
                loader = importlib.machinery.ExtensionFileLoader(name, path)
                spec = importlib.util.spec_from_file_location(name, path, loader=loader)
                module = importlib.util.module_from_spec(spec)
                loader.exec_module(module)
                sys.modules[name] = module
                return module
        return None
    return None


# A tokenizer for the texts at hand. Building tiktoken's encoder from all 200,000 ranks
# takes about 0.1 s (each rank's bytes are handed over one at a time, 0.45 us a rank) and
# cutting their bytes out of the index 0.07 s, more than counting a megabyte. For a
# one-off count (a `measure`, a rebuild before a launch) an encoder holding only the ranks the
# texts can use is built instead, and counts exactly as the whole one does: BPE only ever
# looks up byte strings inside one piece of the text, and a rank missing from the encoder
# is one no lookup of these texts could find. The ranks kept are those whose word-part
# (see below) occurs in the texts' words (cut at ASCII whitespace) as far as its byte
# grams tell: a part of 2, 3 or 4 bytes whole, a longer one by its first 4 bytes, its
# bytes 1-4 and its last 4 (some kept this way occur nowhere; none that occurs is left
# out). A rank the texts hold either has no ASCII whitespace (it lies inside a word), or is one whitespace
# byte then the start of a word (its word-part is checked), or is one of the 2,853 others
# (whitespace runs, line ends after a sign), which are always kept. For a 1 MiB
# session the encoder holds about 33,000 ranks and is built in 0.015-0.019 s, after about
# 0.05 s picking them (the index read and checked 5 ms, the words' grams 13-15 ms, the
# passes over the index and the tokens cut out 30 ms). A long-running process (a live
# session) builds the whole encoder once instead.
ASCII_WHITESPACE = b" \t\n\r\x0b\x0c"      # what bytes.split() cuts at
SUBSET_TEXT_LIMIT = 2_000_000    # characters counted at once: more hold more distinct words than the next limit
SUBSET_WORDS_LIMIT = 600_000     # bytes of distinct words (all such encoders' together), likewise
SUBSET_BUILDS = 3                # encoders built for texts at hand before the whole one is
SMALL_BATCH = 8_192              # characters: a batch this short (a view's header) is bounded apart
SMALL_BUILDS = 16                # encoders built for such short batches before the whole one is


def core_text(text: str) -> str:
    """The text as tiktoken's core counts it: lone surrogates (which it cannot take) read
    as U+FFFD, as tiktoken's own Encoding does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _gram_masks(order=sys.byteorder):
    """How a 4-gram (an int read in this byte order from four bytes) gives its first 3
    bytes, and how those 3 give their first 2, as the ints those bytes read as."""
    if order == "little":
        return (0xFFFFFF).__and__, (0xFFFF).__and__
    return (8).__rrshift__, (8).__rrshift__


def text_words(texts):
    """The texts' distinct words (their UTF-8 bytes cut at ASCII whitespace, as tiktoken's
    pieces never join two of them), or None when the texts are more than SUBSET_TEXT_LIMIT
    characters (too many for an encoder of their own to pay off)."""
    if sum(map(len, texts)) > SUBSET_TEXT_LIMIT:
        return None
    words = set()
    for text in texts:
        try:
            words.update(text.encode("utf-8").split())
        except UnicodeEncodeError:
            words.update(core_text(text).encode("utf-8").split())
    return words


def word_grams(words, limit=SUBSET_WORDS_LIMIT):
    """The byte 4-grams of these words (as ints read natively), and how many bytes the
    words are; None when they are more than ``limit`` bytes."""
    from array import array
    if array("I").itemsize != 4:
        return None
    corpus = b" ".join(words) + b"    "  # padded: a word's last bytes start a 4-gram too
    if len(corpus) > limit:
        return None
    view, grams = memoryview(corpus), set()
    for start in range(4):
        grams.update(view[start:start + (len(corpus) - start) // 4 * 4].cast("I"))
    return grams, len(corpus)


def text_grams(texts, limit=SUBSET_WORDS_LIMIT):
    """word_grams of the texts' words; None when there are too many (see both)."""
    words = text_words(texts)
    return None if words is None else word_grams(words, limit)


def parse_rank_file(data: bytes) -> dict:
    """token bytes -> rank from a rank file's bytes (tiktoken's text format: one
    "<base64 token> <rank>" line each)."""
    import base64
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _rank_order(ranks: dict):
    """The tokens in rank order, or None unless the ranks are 0..n-1 (as o200k_base's are)."""
    tokens = sorted(ranks, key=ranks.__getitem__)
    if not tokens or ranks[tokens[0]] != 0 or ranks[tokens[-1]] != len(tokens) - 1:
        return None
    return tokens


def build_vocab_index(tokens) -> tuple:
    """The ranks (tokens in rank order) filed for VocabIndex: their bytes, the ranks always
    kept, and the others in four tables by the length of their word-part (2, 3, 4, more).
    In the first three each row is its rank and its word-part read as an int, in that
    int's order (a few are looked up by bisection). The fourth is in the order of its
    word-parts' first 4 bytes and holds those 4-grams once each, where each one's run of
    rows starts, and each row's rank and the 4-grams of its bytes 1-4 and last 4. Plain
    bytes and runs of native ints, which an index file holds as they are (vocab_index_bytes)."""
    from array import array
    order = sys.byteorder
    offsets = array("I", itertools.accumulate(map(len, tokens), initial=0))
    bare = map(operator.methodcaller("translate", None, ASCII_WHITESPACE), tokens)
    always, words = array("I"), {2: ([], []), 3: ([], []), 4: ([], []), 5: ([], [])}  # n: (ranks, word-parts)
    for rank, token, kept in zip(itertools.count(), tokens, bare):
        if len(kept) == len(token):
            word = token
        elif len(kept) + 1 == len(token) and token[0] in ASCII_WHITESPACE:
            word = kept
        else:
            always.append(rank)
            continue
        if len(word) < 2:
            always.append(rank)
        else:
            ranks, parts = words[min(len(word), 5)]
            ranks.append(rank)
            parts.append(word)

    def grams(parts, cut):  # each part's bytes ``cut`` (4 of them) read as an int
        return memoryview(b"".join(map(operator.itemgetter(cut), parts))).cast("I").tolist()
    tables = []
    for n, (ranks, parts) in words.items():
        first = [int.from_bytes(w, order) for w in parts] if n < 4 else grams(parts, slice(0, 4))
        rows = sorted(range(len(ranks)), key=first.__getitem__)

        def in_order(column):  # (the rows sorted by their first bytes)
            return array("I", map(column.__getitem__, rows)).tobytes()
        if n < 5:
            tables.append([in_order(first), in_order(ranks)])
            continue
        keys, starts = array("I"), array("I")
        for at, row in enumerate(rows):
            if not keys or first[row] != keys[-1]:
                keys.append(first[row])
                starts.append(at)
        starts.append(len(rows))
        tables.append([keys.tobytes(), starts.tobytes(), in_order(ranks),
                       in_order(grams(parts, slice(1, 5))), in_order(grams(parts, slice(-4, None)))])
    return (order, len(tokens), b"".join(tokens), offsets.tobytes(), always.tobytes(), tables)


class VocabIndex:
    """build_vocab_index's tables, ready to pick the ranks some texts can use."""

    def __init__(self, data):
        def arr(raw):
            return memoryview(raw).cast("I")  # (read in place: no copy of its 5 MB)
        order, self.size, self.blob, offsets, always, groups = data
        if order != sys.byteorder:
            raise ValueError("index made on a machine of the other byte order")
        self.offsets, self.always = arr(offsets), arr(always)
        self.ends = self.offsets[1:]
        self._always = None  # token bytes -> rank of the ranks always kept, once cut out
        groups = [[arr(raw) for raw in group] for group in groups]
        if [len(group) for group in groups] != [2, 2, 2, 5]:
            raise ValueError("index of another layout")
        self.short, (keys, starts, *self.long) = groups[:3], groups[3]
        self.keys, self.starts, self.run_ends = keys, starts, starts[1:]
        if (len(self.offsets) != self.size + 1 or self.offsets[-1] != len(self.blob)
                or len(starts) != len(keys) + 1 or starts[-1] != len(self.long[0])):
            raise ValueError("index does not match its ranks")

    @staticmethod
    def _rows(keys, present) -> list:
        """Where in ``keys`` (sorted) the ints in ``present`` are."""
        if len(present) * 16 < len(keys):  # a short text: its grams looked up
            import bisect
            rows = []
            for key in present:
                rows.extend(range(bisect.bisect_left(keys, key), bisect.bisect_right(keys, key)))
            return rows
        return list(itertools.compress(range(len(keys)), map(present.__contains__, keys)))

    def ranks_for(self, grams) -> dict:
        """token bytes -> rank for every rank texts with these 4-grams can hold."""
        return self._pick(grams)

    def number_ranks(self) -> dict:
        """token bytes -> rank for every rank a number up to three digits can use (o200k
        cuts digits in threes), and the ranks always kept."""
        return self._pick(text_grams([" ".join(map(str, range(1000)))])[0])

    def _pick(self, grams) -> dict:
        three, two = _gram_masks()  # (two: of a 3-gram)
        threes = set(map(three, grams))
        picked = []
        for (words, ranks), present in zip(self.short, (set(map(two, threes)), threes, grams)):
            picked.extend(map(ranks.__getitem__, self._rows(words, present)))
        runs = self._rows(self.keys, grams)  # the longer ones: their first 4 bytes, then the rest
        if runs:
            at = operator.itemgetter(*runs) if len(runs) > 1 else lambda column: (column[runs[0]],)
            rows = list(itertools.chain.from_iterable(map(range, at(self.starts), at(self.run_ends))))
            ranks, *more = self.long
            for column in more:
                rows = list(itertools.compress(rows, map(grams.__contains__, map(column.__getitem__, rows))))
            picked.extend(map(ranks.__getitem__, rows))
        if self._always is None:  # (the same 2,853 for every encoder this process builds)
            self._always = dict(zip(self._tokens(self.always), self.always))
        chosen = self._always.copy()
        chosen.update(zip(self._tokens(picked), picked))
        return chosen

    def _tokens(self, ranks):
        """The bytes of each of these ranks, in turn."""
        if not ranks:
            return iter(())
        at = operator.itemgetter(*ranks) if len(ranks) > 1 else lambda column: (column[ranks[0]],)
        return map(self.blob.__getitem__, map(slice, at(self.offsets), at(self.ends)))

    def ranks(self) -> dict:
        """token bytes -> rank for every rank (the whole encoder's)."""
        return dict(zip(self._tokens(range(self.size)), range(self.size)))


# The index is the rank file in a form read in a moment: the tokens' bytes and the tables
# above, each a run of native ints, about 4.6 MB in all. The build writes it beside the rank
# file (a checkout's .cache/tokenizer/, the bundle's data folder, the zipapp), so no copy
# of cc-lhc parses the rank file's 200,000 base64 lines (0.15 s) or makes the index itself
# (0.36 s); beside a rank file that has none (one named by CC_LHC_TOKENIZER_FILE) it is made
# once and kept in the state folder. The file: the magic line, the SHA-256 of the rest, a
# JSON line giving the byte order and each section's length, the sections. One that fails
# the hash, or holds other tokens than o200k_base's, is never used.
VOCAB_INDEX_MAGIC = b"cc-lhc vocab index 6\n"
VOCAB_INDEX_FILE_NAME = "o200k_base.index"
# tokens_digest of o200k_base's ranks: an index of any other tokens is never used, whoever made it.
O200K_TOKENS_SHA256 = "46b83cda257f90fb412a2dae27add88dcc92d859fe7f46753a023b473cec6590"


def vocab_index_bytes(data) -> bytes:
    """build_vocab_index's tables as an index file holds them."""
    import hashlib
    order, size, blob, offsets, always, tables = data
    sections = [blob, offsets, always] + [raw for table in tables for raw in table]
    head = json.dumps({"order": order, "size": size,
                       "columns": [len(table) for table in tables],
                       "sections": [len(raw) for raw in sections]}).encode()
    body = head + b"\n" + b"".join(sections)
    return VOCAB_INDEX_MAGIC + hashlib.sha256(body).hexdigest().encode() + b"\n" + body


def parse_vocab_index(raw):
    """The tables in an index file's bytes (read in place, not copied), or None when they
    are not sound: torn or altered (its own hash), another layout, or not o200k_base's
    ranks (their bytes and bounds against O200K_TOKENS_SHA256)."""
    import hashlib
    start = len(VOCAB_INDEX_MAGIC) + 65
    if not raw or raw[:start - 65] != VOCAB_INDEX_MAGIC or raw[start - 1:start] != b"\n":
        return None
    view = memoryview(raw)
    if raw[start - 65:start - 1] != hashlib.sha256(view[start:]).hexdigest().encode():
        return None
    end = raw.find(b"\n", start)
    try:
        head = json.loads(raw[start:end])
        sizes, columns = head["sections"], head["columns"]
        if len(sizes) != 3 + sum(columns) or end + 1 + sum(sizes) != len(raw):
            return None
        sections = []
        at = end + 1
        for n in sizes:
            sections.append(view[at:at + n])
            at += n
        tables, at = [], 3
        for n in columns:
            tables.append(sections[at:at + n])
            at += n
        if (head["size"] != O200K_TOKENS
                or tokens_digest(sections[0], sections[1], head["order"]) != O200K_TOKENS_SHA256):
            return None
        return (head["order"], head["size"], bytes(sections[0]), sections[1], sections[2], tables)
    except (ValueError, KeyError, TypeError):
        return None


def tokens_digest(blob, offsets, order) -> str:
    """The SHA-256 of the tokens' bytes in rank order and their bounds (little-endian
    uint32s), whichever byte order the index was made in."""
    import hashlib
    from array import array
    bounds = array("I")
    if bounds.itemsize != 4:
        return ""
    bounds.frombytes(offsets)
    if order != "little":
        bounds.byteswap()
    digest = hashlib.sha256(blob)
    digest.update(bounds)
    return digest.hexdigest()


def _index_of(raw):
    """The VocabIndex an index file's bytes hold, or None."""
    data = parse_vocab_index(raw)
    try:
        return VocabIndex(data) if data else None
    except (ValueError, TypeError):  # (made on a machine of the other byte order)
        return None


def _index_beside_ranks():
    """(path, member) of the index the build put beside the rank file, as
    _tokenizer_location() gives that file's; (None, None) without a rank file."""
    path, member = _tokenizer_location()
    if path is None:
        return None, None
    if member is not None:
        return path, member.rpartition("/")[0] + "/" + VOCAB_INDEX_FILE_NAME
    return os.path.join(os.path.dirname(path), VOCAB_INDEX_FILE_NAME), None


def _kept_index_path() -> str:
    return StateHome().path("cache", f"o200k_base-{O200K_SHA256[:16]}-index6-{sys.byteorder}.bin")


def _write_cache_file(path: str, data: bytes) -> bool:
    """Write a file into the state folder's cache (atomically, privately); whether it was
    written. A folder that cannot take it is no error, and no reason to create the state
    folder (doctor reports that one missing)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    home = StateHome()
    if not os.path.isdir(home.root):
        return False
    try:
        home.ensure("cache")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def load_vocab_index(ranks_source):
    """The VocabIndex beside the rank file, else the one kept in the state folder, else one
    made from the ranks (``ranks_source()``, a dict or None) and kept there. None when it
    cannot be had, or kept: making it (0.36 s) only pays off once the next process finds it."""
    index = _index_of(_read_tokenizer_bytes(*_index_beside_ranks()))
    if index is None:
        index = _index_of(_read_tokenizer_bytes(_kept_index_path(), None))
    cache = os.path.dirname(_kept_index_path())
    if index is None and os.path.isdir(StateHome().root) and (
            not os.path.isdir(cache) or os.access(cache, os.W_OK | os.X_OK)):
        ranks = ranks_source()
        tokens = _rank_order(ranks) if ranks else None
        raw = vocab_index_bytes(build_vocab_index(tokens)) if tokens is not None else None
        if raw is not None and _write_cache_file(_kept_index_path(), raw):
            index = _index_of(raw)
    return index


# Counts already made are kept in the state folder by a hash of the text (never the text
# itself), so a text is counted once: a second `measure` of a session, or a rebuild of a
# thread whose older messages were counted before, needs no tokenizer at all. Building
# tiktoken's table (0.12 s) is most of what a cold count costs; a lookup is microseconds.
# The file is a cache: one that cannot be opened or read is set aside and counting goes on.
COUNTS_CACHE_ROWS = 500_000   # about 28 MB; the oldest half goes when it is full
COUNTS_MIGRATIONS = [
    ("counts", "CREATE TABLE counts (k BLOB PRIMARY KEY, n INTEGER NOT NULL);\n"
               "CREATE TABLE verified (stamp TEXT PRIMARY KEY)"),
]


def text_key(text: str) -> bytes:
    """What the counts cache files a text under: 16 bytes of its BLAKE2b hash."""
    import hashlib
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _is_o200k(data: bytes) -> bool:
    import hashlib
    return hashlib.sha256(data).hexdigest() == O200K_SHA256


class CountsCache:
    """Exact o200k_base counts by text_key, in cache/o200k-counts-<sha>.sqlite."""

    def __init__(self, home=None):
        self.home = home or StateHome()
        self.path = self.home.path("cache", f"o200k-counts-{O200K_SHA256[:16]}.sqlite")
        self._db = None
        self._failed = False
        self._renamed = False

    def _open(self):
        if self._db is None and not self._failed:
            self._db = self._connect()
            if self._db is None and self._renamed:
                self._db = self._connect()  # the damaged file is out of the way: a new one
            self._failed = self._db is None
        return self._db

    def _connect(self):
        import sqlite3
        if not os.path.isdir(self.home.root):
            return None  # a cache is no reason to create the state folder
        try:
            self.home.ensure("cache")
            return open_db(self.path, COUNTS_MIGRATIONS, busy_ms=500)
        except SchemaTooNew:
            return None  # a newer cc-lhc's layout: left to it
        except LhcError as e:
            self._set_aside(e.__cause__)
        except (OSError, sqlite3.Error):
            pass
        return None

    def _set_aside(self, why) -> None:
        """A cache that fails is not used again by this process; a damaged file (not a busy
        one) is renamed out of the way, once, so the next use starts a new one."""
        import sqlite3
        self._failed = True
        if self._db is not None:
            try:
                self._db.close()
            except sqlite3.Error:
                pass
            self._db = None
        damaged = isinstance(why, sqlite3.DatabaseError) and not isinstance(why, sqlite3.OperationalError)
        if not damaged or self._renamed:
            return  # busy, locked or full: the file is sound
        try:
            os.replace(self.path, f"{self.path}.unreadable-{os.getpid()}")
            for tail in ("-wal", "-shm"):
                if os.path.exists(self.path + tail):
                    os.unlink(self.path + tail)
            self._renamed = True
        except OSError:
            pass

    def _use(self, work, otherwise):
        """work(db) on the open cache; when it fails, the cache is set aside and the
        answer is ``otherwise``: a cache never fails the count it serves."""
        import sqlite3
        db = self._open()
        if db is None:
            return otherwise
        try:
            return work(db)
        except sqlite3.Error as e:
            self._set_aside(e)
            return otherwise

    def get(self, keys) -> dict:
        """key -> count for the keys the cache holds."""
        keys = list(keys)

        def read(db):
            found = {}
            for i in range(0, len(keys), 500):
                part = keys[i:i + 500]
                found.update(db.execute(f"SELECT k, n FROM counts WHERE k IN ({','.join('?' * len(part))})",
                                        part))
            return found
        return self._use(read, {}) if keys else {}

    def put(self, counted: dict) -> None:
        def write(db):
            with Tx(db):
                insert_rows(db, "INSERT OR IGNORE INTO counts", 2, list(counted.items()))
                low, high = db.execute("SELECT min(rowid), max(rowid) FROM counts").fetchone()
                if high - low >= COUNTS_CACHE_ROWS:
                    db.execute("DELETE FROM counts WHERE rowid < ?", (high - COUNTS_CACHE_ROWS // 2,))
        if counted:
            self._use(write, None)

    def verified(self, stamp) -> bool:
        """Whether a rank file under this stamp passed its checksum before."""
        return stamp is not None and self._use(
            lambda db: db.execute("SELECT 1 FROM verified WHERE stamp = ?", (stamp,)).fetchone() is not None,
            False)

    def note_verified(self, stamp) -> None:
        if stamp is not None:
            self._use(lambda db: db.execute("INSERT OR IGNORE INTO verified VALUES (?)", (stamp,)), None)

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None


# A text longer than this is counted a piece at a time: the core hands back a list of its
# tokens, 36 bytes of Python objects each (a 12 MB prompt's made 100 MB for a count).
COUNT_PIECE_CHARS = 1 << 20
# Where a long text is cut: after a line end that a letter follows, or between two words
# (a letter, then a space and a letter). No piece of o200k's pattern holds a letter after a
# line end (those that hold one end in white space, or in slashes after punctuation), and a
# piece of letters ends at the space, which begins the next word's piece: so the pieces,
# and their tokens, are those of the whole text (a test holds them equal).
COUNT_CUT = re.compile(r"\n(?=[A-Za-z])|(?<=[A-Za-z])(?= [A-Za-z])")


def _token_count(core, text: str) -> int:
    """o200k_base's count of one text, as tiktoken's Encoding.encode_ordinary makes it: a
    text holding lone surrogates (which the core cannot take) is counted as tiktoken counts
    it, each one read as U+FFFD. A long one is counted in parts (COUNT_CUT)."""
    try:
        return sum(len(core.encode_ordinary(part)) for part in _count_parts(text))
    except UnicodeEncodeError:
        return sum(len(core.encode_ordinary(part)) for part in _count_parts(core_text(text)))


def _count_parts(text: str):
    """The text in parts of about COUNT_PIECE_CHARS, cut where COUNT_CUT allows (a part
    with no such place in it stays whole)."""
    start, n = 0, len(text)
    while n - start > COUNT_PIECE_CHARS:
        cut = COUNT_CUT.search(text, start + COUNT_PIECE_CHARS)
        if cut is None:
            break
        yield text[start:cut.end()]
        start = cut.end()
    yield text[start:] if start else text


def _token_counts(core, texts, threads: int = 4) -> list:
    """_token_count of each text, on up to ``threads`` threads: the core lets go of the GIL
    while it encodes, so the cores share a large batch. A failure is raised here."""
    threads = min(threads, len(texts), os.cpu_count() or 1)
    if threads < 2:
        return [_token_count(core, t) for t in texts]
    import threading
    out, failed = [0] * len(texts), []

    def work(first):
        try:
            for i in range(first, len(texts), threads):
                out[i] = _token_count(core, texts[i])
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            failed.append(e)
    workers = [threading.Thread(target=work, args=(k,), name="cc-lhc-count") for k in range(1, threads)]
    for w in workers:
        w.start()
    work(0)
    for w in workers:
        w.join()
    if failed:
        raise failed[0]
    return out


class TokenCounter:
    """Counts tokens with tiktoken's o200k_base when it can, a safe estimate otherwise.

    ``exact`` says which: every figure cc-lhc shows carries that label, because an
    approximate count must never pass for an exact one. Whether exact counts can be
    made is settled cheaply (the rank file's checksum, tiktoken's presence); the
    tokenizer itself is built only for a text no earlier count has seen (CountsCache).
    """

    def __init__(self):
        self._encoding = None
        self._checked = False
        self._loaded = False
        self._ranks_data = None  # the rank file's bytes, when _check read them
        self._parsed = None  # the rank file parsed, when no index was to be had
        self._small_builds = 0  # encoders built for short batches (see SMALL_BATCH)
        self._where = (None, None)
        self.exact = False
        self.reason = "not loaded yet"
        self._memo = {}    # text_key -> count, this process
        self._fresh = {}   # counted here and not yet in the cache
        self.cache = None  # CountsCache, once exact counts are possible
        import threading
        self._lock = threading.RLock()  # the host builds the encoder on a thread of its own
        self._cache_lock = threading.Lock()  # the cache's connection, one thread at a time
        self._saver = None
        self._atexit = False
        self._ahead = None  # texts waiting for count_ahead's thread
        self.ahead_error = None  # count_ahead's last failure (it goes on; the session's end logs it)
        self._whole_wanted = False  # a process that counts for long builds the whole encoder
        # (encoder, the words it covers, their bytes, its tokens) built for texts at hand
        self._for_texts = []
        self._index = None  # VocabIndex, once loaded (False: it cannot be had)
        self._numbers = None  # _number_ranks, once picked

    def usable(self) -> bool:
        """Whether counts are exact, settled without building the tokenizer."""
        if not self._checked:
            with self._lock:  # the host's warm-up thread may be settling it right now
                if not self._checked:
                    try:
                        self._check()
                    finally:
                        self._checked = True
        return self.exact

    def _check(self):
        path, member = _tokenizer_location()
        data = None  # the rank file's bytes, when its checksum was checked now
        if path is None:
            self.reason = "o200k_base data not found (counts are approximate)"
            return
        self.cache = CountsCache()
        stamp = _tokenizer_stamp(path, member)
        if not self.cache.verified(stamp):
            data = _read_tokenizer_bytes(path, member)
            if data is None:
                self.reason = "o200k_base data not found (counts are approximate)"
                return
            if not _is_o200k(data):
                self.reason = f"o200k_base data at {path} failed its checksum (counts are approximate)"
                return
            self._ranks_data = data
        import importlib.util
        try:
            found = importlib.util.find_spec("tiktoken") is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            self.reason = "tiktoken is not installed (counts are approximate)"
            return
        if data is not None:
            self.cache.note_verified(stamp)
        self._where = (path, member)
        self.exact = True
        self.reason = f"o200k_base from {path}"

    def _core(self):
        """tiktoken's compiled core; None (counts become estimates) when it cannot be imported."""
        try:
            core = _tiktoken_core()
            if core is None:
                from tiktoken import _tiktoken as core
            return core
        except ImportError as e:
            self.exact = False
            self.reason = f"tiktoken could not be imported ({e}; counts are approximate)"
            return None

    def _ranks(self):
        """o200k_base's ranks (token bytes -> rank), from the vocabulary index (see
        load_vocab_index) or parsed from the rank file; None when that file changed under
        us (counts become estimates)."""
        return self._index.ranks() if self._vocab_index() else self._parsed_ranks()

    def _parsed_ranks(self):
        """The rank file parsed (kept until an encoder is built from it), its hash checked
        again unless _check just did; None when it changed under us."""
        if self._parsed is None:
            data, self._ranks_data = self._ranks_data, None
            if data is None:
                data = _read_tokenizer_bytes(*self._where)
            if data is None or not _is_o200k(data):
                self.exact = False
                self.reason = f"o200k_base data at {self._where[0]} changed while in use (counts are approximate)"
                return None
            self._parsed = parse_rank_file(data)
        return self._parsed

    def _load(self):
        """Build tiktoken's encoder (once); a failure leaves every later count an estimate."""
        self._loaded = True
        if not self.usable():
            return
        core = self._core()
        ranks = self._ranks() if core is not None else None
        if ranks is not None:
            # (tiktoken's own o200k_base() would download the ranks)
            self._encoding = core.CoreBPE(ranks, O200K_SPECIAL, O200K_PATTERN)
        self._ranks_data = self._parsed = None

    def encoding(self):
        """tiktoken's o200k_base encoder (its core: encode_ordinary and the rest), built now
        if it was not; None without the tokenizer. Counting from here on uses it."""
        self._whole_wanted = True
        with self._lock:
            if not self._loaded and self.usable():
                self._load()
        return self._encoding

    def _encoder_for(self, texts):
        """What to count these texts with: the whole encoder once it is built or wanted,
        else one holding only the ranks they can use (see VocabIndex), kept for later
        texts it covers. The whole one is built when that cannot be had, or once such
        encoders would be more than SUBSET_BUILDS, or built for more than
        SUBSET_WORDS_LIMIT bytes of words: many different batches are a long count, for
        which the whole one costs less. A short batch (SMALL_BATCH: a view's header, a
        note, a few of which one count holds, each a little different) is bounded apart,
        by SMALL_BUILDS."""
        with self._lock:
            if self._whole_wanted or self._loaded:
                return self.encoding()
            words = text_words(texts)
            if words is None:
                return self.encoding()
            for encoder, covered, _size, _tokens in self._for_texts:
                if words <= covered:
                    return encoder
            if self._for_texts and self._vocab_index():
                # A batch of words mostly seen (a view's header again, with other label
                # numbers and paths) needs no encoder of its own when one built before holds
                # every rank its new words can use: looking those up is a fraction of
                # looking up all of its words.
                encoder, covered, _size, tokens = min(self._for_texts, key=lambda e: len(words - e[1]))
                new = words - covered
                if sum(map(len, new)) <= SMALL_BATCH:
                    found = word_grams(new)
                    if found is not None and self._index.ranks_for(found[0]).keys() <= tokens:
                        return encoder
            found = word_grams(words)
            if found is None:
                return self.encoding()
            grams, size = found
            small = sum(map(len, texts)) <= SMALL_BATCH
            if (self._small_builds >= SMALL_BUILDS if small else
                    len(self._for_texts) - self._small_builds >= SUBSET_BUILDS
                    or size + sum(n for _e, _w, n, _t in self._for_texts) > SUBSET_WORDS_LIMIT):
                return self.encoding()
            core = self._core() if self._vocab_index() else None
            if core is None:  # (encoding() then builds the whole one, or says why it cannot)
                return self.encoding()
            ranks = self._index.ranks_for(grams)
            if small:  # (with every number's ranks: the next header differs in its numbers)
                ranks = {**self._number_ranks(), **ranks}
            encoder = core.CoreBPE(ranks, O200K_SPECIAL, O200K_PATTERN)
            self._small_builds += small
            self._for_texts.append((encoder, words, size, ranks.keys()))
            return encoder

    def _number_ranks(self) -> dict:
        """VocabIndex.number_ranks, once a process."""
        if self._numbers is None:
            self._numbers = self._index.number_ranks()
        return self._numbers

    def _vocab_index(self) -> bool:
        """Whether the vocabulary index is at hand (loaded now if it was not)."""
        if self._index is None:
            self._index = load_vocab_index(self._parsed_ranks) or False
            if self._index:  # (else the whole encoder is built from them next)
                self._ranks_data = self._parsed = None  # (read for the checksum, parsed for the index)
        return bool(self._index)

    def count(self, text: str) -> int:
        """One text's tokens; without the tokenizer, bytes/4 (labelled approximate)."""
        if not self.usable():
            return estimate_tokens(text)
        return self.count_many([text])[0]

    def count_many(self, texts) -> list:
        """Counts of many texts: known ones looked up, the rest counted in one batch.
        Without the tokenizer, safe estimates (never under o200k_base's count)."""
        if not self.usable():
            return [safe_estimate(t) for t in texts]
        keys = [text_key(t) if t else b"" for t in texts]
        memo = self._memo
        wanted = {k for k in keys if k and k not in memo}
        if wanted:
            with self._cache_lock:
                memo.update(self.cache.get(wanted))
        todo = {}
        for k, t in zip(keys, texts):
            if k and k not in memo and k not in todo:
                todo[k] = t
        if todo:
            enc = self._encoder_for(list(todo.values()))
            if enc is None:  # tiktoken failed to load after all: estimates from here on
                return [0 if not t else memo.get(k) or safe_estimate(t) for k, t in zip(keys, texts)]
            for k, n in zip(todo, _token_counts(enc, list(todo.values()))):
                memo[k] = self._fresh[k] = n
            if len(self._fresh) >= 5000:
                self.save()
        return [memo[k] if k else 0 for k in keys]

    def save(self) -> None:
        """Keep the counts made since the last save for later processes."""
        with self._cache_lock:
            if self._fresh and self.cache is not None:
                fresh, self._fresh = self._fresh, {}
                # one C call, so a count added meanwhile on another thread cannot break the
                # write (it is then only left out of it)
                self.cache.put(dict(list(fresh.items())))

    def save_later(self) -> None:
        """save() on a thread of its own: a view built at a seam does not wait for the write.
        The process waits for it (briefly) before it exits."""
        if not self._fresh or self.cache is None:
            return
        import atexit
        import threading
        if self._saver is not None and self._saver.is_alive():
            return  # the running save takes these too, or the next one will
        self._saver = threading.Thread(target=self.save, name="cc-lhc-counts", daemon=True)
        self._saver.start()
        if not self._atexit:
            self._atexit = True
            atexit.register(lambda: self._saver is not None and self._saver.join(timeout=5))

    AHEAD_BATCH = 2000  # texts counted together by count_ahead's thread

    def count_ahead(self, texts) -> None:
        """Count texts later, on a thread of its own at low priority, so that a view built
        at a seam finds them counted: the live host hands over what it captures. The
        counts are kept like any others (saved when the thread runs out of work, and at
        exit; a session's end waits for it, see finish_counting_ahead). Nothing is done
        when counts cannot be exact."""
        texts = [t for t in texts if t]
        if not texts or not self.usable():
            return
        self._whole_wanted = True  # counting for as long as the session runs
        with self._lock:
            if self._ahead is None:
                import atexit
                import queue
                import threading
                self._ahead = queue.Queue()
                threading.Thread(target=self._count_ahead, name="cc-lhc-count-ahead", daemon=True).start()
                atexit.register(self.save)
        self._ahead.put(texts)

    def _count_ahead(self) -> None:
        import queue
        lower_thread_priority()
        while True:
            texts, taken = self._ahead.get(), 1
            while len(texts) < self.AHEAD_BATCH:  # a catch-up hands over many batches at once
                try:
                    texts, taken = texts + self._ahead.get_nowait(), taken + 1
                except queue.Empty:
                    break
            try:
                self.count_many(texts)
                if self._ahead.empty():
                    self.save()
            except Exception as e:  # only ever a head start: the view counts what is missing
                self.ahead_error = e
            for _ in range(taken):
                self._ahead.task_done()

    def drain_ahead(self, timeout: float) -> bool:
        """Wait up to timeout seconds for count_ahead's work to be done; whether it is."""
        import time
        deadline = time.monotonic() + timeout
        while self._ahead is not None and self._ahead.unfinished_tasks:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True


def lower_thread_priority() -> None:
    """Give the calling thread alone a nice value of 10, where threads have their own
    (Linux); elsewhere it runs as it is."""
    if sys.platform.startswith("linux"):
        import threading
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (OSError, AttributeError):
            pass


def view_text(row) -> str:
    """What a view shows of a captured message row, verbatim (shown_text of the row as
    message_row reads it back from the store)."""
    return row.text or (full_block_json(row.text, row.data) if row.data else "") or ""


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
    "thinkingReplay": "signed_verbatim",
    # A person's own /compact runs through the cc-lhc mod's hook as a Smart Compact; true
    # leaves it to Claude's own summary.
    "nativeCompact": False,
}
PROFILES = ("default", "balanced", "historical")
# The thinking replay arms of a rebuilt session (section 6): replay signed thinking
# blocks exactly as recorded, or leave all thinking out.
THINKING_ARMS = ("signed_verbatim", "omit")
_TOKEN_FIELDS = ("lowerBoundTokens", "upperBoundTokens", "pruneThresholdTokens",
                 "pruneTargetTokens", "minRunwayTokens")
# Every token field lies in this range. Small values are allowed (they rebuild early and
# often, which tests and demos rely on); a value no context can ever reach would leave
# Smart Compact armed but never firing, so past ten times a 1M window it is malformed.
TOKEN_FIELD_MIN, TOKEN_FIELD_MAX = 1, 10_000_000
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


def describe_target(policy) -> str:
    """The target as a person reads it, with the budget views are built to when the
    runway keeps that below the target: "80,000 (50,000 in effect: the trigger less the
    runway)"."""
    target, effective = policy["lowerBoundTokens"], policy.effective_target
    if effective >= target:
        return f"{target:,}"
    return f"{target:,} ({effective:,} in effect: the trigger less the runway)"


def token_count_problem(value):
    """Why a value is not a usable token count (a whole number in range), or None."""
    if isinstance(value, bool) or not isinstance(value, int) \
            or not TOKEN_FIELD_MIN <= value <= TOKEN_FIELD_MAX:
        return (f"expected a positive whole number of tokens up to {TOKEN_FIELD_MAX:,}, "
                f"got {_shown_value(value)}")
    return None


def _shown_value(value) -> str:
    """A bad value as the fallback line names it: JSON, cut short when it is long."""
    try:
        text = json.dumps(value)
    except ValueError:  # an integer too long for Python to print
        return "a number with too many digits"
    return text if len(text) <= 40 else f"{text[:30]}... ({len(text)} characters)"


def _check_field(name, value):
    """Return an error sentence for a bad value, or None."""
    if name in _TOKEN_FIELDS:
        return token_count_problem(value)
    elif name == "profile":
        if value not in PROFILES:
            return f"expected one of {', '.join(PROFILES)}, got {_shown_value(value)}"
    elif name in ("pruneEnabled", "nativeCompact"):
        if not isinstance(value, bool):
            return f"expected true or false, got {_shown_value(value)}"
    elif name == "thinkingReplay":
        if value not in THINKING_ARMS:
            return f"expected one of {', '.join(THINKING_ARMS)}, got {_shown_value(value)}"
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
                shown = name if len(name) <= 40 else f"{name[:30]}... ({len(name)} characters)"
                problems.append(f"{shown} from {source}: unknown field")
                continue
            why = _check_field(name, value)
            if why:
                # The builtin value, not a lower layer's: what the layer meant to change
                # is unknown, and a value set below it is not what this layer asked for.
                problems.append(f"{name} from {source}: {why}")
                values[name], sources[name] = BUILTIN_POLICY[name], "builtin"
                continue
            values[name] = value
            sources[name] = source
    broken = True
    while broken:  # a pair put back to builtin can break one checked before it
        broken = False
        for low, high, why in _COHERENT_PAIRS:
            if values[low] >= values[high]:
                problems.append(f"{low} ({values[low]} from {sources[low]}) and {high} "
                                f"({values[high]} from {sources[high]}): {why}")
                for name in (low, high):
                    values[name] = BUILTIN_POLICY[name]
                    sources[name] = "builtin"
                broken = True
    # (a field name or value comes from a file anyone may have put in a project: its control
    # characters are written as escapes wherever a problem is shown, never sent to a terminal)
    return Policy(values, sources, [escape_controls(problem) for problem in problems])


def user_config_path(env=None) -> str:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME", "")
    if not os.path.isabs(base):  # (a relative one is to be ignored, as the XDG base directory rules say)
        base = os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "cc-lhc", "config.json")


def config_file_there(path: str) -> bool:
    """Whether a config file is (or may be) at path: one in a folder that cannot be looked
    into is reported as unreadable, never skipped as if there were none (lexists says no)."""
    try:
        os.lstat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError:
        return True


def project_config_path(cwd: str):
    """The nearest .cc-lhc.json at or above cwd, or None."""
    here = os.path.abspath(cwd)
    while True:
        candidate = os.path.join(here, ".cc-lhc.json")
        if config_file_there(candidate):  # a folder or dangling link here is reported, not skipped
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            return None
        here = parent


CONFIG_FILE_LIMIT = 1 << 20  # a real config is a few hundred bytes


def _read_config_file(path):
    try:
        text = read_small_file(path, CONFIG_FILE_LIMIT).decode("utf-8-sig")  # editors on Windows add a BOM
    except UnfitFile as e:
        return LhcError(f"cannot read the file: it {e.reason}")
    except (OSError, UnicodeDecodeError) as e:
        return LhcError(f"cannot read the file ({e.__class__.__name__}: {e})")
    try:
        return load_json(text)
    except BadJson as e:
        return LhcError(str(e))


def load_policy(cwd: str, flag_values: dict) -> Policy:
    layers = []
    user = user_config_path()
    if config_file_there(user):
        layers.append((user, _read_config_file(user)))
    project = project_config_path(cwd)
    if project:
        layers.append((project, _read_config_file(project)))
    for name, (flag, value) in flag_values.items():
        layers.append((f"launch flag {flag}", {name: value}))
    return resolve_policy(layers)


# == 4. Rollout parsing (pure): transcript line -> canonical records ============

# Bumped whenever the mapping from transcript lines to canonical records changes;
# every source row records the version that read it.
PARSER_VERSION = 5  # 3: local commands are turns of their own (COMMAND_TURN); 4: queued prompts;
# 5: messages Claude took from its queue mid-turn (queue-operation remove)

# Record types Claude Code writes for its own bookkeeping. They are counted, never
# parsed into the record, and never an error. Unknown types are treated the same way.
BOOKKEEPING_TYPES = frozenset((
    "queue-operation", "atis-latch", "api-request-shape", "api-request-blob", "api-request",
    "tools-used", "last-prompt", "mode", "permission-mode", "cost-state",
    "file-history-snapshot", "summary", "custom-title", "tag",
))
TERMINAL_STOP_REASONS = frozenset(("end_turn", "stop_sequence", "max_tokens", "refusal",
                                   "pause_turn", "model_context_window_exceeded"))
# System records Claude Code writes once a turn is over. Versions that wrote a response's
# records before its stream ended (2.1.39 and earlier) leave stop_reason null on every one
# of them, so these are the only end-of-turn evidence they give.
TURN_END_SUBTYPES = frozenset(("turn_duration", "stop_hook_summary"))
# A -p run also ends on records of Claude Code's own, not on an answer: an attachment when
# --max-turns stops it (after the last call's result), and the result of the tool a
# --json-schema run answers with. The turn is over there, as after a final answer.
MAX_TURNS_REACHED = "max_turns_reached"
RUN_ENDING_TOOLS = frozenset(("StructuredOutput",))
# A tool output too large for the transcript: Claude Code (2.1.2 and later) writes it whole
# to <session>/tool-results/<name>.txt and puts only a preview in the tool result (its
# toolUseResult names the file; older ones only say so in the preview's first lines). The
# file is captured as a message of its own right after the result (SAVED_OUTPUT), with the
# file's bytes: export, get-messages and search reach it, and Claude's cleanup of old
# sessions cannot take it. The model only ever saw the preview, so views leave it out.
SAVED_OUTPUT = "saved_output"
SAVED_OUTPUT_FOLDER = "tool-results"
SAVED_OUTPUT_MAX_BYTES = 64 << 20
SAVED_OUTPUT_PREVIEW = re.compile(r"<persisted-output>\n[^\n]*Full output saved to: ([^\n]+?)\s*\n")
# Tools whose call starts an agent that writes its own records (a sidechain).
AGENT_TOOLS = ("Agent", "Task")
# A slash command Claude Code runs itself (/compact, /model, /context, ...) asks the model
# nothing. 2.1.328 writes /compact as a caveat (an isMeta user record), the command as a
# user record and its output as a user record (compacted) or a system/local_command record
# (not compacted); most other commands only as system/local_command records, which open no
# turn, /context then adds its output for the model as an isMeta user record. Written as
# user records, a command is a turn of its own, of kind "command", settled once its output
# is written, so the seam after it is still a settled one. A command that is a prompt (a
# skill, a custom command) writes no output: the model answers it and its turn ends as any
# other.
LOCAL_COMMAND_CAVEAT = "<local-command-caveat>"
LOCAL_COMMAND_NAME = "<command-name>"
LOCAL_COMMAND_OUTPUT = ("<local-command-stdout>", "<local-command-stderr>")
COMMAND_TURN = "command"
# 2.1.328 writes a record for the model to read with the next prompt (isMeta, turnCompanion:
# which tools ran before a background agent's summary) just before that prompt, which is
# often a <task-notification>: with no turn open, it opens one the prompt then joins, so
# the two are one turn, as they are one request.
COMPANION_TURN = "companion"
# How the turn of Claude's own compaction summary ends when that compaction cut a turn
# short (2.1.39's auto-compaction after a tool result, 2.1.328's after a prompt the API
# found too long): Claude goes on with that turn's work, unasked, so the seam after the
# summary is no settled one until it does (unsettled_reason).
COMPACTED_MID_TURN = "compacted_mid_turn"
LOCAL_OUTPUT_KEY = "local_output:"  # + session id: ParseState.local_output, in the thread's meta
TURN_END_KEY = "turn_end_due:"  # + session id: ParseState.turn_end_due, the same way
CHAIN_TIP_KEY = "chain_tip:"  # + session id: ParseState.chain_tip, the same way
QUEUE_KEY = "queue:"  # + session id: ParseState.queued, the same way
ABSORBED_KEY = "absorbed:"  # + session id: ParseState.absorbed, the same way
ENDING_KEY = "ending_response:"  # + session id: ParseState.ending_response, the same way
UNASKED_KEY = "unasked:"  # + session id: ParseState.unasked, the same way
AFTER_BOUNDARY_KEY = "after_boundary:"  # + session id: ParseState.after_boundary, the same way
# + session id + ":" + uuid: the agent of a sidechain record that made no message (a hook's
# system record, say). Those that made one are found by their messages' source_uuid; a
# restart must find these too, or the records after one would start a second agent.
SIDECHAIN_KEY = "sidechain:"
# The ParseState fields the records alone do not give back, kept in the thread's meta under
# key + session id whenever a batch changes them (ParseOutput.state): (field, key, default).
# A flag is kept as "1"/"0", a uuid as itself, a tuple as JSON (persisted_value).
PERSISTED_STATE = (("local_output", LOCAL_OUTPUT_KEY, False), ("turn_end_due", TURN_END_KEY, False),
                   ("chain_tip", CHAIN_TIP_KEY, None), ("queued", QUEUE_KEY, ()),
                   ("absorbed", ABSORBED_KEY, ()), ("unasked", UNASKED_KEY, False),
                   ("after_boundary", AFTER_BOUNDARY_KEY, False), ("ending_response", ENDING_KEY, None))


def without_first(entries: tuple, matches) -> tuple:
    """entries less the first one for which matches(entry) holds (all of them if none)."""
    for i, entry in enumerate(entries):
        if matches(entry):
            return entries[:i] + entries[i + 1:]
    return entries


def persisted_value(value) -> str:
    """A PERSISTED_STATE field's value as the meta table keeps it."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return json.dumps(value) if isinstance(value, tuple) else value


def restored_value(stored, default):
    """A PERSISTED_STATE field's value back from the meta table (default when absent)."""
    if stored is None:
        return default
    if default is False:
        return stored == "1"
    if isinstance(default, tuple):
        return tuple(tuple(entry) for entry in json.loads(stored))
    return stored
# A prompt Claude chained to an earlier record than the newest one: the person rewound the
# conversation (Esc Esc, /rewind: "Restore conversation") or edited an earlier prompt. The
# turns after that record are off Claude's branch now: kept in the thread as they were
# (export, search, get-turns) but left out of every view, under OFF_BRANCH_KEY + session +
# first seq (the value is the last seq of the run; wrapper.log says "off_branch"). Esc on a
# prompt not yet answered is the same to Claude: it drops that prompt (its text goes back
# into the box) and chains the next one to the record before it.
OFF_BRANCH_KEY = "off_branch:"
# + source key: what the thread held of a source's lines that carry no uuid (kept lines by
# their bytes' hash, tallies by type) when the source was read again from its start
# (ThreadStore.restart_source). The reading takes those as already held, one for one, so a
# file read twice keeps and counts each such line once; a line the file holds more often
# than the thread did is new. The key goes once everything held has been met again.
REREAD_KEY = "reread:"
OWN_UUID_KEY = re.compile(rb'[{,]\s*"uuid"\s*:\s*$')
TASK_NOTIFICATION_OPEN = "<task-notification>"
# A queued message that is a slash command (/mcp, /plugin:cmd args), not a path like /var/log
QUEUED_COMMAND = re.compile(r"\s*/[\w:-]+(?:\s|$)")
# A record's sessionId, found in its first bytes when the record is too long to read whole.
SESSION_KEY_IN_LINE = re.compile(rb'"sessionId"\s*:\s*"([0-9A-Za-z-]{1,64})"')
LEGACY_LINE_BYTES = 1 << 20  # of one line, at most, read to tell whose a 2.0 agent file is


def legacy_owner(path: str, most: int):
    """The session a 2.0 agent file belongs to: the sessionId of the first of its first
    ``most`` complete records that has one (its first line may be damaged or blank, and a
    long first record may name its session after its message); None when none says yet.
    No more than LEGACY_LINE_BYTES of a line is read: of a longer one (a huge prompt) the
    sessionId is looked for in those bytes, where Claude writes it ahead of the message."""
    with open_regular(path) as f:
        for _n in range(most):
            line = f.readline(LEGACY_LINE_BYTES)
            if len(line) == LEGACY_LINE_BYTES and not line.endswith(b"\n"):
                found = SESSION_KEY_IN_LINE.search(line)
                return found.group(1).decode("ascii") if found else None
            if not line.endswith(b"\n"):
                break  # (being written: asked again once it grew)
            rec = json_record(line) if line.strip() else None
            owner = rec.get("sessionId") if isinstance(rec, dict) else None
            if isinstance(owner, str) and owner:
                return owner
    return None


# Claude Code writes this once the Stop hooks ran, and only when there are any: a thread
# holding one has hooks that may keep Claude working after its final answer.
STOP_HOOK_SUMMARY = "system/stop_hook_summary"

# The rows a parsed batch carries (ParseOutput). They are tuples in the store's column
# order, so the store inserts them as they come; everything else reads them by name.
MessageRow = collections.namedtuple("MessageRow", (
    "seq", "turn", "segment", "role", "kind", "text", "data", "tool_use_id", "tool_name",
    "is_error", "response_id", "model", "source_session", "source_uuid", "block", "line",
    "created", "agent"))
MESSAGE_COLUMNS = MessageRow._fields
TurnOpened = collections.namedtuple("TurnOpened", "n kind first_seq session started")
TurnClosed = collections.namedtuple("TurnClosed", "n last_seq status stop_reason ended")
SegmentRow = collections.namedtuple("SegmentRow", "turn idx first_seq last_seq reason est_tokens")
UsageRow = collections.namedtuple("UsageRow", "session seq input cache_creation cache_read output "
                                              "model created")
ChainRow = collections.namedtuple("ChainRow", "session uuid")
Problem = collections.namedtuple("Problem", "session line offset kind detail")
Tally = collections.namedtuple("Tally", "count bytes")
CaptureEvent = collections.namedtuple("CaptureEvent", "kind turn")
AgentRow = collections.namedtuple("AgentRow", "agent_id source kind tool_use_id prompt")
RawLine = collections.namedtuple("RawLine", "session line offset reason raw")
# The parser makes a message, chain and tally row for nearly every line: built from a plain
# tuple they cost what a tuple costs (the named constructor is five times slower).
_row = tuple.__new__
# Where the last turn stood when a response's record closed it (see ParseState).
ClosedResponse = collections.namedtuple("ClosedResponse", "response_id turn segment segment_first "
                                                          "segment_bytes")


# What Claude Code writes as a user record when the person stops a turn with Esc (after a
# refused tool result when a call was running): the turn is over, interrupted. It is not a
# prompt, so it opens no turn that would stay open (and hold every later seam) for good.
INTERRUPT_MARKERS = frozenset(("[Request interrupted by user]", "[Request interrupted by user for tool use]"))


def _interrupt_marker(blocks) -> bool:
    return (len(blocks) == 1 and isinstance(blocks[0], dict) and blocks[0].get("type") == "text"
            and isinstance(blocks[0].get("text"), str) and blocks[0]["text"].strip() in INTERRUPT_MARKERS)


def flatten_tool_output(content) -> str:
    """A tool result's content as the text a reader would see."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "text":
                parts.append(block["text"] if isinstance(block.get("text"), str) else "")
            elif isinstance(block, dict):
                parts.append(f"[{block.get('type', 'block')}]")
        return "\n".join(parts)
    return "" if content is None else json_as_written(content, ensure_ascii=False)


# One encoder for every block the parser writes: json.dumps with these options would
# build a new one per call, a fifth of what dumping a small block costs.
_dump_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def _dump(value) -> str:
    """A block as the parser keeps it: compact JSON, its numbers spelled as Claude Code
    wrote them (see js_float_text)."""
    return _written(_dump_json, value)


# A float whose repr JavaScript writes otherwise has an exponent of -5 to -9 in repr, which
# writes it with a leading zero (its exponents from 16 to 20, which JavaScript writes as
# whole numbers, are left out: JavaScript never writes a float there, and Python reads its
# digits as an int).
_REPR_ONLY_FLOAT = "e-0"


def js_float_text(value: float) -> str:
    """A float as Claude Code's JSON.stringify writes it (JavaScript's Number toString): the
    same shortest digits as Python's repr, placed as JavaScript places them. Only below
    1e-4 do the two differ: 0.00001234 and 1.2345e-7, which repr writes 1.234e-05 and
    1.2345e-07 (and above 1e16, which JavaScript writes in full up to 1e21)."""
    text = repr(value)
    mantissa, exponent_sign, exponent = text.partition("e")
    if not exponent_sign:
        return text  # (fixed-point, as JavaScript writes it too; inf and nan are never stored)
    sign, mantissa = ("-", mantissa[1:]) if mantissa.startswith("-") else ("", mantissa)
    power, digits = int(exponent), mantissa.replace(".", "")
    if -7 < power < 0:
        return f"{sign}0.{'0' * (-power - 1)}{digits}"
    if 0 <= power < 21:
        return sign + digits + "0" * (power + 1 - len(digits))
    return f"{sign}{mantissa}e{'+' if power > 0 else '-'}{abs(power)}"


def json_as_written(value, **options) -> str:
    """json.dumps(value, **options) with its floats spelled as Claude Code wrote them (what
    the export writes of a message's JSON)."""
    return _written(json.JSONEncoder(**options).encode, value)


def _written(encode, value) -> str:
    """encode(value), its floats spelled by js_float_text: one C call and a look for repr's
    own spelling, unless it is there."""
    text = encode(value)
    return with_js_floats(value, text, encode) if _REPR_ONLY_FLOAT in text else text


def with_js_floats(value, text, encode):
    """``text`` (encode(value)) with each float spelled by js_float_text where repr spells
    it otherwise: such floats are encoded as unique strings and those swapped for the
    numbers. ``text`` itself when it holds none (or nests too deep to be walked)."""
    nonce, numbers = os.urandom(8).hex(), {}

    def swap(item):
        if isinstance(item, float):
            js = js_float_text(item)
            if js == repr(item):
                return item
            stand_in = f"\x00{nonce}:{len(numbers)}"
            numbers[_dump_json(stand_in)] = js
            return stand_in
        if isinstance(item, dict):
            return {k: swap(v) for k, v in item.items()}
        if isinstance(item, list):
            return [swap(v) for v in item]
        return item
    try:
        swapped = swap(value)
    except RecursionError:
        return text
    if not numbers or any(stand_in in text for stand_in in numbers):
        return text
    out = encode(swapped)
    for stand_in, js in numbers.items():
        out = out.replace(stand_in, js, 1)
    return out


# Each payload is stored once. A block whose text the message's text column already holds
# (a tool result's output, a thinking block's thinking, a tool call's input) is kept as
# JSON with a marker in that text's place; full_block_json() puts it back. A marker is a
# JSON string starting with a NUL character. A block kept whole that holds such a string
# anyway is stored behind a leading NUL (never the start of JSON), so a marker is never
# guessed at; rows from before this scheme hold no marker and read as they are.
PAYLOAD_AS_STRING = "\x00cc-lhc:text"   # the text column, written as a JSON string, stands here
PAYLOAD_AS_JSON = "\x00cc-lhc:json"     # the text column, itself JSON, stands here
MARKER_JSON = {PAYLOAD_AS_STRING: _dump(PAYLOAD_AS_STRING), PAYLOAD_AS_JSON: _dump(PAYLOAD_AS_JSON)}
MARKER_PREFIX_JSON = '"\\u0000cc-lhc:'
KEPT_WHOLE = "\x00"
ELIDE_MIN_CHARS = 256  # below this the copy costs less than the marker's bookkeeping


def _whole(data: str) -> str:
    """A block's whole JSON as stored: behind KEPT_WHOLE when it holds marker-like text."""
    return KEPT_WHOLE + data if MARKER_PREFIX_JSON in data else data


def _dump_once(block: dict, key: str, marker: str, text) -> str:
    """block's JSON with block[key] (whose payload is text) replaced by marker, when worth it."""
    if text is None or len(text) < ELIDE_MIN_CHARS or key not in block:
        return _whole(_dump(block))
    elided = _dump({**block, key: marker})
    return elided if elided.count(MARKER_PREFIX_JSON) == 1 else _whole(_dump(block))


def _text_block_json(block: dict):
    """A text block's JSON when it holds more than its text (citations, cache_control), its
    text by marker; None for a plain one, which the text column holds whole."""
    text = block.get("text")
    if isinstance(text, str) and len(block) == 2:
        return None  # {"type": "text", "text": ...}
    return _dump_once(block, "text", PAYLOAD_AS_STRING, text) if isinstance(text, str) else _whole(_dump(block))


def _result_json_once(block: dict, text: str) -> str:
    """A tool_result block's JSON, its output left out where the text column holds it whole."""
    content = block.get("content")
    if isinstance(content, str):
        return _dump_once(block, "content", PAYLOAD_AS_STRING, text)
    if (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)
            and content[0].get("type") == "text" and content[0].get("text") == text
            and len(text) >= ELIDE_MIN_CHARS):
        elided = _dump({**block, "content": [{**content[0], "text": PAYLOAD_AS_STRING}]})
        if elided.count(MARKER_PREFIX_JSON) == 1:
            return elided
    return _whole(_dump(block))


def full_block_json(text, data):
    """The block JSON as the transcript held it: the message's text back in its marker's place."""
    if not data:
        return data
    if data[0] == KEPT_WHOLE:
        return data[1:]
    if MARKER_PREFIX_JSON not in data:
        return data
    as_string = MARKER_JSON[PAYLOAD_AS_STRING]
    if as_string in data:
        return data.replace(as_string, _dump(text), 1)
    return data.replace(MARKER_JSON[PAYLOAD_AS_JSON], text, 1)


class ParseState:
    """Everything the parser remembers between lines of one thread.

    The store can rebuild it from what it holds (see ThreadStore.parse_state), so
    capture survives being killed at any line.
    """

    def __init__(self, next_seq=1, next_turn=1):
        self.next_seq = next_seq
        self.next_turn = next_turn
        self.open_turn = None        # the turn number still running, or None
        self.open_kind = None        # and its kind (TurnOpened.kind)
        self.answering = False       # the model has spoken in the open turn
        # The newest main-chain record was a local command's output: an isMeta record right
        # after it is that output written out for the model (/context), not a new turn. Kept
        # in the thread's meta (LOCAL_OUTPUT_KEY) when a batch changes it.
        self.local_output = False
        # The newest turn ended on a final stop_reason and no end-of-turn record (Stop hooks
        # done, TURN_END_SUBTYPES) came after it yet: Claude may still be running its Stop
        # hooks, one of which can send it back to work. In the meta as TURN_END_KEY.
        self.turn_end_due = False
        self.chain_tip = None        # the newest main-chain record's uuid (CHAIN_TIP_KEY)
        # Messages the person typed while Claude worked, as queue-operation records tell
        # them: (line, enqueue record JSON) still in Claude's queue, and those Claude took
        # out of it to hand to the model inside the running turn ("remove") whose words no
        # queued_command attachment has given yet (see RolloutParser._queue_operation).
        self.queued = ()
        self.absorbed = ()
        self.last_response = None    # the response id of the newest main-chain assistant record
        self.segment = 0             # current segment index within the open turn
        self.segment_first = None    # first seq of the current segment
        self.segment_bytes = 0       # size of the current segment's text so far
        self.outstanding = {}        # tool_use_id -> seq of the call, thread-wide
        self.ending_calls = set()    # of those, calls whose result ends Claude's run (RUN_ENDING_TOOLS)
        self.ending_response = None  # the response whose such call succeeded: its run ends once it is answered
        self.known_uuids = set()     # uuids seen in the session being read
        # The response whose record closed the last turn, and where that turn stood: Claude
        # Code copies the final stop_reason onto every record of a response, so the first
        # block already looks terminal and the response's later blocks must rejoin the turn.
        self.closed_response = None  # ClosedResponse
        # The newest main-chain response ended with stop_reason null and asked for no tool:
        # in a version that writes null, a prompt after it starts a new turn, it does not
        # interrupt one.
        self.unasked = False
        self.turn_first = None       # first seq of the open turn
        self.last_seq = None         # newest main-chain message
        self.sidechains = {}         # uuid of a sidechain record -> the agent it belongs to
        self.agent_calls = {}        # agent -> {tool_use_id: seq} of its unanswered calls
        self.after_boundary = False  # a compact_boundary was the last main-chain record
        self.replaying = False       # inside a view the cc-lhc mod served back (see _replayed)


class ParseOutput:
    """What parsing a batch of lines produced, ready for one store transaction."""

    def __init__(self):
        self.messages = []       # MessageRow
        self.turns_opened = []   # TurnOpened
        self.turns_closed = []   # TurnClosed
        self.segments = []       # SegmentRow
        self.usage = {}          # response_id -> UsageRow
        self.chain = []          # ChainRow
        self.problems = []       # Problem
        self.telemetry = {}      # type -> Tally
        self.events = []         # CaptureEvent ("native_compact", turn) and similar, for the host
        self.agents = []         # AgentRow: seen or linked
        self.sidechain_records = []  # (uuid, agent) of sidechain records that made no message
        self.raw_lines = []      # RawLine: lines kept verbatim
        self.state = {}           # PERSISTED_STATE field -> its value at the batch's end, if it changed
        self.branches = []        # (parent uuid, line) of prompts chained to an older record
        self.turn_kinds = []      # (turn n, kind): a turn a companion record opened, now its prompt's


# An in-process Smart Compact (the cc-lhc mod's session.compact hook, section 12) has
# Claude write a compact_boundary and then the view cc-lhc served: its header, the older
# turns as cc-lhc rendered them, the newest records again under new uuids, and last the
# closing line below. All of it is already in the thread. The telemetry counts of the
# views opened and closed in a session tell a restarted parser whether it stopped inside one.
IN_PROCESS_VIEW_END = "[cc-lhc] End of the rebuilt view; the conversation goes on from here."
VIEW_OPENED, VIEW_CLOSED = "in_process_view_opened", "in_process_view_closed"


def _closes_view(rec) -> bool:
    message = rec.get("message") or {}
    content = message.get("content")
    return (message.get("model") == "<synthetic>" and isinstance(content, list) and len(content) == 1
            and isinstance(content[0], dict) and content[0].get("text") == IN_PROCESS_VIEW_END)


class RolloutParser:
    """Maps Claude Code transcript lines to canonical records (pure).

    One instance reads one session's lines in order into one thread. ``segment_soft_bytes``
    is the size at which a long open turn is closed into a segment at the next safe
    place (a tool result with no call outstanding).

    With ``agent`` set it reads a subagent's own file: its records become messages tagged
    with the agent, attached to ``agent_turn`` (the turn of the call that started it),
    outside every turn's segments, and they never open or close a turn. ``resumes``:
    (timestamp, turn) of each later call that sent the agent a message (SendMessage runs
    a stopped agent again), oldest first: a record written after one is in its turn.
    """

    def __init__(self, session_id: str, state: ParseState, segment_soft_bytes: int,
                 agent=None, agent_turn=0, resumes=()):
        self.session = session_id
        self.s = state
        self.soft = segment_soft_bytes
        self.out = ParseOutput()
        self.agent = agent
        self.agent_turn = agent_turn
        self.resumes = resumes
        self.usage_session = session_id
        # read_saved(path) -> (text, data) of a saved tool output, or why it cannot be read
        # (a str); set by Capture, which knows the session's folder. None: not looked for.
        self.read_saved = None
        # For an agent's file: outer_uuids() -> the uuids of the session the agent ran in.
        # Claude's compaction agent chains its records to the main conversation's.
        self.outer_uuids = None
        self._outer = None
        self._odd = []  # why the line being fed is also kept verbatim (text_repaired, ...)
        self._kept = {field: getattr(state, field) for field, _k, _d in PERSISTED_STATE}  # as stored
        self._off_tip = False  # the record being read names a parent other than the tip

    def take(self) -> ParseOutput:
        out, self.out = self.out, ParseOutput()
        for field, _key, _default in PERSISTED_STATE:
            value = getattr(self.s, field)
            if value != self._kept[field]:
                out.state[field] = self._kept[field] = value
        return out

    # -- lines ---------------------------------------------------------------

    def feed(self, raw: bytes, line_no: int, offset: int) -> None:
        """One complete line (without its newline)."""
        not_finite, text = False, raw
        try:
            try:
                try:
                    rec = transcript_json(raw)
                except UnicodeDecodeError:
                    # Bytes that are not UTF-8 (an editor or a tool wrote them): Claude Code
                    # reads each as U+FFFD and sends the message on, so it is read so here
                    # (text_repaired, below), and the line's bytes are kept as they are.
                    text = raw.decode("utf-8", "replace").encode("utf-8")
                    rec = transcript_json(text)
            except NotFiniteNumber:
                # (stored as null, as Claude Code sends it on; the line's bytes are kept)
                rec, not_finite = finite_or_null(json.loads(text)), True
        except ValueError as e:
            rec = None if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)) else _with_long_ints_null(text)
            if rec is None:
                if raw.strip():
                    self._malformed(raw, line_no, offset, f"not valid JSON: {e}")
                return
            not_finite = True
        except RecursionError:
            # JSON sets no depth limit (a tool input can nest deep); Python's reader has
            # one. Such a line cannot become messages: it is kept as bytes and named, never
            # a capture stalled on it.
            self._malformed(raw, line_no, offset, "nested deeper than this parser can read")
            return
        if not isinstance(rec, dict):
            self._malformed(raw, line_no, offset, "a line that is not a JSON object")
            return
        self._odd = ["number_out_of_range"] if not_finite else []
        if text is not raw:  # (a damaged file, most likely: said, and the thread marked degraded)
            self._odd.append("text_repaired")
            self.out.problems.append(Problem(self.session, line_no, offset, "invalid_utf8",
                                             "bytes that are not UTF-8, read as U+FFFD as Claude Code reads them"))
        if ESCAPED_SURROGATE.search(raw) or (b"\xed" in raw and SURROGATE_IN_LINE.search(raw)):
            # Half of a surrogate pair (a string cut mid-emoji), escaped or as raw bytes
            # ED A0..BF (Python's reader lets those through), is valid JSON but not
            # storable text; it becomes U+FFFD, and the line is kept verbatim.
            rec, repaired = _without_lone_surrogates(rec)
            if repaired and text is raw:
                self._odd.append("text_repaired")
        out = self.out
        before = (len(out.messages), len(out.turns_opened), len(out.turns_closed))
        chained = len(out.chain)
        try:
            self._record(rec, len(raw), line_no, offset)
        except (TypeError, AttributeError, RecursionError) as e:
            # Valid JSON in a shape Claude Code never writes (one flipped byte can make
            # one), or one nested just too deep to write back: a malformed line where it
            # stands, never a capture stalled on it.
            self._off_tip = False
            if (len(out.messages), len(out.turns_opened), len(out.turns_closed)) == before:
                # Nothing of it is in the thread, so its uuid names no record there: a
                # later, readable copy under that uuid is read, not counted as its copy.
                # (one that got as far as opening a turn leaves it: read again, the copy
                # would open a second, empty one before its own)
                for row in self.out.chain[chained:]:
                    self.s.known_uuids.discard(row.uuid)
                del self.out.chain[chained:]
            self._malformed(raw, line_no, offset, f"a record in a shape this parser does not know ({e})")
            return
        for reason in self._odd:
            self._count(reason, len(raw))
            self.out.raw_lines.append(RawLine(self.session, line_no, offset, reason, raw))

    def _unplaced(self, line_no, offset, detail):
        """A conversational record the chain cannot hold: a problem where it stands, its
        line kept as it is (feed), so its words are not only a count."""
        self.out.problems.append(Problem(self.session, line_no, offset, "unplaced_record", detail))
        self._odd.append("unplaced_record")

    def _malformed(self, raw, line_no, offset, detail):
        """A line the record cannot hold: a problem where it stands, its bytes kept as they are."""
        self.out.problems.append(Problem(self.session, line_no, offset, "malformed_line", detail))
        self.out.raw_lines.append(RawLine(self.session, line_no, offset, "malformed_line", raw))

    def _record(self, rec, size, line_no, offset):
        rtype = rec.get("type")
        uid = rec.get("uuid")
        if isinstance(uid, str) and not uid.strip():
            uid = None  # ("" names no record: every other such line would pass for its copy)
        if uid is None or rtype in BOOKKEEPING_TYPES:
            if rtype == "queue-operation" and self.agent is None:
                self._queue_operation(rec, line_no)
            elif rtype in ("user", "assistant"):
                self._unplaced(line_no, offset, f"a {rtype} record without a uuid")
            self._count(rtype, size)
            return
        if rtype is None and "message" in rec:
            self._unplaced(line_no, offset, f"record {uid} has a message but no type")
        parent = rec.get("parentUuid")
        _require_text(uid, parent, rec.get("timestamp"))
        if uid in self.s.known_uuids:
            # Claude Code writes some records again under the same uuid (a reopened or
            # resumed session replays them); the first copy is already in the record.
            self._count("duplicate_record", size)
            return
        if parent is not None and parent not in self.s.known_uuids and not self._outer_parent(parent):
            self.out.problems.append(Problem(
                self.session, line_no, offset, "broken_chain",
                f"record {uid} names parent {parent}, never seen in this session"))
        self.s.known_uuids.add(uid)
        self.out.chain.append(_row(ChainRow, (self.session, uid)))
        if rec.get("isSidechain") and self.agent is None:
            self._sidechain(rec, rtype, size, line_no, offset)
        else:
            main = self.agent is None
            tip = self.s.chain_tip
            self._off_tip = main and tip is not None and parent != tip  # (None: back to the start)
            self._dispatch(rec, rtype, size, line_no, offset)
            self._off_tip = False
            if main:
                self.s.chain_tip = uid

    def _outer_parent(self, parent) -> bool:
        """Whether an agent's record names a record of the session it ran in as its parent."""
        if self.outer_uuids is None:
            return False
        if self._outer is None:
            self._outer = self.outer_uuids()
        return parent in self._outer

    def _dispatch(self, rec, rtype, size, line_no, offset):
        if self.agent is None and self._replayed(rec, rtype, size):
            return
        if rtype == "user":
            after_output = False
            if self.agent is None:
                self.s.closed_response = None
                after_output, self.s.local_output = self.s.local_output, False
            self._link_agents(rec)
            self._user(rec, line_no, offset, after_output)
        elif rtype == "assistant":
            if self.agent is None:
                self.s.local_output = False
                response_id = (rec.get("message") or {}).get("id") or rec.get("uuid")
                if response_id != self.s.last_response:
                    self._absorbed_prompts()  # the model answers them in this response
                self.s.last_response = response_id
            self._assistant(rec, line_no)
        elif rtype == "attachment" and self._queued_prompt(rec, line_no):
            return
        else:
            label = rtype if rtype != "system" else f"system/{rec.get('subtype')}"
            if rtype == "attachment":
                label = f"attachment/{(rec.get('attachment') or {}).get('type')}"
                if label == f"attachment/{MAX_TURNS_REACHED}" and self.agent is None:
                    self._run_ended("max_turns", rec.get("timestamp"))  # (-p --max-turns stopped it)
            elif rtype == "progress":
                data = rec.get("data") if isinstance(rec.get("data"), dict) else {}
                label = f"progress/{data.get('type')}"
                self._link(data.get("agentId"), rec.get("parentToolUseID"))
            elif rtype == "system" and rec.get("subtype") in TURN_END_SUBTYPES and self.agent is None:
                self._absorbed_prompts()
                self.s.turn_end_due = False
                self._turn_ended(rec)
            elif rtype == "system" and rec.get("subtype") == "local_command" and self.agent is None:
                if _local_command_part(rec.get("content")) == "output":
                    self._command_done(rec)
            elif rtype not in (None, "system", "attachment") and isinstance(rec.get("message"), dict):
                # A kind of record this parser does not know (a newer Claude Code's) that
                # holds a message: its words stay, as the line, not only as a count.
                self._unplaced(line_no, offset, f"record {rec.get('uuid')} of type {rtype} holds a message "
                                                "this parser does not know how to place")
            self._count(label, size)

    def _replayed(self, rec, rtype, size) -> bool:
        """Whether a main-chain record belongs to a view cc-lhc served back into Claude.

        Such a record is a rebuild of the thread, never new content and never Claude's
        own Compact turn: it is counted, not captured. The view opens with cc-lhc's header
        as the first user record after a compact_boundary and ends on IN_PROCESS_VIEW_END.
        """
        s = self.s
        if rtype == "system" and rec.get("subtype") == "compact_boundary":
            s.after_boundary = True
            return False
        if s.after_boundary and rtype == "user":
            s.after_boundary = False
            content = (rec.get("message") or {}).get("content")
            if isinstance(content, str) and content.startswith(REBUILT_MARKER):
                s.replaying = True
                self._count(VIEW_OPENED, size)
                return True
        if not s.replaying:
            return False
        if rtype == "assistant" and _closes_view(rec):
            s.replaying = False
            self._count(VIEW_CLOSED, size)
            self.out.events.append(CaptureEvent("in_process_view", max(0, s.next_turn - 1)))
        else:
            self._count("in_process_view_record", size)
        return True

    # -- agents ------------------------------------------------------------------

    def _link(self, agent_id, tool_use_id):
        """Record that the call tool_use_id started agent_id (either may be unknown)."""
        _require_text(agent_id, tool_use_id)
        if agent_id and tool_use_id:
            self.out.agents.append(AgentRow(agent_id, None, None, tool_use_id, None))

    def _link_agents(self, rec):
        """A tool result of an agent call names the agent it started (2.x)."""
        result = rec.get("toolUseResult")
        if not isinstance(result, dict) or not result.get("agentId"):
            return
        content = (rec.get("message") or {}).get("content")
        for block in content if isinstance(content, list) else ():
            if isinstance(block, dict) and block.get("type") == "tool_result":
                self._link(result.get("agentId"), block.get("tool_use_id"))

    def _sidechain(self, rec, rtype, size, line_no, offset):
        """A subagent's record written into the main transcript (the Task tool of 1.0.x).

        Its chain starts at a record with no known parent; every record that descends
        from it belongs to the same agent. The agent is linked to its call later, by
        the prompt it was given (those versions wrote no other link).
        """
        s = self.s
        uid = rec["uuid"]
        agent = rec.get("agentId") or s.sidechains.get(rec.get("parentUuid"))
        _require_text(agent)
        first = agent is None or (rec.get("agentId") and agent not in s.sidechains)
        if first:  # the agent's first record: its prompt links it to its call
            agent = agent or f"sidechain-{uid}"
            s.sidechains[agent] = agent  # (an agent id names itself, so it is announced once)
            content = (rec.get("message") or {}).get("content")
            if isinstance(content, list):  # (the prompt as text blocks)
                content = "".join(b.get("text") or "" for b in content if isinstance(b, dict) and b.get("type") == "text")
            prompt = content if rtype == "user" and isinstance(content, str) and content else None
            self.out.agents.append(AgentRow(agent, self.session, "sidechain", None, prompt))
        s.sidechains[uid] = agent
        self.agent, self.usage_session = agent, f"{self.session}/{agent}"
        self.agent_turn = s.open_turn if s.open_turn is not None else max(0, s.next_turn - 1)
        made = len(self.out.messages)
        try:
            self._dispatch(rec, rtype, size, line_no, offset)
        finally:
            self.agent, self.usage_session = None, self.session
        if len(self.out.messages) == made:
            self.out.sidechain_records.append((uid, agent))

    def _calls(self):
        """Unanswered tool calls of whoever is speaking: the main chain or one agent."""
        if self.agent is None:
            return self.s.outstanding
        return self.s.agent_calls.setdefault(self.agent, {})
    def _token_count(self, value):
        """A usage figure, or None; one too big to store marks the line (see sqlite_int)."""
        if type(value) is int and 0 <= value <= SQLITE_INT_MAX:
            return value  # the common case, without the checks below
        too_big = isinstance(value, int) and not isinstance(value, bool) and sqlite_int(value) is None
        if too_big and "number_out_of_range" not in self._odd:
            self._odd.append("number_out_of_range")
        return _int_or_none(value)

    def _count(self, rtype, size):
        tally, key = self.out.telemetry, str(rtype)
        old = tally.get(key)
        tally[key] = _row(Tally, (old.count + 1, old.bytes + size) if old else (1, size))

    # -- turns and segments ----------------------------------------------------

    def _open_turn(self, kind, seq, created):
        if self.agent is not None:
            return None
        if self.s.open_turn is not None:
            # A response that asked for nothing, in a version that left stop_reason null,
            # ended its turn, and so did a -p run's StructuredOutput; otherwise the prompt
            # cut the turn short.
            status, why = (("closed", "next_prompt") if self.s.unasked else
                           ("closed", "structured_output") if self.s.ending_response is not None
                           and not self.s.outstanding else ("interrupted", None))
            self._close_turn(self.s.last_seq if self.s.last_seq is not None else seq - 1,
                             status, why, created)
        n = self.s.next_turn
        self.s.next_turn += 1
        self.s.open_turn, self.s.open_kind = n, kind
        self.s.turn_first, self.s.unasked, self.s.answering = seq, False, False
        self.s.turn_end_due = False
        self.s.segment, self.s.segment_first, self.s.segment_bytes = 0, seq, 0
        self.out.turns_opened.append(TurnOpened(n, kind, seq, self.session, created))
        return n

    def _close_segment(self, last_seq, reason):
        s = self.s
        if s.segment_first is not None and last_seq >= s.segment_first:
            self.out.segments.append(SegmentRow(s.open_turn, s.segment, s.segment_first, last_seq, reason,
                                                s.segment_bytes // 4))
        s.segment += 1
        s.segment_first, s.segment_bytes = None, 0

    def _close_turn(self, last_seq, status, stop_reason, ended):
        if self.s.open_turn is None or self.agent is not None:
            return
        self._close_segment(last_seq, "terminal" if status == "closed" else status)
        self.out.turns_closed.append(TurnClosed(self.s.open_turn, last_seq, status, stop_reason, ended))
        self.s.open_turn = None

    def _message(self, role, kind, text, data, rec, block, line_no, tool_use_id=None,
                 tool_name=None, is_error=None, response_id=None, model=None):
        _require_text(text, tool_use_id, tool_name, response_id, model)
        s = self.s
        seq = s.next_seq
        s.next_seq += 1
        if self.agent is not None:
            turn, at = self.agent_turn, rec.get("timestamp")
            if self.resumes and isinstance(at, str):
                turn = next((n for when, n in reversed(self.resumes) if when <= at), turn)
            self.out.messages.append(_row(MessageRow, (
                seq, turn, -1, role, kind, text, data, tool_use_id, tool_name, is_error,
                response_id, model, self.session, rec.get("uuid"), block, line_no,
                rec.get("timestamp"), self.agent)))
            return seq
        s.last_seq = seq
        if s.open_turn is None:
            self._open_turn("continuation", seq, rec.get("timestamp"))
        if role == "assistant":
            s.answering = True
        if s.segment_first is None:
            s.segment_first = seq
        s.segment_bytes += segment_size(kind, text, data)
        self.out.messages.append(_row(MessageRow, (
            seq, s.open_turn, s.segment, role, kind, text, data, tool_use_id, tool_name, is_error,
            response_id, model, self.session, rec.get("uuid"), block, line_no,
            rec.get("timestamp"), None)))
        return seq

    def _command_done(self, rec):
        """A local command's output is written: its turn is over, and the seam settled. (Not
        a command that is a prompt the model is answering: a command run meanwhile, such as
        /context, ends nothing.)"""
        s = self.s
        s.local_output = True
        if (s.open_turn is not None and s.open_kind == COMMAND_TURN and not s.answering
                and s.last_seq is not None):
            self._close_turn(s.last_seq, "closed", "local_command", rec.get("timestamp"))

    def _turn_ended(self, rec):
        """A system record saying the turn is over closes it, unless a call still waits."""
        s = self.s
        if s.open_turn is None or s.last_seq is None:
            return
        if s.open_kind == "continuation" and not s.answering:
            return  # a Stop hook's feedback, written just before: the model answers it next
        first = s.turn_first if s.turn_first is not None else 0
        if any(seq >= first for seq in s.outstanding.values()):
            return
        s.closed_response, s.unasked = None, False
        self._close_turn(s.last_seq, "closed", rec.get("subtype"), rec.get("timestamp"))

    # -- record kinds ----------------------------------------------------------

    def _user(self, rec, line_no, offset, after_output=False):
        message = rec.get("message") or {}
        content = message.get("content")
        created = rec.get("timestamp")
        if rec.get("isCompactSummary") and self.agent is None:
            seq, cut, closed = self.s.next_seq, self.s.open_turn, len(self.out.turns_closed)
            cut = cut if self.s.open_kind != COMMAND_TURN else None  # (a typed /compact's own turn)
            self._open_turn("compact_summary", seq, created)
            cut = cut is not None and any(t.n == cut and t.status == "interrupted"
                                          for t in self.out.turns_closed[closed:])
            text = content if isinstance(content, str) else flatten_tool_output(content)
            self._message("user", "compact_summary", text, _dump(content), rec, 0, line_no)
            self._close_turn(seq, "closed", COMPACTED_MID_TURN if cut else "compact_summary", created)
            self.out.events.append(CaptureEvent("native_compact", self.s.next_turn - 1))
            return
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else (content or [])
        if not isinstance(blocks, list):
            blocks = [{"type": "unknown", "value": blocks}]
        if not blocks or content == "":
            # Nothing said (no message, no content, or none in it): no turn of its own, and
            # the line is kept as it is, so whatever else it holds is not lost unsaid.
            self._unplaced(line_no, offset, f"user record {rec.get('uuid')} holds no content")
            return
        has_result = any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks)
        local = None if has_result or self.agent is not None else _local_command_part(content)
        written_out = (local is None and after_output and rec.get("isMeta") and self.s.open_turn is None
                       and not rec.get("turnCompanion"))
        stopped = (self.agent is None and not has_result and not rec.get("isMeta")
                   and _interrupt_marker(blocks))
        if self.s.queued and self.agent is None and not has_result:
            self._delivered(content)
        if local is not None or written_out:
            self._command_part(local or "output", created)
        elif stopped:
            self._absorbed_prompts()  # (words the stopped turn took in belong to it)
            if self.s.open_turn is None:  # (cc-lhc had already ended it): the note is a turn of its own
                self._open_turn("interrupted", self.s.next_seq, created)
        elif not has_result and not rec.get("isMeta"):
            origin = (rec.get("origin") or {}).get("kind") if isinstance(rec.get("origin"), dict) else None
            _require_text(origin)
            if self._off_tip:
                self.out.branches.append((rec.get("parentUuid"), line_no))
            if self.agent is None:
                self._absorbed_prompts()  # (words the running turn took in belong to it)
            if (self.agent is None and self.s.open_turn is not None and self.s.open_kind == COMPANION_TURN
                    and not self.s.answering):
                self.s.open_kind = origin or "prompt"  # (the prompt joins the turn its companion opened)
                self.out.turn_kinds.append((self.s.open_turn, self.s.open_kind))
            else:
                self._open_turn(origin or "prompt", self.s.next_seq, created)
        elif (self.agent is None and rec.get("isMeta") and rec.get("turnCompanion") is True
              and self.s.open_turn is None):
            self._open_turn(COMPANION_TURN, self.s.next_seq, created)
        for i, block in enumerate(blocks):
            if not isinstance(block, dict):
                block = {"type": "unknown", "value": block}
            btype = block.get("type")
            if btype == "tool_result":
                tid = block.get("tool_use_id")
                calls = self._calls()
                if tid in calls:
                    del calls[tid]
                else:
                    self.out.problems.append(Problem(
                        self.session, line_no, offset, "tool_result_without_call",
                        f"tool result for {tid} answers no open tool call in this thread (none was made, "
                        "or it was answered before)"))
                output = flatten_tool_output(block.get("content"))
                seq = self._message("user", "tool_result", output,
                                    _result_json_once(block, output), rec, i, line_no, tool_use_id=tid,
                                    is_error=1 if block.get("is_error") else 0)
                seq = self._saved_output(rec, output, i, line_no, offset, tid) or seq
                if self.agent is None and tid in self.s.ending_calls:
                    self.s.ending_calls.discard(tid)
                    if not block.get("is_error"):  # (a refused output is tried again: the run goes on)
                        self.s.ending_response = self.s.last_response or tid
                if (self.agent is None and not self.s.outstanding
                        and self.s.segment_bytes >= self.soft and self.s.open_turn is not None):
                    self._close_segment(seq, "soft_size")
            elif btype == "text":
                kind = "user_meta" if rec.get("isMeta") else "user_text"
                self._message("user", kind, block.get("text", ""), _text_block_json(block), rec, i, line_no)
            else:
                self._message("user", f"user_{btype}", None, _dump(block), rec, i, line_no)
        if local == "output" or written_out:
            self._command_done(rec)
            if written_out:
                self.s.local_output = False  # the output, once: a record after it is not
        if stopped:
            s = self.s
            s.closed_response, s.unasked = None, False
            self._close_turn(s.last_seq, "interrupted", "user_interrupt", created)

    def _run_ended(self, why, created):
        """Claude ended its run on a record of its own, not on an answer: the turn is over."""
        s = self.s
        if s.open_turn is None or s.last_seq is None:
            return
        s.closed_response, s.unasked, s.turn_end_due = None, False, False
        self._close_turn(s.last_seq, "closed", why, created)

    def _saved_output(self, rec, output, block, line_no, offset, tool_use_id):
        """The whole of a tool output Claude saved to a file (SAVED_OUTPUT), as a message
        after its result: its seq, or None when the result names no such file. A file that
        cannot be read is a problem of the thread, never silent."""
        if self.read_saved is None:
            return None
        result = rec.get("toolUseResult")
        path = result.get("persistedOutputPath") if isinstance(result, dict) else None
        if not isinstance(path, str) or not path:
            hit = SAVED_OUTPUT_PREVIEW.match(output) if isinstance(output, str) else None
            if hit is None:
                return None
            path = hit.group(1)
        got = self.read_saved(path)
        if isinstance(got, str):
            self.out.problems.append(Problem(self.session, line_no, offset, "saved_output_unreadable",
                                             f"the output of {tool_use_id} saved to {path}: {got}"))
            return None
        text, data = got
        return self._message("user", SAVED_OUTPUT, text, data, rec, -1 - block, line_no,
                             tool_use_id=tool_use_id)

    def _queue_operation(self, rec, line_no):
        """Claude's queue of messages typed while it works, from its queue-operation records.

        Each enqueue ends in one of: dequeue (the message goes out as a prompt record of its
        own), popAll (the person took the queue back into the input box) or remove. A
        remove that says Claude handed the message to the model inside the running turn
        (no reason, as 2.1.39 writes it, or absorbed_mid_turn) makes it the person's words
        in that turn: newer versions write it again as a queued_command attachment
        (_queued_prompt), 2.1.39 nowhere else, so what no attachment claims joins the turn
        when the model answers it (_absorbed_prompts). Any other remove (cleared_on_cancel:
        Esc put the words back in the box; rewound; dropped_by_hook) sends nothing.
        """
        s = self.s
        op, content = rec.get("operation"), rec.get("content")
        if op == "enqueue":
            # (an enqueue without words of text holds a place: a remove may name it)
            s.queued += ((line_no, content if isinstance(content, str) else None, _dump(rec)),)
        elif op == "dequeue":
            s.queued = s.queued[1:]
        elif op == "popAll":
            s.queued = ()
        elif op == "remove" and s.queued:
            if content is None:
                # (the oldest message of the person's: a background task's notification
                # waits for the turn's end and goes out as a record of its own)
                named = [i for i, entry in enumerate(s.queued) if not (entry[1] or "").startswith(
                    TASK_NOTIFICATION_OPEN)] or [0]
            else:
                named = [i for i, entry in enumerate(s.queued) if entry[1] == content]
            if not named:
                return  # words it never saw queued: nothing to take out
            i = named[0]
            if rec.get("reason") in (None, "absorbed_mid_turn") and s.queued[i][1] is not None:
                s.absorbed += (s.queued[i],)
            s.queued = s.queued[:i] + s.queued[i + 1:]

    def _delivered(self, content):
        """A background task's notification that went out as a record of its own is no
        longer in Claude's queue (2.1.39 writes no dequeue for it)."""
        text = content if isinstance(content, str) else "\n".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        ) if isinstance(content, list) else None
        if not (text or "").startswith(TASK_NOTIFICATION_OPEN):
            return
        self.s.queued = without_first(self.s.queued, lambda entry: entry[1] == text)

    def _absorbed_prompts(self):
        """Messages Claude handed to the model mid-turn that no attachment wrote down: user
        messages of the running turn (or of a new one, if none is open), placed just
        before the response that reads them. Their data is the enqueue record."""
        s = self.s
        if self.agent is not None or not s.absorbed:
            return
        entries, s.absorbed = s.absorbed, ()
        for line_no, content, data in entries:
            if QUEUED_COMMAND.match(content):
                continue  # a slash command: Claude runs it itself and records what it sends
            rec = json.loads(data)
            s.closed_response = None
            if s.open_turn is None:
                self._open_turn("prompt", s.next_seq, rec.get("timestamp"))
            self._message("user", "user_text", content, data, rec, 0, line_no)

    def _queued_prompt(self, rec, line_no) -> bool:
        """A message the person sent while Claude worked: Claude Code writes it only as a
        queued_command attachment and hands it to the model inside the running turn. It is
        their own words, so it is a user message of that turn (or opens one, if none is
        open), never telemetry; its data is the attachment (QUEUED_PROMPT_SQL). False for
        any other attachment."""
        att = rec.get("attachment")
        prompt = att.get("prompt") if isinstance(att, dict) and att.get("type") == "queued_command" else None
        if isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, list):
            text = flatten_tool_output(prompt)
        else:
            return False
        data = _dump(att)
        if self.agent is None:
            self.s.absorbed = without_first(self.s.absorbed, lambda entry: entry[1] == text)
            self.s.closed_response = None
            if self.s.open_turn is None:
                self._open_turn("prompt", self.s.next_seq, rec.get("timestamp"))
        self._message("user", "user_text", text, data, rec, 0, line_no)
        return True

    def _command_part(self, part, created):
        """The turn a user record of a local command (see LOCAL_COMMAND_CAVEAT) belongs to:
        the caveat opens it, the command's name joins a command turn holding only the
        record before it (the caveat), and its output joins the command (and then ends it,
        _command_done)."""
        s = self.s
        joins = s.open_turn is not None and s.open_kind == COMMAND_TURN and (
            part == "output" or part == "name" and s.turn_first == s.last_seq)
        if not joins:
            self._open_turn(COMMAND_TURN, s.next_seq, created)

    def _assistant(self, rec, line_no):
        message = rec.get("message") or {}
        response_id = message.get("id") or rec.get("uuid")
        model = message.get("model")
        content = message.get("content")
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content or ""}]
        created = rec.get("timestamp")
        s = self.s
        main = self.agent is None
        closed = s.closed_response
        if main and s.open_turn is None and closed and closed.response_id == response_id:
            _rid, s.open_turn, s.segment, s.segment_first, s.segment_bytes = s.closed_response
        if main:
            s.closed_response = None
            if response_id != s.ending_response:
                s.ending_response = None  # (the model answered again: its run went on)
        last = None
        for i, block in enumerate(blocks):
            if not isinstance(block, dict):
                block = {"type": "unknown", "value": block}
            btype = block.get("type")
            if btype == "text":
                kind = "api_error" if rec.get("isApiErrorMessage") else "assistant_text"
                last = self._message("assistant", kind, block.get("text", ""), _text_block_json(block), rec, i,
                                     line_no,
                                     response_id=response_id, model=model)
            elif btype == "thinking":
                thought = block.get("thinking", "")
                data = (_dump_once(block, "thinking", PAYLOAD_AS_STRING, thought) if isinstance(thought, str)
                        else _dump(block))
                last = self._message("assistant", "thinking", thought, data,
                                     rec, i, line_no, response_id=response_id, model=model)
            elif btype == "tool_use":
                tid = block.get("id")
                call_input = _dump(block.get("input"))
                last = self._message("assistant", "tool_call", call_input,
                                     _dump_once(block, "input", PAYLOAD_AS_JSON, call_input), rec, i,
                                     line_no, tool_use_id=tid,
                                     tool_name=block.get("name"), response_id=response_id,
                                     model=model)
                self._calls()[tid] = last
                if self.agent is None and block.get("name") in RUN_ENDING_TOOLS:
                    self.s.ending_calls.add(tid)
            else:
                last = self._message("assistant", f"assistant_{btype}", None, _dump(block), rec, i,
                                     line_no, response_id=response_id, model=model)
        usage = message.get("usage")
        if isinstance(usage, dict) and last is not None:
            self.out.usage[response_id] = UsageRow(
                self.usage_session, last, self._token_count(usage.get("input_tokens")),
                # A provider that leaves out the cache fields used no cache; only a value
                # that is there but unusable makes the reading invalid.
                self._token_count(usage.get("cache_creation_input_tokens", 0)),
                self._token_count(usage.get("cache_read_input_tokens", 0)),
                self._token_count(usage.get("output_tokens")), model, created)
        stop = message.get("stop_reason")
        if not main:
            return
        if last is not None:
            s.unasked = (stop is None and not rec.get("isApiErrorMessage")
                         and not any(isinstance(b, dict) and b.get("type") == "tool_use" for b in blocks))
        if last is not None and (stop in TERMINAL_STOP_REASONS or rec.get("isApiErrorMessage")):
            s.closed_response = ClosedResponse(response_id, s.open_turn, s.segment, s.segment_first,
                                               s.segment_bytes)
            self._close_turn(last, "closed", stop or "api_error", created)
            # (an API error Claude writes as its answer, stop_sequence and all, runs no Stop
            # hook: nothing reports its end)
            s.turn_end_due = stop in TERMINAL_STOP_REASONS and not rec.get("isApiErrorMessage")


def _local_command_part(content):
    """'caveat', 'name' or 'output' for a record's content that is part of a local command
    (LOCAL_COMMAND_CAVEAT), else None."""
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict) \
            and content[0].get("type") == "text":
        content = content[0].get("text")
    if not isinstance(content, str):
        return None
    head = content[:64].lstrip()
    if head.startswith(LOCAL_COMMAND_CAVEAT):
        return "caveat"
    if head.startswith(LOCAL_COMMAND_NAME):
        return "name"
    if head.startswith(LOCAL_COMMAND_OUTPUT):
        return "output"
    return None


class NotFiniteNumber(Exception):
    """A line holds a number no float can hold (1e400) or NaN/Infinity, which JSON has not."""


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0:  # inf or nan
        raise NotFiniteNumber(text)
    return value


def _no_constant(name: str):
    raise NotFiniteNumber(name)


def _int_or_null(text: str):
    """parse_int that reads an integer longer than Python reads (4,300 digits) as null."""
    try:
        return int(text)
    except ValueError:
        return None


def _with_long_ints_null(raw: bytes):
    """A valid line holding an integer longer than Python reads, each such number (and any
    inf or nan) null: Claude Code itself reads one as Infinity and sends it on as null. None
    when the line is no such line (its error stands)."""
    try:
        return finite_or_null(json.loads(raw, parse_int=_int_or_null))
    except (ValueError, RecursionError):
        return None


def finite_or_null(value):
    """value with every inf and nan in it made null, as Claude Code's own JSON.stringify
    writes them (so the model saw null), and as JSON can hold them."""
    if isinstance(value, float) and value - value != 0:
        return None
    if isinstance(value, list):
        return [finite_or_null(v) for v in value]
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    return value


# json.loads's own scanner; a float it cannot hold raises NotFiniteNumber (ints and every
# other value are read exactly as json.loads reads them: only floats reach the hook).
_SCAN_JSON = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant).scan_once


def transcript_json(raw: bytes):
    """json.loads(raw), without its detours for what Claude writes: a UTF-8 line that is an object.

    json.loads(bytes) first guesses the encoding and goes through three layers of Python
    before its scanner; for a line that starts with "{" (so no BOM, no UTF-16/32) and is
    strict UTF-8, the scanner alone gives the same value. Anything else, and every line
    the scanner refuses, goes to json.loads itself, so errors read exactly as they did.
    """
    if raw[:1] == b"{" and raw[1:2] != b"\x00":
        try:
            text = raw.decode("utf-8")
            value, end = _SCAN_JSON(text, 0)
        except (UnicodeDecodeError, StopIteration, ValueError):
            return json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)
        if end == len(text) or not text[end:].strip(" \t\n\r"):
            return value
    return json.loads(raw, parse_float=_finite_float, parse_constant=_no_constant)


# A surrogate escaped (\uD800-\uDFFF) or as raw UTF-8-style bytes (ED A0..BF): only such a
# line can decode to text with a lone surrogate in it. The escaped form alone is searched
# on every line: a pattern that starts with one literal byte is scanned for that byte
# first, three times faster than testing for its hints; the alternation is not, and runs
# only when the raw byte ED is there at all.
SURROGATE_IN_LINE = re.compile(rb"\xed[\xa0-\xbf]|\\u[dD][89a-fA-F]")
ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(value):
    """(value, changed) with every unpaired UTF-16 surrogate, in keys too, replaced by U+FFFD."""
    if isinstance(value, str):
        if not SURROGATE.search(value):
            return value, False
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace"), True
    if isinstance(value, list):
        pairs = [_without_lone_surrogates(v) for v in value]
        return [v for v, _ in pairs], any(c for _, c in pairs)
    if isinstance(value, dict):
        changed = False
        out = {}
        for k, v in value.items():
            k, ck = _without_lone_surrogates(k)
            v, cv = _without_lone_surrogates(v)
            out[k] = v
            changed = changed or ck or cv
        return out, changed
    return value, False


# SQLite stores integers as signed 64-bit; Python's would overflow the insert (and roll
# back the whole batch with it). JSON has no such limit, so a value outside is kept only
# in the line's raw bytes.
SQLITE_INT_MIN, SQLITE_INT_MAX = -(1 << 63), (1 << 63) - 1


def sqlite_int(value):
    """The integer when SQLite can hold it, else None (bools and non-integers are None)."""
    if isinstance(value, int) and not isinstance(value, bool) and SQLITE_INT_MIN <= value <= SQLITE_INT_MAX:
        return value
    return None


def _int_or_none(value):
    value = sqlite_int(value)
    return value if value is not None and value >= 0 else None


def _require_text(*values):
    """Raise TypeError unless each value is text or None (what the store may hold there)."""
    for value in values:
        if value is not None and type(value) is not str:
            raise TypeError(f"{type(value).__name__} where text belongs")


def segment_size(kind, text, data) -> int:
    """What one message adds to its segment's size; the store rebuilds it the same way.

    Counted on the whole block JSON, so a block stored once weighs what it always did. An
    image (pasted, or in a tool's output) weighs what a view counts it, IMAGE_TOKENS, in
    the bytes segments are measured in: its text says only "[image]".
    """
    if data and kind == "tool_call":
        return len(text or "") + len(full_block_json(text, data))
    if kind == SAVED_OUTPUT:
        return 0  # never in a view: it weighs nothing there
    if kind == "user_image":
        return IMAGE_TOKENS * 4
    if kind == "tool_result" and data:
        return len(text or "") + IMAGE_TOKENS * 4 * data_images(data)
    return len(text or "")


def _raw_line_row(line: "RawLine", now: str) -> tuple:
    """A raw_lines row: a kept line is filed under its session, its offset and its bytes' hash."""
    import hashlib
    return (line.session, hashlib.sha256(line.raw).hexdigest(), line.line, line.offset, line.reason, line.raw, now)


def line_at(path, begin: int, offset: int) -> int:
    """The number capture gives the line at byte ``offset`` of a file whose line numbers
    start at byte ``begin`` (a rebuilt session's start past its replayed prefix): 1 there,
    one more for each newline in between."""
    line, left = 1, offset - begin
    with open_regular(path) as f:
        f.seek(begin)
        while left > 0:
            chunk = f.read(min(left, 1 << 22))
            if not chunk:
                break
            line += chunk.count(b"\n")
            left -= len(chunk)
    return line


def split_complete_lines(buf: bytes, base_offset: int):
    """Yield (line, offset) for each newline-terminated line; the rest is left for later.

    An incomplete last line is never parsed early: Claude may still be writing it.
    """
    start = 0
    find = buf.find
    while True:
        end = find(b"\n", start)
        if end < 0:
            return
        yield buf[start:end], base_offset + start
        start = end + 1


# == 5. Thread store: SQLite files, migrations, the append-only record ==========


def _touch_private(path: str) -> None:
    """Create a file with mode 0600 before SQLite does (it would use the umask)."""
    if not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        os.close(fd)


# A tool result's output of this many characters or more is stored zlib-compressed (level
# 1: most of the saving for a fraction of the time), as a BLOB: the column's type is the
# flag, since every text the parser writes is TEXT. SQL reads it through lhc_text().
COMPRESS_MIN_CHARS = 2048


def stored_text(value):
    """A text column's value as text: a compressed BLOB opened, anything else as it is."""
    if isinstance(value, bytes):
        import zlib
        return zlib.decompress(value).decode("utf-8")
    return value


def packed_bytes(raw: bytes):
    """raw zlib-compressed (level 1) when that saves a quarter, else None."""
    import zlib
    packed = zlib.compress(raw, 1)
    return packed if len(packed) * 4 < len(raw) * 3 else None


def _compressed(text: str):
    """What the store keeps for a tool result's output: a BLOB when that saves a quarter."""
    packed = packed_bytes(text.encode("utf-8"))
    return text if packed is None else packed


def _packable(row: MessageRow) -> bool:
    # (a saved output is the whole of a tool output too: a 20 MB log was kept as it was)
    return row.kind in PACKED_KINDS and row.text is not None and len(row.text) >= COMPRESS_MIN_CHARS


PACKED_KINDS = frozenset(("tool_result", SAVED_OUTPUT))


def _stored_row(row: MessageRow, packer=None) -> tuple:
    """A parsed message row as the store keeps it (large tool output compressed)."""
    if _packable(row):
        packed = packer.stored(row) if packer is not None else _compressed(row.text)
        if packed is not row.text:
            return row._replace(text=packed)
    return row


def stored_rows(messages, packer=None) -> list:
    """A batch's message rows as the store keeps them; the packer's work is taken back here."""
    if packer is not None:
        packer.settle(messages)
    return [_stored_row(m, packer) for m in messages]


# The most rows one multi-row statement takes: a power of two, so that a table has at most
# a dozen such statements in the connection's statement cache.
INSERT_CHUNK_ROWS = 4096


def insert_rows(db, head: str, width: int, rows, tail: str = "") -> None:
    """``head VALUES (?, ...), (?, ...) ... tail`` for every row, in a few statements.

    Chunks are powers of two, as many rows as SQLite's limit on bound values allows
    (999 where the sqlite3 module cannot say; 32766 in any SQLite since 3.32).
    """
    if not rows:
        return
    try:
        limit = db.getlimit(9)  # SQLITE_LIMIT_VARIABLE_NUMBER (Python 3.11+)
    except AttributeError:
        limit = 999
    most = 1
    while most * 2 <= min(INSERT_CHUNK_ROWS, limit // width):
        most *= 2
    at = 0
    while at < len(rows):
        n = most
        while n > len(rows) - at:
            n //= 2
        db.execute(_values_sql(head, width, n, tail), [value for row in rows[at:at + n] for value in row])
        at += n


@functools.lru_cache(maxsize=256)
def _values_sql(head: str, width: int, n: int, tail: str) -> str:
    one = "(" + ", ".join("?" * width) + ")"
    return f"{head} VALUES {', '.join([one] * n)}{tail}"


class Packer:
    """Compresses large tool outputs (and hashes what was read) on a worker thread.

    zlib and hashlib let go of the GIL while they work, so with a second core that work
    overlaps the parsing of the batch instead of following it. The reader offers each row
    as the parser makes it; the store takes each result back as it inserts the row
    (ThreadStore.apply), and compresses itself any row the worker has not started yet
    (the worker gets the GIL back only between the parser's switches, so it lags; two
    cores then share the rest). The worker starts with its first job, so a batch with
    nothing to compress or hash costs nothing.
    """

    def __init__(self):
        self._thread = None
        self._pending = set()  # keys handed to the worker and not yet taken back
        self._claimed = set()  # keys the worker or the caller has started on (never reused)
        self._ready = {}       # key -> (ok, result or the error it raised)

    def later(self, key, fn, arg) -> None:
        """Run fn(arg) on the worker; wait(key) gives its result."""
        if self._thread is None:
            import queue
            import threading
            self._todo, self._done = queue.SimpleQueue(), queue.SimpleQueue()
            self._lock = threading.Lock()
            self._thread = threading.Thread(target=self._work, name="cc-lhc-pack", daemon=True)
            self._thread.start()
        self._pending.add(key)
        self._todo.put((key, fn, arg))

    def _claim(self, key) -> bool:
        with self._lock:
            if key in self._claimed:
                return False
            self._claimed.add(key)
            return True

    def _work(self):
        while True:
            job = self._todo.get()
            if job is None:
                return
            key, fn, arg = job
            if not self._claim(key):
                continue  # the caller took it over
            try:
                self._done.put((key, True, fn(arg)))
            except BaseException as e:  # handed back: the store's transaction fails with it
                self._done.put((key, False, e))

    def wait(self, key, fn=None, arg=None):
        """The result of key's job; with fn, done here unless the worker has started it."""
        self._pending.discard(key)
        if fn is not None and key not in self._ready and self._claim(key):
            return fn(arg)
        while key not in self._ready:
            done, ok, value = self._done.get()
            self._ready[done] = (ok, value)
        ok, value = self._ready.pop(key)
        if not ok:
            raise value
        return value

    def offer(self, row: MessageRow) -> None:
        if _packable(row):
            self.later(row.seq, _compressed, row.text)

    def settle(self, rows) -> None:
        """Compress here, newest first, the rows the worker has not reached, while it goes on.

        The worker works from the oldest row on; the two meet in the middle, so the
        batch's insert waits for at most the one row the worker is busy with.
        """
        for row in reversed(rows):
            if row.seq in self._pending and row.seq not in self._ready and self._claim(row.seq):
                try:
                    self._ready[row.seq] = (True, _compressed(row.text))
                except BaseException as e:
                    self._ready[row.seq] = (False, e)

    def stored(self, row: MessageRow):
        """What the store keeps for row's text; a row never offered is compressed here."""
        if row.seq not in self._pending:
            return _compressed(row.text)
        return self.wait(row.seq, _compressed, row.text)

    def close(self) -> None:
        if self._thread is not None:
            self._todo.put(None)
            self._thread.join()
            self._thread = None


class StoredMessage(dict):
    """A stored message by column name, as the parser made it (text opened).

    Its whole block JSON ("data") is put together when first read: rebuilding it means
    encoding the message's text into it again, and a view reads every message of a thread
    but shows few of them as their recorded blocks. Every way of reading the dict sees it.
    """

    __slots__ = ("_stored_data",)

    def __missing__(self, key):
        if key != "data":
            raise KeyError(key)
        data = self._stored_data
        value = full_block_json(self["text"], data) if data else data
        # in its column's place, right after "text", so the dict reads as the row does
        keys = list(dict.keys(self))
        after = [(k, dict.pop(self, k)) for k in keys[keys.index("text") + 1:]]
        dict.__setitem__(self, "data", value)
        for k, v in after:
            dict.__setitem__(self, k, v)
        return value

    def whole(self) -> "StoredMessage":
        if not dict.__contains__(self, "data"):
            self["data"]
        return self

    def get(self, key, default=None):
        return self["data"] if key == "data" else dict.get(self, key, default)

    def __contains__(self, key):
        return key == "data" or dict.__contains__(self, key)

    def __iter__(self):
        return dict.__iter__(self.whole())

    def __len__(self):
        return dict.__len__(self.whole())

    def __bool__(self):  # (a row is never empty: a test of one need not put its data together)
        return True

    def __eq__(self, other):
        if isinstance(other, StoredMessage):
            other.whole()
        return dict.__eq__(self.whole(), other)

    __hash__ = None

    def keys(self):
        return dict.keys(self.whole())

    def values(self):
        return dict.values(self.whole())

    def items(self):
        return dict.items(self.whole())

    def copy(self):
        return dict(self.whole())

    def __reduce__(self):
        return (dict, (dict(self.whole()),))

    def __repr__(self):
        return dict.__repr__(self.whole())


def message_row(row) -> dict:
    """A stored messages row (MESSAGE_COLUMNS) as the parser made it: text opened, block
    JSON whole (made when first read, see StoredMessage)."""
    m = StoredMessage(zip(MESSAGE_COLUMNS, row))
    m["text"] = stored_text(m["text"])
    m._stored_data = dict.pop(m, "data")
    return m


def _migrate(db, migrations) -> None:
    """Apply the migrations this file lacks, all in one transaction (a new file gets the
    whole schema in one commit; a crash leaves it as it was)."""
    db.execute("BEGIN IMMEDIATE")
    try:
        # Read again inside the transaction: another process may have migrated meanwhile.
        current = db.execute("PRAGMA user_version").fetchone()[0]
        if current >= len(migrations):
            db.execute("COMMIT")
            return
        for index in range(current, len(migrations)):
            name, sql = migrations[index]
            if callable(sql):  # a step that depends on what this SQLite can do
                sql(db)
            else:
                for statement in sql.split(";\n"):
                    if statement.strip():
                        db.execute(statement)
            db.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied TEXT)")
            db.execute("INSERT INTO migrations VALUES (?, ?)", (name, utc_now_iso()))
        db.execute(f"PRAGMA user_version = {len(migrations)}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


class SchemaTooNew(LhcError):
    """A file written by a newer cc-lhc: left as it is."""


def open_db(path: str, migrations, *, synchronous="NORMAL", page_size=None, busy_ms=30_000):
    """Open one of our SQLite files, applying missing migrations in order.

    ``migrations`` is a list of (name, sql) and is append-only: a shipped entry is
    never edited or reordered; ``sql`` may instead be a function of the connection.
    PRAGMA user_version counts applied migrations, so a
    file written by a newer cc-lhc is refused instead of being silently rewritten.
    The missing migrations run in one explicit transaction (the sqlite3 module would
    otherwise commit DDL implicitly).
    """
    import sqlite3
    import time
    _touch_private(path)
    deadline = time.monotonic() + busy_ms / 1000
    pause = 0.01
    while True:
        try:
            db = sqlite3.connect(path, timeout=busy_ms / 1000, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise LhcError(f"{path} cannot be opened ({e}){_why_unopened(path, e)}") from e
        db.create_function("lhc_text", 1, stored_text, deterministic=True)
        db.create_function("lhc_no_nul", 1, _no_nul, deterministic=True)
        db.create_function("lhc_values", 1, _call_values, deterministic=True)
        db.create_function("lhc_block_values", 1, _block_values, deterministic=True)
        db.create_function("lhc_result_body", 2, _result_body, deterministic=True)
        db.create_function("lhc_block_strings", 1, _block_strings, deterministic=True)
        db.create_function("lhc_retrieval_call", 2, _retrieval_call, deterministic=True)
        try:
            db.execute(f"PRAGMA busy_timeout = {int(busy_ms)}")
            if page_size:  # takes effect only on a new, empty file; an existing one keeps its own
                db.execute(f"PRAGMA page_size = {int(page_size)}")
            db.execute("PRAGMA journal_mode = WAL")
            db.execute(f"PRAGMA synchronous = {synchronous}")
            have = db.execute("PRAGMA user_version").fetchone()[0]
            if have > len(migrations):
                raise SchemaTooNew(f"{path} was written by a newer cc-lhc (schema {have}; this version "
                                   f"knows {len(migrations)}). Upgrade cc-lhc to open it; the file is unchanged.")
            if have < len(migrations):
                _migrate(db, migrations)
            return db
        except sqlite3.OperationalError as e:
            db.close()
            # Switching a new file to WAL can fail at once, without waiting, while many
            # processes open it for the first time together: try again, within the budget.
            if "locked" in str(e) and time.monotonic() < deadline:
                time.sleep(pause)
                pause = min(pause * 2, 0.2)
                continue
            why = _why_unopened(path, e)
            raise LhcError(f"{path} cannot be " + (f"opened ({e}){why}" if why else
                                                    f"used as a cc-lhc database ({e})")
                           + "; it was left as it is") from e
        except sqlite3.DatabaseError as e:
            db.close()
            raise LhcError(f"{path} cannot be used as a cc-lhc database ({e}); it was left as it is") from e
        except BaseException:
            db.close()
            raise


def _why_unopened(path, error) -> str:
    """What keeps SQLite from a file of ours, when it is not the file itself: '; ...' or ''."""
    text = str(error)
    if not any(word in text for word in ("unable to open", "disk I/O error", "disk is full",
                                         "readonly database", "read-only")):
        return ""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.exists(path) and not os.access(path, os.R_OK | os.W_OK):
        return f": this user cannot read and write it (chmod 600 {path})"
    if _read_only_fs(folder):
        return f": {folder} is on a read-only file system"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f": this user cannot write in {folder}, where SQLite keeps its -wal and -shm files"
    free = _free_bytes(folder)
    if free is not None and free < (1 << 20):
        return f": its disk is full ({free:,} bytes free); the file is not known to be damaged"
    return ""


class Tx:
    """`with Tx(db):` runs the block in BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error)."""

    def __init__(self, db):
        self.db = db

    def __enter__(self):
        self.db.execute("BEGIN IMMEDIATE")
        return self.db

    def __exit__(self, exc_type, *_):
        if not exc_type:
            self.db.execute("COMMIT")
        elif self.db.in_transaction:
            # (SQLite rolls back by itself on some errors, a full disk among them: a second
            # ROLLBACK would fail and hide the error that says what happened)
            self.db.execute("ROLLBACK")
        return False


# The substring index: trigrams of each message's searchable text (SEARCH_BODY_SQL). It
# keeps neither the text (content='') nor positions (detail=none), about a fifth of what
# a full trigram index costs; a query asks for rows holding all of its trigrams and
# instr() on the text confirms each one, so a hit is always an exact match.
EXACT_INDEX_DDL = ("CREATE VIRTUAL TABLE IF NOT EXISTS messages_exact USING fts5 "
                   "(body, content='', detail=none, columnsize=0, tokenize='trigram case_sensitive 1')")

# What search reads of a message (alias m): its text, except that a tool call's JSON input
# becomes its values (strings decoded, and numbers), one a line (a command with quotes and
# backslashes reads as Claude wrote it); a tool output's blocks other than text (an MCP
# tool's search_result or document, a tool_reference), which its text names only by their
# type, add their strings; and a block kept only as JSON gives its strings but not its
# base64 payloads.
SEARCH_BODY_SQL = """CASE
 WHEN m.kind = 'tool_call' THEN coalesce(lhc_values(m.text) || char(10), '') || coalesce(m.tool_name, '')
 WHEN m.kind = 'tool_result' AND instr(m.data, '"content":[{') AND NOT instr(m.data, '"\\u0000cc-lhc:text"')
   THEN lhc_result_body(m.text, m.data)
 WHEN m.text IS NOT NULL AND m.data IS NOT NULL AND m.kind IN ('assistant_text', 'user_text', 'user_meta', 'api_error')
   THEN lhc_text(m.text) || coalesce(char(10) || lhc_block_values(m.data), '')
 WHEN m.text IS NOT NULL THEN lhc_text(m.text)
 ELSE lhc_block_strings(m.data)
 END"""


# Read in Python, one pass over each value: SQLite's json_tree walks a block node by node
# and looks up each string's neighbour by path (indexing a 60 MB image took 805 MB more).

def _result_body(text, data):
    """lhc_result_body() in SQL: a tool output as search reads it, its text and the strings
    of its blocks other than text (an MCP tool's search_result, a document's title: not
    their kinds, media types or signatures, nor a base64 source's data), one a line; its
    text alone when its blocks are no JSON."""
    body = stored_text(text)
    try:
        value = json.loads(data)
    except (ValueError, RecursionError, TypeError):
        return body
    content = value.get("content") if isinstance(value, dict) else None
    blocks = content if isinstance(content, list) else list(content.values()) if isinstance(content, dict) else ()
    out = [part for block in blocks if isinstance(block, dict) and block.get("type") != "text"
           for part in json_strings(block, skip=NAMING_KEYS, opaque=("base64",))]
    return (body or "") + ("\n" + "\n".join(out) if out else "")


def _block_strings(data):
    """lhc_block_strings() in SQL: a message that has only its blocks (an image, a redacted
    thinking) as search reads it: their strings, not a signature nor base64 or redacted
    data; None when there are none, or no JSON."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError, TypeError):
        return None
    out = list(json_strings(value, skip=frozenset(("signature",)), opaque=("base64", "redacted_thinking")))
    return "\n".join(out) if out else None


def _block_values(data):
    """lhc_block_values() in SQL: the strings and numbers of a text block's other fields (an
    answer's citations: the text cited, its url and title), as lhc_values reads a call's;
    the stand-in for the text itself (which the text column holds) left out."""
    if not isinstance(data, str):
        return None
    try:
        block = json.loads(data[len(KEPT_WHOLE):] if data.startswith(KEPT_WHOLE) else data,
                           parse_int=str, parse_float=_float_as_written, parse_constant=str)
    except (ValueError, RecursionError):
        return None
    if not isinstance(block, dict):
        return None
    rest = {k: v for k, v in block.items() if k not in ("type", "text")}  # (the text column holds the text)
    out = list(json_strings(rest, skip=OPAQUE_BLOCK_KEYS))
    return "\n".join(out) if out else None


# A block's fields that name what it is rather than say anything (its kind, a media type,
# a signature only the API reads back), and with them a citation's data only the API reads.
NAMING_KEYS = frozenset(("type", "signature", "media_type"))
OPAQUE_BLOCK_KEYS = NAMING_KEYS | {"encrypted_index", "encrypted_content"}


def _float_as_written(text: str) -> str:
    """A stored float as Claude Code wrote it: a thread captured before the parser kept
    JavaScript's spelling holds 1.234e-05 for 0.00001234 (and shows it so), so both are read."""
    return f"{js_float_text(float(text))}\n{text}" if _REPR_ONLY_FLOAT in text else text


def _call_values(text):
    """lhc_values() in SQL: a tool call's JSON input as search reads it, its string values
    and its numbers as the record holds them (3.141592653589793, 1e+21, a 20-digit id:
    SQLite's JSON reader would spell them its own way), one a line, never its keys; a text
    that is no JSON as it is; None for an input with no values."""
    if not isinstance(text, str):
        return text
    try:
        value = json.loads(text, parse_int=str, parse_float=_float_as_written, parse_constant=str)
    except (ValueError, RecursionError):
        return text
    out = list(json_strings(value))
    return "\n".join(out) if out else None


def json_strings(value, skip=frozenset(), opaque=()):
    """Every string a JSON value holds but its keys (and the values of keys in ``skip``, and
    the data of an object whose type is in ``opaque``: a base64 source's, say), in the order
    it holds them, without recursion (a value can nest deeper than Python recurses)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            yield item
        elif isinstance(item, dict):
            binary = item.get("type") in opaque
            todo.extend(v for k, v in reversed(list(item.items())) if k not in skip and not (binary and k == "data"))
        elif isinstance(item, list):
            todo.extend(reversed(item))

# What the substring index is given: FTS5 reads a text only up to its first NUL (a
# `find -print0` output, say), so a NUL goes in as a space; a query holds none, and the
# hits are checked against the text itself.
INDEXED_BODY_SQL = f"lhc_no_nul({SEARCH_BODY_SQL})"

# A large text with little repetition in it (base64, a hex dump, random data) costs the
# trigram index seconds a megabyte, with the thread's write lock held, where a log of the
# same size takes a fraction of one. Such a text is left out of the index and searched by
# a scan instead (meta key EXACT_SCAN_KEY + seq): a scan of a few megabytes is milliseconds.
EXACT_SCAN_MIN_CHARS = 256 * 1024
EXACT_SCAN_SAMPLE = 64 * 1024
EXACT_SCAN_KEY = "exact_scan:"


INDEX_CHUNK_ROWS = 1000  # messages a search index takes in one transaction


def index_chunks(done: int, top: int, deadline=None):
    """(after, upto) seq ranges of at most INDEX_CHUNK_ROWS from done to top: an index is
    filled a transaction each (its watermark moved with it), so a thread's first fill
    never holds the write lock for long and a run stopped part-way resumes there. With a
    ``deadline`` (time.monotonic) no chunk begins once it has passed."""
    import time
    while done < top and (deadline is None or time.monotonic() <= deadline):
        upto = min(top, done + INDEX_CHUNK_ROWS)
        yield done, upto
        done = upto


def costly_to_index(body) -> bool:
    """Whether a text is large and any of 8 samples spread over it (EXACT_SCAN_SAMPLE in
    all) does not compress to under half: base64 after an ordinary head counts."""
    import zlib
    if not isinstance(body, str) or len(body) < EXACT_SCAN_MIN_CHARS:
        return False
    width = EXACT_SCAN_SAMPLE // 8
    for i in range(8):
        at = (len(body) - width) * i // 7
        sample = body[at:at + width].encode("utf-8", "surrogatepass")
        if len(zlib.compress(sample, 1)) * 2 > len(sample):
            return True
    return False


# A scanned text made only of one of these alphabets (a hex dump, base64) cannot hold a
# query with any other character: its search skips it without reading it (its meta value
# names the alphabet; '' means any text). Neither holds a space: the index's body has one
# for each NUL the text holds, which a query may name.
SCAN_ALPHABETS = {"hex": b"0123456789abcdefABCDEF\r\n",
                  "base64": b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_\r\n"}


def scan_alphabet(body: str) -> str:
    """The name of the smallest SCAN_ALPHABETS entry that holds every character of body, or ''."""
    data = body.encode("utf-8", "surrogatepass")
    return next((name for name, chars in SCAN_ALPHABETS.items() if not data.translate(None, chars)), "")


def could_hold(alphabet: str, text: str) -> bool:
    """Whether a scanned text of that alphabet (scan_alphabet) can hold text at all."""
    chars = SCAN_ALPHABETS.get(alphabet)
    return chars is None or not text.encode("utf-8", "surrogatepass").translate(None, chars)


def _no_nul(value):
    """lhc_no_nul() in SQL (SQLite's own replace() cannot name a NUL)."""
    return value.replace("\0", " ") if isinstance(value, str) else value


@functools.lru_cache(maxsize=None)
def trigram_available() -> bool:
    """Whether this SQLite's FTS5 has the trigram tokenizer (3.34 and later), tried once."""
    import sqlite3
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE VIRTUAL TABLE t USING fts5 (x, tokenize='trigram')")
        return True
    except sqlite3.DatabaseError:
        return False
    finally:
        probe.close()


def _migrate_exact_search(db) -> None:
    """The substring index, where this SQLite has the trigram tokenizer.

    Without it the migration still counts as applied and search scans instead; a later
    run on an SQLite that has it creates the index then (ThreadStore.index_search).
    """
    if trigram_available():
        db.execute(EXACT_INDEX_DDL)


def _migrate_payload_once(db) -> None:
    """Rows may now hold compressed output (see stored_text): the word index reads its
    text through a view that opens it, and is filled again on the next index_search."""
    db.execute("DROP TABLE IF EXISTS messages_fts")
    db.execute("CREATE VIEW IF NOT EXISTS messages_plain AS SELECT seq, lhc_text(text) AS text FROM messages")
    db.execute("CREATE VIRTUAL TABLE messages_fts USING fts5 (text, content='messages_plain', "
               "content_rowid='seq')")
    db.execute("DELETE FROM meta WHERE key = 'fts_upto'")


def _migrate_words_of_values(db) -> None:
    """The word index reads what exact search reads (SEARCH_BODY_SQL): a tool call's
    string values, decoded, not its JSON (whose keys made every Bash call a hit for
    "command description"); it is filled again on the next index_search."""
    db.execute("DROP TABLE IF EXISTS messages_fts")
    _migrate_search_view(db)
    db.execute("CREATE VIRTUAL TABLE messages_fts USING fts5 (text, content='messages_plain', "
               "content_rowid='seq')")
    db.execute("DELETE FROM meta WHERE key = 'fts_upto'")


def _migrate_search_view(db) -> None:
    """The word index's view made again from SEARCH_BODY_SQL, which reads what it read: the
    index's rows stay as they are."""
    db.execute("DROP VIEW IF EXISTS messages_plain")
    db.execute(f"CREATE VIEW messages_plain AS SELECT m.seq AS seq, {SEARCH_BODY_SQL} AS text FROM messages m")


def _migrate_values_and_result_blocks(db) -> None:
    """Search reads more of a message now (SEARCH_BODY_SQL: a tool call's numbers, the
    strings of a tool output's blocks other than text): the word index's view is made
    again, and both indexes are filled again on the next index_search."""
    _migrate_words_of_values(db)
    db.execute("DROP TABLE IF EXISTS messages_exact")
    db.execute("DELETE FROM meta WHERE key = 'exact_upto' OR (key >= ? AND key < ?)",
               (EXACT_SCAN_KEY, EXACT_SCAN_KEY[:-1] + ";"))
    _migrate_exact_search(db)


THREAD_MIGRATIONS = [
    ("001_record", """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE sources (
    session_id TEXT PRIMARY KEY, path TEXT, start_offset INTEGER NOT NULL DEFAULT 0,
    offset INTEGER NOT NULL DEFAULT 0, lines INTEGER NOT NULL DEFAULT 0,
    parser_version INTEGER, degraded TEXT, first_seen TEXT, updated TEXT);
CREATE TABLE messages (
    seq INTEGER PRIMARY KEY, turn INTEGER NOT NULL, segment INTEGER NOT NULL,
    role TEXT NOT NULL, kind TEXT NOT NULL, text TEXT, data TEXT,
    tool_use_id TEXT, tool_name TEXT, is_error INTEGER, response_id TEXT, model TEXT,
    source_session TEXT, source_uuid TEXT, block INTEGER, line INTEGER, created TEXT);
CREATE UNIQUE INDEX messages_source ON messages (source_session, source_uuid, block);
CREATE INDEX messages_turn ON messages (turn);
CREATE INDEX messages_tool ON messages (tool_use_id);
CREATE TABLE turns (
    n INTEGER PRIMARY KEY, kind TEXT, status TEXT NOT NULL DEFAULT 'open',
    first_seq INTEGER, last_seq INTEGER, source_session TEXT, stop_reason TEXT,
    started TEXT, ended TEXT);
CREATE TABLE segments (
    turn INTEGER, idx INTEGER, first_seq INTEGER, last_seq INTEGER, reason TEXT,
    est_tokens INTEGER, PRIMARY KEY (turn, idx));
CREATE TABLE usage (
    response_id TEXT PRIMARY KEY, source_session TEXT, seq INTEGER, input INTEGER,
    cache_creation INTEGER, cache_read INTEGER, output INTEGER, model TEXT, created TEXT);
CREATE TABLE chain (session TEXT, uuid TEXT, PRIMARY KEY (session, uuid)) WITHOUT ROWID;
CREATE TABLE problems (
    id INTEGER PRIMARY KEY, session TEXT, line INTEGER, offset INTEGER, kind TEXT,
    detail TEXT, created TEXT);
CREATE TABLE telemetry (
    session TEXT, type TEXT, count INTEGER, bytes INTEGER, PRIMARY KEY (session, type));
CREATE VIRTUAL TABLE messages_fts USING fts5 (text, content='messages', content_rowid='seq')
"""),
    ("002_derivations_impressions", """
CREATE TABLE derivations (
    id INTEGER PRIMARY KEY, turn INTEGER NOT NULL, kind TEXT NOT NULL, text TEXT NOT NULL,
    source TEXT NOT NULL, model TEXT, input_tokens INTEGER, output_tokens INTEGER,
    format_version INTEGER NOT NULL DEFAULT 2, created TEXT);
CREATE INDEX derivations_turn ON derivations (turn, kind);
CREATE TABLE work (
    id INTEGER PRIMARY KEY, turn INTEGER NOT NULL, kind TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'queued', attempts INTEGER NOT NULL DEFAULT 0,
    owner TEXT, claimed_at TEXT, finished_at TEXT, error TEXT, UNIQUE (turn, kind));
CREATE TABLE impressions (
    id INTEGER PRIMARY KEY, session TEXT, command TEXT, labels TEXT, turns TEXT,
    bytes INTEGER, created TEXT);
CREATE TABLE inference_cost (
    id INTEGER PRIMARY KEY, purpose TEXT, calls INTEGER, input_tokens INTEGER,
    output_tokens INTEGER, created TEXT)
"""),
    ("003_derivation_retries", """
ALTER TABLE work ADD COLUMN expiries INTEGER NOT NULL DEFAULT 0;
ALTER TABLE work ADD COLUMN not_before TEXT;
ALTER TABLE inference_cost ADD COLUMN turn INTEGER
"""),
    ("004_agent_records", """
ALTER TABLE messages ADD COLUMN agent TEXT;
CREATE INDEX messages_agent ON messages (agent, seq) WHERE agent IS NOT NULL;
CREATE TABLE agents (
    agent_id TEXT PRIMARY KEY, source TEXT, kind TEXT, tool_use_id TEXT, prompt TEXT,
    first_seen TEXT)
"""),
    ("005_source_prefix_raw_lines", """
ALTER TABLE sources ADD COLUMN prefix_sha256 TEXT;
CREATE TABLE raw_lines (
    session TEXT, sha256 TEXT, line INTEGER, offset INTEGER, reason TEXT, raw BLOB,
    created TEXT, PRIMARY KEY (session, sha256))
"""),
    # The thread's own rows of registry.sqlite, kept in step with it, so a lost or
    # damaged registry can be rebuilt from the thread files alone (Registry.restore_missing).
    ("006_registry_copy", """
CREATE TABLE registry_aliases (
    session_id TEXT PRIMARY KEY, is_current INTEGER NOT NULL DEFAULT 0, created TEXT);
CREATE TABLE registry_rebuilds (
    session_id TEXT PRIMARY KEY, from_session TEXT NOT NULL, path TEXT NOT NULL, cwd TEXT,
    owner TEXT NOT NULL, status TEXT NOT NULL, created TEXT, settled TEXT);
CREATE TABLE registry_alarm (message TEXT NOT NULL, since TEXT NOT NULL)
"""),
    ("007_exact_search", _migrate_exact_search),
    ("008_payload_once", _migrate_payload_once),
    ("009_words_of_values", _migrate_words_of_values),
    # A kept line is one per place in its file: two lines of the same bytes are two rows
    # (filed by their hash alone, the second was lost); a line read again is still one.
    ("010_raw_lines_by_offset", """
CREATE TABLE raw_lines_by_offset (
    session TEXT, sha256 TEXT, line INTEGER, offset INTEGER, reason TEXT, raw BLOB,
    created TEXT, PRIMARY KEY (session, offset, sha256));
INSERT INTO raw_lines_by_offset SELECT session, sha256, line, offset, reason, raw, created FROM raw_lines;
DROP TABLE raw_lines;
ALTER TABLE raw_lines_by_offset RENAME TO raw_lines
"""),
    ("011_values_and_result_blocks", _migrate_values_and_result_blocks),
    ("012_numbers_as_written", _migrate_values_and_result_blocks),
    # (a call's tool name, a text block's citations, floats as Claude Code spelled them)
    ("013_names_and_citations", _migrate_values_and_result_blocks),
    # (the same reading, done in Python: the word index's view is made again, its rows kept)
    ("014_block_strings_in_python", _migrate_search_view),
]

REGISTRY_MIGRATIONS = [
    ("001_threads", """
CREATE TABLE threads (id TEXT PRIMARY KEY, cwd TEXT, created TEXT, origin TEXT);
CREATE TABLE aliases (
    alias TEXT PRIMARY KEY, thread_id TEXT NOT NULL REFERENCES threads (id),
    session_id TEXT NOT NULL, is_current INTEGER NOT NULL DEFAULT 0, created TEXT);
CREATE UNIQUE INDEX one_current_alias ON aliases (thread_id) WHERE is_current = 1
"""),
    ("002_pending_rebuilds", """
CREATE TABLE rebuilds (
    session_id TEXT PRIMARY KEY, thread_id TEXT NOT NULL, from_session TEXT NOT NULL,
    path TEXT NOT NULL, cwd TEXT, owner TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'pending',
    created TEXT, settled TEXT)
"""),
    ("003_thread_alarms", """
CREATE TABLE thread_alarms (
    thread_id TEXT PRIMARY KEY, message TEXT NOT NULL, since TEXT NOT NULL)
"""),
]

HOST_MIGRATIONS = [
    ("001_sessions", """
CREATE TABLE sessions (
    session_id TEXT PRIMARY KEY, thread_id TEXT, rollout_path TEXT, cwd TEXT,
    captured_offset INTEGER NOT NULL DEFAULT 0, replayed_prefix_bytes INTEGER NOT NULL DEFAULT 0,
    replayed_prefix_sha256 TEXT, created TEXT, updated TEXT)
"""),
    ("002_descriptors", """
CREATE TABLE descriptors (
    token TEXT PRIMARY KEY, path TEXT, thread_id TEXT, session_id TEXT, owner TEXT,
    created TEXT, revoked TEXT)
"""),
    ("003_receipts_repairs", """
CREATE TABLE cc_governor_receipts (
    id INTEGER PRIMARY KEY, replay_key TEXT NOT NULL UNIQUE, thread_id TEXT, session_id TEXT,
    state TEXT NOT NULL, source TEXT, provider_tokens INTEGER, estimate_tokens INTEGER,
    pressure INTEGER, trigger_tokens INTEGER, would_mutate INTEGER NOT NULL, outcome TEXT,
    outcome_at TEXT, created TEXT);
CREATE TABLE pointer_repairs (
    id INTEGER PRIMARY KEY, thread_id TEXT NOT NULL, from_session TEXT NOT NULL,
    to_session TEXT NOT NULL, created TEXT, repaired TEXT)
"""),
]


def session_alias(session_id: str) -> str:
    return f"claude-code:{session_id}"


def registry_known(home: "StateHome") -> bool:
    """True when there is a registry, or thread files it can be rebuilt from."""
    if os.path.exists(home.path("registry.sqlite")):
        return True
    return bool(_thread_file_ids(home))


def _thread_file_ids(home: "StateHome") -> set:
    try:
        names = os.listdir(home.path("threads"))
    except OSError:
        return set()
    return {n[:-7] for n in names if n.endswith(".sqlite") and is_uuid(n[:-7])}


class Registry:
    """registry.sqlite: threads and the session aliases that lead to them.

    Every change to a thread's rows is also written into that thread's own file
    (save_copy); opening the registry brings back any thread whose file exists but
    which the registry lacks, from that copy (restore_missing).
    """

    # What restore_missing last found nothing to do against, per registry path: the
    # registry file's identity and the threads folder's mtime. A thread can only be
    # missing when one of them changed (the registry was lost or replaced, or thread
    # files were put in), so a process that opens the registry often checks once.
    _checked = {}
    _named = set()  # thread files restore_missing could not read that it has said so of

    def __init__(self, home: "StateHome", restore=True):
        self.home = home
        self.unreadable = []  # thread files restore_missing could not read
        path = home.path("registry.sqlite")
        self.db = open_db(path, REGISTRY_MIGRATIONS, synchronous="FULL")
        if restore:
            seen = self._state(path)
            if seen is None or Registry._checked.get(path) != seen:
                self.restore_missing()
                Registry._checked[path] = self._state(path)

    def _state(self, path):
        try:
            reg, threads = os.stat(path), os.stat(self.home.path("threads"))
        except OSError:
            return None
        return reg.st_dev, reg.st_ino, threads.st_mtime_ns

    # -- the copy each thread file carries ----------------------------------------------

    def save_copy(self, thread_id: str, create: bool = False) -> bool:
        """Write this thread's registry rows into its thread file (replacing the old copy).

        A failure is logged, not raised: the registry change itself is committed, and a
        stale copy only matters if the registry is later lost. A thread file that is gone
        is not made again here (``create`` only for a new thread): an empty record in its
        place would hide that the record was lost (doctor names it). Returns whether the
        copy was written.
        """
        db = self.db
        thread = db.execute("SELECT cwd, created, origin FROM threads WHERE id = ?", (thread_id,)).fetchone()
        if thread is None:
            return False
        aliases = db.execute("SELECT session_id, is_current, created FROM aliases WHERE thread_id = ?",
                             (thread_id,)).fetchall()
        rebuilds = db.execute("SELECT session_id, from_session, path, cwd, owner, status, created, "
                              "settled FROM rebuilds WHERE thread_id = ?", (thread_id,)).fetchall()
        alarm = db.execute("SELECT message, since FROM thread_alarms WHERE thread_id = ?",
                           (thread_id,)).fetchall()
        cwd, created, origin = thread
        meta = {"cwd": cwd, "created": created, "origin": origin,
                "project_slug": project_slug(cwd) if cwd else None, "registry_copied": utc_now_iso()}
        try:
            store = ThreadStore(self.home, thread_id) if create else ThreadStore.existing(self.home, thread_id)
            try:
                with Tx(store.db) as tdb:
                    tdb.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", meta.items())
                    tdb.execute("DELETE FROM registry_aliases")
                    tdb.executemany("INSERT INTO registry_aliases VALUES (?, ?, ?)", aliases)
                    tdb.execute("DELETE FROM registry_rebuilds")
                    tdb.executemany("INSERT INTO registry_rebuilds VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rebuilds)
                    tdb.execute("DELETE FROM registry_alarm")
                    tdb.executemany("INSERT INTO registry_alarm VALUES (?, ?)", alarm)
            finally:
                store.close()
            return True
        except Exception as e:
            self.home.log("registry_copy_failed", thread=thread_id, error=repr(e))
            return False

    def restore_missing(self, announce=True) -> list:
        """Bring back threads whose files exist but the registry lacks; returns their ids."""
        files = _thread_file_ids(self.home)
        if not files:
            return []
        known = {r[0] for r in self.db.execute("SELECT id FROM threads")}
        copies = []
        for thread_id in sorted(files - known):
            try:
                copy = thread_copy(self.home, thread_id)
            except LhcError as e:  # said, not passed over: this thread is lost to the registry
                self.home.log("registry_restore_skipped", thread=thread_id, error=str(e))
                self.unreadable.append(thread_id)
                if announce and thread_id not in Registry._named:  # once a process (a live one too)
                    Registry._named.add(thread_id)
                    say(f"{e} (it is left out of registry.sqlite)")
                continue
            if copy:
                copies.append(copy)
        if not copies:
            return []
        restored = []
        with Tx(self.db) as db:
            for copy in copies:
                if db.execute("SELECT 1 FROM threads WHERE id = ?", (copy.thread_id,)).fetchone():
                    continue  # another process restored it while we read
                self._insert_copy(db, copy)
                restored.append(copy.thread_id)
        if restored:
            if announce:
                say(f"registry.sqlite lacked {len(restored)} thread(s) whose files exist; "
                    "rebuilt their entries from the thread files")
            self.home.log("registry_rebuilt", threads=restored,
                          from_sources_only=[c.thread_id for c in copies if c.legacy])
        return restored

    def _insert_copy(self, db, copy) -> None:
        tid = copy.thread_id
        db.execute("INSERT INTO threads VALUES (?, ?, ?, ?)", (tid, copy.cwd, copy.created, copy.origin))
        for session_id, is_current, created in copy.aliases:
            taken = db.execute("SELECT thread_id FROM aliases WHERE alias = ?",
                               (session_alias(session_id),)).fetchone()
            if taken:  # bound elsewhere since the loss: never bound twice
                self.home.log("registry_alias_conflict", thread=tid, session=session_id,
                              bound_to=taken[0])
                continue
            db.execute("INSERT INTO aliases VALUES (?, ?, ?, ?, ?)",
                       (session_alias(session_id), tid, session_id, int(bool(is_current)), created))
        db.executemany("INSERT OR IGNORE INTO rebuilds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       [(r[0], tid) + tuple(r[1:]) for r in copy.rebuilds])
        db.executemany("INSERT OR IGNORE INTO thread_alarms VALUES (?, ?, ?)",
                       [(tid, message, since) for message, since in copy.alarm])

    def thread_for_session(self, session_id: str):
        row = self.db.execute("SELECT thread_id FROM aliases WHERE alias = ?",
                              (session_alias(session_id),)).fetchone()
        return row[0] if row else None

    def current_session(self, thread_id: str):
        row = self.db.execute("SELECT session_id FROM aliases WHERE thread_id = ? AND is_current = 1",
                              (thread_id,)).fetchone()
        return row[0] if row else None

    def create_thread(self, session_id: str, cwd: str, origin: str, thread_id=None) -> str:
        """A new thread whose current session is session_id (``thread_id``: one whose
        file was made ready under that id first, see fork_thread)."""
        thread_id = thread_id or new_session_id()
        now = utc_now_iso()
        with Tx(self.db):
            self.db.execute("INSERT INTO threads VALUES (?, ?, ?, ?)", (thread_id, cwd, now, origin))
            self.db.execute("INSERT INTO aliases VALUES (?, ?, ?, 1, ?)",
                            (session_alias(session_id), thread_id, session_id, now))
        self.save_copy(thread_id, create=True)
        return thread_id

    def drop_thread(self, thread_id: str) -> None:
        """Remove a thread that holds nothing worth keeping: its rows and its file go in
        one registry transaction (the file first), so a registry repair running meanwhile
        can never bring back a thread without its file."""
        path = self.home.path("threads", f"{thread_id}.sqlite")
        with Tx(self.db) as db:
            for table, column in (("aliases", "thread_id"), ("rebuilds", "thread_id"),
                                  ("thread_alarms", "thread_id"), ("threads", "id")):
                db.execute(f"DELETE FROM {table} WHERE {column} = ?", (thread_id,))
            for leftover in (path, path + "-wal", path + "-shm"):
                try:
                    os.unlink(leftover)
                except FileNotFoundError:
                    pass

    def forget_abandoned(self, session_id: str) -> bool:
        """Free the id of a rebuild that was rolled back and never became current (an
        interrupted `rollout write`, to be run again under the same id); whether it was one."""
        with Tx(self.db) as db:
            row = db.execute("SELECT r.thread_id FROM rebuilds r JOIN aliases a ON a.alias = ? "
                             "WHERE r.session_id = ? AND r.status = 'abandoned' AND a.is_current = 0",
                             (session_alias(session_id), session_id)).fetchone()
            if row is None:
                return False
            db.execute("DELETE FROM aliases WHERE alias = ?", (session_alias(session_id),))
            db.execute("DELETE FROM rebuilds WHERE session_id = ?", (session_id,))
        self.save_copy(row[0])
        return True

    def dropped(self, thread_id: str) -> bool:
        """Whether the thread is gone from the registry: one a launch dropped (nothing worth
        keeping) while a reader listed it. The write lock is taken to ask, so a drop under
        way (its file deleted inside its transaction) has committed first."""
        try:
            with Tx(self.db) as db:
                return db.execute("SELECT 1 FROM threads WHERE id = ?", (thread_id,)).fetchone() is None
        except sqlite3_errors():
            return False

    def add_alias(self, session_id: str, thread_id: str, current: bool) -> None:
        """Bind a session to a thread; with current=True it becomes the thread's current alias."""
        now = utc_now_iso()
        with Tx(self.db):
            row = self.db.execute("SELECT thread_id FROM aliases WHERE alias = ?",
                                  (session_alias(session_id),)).fetchone()
            if row and row[0] != thread_id:
                raise usage_error(f"session {session_id} already belongs to thread {row[0]}")
            if current:
                self.db.execute("UPDATE aliases SET is_current = 0 WHERE thread_id = ?", (thread_id,))
            self.db.execute("INSERT INTO aliases VALUES (?, ?, ?, ?, ?) ON CONFLICT (alias) DO UPDATE "
                            "SET is_current = excluded.is_current",
                            (session_alias(session_id), thread_id, session_id, int(current), now))
        self.save_copy(thread_id)

    def thread_cwd(self, thread_id: str):
        row = self.db.execute("SELECT cwd FROM threads WHERE id = ?", (thread_id,)).fetchone()
        return row[0] if row else None

    def threads(self):
        return self.db.execute(
            "SELECT t.id, t.cwd, t.created, t.origin, a.session_id FROM threads t "
            "LEFT JOIN aliases a ON a.thread_id = t.id AND a.is_current = 1 ORDER BY t.created"
        ).fetchall()

    def resolve_prefix(self, prefix: str) -> str:
        """A thread id from a unique prefix (or a session id of the thread)."""
        if not prefix.strip():
            raise usage_error("name a thread (an id prefix; see cc-lhc threads)")
        rows = [r[0] for r in self.db.execute("SELECT id FROM threads WHERE substr(id, 1, ?) = ? "
                                              "ORDER BY id", (len(prefix), prefix.lower())).fetchall()]
        if not rows and is_uuid(prefix):  # (a session id as Claude was given it, in either case)
            rows = [r[0] for r in self.db.execute(
                "SELECT DISTINCT thread_id FROM aliases WHERE alias = ? COLLATE NOCASE ORDER BY thread_id",
                (session_alias(prefix),))]
        if not rows:
            raise usage_error(f"no thread matches {prefix!r} (see cc-lhc threads)")
        if len(rows) > 1:
            raise usage_error(f"{prefix!r} matches {len(rows)} threads: " + ", ".join(rows)
                              + "; give more of the id")
        return rows[0]


class HostDB:
    """cc-lhc.sqlite: what this host knows about each Claude session it has run."""

    def __init__(self, home: "StateHome"):
        self.db = open_db(home.path("cc-lhc.sqlite"), HOST_MIGRATIONS)

    def note_session(self, session_id, thread_id, rollout_path, cwd):
        now = utc_now_iso()
        with Tx(self.db):
            self.db.execute(
                "INSERT INTO sessions (session_id, thread_id, rollout_path, cwd, created, updated) "
                "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (session_id) DO UPDATE SET "
                "thread_id = excluded.thread_id, rollout_path = excluded.rollout_path, "
                "updated = excluded.updated", (session_id, thread_id, rollout_path, cwd, now, now))

    def session(self, session_id):
        row = self.db.execute("SELECT session_id, thread_id, rollout_path, cwd, captured_offset, "
                              "replayed_prefix_bytes, replayed_prefix_sha256 FROM sessions "
                              "WHERE session_id = ?", (session_id,)).fetchone()
        if not row:
            return None
        keys = ("session_id", "thread_id", "rollout_path", "cwd", "captured_offset",
                "replayed_prefix_bytes", "replayed_prefix_sha256")
        return dict(zip(keys, row))


# A thread file has some forty tables and indexes of at least one page each; 2 KiB pages
# halve what an empty thread costs (180 KiB at 4 KiB) and are as quick for its rows.
THREAD_PAGE_SIZE = 2048
# SQLite's own default: after a commit leaves the WAL this many pages long, it is copied
# into the file (see ThreadStore.checkpoint_on_commit).
WAL_CHECKPOINT_PAGES = 1000


# The call that started agent ``a`` (its {column}): the main conversation's, else one a
# subagent made (a subagent can start one of its own), never a copy in the agent's own file
# (a fork holds its parent's call).
STARTING_CALL_SQL = ("SELECT coalesce((SELECT c.{column} FROM messages c WHERE c.tool_use_id = a.tool_use_id "
                     "AND c.kind = 'tool_call' AND c.agent IS NULL), (SELECT c.{column} FROM messages c WHERE "
                     "c.tool_use_id = a.tool_use_id AND c.kind = 'tool_call' AND c.agent IS NOT a.agent_id "
                     "ORDER BY c.seq LIMIT 1))")


class ThreadStore:
    """threads/<id>.sqlite: one thread's append-only canonical record.

    Messages and turns are only ever added; their labels (mN, tN) never change. The
    byte offset read from each source transcript is written in the same transaction
    as the messages it produced, which is what makes capture safe to kill anywhere.
    """

    def __init__(self, home: "StateHome", thread_id: str):
        self.thread_id = thread_id
        home.ensure("threads")
        self.path = home.path("threads", f"{thread_id}.sqlite")
        self.scratch = home.scratch  # a throwaway store: never fsynced, nor copied apart (checkpoint_apart)
        self.db = open_db(self.path, THREAD_MIGRATIONS, page_size=THREAD_PAGE_SIZE,
                          synchronous="OFF" if home.scratch else "NORMAL")
        self._checkpointer = None  # checkpoint_apart's thread
        if not self.db.execute("SELECT 1 FROM meta WHERE key = 'thread_id'").fetchone():
            with Tx(self.db):
                self.db.execute("INSERT OR IGNORE INTO meta VALUES ('thread_id', ?)", (thread_id,))

    @classmethod
    def existing(cls, home: "StateHome", thread_id: str) -> "ThreadStore":
        """The store of a thread known to have a record, for commands that read it: a file
        that is gone or empty is an error that names it, never a new empty record made in
        its place (which would hide that the record was lost)."""
        path = home.path("threads", f"{thread_id}.sqlite")
        try:
            st = os.stat(path)
            size = st.st_size
        except FileNotFoundError:
            raise LhcError(f"thread {thread_id}: its record {path} is missing; cc-lhc doctor says more")
        except OSError as e:
            raise LhcError(f"thread {thread_id}: its record {path} cannot be read ({e.strerror})")
        if not stat.S_ISREG(st.st_mode):
            raise LhcError(f"thread {thread_id}: its record {path} is a {_file_kind(st.st_mode)}, not a "
                           "regular file; cc-lhc doctor says more")
        if size == 0:
            raise LhcError(f"thread {thread_id}: its record {path} is empty; cc-lhc doctor says more")
        try:
            return cls(home, thread_id)
        except (OSError, sqlite3_errors()) as e:
            raise LhcError(f"thread {thread_id}: its record {path} cannot be opened ({e})") from e

    def close(self):
        if self._checkpointer is not None:
            self._checkpointer.join()  # (its connection closes first, so this one's close is the last)
        self.db.close()

    # -- sources ----------------------------------------------------------------

    def source(self, session_id):
        row = self.db.execute("SELECT path, start_offset, offset, lines, degraded, prefix_sha256 "
                              "FROM sources WHERE session_id = ?", (session_id,)).fetchone()
        return None if row is None else dict(zip(("path", "start_offset", "offset", "lines",
                                                  "degraded", "prefix_sha256"), row))

    def add_source(self, session_id, path, start_offset=0, prefix_uuids=()):
        """Start reading a session; a replayed prefix is skipped, its uuids still known."""
        now = utc_now_iso()
        with Tx(self.db):
            self.db.execute("INSERT OR IGNORE INTO sources (session_id, path, start_offset, offset, "
                            "parser_version, first_seen, updated) VALUES (?, ?, ?, ?, ?, ?, ?)",
                            (session_id, path, start_offset, start_offset, PARSER_VERSION, now, now))
            self.db.executemany("INSERT OR IGNORE INTO chain VALUES (?, ?)",
                                [(session_id, u) for u in prefix_uuids])

    def parse_state(self, session_id, kept=None) -> ParseState:
        """Rebuild the parser's memory from the record (after a restart or a kill).

        ``kept``: the memory of this session's parser after a read that stored everything
        it parsed, this process's own. What only that parser writes (the session's uuids,
        its main calls still unanswered, its sidechains: a long session's many rows) is
        taken from it; the rest, which other writers change too (a subagent file's
        capture takes labels, a swap ends a turn), is read again."""
        db = self.db
        state = ParseState()
        state.next_seq = (db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0) + 1
        state.next_turn = (db.execute("SELECT max(n) FROM turns").fetchone()[0] or 0) + 1
        self._open_turn_state(state)
        if state.open_turn is None:
            state.closed_response = self._closed_response()
        unanswered = db.execute(
            "SELECT c.agent, c.tool_use_id, c.seq, c.tool_name FROM messages c WHERE c.kind = 'tool_call' "
            + ("AND c.agent IS NOT NULL " if kept is not None else "") + "AND NOT EXISTS "
            "(SELECT 1 FROM messages r WHERE r.kind = 'tool_result' AND r.tool_use_id = c.tool_use_id "
            "AND r.agent IS c.agent)").fetchall()
        for agent, tool_use_id, seq, tool_name in unanswered:
            (state.agent_calls.setdefault(agent, {}) if agent else state.outstanding)[tool_use_id] = seq
            if not agent and tool_name in RUN_ENDING_TOOLS:
                state.ending_calls.add(tool_use_id)
        if kept is not None:
            state.outstanding, state.ending_calls = kept.outstanding, kept.ending_calls
            state.known_uuids, state.sidechains = kept.known_uuids, kept.sidechains
        else:
            state.known_uuids = {r[0] for r in db.execute("SELECT uuid FROM chain WHERE session = ?",
                                                          (session_id,))}
            state.sidechains = dict(db.execute("SELECT source_uuid, agent FROM messages WHERE agent IS NOT "
                                               "NULL AND source_session = ?", (session_id,)).fetchall())
            state.sidechains.update((a, a) for (a,) in db.execute(
                "SELECT agent_id FROM agents WHERE source = ? AND kind = 'sidechain'", (session_id,)))
            prefix = f"{SIDECHAIN_KEY}{session_id}:"
            state.sidechains.update((key[len(prefix):], agent) for key, agent in db.execute(
                "SELECT key, value FROM meta WHERE key >= ? AND key < ?", (prefix, prefix + "\uffff")))
        for field, key, default in PERSISTED_STATE:
            row = db.execute("SELECT value FROM meta WHERE key = ?", (key + session_id,)).fetchone()
            setattr(state, field, restored_value(row and row[0], default))
        views = dict(db.execute("SELECT type, count FROM telemetry WHERE session = ? AND type IN (?, ?)",
                                (session_id, VIEW_OPENED, VIEW_CLOSED)).fetchall())
        state.replaying = views.get(VIEW_OPENED, 0) > views.get(VIEW_CLOSED, 0)
        row = db.execute("SELECT response_id, source_session FROM messages WHERE seq = (SELECT max(seq) "
                         "FROM messages WHERE agent IS NULL AND role = 'assistant')").fetchone()
        state.last_response = row[0] if row and row[1] == session_id else None
        return state

    def _open_turn_state(self, state: ParseState):
        """The parser's memory of the newest main-chain message and the open turn (into
        state); returns the session the open turn came from (None when none is open)."""
        db = self.db
        state.last_seq = db.execute("SELECT max(seq) FROM messages WHERE agent IS NULL").fetchone()[0]
        row = db.execute("SELECT n, kind, first_seq, source_session FROM turns WHERE status = 'open' "
                         "ORDER BY n DESC LIMIT 1").fetchone()
        if row:
            state.open_turn, state.open_kind, state.turn_first = row[0], row[1], row[2]
            # (whether the model has spoken in it: a command's turn, a companion's and a
            # continuation's end each depend on that, read in a later batch or not)
            state.answering = db.execute("SELECT 1 FROM messages WHERE turn = ? AND agent IS NULL AND "
                                         "role = 'assistant' LIMIT 1", (row[0],)).fetchone() is not None
            seg = db.execute("SELECT max(segment) FROM messages WHERE turn = ? AND agent IS NULL",
                             (row[0],)).fetchone()[0]
            state.segment = seg or 0
            closed = db.execute("SELECT 1 FROM segments WHERE turn = ? AND idx = ?",
                                (row[0], state.segment)).fetchone()
            if closed:
                state.segment += 1
            else:
                # Measured in Python exactly as the parser measured it (SQLite's length()
                # differs: it skips a tool call's block and stops at a NUL), or a restart
                # would cut this segment somewhere a one-shot read would not.
                rows = db.execute("SELECT seq, kind, text, data FROM messages WHERE turn = ? "
                                  "AND segment = ? ORDER BY seq", (row[0], state.segment)).fetchall()
                state.segment_first = rows[0][0] if rows else None
                state.segment_bytes = sum(segment_size(kind, stored_text(text), data)
                                          for _, kind, text, data in rows)
        return row[3] if row else None

    def agent_parse_state(self, source_key, agent_id) -> ParseState:
        """The parser's memory for one subagent file: only labels and its own chain."""
        db = self.db
        state = ParseState()
        state.next_seq = (db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0) + 1
        state.next_turn = (db.execute("SELECT max(n) FROM turns").fetchone()[0] or 0) + 1
        # Its own records, and those of every other file of the same agent: a swap that
        # carries a workflow copies the run's agent files into the new session's folder.
        suffix = f"/agent-{agent_id}.jsonl"
        state.known_uuids = {r[0] for r in db.execute(
            "SELECT uuid FROM chain WHERE session = ? OR session IN (SELECT session_id FROM sources "
            "WHERE substr(session_id, -length(?2)) = ?2)", (source_key, suffix))}
        state.agent_calls[agent_id] = dict(db.execute(
            "SELECT c.tool_use_id, c.seq FROM messages c WHERE c.agent = ? AND c.kind = 'tool_call' "
            "AND NOT EXISTS (SELECT 1 FROM messages r WHERE r.agent = c.agent AND r.kind = 'tool_result' "
            "AND r.tool_use_id = c.tool_use_id)", (agent_id,)).fetchall())
        return state

    def agent_turn(self, agent_id, started=None) -> int:
        """The turn of the call that started an agent; for one no call started (Claude's own
        compaction, a 2.0 warm-up), the turn running when its first record was written
        (``started()``, its timestamp, asked only then), else the first turn; with no turn
        yet, 0."""
        db = self.db
        row = db.execute(f"SELECT ({STARTING_CALL_SQL.format(column='turn')}) FROM agents a WHERE a.agent_id = ?",
                         (agent_id,)).fetchone()
        if row and row[0] is not None:
            return row[0]
        started = started() if started is not None else None
        if isinstance(started, str):
            row = db.execute("SELECT max(turn) FROM messages WHERE agent IS NULL AND created <= ?",
                             (started,)).fetchone()
            if row[0] is not None:
                return row[0]
        return db.execute("SELECT coalesce(min(n), 0) FROM turns").fetchone()[0]

    def _closed_response(self):
        """Where the last turn stood when its final response closed it (see ParseState)."""
        db = self.db
        row = db.execute("SELECT n, last_seq FROM turns WHERE status = 'closed' ORDER BY n DESC "
                         "LIMIT 1").fetchone()
        if not row or row[0] != db.execute("SELECT max(n) FROM turns").fetchone()[0]:
            return None
        last = db.execute("SELECT role, response_id, segment FROM messages WHERE seq = ?",
                          (row[1],)).fetchone()
        if not last or last[0] != "assistant" or last[1] is None:
            return None
        rows = db.execute("SELECT seq, kind, text, data FROM messages WHERE turn = ? AND segment = ? "
                          "ORDER BY seq", (row[0], last[2])).fetchall()
        size = sum(segment_size(kind, stored_text(text), data) for _, kind, text, data in rows)
        return ClosedResponse(last[1], row[0], last[2], rows[0][0] if rows else None, size)

    def apply(self, session_id, out: ParseOutput, new_offset: int, lines_read: int,
              prefix_sha256=None, packer=None, rows=None) -> None:
        """Write one parsed batch and the offset it reached, atomically.

        ``prefix_sha256`` is the hash of every byte captured up to ``new_offset``: what
        the next run checks the file against before trusting the offset. ``packer`` (a
        Packer) holds the batch's large outputs already compressed, or on their way;
        ``rows``, when given, are the batch's messages already as stored (stored_rows).

        Every table is written in a few multi-row statements, not one per row: SQLite
        then does a whole chunk in one step with the GIL let go, so a writer thread
        (Capture's BatchWriter) waits for the GIL a few times a batch, not once a row.
        """
        db = self.db
        now = utc_now_iso()
        if rows is None:
            rows = stored_rows(out.messages, packer)
        with Tx(db):
            insert_rows(db, "INSERT INTO turns (n, kind, first_seq, source_session, started)", 5,
                        out.turns_opened)
            db.executemany("UPDATE turns SET kind = ? WHERE n = ?", [(kind, n) for n, kind in out.turn_kinds])
            insert_rows(db, f"INSERT INTO messages ({', '.join(MESSAGE_COLUMNS)})", len(MESSAGE_COLUMNS), rows)
            self._write_closes(out)
            insert_rows(db, "INSERT OR REPLACE INTO usage", 9, [(rid,) + row for rid, row in out.usage.items()])
            insert_rows(db, "INSERT OR IGNORE INTO chain", 2, out.chain)
            if out.agents:
                self._note_agents(out.agents, now)
            insert_rows(db, "INSERT OR REPLACE INTO meta", 2, [(f"{SIDECHAIN_KEY}{session_id}:{uuid}", agent)
                                                             for uuid, agent in out.sidechain_records])
            keys = {field: key for field, key, _d in PERSISTED_STATE}
            for field, value in out.state.items():
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (keys[field] + session_id,
                                                                        persisted_value(value)))
            if out.problems:
                insert_rows(db, "INSERT INTO problems (session, line, offset, kind, detail, created)", 6,
                            [p + (now,) for p in out.problems])
                first = out.problems[0]
                db.execute("UPDATE sources SET degraded = coalesce(degraded, ?) WHERE session_id = ?",
                           (f"{first.kind} at line {first.line}: {first.detail}", session_id))
            raw_lines = [_raw_line_row(r, now) for r in out.raw_lines]
            tallies = [(rtype, count, size) for rtype, (count, size) in out.telemetry.items()]
            if raw_lines or tallies:
                raw_lines, tallies = self._met_again(session_id, raw_lines, tallies)
            insert_rows(db, "INSERT OR IGNORE INTO raw_lines", 7, raw_lines)
            self._count_all(session_id, tallies)
            db.execute("UPDATE sources SET offset = ?, lines = lines + ?, parser_version = ?, "
                       "updated = ?, prefix_sha256 = ? WHERE session_id = ?",
                       (new_offset, lines_read, PARSER_VERSION, now, prefix_sha256, session_id))

    def _write_closes(self, out: ParseOutput) -> None:
        """The turns and segments a batch closed (inside the caller's transaction)."""
        if out.turns_closed:
            # A turn may close twice in one batch (its final response rejoined it): the last wins.
            closed = {c.n: c for c in out.turns_closed}
            insert_rows(self.db, "WITH closed (n, last_seq, status, stop_reason, ended) AS (", 5,
                        list(closed.values()), ") UPDATE turns SET (last_seq, status, stop_reason, ended) = "
                        "(SELECT last_seq, status, stop_reason, ended FROM closed WHERE closed.n = turns.n) "
                        "WHERE n IN (SELECT n FROM closed)")
        insert_rows(self.db, "INSERT OR REPLACE INTO segments", 6, out.segments)

    def interrupt_open_turn(self, session_id, why: str):
        """End the turn a session left open once its Claude is gone for good (a swap ended
        it): nothing more can come for it, so it no longer holds every later seam open. The
        turn is interrupted, as a new prompt would have cut it; returns its number or None."""
        state = ParseState()
        if self._open_turn_state(state) != session_id or state.last_seq is None:
            return None
        n, parser = state.open_turn, RolloutParser(session_id, state, 0)
        parser._close_turn(state.last_seq, "interrupted", why, utc_now_iso())
        with Tx(self.db):
            self._write_closes(parser.take())
        return n

    def checkpoint_on_commit(self, yes: bool) -> None:
        """Whether a commit that leaves the WAL past SQLite's threshold copies it into the file.

        Each such copy costs two fsyncs and restarts the WAL. A catch-up of several batches
        (several MB each) turns this off for all of them and has checkpoint_apart copy them
        at once when it is done; a live read of a few lines leaves it on.
        """
        self.db.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES if yes else 0}")

    def checkpoint_apart(self) -> None:
        """Copy the WAL into the file on a connection and a thread of their own: what a
        long catch-up does once its batches are written (see checkpoint_on_commit).

        The copy of its WAL (tens of ms for 40 MB, and the fsyncs that make the batches
        safe from a power cut) then runs beside what comes next instead of before it. It is
        SQLite's passive checkpoint: it never waits for this connection, and this
        connection's own later commits never wait for it (one that finds it running leaves
        the copy to it). Stopping it half-way, by a crash or the process's exit, loses
        nothing: the WAL still holds every page. A throwaway store is left to its close,
        which copies it as SQLite does when its last connection closes. close() waits for it.
        """
        if self.scratch or (self._checkpointer is not None and self._checkpointer.is_alive()):
            return
        import threading

        def copy():
            import sqlite3
            try:
                db = sqlite3.connect(self.path, timeout=0, isolation_level=None, check_same_thread=False)
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                finally:
                    db.close()
            except sqlite3.Error:
                pass  # (left to the next commit's own checkpoint)
        self._checkpointer = threading.Thread(target=copy, name="cc-lhc-checkpoint", daemon=True)
        self._checkpointer.start()

    def _count(self, session_id, rtype, count, size):
        self._count_all(session_id, [(rtype, count, size)])

    def _count_all(self, session_id, tallies):
        """Add (type, count, bytes) tallies to the session's telemetry."""
        insert_rows(self.db, "INSERT INTO telemetry", 4, [(session_id,) + t for t in tallies],
                    " ON CONFLICT (session, type) DO UPDATE SET count = count + excluded.count, "
                    "bytes = bytes + excluded.bytes")

    def restart_source(self, session_id, kind, detail):
        """The transcript no longer holds what was captured: read it again from its start.

        Nothing captured is removed; the parser knows every uuid already taken, so the
        second reading adds only records the first never saw. The event is a problem (the
        thread is degraded, and says why) and a count.
        """
        now = utc_now_iso()
        db = self.db
        with Tx(db):
            held = {"raw": dict(db.execute("SELECT sha256, count(*) FROM raw_lines WHERE session = ? "
                                           "AND reason != ? GROUP BY sha256", (session_id, TORN_LINE))),
                    "tally": {rtype: [count, size] for rtype, count, size in db.execute(
                        "SELECT type, count, bytes FROM telemetry WHERE session = ? AND type NOT IN (?, ?, ?)",
                        (session_id, "transcript_shrank", "transcript_rewritten", TORN_LINE))}}
            # Every record read before is met again: the reading takes it for a copy (a duplicate_record).
            (known,) = db.execute("SELECT count(*) FROM chain WHERE session = ?", (session_id,)).fetchone()
            if known:
                held["tally"].setdefault("duplicate_record", [0, 0])[0] += known
            db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (REREAD_KEY + session_id, json.dumps(held)))
            db.execute("INSERT INTO problems (session, line, offset, kind, detail, created) "
                       "VALUES (?, NULL, NULL, ?, ?, ?)", (session_id, kind, detail, now))
            self._count(session_id, kind, 1, 0)
            self.db.execute("UPDATE sources SET degraded = coalesce(degraded, ?), start_offset = 0, "
                            "offset = 0, lines = 0, prefix_sha256 = NULL, updated = ? "
                            "WHERE session_id = ?", (f"{kind}: {detail}", now, session_id))

    def _met_again(self, session_id, raw_lines, tallies):
        """The kept lines (raw_lines rows) and tallies of a batch less those the thread held
        already when the source was read again from its start (REREAD_KEY): each of them is
        taken to be met again once. Inside the caller's transaction."""
        key = REREAD_KEY + session_id
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            return raw_lines, tallies
        held = json.loads(row[0])
        raw, tally = held["raw"], held["tally"]
        new_lines = []
        for line in raw_lines:
            sha = line[1]
            if raw.get(sha):
                raw[sha] -= 1
            else:
                new_lines.append(line)
        new_tallies = []
        for rtype, count, size in tallies:
            had = tally.get(rtype, (0, 0))
            met = min(count, had[0])
            bytes_met = size if met == count else min(size, had[1], size * met // count)
            if met:
                tally[rtype] = [had[0] - met, max(0, had[1] - bytes_met)]
            if count > met:
                new_tallies.append((rtype, count - met, size - bytes_met))
        held = {"raw": {sha: n for sha, n in raw.items() if n},
                "tally": {rtype: n for rtype, n in tally.items() if n[0]}}
        if held["raw"] or held["tally"]:
            self.db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(held), key))
        else:
            self.db.execute("DELETE FROM meta WHERE key = ?", (key,))
        return new_lines, new_tallies

    def _note_agents(self, agents, now):
        """Upsert agents and their links; a sidechain without one is linked by its prompt."""
        db = self.db
        db.executemany(
            "INSERT INTO agents (agent_id, source, kind, tool_use_id, prompt, first_seen) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (agent_id) DO UPDATE SET "
            "source = coalesce(agents.source, excluded.source), kind = coalesce(agents.kind, excluded.kind), "
            "tool_use_id = coalesce(agents.tool_use_id, excluded.tool_use_id), "
            "prompt = coalesce(agents.prompt, excluded.prompt)", [a + (now,) for a in agents])
        db.execute(
            "UPDATE agents SET tool_use_id = (SELECT c.tool_use_id FROM messages c WHERE "
            "c.kind = 'tool_call' AND c.agent IS NULL AND c.tool_name IN ('Agent', 'Task') AND "
            "json_valid(c.text) AND json_extract(c.text, '$.prompt') = agents.prompt "
            "AND NOT EXISTS (SELECT 1 FROM agents o WHERE o.tool_use_id = c.tool_use_id) "
            # (the newest such call before the agent's first record: a prompt used twice)
            "AND c.seq < coalesce((SELECT min(a.seq) FROM messages a WHERE a.agent = agents.agent_id), "
            "c.seq + 1) ORDER BY c.seq DESC LIMIT 1) WHERE tool_use_id IS NULL AND prompt IS NOT NULL")

    def agent_resumes(self, agent_id) -> list:
        """(timestamp, turn) of each SendMessage call of the main conversation to this
        agent, oldest first: one to an agent that had stopped runs it again, and what that
        run writes belongs to the turn of that call (see RolloutParser)."""
        return [(created, turn) for created, turn, _seq, _id in self.agent_sends(agent_id)]

    def agent_sends(self, agent_id, sends=None) -> list:
        """(timestamp, turn, seq, tool_use_id) of each SendMessage call of the main
        conversation to this agent, oldest first. A call names the agent by its id or by
        the name its Agent call gave it; its acknowledgement, once written, names the id
        it resumed. ``sends``: send_messages(), read once for many agents."""
        names = {agent_id}
        started = self.db.execute(f"SELECT ({STARTING_CALL_SQL.format(column='text')}) FROM agents a "
                                  "WHERE a.agent_id = ?", (agent_id,)).fetchone()
        name = _json_object(started[0]).get("name") if started and started[0] else None
        if isinstance(name, str) and name:
            names.add(name)
        return [(created, turn, seq, call_id) for to, resumed, created, turn, seq, call_id
                in (self.send_messages() if sends is None else sends) if to in names or agent_id in resumed]

    def send_messages(self) -> list:
        """Every SendMessage call of the main conversation, oldest first: (whom its input
        names, the ids its acknowledgement says it resumed, timestamp, turn, seq, tool_use_id)."""
        found = []
        for text, created, turn, seq, call_id, ack in self.db.execute(
                "SELECT c.text, c.created, c.turn, c.seq, c.tool_use_id, lhc_text(r.text) FROM messages c "
                "LEFT JOIN messages r ON r.kind = 'tool_result' AND r.tool_use_id = c.tool_use_id "
                "AND r.agent IS NULL WHERE c.kind = 'tool_call' AND c.agent IS NULL "
                "AND c.tool_name = 'SendMessage' ORDER BY c.seq"):
            answer = _json_object(ack) if ack else {}
            if isinstance(created, str):
                found.append((_json_object(text).get("to"),
                              {answer.get("resumedAgentId"), answer.get("revivedAgentId")} - {None},
                              created, turn, seq, call_id))
        return found

    def linked_call(self, agent_id):
        """The call an agent is linked to (its tool_use_id), or None."""
        row = self.db.execute("SELECT tool_use_id FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
        return row[0] if row else None

    def workflow_call(self, run, started=None):
        """The Workflow call whose acknowledgement names ``run`` (see WORKFLOW_RUN): the newest
        one before ``started`` (an agent file's first timestamp; a resumed run is named again
        by the call that resumed it), else the first; None when none does."""
        named = [(tid, created) for tid, text, created in self.db.execute(
            "SELECT r.tool_use_id, r.text, r.created FROM messages c JOIN messages r ON r.tool_use_id = "
            "c.tool_use_id AND r.kind = 'tool_result' AND r.agent IS NULL WHERE c.kind = 'tool_call' "
            "AND c.agent IS NULL AND c.tool_name = 'Workflow' ORDER BY r.seq")
            if run in workflow_runs(stored_text(text))]
        before = [tid for tid, created in named
                  if isinstance(started, str) and isinstance(created, str) and created <= started]
        return before[-1] if before else named[0][0] if named else None

    def agents(self) -> dict:
        """agent_id -> {kind, tool_use_id, call (the seq of that call), source, sends (see
        agent_sends: the SendMessage calls that may have run it again)}."""
        rows = self.db.execute(
            f"SELECT a.agent_id, a.kind, a.tool_use_id, a.source, ({STARTING_CALL_SQL.format(column='seq')}) "
            "FROM agents a").fetchall()
        sends = self.send_messages() if any(r[1] == "subagent" for r in rows) else []
        return {r[0]: {"kind": r[1], "tool_use_id": r[2], "source": r[3], "call": r[4],
                       "sends": self.agent_sends(r[0], sends) if r[1] == "subagent" and sends else []}
                for r in rows}

    def keep_raw_line(self, session_id, line, offset, reason, raw) -> None:
        """One transcript line kept byte for byte outside the parse (see RawLine), counted."""
        with Tx(self.db) as db:
            insert_rows(db, "INSERT OR IGNORE INTO raw_lines", 7,
                        [_raw_line_row(RawLine(session_id, line, offset, reason, raw), utc_now_iso())])
            self._count(session_id, reason, 1, len(raw))

    def mark_degraded(self, session_id, kind, detail):
        with Tx(self.db):
            self.db.execute("INSERT INTO problems (session, line, offset, kind, detail, created) "
                            "VALUES (?, NULL, NULL, ?, ?, ?)", (session_id, kind, detail, utc_now_iso()))
            self.db.execute("UPDATE sources SET degraded = coalesce(degraded, ?) WHERE session_id = ?",
                            (f"{kind}: {detail}", session_id))

    def index_search(self, deadline=None) -> int:
        """Bring the search indexes up to the record; returns rows added to the word index.

        Both follow the record by a watermark in meta, so a thread from before an index
        existed is filled on its first call, and a run killed mid-way resumes there. With
        a ``deadline`` (time.monotonic) it stops between chunks once that has passed (the
        next call, or the next search, goes on from there).
        """
        db = self.db
        first = int((db.execute("SELECT value FROM meta WHERE key = 'fts_upto'").fetchone() or (0,))[0])
        top = db.execute("SELECT max(seq) FROM messages").fetchone()[0] or 0
        reached = first
        for done, reached in index_chunks(first, top, deadline):
            with Tx(db):
                # (NULs kept: the word index's content is messages_plain, and its snippets
                # must match it; what follows a NUL is found by the substring index)
                db.execute("INSERT INTO messages_fts (rowid, text) SELECT seq, text FROM messages_plain "
                           "WHERE seq > ? AND seq <= ? AND text IS NOT NULL", (done, reached))
                db.execute("INSERT OR REPLACE INTO meta VALUES ('fts_upto', ?)", (str(reached),))
        self._index_exact(top, deadline)
        return max(0, reached - first)

    def has_exact_index(self) -> bool:
        """Whether the substring index exists here and this SQLite can read it."""
        return trigram_available() and self.db.execute(
            "SELECT 1 FROM sqlite_master WHERE name = 'messages_exact'").fetchone() is not None

    def _index_exact(self, top: int, deadline=None) -> None:
        db = self.db
        if not trigram_available():
            return  # left where it is: a run on an SQLite with trigrams catches up
        first = int((db.execute("SELECT value FROM meta WHERE key = 'exact_upto'").fetchone() or (0,))[0])
        for done, upto in index_chunks(first, top, deadline):
            self._index_exact_chunk(done, upto)

    def _index_exact_chunk(self, done: int, top: int) -> None:
        db = self.db
        with Tx(db):
            db.execute(EXACT_INDEX_DDL)  # absent when the migration ran without trigrams
            # (a text of EXACT_SCAN_MIN_CHARS takes at least a quarter of that in bytes)
            scanned = {seq: scan_alphabet(body) for seq, body in db.execute(
                f"SELECT m.seq, {INDEXED_BODY_SQL} FROM messages m WHERE m.seq > ? AND m.seq <= ? AND "
                "max(coalesce(length(CAST(m.text AS BLOB)), 0), coalesce(length(CAST(m.data AS BLOB)), 0)) >= ?",
                (done, top, EXACT_SCAN_MIN_CHARS // 4)) if costly_to_index(body)}
            db.execute(f"INSERT INTO messages_exact (rowid, body) SELECT m.seq, {INDEXED_BODY_SQL} "
                       "FROM messages m WHERE m.seq > ? AND m.seq <= ? AND m.seq NOT IN "
                       f"({','.join('?' * len(scanned))})", (done, top, *scanned))
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                           [(f"{EXACT_SCAN_KEY}{seq}", alphabet) for seq, alphabet in scanned.items()])
            db.execute("INSERT OR REPLACE INTO meta VALUES ('exact_upto', ?)", (str(top),))

    def exact_scanned(self, text=None) -> list:
        """The messages the substring index leaves to a scan (costly_to_index); with text,
        only those whose alphabet could hold it (scan_alphabet)."""
        return [int(k[len(EXACT_SCAN_KEY):]) for k, alphabet in self.db.execute(
            "SELECT key, value FROM meta WHERE key >= ? AND key < ?", (EXACT_SCAN_KEY, EXACT_SCAN_KEY[:-1] + ";"))
                if text is None or could_hold(alphabet, text)]

    # -- reading ------------------------------------------------------------------

    def summary(self) -> dict:
        db = self.db
        turns, messages = db.execute("SELECT (SELECT count(*) FROM turns), "
                                     "(SELECT count(*) FROM messages)").fetchone()
        captured, degraded, last = db.execute(
            "SELECT coalesce(sum(offset - start_offset), 0), group_concat(degraded, '; '), "
            "max(updated) FROM sources").fetchone()
        return {"turns": turns, "messages": messages, "captured_bytes": captured,
                "degraded": degraded, "last_activity": last}

    def messages(self, first_turn=None, last_turn=None, agents=False, by_turn=False):
        """Messages in label order (``by_turn``: turn by turn, each in label order);
        subagents' records only when asked for (export)."""
        sql = f"SELECT {', '.join(MESSAGE_COLUMNS)} FROM messages"
        args, where = [], [] if agents else ["agent IS NULL"]
        if first_turn is not None:
            where.append("turn >= ?")
            args.append(first_turn)
        if last_turn is not None:
            where.append("turn <= ?")
            args.append(last_turn)
        if where:
            sql += " WHERE " + " AND ".join(where)
        for row in self.db.execute(sql + (" ORDER BY turn, seq" if by_turn else " ORDER BY seq"), args):
            yield message_row(row)


class ThreadCopy:
    """What a thread file knows of the thread's registry rows (see Registry.save_copy).

    aliases: (session_id, is_current, created); rebuilds: (session_id, from_session, path,
    cwd, owner, status, created, settled); alarm: (message, since); legacy: the file had no
    copy yet, so this was rebuilt from the sessions it captured.
    """

    def __init__(self, thread_id, cwd, created, origin, aliases, rebuilds, alarm, legacy):
        self.thread_id, self.cwd, self.created, self.origin = thread_id, cwd, created, origin
        self.aliases, self.rebuilds, self.alarm, self.legacy = aliases, rebuilds, alarm, legacy


def thread_copy(home, thread_id: str):
    """Read a thread file's copy of its registry rows; None when it has no session to offer.

    A file written before copies existed still names the sessions it captured: the
    newest becomes current, and the working folder comes from cc-lhc.sqlite.
    """
    store = ThreadStore.existing(home, thread_id)  # (a damaged one raises, and is named)
    try:
        db = store.db
        meta = dict(db.execute("SELECT key, value FROM meta WHERE key IN "
                               "('cwd', 'created', 'origin', 'registry_copied')").fetchall())
        if "registry_copied" in meta:
            return ThreadCopy(thread_id, meta.get("cwd"), meta.get("created"), meta.get("origin") or "restored",
                              db.execute("SELECT session_id, is_current, created FROM registry_aliases").fetchall(),
                              db.execute("SELECT session_id, from_session, path, cwd, owner, status, created, "
                                         "settled FROM registry_rebuilds").fetchall(),
                              db.execute("SELECT message, since FROM registry_alarm").fetchall(), False)
        sessions = db.execute("SELECT session_id, first_seen FROM sources ORDER BY first_seen, rowid").fetchall()
    finally:
        store.close()
    if not sessions:
        return None
    cwd = None
    if os.path.exists(home.path("cc-lhc.sqlite")):
        row = HostDB(home).db.execute("SELECT cwd FROM sessions WHERE thread_id = ? AND cwd IS NOT NULL "
                                      "ORDER BY created LIMIT 1", (thread_id,)).fetchone()
        cwd = row[0] if row else None
    aliases = [(sid, int(i == len(sessions) - 1), seen) for i, (sid, seen) in enumerate(sessions)]
    return ThreadCopy(thread_id, cwd, sessions[0][1], "restored", aliases, [], [], True)


def off_branch(store) -> list:
    """(first, last) seq runs that a rewind left off Claude's branch (OFF_BRANCH_KEY)."""
    return sorted((int(k.rsplit(":", 1)[1]), int(v)) for k, v in store.db.execute(
        "SELECT key, value FROM meta WHERE key >= ? AND key < ?", (OFF_BRANCH_KEY, OFF_BRANCH_KEY[:-1] + ";")))


# What is off the branch of the session Claude is on: the runs a rewind in it left off, and
# those a resume back to an earlier session of the thread left off (see resumed_back), under
# OFF_BRANCH_KEY + BRANCH_RUNS + ":" + first seq. The runs off while a session was Claude's
# are kept under BRANCH_SNAPSHOT_KEY + its id when the thread leaves it (a resume elsewhere,
# a swap: leave_branch), so a resume back to it puts that branch back as it was. (Threads
# captured before kept a rewind's runs under OFF_BRANCH_KEY + session + ":" + first seq:
# those stay off whatever session Claude is on.)
BRANCH_RUNS = "@branch"
BRANCH_SNAPSHOT_KEY = "branch_snapshot:"


def _resume_runs(db) -> list:
    prefix = OFF_BRANCH_KEY + BRANCH_RUNS + ":"
    return sorted([int(k[len(prefix):]), int(v)] for k, v in db.execute(
        "SELECT key, value FROM meta WHERE key >= ? AND key < ?", (prefix, prefix[:-1] + ";")))


BRANCH_SESSION_KEY = "branch_session"  # the session whose branch the runs above are


def _adopt_older_runs(db) -> None:
    """Runs a build before the branch snapshots wrote for a resume back (OFF_BRANCH_KEY + a
    session + "@resumed:" + first seq) become runs of the branch in force, so a snapshot
    keeps them. Inside the caller's transaction."""
    rows = db.execute("SELECT key, value FROM meta WHERE key >= ? AND key < ? AND instr(key, '@resumed:') > 0",
                      (OFF_BRANCH_KEY, OFF_BRANCH_KEY[:-1] + ";")).fetchall()
    for key, end in rows:
        db.execute("DELETE FROM meta WHERE key = ?", (key,))
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                   (f"{OFF_BRANCH_KEY}{BRANCH_RUNS}:{key.rsplit(':', 1)[1]}", end))


def _own(session_id) -> tuple:
    return ("(source_session = ?1 OR (source_session >= ?1 || '/' AND source_session < ?1 || '0'))",
            (session_id,))


def leave_branch(store, session_id, replaced_by=None) -> None:
    """The thread leaves ``session_id`` (Claude moved elsewhere, or a swap replaces it): keep
    the runs off the branch while it was Claude's, and the newest record then (all below it
    and not in a run was its branch), for a resume back to it. Taken before the thread's
    pointer moves, so a kill in between leaves no session without one. A rebuild that
    ``replaced_by`` it may already hold turns of its own (accepted at a session's end, or
    completed by recovery): the branch ends before the first of them."""
    db = store.db
    with Tx(db):
        _adopt_older_runs(db)
        top = None
        if replaced_by:
            own, args = _own(replaced_by)
            (first,) = db.execute(f"SELECT min(seq) FROM messages WHERE {own}", args).fetchone()
            top = first - 1 if first is not None else None
        if top is None:
            (top,) = db.execute("SELECT max(seq) FROM messages").fetchone()
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                   (BRANCH_SNAPSHOT_KEY + session_id,
                    json.dumps({"runs": _resume_runs(db), "top": top or 0, "to": replaced_by})))


def took_branch(store, session_id) -> None:
    """The thread's pointer moved to ``session_id`` by a swap (or `rollout write`): the new
    session has the branch the old one had, runs and all."""
    with Tx(store.db) as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (BRANCH_SESSION_KEY, session_id))


def resumed_back(store, session_id, left=None):
    """Claude reopened ``session_id``, an earlier session of the thread (an in-app /resume
    back to it, after a Smart Compact moved the thread on), leaving session ``left``: what
    the thread took in after that session was left (or after its last record) is not in the
    conversation Claude has now, so it goes off the branch, as a rewind's turns do, and so
    does what was off it while that session was Claude's (its snapshot). The branch
    ``left`` had is kept for a resume back to it. Returns the run added, or None."""
    db = store.db
    with Tx(db):
        _adopt_older_runs(db)
    if left and left != session_id:
        leave_branch(store, left)
    own = _own(session_id)[0]
    (mine,) = db.execute(f"SELECT max(seq) FROM messages WHERE {own}", (session_id,)).fetchone()
    (top,) = db.execute("SELECT max(seq) FROM messages").fetchone()
    prefix = OFF_BRANCH_KEY + BRANCH_RUNS + ":"
    row = db.execute("SELECT value FROM meta WHERE key = ?", (BRANCH_SNAPSHOT_KEY + session_id,)).fetchone()
    snapshot = json.loads(row[0]) if row else None
    if isinstance(snapshot, dict):
        runs, last = list(snapshot["runs"]), max(snapshot["top"], mine or 0)
    elif isinstance(snapshot, list):  # (as a build before the newest records were kept wrote it)
        runs, last = list(snapshot), mine
    elif mine is not None:  # (never left by a move cc-lhc saw: what is off now and holds none of its own)
        runs, last = [run for run in _resume_runs(db) if not db.execute(
            f"SELECT 1 FROM messages WHERE {own} AND seq BETWEEN ?2 AND ?3 LIMIT 1",
            (session_id, run[0], run[1])).fetchone()], mine
    else:  # (a rebuild never left and never written in: the branch it was made from)
        runs, last = _resume_runs(db), None
    added = (last + 1, top) if last is not None and top and top > last else None
    if added:
        runs.append(list(added))
    with Tx(db):
        db.execute("DELETE FROM meta WHERE key >= ? AND key < ?", (prefix, prefix[:-1] + ";"))
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", [(f"{prefix}{a}", str(b)) for a, b in runs])
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (BRANCH_SESSION_KEY, session_id))
    return added


def repair_branch(home, thread_id, current) -> None:
    """At a launch, under the lease: a kill between a move's two steps (the branch in the
    thread, the pointer in the registry) left the branch of another session than the
    current one in force; it is switched to the current one's. Threads that never moved
    between sessions have nothing to mend."""
    store = ThreadStore(home, thread_id)
    try:
        row = store.db.execute("SELECT value FROM meta WHERE key = ?", (BRANCH_SESSION_KEY,)).fetchone()
        if current and row is not None and row[0] != current:
            kept = store.db.execute("SELECT value FROM meta WHERE key = ?",
                                    (BRANCH_SNAPSHOT_KEY + row[0],)).fetchone()
            try:
                done = json.loads(kept[0]).get("to") == current if kept else False
            except (ValueError, AttributeError):
                done = False
            # (its branch was kept as this move began: a second look would take in the new turns)
            resumed_back(store, current, left=None if done else row[0])
            home.log("branch_repaired", thread=thread_id, session=current, was=row[0])
    finally:
        store.close()


def load_turns(store, closed_only=True):
    """All turns of a thread with their messages, in order (as the views see them): a
    message a rewind left off Claude's branch is not one of them (off_branch), nor is a
    `/compact` command's own turn (see compaction_command)."""
    turns = {}
    for n, kind, status in store.db.execute("SELECT n, kind, status FROM turns ORDER BY n"):
        if closed_only and status == "open":
            continue
        turns[n] = Turn(n, kind, status, [])
    runs = off_branch(store)
    for m in store.messages():
        t = turns.get(m["turn"])
        if t is not None and not (runs and any(a <= m["seq"] <= b for a, b in runs)):
            t.messages.append(m)
    return [t for t in turns.values() if t.messages and not compaction_command(t)]


COMPACT_COMMAND = "<command-name>/compact</command-name>"


def compaction_command(turn) -> bool:
    """Whether a turn is the records of a `/compact` command (its caveat, the command and
    "Compacted", with terminal escapes): the one cc-lhc types for an in-process Smart
    Compact, or a person's. It says nothing the model needs (a summary Claude wrote is a
    turn of its own, and a view cc-lhc served is the compaction), so no view holds it; the
    thread keeps it."""
    return turn.kind == COMMAND_TURN and any(
        m["kind"] == "user_text" and COMPACT_COMMAND in (m["text"] or "") for m in turn.messages)


# == 6. Views (pure): fidelity bands and the served view ========================

# How each allocation profile splits the view budget between the bands. The newest
# turns get the best band that still fits; what no band can hold is named by range.
PROFILE_SHARES = {
    "default": {"full": 0.55, "lean": 0.30, "summary": 0.15},
    "balanced": {"full": 0.40, "lean": 0.35, "summary": 0.25},
    "historical": {"full": 0.30, "lean": 0.35, "summary": 0.35},
}


BANDS = ("full", "lean", "summary")

# Which arm of the thinking ladder rebuilt rollouts use when no arm is passed.
# `signed_verbatim` replays the tail's signed thinking blocks exactly as recorded; `omit`
# drops all thinking. The arm a rebuild uses comes from the policy (`thinkingReplay`,
# --lhc-thinking-replay) or from the thread, once the API refused replayed thinking for
# it (see thinking_arm): the API binds a signature to the history it was produced over.
THINKING_REBUILD_ARM = BUILTIN_POLICY["thinkingReplay"]

# Tool outputs at most this long stay verbatim in the lean band (a stub would be longer);
# error outputs up to ERROR_KEEP_BYTES stay too, because the exact error is what matters.
STUB_KEEP_BYTES = 160
ERROR_KEEP_BYTES = 2_000
EDIT_TOOLS = frozenset(("Edit", "MultiEdit", "Write", "NotebookEdit"))
READ_TOOLS = frozenset(("Read", "NotebookRead"))
WORKING_SET_LIMIT = 30


def utf8_len(text: str) -> int:
    """Bytes of text as UTF-8, without encoding it when it is ASCII (most tool output)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def estimate_tokens(text) -> int:
    """LHC's fast estimate (4 bytes a token), used for budgets; `measure` counts exactly."""
    return (utf8_len(text) + 3) // 4 if text else 0


class Turn:
    """A turn and its messages, as the views see them."""

    __slots__ = ("n", "kind", "status", "messages")

    def __init__(self, n, kind, status, messages):
        self.n, self.kind, self.status, self.messages = n, kind, status, messages


def _human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    if n < 1024 * 1024:
        return f"{n / 1024:.1f} KB"
    return f"{n / (1024 * 1024):.1f} MB"


def read_back(seq: int, native: bool = False) -> str:
    """How a stub names the way back to message m<seq>: the mod's tool when it is active
    (``native``), the Bash command otherwise."""
    return f"lhc_get_messages m{seq}" if native else f"cc-lhc get-messages m{seq}"


def tool_stub(m: dict, tool_name: str, native: bool = False) -> str:
    """The lean band's stand-in for a tool output: its size and the exact way back."""
    text = m["text"] or ""
    lines = text.count("\n") + (1 if text and not text.endswith("\n") else 0)
    size = _human_size(utf8_len(text))
    data = block_data(m)
    images = data_images(data) if data else 0
    pictures = f", {images} image{'s' if images > 1 else ''}" if images else ""
    return (f"[output of {tool_name or 'tool'} m{m['seq']}: {lines} lines, {size}{pictures} · "
            f"{read_back(m['seq'], native)}]")


def _keeps_verbatim(m: dict) -> bool:
    """Whether a tool output is short enough for the lean band to keep as it is (an image
    in it never is: it weighs IMAGE_TOKENS, not the word its text names it by)."""
    size = utf8_len(m["text"] or "")
    if size > ERROR_KEEP_BYTES or (size > STUB_KEEP_BYTES and not m["is_error"]):
        return False
    data = block_data(m)
    return not (data and data_images(data))


def paired_tool_ids(messages) -> set:
    """Tool ids with both a call and a result here: only those may appear in a view."""
    calls = {m["tool_use_id"] for m in messages if m["kind"] == "tool_call"}
    results = {m["tool_use_id"] for m in messages if m["kind"] == "tool_result"}
    return calls & results


def _tool_context(turn: Turn):
    """(tool name by id, ids with both a call and a result) over a whole turn."""
    names = {m["tool_use_id"]: m["tool_name"] for m in turn.messages if m["kind"] == "tool_call"}
    return names, paired_tool_ids(turn.messages)


def visible_messages(turn: Turn, band: str, arm: str = None, messages=None, tools=None,
                     native=False):
    """The messages a band keeps of a turn, each as (message, rendered_text_or_None).

    rendered_text is the stub that replaces a tool output in the lean band; None means
    the message goes in verbatim. ``arm`` defaults to THINKING_REBUILD_ARM as it is now
    (read at each call, so flipping the constant takes effect at once). ``messages``
    narrows it to one part of the turn; pairing is still judged over the whole turn
    (``tools``, from _tool_context, saves working that out again for every part).
    ``native``: stubs name the mod's retrieval tool instead of the Bash command (a stub
    costs no more that way, so band costs are worked out without it).
    """
    arm = arm or THINKING_REBUILD_ARM
    names, paired = tools or _tool_context(turn)
    saved = None  # tool_use_id -> the whole output Claude saved to a file (SAVED_OUTPUT)
    out = []
    for m in (turn.messages if messages is None else messages):
        kind = m["kind"]
        if kind in ("api_error", SAVED_OUTPUT):
            continue  # Claude's own error notices are not model output; the model saw a preview
        if kind in ("tool_call", "tool_result") and m["tool_use_id"] not in paired:
            continue  # an unpaired tool block makes the API reject the whole session
        if kind in ("thinking", "assistant_redacted_thinking"):
            if band != "full" or arm != "signed_verbatim" or not _signature(m):
                continue  # never invent a signature; lean drops thinking
        if kind == "tool_result" and band == "lean" and not _keeps_verbatim(m):
            if saved is None:
                saved = {x["tool_use_id"]: x for x in turn.messages if x["kind"] == SAVED_OUTPUT}
            # (a preview's stub names the whole output: that is the one worth reading back)
            out.append((m, tool_stub(saved.get(m["tool_use_id"], m), names.get(m["tool_use_id"]), native)))
            continue
        if kind.startswith("user_") and kind not in ("user_text", "user_meta") and band == "lean":
            out.append((m, f"[{kind[5:]} m{m['seq']} · {read_back(m['seq'], native)}]"))
            continue
        out.append((m, None))
    return out


def _signature(m: dict):
    """A thinking block's signature (a redacted block's encrypted data plays that part)."""
    try:
        block = json.loads(m["data"]) if m["data"] else None
    except ValueError:
        return None
    if not isinstance(block, dict):
        return None
    return block.get("signature") or (block.get("data") if block.get("type") == "redacted_thinking" else None)


def band_cost(turn: Turn, band: str, summary_text: str = "", messages=None, tools=None) -> int:
    """Estimated tokens a band gives a turn (or ``messages``, one part of it)."""
    if band == "summary":
        return estimate_tokens(summary_text) + 8
    total = 0
    for m, stub in visible_messages(turn, band, messages=messages, tools=tools):
        text, _ids, images = counted_parts(m, stub)
        total += estimate_tokens(text) + images + 4
        if m["kind"] in ("tool_call", "tool_result"):
            total += CALL_ID_TOKENS
    return total


class Part:
    """A run of one turn's messages that the bands allocate as one: a canonical segment,
    or a piece of one when the target in force makes it larger than a segment may be."""

    __slots__ = ("turn", "messages", "whole")

    def __init__(self, turn: Turn, messages, whole: bool):
        self.turn, self.messages, self.whole = turn, messages, whole

    @property
    def n(self) -> int:
        return self.turn.n

    @property
    def first(self) -> int:
        return self.messages[0]["seq"]

    @property
    def last(self) -> int:
        return self.messages[-1]["seq"]


def segment_tokens(target: int, profile: str) -> int:
    """The soft size of a segment: half the full-fidelity share of the target (the rule
    capture closes segments by, see segment_soft_bytes)."""
    return max(1, int(target * PROFILE_SHARES[profile]["full"] / 2))


def turn_parts(turn: Turn, soft_tokens: int):
    """A turn cut where capture closed its segments, and again wherever a segment outgrew
    ``soft_tokens`` (capture ran under another target): always after a tool result with no
    call of the turn still waiting, so a tool call and its result stay in one part. An
    exchange as large as a part on its own is a part of its own: the smaller exchanges
    before it are not held back with it (one output too large to be verbatim would take
    them to lean while older calls of the turn stayed verbatim)."""
    paired = paired_tool_ids(turn.messages)
    soft = soft_tokens * 4  # segments are measured as capture measures them (segment_size)
    # The runs no cut may fall inside: [messages, size, whether a segment ends after it]
    units, unit, size, waiting, segment = [], [], 0, set(), None
    for m in turn.messages:
        if (m["segment"] or 0) != segment and segment is not None and not waiting:
            if unit:
                units.append([unit, size, True])
                unit, size = [], 0
            elif units:
                units[-1][2] = True
        if m["kind"] == SAVED_OUTPUT and not unit and units:
            # (a whole output Claude saved goes with the result that previews it: a view
            # shows that result, whole or as a stub naming it, never the saved output alone)
            units[-1][0].append(m)
            continue
        segment = m["segment"] or 0
        unit.append(m)
        size += segment_size(m["kind"], m["text"], block_data(m))  # (never put together for this)
        if m["kind"] == "tool_call" and m["tool_use_id"] in paired:
            waiting.add(m["tool_use_id"])
        elif m["kind"] == "tool_result":
            waiting.discard(m["tool_use_id"])
            if not waiting:
                units.append([unit, size, False])
                unit, size = [], 0
    if unit:
        units.append([unit, size, False])
    pieces, current, size = [], [], 0
    for messages, weight, segment_ends in units:
        if current and weight >= soft:
            pieces.append(current)
            current, size = [], 0
        current += messages
        size += weight
        if segment_ends or size >= soft:
            pieces.append(current)
            current, size = [], 0
    if current:
        pieces.append(current)
    return [Part(turn, p, len(pieces) == 1) for p in pieces]


SPLIT = "split"  # View.bands for a turn whose parts are in different bands
RANK = {"full": 0, "lean": 1, "summary": 2, "omitted": 3}


class View:
    """The served view of a thread: a band for every turn, and what that costs.

    ``bands`` maps turn n -> "full" | "lean" | "summary" | "omitted", or SPLIT for a long
    turn whose parts are in different bands; ``pieces`` then holds, for each such turn,
    (first seq, last seq, band) runs oldest first, and ``summaries`` has the summarised
    runs under (n, first, last) as well as whole summarised turns under n.
    """

    def __init__(self, thread_id, bands, costs, budget, profile, summaries, pieces=None):
        self.thread_id = thread_id
        self.bands = bands
        self.costs = costs          # band -> estimated tokens used
        self.budget = budget
        self.profile = profile
        self.summaries = summaries
        self.pieces = pieces or {}
        self.tokens = None          # what serve_view counted the served view at
        self.counting = None

    def turns_in(self, band):
        return sorted(n for n, b in self.bands.items() if b == band)

    def omitted_ranges(self):
        return label_ranges(self.turns_in("omitted"))

    def band_of(self, n: int, seq: int) -> str:
        """The band of one message of turn n."""
        band = self.bands.get(n, "omitted")
        if band != SPLIT:
            return band
        return next(b for first, last, b in self.pieces[n] if first <= seq <= last)

    @property
    def empty(self) -> bool:
        return not any(b != "omitted" for b in self.bands.values())


def label_ranges(numbers):
    """[1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    ranges = []
    for n in numbers:
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], n)
        else:
            ranges.append((n, n))
    return ranges


def omitted_line(a: int, b: int) -> str:
    """The line that names turns left out of a view (the contract's exact form, even for one
    turn: tN\u2013tN, so whoever reads the line back meets one shape)."""
    return f"turns t{a}\u2013t{b} not in view; use get-turns"


def range_text(a: int, b: int) -> str:
    return f"t{a}" if a == b else f"t{a}\u2013t{b}"


# get-messages takes a range of at most this many messages after its first (parse_labels).
MESSAGE_RANGE_SPAN = 10_000


def request_spans(a: int, b: int) -> list:
    """a..b cut into ranges get-turns and get-messages each take (at most
    MESSAGE_RANGE_SPAN labels after a range's first)."""
    spans = []
    while a <= b:
        end = min(b, a + MESSAGE_RANGE_SPAN)
        spans.append((a, end))
        a = end + 1
    return spans


def message_request(a: int, b: int, letter: str = "m") -> str:
    """The arguments that read back labels a..b: "m12-m40", split into several ranges when
    one would be longer than get-messages (get-turns, letter t) accepts."""
    return " ".join(f"{letter}{x}" if x == y else f"{letter}{x}-{letter}{y}" for x, y in request_spans(a, b))


def _fits(used, caps, k, cost) -> bool:
    """Whether ``cost`` more in band k keeps every band within its share plus what the
    better bands left unused (caps are cumulative: full, full+lean, full+lean+summary)."""
    spent = sum(used[:k])
    for j in range(k, len(caps)):
        spent += used[j]
        if spent + cost > caps[j]:
            return False
    return True


def _part_summary(part: Part, summaries):
    """(text, source) standing in for a part: the turn's own summary for a whole turn,
    an extractive one of just these messages for a part of a long turn."""
    if part.whole:
        return summaries.get(part.n, ("", ""))
    return extractive_summary(part.messages, part=True), "extractive"


# Once this many parts in a row found no band with room, the older ones are left out without
# weighing each: the room left is less than any of those took, and a thread of 20,000 turns
# spent seconds weighing (and summarising) turns that could never fit.
OMITTED_RUN = 256


def _allocate(parts, budget, profile, summaries, memo=None):
    """Bands for parts, newest first: each takes the best band that still has room, where
    a band's room is its profile share plus whatever the better bands left unused.

    An older part may get a better band than a newer one of another turn (a big turn
    that fell to lean does not push the small turns before it down with it); inside one
    turn the bands only get worse going back, so what a turn leaves out is its oldest
    messages. A part that takes the best band it could have in an empty view (one
    exchange larger than the whole full share: eight big files read at once) holds the
    parts before it to nothing: the work that led up to it stays verbatim as far as
    there is room. Returns ({(n, first seq): band}, used tokens per band, part summaries).
    ``memo`` keeps each part's cost in each band (and its summary) for the next allocation
    over the same turns: a part is the same run of messages whatever the budget. After
    OMITTED_RUN parts in a row that had no room, the older ones are left out unweighed.
    """
    memo = {} if memo is None else memo
    shares = PROFILE_SHARES[profile]
    caps, total = [], 0
    for band in BANDS:
        total += int(budget * shares[band])
        caps.append(total)
    used, empty = [0] * len(BANDS), [0] * len(BANDS)
    placed, floor, texts, tools = {}, {}, {}, {}

    def weighed(part, name):
        """(summary text, its source, cost) of a part in a band; cost None: no summary."""
        key = (part.n, part.first, part.last, name)
        if key not in memo:
            if part.n not in tools:
                tools[part.n] = _tool_context(part.turn)
            text, source = _part_summary(part, summaries) if name == "summary" else ("", "")
            cost = band_cost(part.turn, name, text, part.messages, tools[part.n]) \
                if text or name != "summary" else None
            memo[key] = (text, source, cost)
        return memo[key]

    missed = 0  # parts in a row no band had room for
    unseen = set()  # parts the view can show nothing of (a call that never got its result)
    lean_unseen = set()  # parts that did not fit in full, and lean shows nothing of
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if missed >= OMITTED_RUN:
            placed[(part.n, part.first)] = "omitted"  # (what room is left is less than any of them took)
            continue
        if not weighed(part, "full")[2]:
            unseen.add(i)  # (it takes a neighbour's band below: on its own it would be named in view)
            continue
        band, alone = "omitted", None  # (alone: the best band its cost fits in an empty view)
        for k in range(floor.get(part.n, 0), len(BANDS)):
            name = BANDS[k]
            text, source, cost = weighed(part, name)
            if cost is None:
                break  # no summary to stand in for it
            if not cost:  # (lean shows nothing of a run of thinking): no band of its own either
                band = None
                lean_unseen.add(i)
                break
            if alone is None and _fits(empty, caps, k, cost):
                alone = k
            if _fits(used, caps, k, cost):
                used[k] += cost
                band = name
                if name == "summary":
                    texts[(part.n, part.first)] = (text, source, cost)
                break
        if band is None:
            continue
        placed[(part.n, part.first)] = band
        missed = missed + 1 if band == "omitted" else 0
        if alone is not None and RANK[band] > alone:  # (it fell for what newer parts took)
            floor[part.n] = RANK[band]
    quiet = unseen | lean_unseen
    for i in sorted(quiet):
        band = _neighbour_band(parts, i, quiet, placed)
        # (one that did not fit in full is never made verbatim by a verbatim neighbour; next
        # to a summary it is out of view: a summary of the runs beside it does not cover it)
        placed[(parts[i].n, parts[i].first)] = ("lean" if band == "full" and i in lean_unseen else
                                                band if band in ("full", "lean") else "omitted")
    return placed, dict(zip(BANDS, used)), texts


def _neighbour_band(parts, i, unseen, placed) -> str:
    """The band of the part beside parts[i] in its turn, the older one first (a run the
    view can show nothing of goes with the run next to it); "omitted" when it is alone."""
    n = parts[i].n
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(parts) and parts[j].n == n:
            if j not in unseen:
                return placed[(n, parts[j].first)]
            j += step
    return "omitted"


def build_view(thread_id, turns, budget, profile, summaries=None, favoured=(), soft_tokens=None):
    """Give every part of every turn the best band that fits, newest first (pure,
    deterministic). Parts are the turns' canonical segments, cut again at ``soft_tokens``
    (default: the segment size for this budget) where a segment is larger.

    Turns the model recently retrieved (``favoured``) that would otherwise be summarised
    or omitted are held in lean instead: their cost is set aside first, newest first and
    up to the profile's lean share, and the other turns share what remains.
    ``summaries`` maps turn -> (text, source); a turn without one cannot be summarised.
    """
    soft = soft_tokens or segment_tokens(budget, profile)
    return _build_view(thread_id, turns, {t.n: turn_parts(t, soft) for t in turns}, budget,
                       profile, summaries or {}, favoured)


def _build_view(thread_id, turns, by_turn, budget, profile, summaries, favoured, hidden=frozenset(),
                memo=None):
    """build_view over turns already cut into parts (turn n -> its parts, oldest first).

    ``hidden`` are the (turn, first seq) keys of parts before the visibility boundary:
    they are out of view whatever room is left, and no band is spent on them. ``memo``:
    see _allocate.
    """
    memo = {} if memo is None else memo
    parts = [p for t in turns for p in by_turn[t.n] if (p.n, p.first) not in hidden]
    placed, used, texts = _allocate(parts, budget, profile, summaries, memo)
    placed.update((key, "omitted") for key in hidden)
    by_n = {t.n: t for t in turns}
    lift, reserve = [], 0
    room = int(budget * PROFILE_SHARES[profile]["lean"])
    favoured = set(favoured) - {n for n, _first in hidden}
    for n in sorted(favoured & set(by_turn), reverse=True):
        got = {placed[(n, p.first)] for p in by_turn[n]}
        if got & {"summary", "omitted"} and "full" not in got:
            cost = band_cost(by_n[n], "lean")
            if reserve + cost <= room:
                lift.append(n)
                reserve += cost
    if lift:
        placed, used, texts = _allocate([p for p in parts if p.n not in lift], budget - reserve,
                                        profile, summaries, memo)
        placed.update(((n, p.first), "lean") for n in lift for p in by_turn[n])
        used["lean"] += reserve
    return _assemble(thread_id, turns, by_turn, placed, used, budget, profile, summaries, texts)


def _assemble(thread_id, turns, by_turn, placed, used, budget, profile, summaries, texts):
    """The View of an allocation: one band per turn where its parts agree, runs where not.

    Neighbouring parts in one band make one run (one header line); summarised parts keep
    a summary each.
    """
    bands, pieces, kept = {}, {}, {}
    for turn in turns:
        parts = by_turn[turn.n]
        runs = []
        for p in parts:
            band = placed[(turn.n, p.first)]
            if runs and runs[-1][2] == band:
                runs[-1] = (runs[-1][0], p.last, band)
            else:
                runs.append((p.first, p.last, band))
        mine = {(turn.n, p.first, p.last): texts[(turn.n, p.first)] for p in parts
                if (turn.n, p.first) in texts}
        if len(parts) > 1 and len(runs) == 1 and runs[0][2] == "summary":
            # Every part summarised: the turn's own summary says it better, when it is no longer.
            text, source = summaries.get(turn.n, ("", ""))
            cost = band_cost(turn, "summary", text)
            if text and cost <= sum(c for _, _, c in mine.values()):
                used["summary"] += cost - sum(c for _, _, c in mine.values())
                mine = {turn.n: (text, source, cost)}
        if len(runs) == 1 and (len(parts) == 1 or runs[0][2] != "summary" or turn.n in mine):
            bands[turn.n] = runs[0][2]
            if runs[0][2] == "summary":
                kept[turn.n] = next(iter(mine.values()))[:2]
            continue
        bands[turn.n], pieces[turn.n] = SPLIT, runs
        kept.update((key, value[:2]) for key, value in mine.items())
    return View(thread_id, bands, used, budget, profile, kept, pieces)


def working_set(turns):
    """Files the thread read or edited, edited first, each with the label that last showed it.
    A call whose result was an error (a Write refused, a Read of a missing file) read or
    changed nothing: it names no file here."""
    seen = {}
    for turn in turns:
        results = {m["tool_use_id"]: m["seq"] for m in turn.messages if m["kind"] == "tool_result"}
        failed = {m["tool_use_id"] for m in turn.messages if m["kind"] == "tool_result" and m["is_error"]}
        for m in turn.messages:
            if (m["kind"] != "tool_call" or m["tool_name"] not in EDIT_TOOLS | READ_TOOLS
                    or m["tool_use_id"] in failed):
                continue
            try:
                args = json.loads(m["text"] or "{}")
            except ValueError:
                continue
            path = args.get("file_path") or args.get("notebook_path") if isinstance(args, dict) else None
            if not isinstance(path, str):
                continue
            edited = m["tool_name"] in EDIT_TOOLS
            label = results.get(m["tool_use_id"], m["seq"])
            prev = seen.get(path)
            seen[path] = (edited or (prev[0] if prev else False), label)
    rows = sorted(seen.items(), key=lambda kv: (not kv[1][0], -kv[1][1], kv[0]))
    return [(path, "edited" if edited else "read", label) for path, (edited, label) in rows[:WORKING_SET_LIMIT]]


# Counts made without the tokenizer must not fall short of o200k_base (safe_estimate).
# Measured on real CLI content, code and tool output average 3.5-4.2 bytes a token,
# `ls -la` listings 2.3, uuids and hashes 1.6-2.0; base64 and random ids 1.4, a byte of a
# character beyond ASCII (a rare ideograph, an emoji) can be a token of its own, and random
# names (a capital and two small letters, CamelCase, snake_case) 1.5. The estimate is the
# largest of: the bytes / 2.25; each byte beyond ASCII a token plus 1.1 times the pieces
# o200k's splitter makes of the rest (letter runs cut before a capital, digits in threes,
# whitespace runs and the indent after a newline, each other byte), the letters counted
# as random ones (RANDOM_LETTER_TOKENS each) as far as their vowels fall short of prose's;
# and, for text of short pieces or long runs, each byte beyond ASCII plus what zlib
# compresses the rest to. Then 2 more. A run of 12 letters of one case or more (DNA,
# random letters) adds about half its length. It stays at or above the exact count on real
# CLI sessions (about 1.9 times it), on 70 kinds of hard text (base64, hex, uuids, DNA,
# random letters of every case and length, random identifiers, paths and word lists,
# tab-indented code, controls, CJK, emoji, marks) and on 10,000 fuzzed texts.
SAFE_SLACK = 2            # added to every estimate: a short text's pieces can each be two tokens
MESSAGE_TOKENS = 4        # what each message adds beyond its text (as band_cost counts it)
# Claude's side of a rebuilt session that would end on a user record (view_records): its
# count is part of every view's, written or not.
VIEW_CLOSING_TEXT = "Understood. Continuing from the rebuilt view."
VIEW_FIT_ROUNDS = 8       # allocations tried to bring the counted view up to its budget
VIEW_FIT_FILL = 0.97      # a view counted at this share of its budget or more is kept


def _byte_table(mark) -> bytes:
    """A bytes.translate table: each byte to b"a", b"A" or b" " as mark(byte) says."""
    return bytes(ord(mark(b)) for b in range(256))


# (bytes beyond ASCII map to " ": a character beyond ASCII ends a run of letters or digits)
LETTER_CASES = _byte_table(lambda b: "a" if 97 <= b <= 122 else "A" if 65 <= b <= 90 else " ")
DIGIT_MARKS = _byte_table(lambda b: "a" if 48 <= b <= 57 else " ")
SPACE_MARKS = _byte_table(lambda b: "a" if b in b" \t\n" else " ")   # the ones o200k runs together
NON_ASCII = bytes(range(0x80, 0x100))
ASCII_LETTERS = bytes(range(65, 91)) + bytes(range(97, 123))
WORD_OR_SPACE = ASCII_LETTERS + bytes(range(48, 58)) + b" \t\n"
VOWELS = b"aeiouAEIOU"
RANDOM_LETTER_TOKENS = 0.8   # tokens a letter of random letters can take (1.5 to 3 letters a token)
RANDOM_LETTERS_SHORT = 128   # fewer letters than this: taken for random whatever their vowels


def safe_estimate(text) -> int:
    """Tokens of text counted without the tokenizer, calibrated never to fall short of
    o200k's count (see SAFE_SLACK): a few passes of C over its bytes, by class."""
    if not text:
        return 0
    data = text.encode("utf-8", "surrogatepass")
    ascii_ = data.translate(None, NON_ASCII)
    wide = len(data) - len(ascii_)  # bytes of characters beyond ASCII: at most a token each
    cases = b" " + data.translate(LETTER_CASES)
    # o200k's pieces of letters: a run starts one, and so does a capital after a small
    # letter; in a run of capitals (a hash, a constant) each one can be a token of its own
    words = cases.count(b" a") + cases.count(b" A") + cases.count(b"aA") + cases.count(b"AA")
    digits = b" " + data.translate(DIGIT_MARKS)
    ndigits = digits.count(b"a")
    numbers = digits.count(b" a") + ndigits // 3  # digits come in threes
    # an indented line: its newline, its indent and its first word are three pieces
    spaces = (b" " + data.translate(SPACE_MARKS)).count(b" a") + data.count(b"\n\t") + data.count(b"\n ")
    signs = len(ascii_.translate(None, WORD_OR_SPACE))  # each other byte (signs, controls)
    letters = len(ascii_) - len(ascii_.translate(None, ASCII_LETTERS))
    # Letters that are no words (random ids, names like "xkcdPqz"): o200k cuts them into
    # pieces of one to three letters. Such text has few vowels (a fifth of random letters,
    # two fifths of English or code), so as the vowels fall short of that, the letters are
    # taken for up to RANDOM_LETTER_TOKENS a letter; a short text, whose vowels say little,
    # is taken for random outright.
    if letters:
        vowels = len(ascii_) - len(ascii_.translate(None, VOWELS))
        random_share = (1.0 if letters < RANDOM_LETTERS_SHORT
                        else min(1.0, max(0.0, (0.4 - vowels / letters) / 0.2)))
        pieces = max(words, int(random_share * RANDOM_LETTER_TOKENS * letters)) + numbers + spaces + signs
    else:
        pieces = numbers + spaces + signs
    estimate = wide + max(-(-len(ascii_) * 4 // 9), -(-pieces * 11 // 10))
    # Long runs of one case (DNA, random letters, glued words): o200k cuts them into about
    # two letters a token, where their pieces count them as one. Each 12 letters of such a
    # run is taken for 18 (a run of 12 to 23 holds 12 once), of which a token every two.
    dozens = cases.count(b"a" * 12) + cases.count(b"A" * 12)
    estimate += -(-dozens * 18 * 11 // 20)
    if len(ascii_) >= 24:
        if 10 * (words + numbers) > 4 * (letters + ndigits) or b"a" * 24 in cases or b"A" * 24 in cases:
            # Short pieces or long runs: random text (base64, ids, hex), which o200k cuts
            # into more tokens than its pieces; what zlib makes of it bounds its entropy.
            import zlib
            estimate = max(estimate, wide + len(zlib.compress(ascii_, 1)))
    return max(-(-len(data) * 4 // 9), estimate) + SAFE_SLACK


def shown_text(m, stub) -> str:
    """What a view shows of a message: its stub when it has one, else its text (or its
    block JSON)."""
    return stub if stub is not None else (m["text"] or m["data"] or "")


class ViewCounter:
    """Counts what a view serves: exact o200k tokens when the tokenizer is there, else
    safe_estimate. A message's count is kept by (label, stub), so fitting a view by
    several allocations counts each message once."""

    def __init__(self, tokens=None):
        self.tokens = tokens or TOKENS
        self._cache = {}

    @property
    def exact(self) -> bool:
        return self.tokens.usable()

    def text(self, text) -> int:
        return self.tokens.count_many([text])[0] if text else 0

    def texts(self, texts) -> list:
        """text() of each, counted in one batch."""
        return self.tokens.count_many(list(texts)) if texts else []

    def prime(self, pairs, texts=()) -> None:
        """Count many (message, stub) pairs in one batch before message() asks for each,
        and with them ``texts`` that text() will ask for (a view's header, its notes):
        counted apart, each short text would need an encoder of its own."""
        todo = {}
        for m, stub in pairs:
            if (m["seq"], stub) not in self._cache:
                todo[(m["seq"], stub)] = counted_parts(m, stub)
        counts = self.tokens.count_many([text for text, _i, _n in todo.values()]
                                        + [ids for _t, ids, _n in todo.values()] + [t for t in texts if t])
        for (key, (_t, _i, images)), n, n_id in zip(todo.items(), counts, counts[len(todo):]):
            self._cache[key] = n + n_id + images + MESSAGE_TOKENS

    def prefill(self, counted: dict) -> None:
        """Counts made elsewhere, by (label, stub) as message() keys them (counted_parts
        together)."""
        for key, tokens in counted.items():
            self._cache.setdefault(key, tokens + MESSAGE_TOKENS)

    def message(self, m, stub) -> int:
        key = (m["seq"], stub)
        if key not in self._cache:
            self.prime([(m, stub)])
        return self._cache[key]


CALL_ID_TOKENS = 20  # a tool call's id (toolu_ and 24 random letters), as o200k counts it on average
# An image costs what its pixels cost, not its base64: about width x height / 750 tokens,
# the API scaling a larger one down to about 1.15 megapixels, so 1,600 at most.
IMAGE_TOKENS = 1_600


def counted_parts(m, stub) -> tuple:
    """What a view's count takes of a message it shows: (its text, what its block holds
    besides its text, its images' tokens). The text is shown_text, less a pasted image's
    base64, plus the strings of a tool output's blocks other than text, which the view
    serves whole (other_blocks); the rest is call_id_text; an image costs IMAGE_TOKENS."""
    if stub is not None:
        return stub, call_id_text(m), 0
    if m["kind"] == "user_image":
        return "", "", IMAGE_TOKENS
    extra, images = other_blocks(m)
    return shown_text(m, None) + ("\n" + extra if extra else ""), call_id_text(m), IMAGE_TOKENS * images


def other_blocks(m) -> tuple:
    """(strings, images) of a tool output's blocks other than text, which its text names
    only by type ("[document]") and a view serves whole: the strings of an MCP tool's
    search_result or document, a tool_reference (never base64), and how many images."""
    strings, images = [], 0
    for part in result_blocks(m) or ():
        if isinstance(part, dict) and part.get("type") == "image":
            images += 1
        elif isinstance(part, dict) and part.get("type") != "text":
            strings += json_strings(part, skip=NAMING_KEYS, opaque=("base64",))
    return "\n".join(strings), images


def block_data(m):
    """A message's block JSON as the store keeps it (its text a stand-in), read without
    putting the whole one together when the message is a stored one."""
    return m._stored_data if isinstance(m, StoredMessage) and not dict.__contains__(m, "data") else m.get("data")


def data_images(data) -> int:
    """How many images a tool output's block JSON (stored or whole) holds."""
    if '"image"' not in data:  # (base64 holds no quote, and a quote in a text is escaped)
        return 0
    return sum(1 for part in data_blocks(data) or () if isinstance(part, dict) and part.get("type") == "image")


def result_blocks(m):
    """A tool output's list of blocks as the record holds it; None for one that is a string or
    one text block (kept as the text column, its place in the block JSON a stand-in)."""
    if m["kind"] != "tool_result":
        return None
    return data_blocks(block_data(m))


def data_blocks(data):
    """result_blocks of a tool output's block JSON (stored or whole)."""
    whole = bool(data) and data.startswith(KEPT_WHOLE)
    if not data or '"content":[' not in data or (not whole and MARKER_JSON[PAYLOAD_AS_STRING] in data):
        return None
    try:
        block = json.loads(data[len(KEPT_WHOLE):] if whole else data)
    except (ValueError, RecursionError):
        return None
    content = block.get("content") if isinstance(block, dict) else None
    return content if isinstance(content, list) else None


def call_id_text(m) -> str:
    """What a message's block holds besides its text that the model reads: a tool call's
    id and name, a result's id (an id is about 19 tokens, twice a call)."""
    if m["kind"] == "tool_call":
        return f"{m['tool_use_id'] or ''} {m['tool_name'] or ''}"
    if m["kind"] == "tool_result":
        return m["tool_use_id"] or ""
    return ""


def view_tokens(view, header, turns, counter) -> dict:
    """What a served view holds, counted: header (summaries included), full, lean, notes."""
    shown = [(turn, turn_items(view, turn)) for turn in turns
             if view.bands.get(turn.n, "omitted") not in ("omitted", "summary")]
    counter.prime((pair for _, (_, items) in shown for pair in items),
                  [header, VIEW_CLOSING_TEXT] + [note for _, (notes, _) in shown for _at, note in notes])
    out = {"header": counter.text(header), "full": 0, "lean": 0, "notes": 0}
    for turn, (notes, items) in shown:
        for _at, note in notes:
            out["notes"] += counter.text(note) + MESSAGE_TOKENS
        for m, stub in items:
            out[view.band_of(turn.n, m["seq"])] += counter.message(m, stub)
    closing = counter.text(VIEW_CLOSING_TEXT) + MESSAGE_TOKENS
    out["total"] = out["header"] + out["full"] + out["lean"] + out["notes"] + closing
    return out


def serve_view(thread_id, turns, budget, profile, summaries, favoured=(), fell_back=False,
               boundary=0, counter=None, native=False):
    """The view Claude will be served and its header, together inside ``budget`` as
    ``counter`` counts them (exact o200k tokens when the tokenizer is there).

    The bands are allocated by the quick estimate, then what the view holds is counted
    and the allocation redone (see _fit_view); the fullest view within budget is served.
    Parts come whole, so a view can fall short of its budget by most of a part: one that
    fills less than VIEW_REFINE_FILL of it is fitted again with parts a quarter the size,
    and the fuller of the two is served; so is one whose newest tool output is not verbatim
    (a long newest turn cut in parts of several calls each, none of which fits the full
    band alone, where one call would), and of the two the one that holds that output
    verbatim is served. ``view.tokens`` is its count (``view.counting``
    says how it was counted).
    Messages up to ``boundary`` (the thread's visibility boundary, moved by Smart Prune)
    are out of view; ``native``: the header names the cc-lhc mod's tools (see render_header).
    """
    counter = counter or ViewCounter()
    budget = max(0, budget)  # (a reserve larger than a tiny target leaves none: the header alone)
    last_seq = {t.n: t.messages[-1]["seq"] for t in turns if t.messages}
    ask = ViewAsk(thread_id, turns, profile, summaries, favoured, fell_back, boundary, native)
    fixed = _view_parts(thread_id, turns, budget, profile, boundary, fell_back)
    best = _fit_view(ask, budget, fixed, counter, last_seq)
    newest = _newest_result(turns, boundary)
    if ((best.tokens < budget * VIEW_REFINE_FILL or not _verbatim_at(best.view, newest))
            and not _all_verbatim(best.view, last_seq, boundary)):
        finer = _fit_view(ask, budget, _view_parts(thread_id, turns, budget, profile, boundary, fell_back,
                                                   VIEW_REFINE_PARTS, fixed), counter, last_seq)
        if (_verbatim_at(finer.view, newest), finer.tokens) > (_verbatim_at(best.view, newest), best.tokens):
            best = finer
    if not _verbatim_at(best.view, newest):
        best = _newest_outputs_verbatim(best, ask, budget, fixed, counter)
    view, counted = best.view, best.counted
    view.tokens = best.tokens
    view.counting = "exact o200k_base" if counter.exact else "safe estimate"
    counter.tokens.save_later()
    view.costs = {"full": counted["full"], "lean": counted["lean"], "summary": view.costs.get("summary", 0)}
    return view, best.header


def _newest_outputs_verbatim(best, ask, budget, fixed, counter):
    """``best`` with the newest exchange's outputs verbatim, newest first, each one the
    budget still holds: an exchange of several calls at once (Claude read four logs together) is
    one part, so one too large for the verbatim share as a whole went lean, every output a
    stub, where its newest outputs alone fit."""
    turn = ask.turns[-1]
    calls = [m["seq"] for m in turn.messages if m["kind"] == "tool_call"]
    outputs = [m["seq"] for m in turn.messages if m["kind"] == "tool_result" and calls
               and m["seq"] > calls[-1] and m["seq"] > ask.boundary]
    for seq in reversed(outputs):
        if best.view.band_of(turn.n, seq) != "lean":
            continue
        view = _served_verbatim(best.view, turn, seq)
        header = render_header(view, fixed["files"], ask.fell_back, ask.native)
        counted = view_tokens(view, header, ask.turns, counter)
        if counted["total"] <= budget:  # (Claude Code writes them as they finish: an older one may be smaller)
            best = CountedView(counted["total"], view, header, counted)
    return best


def _served_verbatim(view, turn, seq):
    """A copy of ``view`` that serves message ``seq`` of ``turn`` (in a lean run) verbatim."""
    runs = view.pieces.get(turn.n) or [(turn.messages[0]["seq"], turn.messages[-1]["seq"], view.bands[turn.n])]
    cut = []
    for a, b, band in runs:
        if band == "lean" and a <= seq <= b:
            cut += [r for r in ((a, seq - 1, band), (seq, seq, "full"), (seq + 1, b, band)) if r[0] <= r[1]]
        else:
            cut.append((a, b, band))
    merged = []
    for a, b, band in cut:  # (a run next to one of its band: one header line)
        if merged and merged[-1][2] == band:
            merged[-1] = (merged[-1][0], b, band)
        else:
            merged.append((a, b, band))
    bands, pieces = dict(view.bands), dict(view.pieces)
    if len(merged) == 1:
        bands[turn.n] = merged[0][2]
        pieces.pop(turn.n, None)
    else:
        bands[turn.n], pieces[turn.n] = SPLIT, merged
    return View(view.thread_id, bands, dict(view.costs), view.budget, view.profile, view.summaries, pieces)


def _newest_result(turns, boundary):
    """(turn n, seq) of the newest turn's newest tool output after the visibility boundary,
    or None."""
    for m in reversed(turns[-1].messages if turns else ()):
        if m["seq"] <= boundary:
            return None
        if m["kind"] == "tool_result":
            return turns[-1].n, m["seq"]
    return None


def _verbatim_at(view, at) -> bool:
    """Whether the view holds the message at (turn n, seq) verbatim (None: nothing to hold)."""
    return at is None or view.band_of(*at) == "full"


VIEW_REFINE_FILL = 0.9      # a view counted below this share of its budget is fitted again with finer parts
VIEW_REFINE_PARTS = 4       # ... cut at a quarter of the segment size
# What serve_view was asked for, the same in every allocation it tries.
ViewAsk = collections.namedtuple("ViewAsk", "thread_id turns profile summaries favoured fell_back boundary native")
# One allocation's view, counted: its total, the view, its header, and view_tokens' parts.
CountedView = collections.namedtuple("CountedView", "tokens view header counted")


def _counted_view(ask: ViewAsk, alloc, fixed, counter) -> CountedView:
    view, header = _serve_view(ask.thread_id, ask.turns, alloc, ask.profile, ask.summaries, ask.favoured,
                               ask.fell_back, ask.boundary, ask.native, fixed)
    counted = view_tokens(view, header, ask.turns, counter)
    return CountedView(counted["total"], view, header, counted)


def _fit_view(ask: ViewAsk, budget, fixed, counter, last_seq) -> CountedView:
    """The fullest view within ``budget`` of the parts in ``fixed`` (see _view_parts): the
    allocation is scaled by how far the count fell from the budget, and once one allocation
    fits and another does not, halfway between them, up to VIEW_FIT_ROUNDS times (the count
    is a step function of the allocation, so scaling by it overshoots)."""
    alloc, best = budget, None
    fits, over = None, None  # the largest allocation seen within budget, the smallest over it
    for _ in range(VIEW_FIT_ROUNDS):
        found = _counted_view(ask, alloc, fixed, counter)
        used = found.tokens
        if used <= budget:
            if best is None or used > best.tokens:
                best = found
            if used >= budget * VIEW_FIT_FILL or _all_verbatim(found.view, last_seq, ask.boundary):
                break  # full enough, or all of it is in view verbatim
            fits = alloc if fits is None else max(fits, alloc)
        else:
            over = alloc if over is None else min(over, alloc)
        if fits is not None and over is not None:
            if over - fits <= max(2, fits // 64):
                break
            alloc = (fits + over) // 2
        elif over is None:
            alloc = max(alloc + 1, int(alloc * budget / max(used, 1)))
        else:  # (scaled down by a little more than the excess: one just over is not retried by a hair)
            alloc = min(alloc - 1, int(alloc * budget / used * 0.98))
            if alloc <= 0:
                break
    while best is None:  # still over: shrink until it fits (an empty allocation serves the header)
        alloc = int(alloc * budget / max(used, 1) * 0.9)
        found = _counted_view(ask, alloc, fixed, counter)
        used = found.tokens
        if used <= budget or alloc == 0:
            best = found
    return best


def _all_verbatim(view, last_seq, boundary) -> bool:
    """Whether a view holds everything after the visibility boundary verbatim (a larger
    allocation could add nothing)."""
    for n, band in view.bands.items():
        if band == SPLIT:
            if any(b != "full" and last > boundary for _first, last, b in view.pieces[n]):
                return False
        elif band != "full" and last_seq.get(n, 0) > boundary:
            return False
    return True


def _serve_view(thread_id, turns, budget, profile, summaries, favoured, fell_back, boundary,
                native=False, fixed=None):
    """One allocation of the served view within ``budget`` by the quick estimate.

    The header is part of what Claude receives: its fixed part (instructions, working
    set, omitted-range lines, and for each long turn the lines naming its parts and the
    note where it resumes) comes out of the budget before the bands share the rest.
    Messages up to ``boundary`` (the thread's visibility boundary, moved by Smart Prune)
    are out of view, named like any other omitted range. ``native``: the header names the
    cc-lhc mod's tools (see render_header). ``fixed`` holds what does not change with
    the budget, worked out once by serve_view (see there).
    """
    fixed = fixed or _view_parts(thread_id, turns, budget, profile, boundary, fell_back)
    files, by_turn = fixed["files"], fixed["by_turn"]
    view = _build_view(thread_id, turns, by_turn, max(0, budget - fixed["reserve"]), profile,
                       summaries or {}, favoured, fixed["hidden"], fixed["memo"])
    return view, render_header(view, files, fell_back, native)


def _view_parts(thread_id, turns, budget, profile, boundary, fell_back, finer=1, shared=None) -> dict:
    """What every allocation of one view shares: the working set, the turns cut into parts
    (at the segment size of the view's own budget, or a ``finer`` part of it, whatever the
    allocation tried: with the same parts, a larger allocation never serves less), those
    before the boundary, the header's reserve, and each part's cost in each band (filled
    as they are asked; with ``shared``, another cut's, whose working set and costs of the
    same parts are taken over)."""
    soft = max(1, segment_tokens(budget, profile) // finer)
    by_turn = {t.n: turn_parts(t, soft) for t in turns}
    files = shared["files"] if shared else working_set(turns)
    return {"files": files, "by_turn": by_turn, "memo": shared["memo"] if shared else {},
            "hidden": apply_boundary(turns, by_turn, boundary, soft),
            "reserve": _header_reserve(thread_id, turns, by_turn, profile, files, fell_back)}


def _header_reserve(thread_id, turns, by_turn, profile, files, fell_back) -> int:
    """Tokens the header can take at most: its fixed part with every turn named as out of
    view, and the lines naming the parts of each long turn with the note where it resumes."""
    everything_omitted = View(thread_id, {t.n: "omitted" for t in turns}, {}, 0, profile, {})
    reserve = estimate_tokens(render_header(everything_omitted, files, fell_back))
    for turn in turns:
        parts = by_turn[turn.n]
        if len(parts) > 1:
            a, b = parts[0].first, parts[-1].last
            widest = [(a, b, band) for band in BANDS + ("omitted",)]
            # (one note, where the turn resumes after its oldest runs: a run left out further
            # on is rare, and the view's exact count makes room for its note when there is one)
            reserve += estimate_tokens("\n".join(split_lines(turn.n, widest))) + 4 + max(
                estimate_tokens(bridge_note(turn.n, a, b, first=first)) for first in (True, False)) + 4
    return reserve


# -- the visibility boundary (Smart Prune) ---------------------------------------------
#
# The boundary is a message label: everything at or before it is out of view in every
# later view of the thread (Smart Compact's too), named as not in view and retrievable.
# Smart Prune only ever moves it forward. A pruned view holds everything after it
# verbatim: prune summarises nothing and leans nothing, so a turn an earlier Smart
# Compact had put lean or summarised is either verbatim again after the boundary or out
# of view before it.

def safe_cut(messages, boundary: int) -> int:
    """The boundary moved forward, if need be, so that no tool call at or before it waits
    for a result after it (a call and its result never fall on two sides)."""
    paired = paired_tool_ids(messages)
    waiting, cut = set(), 0
    for m in messages:
        if m["seq"] > boundary and not waiting:
            break
        if m["kind"] == "tool_call" and m["tool_use_id"] in paired:
            waiting.add(m["tool_use_id"])
        elif m["kind"] == "tool_result":
            waiting.discard(m["tool_use_id"])
        cut = m["seq"]
    return max(cut, boundary)


def apply_boundary(turns, by_turn, boundary: int, soft: int) -> set:
    """Cut the parts of the turn the boundary falls inside at the boundary (in place), and
    return the (turn, first seq) keys of every part at or before it."""
    hidden = set()
    if boundary <= 0:
        return hidden
    for turn in turns:
        parts = by_turn[turn.n]
        if parts[-1].last <= boundary:
            hidden.update((turn.n, p.first) for p in parts)
            continue
        if parts[0].first > boundary:
            continue
        cut = safe_cut(turn.messages, boundary)
        before = [m for m in turn.messages if m["seq"] <= cut]
        after = Turn(turn.n, turn.kind, turn.status, [m for m in turn.messages if m["seq"] > cut])
        parts = [Part(turn, before, False)] + [Part(turn, p.messages, False)
                                               for p in turn_parts(after, soft)]
        by_turn[turn.n] = parts
        hidden.add((turn.n, parts[0].first))
    return hidden


def prune_view(thread_id, turns, boundary, budget, profile, fell_back=False, native=False):
    """Smart Prune's view (pure): (view, header, new boundary).

    Everything after the new boundary is verbatim; the boundary is the end of the newest
    part that no longer fits ``budget`` with everything newer than it (the newest part
    always stays), and never before ``boundary``. Parts end where no tool call waits, so
    the boundary never separates a call from its result.
    """
    files = working_set(turns)
    soft = segment_tokens(budget, profile)
    by_turn = {t.n: turn_parts(t, soft) for t in turns}
    room = max(0, budget - _header_reserve(thread_id, turns, by_turn, profile, files, fell_back))
    parts = [p for t in turns for p in by_turn[t.n]]
    cut, used, tools = boundary, 0, {}
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if part.n not in tools:
            tools[part.n] = _tool_context(part.turn)
        cost = band_cost(part.turn, "full", messages=part.messages, tools=tools[part.n])
        if part.last <= boundary:
            break  # already out of view
        if used + cost > room and i < len(parts) - 1:
            cut = part.last
            break
        used += cost
    hidden = apply_boundary(turns, by_turn, cut, soft)
    placed = {(p.n, p.first): "omitted" if (p.n, p.first) in hidden else "full"
              for t in turns for p in by_turn[t.n]}
    kept = sum(band_cost(p.turn, "full", messages=p.messages, tools=tools.get(p.n))
               for t in turns for p in by_turn[t.n] if placed[(p.n, p.first)] == "full")
    view = _assemble(thread_id, turns, by_turn, placed, {"full": kept, "lean": 0, "summary": 0},
                     budget, profile, {}, {})
    return view, render_header(view, files, fell_back, native), cut


def fitted_prune_view(thread_id, turns, boundary, budget, profile, fell_back, native, counter):
    """prune_view within ``budget`` as ``counter`` counts it (exact o200k tokens when the
    tokenizer is there; prune_view itself sizes parts by the quick estimate, which ordinary
    log output runs a quarter over): the budget it is given is scaled down by how far the
    count went over, then halfway between one that fits and one that does not, up to
    VIEW_FIT_ROUNDS times. The newest part stays whatever it costs."""
    alloc = budget = max(0, budget)
    best, fits, over = None, None, None
    for _ in range(VIEW_FIT_ROUNDS):
        found = prune_view(thread_id, turns, boundary, alloc, profile, fell_back, native)
        counted = view_tokens(found[0], found[1], turns, counter)
        total, held = counted["total"], best[1]["total"] if best else None
        # the fullest view within budget; while none is, the smallest one counted
        if (best is None or (total <= budget and (held > budget or total > held))
                or (held > budget and total < held)):
            best = (found, counted)
        if counted["total"] <= budget:
            if alloc == budget or counted["total"] >= budget * VIEW_FIT_FILL:
                break  # as much as the budget itself gives, or full enough
            fits = alloc
        else:
            over = alloc
        if alloc == 0:
            break
        if fits is not None and over is not None:
            if over - fits <= max(2, fits // 64):
                break
            alloc = (fits + over) // 2
        else:
            alloc = max(0, min(alloc - 1, alloc * budget // counted["total"]))
    (view, header, cut), counted = best
    view.tokens = counted["total"]
    view.counting = "exact o200k_base" if counter.exact else "safe estimate"
    view.costs = {"full": counted["full"], "lean": 0, "summary": 0}
    counter.tokens.save_later()
    return view, header, cut


BAND_WORDS = (("full", "verbatim"),
              ("lean", "lean (tool outputs replaced by stubs; thinking left out)"),
              ("summary", "summarised below"))


def split_lines(n: int, runs):
    """The header lines naming where each part of a long turn went, oldest first."""
    words = dict(BAND_WORDS)
    lines = [f"t{n} is long, so it is in view in parts:"]
    for a, b, band in runs:
        span = f"m{a}" if a == b else f"m{a}\u2013m{b}"
        if band == "omitted":
            lines.append(f"  {span} not in view; use get-messages {message_request(a, b)}")
        else:
            lines.append(f"  {span} {words[band]}")
    return lines


def bridge_note(n: int, a: int, b: int, native: bool = False, first: bool = True) -> str:
    """What stands where messages a..b of a long turn were left out or summarised: where it
    resumes after its oldest ones (``first``), or the run it skips further on (an exchange
    too large for the view in the middle of work that is in view). ``native``: named by
    the cc-lhc mod's tool, as the header names it."""
    span = f"m{a}" if a == b else f"m{a}\u2013m{b}"
    where = (f"t{n} continues here. Its earlier messages {span} are not shown" if first else
             f"t{n} goes on here after {span}, which {'is' if a == b else 'are'} not shown")
    return (f"[cc-lhc] {where} (the opening message says what became of them); "
            f"{'lhc_get_messages' if native else 'cc-lhc get-messages'} "
            f"{message_request(a, b)} reads them back exactly.")


def turn_items(view: View, turn: Turn, arm=None, native=False):
    """(notes, visible (message, stub) items) of a turn as the view serves it. A long turn
    whose parts are in different bands has a note for each run of its messages the view
    does not show, as (where in the items it stands, its text): a run left out between
    two shown is named where it was, not with the oldest."""
    band = view.bands.get(turn.n)
    if band in ("full", "lean"):
        return [], visible_messages(turn, band, arm, native=native)
    if band != SPLIT:
        return [], []
    tools = _tool_context(turn)
    items, notes, hidden = [], [], None
    for a, b, band in view.pieces[turn.n]:
        if band in ("full", "lean"):
            chosen = [m for m in turn.messages if a <= m["seq"] <= b]
            shown = visible_messages(turn, band, arm, chosen, tools, native)
            if shown and hidden:
                notes.append((len(items), bridge_note(turn.n, *hidden, native, first=not items)))
                hidden = None
            items += shown
        elif hidden is None:
            hidden = (a, b)
        else:
            hidden = (hidden[0], b)
    if hidden and items:  # (the newest run out of view: one exchange too large, at the end)
        notes.append((len(items), bridge_note(turn.n, *hidden, native, first=False)))
    return notes, items


# How the header names the way back when the cc-lhc mod is active: its tools, each line
# no longer than the Bash line it replaces (the header's reserve is measured on those).
# The labels are placeholders (tN, mN): a real-looking one (m57) may not exist in the thread
# and would read as a pointer to it.
NATIVE_READ_BACK = [
    "To read anything back exactly, call these tools:",
    "  lhc_get_turns [tN, tM]       whole turns as recorded",
    "  lhc_get_messages [mN]        single messages, such as a stubbed tool output",
    "  lhc_get_messages [mN-mM]     a run of messages, such as part of a long turn",
    "  lhc_search \"some text\"      where an exact string (a command, an error line) or some words appear",
]


def render_header(view: View, files, fallback_note: bool, native: bool = False) -> str:
    """The opening message of a rebuilt session: what is in view and how to get the rest.

    ``native``: the cc-lhc mod is active, so the way back is its tools, not Bash.
    """
    lines = [
        f"[cc-lhc] This conversation was rebuilt by Smart Compact from thread {view.thread_id}. "
        "Nothing was deleted: every earlier turn is stored word for word and can be read back.",
    ]
    for band, words in BAND_WORDS:
        ranges = label_ranges(view.turns_in(band))
        if ranges:
            lines.append(f"In view, {words}: " + ", ".join(range_text(a, b) for a, b in ranges))
    for a, b in view.omitted_ranges():
        lines += [omitted_line(x, y) for x, y in request_spans(a, b)]  # (each one get-turns takes)
    for n in view.turns_in(SPLIT):
        lines += split_lines(n, view.pieces[n])
    lines += NATIVE_READ_BACK if native else [
        "To read anything back exactly, run these through Bash:",
        "  cc-lhc get-turns tN tM       whole turns as recorded",
        "  cc-lhc get-messages mN       single messages, such as a stubbed tool output",
        "  cc-lhc get-messages mN-mM    a run of messages, such as part of a long turn",
        "  cc-lhc search \"some text\"    where an exact string (a command, an error line) or some words appear",
    ]
    lines.append("Use them instead of guessing what an earlier turn said.")
    if files:
        lines.append("Working set (edited first; the label last showed the file):")
        lines += [f"  {state:<6} {path}  ({'m' + str(label)})" for path, state, label in files]
    if view.summaries:
        lines.append("Summaries of earlier turns:")
        for key in sorted(view.summaries, key=lambda k: k[:2] if isinstance(k, tuple) else (k, 0)):
            text, source = view.summaries[key]
            label = "" if text.startswith("(") else f"({source}) "
            name = f"t{key}" if not isinstance(key, tuple) else \
                f"t{key[0]} m{key[1]}" + (f"\u2013m{key[2]}" if key[2] != key[1] else "")
            lines.append(f"  {name}: {label}" + text.replace("\n", "\n    "))
    if fallback_note:
        lines.append(MSG_CONFIG_FALLBACK)
    return "\n".join(lines)


def header_vocabulary(thread_id) -> str:
    """Every kind of line render_header writes, for thread ``thread_id``, and the numbers a
    label can hold: counted in the same batch as a session's messages (measure), the
    encoder built for them also serves the header counted next (see TokenCounter), which
    would otherwise need one of its own."""
    bands = {1: "omitted", 2: SPLIT, 3: "lean", 4: "summary", 5: "full"}
    pieces = {2: [(10, 10, "omitted"), (11, 12, "summary"), (13, 14, "lean"), (15, 15, "full")]}
    view = View(thread_id, bands, {}, 0, "", {4: ("(x)", "rules"), (2, 11, 12): ("x", "extractive")}, pieces)
    files = [("/a", "edited", 1), ("/b", "read", 2)]
    return "\n".join([render_header(view, files, True), render_header(view, files, False, native=True),
                      VIEW_CLOSING_TEXT, " ".join(map(str, range(1000)))])

# == 7. Rollout writing: a view -> a transcript Claude can resume ===============

ROLLOUT_NAMESPACE = bytes.fromhex("5d2c4f0e8f1b4a559a3c6c1c2b7d9e01")  # (a UUID's 16 bytes: see name_uuid)
ENVELOPE_ATTACHMENTS = ("environment", "date", "model")
# A session started with `claude -w NAME` (or one that entered a worktree) records where the
# worktree is in a worktree-state record after each turn, and `claude --resume` goes back
# into that folder only when the session holds one: a rebuilt session carries the source's
# newest, so Claude goes on working in the worktree, not in the folder cc-lhc started in.
WORKTREE_STATE = "worktree-state"
ZERO_USAGE = {"input_tokens": 0, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
              "output_tokens": 0}

# Claude Code (2.1.328) refuses an Edit or Write of a file outside the project with "File
# has not been read yet" unless its read-file state knows the file, and on --resume it
# fills that state only from the Read, Edit and Write calls it finds paired with a
# successful tool_result (carrying a timestamp) in the transcript: a stubbed Read output
# counts, an Edit makes it read the file from disk, a summary or an omitted turn gives it
# nothing. So for each working-set file whose newest such call is out of view, the rebuilt
# session carries that call with a lean result right after the header. Each pair costs at
# most CARRY_PAIR_BYTES, and all of them together at most CARRY_SHARE of the view budget.
CARRY_TOOLS = frozenset(("Read", "Edit", "Write"))
CARRY_PAIR_BYTES = 1_000
CARRY_SHARE = 0.05


def _block_of(m: dict, stub):
    """The API content block for one message, verbatim unless the band stubbed it."""
    kind = m["kind"]
    if kind == "tool_result" and stub is not None:
        # The recorded block holds the whole output; the stub needs none of it.
        block = {"tool_use_id": m["tool_use_id"], "type": "tool_result", "content": stub}
        if m["is_error"]:
            block["is_error"] = True
        return block
    data = json.loads(m["data"]) if m["data"] else None
    if kind == "tool_result":
        block = dict(data) if isinstance(data, dict) else {"type": "tool_result",
                                                          "tool_use_id": m["tool_use_id"],
                                                          "content": m["text"] or ""}
        if stub is not None:
            block["content"] = stub
        return block
    if stub is not None:
        return {"type": "text", "text": stub}
    if kind in ("tool_call", "thinking") or (data is not None and kind not in (
            "user_text", "user_meta", "assistant_text", "compact_summary")):
        return data
    return {"type": "text", "text": m["text"] or ""}


def view_records(view: View, turns, header: str, session_id: str, cwd: str, now: str,
                 envelope=(), version="2.1.328", git_branch="", arm=None, carried=(), native=False,
                 sources=None, manifest=(), worktree=None):
    """The rebuilt session as transcript records (pure and deterministic).

    A header user message, the source session's envelope attachments, then every lean
    and full turn, or part of a long turn, in order: one user record per original user record, and one record
    per content block for assistant responses, sharing the response's message.id as
    Claude Code itself writes them. Usage on replayed records is zero: the old counts
    would make the new session look as full as the one it replaces. ``carried`` are
    file-state pairs (see carried_file_state); those whose call is not already in view
    go right after the envelope. ``sources``, a list, receives one entry per record: None
    for what cc-lhc wrote itself, else (source uuid, whether it is verbatim, how many
    recorded messages it holds); it is only given without ``carried``. ``manifest``: the
    background work a swap carries into this session (BackgroundCarry.plan), one line
    each, written after the last turn so the replacement knows of it from its first turn.
    ``worktree``: the source's newest worktree-state record (WORKTREE_STATE), written last
    under the new session's id; not for a view served in process (``sources``), whose
    Claude never left its folder.
    """
    counter = [0]
    parent = [None]

    def next_uuid():
        counter[0] += 1
        return name_uuid(f"{session_id}/{counter[0]}")

    def common(rtype, timestamp):
        return {"parentUuid": parent[0], "isSidechain": False, "userType": "external",
                "entrypoint": "cli", "cwd": cwd, "sessionId": session_id, "version": version,
                "gitBranch": git_branch, "type": rtype}

    records = []

    def emit(rec, source=None):
        records.append(rec)
        parent[0] = rec["uuid"]
        if sources is not None:
            sources.append(source)

    header_rec = common("user", now)
    header_rec.update({"message": {"role": "user", "content": header}, "uuid": next_uuid(),
                       "timestamp": now})
    emit(header_rec)
    for att in envelope:
        rec = dict(att)
        rec.update({"parentUuid": parent[0], "sessionId": session_id, "cwd": cwd,
                    "uuid": next_uuid(), "isSidechain": False})
        emit(rec)
    model = next((m["model"] for t in reversed(turns) for m in reversed(t.messages)
                  if m["role"] == "assistant" and m["model"] and m["model"] != "<synthetic>"),
                 "<synthetic>")
    def source_record(item):
        """Messages that came from one transcript record go back into one record."""
        m = item[0]
        role = "assistant" if m["role"] == "assistant" else "user"
        return role, m["response_id"] if role == "assistant" else m["source_uuid"]

    def runs_of(turn):
        """A turn's visible items in runs, each after the note (or None) that stands before it."""
        notes, visible = turn_items(view, turn, arm, native)
        cuts = [0] + [at for at, _note in notes] + [len(visible)]
        texts = [None] + [note for _at, note in notes]
        return [(text, visible[a:b], visible[a - 1] if a else None) for text, a, b in zip(texts, cuts, cuts[1:])]

    for note, visible, near in (run for turn in turns for run in runs_of(turn)):
        if note:
            # Where a long turn's messages are out of view (its oldest, or a run further on)
            # a user-side note stands in for them, so the next response does not follow
            # the one before with nothing between.
            rec = common("user", now)
            rec.update({"message": {"role": "user", "content": note}, "uuid": next_uuid(),
                        "timestamp": (visible[0] if visible else near)[0]["created"] or now})
            emit(rec)
        for (role, _), items in itertools.groupby(visible, key=source_record):
            group = list(items)
            first = group[0][0]
            if role == "user":
                blocks = [_block_of(m, stub) for m, stub in group]
                content = (blocks[0]["text"] if len(blocks) == 1 and blocks[0].get("type") == "text"
                           and first["kind"] != "tool_result" else blocks)
                rec = common("user", first["created"] or now)
                rec.update({"message": {"role": "user", "content": content}, "uuid": next_uuid(),
                            "timestamp": first["created"] or now})
                if first["kind"] == "user_meta":
                    rec["isMeta"] = True
                emit(rec, (first["source_uuid"], all(stub is None for _, stub in group), len(group)))
                continue
            has_tool = any(m["kind"] == "tool_call" for m, _ in group)
            for m, stub in group:  # one record per block, sharing the response's id
                rec = common("assistant", m["created"] or now)
                rec.update({"message": {"id": m["response_id"], "type": "message", "role": "assistant",
                                        "model": m["model"] or "<synthetic>",
                                        "content": [_block_of(m, stub)],
                                        "stop_reason": "tool_use" if has_tool else "end_turn",
                                        "stop_sequence": None, "usage": dict(ZERO_USAGE)},
                            "uuid": next_uuid(), "timestamp": m["created"] or now})
                emit(rec, (m["source_uuid"], stub is None, 1))
    if manifest:
        rec = common("user", now)
        rec.update({"message": {"role": "user", "content": render_manifest(manifest)},
                    "uuid": next_uuid(), "timestamp": now})
        emit(rec)
    if records[-1]["type"] != "assistant":
        # A session must end on Claude's side: otherwise the header, or a prompt left
        # unanswered, would be answered as if the user had just sent it. The model named
        # is the thread's, because --resume adopts the model of the last response.
        rec = common("assistant", now)
        rec.update({"message": {"id": f"msg_cc_lhc_{session_id.replace('-', '')[:24]}",
                                "type": "message", "role": "assistant", "model": model,
                                "content": [{"type": "text", "text": VIEW_CLOSING_TEXT}],
                                "stop_reason": "end_turn", "stop_sequence": None,
                                "usage": dict(ZERO_USAGE)},
                    "uuid": next_uuid(), "timestamp": now})
        emit(rec)
    if carried:
        _splice_carried(records, 1 + len(envelope), carried, common, next_uuid, now)
    if worktree is not None and sources is None:
        state = dict(worktree, sessionId=session_id)
        if isinstance(state.get("worktreeSession"), dict):
            state["worktreeSession"] = dict(state["worktreeSession"], sessionId=session_id)
        records.append(state)
    return records


def worktree_folder(state) -> str | None:
    """The folder a worktree-state record says the session works in, or None."""
    session = state.get("worktreeSession") if isinstance(state, dict) else None
    folder = session.get("worktreePath") if isinstance(session, dict) else None
    return folder if isinstance(folder, str) and folder else None


def render_manifest(lines) -> str:
    """The carried-work manifest as the rebuilt session holds it (see BackgroundCarry)."""
    return ("[cc-lhc] Background work that was still open when this session was rebuilt:\n"
            + "\n".join(f"- {line}" for line in lines))


def _tool_ids_in(records) -> set:
    ids = set()
    for rec in records:
        content = rec["message"]["content"] if rec.get("type") == "assistant" else None
        for block in content or ():
            if block.get("type") == "tool_use":
                ids.add(block.get("id"))
    return ids


def _splice_carried(records, at, carried, common, next_uuid, now):
    """Insert the carried pairs not already in view at ``at``, keeping the parent chain.

    Each pair is written as Claude Code writes a tool call: the call in an assistant
    record, its result in the user record after it, at the time the result came.
    """
    in_view = _tool_ids_in(records)
    added, parent = [], records[at - 1]["uuid"]
    for call, result, stub in carried:
        if call["tool_use_id"] in in_view:
            continue
        for role, m in (("assistant", call), ("user", result)):
            rec = common(role, m["created"] or now)
            if role == "assistant":
                message = {"id": m["response_id"], "type": "message", "role": "assistant",
                           "model": m["model"] or "<synthetic>", "content": [_block_of(m, None)],
                           "stop_reason": "tool_use", "stop_sequence": None, "usage": dict(ZERO_USAGE)}
            else:
                message = {"role": "user", "content": [_block_of(m, stub)]}
            rec.update({"parentUuid": parent, "message": message, "uuid": next_uuid(),
                        "timestamp": m["created"] or now})
            added.append(rec)
            parent = rec["uuid"]
    if added:
        if at < len(records):
            records[at]["parentUuid"] = parent
        records[at:at] = added


def _carry_candidates(turns) -> dict:
    """path -> [(call, result, stub)] of its successful Read/Edit/Write calls, newest first."""
    touches = {}
    for turn in turns:
        results = {m["tool_use_id"]: m for m in turn.messages if m["kind"] == "tool_result"}
        for m in turn.messages:
            if m["kind"] != "tool_call" or m["tool_name"] not in CARRY_TOOLS:
                continue
            result = results.get(m["tool_use_id"])
            try:
                args = json.loads(m["text"] or "{}")
            except ValueError:
                continue
            path = args.get("file_path") if isinstance(args, dict) else None
            if result is None or result["is_error"] or not isinstance(path, str):
                continue
            stub = (tool_stub(result, m["tool_name"])
                    if m["tool_name"] == "Read" and not _keeps_verbatim(result) else None)
            touches.setdefault(path, []).insert(0, (m, result, stub))
    return touches


def _pair_parts(call, result, stub):
    return call["data"] or "", stub if stub is not None else (result["data"] or "")


def carried_file_state(turns, budget, counter=None):
    """The pairs that let Claude Code know the working set's files after a rebuild.

    One pair per working-set file (in the manifest's order): its newest successful Read,
    Edit or Write whose lean form fits CARRY_PAIR_BYTES, until CARRY_SHARE of ``budget``
    is used by LHC's estimate (an exact count of a call's ids would crowd the pairs out
    of a small view). Returns (pairs, tokens), the tokens as ``counter`` counts them (a
    ViewCounter: exact o200k when the tokenizer is there), the same way as the view's
    own messages, so a view served within the budget less them stays within the budget
    with them; pairs already in view are skipped when written (carried_pairs_tokens
    counts those that are not).
    """
    touches = _carry_candidates(turns)
    room = int(budget * CARRY_SHARE)
    pairs, used = [], 0
    for path, _state, _label in working_set(turns):
        for call, result, stub in touches.get(path, ()):
            parts = _pair_parts(call, result, stub)
            if sum(len(p.encode("utf-8")) for p in parts) <= CARRY_PAIR_BYTES:
                cost = sum(estimate_tokens(p) + MESSAGE_TOKENS for p in parts)
                if used + cost <= room:
                    pairs.append((call, result, stub))
                    used += cost
                break
    return pairs, used if counter is None else pairs_tokens(pairs, counter)


def reads_claude_would_forget(store, folders, since: str) -> list:
    """Working-set files outside ``folders`` (the project's) that Claude's Edit would refuse
    as "not read yet" after a compaction inside the running Claude: those whose newest
    successful Read, Edit or Write came before ``since`` (when this Claude process
    started). Claude Code 2.1.328 empties what it knows of read files when it compacts and
    keeps, for Edit, only what this process read itself; a file inside the project it lets
    Edit take anyway. A swap resumes the rebuilt session, whose carried file-state pairs
    (the working set's) Claude reads back, so it keeps them (measured with the real CLI).
    The working set as working_set() makes it, off-branch turns left out, from one query
    (the rebuild loads the turns later; this is asked before it, at every seam)."""
    tools = tuple(EDIT_TOOLS | READ_TOOLS)
    runs = off_branch(store)
    touched = {}  # path -> [edited, newest label, newest successful carried op's time]
    for seq, tool, path, result, created, failed in store.db.execute(
            "SELECT c.seq, c.tool_name, coalesce(json_extract(lhc_text(c.text), '$.file_path'), "
            "json_extract(lhc_text(c.text), '$.notebook_path')), r.seq, r.created, coalesce(r.is_error, 0) "
            "FROM messages c LEFT JOIN messages r ON r.kind = 'tool_result' AND r.tool_use_id = c.tool_use_id "
            f"AND r.agent IS NULL WHERE c.kind = 'tool_call' AND c.agent IS NULL AND c.tool_name IN "
            f"({','.join('?' * len(tools))}) AND json_valid(lhc_text(c.text)) ORDER BY c.seq", tools):
        if not isinstance(path, str) or runs and any(a <= seq <= b for a, b in runs):
            continue
        row = touched.setdefault(path, [False, 0, None])
        row[0] = row[0] or tool in EDIT_TOOLS
        row[1] = result or seq
        if tool in CARRY_TOOLS and result is not None and not failed and created:
            row[2] = created
    ranked = sorted(touched.items(), key=lambda kv: (not kv[1][0], -kv[1][1], kv[0]))[:WORKING_SET_LIMIT]
    roots = [os.path.realpath(f) for f in folders]
    return sorted(path for path, (_edited, _label, created) in ranked
                  if created and created < since and not any(_inside(os.path.realpath(path), root) for root in roots))


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # (another drive)
        return False


def project_folders(spec) -> list:
    """The folders Claude treats as the project's: its working folder and each `--add-dir`."""
    folders, args, i = [spec.cwd], list(spec.claude_args), 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--add-dir="):
            folders.append(arg.split("=", 1)[1])
        elif arg == "--add-dir":
            while i + 1 < len(args) and not args[i + 1].startswith("-"):
                i += 1
                folders.append(args[i])
        i += 1
    return [os.path.join(spec.cwd, f) for f in folders]


def pairs_tokens(pairs, counter) -> int:
    """File-state pairs as ``counter`` counts them, in one batch (one by one, each would
    need an encoder of its own)."""
    parts = [part for pair in pairs for part in _pair_parts(*pair)]
    return sum(counter.texts(parts)) + MESSAGE_TOKENS * len(parts)


def carried_pairs_tokens(view, turns, carried, counter) -> int:
    """What the carried file-state pairs add to a view: those whose call it does not hold."""
    shown = {m["tool_use_id"] for t in turns for m, _stub in turn_items(view, t)[1]
             if m["kind"] == "tool_call"}
    return pairs_tokens([pair for pair in carried if pair[0]["tool_use_id"] not in shown], counter)


def records_bytes(records) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
                    for r in records)


def write_atomic(path: str, data: bytes, mode=0o600) -> None:
    """Write a file so that it either exists complete or not at all."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(path):
            raise LhcError(f"{path} already exists", EXIT_USAGE)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_folder(folder)


def fsync_folder(folder: str) -> None:
    """Make a rename into ``folder`` durable (POSIX; elsewhere the rename is all there is)."""
    if os.name == "posix":
        dfd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


ENVELOPE_LINE_RE = re.compile(rb'"type"\s*:\s*"(?:environment|date|model|worktree-state)"')


# How much of a transcript read_envelope searches at a time, from its end backwards.
ENVELOPE_WINDOW = 1 << 20


def read_envelope(path: str):
    """The newest environment/date/model attachments of a transcript, plus its version and
    branch (and, under WORKTREE_STATE, the newest worktree-state record, when it has one).

    Only lines that name one of those attachment types are parsed, and they are found by
    a regular expression over the mapped file rather than line by line: a long transcript
    has many megabytes of records, and this runs inside Smart Compact. The file is
    searched from its end backwards, a window at a time, and the search stops once the
    newest of each type (and a version) is known; Claude writes them with every prompt.
    """
    import mmap
    latest, meta = {}, {}
    try:
        with open_regular(path) as f:
            try:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except ValueError:  # an empty file cannot be mapped
                return [], {}
            try:
                high = len(data)
                while high > 0 and (len(latest) < len(ENVELOPE_ATTACHMENTS) or "version" not in meta):
                    low = max(0, high - ENVELOPE_WINDOW)
                    if low:
                        low = data.rfind(b"\n", 0, low) + 1  # whole lines: a window starts at one
                    for line in reversed(_envelope_lines(data, low, high)):
                        _envelope_line(line, latest, meta)
                    high = low
            finally:
                data.close()
    except OSError:
        pass
    return [latest[k] for k in ENVELOPE_ATTACHMENTS if k in latest], meta


def _envelope_lines(data, low: int, high: int) -> list:
    """The lines within data[low:high] (which starts a line and ends one) that name an
    envelope attachment type, in file order."""
    lines, end = [], -1
    for hit in ENVELOPE_LINE_RE.finditer(data, low, high):
        if hit.start() < end:
            continue  # the same line named a second type
        start = data.rfind(b"\n", low, hit.start()) + 1 or low
        end = data.find(b"\n", hit.end(), high)
        end = high if end < 0 else end
        lines.append(data[start:end])
    return lines


def _envelope_line(raw: bytes, latest: dict, meta: dict) -> None:
    """One envelope line, newest first: what is already known is not replaced."""
    rec = json_record(raw)
    if rec is None:
        return
    if rec.get("type") == WORKTREE_STATE:
        meta.setdefault(WORKTREE_STATE, rec)
        return
    att = rec.get("attachment")
    if rec.get("type") == "attachment" and isinstance(att, dict) and att.get("type") in ENVELOPE_ATTACHMENTS:
        latest.setdefault(att["type"], rec)
        if rec.get("version") and "version" not in meta:
            meta.update(version=rec["version"], gitBranch=rec.get("gitBranch", ""))


class Rebuild:
    """One rebuilt session, ready to write: its records and what it holds."""

    def __init__(self, session_id, path, data, view, boundary=0, arm=None):
        self.session_id = session_id
        self.path = path
        self.data = data
        self.view = view
        self.boundary = boundary  # the visibility boundary this view was built with
        self.arm = arm


class NoRebuild(LhcError):
    """A rebuild that would serve nothing better than the session Claude is on: nothing is
    written and nothing swaps (``event``: what the log names it)."""

    event = "no_rebuild"


class PruneUnchanged(NoRebuild):
    """Smart Prune found nothing to move out of view: the boundary stays where it is."""

    event = "prune_unchanged"


class ViewHoldsNoTurn(NoRebuild):
    """The target leaves no room for any turn beside the view's header: a session served
    from such a view would hold none of the conversation (status: a usage error, the
    target is the person's to change)."""

    event = "view_holds_no_turn"

    def __init__(self, message: str, budget: int, header: int):
        super().__init__(message, EXIT_USAGE)
        self.budget, self.header = budget, header  # (the view's target; its header's tokens)


def note_no_rebuild(home, thread_id, assessment, e) -> None:
    """A NoRebuild's receipt (no action) and its line in the log."""
    assessment.outcome(f"no_action: {e}")
    home.log(e.event, thread=thread_id, why=str(e))


def no_turn_fits(thread_id, policy, budget, view) -> ViewHoldsNoTurn:
    """Why a view within ``budget`` holds no turn, naming the setting that made the budget."""
    target = policy["lowerBoundTokens"]
    which = ("lowerBoundTokens" if budget >= target else
             f"the trigger less the minimum runway: upperBoundTokens {policy['upperBoundTokens']:,} "
             f"less minRunwayTokens {policy['minRunwayTokens']:,}")
    return ViewHoldsNoTurn(f"a view of thread {thread_id} within the target of {budget:,} tokens holds no "
                           f"turn (its header alone is {view.tokens:,}); give a larger target ({which})",
                           budget, view.tokens)


def plan_rebuild(home, store, thread_id, policy, session_id, cwd, projects_root=None,
                 envelope_from=None, now=None, arm=None, prune_target=None, native=False,
                 sources=None, manifest=(), idle=False, gone=False) -> Rebuild:
    """Build the served view of a thread and the transcript bytes for a new session.

    ``arm`` is the thinking replay arm (default: the thread's, see thinking_arm).
    ``prune_target`` makes it Smart Prune's view (prune_view) within that many tokens;
    it raises PruneUnchanged when that would not move the visibility boundary.
    ``native``: the cc-lhc mod is active, so the view names its tools (serve_view).
    ``sources`` (a list) is filled as view_records fills it, for a view served in process:
    that Claude process still knows every file it read, so no file-state pairs are carried.
    ``manifest``: lines naming the background work a swap carries (view_records).
    ``idle``: no Claude writes the transcript (before a launch, a fork, rollout write), so
    a newest turn left open that is over all the same (unsettled_reason) is in the view.
    ``gone``: the session's transcript no longer exists, so nothing will ever close a turn
    it left open: that turn is in the view as far as it went (a call without its result
    is left out, as Claude leaves it out on resume).
    """
    turns = load_turns(store, closed_only=not (gone or idle and not unsettled_reason(store, idle=True)))
    boundary = visibility_boundary(store)
    arm = arm or thinking_arm(store, policy)
    budget = policy.effective_target if prune_target is None else prune_target
    # The file-state pairs are set aside first, as if none of them were in view.
    counter = ViewCounter()
    carried, reserve = carried_file_state(turns, budget, counter)
    if manifest:
        reserve += counter.text(render_manifest(manifest)) + MESSAGE_TOKENS
    if prune_target is None:
        view, header = serve_view(thread_id, turns, budget - reserve, policy["profile"],
                                  thread_summaries(store, turns), recent_impression_turns(store),
                                  policy.fell_back, boundary=boundary, counter=counter, native=native)
        # (turns it could have held, all left out; or, the header alone over it, nothing fitted)
        if view.bands and (view.empty or view.tokens > budget - reserve):
            raise no_turn_fits(thread_id, policy, budget, view)
    else:
        view, header, new_boundary = fitted_prune_view(thread_id, turns, boundary, budget - reserve,
                                                       policy["profile"], policy.fell_back, native, counter)
        if new_boundary <= boundary:
            if view.tokens <= budget - reserve:
                raise PruneUnchanged(f"nothing to prune: the view already fits {prune_target:,} tokens"
                                     + (f" after m{boundary}" if boundary else ""))
            carried_too = (f", and the file-state pairs a rebuilt session carries {reserve:,} more"
                           if reserve else "")
            raise PruneUnchanged(f"nothing to prune: what is left is the newest turn's last part, which "
                                 f"always stays in view: it is {view.tokens:,} tokens{carried_too}, over "
                                 f"{prune_target:,}")
        boundary = new_boundary
    envelope, meta = read_envelope(envelope_from) if envelope_from else ((), {})
    worktree = meta.get(WORKTREE_STATE)
    # (the file goes where cc-lhc looks for it; Claude finds it from the worktree too)
    records = view_records(view, turns, header, session_id, worktree_folder(worktree) or cwd,
                           now or utc_now_iso(), envelope,
                           version=meta.get("version", "2.1.328"), git_branch=meta.get("gitBranch", ""),
                           arm=arm, carried=carried if sources is None else (), native=native,
                           sources=sources, manifest=manifest, worktree=worktree)
    root = projects_root or os.path.join(claude_config_dir(), "projects")
    path = os.path.join(root, project_slug(cwd), f"{session_id}.jsonl")
    return Rebuild(session_id, path, records_bytes(records), view, boundary, arm)


def prune_planner(target: int):
    """The plan_view `rebuild` takes for Smart Prune down to ``target`` tokens."""
    return functools.partial(plan_rebuild, prune_target=target)


# Per-thread view state lives in the thread's meta table: the visibility boundary in
# force (moved only forward, once a pruned session was accepted), the boundary each
# rebuilt session was built with until then, and the thinking arm once the API refused
# replayed thinking for the thread.
BOUNDARY_KEY = "visibility_boundary"
THINKING_KEY = "thinking_replay"


def _meta(store, key, default=None):
    row = store.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else default


def _set_meta(store, key, value) -> None:
    with Tx(store.db) as db:
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, str(value)))


def visibility_boundary(store) -> int:
    """The thread's visibility boundary: the newest message label out of view (0: none)."""
    return int(_meta(store, BOUNDARY_KEY, 0))


def note_built_boundary(store, session_id, boundary) -> None:
    _set_meta(store, f"boundary:{session_id}", boundary)


def advance_boundary(store, session_id) -> int:
    """Once a rebuilt session is accepted, its boundary is the thread's (never backwards)."""
    built = int(_meta(store, f"boundary:{session_id}", 0))
    current = visibility_boundary(store)
    if built > current:
        _set_meta(store, BOUNDARY_KEY, built)
    return max(built, current)


def thinking_arm(store, policy) -> str:
    """The thread's own arm once it had to give up replayed thinking, else the policy's."""
    return _meta(store, THINKING_KEY) or policy.values.get("thinkingReplay", THINKING_REBUILD_ARM)


class ThreadSummaries(collections.abc.Mapping):
    """turn -> (text, source) as turn_summary gives them: the model-written ones read at
    once, an extractive one made when it is first asked for (a view of a long thread asks
    for those of the turns it weighs, not of every turn)."""

    def __init__(self, written: dict, turns):
        self._made = {n: (text, "model") for n, text in written.items()}
        self._turns = {t.n: t for t in turns}

    def __getitem__(self, n):
        found = self._made.get(n)
        if found is None:
            found = self._made[n] = (extractive_summary(self._turns[n].messages), "extractive")
        return found

    def __iter__(self):
        return iter(self._turns)

    def __len__(self):
        return len(self._turns)


def thread_summaries(store, turns) -> ThreadSummaries:
    """turn -> (text, source): model-written where there is one, else extractive (the
    model-written ones read in one query)."""
    written = dict(store.db.execute("SELECT turn, text FROM derivations WHERE kind = ? AND source = 'model' "
                                    "ORDER BY id", (SUMMARY_KIND,)))  # (the newest last: it is kept)
    return ThreadSummaries(written, turns)


def recent_impression_turns(store, limit=20):
    turns = set()
    for (text,) in store.db.execute("SELECT turns FROM impressions ORDER BY id DESC LIMIT ?", (limit,)):
        turns.update(int(t) for t in (text or "").split(",") if t.isdigit())
    return turns


def record_lineage(hostdb, session_id, thread_id, path, cwd, data: bytes):
    """Remember the replayed prefix so capturing this session skips it instead of re-taking it."""
    import hashlib
    hostdb.note_session(session_id, thread_id, path, cwd)
    with Tx(hostdb.db):
        hostdb.db.execute("UPDATE sessions SET replayed_prefix_bytes = ?, replayed_prefix_sha256 = ?, "
                          "captured_offset = ? WHERE session_id = ?",
                          (len(data), hashlib.sha256(data).hexdigest(), len(data), session_id))


# == 8. Governor (pure): pressure, states, decisions ============================

# Named states of one classification. Only measured pressure against the trigger
# decides; everything else is a diagnostic.
STATE_NOT_OBSERVED = "not_observed"
STATE_HEALTHY = "healthy"
STATE_OVER_OPEN = "over_trigger_open_turn"
STATE_OVER_SETTLED = "over_trigger_settled"


def provider_context(row):
    """input + cache creation + cache read of one response, or None if any part is unusable."""
    if row is None:
        return None
    parts = row[:3]
    if any(p is None for p in parts):
        return None
    return sum(parts)


def measure_pressure(latest, last_valid, estimate_after_latest, estimate_after_valid, prompt_estimate=0):
    """The governor's reading (pure).

    ``latest`` is the newest response's (input, cache_creation, cache_read) or None;
    ``last_valid`` the newest one that was usable. Content captured after a response is
    an LHC estimate added on top, labelled, never mixed into the provider figure.
    """
    provider = provider_context(latest)
    if provider is not None:
        source, estimate = "provider", estimate_after_latest
    else:
        provider = provider_context(last_valid)
        if provider is None:
            return {"source": STATE_NOT_OBSERVED, "provider_tokens": None,
                    "estimate_tokens": estimate_after_valid + prompt_estimate, "pressure": None}
        source, estimate = "last_known", estimate_after_valid
    estimate += prompt_estimate
    return {"source": source, "provider_tokens": provider, "estimate_tokens": estimate,
            "pressure": provider + estimate}


def classify(reading: dict, trigger: int, settled: bool) -> dict:
    """One named state and whether Smart Compact would run now (pure)."""
    if reading["pressure"] is None:
        state = STATE_NOT_OBSERVED
    elif reading["pressure"] < trigger:
        state = STATE_HEALTHY
    elif settled:
        state = STATE_OVER_SETTLED
    else:
        state = STATE_OVER_OPEN
    return dict(reading, state=state, trigger=trigger, would_mutate=state == STATE_OVER_SETTLED)


def describe_reading(c: dict) -> str:
    if c["pressure"] is None:
        return "provider-reported context: not observed"
    label = "provider-reported" if c["source"] == "provider" else "last known provider-reported"
    return (f"{label} context {c['provider_tokens']:,} + LHC estimated tokens {c['estimate_tokens']:,} "
            f"= {c['pressure']:,} tokens against a trigger of {c['trigger']:,}")


# == 9. Derivations: the work queue and isolated summarisers ====================

# A derivation is text made from the record, never part of it: here one summary per
# settled turn, for the summary band. A model writes it in the background, through an
# isolated `claude -p` that cc-lhc never captures; until it has (and whenever it cannot),
# a deterministic extractive summary, labelled as such, stands in, so a view never waits.

SUMMARY_KIND = "turn_summary"
EXTRACTIVE_MARKER = "(extractive summary)"
EXTRACTIVE_PROMPT_CHARS = 300
EXTRACTIVE_REPLY_CHARS = 400
EXTRACTIVE_TOOLS_CHARS = 240   # the whole "Tools" line
EXTRACTIVE_ERRORS_CHARS = 160  # the whole "Errors" line
EXTRACTIVE_MAX_CHARS = 1200

# The key argument shown for a tool call, first match wins.
TOOL_KEY_ARGUMENTS = ("file_path", "notebook_path", "command", "pattern", "path", "url",
                      "query", "skill", "description", "prompt")

# Bounded input for the summariser. The prompt travels on the command line (stdin stays
# /dev/null), so this also keeps it far below Windows' 32,767-character command line.
SUMMARY_INPUT_MAX_CHARS = 16_000
SUMMARY_MESSAGE_MAX_CHARS = 3_000
SUMMARY_OUTPUT_MAX_CHARS = 4_000
SUMMARY_TIMEOUT_SECONDS = 120
SUMMARY_MAX_ATTEMPTS = 3               # claims of one item (crashed ones count) before it fails
CLAIM_EXPIRY_LIMIT = 2                 # losing a claim to a dead owner this often fails the item
SUMMARY_RETRY_DELAYS = (30, 120, 600)  # seconds a failed item waits before its next claim
WORKER_MAX_PAUSE_SECONDS = 300

SUMMARY_SYSTEM_PROMPT = (
    "You write short, factual summaries of single turns of a coding session between a "
    "user and an AI coding assistant. You have no tools. Reply with the summary only."
)
SUMMARY_INSTRUCTIONS = (
    "Summarise the turn of a coding session below in at most 120 words of plain text: what "
    "the user asked, what was done, and what came of it. Keep exact file paths, commands, "
    "error messages, numbers, names and decisions; leave out pleasantries and anything you "
    "would have to guess. Messages are labelled mN; cite a label where it helps to find a "
    "detail again."
)


class SummariserError(LhcError):
    """A summariser run gave no usable summary. ``usage`` holds tokens it still spent."""

    def __init__(self, message: str, usage=None):
        super().__init__(message)
        self.usage = usage


def _one_line(text, limit=None) -> str:
    """The text's words on one line. With a ``limit``: only as much of it as that takes
    (its first ``limit`` characters are the whole line's, and it is longer when the whole
    line is), not a split of all of a 12 MB prompt's words to keep a few hundred."""
    text = str(text or "")
    if limit is None or len(text) <= 4 * limit + 64:
        return " ".join(text.split())
    first = NOT_SPACE.search(text)  # (a prompt may open with pages of blank lines)
    start = first.start() if first else len(text)
    size = 4 * limit + 64
    while True:
        line = " ".join(text[start:start + size].split())
        if start + size >= len(text) or len(line) > limit:
            return line
        size *= 2


NOT_SPACE = re.compile(r"\S")


def _has_words(text) -> bool:
    text = str(text or "")
    return bool(text) and not text.isspace()


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:max(limit - 1, 0)] + "\u2026"


def _clip_middle(text: str, limit: int) -> str:
    """Keep the head and the tail (where errors and results tend to be)."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    return f"{text[:head]}\n[\u2026 {len(text) - head - tail} characters left out \u2026]\n{text[-tail:]}"


def _tool_key_argument(message, limit=None) -> str:
    try:
        args = json.loads(message.get("text") or "null")
    except ValueError:
        return _one_line(message.get("text"), limit)
    if not isinstance(args, dict):
        return ""
    for key in TOOL_KEY_ARGUMENTS + tuple(sorted(args)):
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return _one_line(value, limit)
    return ""


def _tool_names(messages) -> dict:
    return {m.get("tool_use_id"): m.get("tool_name") or "tool"
            for m in messages if m.get("kind") == "tool_call"}


def extractive_summary(messages, part=False) -> str:
    """A deterministic stand-in summary of one turn, built from its messages alone.

    It names the prompt, the tools called with their key argument, failed tool results
    and the start of the final reply, each with its mN label. Same messages, same bytes;
    never longer than EXTRACTIVE_MAX_CHARS. For a ``part`` of a long turn, its last text
    is only what was said there (the turn's answer, if any, is in another part).
    """
    messages = list(messages)
    names = _tool_names(messages)

    def first(kinds, items):
        return next((m for m in items if m.get("kind") in kinds and _has_words(m.get("text"))), None)

    lines = [EXTRACTIVE_MARKER]
    prompt = first(("user_text",), messages)
    compacted = first(("compact_summary",), messages)
    if prompt:
        lines.append(f"Asked (m{prompt['seq']}): "
                     + _clip(_one_line(prompt["text"], EXTRACTIVE_PROMPT_CHARS), EXTRACTIVE_PROMPT_CHARS))
    elif compacted:
        lines.append(f"Compacted history (m{compacted['seq']}): "
                     + _clip(_one_line(compacted["text"], EXTRACTIVE_PROMPT_CHARS), EXTRACTIVE_PROMPT_CHARS))
    calls = [m for m in messages if m.get("kind") == "tool_call"]
    if calls:
        shown = []
        for m in calls:
            arg = _clip(_tool_key_argument(m, 60), 60)
            shown.append(f"{m.get('tool_name') or 'tool'} m{m['seq']}" + (f" {arg}" if arg else ""))
        lines.append(_clip(f"Tools ({len(calls)}): " + "; ".join(shown), EXTRACTIVE_TOOLS_CHARS))
    errors = [m for m in messages if (m.get("kind") == "tool_result" and m.get("is_error"))
              or m.get("kind") == "api_error"]
    if errors:
        noted = []
        for m in errors:
            what = "API error" if m.get("kind") == "api_error" else names.get(m.get("tool_use_id"), "tool")
            noted.append(f"{what} m{m['seq']}: {_clip(_one_line(m.get('text'), 80), 80)}")
        lines.append(_clip(f"Errors ({len(errors)}): " + "; ".join(noted), EXTRACTIVE_ERRORS_CHARS))
    reply = first(("assistant_text",), reversed(messages))
    if reply:
        lines.append(f"{'Said last' if part else 'Answered'} (m{reply['seq']}): "
                     + _clip(_one_line(reply["text"], EXTRACTIVE_REPLY_CHARS), EXTRACTIVE_REPLY_CHARS))
    elif not part:
        lines.append("Answered: no text reply in this turn")
    return _clip("\n".join(lines), EXTRACTIVE_MAX_CHARS)


def render_turn_for_summary(messages, limit: int = SUMMARY_INPUT_MAX_CHARS) -> str:
    """One turn as labelled plain text for a summariser, never longer than ``limit``.

    Thinking and meta messages are left out; long messages keep their head and tail;
    when the turn is still too long, messages from its middle are left out and counted.
    """
    messages = list(messages)
    names = _tool_names(messages)
    entries = []
    for m in messages:
        kind, seq = m.get("kind"), m.get("seq")
        if kind == "user_text":
            head = f"[m{seq} user]"
        elif kind == "assistant_text":
            head = f"[m{seq} assistant]"
        elif kind == "tool_call":
            head = f"[m{seq} tool call: {m.get('tool_name') or 'tool'}]"
        elif kind == "tool_result":
            head = (f"[m{seq} tool result of {names.get(m.get('tool_use_id'), 'tool')}"
                    + (", error]" if m.get("is_error") else "]"))
        elif kind == "compact_summary":
            head = f"[m{seq} compacted history]"
        elif kind == "api_error":
            head = f"[m{seq} API error]"
        else:
            continue
        entries.append(head + "\n" + _clip_middle(m.get("text") or "", SUMMARY_MESSAGE_MAX_CHARS))
    text = "\n\n".join(entries)
    if len(text) <= limit:
        return text
    budget = limit - 60
    front, back, used = [], [], 0
    i, j = 0, len(entries) - 1
    while i <= j:  # alternate ends so both the prompt and the outcome survive
        take_front = len(front) <= len(back)
        entry = entries[i] if take_front else entries[j]
        if used + len(entry) + 2 > budget:
            break
        used += len(entry) + 2
        if take_front:
            front.append(entry)
            i += 1
        else:
            back.append(entry)
            j -= 1
    gap = [f"[\u2026 {j - i + 1} messages left out \u2026]"] if i <= j else []
    return _clip("\n\n".join(front + gap + back[::-1]), limit)


def summary_prompt(messages) -> str:
    return f"{SUMMARY_INSTRUCTIONS}\n\n<turn>\n{render_turn_for_summary(messages)}\n</turn>"


def summariser_command(claude_bin: str, prompt: str, model=None) -> list:
    """argv of one isolated summariser run (real CLI 2.1.328 checked by the tests).

    --no-session-persistence: the CLI writes no transcript at all; --tools "": the request
    carries an empty tool list; --system-prompt replaces Claude Code's own (~7 KB) prompt.
    """
    argv = [claude_bin, "-p", prompt, "--output-format", "json", "--no-session-persistence",
            "--system-prompt", SUMMARY_SYSTEM_PROMPT, "--disable-slash-commands"]
    if model:
        argv += ["--model", model]
    return argv + ["--tools", ""]  # last: --tools takes a list and would swallow what follows


def summariser_environment(base=None) -> dict:
    """The caller's environment minus every CC_LHC_* variable, with native compaction off.

    Without CC_LHC_* the run cannot reach this process's descriptor or state, and nothing
    downstream mistakes it for a managed session.
    """
    env = {k: v for k, v in (outside_environment() if base is None else base).items()
           if not k.upper().startswith("CC_LHC_")}
    env["DISABLE_AUTO_COMPACT"] = "1"
    return env


def parse_summariser_output(status: int, stdout: str, stderr: str) -> dict:
    """The result of `claude -p --output-format json` -> dict(text, model, tokens).

    Raises SummariserError for a non-zero status, an error result, output that is not
    the JSON result object, or an empty summary.
    """
    doc = None
    for line in reversed((stdout or "").strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict):
                break
            doc = None
    usage = doc.get("usage") if isinstance(doc, dict) and isinstance(doc.get("usage"), dict) else {}
    spent = {"input_tokens": sum(_int_or_none(usage.get(k)) or 0 for k in
                                 ("input_tokens", "cache_creation_input_tokens",
                                  "cache_read_input_tokens")),
             "output_tokens": _int_or_none(usage.get("output_tokens")) or 0}
    spent = spent if usage else None
    if status != 0 or doc is None or doc.get("is_error"):
        detail = doc.get("result") if isinstance(doc, dict) else None
        detail = _clip(_one_line(detail or stderr or stdout, 300) or "no output", 300)
        if status == 0 and doc is None:
            raise SummariserError(f"summariser output is not a JSON result: {detail}")
        raise SummariserError(f"summariser failed (exit status {status}): {detail}", spent)
    text = doc.get("result")
    if not isinstance(text, str) or not text.strip():
        raise SummariserError("summariser returned no summary text", spent)
    models = doc.get("modelUsage")
    model = sorted(models)[0] if isinstance(models, dict) and models else None
    tokens = spent or {"input_tokens": 0, "output_tokens": 0}
    return {"text": _clip(text.strip(), SUMMARY_OUTPUT_MAX_CHARS), "model": model, **tokens}


def _discard_stray_transcripts(home, cwd: str, since: float) -> None:
    """--no-session-persistence writes nothing today; should a CLI version write a
    transcript anyway, it lands in our private cwd's project folder and is removed."""
    seen = set()
    for path in (cwd, os.path.realpath(cwd)):
        folder = os.path.join(claude_config_dir(), "projects", project_slug(path))
        if folder in seen or not os.path.isdir(folder):
            continue
        seen.add(folder)
        for name in sorted(os.listdir(folder)):
            target = os.path.join(folder, name)
            try:
                if name.endswith(".jsonl") and os.path.getmtime(target) >= since - 2:
                    os.unlink(target)
                    home.log("summariser_transcript_removed", path=target)
            except OSError:
                pass


def summarise_turn(home, turn_messages, claude_bin=None, timeout=SUMMARY_TIMEOUT_SECONDS,
                   model=None, on_start=None) -> dict:
    """Have an isolated `claude -p` summarise one turn -> dict(text, model, input_tokens,
    output_tokens). Raises SummariserError on any failure.

    Isolated: its cwd is private (<home>/derivations/work), it keeps no session, has no
    tools, gets no CC_LHC_* variables and reads /dev/null; cc-lhc never captures it.
    ``on_start(popen)`` lets a worker stop a run in flight.
    """
    import subprocess
    import time
    if claude_bin is None:
        try:
            claude_bin = find_claude_binary()
        except LhcError as e:
            raise SummariserError(str(e)) from None
    cwd = home.ensure("derivations", "work")
    extra = {}
    if os.name == "posix":
        extra = {"preexec_fn": _death_link_preexec(os.getpid()), "start_new_session": True}
    started = time.time()
    try:
        proc = subprocess.Popen(summariser_command(claude_bin, summary_prompt(turn_messages), model),
                                cwd=cwd, env=summariser_environment(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, **extra)
    except OSError as e:
        raise SummariserError(f"cannot run {claude_bin}: {e}") from None
    try:
        if on_start is not None:
            on_start(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise SummariserError(f"summariser timed out after {timeout} s") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        _discard_stray_transcripts(home, cwd, started)
    return parse_summariser_output(proc.returncode, out.decode("utf-8", "replace"),
                                   err.decode("utf-8", "replace"))


# -- the work queue (one per thread store) ----------------------------------------


def _owner_key(owner) -> str:
    """A claim owner as stored: a process identity (dict) as canonical JSON."""
    if isinstance(owner, str):
        return owner
    return json.dumps(owner, sort_keys=True, separators=(",", ":"))


def _iso_after(now_iso: str, seconds: float) -> str:
    moment = datetime.datetime.fromisoformat(now_iso.replace("Z", "+00:00"))
    later = moment + datetime.timedelta(seconds=seconds)
    return later.astimezone(datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _home_of(store) -> "StateHome":
    """A thread store lives at <home>/threads/<id>.sqlite."""
    return StateHome(os.path.dirname(os.path.dirname(store.path)))


def queue_summaries(store, turns=None) -> int:
    """Queue a summary for each settled turn (closed or interrupted) that has neither a
    summary nor a queue entry; ``turns`` limits it to those turn numbers. Returns how many."""
    rows = store.db.execute(
        "SELECT t.n FROM turns t WHERE t.status IN ('closed', 'interrupted') "
        "AND NOT EXISTS (SELECT 1 FROM derivations d WHERE d.turn = t.n AND d.kind = ?) "
        "AND NOT EXISTS (SELECT 1 FROM work w WHERE w.turn = t.n AND w.kind = ?) ORDER BY t.n",
        (SUMMARY_KIND, SUMMARY_KIND)).fetchall()
    wanted = None if turns is None else set(turns)
    todo = [(n, SUMMARY_KIND) for (n,) in rows if wanted is None or n in wanted]
    if not todo:  # the common case takes no write lock
        return 0
    with Tx(store.db) as db:
        before = db.total_changes
        db.executemany("INSERT OR IGNORE INTO work (turn, kind) VALUES (?, ?)", todo)
        return db.total_changes - before


def claim_work(store, owner_identity, now=None, home=None):
    """Claim the next item for ``owner_identity`` -> dict(id, turn, kind, attempts,
    expiries) or None.

    Takes a queued item whose retry time has come, or an item whose claim owner no longer
    runs (left by a crash; its attempt counts). An item that loses its claim that way for
    the CLAIM_EXPIRY_LIMIT-th time is failed (`claim_expired_repeatedly`) and a warning
    goes to the wrapper log, instead of crashing a third process.
    """
    owner = _owner_key(owner_identity)
    now = now or utc_now_iso()
    given_up, claimed = [], None
    with Tx(store.db) as db:
        rows = db.execute("SELECT id, turn, kind, status, attempts, expiries, owner, not_before "
                          "FROM work WHERE status IN ('queued', 'claimed') ORDER BY id").fetchall()
        for wid, turn, kind, status, attempts, expiries, holder, not_before in rows:
            error = None
            if status == "claimed":
                if holder == owner or owner_alive(holder):
                    continue
                expiries += 1
                if expiries >= CLAIM_EXPIRY_LIMIT:
                    db.execute("UPDATE work SET status = 'failed', expiries = ?, owner = NULL, "
                               "finished_at = ?, error = 'claim_expired_repeatedly' WHERE id = ?",
                               (expiries, now, wid))
                    given_up.append({"work_id": wid, "turn": turn, "kind": kind,
                                     "attempts": attempts, "last_owner": holder})
                    continue
                error = "claim_expired"
            elif not_before and not_before > now:
                continue
            db.execute("UPDATE work SET status = 'claimed', owner = ?, claimed_at = ?, "
                       "attempts = attempts + 1, expiries = ?, error = coalesce(?, error) "
                       "WHERE id = ?", (owner, now, expiries, error, wid))
            claimed = {"id": wid, "turn": turn, "kind": kind, "attempts": attempts + 1,
                       "expiries": expiries}
            break
    for item in given_up:
        (home or _home_of(store)).log("derivation_failed", level="warning", thread=store.thread_id,
                                      error="claim_expired_repeatedly", **item)
    return claimed


def _record_cost(db, purpose, turn, calls, spent, now) -> None:
    db.execute("INSERT INTO inference_cost (purpose, calls, input_tokens, output_tokens, created, "
               "turn) VALUES (?, ?, ?, ?, ?, ?)",
               (purpose, calls, int(spent.get("input_tokens") or 0),
                int(spent.get("output_tokens") or 0), now, turn))


def finish_work(store, work_id, derivation, now=None) -> int:
    """Store a finished derivation (dict: text, model, input_tokens, output_tokens, and
    optionally source, calls), mark its item done and count the call it took, in one
    transaction. Returns the derivation id."""
    now = now or utc_now_iso()
    with Tx(store.db) as db:
        row = db.execute("SELECT turn, kind FROM work WHERE id = ?", (work_id,)).fetchone()
        if row is None:
            raise LhcError(f"no derivation work item {work_id}")
        turn, kind = row
        cur = db.execute(
            "INSERT INTO derivations (turn, kind, text, source, model, input_tokens, output_tokens, "
            "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (turn, kind, derivation["text"], derivation.get("source", "model"), derivation.get("model"),
             derivation.get("input_tokens"), derivation.get("output_tokens"), now))
        db.execute("UPDATE work SET status = 'done', owner = NULL, finished_at = ?, error = NULL, "
                   "not_before = NULL WHERE id = ?", (now, work_id))
        calls = derivation.get("calls", 1)
        if calls:
            _record_cost(db, kind, turn, calls, derivation, now)
        return cur.lastrowid


def fail_work(store, work_id, error: str, spent=None, now=None) -> str:
    """Record a failed attempt. The item goes back to the queue, claimable again after a
    delay, until it has had SUMMARY_MAX_ATTEMPTS; then it is `failed` for good. Tokens a
    failed call still spent (``spent``) are counted. Returns the item's new status."""
    now = now or utc_now_iso()
    with Tx(store.db) as db:
        row = db.execute("SELECT turn, kind, attempts FROM work WHERE id = ?", (work_id,)).fetchone()
        if row is None:
            raise LhcError(f"no derivation work item {work_id}")
        turn, kind, attempts = row
        if attempts >= SUMMARY_MAX_ATTEMPTS:
            status, not_before, finished = "failed", None, now
        else:
            delay = SUMMARY_RETRY_DELAYS[min(max(attempts - 1, 0), len(SUMMARY_RETRY_DELAYS) - 1)]
            status, not_before, finished = "queued", _iso_after(now, delay), None
        db.execute("UPDATE work SET status = ?, owner = NULL, claimed_at = NULL, error = ?, "
                   "not_before = ?, finished_at = ? WHERE id = ?",
                   (status, _clip(str(error), 500), not_before, finished, work_id))
        if spent:
            _record_cost(db, kind, turn, 1, spent, now)
    return status


def release_work(store, owner) -> int:
    """Hand back every item ``owner`` still claims (a clean exit): queued again, and the
    attempt it had counted is returned. Returns how many."""
    with Tx(store.db) as db:
        return db.execute("UPDATE work SET status = 'queued', owner = NULL, claimed_at = NULL, "
                          "attempts = max(attempts - 1, 0) WHERE status = 'claimed' AND owner = ?",
                          (_owner_key(owner),)).rowcount


def turn_summary(store, turn: int, messages=None):
    """(text, source) for a turn: the newest model-written summary ('model'), else the
    extractive one ('extractive'), computed now and never stored. ``messages`` (the
    turn's, if the caller has them) saves reading them again."""
    row = store.db.execute("SELECT text FROM derivations WHERE turn = ? AND kind = ? "
                           "AND source = 'model' ORDER BY id DESC LIMIT 1",
                           (turn, SUMMARY_KIND)).fetchone()
    if row:
        return row[0], "model"
    if messages is None:
        messages = store.messages(turn, turn)
    return extractive_summary(messages), "extractive"


def derivation_cost(store) -> dict:
    """Summariser calls and tokens spent on this thread so far."""
    calls, tokens_in, tokens_out = store.db.execute(
        "SELECT coalesce(sum(calls), 0), coalesce(sum(input_tokens), 0), "
        "coalesce(sum(output_tokens), 0) FROM inference_cost").fetchone()
    return {"calls": calls, "input_tokens": tokens_in, "output_tokens": tokens_out}


def work_counts(store) -> dict:
    """status -> number of queue items (queued, claimed, done, failed)."""
    return dict(store.db.execute("SELECT status, count(*) FROM work GROUP BY status").fetchall())


class DerivationWorker:
    """Summarises one thread's settled turns in the background while a host runs.

    Loop: queue new settled turns, claim one, summarise it, store the result. A failed
    run is recorded on its item (retried later, within bounds) and slows the loop down;
    nothing here raises into the host. stop() ends a run in flight and hands unfinished
    claims back, so the next process starts them afresh.
    """

    def __init__(self, home, thread_id, claude_bin=None, timeout=SUMMARY_TIMEOUT_SECONDS,
                 model=None, idle_seconds=2.0, summariser=None):
        import threading
        self.home = home
        self.thread_id = thread_id
        self.claude_bin = claude_bin
        self.timeout = timeout
        self.model = model
        self.idle_seconds = idle_seconds
        self.summarise = summariser or summarise_turn
        # The worker field keeps two workers of one process from releasing each other's claims.
        self.owner = {**process_identity(), "worker": os.urandom(16).hex()[:12]}
        self.done = 0
        self.failed = 0
        self._stopping = threading.Event()
        self._thread = None
        self._proc = None

    def start(self) -> "DerivationWorker":
        import threading
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name=f"cc-lhc derivations {self.thread_id[:8]}")
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.terminate()
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout)
            if not self._thread.is_alive():
                return
        try:  # not started, or stuck: release from here
            store = ThreadStore(self.home, self.thread_id)
            try:
                release_work(store, self.owner)
            finally:
                store.close()
        except Exception as e:
            self.home.log("derivation_worker_error", thread=self.thread_id, error=repr(e))

    def run_pending(self, store=None, limit=None) -> int:
        """Work in this thread until nothing is claimable (or ``limit`` items); returns
        how many items were tried."""
        own = store is None
        store = store or ThreadStore(self.home, self.thread_id)
        tried = 0
        try:
            while limit is None or tried < limit:
                if self.step(store) in ("idle", "released"):
                    break
                tried += 1
        finally:
            if own:
                release_work(store, self.owner)
                store.close()
        return tried

    def step(self, store) -> str:
        """One claim and run: 'idle', 'done', 'failed' or 'released' (stopping)."""
        queue_summaries(store)
        item = claim_work(store, self.owner, home=self.home)
        if item is None:
            return "idle"
        try:
            messages = list(store.messages(item["turn"], item["turn"]))
            result = self.summarise(self.home, messages, claude_bin=self.claude_bin,
                                    timeout=self.timeout, model=self.model, on_start=self._started)
        except Exception as e:  # whatever went wrong, the host carries on
            if self._stopping.is_set():
                release_work(store, self.owner)
                return "released"
            status = fail_work(store, item["id"], str(e), spent=getattr(e, "usage", None))
            self.failed += 1
            self.home.log("derivation_attempt_failed", level="warning" if status == "failed" else "info",
                          thread=self.thread_id, turn=item["turn"], work_id=item["id"],
                          attempts=item["attempts"], status=status, error=_clip(str(e), 300))
            return "failed"
        finally:
            self._proc = None
        finish_work(store, item["id"], result)
        self.done += 1
        return "done"

    def _started(self, proc) -> None:
        self._proc = proc
        if self._stopping.is_set():
            proc.terminate()

    def _run(self) -> None:
        store = None
        pause = self.idle_seconds
        try:
            store = ThreadStore(self.home, self.thread_id)
            while not self._stopping.is_set():
                try:
                    outcome = self.step(store)
                except Exception as e:
                    self.home.log("derivation_worker_error", thread=self.thread_id, error=repr(e))
                    outcome = "failed"
                if outcome == "done":
                    pause = self.idle_seconds
                    continue
                if outcome == "failed":  # inference is unavailable: ask less often
                    pause = min(max(pause * 2, self.idle_seconds), WORKER_MAX_PAUSE_SECONDS)
                    self._stopping.wait(pause)
                else:
                    self._stopping.wait(self.idle_seconds)
        except Exception as e:
            self.home.log("derivation_worker_error", thread=self.thread_id, error=repr(e))
        finally:
            if store is not None:
                try:
                    release_work(store, self.owner)
                except Exception as e:
                    self.home.log("derivation_worker_error", thread=self.thread_id, error=repr(e))
                store.close()


# == 10. Processes: identity, leases, descriptors, spawning, death-linking ======


class StateHome:
    """The private state folder (~/.cc-lhc or $CC_LHC_HOME) and its log."""

    def __init__(self, root=None, scratch=False):
        self.root = os.path.abspath(root or os.environ.get("CC_LHC_HOME")
                                    or os.path.join(os.path.expanduser("~"), ".cc-lhc"))
        # A folder thrown away after one command (measure's): its stores never wait for the disk.
        self.scratch = scratch

    def path(self, *parts) -> str:
        return os.path.join(self.root, *parts)

    def ensure(self, *parts) -> str:
        """Create a folder under the home (0700 on POSIX) and return its path."""
        path = self.path(*parts)
        if not os.path.isdir(path):
            # One step at a time: makedirs gives the folders it creates on the way (the
            # home itself, on a first use that starts here) the umask's mode, not 0700.
            here = self.root
            rel = os.path.relpath(path, self.root)
            for step in [""] + ([] if rel == "." else rel.split(os.sep)):
                here = os.path.join(here, step) if step else here
                if not os.path.isdir(here):
                    os.makedirs(here, mode=0o700, exist_ok=True)
                    if os.name == "posix":
                        os.chmod(here, 0o700)
        return path

    # wrapper.log is moved to wrapper.log.1 (replacing the one before) once it passes this
    # size, so a long-used state folder holds at most about twice as much log.
    LOG_ROTATE_BYTES = 16 << 20

    @staticmethod
    def _rotate_log(fd, path) -> None:
        """Move the full log aside, holding its lock: a writer that saw it full too finds,
        once it has the lock, that the file at the path is another (or none) and leaves it."""
        try:
            import fcntl
        except ImportError:  # Windows: no advisory locks here; a second move is only a lost .1
            fcntl = None
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            full, now = os.fstat(fd), os.stat(path)
            if (now.st_ino, now.st_dev) == (full.st_ino, full.st_dev):
                os.replace(path, path + ".1")
        finally:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def log(self, event: str, **fields) -> None:
        """Append one line to wrapper.log. Logging never breaks a session."""
        try:
            self.ensure()
            line = json.dumps({"ts": utc_now_iso(), "pid": os.getpid(), "event": event, **fields},
                              ensure_ascii=False, sort_keys=False)
            path = self.path("wrapper.log")
            # (non-blocking: a FIFO put where the log was must not hold the session)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0), 0o600)
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    return
                # a value holding bytes that are not UTF-8 (an argument, a path) is kept as an escape
                os.write(fd, (line + "\n").encode("utf-8", "backslashreplace"))
                if os.fstat(fd).st_size > self.LOG_ROTATE_BYTES:
                    self._rotate_log(fd, path)
            finally:
                os.close(fd)
        except Exception:  # an unwritable folder, a FIFO nobody reads, a value json cannot take
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


def boot_id() -> str:
    """An id of the running OS boot, so a pid from an earlier boot never matches."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        pass
    try:
        import psutil
        return str(int(psutil.boot_time()))
    except (ImportError, OSError):
        return "unknown-boot"


def process_start_time(pid: int):
    """The OS's start time of a process (opaque, comparable), or None if it is gone."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            # Field 22 (starttime) counted after the ")" that ends the command name,
            # which itself may contain spaces or parentheses.
            return int(stat[stat.rindex(b")") + 2:].split()[19])
        except FileNotFoundError:
            return None
        except (OSError, ValueError, IndexError):
            pass
    try:
        import psutil
    except ImportError:
        return _start_time_without_psutil(pid)
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except Exception:  # psutil.NoSuchProcess and friends
        return None


def _start_time_without_psutil(pid: int):
    """Start time from the OS itself where there is no /proc and no psutil."""
    if os.name == "nt":  # pragma: no cover - Windows only
        import ctypes
        from ctypes import wintypes
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        kernel32.OpenProcess.restype = wintypes.HANDLE
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return None
        try:
            times = [wintypes.FILETIME() for _ in range(4)]
            if not kernel32.GetProcessTimes(handle, *[ctypes.byref(t) for t in times]):
                return None
            code = wintypes.DWORD()
            if kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) and code.value != 259:
                return None  # exited (259 is STILL_ACTIVE)
            return (times[0].dwHighDateTime << 32) | times[0].dwLowDateTime
        finally:
            kernel32.CloseHandle(handle)
    import subprocess
    try:  # POSIX ps: the start time as the OS prints it is opaque but stable
        out = subprocess.run(["ps", "-o", "lstart=", "-p", str(pid)], capture_output=True, text=True,
                             timeout=10, env=outside_environment())
    except (OSError, subprocess.SubprocessError):
        return None
    text = out.stdout.strip()
    if out.returncode != 0 or not text:
        return None
    import hashlib
    return int(hashlib.sha256(text.encode()).hexdigest()[:12], 16)


def parent_pid(pid: int):
    """The parent of a process, or None when it is gone or the OS will not say."""
    if os.path.isdir("/proc/self"):
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            return int(stat[stat.rindex(b")") + 2:].split()[1])  # field 4, after the name
        except (OSError, ValueError, IndexError):
            return None
    try:
        import psutil
    except ImportError:
        return _parent_without_psutil(pid)
    try:
        return psutil.Process(pid).ppid()
    except Exception:  # psutil.NoSuchProcess and friends
        return None


def _parent_without_psutil(pid: int):
    if os.name == "nt":  # pragma: no cover - Windows only: no way without psutil
        return None
    import subprocess
    try:
        out = subprocess.run(["ps", "-o", "ppid=", "-p", str(pid)], capture_output=True, text=True,
                             timeout=10, env=outside_environment())
        return int(out.stdout.strip()) if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def descends_from(pid: int, ancestor: int):
    """True when ancestor is pid itself or one of its parents, False when the chain of
    parents ends without it, None when the OS cannot tell (no /proc, psutil or ps)."""
    for step in range(4096):  # a bound, not a depth anyone reaches
        if pid == ancestor:
            return True
        if pid in (0, 1):
            return False
        parent = parent_pid(pid)
        if parent is None:
            # Not even our own parent is known: this OS cannot tell. A parent that
            # vanished mid-walk, though, is a broken chain: not a descendant.
            return None if step == 0 else False
        pid = parent
    return False


def process_identity(pid: int = None) -> dict:
    """(pid, start time, boot id): names one process for the life of the machine."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": process_start_time(pid), "boot": boot_id()}


def _identity_of(owner_json):
    """The process identity a rebuild's owner column holds (the rebuild's kind aside)."""
    try:
        owner = json.loads(owner_json)
    except (TypeError, ValueError):
        return None
    return {k: v for k, v in owner.items() if k != "what"} if isinstance(owner, dict) else owner


def owner_alive(owner_json) -> bool:
    """identity_alive() for an identity stored as JSON; unreadable means gone."""
    try:
        return identity_alive(json.loads(owner_json))
    except (TypeError, ValueError):
        return False


def identity_alive(ident) -> bool:
    """True only when that exact process (not a later one reusing its pid) still runs."""
    if not isinstance(ident, dict) or not isinstance(ident.get("pid"), int):
        return False
    if ident.get("boot") != boot_id():
        return False
    start = process_start_time(ident["pid"])
    return start is not None and start == ident.get("start")


PR_SET_PDEATHSIG = 1


def _linux_libc(name: str):
    """A function of the C library this process runs on (Linux), or None elsewhere or when
    it has none by that name (glibc's malloc_trim, say)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes
        return getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None


def _death_link_preexec(parent_pid: int):
    """A preexec_fn that makes the child die with the wrapper (Linux).

    prctl(PR_SET_PDEATHSIG) fires when the parent thread dies; the getppid() check
    closes the race where the wrapper died between fork and prctl. libc is looked up
    here, before the fork: importing or loading libraries in a child forked from a
    threaded process can deadlock.
    """
    prctl = _linux_libc("prctl")

    def link():
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(EXIT_ERROR)
    return link


PR_SET_CHILD_SUBREAPER = 36


def set_subreaper(on: bool) -> bool:
    """Whether cc-lhc now takes in (or, ``on`` false, no longer takes in) the processes its
    descendants leave when they end (Linux; see LiveHandoff._end_old). Whether it holds."""
    prctl = _linux_libc("prctl")
    return prctl is not None and prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0


def clock_ticks():
    """Now, in the clock ticks since boot that process start times are counted in (Linux), or None."""
    try:
        with open("/proc/uptime") as f:
            return int(float(f.read().split()[0]) * os.sysconf("SC_CLK_TCK")) + 1
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def _wait_dead(pid: int, seconds: float = 2.0) -> None:
    """Until a child of cc-lhc has ended (bounded), leaving it to be collected by its owner."""
    import time
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is not None:
                return
        except (ChildProcessError, AttributeError, OSError):
            return
        time.sleep(0.002)


def children_of(parent: int, sessions=None) -> dict:
    """pid -> start time of each child of ``parent`` (Linux /proc), ended or not; with
    ``sessions``, only those in one of them."""
    found = {}
    if not os.path.isdir("/proc/self"):
        return found
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()
            if int(fields[1]) == parent and (sessions is None or int(fields[3]) in sessions):
                found[int(name)] = int(fields[19])
        except (OSError, ValueError, IndexError):
            continue
    return found


def exit_status_of(pid: int):
    """The exit status of a process cc-lhc took in (a carried job's shell) once it has
    ended, collected here; None when it is not cc-lhc's to wait for or has not ended."""
    try:
        got, status = os.waitpid(pid, os.WNOHANG)
    except (ChildProcessError, OSError):
        return None
    return os.waitstatus_to_exitcode(status) if got == pid else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return str(signum)


def reap_taken_in(taken: dict, codes: dict) -> None:
    """Collect each process cc-lhc took in (pid -> start time) once it has ended, so none
    stays a zombie under it: its exit status into ``codes``; gone from ``taken`` then."""
    for pid, start in list(taken.items()):
        if process_start_time(pid) != start:
            del taken[pid]  # (collected already, or never ours)
        elif not _alive(pid, start):
            codes[pid] = exit_status_of(pid)
            del taken[pid]


TRIM_AFTER_BYTES = 8 << 20  # a catch-up reading this much gives what it freed back to the system


def release_freed_memory() -> None:
    """Give the memory freed on the heap back to the system (glibc's malloc_trim; elsewhere
    nothing): parsing one line of a 20 MB tool output leaves the heap at ten times that,
    all of it free and none of it returned, for the rest of the session."""
    trim = _linux_libc("malloc_trim")
    if trim is not None:
        trim(0)


def start_watchdog(child_pid: int):
    """Where the kernel cannot tie a child to us (macOS), a small process does it.

    It runs this same program as `cc-lhc __watchdog <wrapper> <child>` (spawn_self).
    """
    if sys.platform.startswith("linux") or os.name != "posix":
        return None
    return spawn_self(["__watchdog", str(os.getpid()), str(child_pid)])


def spawn_self(args: list, stdin=None):
    """Start this same program (`cc-lhc <args>`) as a helper process in a session of its
    own, so the terminal's hangup does not end it with the wrapper.

    Through self_command(), so it works from a checkout, the zipapp and the frozen bundle.
    """
    import subprocess
    return subprocess.Popen(self_command() + args,
                            stdin=subprocess.DEVNULL if stdin is None else stdin,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)


def tie_to_wrapper_windows(child_pid: int):  # pragma: no cover - Windows only
    """Windows: put the child in a Job Object that the OS kills when our handle closes.

    The handle closes however cc-lhc ends (exit, crash, taskkill), so Claude and every
    process it started go with it. Returns the job handle, to keep for our lifetime.
    """
    import ctypes
    from ctypes import wintypes
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.CreateJobObjectW.restype = wintypes.HANDLE
    kernel32.OpenProcess.restype = wintypes.HANDLE

    class Basic(ctypes.Structure):
        _fields_ = [("PerProcessUserTimeLimit", ctypes.c_longlong),
                    ("PerJobUserTimeLimit", ctypes.c_longlong), ("LimitFlags", wintypes.DWORD),
                    ("MinimumWorkingSetSize", ctypes.c_size_t),
                    ("MaximumWorkingSetSize", ctypes.c_size_t), ("ActiveProcessLimit", wintypes.DWORD),
                    ("Affinity", ctypes.c_size_t), ("PriorityClass", wintypes.DWORD),
                    ("SchedulingClass", wintypes.DWORD)]

    class Extended(ctypes.Structure):
        _fields_ = [("BasicLimitInformation", Basic), ("IoInfo", ctypes.c_ulonglong * 6),
                    ("ProcessMemoryLimit", ctypes.c_size_t), ("JobMemoryLimit", ctypes.c_size_t),
                    ("PeakProcessMemoryUsed", ctypes.c_size_t), ("PeakJobMemoryUsed", ctypes.c_size_t)]

    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE, EXTENDED_LIMIT_INFORMATION = 0x2000, 9
    PROCESS_SET_QUOTA, PROCESS_TERMINATE = 0x0100, 0x0001
    job = kernel32.CreateJobObjectW(None, None)
    if not job:
        return None
    info = Extended()
    info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
    kernel32.SetInformationJobObject(job, EXTENDED_LIMIT_INFORMATION, ctypes.byref(info),
                                     ctypes.sizeof(info))
    process = kernel32.OpenProcess(PROCESS_SET_QUOTA | PROCESS_TERMINATE, False, child_pid)
    if process:
        kernel32.AssignProcessToJobObject(job, process)
        kernel32.CloseHandle(process)
    return job


def close_tree_windows(child_pid: int) -> None:  # pragma: no cover - Windows only
    """taskkill /T /F: end Claude and everything it started."""
    import subprocess
    subprocess.run(["taskkill", "/T", "/F", "/PID", str(child_pid)], capture_output=True,
                   env=outside_environment())


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
    here = _program_dir()
    if os.path.isfile(here):  # a zipapp: __file__ lives inside the archive
        return [sys.executable, here]
    # Imported rather than run as a script, so Python reuses its cached bytecode: the
    # model runs retrieval often, and compiling this file costs more than the work.
    # sys.path[0] is replaced, not pushed down: for -c it is the current folder, the
    # user's project, whose own json.py or uuid.py must never shadow the standard library.
    return [sys.executable, "-c", "import sys; sys.path[0] = sys.argv.pop(1); "
            "import cc_lhc; cc_lhc.cli()", here]


def outside_environment() -> dict:
    """Our environment as the user's shell gave it, for the programs we start.

    A PyInstaller bundle points LD_LIBRARY_PATH (DYLD_* on macOS) at its own older
    libraries and sets _PYI_* variables; a child inheriting them could load the
    bundle's libstdc++ or OpenSSL and crash, so the user's values are put back.
    """
    env = dict(os.environ)
    if getattr(sys, "frozen", False):
        for name in ("LD_LIBRARY_PATH", "DYLD_LIBRARY_PATH", "DYLD_FRAMEWORK_PATH"):
            original = env.pop(name + "_ORIG", None)
            if original is not None:
                env[name] = original
            else:
                env.pop(name, None)
        for name in list(env):
            if name.startswith("_PYI_") or name == "_MEIPASS2":
                del env[name]
    return env


def child_environment(spec) -> dict:
    """The environment every managed Claude child gets."""
    env = outside_environment()
    env.update(spec.extra_env)
    if RUNTIME_ENV in env:
        # The state folder the descriptor lies in, named outright: a tool Claude runs with
        # another HOME (`HOME=/tmp/x cc-lhc get-turns t3`) still finds it.
        env["CC_LHC_HOME"] = StateHome().root
    if not spec.autocompact and spec.governed:
        # Claude native Compact would replace the conversation with a summary behind our
        # back; Smart Compact does this job losslessly instead.
        env["DISABLE_AUTO_COMPACT"] = "1"
    return env


FAILPOINT_ENV = "CC_LHC_FAILPOINT"
FAILPOINTS = ("after-pending-record", "after-rollout-write", "after-spawn", "before-acceptance",
              "after-acceptance-before-alias", "after-alias-advance")
# The live swap's steps: the rebuild's own two, then the replacement's life until accepted.
LIVE_FAILPOINTS = ("after-pending-record", "after-rollout-write", "after-candidate-spawn",
                   "before-switch", "after-switch-before-accept", "after-alias-advance")
# ...and of an in-process Smart Compact through the cc-lhc mod (InProcessCompact).
IN_PROCESS_FAILPOINTS = ("after-pending-record", "after-view-write", "after-compact-typed",
                         "after-view-replayed", "before-acceptance")
# ...and of a fork cc-lhc writes (fork_thread).
FORK_FAILPOINTS = ("fork-after-copy", "fork-after-register", "fork-after-write")


def failpoint(name: str) -> None:
    """Die here, at once and without cleanup, when $CC_LHC_FAILPOINT names this point.

    Tests use it to kill cc-lhc at every step of Smart Compact and prove the next
    launch recovers with nothing lost.
    """
    if os.environ.get(FAILPOINT_ENV) == name:
        StateHome().log("failpoint", name=name)
        os.kill(os.getpid(), signal.SIGKILL)


class Lease:
    """Exclusive ownership of one thread for this process's life.

    An OS lock on owners/<hash>.lock is held while we live, so a dead owner never
    blocks anyone and a reused pid can never pass for the owner; the JSON beside it
    says who holds the lease, for messages and diagnostics.
    """

    def __init__(self, home, thread_id):
        import hashlib
        self.home = home
        self.thread_id = thread_id
        key = hashlib.sha256(thread_id.encode()).hexdigest()[:24]
        folder = home.ensure("owners")
        self.lock_path = os.path.join(folder, f"{key}.lock")
        self.info_path = os.path.join(folder, f"{key}.json")
        self.fd = None

    # What a refusal says the thread was wanted for (acquire's ``refused``: a launch's by default).
    LAUNCH_REFUSED = ("not starting a second Claude on it (nothing was queued); once that session ends "
                      "it is free, `cc-lhc --resume` picks another thread, and `--fork-session` branches this one")

    def _holder(self) -> str:
        """' by cc-lhc pid N' from the JSON beside the lock (or '' when it says nothing)."""
        try:
            owner = json.loads(read_small_file(self.info_path, DESCRIPTOR_FILE_LIMIT)).get("owner", {})
            return f" by cc-lhc pid {owner.get('pid')}"
        except (OSError, ValueError, AttributeError, RecursionError):
            return ""

    def held_elsewhere(self):
        """None when no process holds the thread; else ' by cc-lhc pid N' (or ''), for a
        list that marks threads in use. Takes nothing: the lock is let go at once."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return None
        try:
            return None if _try_lock(fd) else self._holder()
        finally:
            os.close(fd)  # (closing the file lets go of a lock it took)

    def acquire(self, refused: str = LAUNCH_REFUSED) -> None:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        if not _try_lock(fd):
            os.close(fd)
            holder = self._holder()
            self.held_by = holder
            raise usage_error(f"thread {self.thread_id[:8]} is already in use{holder}; {refused}")
        self.fd = fd
        write_info = json.dumps({"thread_id": self.thread_id, "owner": process_identity(),
                                 "since": utc_now_iso()}).encode()
        tmp = self.info_path + f".{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(write_info)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.info_path)

    def try_acquire(self) -> bool:
        """acquire(), but False (``held_by`` saying by whom) when someone holds it."""
        try:
            self.acquire()
        except LhcError:
            return False
        return True

    def forget(self) -> None:
        """Remove the lock file of a thread that is gone, while holding it (a thread in use
        keeps its own: removed, a waiting process could lock the old file while a new one
        locks a new one)."""
        if self.fd is not None:
            try:
                os.unlink(self.lock_path)
            except OSError:
                pass

    def release(self) -> None:
        if self.fd is not None:
            try:
                os.unlink(self.info_path)
            except OSError:
                pass
            os.close(self.fd)  # closing drops the OS lock
            self.fd = None


def _try_lock(fd) -> bool:
    if os.name == "nt":  # pragma: no cover - Windows only
        import msvcrt
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            return True
        except OSError:
            return False
    import fcntl
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


RUNTIME_ENV = "CC_LHC_RUNTIME_DESCRIPTOR"
DESCRIPTOR_FILE_LIMIT = 64 << 10  # what cc-lhc writes is a few hundred bytes


# The read-only retrieval commands, allowed to run through Bash without a permission
# prompt. Claude Code 2.1.328 matches `Bash(<prefix>:*)` per part of a command line: a
# compound (`;`, `&&`, `|`, a newline) still asks for every other part, and a nested
# `$(...)` or backquote asks for the whole line. Rules given on the command line add to
# the user's own (--allowedTools, --settings, settings files) and a user's deny rule
# still wins. The `=` form keeps each rule one argument, so the variadic option cannot
# swallow the user's first positional (the prompt).
RETRIEVAL_COMMANDS = ("get-turns", "get-messages", "search")


def retrieval_allow_args() -> list:
    """The argv items that let Claude run exactly the retrieval commands unprompted (pure)."""
    return [f"--allowedTools=Bash(cc-lhc {name}:*)" for name in RETRIEVAL_COMMANDS]


def descriptor_paths(runtime: str, token: str):
    """(descriptor file, shim folder) of one token under runtime/."""
    name = token[:16]
    return os.path.join(runtime, f"{name}.json"), os.path.join(runtime, f"bin-{name}")


def shim_dir_of(descriptor_path: str) -> str:
    """The shim folder beside a descriptor file, named for the file: a descriptor rebound
    to another session (/clear, /resume) keeps its path, and its folder, under a new token."""
    folder, name = os.path.split(descriptor_path)
    return os.path.join(folder, f"bin-{name[:-len('.json')] if name.endswith('.json') else name}")


def create_descriptor(home, hostdb, thread_id: str, session_id: str) -> dict:
    """Write the retrieval capability for one live child, and a `cc-lhc` shim for it.

    The descriptor (0600) binds thread, session, this wrapper's process identity and a
    random token that is also recorded in cc-lhc.sqlite; retrieval refuses on any
    mismatch. The shim folder goes first on the child's PATH, so the `cc-lhc` the view
    tells the model to run is this very program, however cc-lhc was installed.
    """
    import secrets
    import shlex
    token = secrets.token_hex(16)
    path, shim_dir = descriptor_paths(home.ensure("runtime"), token)
    body = {"version": 1, "token": token, "thread_id": thread_id, "session_id": session_id,
            "owner": process_identity(), "created": utc_now_iso()}
    write_atomic(path, json.dumps(body).encode("utf-8"))
    os.makedirs(shim_dir, mode=0o700, exist_ok=True)
    if os.name == "nt":  # pragma: no cover - Windows only
        shim = os.path.join(shim_dir, "cc-lhc.cmd")
        with open(shim, "w") as f:
            f.write("@echo off\r\n" + " ".join(f'"{a}"' for a in self_command()) + " %*\r\n")
    else:
        shim = os.path.join(shim_dir, "cc-lhc")
        with open(shim, "w") as f:
            f.write("#!/bin/sh\nexec " + " ".join(shlex.quote(a) for a in self_command()) + ' "$@"\n')
        os.chmod(shim, 0o700)
    with Tx(hostdb.db):
        hostdb.db.execute("INSERT INTO descriptors VALUES (?, ?, ?, ?, ?, ?, NULL)",
                          (token, path, thread_id, session_id, json.dumps(body["owner"]), body["created"]))
    return {"path": path, "token": token, "shim_dir": shim_dir}


def revoke_descriptor(home, hostdb, descriptor: dict, reason: str) -> None:
    """Retrieval through this descriptor refuses from now on (its shim stays)."""
    with Tx(hostdb.db):
        hostdb.db.execute("UPDATE descriptors SET revoked = ? WHERE token = ? AND revoked IS NULL",
                          (f"{utc_now_iso()} {reason}", descriptor["token"]))
    try:
        os.unlink(descriptor["path"])
    except OSError:
        pass


def rebind_descriptor(home, hostdb, descriptor: dict, thread_id: str, session_id: str) -> dict:
    """Issue a new capability at a revoked descriptor's path, for another thread and session.

    A running Claude keeps the descriptor path it was started with in its environment, so
    when it moves to another session (/clear, /resume) the new binding must live there.
    """
    import secrets
    token = secrets.token_hex(16)
    body = {"version": 1, "token": token, "thread_id": thread_id, "session_id": session_id,
            "owner": process_identity(), "created": utc_now_iso()}
    with Tx(hostdb.db):
        hostdb.db.execute("INSERT INTO descriptors VALUES (?, ?, ?, ?, ?, ?, NULL)",
                          (token, descriptor["path"], thread_id, session_id,
                           json.dumps(body["owner"]), body["created"]))
    write_atomic(descriptor["path"], json.dumps(body).encode("utf-8"))
    return dict(descriptor, token=token)


def remove_descriptor(home, hostdb, descriptor: dict, reason: str) -> None:
    import shutil
    revoke_descriptor(home, hostdb, descriptor, reason)
    shutil.rmtree(descriptor["shim_dir"], ignore_errors=True)


def claude_session_of(pid: int):
    """The session a running Claude says it is on, from the file it keeps for its pid.

    Claude Code (2.1.x) writes $CLAUDE_CONFIG_DIR/sessions/<pid>.json while it runs and
    rewrites its sessionId when /clear or an in-app /resume moves it to another session.
    None when there is no such file (older versions) or it cannot be read.
    """
    path = os.path.join(claude_config_dir(), "sessions", f"{pid}.json")
    try:
        body = load_json(read_small_file(path, 64 * 1024))
    except (OSError, ValueError, LhcError):
        return None
    sid = body.get("sessionId") if isinstance(body, dict) else None
    if not (isinstance(sid, str) and is_uuid(sid) and body.get("pid") in (pid, None)):
        return None
    # A Claude killed outright leaves its file behind, and a later process (this one, before
    # it writes its own) can have the same pid: the file names the start of the process it
    # was written by (on Linux /proc's start time, as process_start_time reads it).
    start = body.get("procStart")
    if isinstance(start, str) and start.isdigit() and os.path.isdir("/proc/self"):
        now = process_start_time(pid)
        if now is not None and str(now) != start:
            return None
    return sid


def claude_running(session_id: str, mine=()):
    """The pid of a running Claude (not one of ``mine``) that says it is on ``session_id``
    (the files Claude keeps for its pid, as claude_session_of reads them), else None: one
    in another terminal, or in Claude's background daemon after "Move to background"."""
    folder = os.path.join(claude_config_dir(), "sessions")
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    for name in names:
        stem, _dot, ext = name.partition(".")
        if ext != "json" or not stem.isdigit() or int(stem) in mine:
            continue
        pid = int(stem)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except OSError:
            pass  # (alive, another user's)
        try:  # (a pid reused by a process that is no Claude, where the file names no start)
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"claude" not in f.read(1 << 16):
                    continue
        except OSError:
            pass
        if claude_session_of(pid) == session_id:
            return pid
    return None


def refuse_running_session(session_id: str) -> None:
    """Two Claudes on one session both append to its transcript and neither sees what the
    other wrote: a launch onto a session another Claude runs is refused (exit 2)."""
    pid = claude_running(session_id)
    if pid is not None:
        raise usage_error(f"session {session_id} is open in another Claude (pid {pid}; one Claude runs "
                          "in the background, `claude agents` lists those); not starting a second "
                          "Claude on it (nothing was queued). Close it there, or wait until it is done.")


# A withdrawn descriptor's row says why to a Claude still holding it (_withdrawn); after
# this long none does, and a launch a minute (a CI job) would otherwise add rows for ever.
DESCRIPTOR_ROWS_KEPT_DAYS = 30


def remove_stale_descriptors(home, hostdb) -> int:
    """Launch-time sweep: descriptors whose owning process is gone are removed.

    Both what cc-lhc.sqlite lists and what lies in runtime/: a wrapper killed between
    writing its descriptor and recording it leaves a file no row names. Rows of
    descriptors withdrawn more than DESCRIPTOR_ROWS_KEPT_DAYS ago go too.
    """
    cutoff = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=DESCRIPTOR_ROWS_KEPT_DAYS)
    with Tx(hostdb.db) as db:  # (revoked begins with the time it was written: ISO text orders as time)
        db.execute("DELETE FROM descriptors WHERE revoked IS NOT NULL AND revoked < ?", (utc_iso(cutoff),))
    removed = 0
    for token, path, owner in hostdb.db.execute(
            "SELECT token, path, owner FROM descriptors WHERE revoked IS NULL").fetchall():
        if not owner_alive(owner):
            remove_descriptor(home, hostdb, {"token": token, "path": path,
                                             "shim_dir": shim_dir_of(path)},
                              "owner gone")
            removed += 1
    return removed + _sweep_runtime_folder(home)


def _sweep_runtime_folder(home) -> int:
    """Remove descriptor files (and their shim folders) whose recorded owner is not alive."""
    import shutil
    runtime = home.ensure("runtime")
    removed = 0
    for name in os.listdir(runtime):
        if not name.endswith(".json") or name.startswith("."):
            continue  # a dot-file is a descriptor still being written (write_atomic)
        path = os.path.join(runtime, name)
        try:
            body = json.loads(read_small_file(path, DESCRIPTOR_FILE_LIMIT))
        except (OSError, ValueError, RecursionError):
            body = None
        if isinstance(body, dict) and identity_alive(body.get("owner")):
            continue
        try:
            os.unlink(path)
        except OSError:
            continue
        shutil.rmtree(shim_dir_of(path), ignore_errors=True)
        home.log("descriptor_swept", path=path)
        removed += 1
    return removed


def refuse(reason: str) -> LhcError:
    return LhcError(f"retrieval refused: {reason}", EXIT_USAGE)


def _withdrawn(home, paths) -> str:
    """Why the descriptor at one of ``paths`` (as given, as resolved) was withdrawn, as its
    newest revocation says ('' if this host never issued one there): Claude moved to another
    session, say."""
    if not os.path.exists(home.path("cc-lhc.sqlite")):
        return ""
    paths = list(dict.fromkeys(paths))
    row = HostDB(home).db.execute(f"SELECT revoked FROM descriptors WHERE path IN ({','.join('?' * len(paths))}) "
                                  "ORDER BY created DESC, rowid DESC LIMIT 1", paths).fetchone()
    if not row or not row[0]:
        return ""
    return "retrieval in this window was withdrawn: " + str(row[0]).split(" ", 1)[-1]


def check_descriptor(home) -> dict:
    """Verify the inherited descriptor before anything in the archive is read.

    Fails closed: a missing, malformed, foreign, revoked or stale descriptor, a dead
    owner, or a session that is no longer the thread's current one is a refusal.
    """
    path = os.environ.get(RUNTIME_ENV)
    if path is None:
        raise refuse(f"{RUNTIME_ENV} is not set; retrieval runs inside a cc-lhc session, "
                     "where Claude calls it through Bash")
    if not path:
        raise refuse(f"{RUNTIME_ENV} is set but empty: it names no session's descriptor")
    runtime = os.path.realpath(home.path("runtime"))
    real = os.path.realpath(path)
    if os.path.dirname(real) != runtime:
        raise refuse("the descriptor is not one of this state home's runtime descriptors")
    try:
        st = os.stat(real)
        body = load_json(read_small_file(real, DESCRIPTOR_FILE_LIMIT))
    except NotRegularFile:
        raise refuse("the descriptor is not a regular file")
    except FileNotFoundError:
        raise refuse(_withdrawn(home, (os.path.abspath(path), real)) or "the descriptor is missing")
    except (OSError, ValueError):
        raise refuse("the descriptor is missing or malformed")
    if os.name == "posix" and (st.st_mode & 0o077 or st.st_uid != os.getuid()):
        raise refuse("the descriptor's owner or permissions are wrong")
    if not isinstance(body, dict) or not all(isinstance(body.get(k), str)
                                             for k in ("token", "thread_id", "session_id")):
        raise refuse("the descriptor is malformed")
    if not os.path.exists(home.path("cc-lhc.sqlite")):
        raise refuse("the descriptor is not known to this state home")
    hostdb = HostDB(home)
    row = hostdb.db.execute("SELECT thread_id, session_id, owner, revoked FROM descriptors WHERE token = ?",
                            (body["token"],)).fetchone()
    if row is None or row[3] is not None:
        raise refuse("the descriptor was revoked or never issued")
    if (row[0], row[1]) != (body["thread_id"], body["session_id"]) or json.loads(row[2]) != body.get("owner"):
        raise refuse("the descriptor does not match what this host issued")
    if not identity_alive(body.get("owner")):
        raise refuse("the cc-lhc process that owned this session is gone")
    if descends_from(os.getpid(), body["owner"]["pid"]) is False:
        # Binds the capability to the session's own process tree (its Claude and the
        # tools Claude runs): a descriptor path leaked into another terminal's env, or
        # copied from another live session, does not work there.
        raise refuse("this process does not run inside the cc-lhc session the descriptor "
                     "was issued to")
    registry = Registry(home)
    current = registry.current_session(body["thread_id"])
    if current != body["session_id"]:
        # A rebuilt one-shot session is current only once accepted; until then its own
        # wrapper, and only that one, may already serve it.
        pending = registry.db.execute("SELECT owner FROM rebuilds WHERE session_id = ? AND thread_id = ? "
                                      "AND status = 'pending'",
                                      (body["session_id"], body["thread_id"])).fetchone()
        if pending is None or _identity_of(pending[0]) != body.get("owner"):
            raise refuse(f"session {body['session_id']} is no longer the thread's current session")
    return body


# -- The cc-lhc mod: Claude Code's hooks API, from the inside --------------------
#
# Claude Code 2.1.328 loads mods (`--plugin-dir`): a JavaScript hooks module running
# inside the CLI. cc-lhc ships one as the files below, written at launch into a folder
# named by their version and hash under the state home. It reports each session start
# back to the owning wrapper (the handshake: until it arrives cc-lhc assumes nothing),
# and it serves the retrieval commands as model-callable tools that need no approval.
# Everything it does goes through the `cc-lhc` shim on the child's PATH, so the
# descriptor checks and the page size are the commands' own.

MOD_VERSION = "3"
MOD_MEASURED_CLAUDE = (2, 1, 328)  # the version REAL-CLAUDE-MODS.md measured the API on
MOD_HELLO_FILE = "mod-hello.json"  # in the descriptor's shim folder, removed with it
# An in-process Smart Compact, beside the handshake: the view the wrapper prepared (0600),
# renamed once the hook has taken it; the hook's own request when a person typed /compact;
# and the wrapper's refusal of such a request.
MOD_VIEW_FILE = "mod-view.json"
MOD_SERVED_FILE = "mod-view.served.json"
MOD_REQUEST_FILE = "mod-compact-request.json"
MOD_REFUSED_FILE = "mod-compact-refused.json"
MOD_COMPACT_WAIT = 15.0  # how long the hook waits for the wrapper to prepare a view
MOD_TOOLS = ("lhc_get_turns", "lhc_get_messages", "lhc_search")
MOD_FILES = {
    ".claude-plugin/plugin.json": json.dumps({
        "name": "cc-lhc", "version": f"{VERSION}+mod{MOD_VERSION}",
        "description": "cc-lhc inside Claude Code: session handshake, lossless retrieval tools, Smart Compact in process",
    }, indent=2) + "\n",
    "hooks/hooks.json": '{ "modules": ["./register.js"] }\n',
    "hooks/register.js": r"""// The cc-lhc mod. Written by cc-lhc at launch; edits are overwritten.
// Every action runs the `cc-lhc` on this session's PATH (the owning wrapper's shim), so
// the wrapper checks its runtime descriptor before anything is read.

const PAGE = { type: "integer", minimum: 0,
  description: "Continue a result cut at the 24,000-byte page limit: the token offset its last line names." }
const THROUGH = { type: "string",
  description: "With from: the message label its last line names after --through (such as m57), so the rest continues the same answer." }
const TOOLS = [
  { name: "lhc_get_turns", mcp: false,
    description: "Read whole turns of this cc-lhc thread back exactly as recorded (labels like t12, or ranges like t5-t7). Use it instead of guessing what an earlier turn said.",
    inputSchema: { type: "object", required: ["turns"], properties: {
      turns: { type: "array", minItems: 1, items: { type: "string" }, description: "Turn labels or ranges: [\"t12\", \"t14-t16\"]" },
      from: PAGE, through: THROUGH } } },
  { name: "lhc_get_messages", mcp: false,
    description: "Read single messages of this cc-lhc thread back exactly as recorded (labels like m57, or ranges like m40-m60), such as a tool output the view shows as a stub.",
    inputSchema: { type: "object", required: ["messages"], properties: {
      messages: { type: "array", minItems: 1, items: { type: "string" }, description: "Message labels or ranges: [\"m57\", \"m40-m60\"]" },
      from: PAGE, through: THROUGH } } },
  { name: "lhc_search", mcp: false,
    description: "Search this cc-lhc thread for an exact string (a command, an error line) or some words; answers the labels of matching messages to read back.",
    inputSchema: { type: "object", required: ["text"], properties: {
      text: { type: "string", description: "What to look for" },
      limit: { type: "integer", minimum: 1, description: "How many matches at most" },
      from: PAGE } } },
]

function argvFor(e) {
  const from = [...(Number.isInteger(e.from) ? ["--from", String(e.from)] : []),
    ...(typeof e.through === "string" && e.tool !== "lhc_search" ? ["--through", e.through] : [])]
  if (e.tool === "lhc_get_turns") return ["cc-lhc", "get-turns", ...(e.turns || []).map(String), ...from]
  if (e.tool === "lhc_get_messages") return ["cc-lhc", "get-messages", ...(e.messages || []).map(String), ...from]
  const limit = Number.isInteger(e.limit) ? ["--limit", String(e.limit)] : []
  return ["cc-lhc", "search", ...limit, ...from, "--", String(e.text || "")]
}

async function onStart($, e, next) {
  const started = await next(e)
  try {
    await ownFiles($)
  } catch (err) {
    // Read again at the first compaction.
  }
  try {
    const sid = await $.session.id()
    await $.process.run(["cc-lhc", "mod-hello", sid, e.isInteractive ? "interactive" : "print"], { timeoutMs: 10000 })
  } catch (err) {
    // No cc-lhc on PATH, or it refused: the wrapper sees no handshake and swaps as before.
  }
  return started
}

async function onList($, e, next) {
  const listed = await next(e)
  if (listed.value === undefined) return listed
  return { value: [...listed.value.filter(t => !TOOLS.some(x => x.name === t.name)), ...TOOLS] }
}

async function onRun($, e, next) {
  try {
    const r = await $.process.run(argvFor(e), { timeoutMs: 60000 })
    if (r.exitCode === 0) return { result: r.stdout }
    return { deny: (r.stderr || r.stdout || "").trim() || `cc-lhc exited with status ${r.exitCode}` }
  } catch (err) {
    return { deny: `cc-lhc could not be run: ${err}` }
  }
}

// A compaction of the main conversation (a /compact cc-lhc typed at a settled seam, or
// the person's own) answers with the view cc-lhc built: built messages for its header and
// older content, and the newest messages by handle, so Claude sends them whole (signed
// thinking included). A view cc-lhc typed /compact for is read straight from its file
// beside this session's runtime descriptor (no process to start on the way); anything
// else asks `cc-lhc mod-compact`, which fails when cc-lhc leaves this compaction to
// Claude (nativeCompact, or it could not build a view): then Claude's own runs. A view
// the hook cannot use is declined in its file, so cc-lhc swaps the process at once,
// and the conversation is left as it is ({ skip }), never summarised.
const VIEW_FILE = "mod-view.json"
const VIEW_WAIT_MS = 15000
const READ_MAX = 4 * 1024 * 1024

// This process's runtime descriptor and the view file beside it (its environment is
// fixed for the process's life, so it is read once), and whether compaction is declined.
let own

async function ownFiles($) {
  if (own !== undefined) return own
  const descriptor = await $.env.get("CC_LHC_RUNTIME_DESCRIPTOR")
  const declineAll = (await $.env.get("CC_LHC_MOD_COMPACT")) === "decline"
  if (!descriptor || !descriptor.endsWith(".json")) return own = { declineAll }
  const cut = Math.max(descriptor.lastIndexOf("/"), descriptor.lastIndexOf("\\"))
  const folder = `${descriptor.slice(0, cut + 1)}bin-${descriptor.slice(cut + 1, -5)}`
  return own = { descriptor, declineAll, view: `${folder}${descriptor[cut]}${VIEW_FILE}` }
}

async function readWhole($, path) {
  try {
    return await $.fs.read(path)
  } catch (err) {
    const { size } = await $.fs.stat(path)  // missing: rejects again, as it should
    if (size <= READ_MAX) throw err
    const all = new Uint8Array(size)
    for (let at = 0; at < size; at += READ_MAX) {
      const { base64 } = await $.fs.read(path, { as: "bytes", offset: at, length: READ_MAX })
      all.set(Uint8Array.fromBase64(base64), at)
    }
    return new TextDecoder().decode(all)
  }
}

// The view cc-lhc is preparing or has prepared for this session, waited for while it is
// being built; undefined when there is none (a person's own /compact).
async function preparedView($, sid, files) {
  if (files.descriptor === undefined) return undefined
  const { token } = JSON.parse(await $.fs.read(files.descriptor))
  let until
  for (;;) {
    let text
    try {
      text = await readWhole($, files.view)
    } catch (err) {
      if (!(await $.fs.exists(files.view))) return undefined
      throw err
    }
    const view = JSON.parse(text)
    // Bound to this descriptor and session, written 0600 by the owning wrapper.
    if (typeof token !== "string" || view.token !== token || view.session_id !== sid) return undefined
    if (!view.preparing) return view
    const now = await $.clock.now()
    until = until ?? now + VIEW_WAIT_MS
    if (now > until) return { key: view.key, refused: "no view from cc-lhc in time" }
    await $.clock.sleep(10)
  }
}

async function decline($, files, key, reason) {
  try {
    if (files?.view !== undefined) await $.fs.write(files.view, JSON.stringify({ key, declined: reason }))
  } catch (err) {
    // cc-lhc then sees nothing installed within its wait and swaps all the same.
  }
  return { skip: `cc-lhc: ${reason}` }
}

async function askCcLhc($, sid, e) {
  const words = e.instructions ? ["--", String(e.instructions)] : []
  const r = await $.process.run(["cc-lhc", "mod-compact", sid, String(e.trigger), ...words], { timeoutMs: 30000 })
  return r.exitCode === 0 ? JSON.parse(r.stdout) : undefined
}

async function onCompact($, e, next) {
  if (e.agentId !== undefined || e.trigger === "precompute") return next(e)
  let sid, files, view
  try {
    sid = await $.session.id()
    files = await ownFiles($)
    view = files === undefined ? undefined : await preparedView($, sid, files)
  } catch (err) {
    view = undefined  // unreadable here: cc-lhc mod-compact reads it in its own way
  }
  const typed = view !== undefined
  if (files !== undefined && files.declineAll) {
    return typed ? decline($, files, view.key, "CC_LHC_MOD_COMPACT=decline") : next(e)
  }
  if (!typed) {
    try {
      view = await askCcLhc($, sid, e)
    } catch (err) {
      view = undefined
    }
    if (view === undefined) return next(e)
  }
  if (view.refused !== undefined) return { skip: `cc-lhc: ${view.refused}` }
  const at = new Map(e.messages.map((m, i) => [m.handle, i]))
  const out = []
  let newest = -1
  for (const m of view.messages || []) {
    if (m.handle === undefined) {
      out.push({ role: m.role, text: String(m.text), toolUses: [] })
      continue
    }
    const i = at.get(m.handle)
    // Never a view with a hole in it: cc-lhc swaps the process instead.
    if (i === undefined) return decline($, files, view.key, `message ${m.handle} is not in this conversation`)
    out.push(e.messages[i])
    newest = Math.max(newest, i)
  }
  // What Claude added after the view was made (a prompt it had queued and its answer, a
  // task notification) follows it as it is: a view never leaves out a newer message.
  if (newest >= 0) out.push(...e.messages.slice(newest + 1))
  if (typed) {
    try {
      await $.fs.write(files.view, JSON.stringify({ key: view.key, taken: true }))  // served once
    } catch (err) {
      return { skip: "cc-lhc: its view could not be marked as taken" }
    }
  }
  return { messages: out }
}

export function register(on, options) {
  on("session.start", onStart)
  on("session.compact", onCompact)
  on("tool.list", onList)
  on("tool.run", { tool: "lhc_get_turns" }, onRun)
  on("tool.run", { tool: "lhc_get_messages" }, onRun)
  on("tool.run", { tool: "lhc_search" }, onRun)
}
""",
}


def mod_digest() -> str:
    import hashlib
    h = hashlib.sha256()
    for name in sorted(MOD_FILES):
        h.update(name.encode() + b"\0" + MOD_FILES[name].encode("utf-8") + b"\0")
    return h.hexdigest()


def install_mod(home) -> str:
    """The mod's folder under the state home, its files rewritten where they differ.

    Only cc-lhc's own files are checked: Claude lays type declarations into a folder it
    hot-reloads, and those are left alone.
    """
    folder = home.ensure("mods", f"{MOD_VERSION}-{mod_digest()[:12]}")
    for name, text in MOD_FILES.items():
        path = os.path.join(folder, *name.split("/"))
        data = text.encode("utf-8")
        try:
            with open(path, "rb") as f:
                if f.read(len(data) + 1) == data:
                    if os.name == "posix" and os.fstat(f.fileno()).st_mode & 0o077:
                        os.chmod(path, 0o600)  # (one an earlier version wrote with the umask's mode)
                    continue
        except OSError:
            pass
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return folder


def claudes_own_mod_file(home, path: str) -> bool:
    """Whether ``path`` is one Claude laid into a mod folder itself (type declarations, a
    tsconfig.json: public, and written with its own modes), not one of cc-lhc's files."""
    mods = home.path("mods")
    rel = os.path.relpath(path, mods)
    if rel.startswith(os.pardir) or os.sep not in rel:
        return False
    inner = rel.split(os.sep, 1)[1].replace(os.sep, "/")
    return inner not in MOD_FILES and not any(name.startswith(inner + "/") for name in MOD_FILES)


def claude_version_of(binary: str):
    """The installed Claude's version as (major, minor, patch), from where it lives.

    npm installs keep it in the package's package.json, the native installer in the
    file's own name; reading either costs no process start. None when neither says.
    """
    real = os.path.realpath(binary)
    found = re.search(r"(\d+)\.(\d+)\.(\d+)$", os.path.basename(real))
    if found:
        return tuple(int(x) for x in found.groups())
    here = os.path.dirname(real)
    for folder in (here, os.path.dirname(here)):
        try:
            body = load_json(read_small_file(os.path.join(folder, "package.json"), 1 << 20))
        except (OSError, ValueError, LhcError):
            continue
        if isinstance(body, dict) and body.get("name") == "@anthropic-ai/claude-code":
            m = re.match(r"(\d+)\.(\d+)\.(\d+)", str(body.get("version", "")))
            return tuple(int(x) for x in m.groups()) if m else None
    return None


MOD_CONFLICTS = ("--bare", "--safe-mode")  # both leave plugins unloaded


ENV_OFF = ("off", "0", "false", "no")
ENV_ON = ("on", "1", "true", "yes", "")
_env_said = set()


def env_off(name: str) -> bool:
    """Whether a switch of cc-lhc's environment (on unless set so) is off: off, 0, false or
    no, in any case. Any other word leaves it on, and is said once a process."""
    value = os.environ.get(name, "")
    if value.strip().lower() in ENV_OFF:
        return True
    if value.strip().lower() not in ENV_ON and name not in _env_said:
        _env_said.add(name)
        say(f"{name}={value!r} is neither on nor off (off, 0, false or no turn it off): left on")
    return False


def mod_refusal(spec) -> str:
    """Why a launch does not offer the mod to its Claude child ('' when it does)."""
    if env_off("CC_LHC_MOD"):
        return f"CC_LHC_MOD={os.environ['CC_LHC_MOD']}"
    clash = [a for a in spec.claude_args if a.partition("=")[0] in MOD_CONFLICTS]
    if clash:
        return f"{clash[0]} loads no plugins"
    have = claude_version_of(spec.child_argv[0])
    if have is None:
        return "the installed Claude's version could not be read"
    if have < MOD_MEASURED_CLAUDE:
        return (f"Claude {'.'.join(map(str, have))} is older than "
                f"{'.'.join(map(str, MOD_MEASURED_CLAUDE))}, where the mod API was measured")
    return ""


def cmd_mod_hello(args) -> int:
    """The mod's handshake, run by its session.start hook inside Claude: record which
    session this Claude process says it is on, next to the descriptor that allows it."""
    if not args or not is_uuid(args[0]):
        raise usage_error("usage: cc-lhc mod-hello <session-id> [interactive|print]")
    home = StateHome()
    body = check_descriptor(home)
    shim_dir = shim_dir_of(os.path.realpath(os.environ[RUNTIME_ENV]))
    hello = {"token": body["token"], "session_id": args[0], "pid": os.getppid(),
             "surface": args[1] if len(args) > 1 else "", "mod": MOD_VERSION, "at": utc_now_iso()}
    path = os.path.join(shim_dir, MOD_HELLO_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(hello, f)
    os.replace(tmp, path)  # a later hello (the same process on another session) replaces it
    return EXIT_OK


def _write_private_json(path: str, body: dict) -> None:
    """Replace a small JSON file in one step, readable by this user only."""
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


def _read_bound_json(folder: str, name: str, token: str, limit=DESCRIPTOR_FILE_LIMIT):
    """A JSON file beside a descriptor, only when it names that descriptor's token."""
    try:
        body = load_json(read_small_file(os.path.join(folder, name), limit))
    except (OSError, ValueError, LhcError):
        return None
    return body if isinstance(body, dict) and body.get("token") == token else None


MOD_VIEW_LIMIT = 64 << 20  # a view is at most the trigger's worth of text, with room


def cmd_mod_compact(args) -> int:
    """Run by the mod's session.compact hook inside Claude: print the view cc-lhc prepared
    for this compaction (JSON), asking the owning wrapper for one when none is waiting.

    The hook reads a view cc-lhc typed /compact for straight from its file; this is its
    way when that read fails, and for a person's own /compact. Prints {"refused": why}
    when cc-lhc gave up a compaction it started (the hook leaves the conversation as it
    is); exit 1 with the reason when cc-lhc leaves this compaction to Claude's own summary.
    """
    import time
    if len(args) < 2 or not is_uuid(args[0]) or (len(args) > 2 and args[2] != "--"):
        raise usage_error("usage: cc-lhc mod-compact <session-id> <trigger> [-- instructions]")
    home = StateHome()
    body = check_descriptor(home)
    if args[0] != body["session_id"]:
        raise refuse(f"session {args[0]} is not the session this descriptor serves")
    folder = shim_dir_of(os.path.realpath(os.environ[RUNTIME_ENV]))
    deadline = time.monotonic() + MOD_COMPACT_WAIT
    asked = False
    while True:
        view = _claim_view(folder, body)
        if view is not None and "preparing" not in view:
            break
        if view is None and not asked:  # nothing under way: a person's own /compact
            _write_private_json(os.path.join(folder, MOD_REQUEST_FILE), {
                "token": body["token"], "session_id": args[0], "trigger": args[1],
                "instructions": " ".join(args[3:]), "id": os.urandom(16).hex(), "at": utc_now_iso()})
            asked = True
        refused = _read_bound_json(folder, MOD_REFUSED_FILE, body["token"])
        if refused is not None:
            os.unlink(os.path.join(folder, MOD_REFUSED_FILE))
            if refused.get("skip"):  # no compaction at all, not Claude's own summary instead
                sys.stdout.write(json.dumps({"refused": str(refused.get("reason"))}, ensure_ascii=False))
                return EXIT_OK
            print(f"{PROG}: {refused.get('reason')}", file=sys.stderr)
            return EXIT_ERROR
        if time.monotonic() > deadline:
            print(f"{PROG}: no view from the cc-lhc session within {MOD_COMPACT_WAIT:g} s",
                  file=sys.stderr)
            return EXIT_ERROR
        time.sleep(0.05)
    out = {"refused": view["refused"]} if "refused" in view else {"messages": view["messages"]}
    sys.stdout.write(json.dumps(out, ensure_ascii=False))
    return EXIT_OK


def _claim_view(folder: str, body: dict):
    """Take the prepared view for this descriptor's session, once: it is renamed as it is
    read, which is how the wrapper learns the hook has it. One still being built (or given
    up) is answered as it stands and stays in place."""
    view = _read_bound_json(folder, MOD_VIEW_FILE, body["token"], MOD_VIEW_LIMIT)
    if view is None or view.get("session_id") != body["session_id"]:
        return None
    if "preparing" in view or "refused" in view:
        return view
    try:
        os.replace(os.path.join(folder, MOD_VIEW_FILE), os.path.join(folder, MOD_SERVED_FILE))
    except OSError:
        return None
    return view


def read_mod_hello(descriptor: dict):
    """The newest handshake left for a descriptor, or None."""
    try:
        body = load_json(read_small_file(os.path.join(descriptor["shim_dir"], MOD_HELLO_FILE),
                                         DESCRIPTOR_FILE_LIMIT))
    except (OSError, ValueError, LhcError):
        return None
    return body if isinstance(body, dict) and body.get("token") == descriptor["token"] else None


class ModBridge:
    """What cc-lhc knows of its mod in one interactive session.

    Offered (``folder``) when the launch allows it; active only once the mod inside the
    current Claude child has shaken hands for the session cc-lhc bound. Until then, and
    whenever that fails, Smart Compact swaps processes and the view names the Bash
    commands, as without a mod. Runs on the relay's thread.
    """

    HELLO_SECONDS = 8.0

    def __init__(self, home, folder: str, refusal: str):
        self.home, self.folder = home, folder
        self.reason = refusal        # why the mod is not in use ('' while active or waiting)
        self.active = False
        self.hello = None
        self.hello_seen = None       # (inode, mtime, size) of the handshake file when last read
        self.deadline = None
        self.child_pid = None
        self.unbound_for = None      # the session Claude moved to that the mod has not confirmed
        self.warming = None          # the thread loading the tokenizer once the mod is active

    @classmethod
    def offer(cls, spec, home) -> "ModBridge":
        """Decide at launch; an offered mod goes into the child's argv."""
        refusal = mod_refusal(spec)
        folder = ""
        if not refusal:
            try:
                folder = install_mod(home)
            except OSError as e:
                refusal = f"its folder could not be written: {e}"
        bridge = cls(home, folder, refusal)
        if refusal:
            bridge.settle(refusal)
        return bridge

    def argv(self, argv: list) -> list:
        """A child's argv with the mod's folder given to it (after the program)."""
        return [argv[0], "--plugin-dir", self.folder] + argv[1:] if self.folder else argv

    @property
    def waiting(self) -> bool:
        return bool(self.folder) and not self.active and not self.reason

    def expect(self, child_pid: int) -> None:
        """A child was started with the mod: wait a few seconds for its handshake."""
        import time
        if not self.folder:
            return
        self.active, self.reason, self.child_pid, self.unbound_for = False, "", child_pid, None
        self.deadline = time.monotonic() + self.HELLO_SECONDS

    def on_tick(self, session, child_pid: int):
        """Poll the handshake. Returns a session id the mod reports that is not the bound
        one (Claude moved inside the process), else None."""
        import time
        if not self.folder or session.descriptor is None or self.reason:
            return None
        # (ten times a second for the session's life: the file is read again only once it
        # changed, which a stat tells)
        try:
            st = os.stat(os.path.join(session.descriptor["shim_dir"], MOD_HELLO_FILE))
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
        except OSError:
            seen = None
        if seen is not None and seen == self.hello_seen:
            hello = self.hello
        else:
            hello = read_mod_hello(session.descriptor)
            self.hello_seen = seen if hello is not None else None  # (a torn read is read again)
        if hello is None or hello == self.hello:
            if self.waiting and self.deadline is not None and time.monotonic() > self.deadline:
                self.settle(f"no handshake from the mod within {self.HELLO_SECONDS:g} s")
            return None
        self.hello = hello
        pid = hello.get("pid")
        if not isinstance(pid, int) or descends_from(pid, child_pid) is False:
            self.settle("a handshake came from outside the current Claude process")
            return None
        sid = hello.get("session_id")
        if sid != session.spec.session_id:
            return sid if self.active else None
        if not self.active:
            self.active = True
            self.home.log("mod_active", session=sid, claude_pid=child_pid, folder=self.folder)
            self._warm()
        return None

    def rebind(self, session_id: str) -> None:
        """Claude moved to another session inside the same process (/clear, /resume).

        The mod counts for the new session only if its own handshake named it; /clear
        sends none, so until the mod says so Smart Compact swaps for that session. Typing
        /compact for a session the mod does not serve would run Claude's own lossy one.
        """
        named = bool(self.hello) and self.hello.get("session_id") == session_id
        if self.active and not named:
            self.active, self.deadline, self.unbound_for = False, None, session_id
            self.home.log("mod_unbound", session=session_id,
                          reason="Claude changed session and the mod has not shaken hands for it")

    def confirm(self, session_id: str) -> bool:
        """The mod's compact hook asked for a view for ``session_id``, through the
        descriptor of this very session: it serves that session (the handshake /clear
        never sends). True when that makes the mod count again."""
        if self.active or self.reason or not self.unbound_for or self.unbound_for != session_id:
            return False
        self.active, self.unbound_for = True, None
        self.home.log("mod_active", session=session_id, claude_pid=self.child_pid, folder=self.folder,
                      by="its compact hook asked for this session")
        return True

    def _warm(self) -> None:
        """Load the tokenizer now, off the relay's thread: the first in-process view would
        otherwise wait for it at the seam. The view's builder waits for this (ready)."""
        import threading
        if self.warming is None:
            self.warming = threading.Thread(target=TOKENS.encoding, name="cc-lhc-warm", daemon=True)
            self.warming.start()

    def ready(self) -> None:
        """Before a view is built on the relay's thread: the tokenizer is loaded (or failed)."""
        if self.warming is not None:
            self.warming.join()

    def settle(self, reason: str) -> None:
        """The mod is not in use here: said once, in wrapper.log and in /details."""
        was = self.active
        self.active, self.reason = False, reason
        self.home.log("mod_inactive", reason=reason, was_active=was)

    def details(self) -> str:
        if self.active:
            return (f"active (Claude pid {self.child_pid}): retrieval tools "
                    f"{', '.join(MOD_TOOLS)}")
        if self.waiting:
            return "loaded, waiting for its handshake"
        return f"not in use ({self.reason}); Smart Compact swaps the Claude process"


# == 11. Capture: tailing the live transcript into the store ====================


def rollout_path(session_id: str, cwd: str) -> str:
    return os.path.join(claude_config_dir(), "projects", project_slug(cwd), f"{session_id}.jsonl")


def named_in_projects(projects: str, name: str) -> list:
    """Every file called ``name`` in a folder of a projects folder, in the folders' order
    (Claude finds a session by its id in any of them): the one look the functions below
    share."""
    try:
        entries = sorted(os.listdir(projects))
    except OSError:
        return []
    return [c for c in (os.path.join(projects, e, name) for e in entries) if os.path.lexists(c)]


def claude_reads(path: str) -> bool:
    """Whether Claude finds the session file ``path`` where it looks for sessions: in a
    folder of the projects folder it reads (a session written anywhere else, `rollout
    write --projects-root`, is one Claude cannot find). A folder there that is a link to
    another place is one Claude reads through."""
    projects = os.path.join(claude_config_dir(), "projects")
    parent = os.path.dirname(os.path.dirname(os.path.abspath(path)))
    if os.path.realpath(parent) == os.path.realpath(projects):
        return True
    for candidate in named_in_projects(projects, os.path.basename(path)):
        try:
            if os.path.samefile(candidate, path):
                return True
        except OSError:
            continue
    return False


def session_transcripts(session_id: str, roots) -> list:
    """Every transcript named for this session in a folder of these projects folders."""
    return [c for root in dict.fromkeys(roots) for c in named_in_projects(root, f"{session_id}.jsonl")]


def transcript_elsewhere(path: str):
    """A session transcript of the same name in another folder of the same projects
    folder (session ids are unique), when ``path`` names one that does not exist; else None."""
    name = os.path.basename(path)
    if not (name.endswith(".jsonl") and is_uuid(name[:-6])):
        return None
    return next((c for c in named_in_projects(os.path.dirname(os.path.dirname(path)), name)
                 if c != path and os.path.isfile(c)), None)


def segment_soft_bytes(policy) -> int:
    """Half the full-fidelity share of the lower target, as bytes (4 per token)."""
    target = policy["lowerBoundTokens"] if policy is not None else BUILTIN_POLICY["lowerBoundTokens"]
    profile = policy["profile"] if policy is not None else "default"
    return int(target * PROFILE_SHARES[profile]["full"] / 2) * 4


CaughtBatch = collections.namedtuple("CaughtBatch", "out consumed end lines rows digest prefix")


class BatchWriter:
    """Stores parsed batches one at a time: on a thread of its own, or (one batch) right here.

    SQLite lets go of the GIL while it writes (ThreadStore.apply writes in a few
    multi-row statements), so with a second core the store of one batch overlaps the
    parsing of the next. One write at a time keeps the commits in file order, and the
    caller touches the store's connection only between writes (after wait).
    """

    def __init__(self, background: bool):
        self._thread = None
        self._busy = False
        if background:
            import queue
            import threading
            self._todo, self._done = queue.SimpleQueue(), queue.SimpleQueue()
            self._thread = threading.Thread(target=self._work, name="cc-lhc-store", daemon=True)
            self._thread.start()

    def _work(self):
        while True:
            job = self._todo.get()
            if job is None:
                return
            fn, arg = job
            try:
                fn(arg)
                self._done.put(None)
            except BaseException as e:  # handed back to wait(), on the caller's thread
                self._done.put(e)

    def submit(self, fn, arg) -> None:
        """Start fn(arg); here and now (raising what it raises) when there is no thread."""
        if self._thread is None:
            fn(arg)
            return
        self._busy = True
        self._todo.put((fn, arg))

    def wait(self) -> None:
        """Until the write submitted last is done; raises what it raised."""
        if self._busy:
            self._busy = False
            error = self._done.get()
            if error is not None:
                raise error

    def close(self) -> None:
        """Wait for a write still running (its error is the caller's to have seen), then stop."""
        if self._thread is not None:
            if self._busy:
                self._busy = False
                self._done.get()
            self._todo.put(None)
            self._thread.join()
            self._thread = None


class FileSpan:
    """What one process has verified a transcript file holds: the hash of the span captured
    from it, that span's last bytes, and the offset they end at (None until the first read
    checks them). Claude only appends; a file that no longer holds those bytes is read
    again from its start."""

    # Bytes before the offset compared on every read of a live session; the whole
    # captured span is checked against its stored hash once per process.
    TAIL_CHECK_BYTES = 4096
    READ_BYTES = 4 << 20

    def __init__(self, path):
        self.path = path
        self.prefix = None
        self.tail = b""
        self.offset = None

    def restart(self) -> None:
        import hashlib
        self.prefix, self.tail, self.offset = hashlib.sha256(), b"", 0

    def trust(self, batch) -> None:
        """A batch is committed: what this process knows the file holds moves to its end."""
        keep = self.TAIL_CHECK_BYTES
        self.prefix, self.offset = batch.prefix, batch.end
        self.tail = (self.tail + batch.consumed[-keep:])[-keep:]

    def rewrite_reason(self, f, src, size):
        """None while the file still holds what was captured, else (kind, detail).

        A file that is shorter, or whose bytes before the offset differ (a line deleted
        and another appended in its place), would make reading on from the offset start
        mid-line and skip records.
        """
        offset, start = src["offset"], src["start_offset"]
        if size < offset:
            return ("transcript_shrank", f"{self.path} is {size} bytes, {offset} were already captured")
        if self.offset == offset:
            f.seek(offset - len(self.tail))
            if f.read(len(self.tail)) == self.tail:
                return None
        elif self._prefix_matches(f, start, offset, src["prefix_sha256"]):
            return None
        return ("transcript_rewritten", f"{self.path} no longer holds the bytes captured before "
                                        f"offset {offset}")

    def _prefix_matches(self, f, start, offset, stored) -> bool:
        """Hash the captured span [start, offset) and compare; remember it when it matches.

        A thread written before hashes were kept has none to compare with: the file as
        it is now is taken as what was captured.
        """
        import hashlib
        prefix, tail, keep = hashlib.sha256(), b"", self.TAIL_CHECK_BYTES
        f.seek(start)
        remaining = offset - start
        while remaining > 0:
            chunk = f.read(min(remaining, self.READ_BYTES))
            if not chunk:
                return False
            prefix.update(chunk)
            tail = (tail + chunk[-keep:])[-keep:]
            remaining -= len(chunk)
        if stored is not None and prefix.hexdigest() != stored:
            return False
        self.prefix, self.tail, self.offset = prefix, tail, offset
        return True


class Capture:
    """Reads one session's transcript into its thread: on demand, or live in a thread.

    Only newline-terminated lines are parsed, so a line Claude is still writing is
    waited on. Each batch of records is committed together with the byte offset it
    reached; killed at any point, the next run resumes exactly there. SQLite work
    happens on the capture thread (a long catch-up writes on a store thread of its own,
    see BatchWriter), never on the terminal relay's.
    """

    BATCH_BYTES = 4 << 20
    # How often the files are looked at: often while Claude is writing (a settled seam
    # or a served view is then seen within about FAST_POLL_SECONDS of its record), less
    # once nothing changed for ACTIVE_SECONDS, and least once nothing changed for
    # IDLE_SECONDS (Claude waiting at its prompt: the first line it writes then is read
    # within IDLE_POLL_SECONDS, and the ones after it quickly again). A look is two stat()s.
    POLL_SECONDS = 0.05
    FAST_POLL_SECONDS = 0.01
    ACTIVE_SECONDS = 2.0
    IDLE_SECONDS = 10.0
    IDLE_POLL_SECONDS = 0.25
    def __init__(self, home, thread_id, session_id, path, policy=None, start_offset=0,
                 on_event=None, on_responses=None):
        self.home = home
        self.thread_id = thread_id
        self.session_id = session_id
        self.path = path
        self.policy = policy
        self.start_offset = start_offset
        self.on_event = on_event or (lambda *_: None)
        self.on_responses = on_responses
        self.store = None
        self._thread = None
        self._stop = None
        self.error = None             # why the live reads fail, while they do (since error_since)
        self.error_since = None
        self.lines = 0
        self.lease = None
        self.caught_up = False
        self.cut_short = False  # the last catch-up stopped at its deadline before the file's end
        self.hostdb = None  # opened on the capture thread when live classification needs it
        self.request_handoff = None  # set by an interactive host that can swap children
        self._span = FileSpan(path)   # what this process has verified the transcript holds
        self._agent_spans = {}        # the same for each subagent file, by source key
        self._kept_state = None       # the parser's memory after a read that stored all it parsed
        self._read_bytes = 0          # what the catch-up under way read: transcripts, saved outputs
        self._looked = None           # when _relocated last looked for the transcript elsewhere
        self._legacy_agents = {}      # agent-*.jsonl beside the session -> its entry, or False: not its
        self._legacy_unnamed = {}     # such a file that named no session yet -> its size then
        self._legacy_looked = None    # when _legacy_agent_files last listed that folder
        # Whether a whole record the file ends on without its newline is read too: only for
        # a file no Claude will append to again and whose thread is thrown away (measure);
        # a session's own capture waits for the newline (finish_capture mends the file).
        self.take_unended = False
        self.cut_tail = 0  # with take_unended: bytes the file ends on that are no whole record

    def _open(self, deadline=None):
        if self.store is None:
            self.store = ThreadStore(self.home, self.thread_id)
            if self.store.source(self.session_id) is None:
                self.store.add_source(self.session_id, self.path, self.start_offset,
                                      self._prefix_uuids())
            # A run killed between storing a batch and indexing it left the search index
            # behind, and no new line may ever come to trigger it: catch up here (within a
            # launch's deadline: the live capture's first read takes the rest).
            self.store.index_search(deadline)

    def _prefix_uuids(self):
        """uuids of the replayed prefix cc-lhc wrote: Claude's next records chain onto them."""
        if not self.start_offset:
            return ()
        found = []
        try:
            f = open_regular(self.path)
        except OSError:
            return ()  # nothing to read them from: the offset still skips the prefix
        with f:
            for line, _ in split_complete_lines(f.read(self.start_offset), 0):
                try:
                    uid = json.loads(line).get("uuid")
                except (ValueError, AttributeError, RecursionError):
                    continue
                if uid:
                    found.append(uid)
        return found

    def catch_up(self, index=True, deadline=None) -> int:
        """Read every complete line not yet in the record; returns lines read.

        With a ``deadline`` (time.monotonic) it stops between batches once that has
        passed; ``caught_up`` then says whether the end of the file was reached. The
        session's subagent files are read after it, so their records find the calls
        that started them.
        """
        total = self._catch_up_main(deadline)
        if not self.cut_short:
            # (a main file read only part way may not hold yet the call an agent's later
            # records belong to, a SendMessage that resumed it: they wait for the next read)
            total += self._catch_up_agents()
        if index and total:
            self.store.index_search(deadline)  # (what a deadline leaves, the next one or a search takes)
        if self._read_bytes >= TRIM_AFTER_BYTES:
            # (a large read leaves the heap many times its size, freed once it is stored but
            # kept by the allocator for the rest of the session: given back)
            release_freed_memory()
        self._read_bytes = 0
        return total

    def _catch_up_main(self, deadline) -> int:
        self.caught_up = self.cut_short = False
        self._open(deadline)
        try:
            f = open_regular(self.path)
        except (FileNotFoundError, NotADirectoryError):  # (a folder on its path is a file: none yet either)
            f = self._relocated()
            if f is None:
                self.caught_up = True  # no transcript yet: nothing to catch up with
                return 0
        except OSError as e:
            self._unreadable(str(e))
            return 0
        with f:
            total = self._read_new_lines(f, deadline)
        self.lines += total
        return total

    RELOCATE_EVERY = 1.0  # seconds between looks for a transcript written somewhere else

    def _rewound(self, parent, line) -> None:
        """A prompt at ``line`` chained to ``parent``, not to the newest record (see
        OFF_BRANCH_KEY): the turns this session's file holds between the two are off
        Claude's branch when they hold a prompt of their own (a rewind). Anything else (a
        record chained past a progress record, say) leaves the thread as it is."""
        import mmap
        begin = self.store.source(self.session_id)["start_offset"] or 0  # where its line numbers start
        if parent is None:  # a prompt with no parent: back to before the file's first record
            at = 0 if begin else None  # (in a rebuilt session: into the turns cc-lhc replayed)
        else:
            try:
                with open_regular(self.path) as f:
                    data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError):
                return
            try:
                value, at = b'"' + parent.encode("utf-8", "replace") + b'"', len(data)
                while True:  # the record whose own uuid it is (its children name it as parentUuid)
                    at = data.rfind(value, 0, at)
                    if at < 0 or OWN_UUID_KEY.search(data[max(0, at - 16):at]):
                        break
            finally:
                data.close()
        if at is not None and at < begin:
            if at >= 0:  # back into the turns cc-lhc replayed into this session: said, not handled
                self.home.log("rewound_into_rebuild", thread=self.thread_id, session=self.session_id,
                              line=line)
            return
        try:
            parent_line = 0 if at is None else line_at(self.path, begin, at)
        except OSError:
            return
        store = self.store
        first, last, prompts = store.db.execute(
            "SELECT min(seq), max(seq), sum(kind = 'user_text') FROM messages WHERE source_session = ? "
            "AND agent IS NULL AND line > ? AND line < ?", (self.session_id, parent_line, line)).fetchone()
        if not prompts:
            return
        # Only this session's own records go off: another session's taken in between (the
        # thread moved there and back) is on its own branch, not on this one.
        runs, run = [], None
        for seq, mine in store.db.execute(
                "SELECT seq, source_session = ?1 OR (source_session >= ?1 || '/' AND source_session < ?1 || '0') "
                "FROM messages WHERE seq BETWEEN ?2 AND ?3 ORDER BY seq", (self.session_id, first, last)):
            if mine and run is not None:
                run[1] = seq
            elif mine:
                run = [seq, seq]
                runs.append(run)
            else:
                run = None
        with Tx(store.db) as db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                           [(f"{OFF_BRANCH_KEY}{BRANCH_RUNS}:{a}", str(b)) for a, b in runs])
        self.home.log("off_branch", thread=self.thread_id, session=self.session_id, line=line,
                      off_branch=", ".join(f"m{a}-m{b}" for a, b in runs))

    def _saved_reader(self):
        """read_saved for one pass over the transcript: each folder's real path is resolved
        once in it, not for every output (realpath costs an lstat per part of the path)."""
        real_dirs = {}

        def real_dir(path):
            if path not in real_dirs:
                real_dirs[path] = os.path.realpath(path)
            return real_dirs[path]
        return functools.partial(self._read_saved, real_dir)

    def _read_saved(self, real_dir, path):
        """A saved tool output (SAVED_OUTPUT) as (text, data), or why it cannot be read.
        Only a file in this session's own tool-results folder is read: a transcript cannot
        make capture copy any other file into the thread. real_dir is os.path.realpath."""
        import base64
        folder = os.path.join(os.path.splitext(self.path)[0], SAVED_OUTPUT_FOLDER)
        head, name = os.path.split(path)
        real = os.path.join(real_dir(head), name)
        if name in ("", ".", "..") or os.path.islink(real):
            real = os.path.realpath(path)  # (past its folder, only its own name can lead elsewhere)
        if os.path.dirname(real) != real_dir(folder):
            return f"not in this session's {SAVED_OUTPUT_FOLDER} folder"
        try:
            with open_regular(real) as f:
                raw = f.read(SAVED_OUTPUT_MAX_BYTES + 1)
        except OSError as e:
            return e.strerror or str(e)
        if len(raw) > SAVED_OUTPUT_MAX_BYTES:
            return f"larger than {SAVED_OUTPUT_MAX_BYTES >> 20} MiB"
        self._read_bytes += len(raw)
        data = {"type": SAVED_OUTPUT, "path": path, "bytes": len(raw)}
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", "replace")
            # (its bytes exactly, compressed as the text column is: a large log with one
            # latin-1 byte was kept as base64 of the whole file)
            packed = packed_bytes(raw) if len(raw) >= COMPRESS_MIN_CHARS else None
            if packed is not None:
                data["raw_zlib_base64"] = base64.b64encode(packed).decode("ascii")
            else:
                data["raw_base64"] = base64.b64encode(raw).decode("ascii")
        return text, _dump(data)

    def _relocated(self):
        """The session's transcript opened where Claude really writes it, when that is not
        where cc-lhc expected it (Claude's --worktree runs in a folder of its own, so its
        projects folder has another name): the capture follows it there, and the thread and
        cc-lhc.sqlite name the real path. None while there is none."""
        import time
        now = time.monotonic()
        if self._looked is not None and now - self._looked < self.RELOCATE_EVERY:
            return None
        self._looked = now
        found = transcript_elsewhere(self.path)
        if found is None:
            return None
        try:
            f = open_regular(found)
        except OSError:
            return None
        self.home.log("transcript_elsewhere", thread=self.thread_id, session=self.session_id,
                      expected=self.path, path=found)
        self.path = found
        self._span = FileSpan(found)
        with Tx(self.store.db) as db:
            db.execute("UPDATE sources SET path = ? WHERE session_id = ?", (found, self.session_id))
        hostdb = HostDB(self.home)
        try:
            with Tx(hostdb.db) as db:
                db.execute("UPDATE sessions SET rollout_path = ? WHERE session_id = ?", (found, self.session_id))
        finally:
            hostdb.db.close()
        return f

    def _unreadable(self, why):
        """A transcript that cannot be read (not a regular file, no permission): say so once."""
        src = self.store.source(self.session_id)
        if not src["degraded"]:
            self.store.mark_degraded(self.session_id, "transcript_unreadable", f"{self.path}: {why}")
            self.home.log("transcript_unreadable", thread=self.thread_id, session=self.session_id,
                          path=self.path, reason=why)
        self.caught_up = True  # nothing can be read; the thread says why

    def _read_new_lines(self, f, deadline):
        import time
        store = self.store
        src = store.source(self.session_id)
        size = os.fstat(f.fileno()).st_size
        src = self._check_span(f, self._span, self.session_id, src, size)
        offset = src["offset"]
        if size == offset:
            self.caught_up = True
            return 0
        kept, self._kept_state = self._kept_state, None
        parser = RolloutParser(self.session_id, store.parse_state(self.session_id, kept),
                               segment_soft_bytes(self.policy))
        parser.read_saved = self._saved_reader()
        total = 0
        if deadline is not None and time.monotonic() > deadline:
            self.cut_short = True
            return total
        packer, prefix = Packer(), self._span.prefix.copy()

        def write(batch):
            store.apply(self.session_id, batch.out, batch.end, batch.lines, batch.digest, rows=batch.rows)

        long = size - offset > self.BATCH_BYTES
        if long:  # (none of its commits copies the WAL: see checkpoint_apart)
            store.checkpoint_on_commit(False)
        try:
            batches = self._caught(f, parser, src, packer, prefix)
            total, self.caught_up = self._store_batches(batches, write, self._trust, long, deadline)
            self.cut_short = deadline is not None and not self.caught_up
        finally:
            packer.close()
            if long:
                store.checkpoint_on_commit(True)
                store.checkpoint_apart()
            self._read_bytes += size - offset
        if self.caught_up:  # (cut short, the parser may be a batch ahead of what was stored)
            self._kept_state = parser.s
        return total

    def _caught(self, f, parser, src, packer, prefix):
        """The batches of f's new lines from the source's offset, each with its rows and the
        hash of the file up to its end. A batch's rows are taken from the packer only once
        the next batch is parsed (or the file ended): while the parser holds the GIL the
        packer's worker gets little of it, so without that time it would leave most of
        the batch's compression to this thread."""
        held = None
        for out, consumed, end, n in self._batches(f, parser, src["offset"], src["lines"], packer, prefix):
            if held is not None:
                yield held._replace(rows=stored_rows(held.out.messages, packer))
            held = CaughtBatch(out, consumed, end, n, None, prefix.hexdigest(), prefix.copy())
        if held is not None:
            yield held._replace(rows=stored_rows(held.out.messages, packer))

    def _store_batches(self, batches, write, stored, background: bool, deadline=None):
        """Store each batch with write(batch) (a BatchWriter's, on its thread when
        ``background``) while the next is parsed; once a write is done, stored(batch)
        runs here and the batch's events are reported. Returns (lines stored, whether the
        batches ran out): with a ``deadline``, it stops between batches once that passed.
        """
        import time
        writer = BatchWriter(background)
        total, held, ended = 0, None, False
        try:
            for batch in batches:
                if held is not None:
                    writer.wait()
                    total += self._stored(held, stored)
                writer.submit(write, batch)
                held = batch
                if deadline is not None and time.monotonic() > deadline:
                    break
            else:
                ended = True
            if held is not None:
                writer.wait()
                total += self._stored(held, stored)
        finally:
            writer.close()
        return total, ended

    def _stored(self, batch, stored) -> int:
        if stored is not None:
            stored(batch)
        if self.request_handoff is not None:
            # A live host builds views at its seams: their main-chain texts are counted now
            # (only ever a head start: nothing about it may keep the batch's events back).
            try:
                TOKENS.count_ahead([view_text(m) for m in batch.out.messages
                                    if m.agent is None and m.kind not in ("api_error", SAVED_OUTPUT)])
            except Exception as e:
                TOKENS.ahead_error = e
        self._report(batch.out)
        return batch.lines

    def _trust(self, batch) -> None:
        self._span.trust(batch)

    def _check_span(self, f, span, key, src, size):
        """The source row to read on from: the same, or (when the file no longer holds what
        was captured) one restarted at the file's start, the reason recorded and logged."""
        changed = span.rewrite_reason(f, src, size)
        if not changed:
            return src
        kind, detail = changed
        self.store.restart_source(key, kind, detail)
        self.home.log(kind, thread=self.thread_id, session=key, path=span.path, detail=detail,
                      action="read again from the start; nothing captured is removed")
        span.restart()
        return self.store.source(key)

    def _batches(self, f, parser, offset, line_no, packer, prefix=None):
        """Parse f's complete lines from offset: yield (out, consumed bytes, end, lines) per batch.

        A batch is what one read of BATCH_BYTES holds up to its last newline; the rest
        waits for the next read (a line longer than that is read on until it ends). The
        generator ends at the end of the file; the caller takes the packer's results for
        a batch back before asking for the next, and trusts a batch's offset only once its
        write committed, so a stop anywhere loses nothing. A ``prefix`` hash is brought up
        to each batch's end (on the packer's worker, while the batch is parsed) before the
        batch is yielded.
        """
        f.seek(offset)
        pending = b""
        while True:
            chunk = f.read(self.BATCH_BYTES)
            if not chunk:
                if self.take_unended and pending.strip() and not whole_record(bytes(pending)):
                    self.cut_tail = len(pending)  # (measure names it: cut off, left out)
                elif self.take_unended and pending.strip():
                    # (measure: the whole record a file ends on without its newline counts too)
                    last = bytes(pending)
                    if prefix is not None:
                        packer.later(("prefix", offset), prefix.update, last)
                    parser.feed(last, line_no + 1, offset)
                    for m in parser.out.messages:
                        packer.offer(m)
                    if prefix is not None:
                        packer.wait(("prefix", offset))
                    yield parser.take(), memoryview(last), offset + len(last), 1
                return
            buf = pending + chunk if pending else chunk
            complete = memoryview(buf)[:buf.rfind(b"\n") + 1]
            if prefix is not None and complete:
                packer.later(("prefix", offset), prefix.update, complete)
            end, n, offered = offset, 0, 0
            for line, at in split_complete_lines(buf, offset):
                n += 1
                parser.feed(line, line_no + n, at)
                end = at + len(line) + 1
                made = parser.out.messages
                while offered < len(made):
                    packer.offer(made[offered])
                    offered += 1
            pending = buf[end - offset:]
            if n:
                if prefix is not None:
                    packer.wait(("prefix", offset))
                yield parser.take(), complete, end, n
                line_no, offset = line_no + n, end

    def agent_files(self):
        """(source key, path, agent id, kind) of each subagent transcript of this session.

        Claude Code 2.x writes them beside the session, under <session>/subagents/: an
        agent-<id>.jsonl per subagent and workflows/<run>/.../agent-<id>.jsonl per
        workflow agent. The key names the file relative to the session's folder.
        """
        root = os.path.join(os.path.splitext(self.path)[0], "subagents")
        found = self._legacy_agent_files()
        for folder, dirs, names in os.walk(root):
            dirs.sort()
            for name in sorted(names):
                if not (name.startswith("agent-") and name.endswith(".jsonl")):
                    continue
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, os.path.dirname(root)).replace(os.sep, "/")
                agent_id = name[len("agent-"):-len(".jsonl")]
                parts = rel.split("/")
                kind = ("workflow" if "workflows" in parts else
                        "compaction" if agent_id.startswith("acompact") else "subagent")
                found.append((f"{self.session_id}/{rel}", path, agent_id, kind))
        return found

    LEGACY_AGENT_LINES = 20  # records of a 2.0 agent file looked at to tell whose it is

    def _legacy_agent_files(self):
        """Subagent files as Claude Code 2.0 wrote them: agent-<id>.jsonl beside the
        session's own file, in the projects folder every session of that folder shares,
        so a file is this session's only when its records name the session (legacy_owner).
        What a file said is kept; one that named no session yet is asked again once it
        grew. While the live thread polls, the folder is looked at no more than once a
        second (and at the last catch-up, once stopping); a catch-up of its own looks each
        time."""
        import time
        now = time.monotonic()
        polling = self._stop is not None and not self._stop.is_set()
        if self._legacy_looked is not None and now - self._legacy_looked < self.RELOCATE_EVERY and polling:
            return [entry for entry in self._legacy_agents.values() if entry]
        self._legacy_looked = now
        folder = os.path.dirname(self.path)
        stem = os.path.splitext(os.path.basename(self.path))[0]  # Claude names it by the session
        try:
            names = sorted(n for n in os.listdir(folder) if n.startswith("agent-") and n.endswith(".jsonl"))
        except OSError:
            names = []
        for name in names:
            if self._legacy_agents.get(name) is not None:
                continue
            path = os.path.join(folder, name)
            try:
                size = os.stat(path).st_size
                if self._legacy_unnamed.get(name) == size:
                    continue  # named no session, and nothing was added since
                owner = legacy_owner(path, self.LEGACY_AGENT_LINES)
            except OSError:
                continue
            if owner is None:
                self._legacy_unnamed[name] = size
                continue
            self._legacy_unnamed.pop(name, None)
            mine = owner in (self.session_id, stem)
            agent_id = name[len("agent-"):-len(".jsonl")]
            self._legacy_agents[name] = (f"{self.session_id}/{name}", path, agent_id,
                                         "compaction" if agent_id.startswith("acompact") else "subagent"
                                         ) if mine else False
        return [entry for entry in self._legacy_agents.values() if entry]

    def _catch_up_agents(self) -> int:
        """Read every subagent file's new complete lines into the record; returns lines read."""
        total = 0
        for key, path, agent_id, kind in self.agent_files():
            total += self._catch_up_agent(key, path, agent_id, kind)
        return total

    def _catch_up_agent(self, key, path, agent_id, kind) -> int:
        store = self.store
        src = store.source(key)
        if src is None:
            store.add_source(key, path)
            src = store.source(key)
        try:
            f = open_regular(path)
        except OSError as e:
            self.home.log("transcript_unreadable", thread=self.thread_id, session=key, path=path,
                          reason=str(e))
            return 0
        with f:
            return self._read_agent(f, key, path, agent_id, kind, src)

    def _read_agent(self, f, key, path, agent_id, kind, src) -> int:
        """A subagent file's new lines, checked as the session's own transcript is: one that
        shrank or was rewritten is read again from its start (nothing captured removed)."""
        store = self.store
        size = os.fstat(f.fileno()).st_size
        span = self._agent_spans.get(key)
        if span is None:
            span = self._agent_spans[key] = FileSpan(path)
        src = self._check_span(f, span, key, src, size)
        if size == src["offset"]:
            return 0
        self._read_bytes += size - src["offset"]
        call = self._agent_call(path)
        if call is None and kind == "workflow" and store.linked_call(agent_id) is None:
            parts = key.split("/")  # (its .meta.json names no call: the run's folder does)
            call = store.workflow_call(parts[parts.index("workflows") + 1], self._agent_start(f))
        with Tx(store.db):
            store._note_agents([(agent_id, key, kind, call, None)], utc_now_iso())
        parser = RolloutParser(key, store.agent_parse_state(key, agent_id), segment_soft_bytes(self.policy),
                               agent=agent_id, agent_turn=store.agent_turn(agent_id, lambda: self._agent_start(f)),
                               resumes=store.agent_resumes(agent_id))
        parser.read_saved = self._saved_reader()
        parser.outer_uuids = lambda: {u for (u,) in store.db.execute(
            "SELECT uuid FROM chain WHERE session = ?", (self.session_id,))}
        packer, prefix = Packer(), span.prefix.copy()
        try:
            batches = self._caught(f, parser, src, packer, prefix)
            total, _ended = self._store_batches(
                batches, lambda b: store.apply(key, b.out, b.end, b.lines, b.digest, rows=b.rows), span.trust,
                size - src["offset"] > self.BATCH_BYTES)
        finally:
            packer.close()
        return total

    @staticmethod
    def _agent_start(f):
        """When an agent's file began: its first record's timestamp (None if unreadable)."""
        at = f.tell()
        try:
            f.seek(0)
            rec = json_record(f.readline(1 << 20).rstrip(b"\r\n"))
        except OSError:
            return None
        finally:
            f.seek(at)
        return rec.get("timestamp") if isinstance(rec, dict) else None

    @staticmethod
    def _agent_call(path):
        """The call that started an agent, from the agent-<id>.meta.json beside its file."""
        try:  # (a FIFO or a device in its place is no file: never waited on or read without end)
            meta = json.loads(read_small_file(path[:-len(".jsonl")] + ".meta.json", DESCRIPTOR_FILE_LIMIT))
        except (OSError, ValueError, RecursionError):
            return None
        call = meta.get("toolUseId") if isinstance(meta, dict) else None
        return call if isinstance(call, str) else None

    def _report(self, out: ParseOutput):
        for parent, line in out.branches:
            self._rewound(parent, line)
        for event in out.events:
            self.on_event(event, self)
        answered = (out.usage or any(m.kind == "api_error" for m in out.messages)
                    or out.state.get("turn_end_due") is False
                    or any(c.status == "interrupted" for c in out.turns_closed))
        # Claude answered, the API refused to, or the turn ended (also when the person stopped
        # it: Esc, "No" at a permission prompt, whose records carry no usage)
        if answered and self.on_responses:
            self.on_responses(self)
        for problem in out.problems:
            self.home.log("capture_problem", thread=self.thread_id, session=problem.session,
                          line=problem.line, kind=problem.kind, detail=problem.detail)

    def start(self):
        import threading
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cc-lhc-capture", daemon=True)
        self._thread.start()

    def _watched(self):
        """What changes when Claude writes: the transcript and each subagent file beside it."""
        st = os.stat(self.path)
        key = [(st.st_size, st.st_mtime_ns, st.st_ino)]
        for _key, path, _agent, _kind in self.agent_files():
            try:
                st = os.stat(path)
            except FileNotFoundError:
                continue
            key.append((path, st.st_size, st.st_mtime_ns))
        return key

    def _run(self):
        import time
        last, changed_at = None, time.monotonic()
        while not self._stop.is_set():
            try:
                key = self._watched()
                if key != last:
                    changed_at = time.monotonic()
                    self.catch_up()
                    last = key  # only once read: a failed read is tried again next poll
                    if self.error is not None:
                        self.on_event(("capture_recovered", self.error_since), self)
                    self.error = self.error_since = None
            except (FileNotFoundError, NotADirectoryError):
                pass  # Claude writes the file with the first prompt
            except Exception as e:  # capture must never take the session down
                if self.error is None:
                    self.error_since = utc_now_iso()
                    self.on_event(("capture_failing", str(e)), self)
                self.error = e
                self.home.log("capture_error", thread=self.thread_id, error=repr(e))
                self._stop.wait(1.0)
            self._stop.wait(self.poll_after(time.monotonic() - changed_at))

    @classmethod
    def poll_after(cls, quiet: float) -> float:
        """Seconds to the next look, nothing having changed for ``quiet`` seconds."""
        return (cls.FAST_POLL_SECONDS if quiet < cls.ACTIVE_SECONDS else
                cls.POLL_SECONDS if quiet < cls.IDLE_SECONDS else cls.IDLE_POLL_SECONDS)

    def stop(self) -> int:
        """Stop the live thread and read whatever Claude wrote last."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        try:
            return self.catch_up()
        finally:
            if self.store is not None:
                self.store.close()
                self.store = None


# == 12. Smart Compact: the one mechanism ========================================
#
# Every caller (the one-shot and interactive pre-launch paths, the live handoff, the
# panel's /smart-compact and /smart-prune, `rollout write`) goes through these steps and
# re-implements none of them:
#   assess   the reading, the settled-seam check, the classification and its receipt,
#            turned into a decision with its reason;
#   rebuild  the view, the pending record, the transcript written under bounded retries,
#            the replayed-prefix lineage, the receipt's outcome, with failpoints between;
#   accept   the thread moves to the rebuild once Claude was seen writing to it;
#   abandon  an unused rebuild is moved out of Claude's projects folder.
# What happens to the Claude process around them (nothing yet, a swap, a one-shot launch)
# is the caller's business.

def newest_response_without_usage(db, session_id):
    """(seq, response id) of the session's newest response when Claude recorded no usage
    for it at all (missing or null), else None: the reading then is the last known one."""
    # (+source_session: walked from the newest message back, not sorted out of the session's index)
    newest = db.execute("SELECT seq, response_id FROM messages WHERE +source_session = ? AND agent IS NULL "
                        "AND role = 'assistant' AND response_id IS NOT NULL AND coalesce(model, '') != "
                        "'<synthetic>' ORDER BY seq DESC LIMIT 1", (session_id,)).fetchone()
    if newest is None or db.execute("SELECT 1 FROM usage WHERE response_id = ?", (newest[1],)).fetchone():
        return None
    return newest


def governor_reading(store, session_id, prompt_estimate=0) -> dict:
    """Read the newest provider usage of a session from the record and measure pressure."""
    db = store.db
    # Only this session's responses count: a rebuilt session's context is its view, not
    # the oversized one it replaced, so before its first answer it is "not observed".
    # Claude's own notice of a failed request (model <synthetic>, a usage of zeros) is no
    # provider reading: after a "prompt is too long" it would read a full session as empty.
    rows = db.execute("SELECT input, cache_creation, cache_read, seq, output, response_id FROM usage "
                      "WHERE source_session = ? AND coalesce(model, '') != '<synthetic>' ORDER BY seq DESC",
                      (session_id,)).fetchall()
    latest = rows[0] if rows else None
    last_valid = next((r for r in rows if provider_context(r) is not None), None)
    unread = newest_response_without_usage(db, session_id)
    if unread is not None and (latest is None or unread[0] > latest[3]):
        latest = (None, None, None, unread[0], None, None)  # (its usage missing: no reading, as an unusable one)

    def payload(where, *args):
        # Bytes, as estimate_tokens counts them (length() of text would count characters).
        total = db.execute("SELECT coalesce(sum(length(CAST(coalesce(lhc_text(text), data) AS BLOB))), 0) "
                           f"FROM messages WHERE {where} AND agent IS NULL", args).fetchone()[0]
        return (total + 3) // 4

    def after(row):
        """What the next request holds beyond what ``row``'s response was sent: that
        response itself (its output_tokens when usable, else its own bytes / 4) and
        everything captured after it."""
        if row is None:
            return payload("seq > 0")
        output = row[4] if row[4] is not None or row[5] is None else \
            payload("response_id = ? AND seq <= ?", row[5], row[3])
        return (output or 0) + payload("seq > ?", row[3])

    # Claude's own compaction since the newest response (a /compact, or its reaction to a
    # "prompt is too long") replaced the conversation with its summary: what that response
    # reported no longer is the context, and no later one has said what is. Not observed.
    (compacted,) = db.execute("SELECT max(seq) FROM messages WHERE +source_session = ? AND agent IS NULL "
                              "AND kind = 'compact_summary'", (session_id,)).fetchone()
    if compacted is not None and (latest is None or compacted > latest[3]):
        return {"source": STATE_NOT_OBSERVED, "provider_tokens": None,
                "estimate_tokens": payload("seq >= ?", compacted) + prompt_estimate, "pressure": None}
    return measure_pressure(latest, last_valid, after(latest), after(last_valid), prompt_estimate)


class Receipts:
    """Durable governor receipts (cc_governor_receipts), written behind the decision.

    A receipt records a classification; it never decides one. If the store cannot be
    written the operation goes on with an in-memory id and a loud warning.
    """

    def __init__(self, hostdb, home):
        self.hostdb = hostdb
        self.home = home

    def record(self, thread_id, session_id, c: dict, replay_key: str):
        try:
            with Tx(self.hostdb.db) as db:
                row = db.execute("SELECT id FROM cc_governor_receipts WHERE replay_key = ?",
                                 (replay_key,)).fetchone()
                if row:
                    return row[0]
                cur = db.execute(
                    "INSERT INTO cc_governor_receipts (replay_key, thread_id, session_id, state, source, "
                    "provider_tokens, estimate_tokens, pressure, trigger_tokens, would_mutate, created) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (replay_key, thread_id, session_id, c["state"], c["source"], c["provider_tokens"],
                     c["estimate_tokens"], c["pressure"], c["trigger"], int(c["would_mutate"]),
                     utc_now_iso()))
                return cur.lastrowid
        except Exception as e:  # write-behind: the receipt store must never block the work
            rid = f"memory-{new_session_id()}"
            say(f"warning: governor receipt could not be stored ({e}); using {rid}, "
                "restart recovery is degraded for this attempt")
            self.home.log("receipt_store_unavailable", error=repr(e), receipt=rid)
            return rid

    def classified(self, store, thread_id, session_id, c: dict):
        """Receipt one classification of a session's newest response (idempotent).

        The replay key names the observation (session, newest response, state), so the
        live capture, the exit report and the next launch all land on the same receipt,
        and a deferral recorded earlier is taken up again when Smart Compact runs.
        """
        latest = store.db.execute("SELECT response_id, seq FROM usage WHERE source_session = ? "
                                  "ORDER BY seq DESC LIMIT 1", (session_id,)).fetchone()
        unread = newest_response_without_usage(store.db, session_id)
        if unread is not None and (latest is None or unread[0] > latest[1]):
            latest = (unread[1], unread[0])  # (the newest response, though it told no usage)
        return self.record(thread_id, session_id, c,
                           f"{session_id}:{latest[0] if latest else '-'}:{c['state']}")

    def prior_outcome(self, receipt_id):
        """The outcome an earlier reading of the same observation left on this receipt."""
        if isinstance(receipt_id, str):
            return None
        try:
            row = self.hostdb.db.execute("SELECT outcome FROM cc_governor_receipts WHERE id = ?",
                                         (receipt_id,)).fetchone()
        except Exception:
            return None
        return row[0] if row else None

    def outcome(self, receipt_id, outcome: str):
        if isinstance(receipt_id, str):
            return
        try:
            with Tx(self.hostdb.db) as db:
                db.execute("UPDATE cc_governor_receipts SET outcome = ?, outcome_at = ? WHERE id = ?",
                           (outcome, utc_now_iso(), receipt_id))
        except Exception as e:
            self.home.log("receipt_outcome_lost", receipt=receipt_id, outcome=outcome, error=repr(e))


STOP_HOOKS_KEY = "stop_hooks_configured"  # in the thread's meta: "1" when settings name any


def managed_settings_file() -> str:
    """Where an administrator's settings for Claude Code live on this system."""
    if sys.platform == "darwin":
        return "/Library/Application Support/ClaudeCode/managed-settings.json"
    if sys.platform == "win32":
        return os.path.join(os.environ.get("ProgramData") or r"C:\ProgramData", "ClaudeCode",
                            "managed-settings.json")
    return "/etc/claude-code/managed-settings.json"


def _read_json_object(source, limit=1 << 20):
    """The JSON object in a file (or, starting with "{", the text itself); None when it is
    missing, unreadable or not an object."""
    try:
        if source.lstrip().startswith("{"):
            value = json.loads(source)
        else:
            with open_regular(source) as f:
                value = json.loads(f.read(limit).decode("utf-8", "replace"))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _names_stop_hook(hooks) -> bool:
    return isinstance(hooks, dict) and bool(hooks.get("Stop"))


def _plugin_runs_stop_hooks(root) -> bool:
    """Whether the plugin in folder ``root`` declares a Stop hook: in hooks/hooks.json, or
    in its manifest's "hooks" (an object, or a path or list of paths within the plugin)."""
    files = [os.path.join(root, "hooks", "hooks.json")]
    manifest = _read_json_object(os.path.join(root, ".claude-plugin", "plugin.json")) or {}
    declared = manifest.get("hooks")
    if isinstance(declared, dict):
        if _names_stop_hook(declared.get("hooks", declared)):
            return True
    else:
        for name in declared if isinstance(declared, list) else [declared]:
            if isinstance(name, str) and name:
                files.append(os.path.join(root, name))
    for path in files:
        found = _read_json_object(path) or {}
        if _names_stop_hook(found.get("hooks")):
            return True
    return False


def stop_hooks_configured(spec) -> bool:
    """Whether this Claude runs a Stop hook as far as its settings say: the user's
    settings.json, the folder's .claude/settings(.local).json, --settings (a file or JSON)
    and the administrator's managed settings; and the plugins it loads (--plugin-dir,
    CLAUDE_CODE_PLUGIN_DIRS, and those enabledPlugins turns on among the installed ones). A thread that wrote
    stop_hook_summary is known to run them anyway (_stop_hooks_running)."""
    sources = [os.path.join(claude_config_dir(), "settings.json"),
               os.path.join(spec.cwd, ".claude", "settings.json"),
               os.path.join(spec.cwd, ".claude", "settings.local.json")]
    plugin_dirs = []
    args = spec.claude_args
    for i, a in enumerate(args):
        for option, into in (("--settings", sources), ("--plugin-dir", plugin_dirs)):
            if a == option and i + 1 < len(args):
                into.append(args[i + 1])
            elif a.startswith(option + "="):
                into.append(a.split("=", 1)[1])
    # (and the folders Claude loads as plugins from its environment)
    plugin_dirs += [d for d in os.environ.get("CLAUDE_CODE_PLUGIN_DIRS", "").split(os.pathsep) if d.strip()]
    sources.append(managed_settings_file())
    enabled = {}
    for settings in map(_read_json_object, sources):
        if settings is None:
            continue
        if _names_stop_hook(settings.get("hooks")):
            return True
        if isinstance(settings.get("enabledPlugins"), dict):
            enabled.update(settings["enabledPlugins"])  # later sources take precedence
    if any(_plugin_runs_stop_hooks(os.path.join(spec.cwd, d)) for d in plugin_dirs):
        return True
    wanted = [name for name, on in enabled.items() if on is True]
    if not wanted:
        return False
    installed = _read_json_object(os.path.join(claude_config_dir(), "plugins", "installed_plugins.json"),
                                  limit=8 << 20) or {}
    plugins = installed.get("plugins") if isinstance(installed.get("plugins"), dict) else {}
    for name in wanted:
        entries = plugins.get(name)
        for entry in entries if isinstance(entries, list) else [entries]:
            path = entry.get("installPath") if isinstance(entry, dict) else None
            if isinstance(path, str) and path and _plugin_runs_stop_hooks(path):
                return True
    return False


def note_stop_hooks(home, thread_id, spec) -> None:
    """Tell the thread whether this launch's settings run Stop hooks (_stop_hooks_running)."""
    try:
        store = ThreadStore(home, thread_id)
    except (LhcError, OSError):
        return
    try:
        _set_meta(store, STOP_HOOKS_KEY, "1" if stop_hooks_configured(spec) else "0")
    finally:
        store.close()


def _stop_hooks_running(store, session_id) -> bool:
    """Whether the newest turn ended on Claude's final answer with the thread's Stop hooks
    yet to report (ParseState.turn_end_due): a hook may still send Claude back to work,
    and a swap now would end it with the hook's demand unheard. The thread runs Stop hooks
    when this launch's settings name one (STOP_HOOKS_KEY) or a session of it (not a subagent's
    file, whose SubagentStop hooks write the same report) ever wrote their report."""
    due = store.db.execute("SELECT value FROM meta WHERE key = ?", (TURN_END_KEY + (session_id or ""),)).fetchone()
    return due == ("1",) and (_meta(store, STOP_HOOKS_KEY) == "1" or store.db.execute(
        "SELECT 1 FROM telemetry WHERE type = ? AND count > 0 AND instr(session, '/') = 0 LIMIT 1",
        (STOP_HOOK_SUMMARY,)).fetchone() is not None)


def unsettled_reason(store, idle=False) -> str:
    """'' when the record ends at a settled seam, else why not.

    ``idle`` says no Claude is writing the transcript (before a launch). Then a turn still
    open whose newest response asked for no tool is over: versions that wrote stop_reason
    null and no end-of-turn record (1.0.x) leave their last turn looking like that.
    """
    row = store.db.execute("SELECT n, status, source_session, stop_reason FROM turns "
                           "ORDER BY n DESC LIMIT 1").fetchone()
    if row and row[3] == COMPACTED_MID_TURN and not idle:
        return (f"Claude compacted the conversation in the middle of t{row[0] - 1} and goes on "
                "with that turn's work")
    if row and row[1] != "open" and not idle and _stop_hooks_running(store, row[2]):
        return f"Claude's Stop hooks have not reported the end of t{row[0]} yet"
    if not row or row[1] != "open":
        # A tool call left unanswered inside a closed turn (an interrupt) is no reason to
        # wait: Claude drops it on resume and the view pairs calls with results.
        return ""
    outstanding = store.db.execute(
        "SELECT count(*) FROM messages c WHERE c.turn = ? AND c.kind = 'tool_call' AND c.agent IS NULL "
        "AND NOT EXISTS (SELECT 1 FROM messages r WHERE r.kind = 'tool_result' "
        "AND r.tool_use_id = c.tool_use_id)", (row[0],)).fetchone()[0]
    if outstanding:
        return (f"the transcript was left mid-turn: t{row[0]} has {outstanding} tool call(s) "
                "still waiting for results")
    if idle:
        last = store.db.execute("SELECT role, kind FROM messages WHERE turn = ? AND agent IS NULL "
                                "ORDER BY seq DESC LIMIT 1", (row[0],)).fetchone()
        if last and last[0] == "assistant" and last[1] != "tool_call":
            return ""
        # A -p --json-schema run ends once the response whose StructuredOutput call succeeded
        # has every call answered (no record of its own says so: the next prompt closes it).
        if store.db.execute(
                "SELECT 1 FROM messages r JOIN messages c ON c.tool_use_id = r.tool_use_id AND c.kind = 'tool_call' "
                f"AND c.tool_name IN ({','.join('?' * len(RUN_ENDING_TOOLS))}) WHERE r.turn = ? "
                "AND r.kind = 'tool_result' AND r.agent IS NULL AND coalesce(r.is_error, 0) = 0 LIMIT 1",
                (*sorted(RUN_ENDING_TOOLS), row[0])).fetchone():
            return ""
    return f"the transcript was left mid-turn (t{row[0]} is still open)"


TERMINAL_TASK_STATUS = re.compile(r"<status>(completed|failed|killed|stopped)</status>")
BACKGROUND_TOOLS = ("Bash", "Agent", "Task", "Monitor", "Workflow", "ScheduleWakeup", "SendMessage")
# What Claude Code 2.1.328 writes in the tool result that says background work started
# (tests/fixtures/background/). The ids close the item again: a notification names them.
SHELL_LAUNCHED = re.compile(r"running in background with ID: (\w+)")
# A foreground Bash call Claude Code moved to the background itself (its timeout ran out,
# ctrl-b, or a message arrived while it ran): its result starts with one of these.
SHELL_MOVED = re.compile(r"Command (?:was manually backgrounded by user with ID: (\w+)"
                         r"|(?:was|did not complete within its \d+s timeout and was) moved to the "
                         r"background \(ID: (\w+)\))")
OUTPUT_FILE = re.compile(r"(?:written to|output_file):? (\S+?\.output)\b")
AGENT_LAUNCHED = re.compile(r"agentId: (\w+)")
MONITOR_LAUNCHED = re.compile(r"Monitor started \(task (\w+)")
WORKFLOW_SCRIPT = re.compile(r"^Script file: (\S+)$", re.M)
# The run id on its own line, else the run folder in the transcript dir's path: never just
# the first "wf_" anywhere (a description or a config path can hold one).
WORKFLOW_RUN = re.compile(r"^Run ID: (wf_[A-Za-z0-9_-]+)$|/subagents/workflows/(wf_[A-Za-z0-9_-]+)$",
                          re.M)  # e.g. wf_9169026d-0ab


def workflow_runs(ack) -> list:
    """The workflow runs a Workflow call's acknowledgement names (WORKFLOW_RUN), in order."""
    return [m.group(1) or m.group(2) for m in WORKFLOW_RUN.finditer(ack or "")]


TASK_STOP_TOOLS = ("TaskStop", "KillShell", "KillBash")
TASK_EVENT = re.compile(r"<event>(.*?)</event>", re.S)
TASK_ID = re.compile(r"<task-id>([^<]*)</task-id>")
TASK_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.S)


def after_seam_note(store, seam_turn, session) -> str:
    """What reached a swapped-out Claude after the seam its replacement was rebuilt at, as a
    note for the replacement ('' when there is nothing it would not learn otherwise).

    Input typed then was dropped, so only background work speaks in that window: a shell
    job's or an agent's end, a due wake-up or a workflow are told again by BackgroundCarry,
    but a monitor event reached that Claude alone (the relaunched command starts afresh),
    and whatever it began doing about any of them (the tools it called) is unknown to the
    replacement. Both are in the thread; this says where.
    """
    events, acted = [], []
    for (n,) in store.db.execute("SELECT n FROM turns WHERE n > ? AND source_session = ? ORDER BY n",
                                 (seam_turn or 0, session)).fetchall():
        calls = []
        for kind, text, tool in store.db.execute(
                "SELECT kind, text, tool_name FROM messages WHERE turn = ? AND agent IS NULL "
                "ORDER BY seq", (n,)):
            if kind in ("user_text", "user_meta") and "<task-notification>" in (text or ""):
                task = TASK_ID.search(text)
                summary = TASK_SUMMARY.search(text)
                for event in TASK_EVENT.findall(text):
                    what = f"monitor {task.group(1) if task else '(unnamed)'}"
                    if summary and ":" in summary.group(1):  # Monitor event: "<description>"
                        what += f" ({summary.group(1).split(':', 1)[1].strip().strip(chr(34))})"
                    events.append(f"{what} reported {event.strip()}")
            elif kind == "tool_call" and tool:
                calls.append(tool)
        if calls:
            acted.append(f"t{n} (it called {', '.join(dict.fromkeys(calls))})")
    said = []
    if events:
        said.append("These monitor events reached only the previous Claude process, just before "
                    "cc-lhc replaced it for Smart Compact: " + "; ".join(events) + ".")
    if acted:
        said.append("The previous Claude process had begun acting on what reached it then and was "
                    "stopped part-way: " + "; ".join(acted) + ". Read it back with cc-lhc get-turns "
                    "before you go on.")
    return "[runtime note] " + " ".join(said) if said else ""


class BackgroundItem:
    """One piece of background work a Claude process started and has not finished."""

    def __init__(self, kind, tool_name, seq, tool_use_id, args, task_id="", output_file="",
                 run_id="", script=""):
        self.kind = kind                # shell, monitor, workflow, wakeup, agent
        self.tool_name = tool_name
        self.seq = seq                  # the launch call's message
        self.tool_use_id = tool_use_id
        self.args = args
        self.task_id = task_id
        self.output_file = output_file
        self.run_id = run_id            # a workflow's run, which Workflow{resumeFromRunId} continues
        self.script = script            # a workflow's script as Claude saved it (Workflow{scriptPath})
        self.thread = None              # the thread it was started in, when not the session's (a /clear since)

    def __repr__(self) -> str:
        return f"BackgroundItem({self.kind} {self.label} {self.task_id})"

    @property
    def label(self) -> str:
        return f"{self.tool_name} m{self.seq}"

    @property
    def command(self) -> str:
        return str(self.args.get("command") or self.args.get("description") or "")


def _launched(name, args, ack):
    """The item a launch acknowledgement opens, or None when the call started nothing."""
    if name == "Bash":
        m = SHELL_LAUNCHED.search(ack) if args.get("run_in_background") else None
        moved = None if m else SHELL_MOVED.match(ack.lstrip())
        if not (m or moved):
            return None
        kind, task_id = "shell", m.group(1) if m else moved.group(1) or moved.group(2)
    elif name in ("Agent", "Task"):
        m = AGENT_LAUNCHED.search(ack)
        # The acknowledgement says what Claude did: it may run an agent in the background even
        # when the call asked for the foreground (run_in_background false).
        if "Async agent launched" not in ack and (args.get("run_in_background") is False or not m):
            return None  # a foreground agent's result is its answer: nothing runs on
        kind, task_id = "agent", m.group(1) if m else ""
    elif name == "SendMessage":
        # A message to an agent that had stopped runs it again, in the background, until a
        # notification says it ended: {"success":true,"message":"Resuming agent …",
        # "resumedAgentId": id} (or revivedAgentId). One to an agent still running is queued.
        answer = _json_object(ack)
        task_id = answer.get("resumedAgentId") or answer.get("revivedAgentId")
        if answer.get("success") is not True or not isinstance(task_id, str) or not task_id:
            return None
        kind = "agent"
    elif name == "ScheduleWakeup":
        if args.get("stop"):
            return None
        kind, task_id = "wakeup", ""
    elif name == "Monitor":
        # Its acknowledgement names the task but no output file: Claude reads the command's
        # stdout through a socket and writes the events into the task's file itself.
        m = MONITOR_LAUNCHED.search(ack)
        kind, task_id = "monitor", m.group(1) if m else ""
    else:
        kind, task_id = name.lower(), ""
    out = OUTPUT_FILE.search(ack)
    runs = workflow_runs(ack) if kind == "workflow" else []
    run = runs[0] if runs else ""
    script = WORKFLOW_SCRIPT.search(ack) if kind == "workflow" else None
    return dict(kind=kind, task_id=task_id, output_file=out.group(1) if out else "",
                run_id=run, script=script.group(1) if script else "")


def _closed(item, seq, notes, stops, metas) -> bool:
    """Whether terminal evidence for this very item came after its launch."""
    if item.kind == "wakeup":
        # Only its own firing: a meta record holding the prompt it scheduled. /clear and
        # other slash commands write meta records too; they close nothing.
        prompt = str(item.args.get("prompt") or "").strip()
        return bool(prompt) and any(m > seq and text.strip() == prompt for m, text in metas)
    ids = [f"<tool-use-id>{item.tool_use_id}</tool-use-id>"]
    if item.task_id:
        ids.append(f"<task-id>{item.task_id}</task-id>")
    if any(n > seq and TERMINAL_TASK_STATUS.search(note) and any(i in note for i in ids)
           for n, note in notes):
        return True
    return bool(item.task_id) and any(s > seq and item.task_id == target for s, target in stops)


# An item a swap carried is cc-lhc's from then on (BackgroundCarry): the Claude that
# started it is gone, so no evidence of its end will ever be written by Claude. Its
# tool_use_id is kept in the thread's meta under this prefix, and it is open no more.
CARRIED_PREFIX = "background_carried:"


def background_items(store) -> list:
    """The background items open in a thread's main conversation, oldest first.

    A launch acknowledgement (the tool result saying the work started, not the call)
    opens an item; only terminal evidence for that item closes it: a <task-notification>
    with a terminal status naming its tool call or task id, an explicit TaskStop of its
    id that succeeded, for a ScheduleWakeup its own firing, or a swap having carried it.
    """
    db = store.db
    marks = ",".join("?" * len(BACKGROUND_TOOLS))
    launches = db.execute(
        "SELECT c.seq, c.tool_name, c.tool_use_id, c.text, lhc_text(r.text) FROM messages c "
        "JOIN messages r ON r.kind = 'tool_result' AND r.tool_use_id = c.tool_use_id "
        "AND coalesce(r.is_error, 0) = 0 AND r.agent IS NULL "
        f"WHERE c.kind = 'tool_call' AND c.agent IS NULL AND c.tool_name IN ({marks}) "
        "ORDER BY c.seq", BACKGROUND_TOOLS).fetchall()
    if not launches:
        return []
    notes, stops, metas = end_evidence(store)
    carried = {key[len(CARRIED_PREFIX):] for (key,) in db.execute(
        "SELECT key FROM meta WHERE key LIKE ?", (CARRIED_PREFIX + "%",))}
    items = []
    for seq, name, tool_use_id, text, ack in launches:
        if tool_use_id in carried:
            continue
        args = _json_object(text)
        opened = _launched(name, args, ack or "")
        if opened is None:
            continue
        item = BackgroundItem(tool_name=name, seq=seq, tool_use_id=tool_use_id, args=args, **opened)
        if not _closed(item, seq, notes, stops, metas):
            items.append(item)
    return items


def end_evidence(store) -> tuple:
    """What in a thread's main conversation can tell background work ended (see _closed):
    (seq, text) of its task notifications, (seq, id) of the TaskStops that succeeded,
    (seq, text) of its meta records."""
    db = store.db
    notes = db.execute("SELECT seq, text FROM messages WHERE kind IN ('user_text', 'user_meta') "
                       "AND agent IS NULL AND text LIKE '%<task-notification>%'").fetchall()
    metas = db.execute("SELECT seq, text FROM messages WHERE kind = 'user_meta' "
                       "AND agent IS NULL").fetchall()
    stops = []
    for seq, text in db.execute(
            "SELECT c.seq, c.text FROM messages c JOIN messages r ON r.kind = 'tool_result' "
            "AND r.tool_use_id = c.tool_use_id AND coalesce(r.is_error, 0) = 0 "
            f"WHERE c.kind = 'tool_call' AND c.agent IS NULL AND c.tool_name IN "
            f"({','.join('?' * len(TASK_STOP_TOOLS))})", TASK_STOP_TOOLS):
        args = _json_object(text)
        target = args.get("task_id") or args.get("shell_id") or args.get("id")
        if target:
            stops.append((seq, str(target)))
    return notes, stops, metas


def close_orphaned_background(home, store) -> list:
    """Before a launch starts its Claude, background work the thread still holds as open
    was started by a Claude process that is gone (it exited, or was killed before it wrote
    how the work ended): none of it is this launch's to carry at a later swap. Claude's own
    resume of that session says such tasks stopped; a session rebuilt from the thread
    holds none of what it reads that from, so a rebuild says it (orphan_lines). Returns
    the items."""
    items = background_items(store)
    if not items:
        return []
    with Tx(store.db) as db:
        db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                       [(CARRIED_PREFIX + i.tool_use_id, f"{i.kind}: ended with the Claude process that "
                         "started it") for i in items])
    home.log("background_orphaned", items=[i.label for i in items])
    return items


def orphan_lines(items) -> list:
    """What a rebuilt session says of background work that ended with the Claude process
    that started it (close_orphaned_background), as Claude's own resume would."""
    lines = []
    for item in items:
        name = item.task_id or item.label
        what = f" ({item.command})" if item.command else ""
        ended = "ended with the Claude process that started it, before it finished"
        if item.kind == "agent":
            lines.append(f"background agent {name}{what} {ended}; its transcript is kept, so "
                         f"SendMessage with to: '{name}' resumes it")
        elif item.kind == "shell":
            lines.append(f"background command {name}{what} {ended}"
                         + (f"; its output so far is in {item.output_file}" if item.output_file else ""))
        elif item.kind == "wakeup":
            lines.append(f"a wake-up you scheduled ({item.args.get('reason') or 'no reason given'}) was "
                         "still pending when the Claude process that scheduled it ended; it will not fire")
        else:
            lines.append(f"{item.kind} {name}{what} {ended}; start it again if it is still needed")
    return lines


def _json_object(text) -> dict:
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def open_background_work(store) -> list:
    """The open background items as labels ("Bash m12"), as receipts and logs name them."""
    return [item.label for item in background_items(store)]


def uncarriable(item, posix: bool = True) -> str:
    """Why a swap could not carry this item into the replacement ('' when it can).

    Shell jobs are processes that outlive the old child only when it is SIGKILLed (POSIX),
    and the wrapper must know the output file to watch. A monitor's command dies with the
    old child (its stdout is a socket to it), so cc-lhc relaunches its command (one that
    then fails to start is recorded as failed); a WebSocket monitor it cannot reopen.
    Workflows and wake-ups continue from the manifest, agents are reported (see
    BackgroundCarry).
    """
    if item.kind == "shell":
        if not posix:
            return f"{item.label}: its process would not outlive the old Claude on this platform"
        if not item.output_file:
            return f"{item.label}: its launch acknowledgement names no output file to watch"
    if item.kind == "monitor" and not item.args.get("command"):
        return f"{item.label}: it watches a WebSocket (no command), which cc-lhc cannot reopen"
    return ""


class PendingRebuild:
    """A rebuilt session written but not yet accepted by Claude."""

    def __init__(self, session_id, from_session, path, prefix, receipt=None, descriptor=None,
                 in_process=False):
        self.session_id = session_id
        self.from_session = from_session
        self.path = path
        self.prefix = prefix            # bytes cc-lhc wrote; Claude accepting it writes past them
        self.receipt = receipt          # the governor receipt this rebuild answers
        self.descriptor = descriptor
        self.in_process = in_process    # served through the mod's hook: same process, same session


class Assessment:
    """What `assess` found: the classification, its receipt, and whether to go on."""

    def __init__(self, c, receipt, receipts, unsettled, reason):
        self.c, self.receipt, self.receipts = c, receipt, receipts
        self.unsettled = unsettled  # '' at a settled seam
        self.reason = reason        # '' when Smart Compact should run now

    @property
    def go(self) -> bool:
        return not self.reason

    def outcome(self, text: str) -> None:
        """Attach an outcome to this assessment's own receipt, never to another."""
        self.receipts.outcome(self.receipt, text)


def _already_rebuilt(home, prior) -> str:
    """The rebuild an earlier reading of this observation made, if it still stands."""
    m = re.match(r"^(?:scheduled|rebuilt):(\S+)", prior or "")
    if not m:
        return ""
    row = Registry(home).db.execute("SELECT status FROM rebuilds WHERE session_id = ?",
                              (m.group(1),)).fetchone()
    return m.group(1) if row and row[0] in ("pending", "inprocess", "accepted") else ""


def current_classification(store, session_id, policy, prompt_estimate=0, idle=False, prune=False):
    """The governor's classification of a session now, and why its seam is unsettled ('').

    ``prune`` classifies against Smart Prune's threshold instead of Smart Compact's trigger.
    """
    reading = governor_reading(store, session_id, prompt_estimate)
    unsettled = unsettled_reason(store, idle)
    trigger = policy["pruneThresholdTokens"] if prune else policy["upperBoundTokens"]
    return classify(reading, trigger, not unsettled), unsettled


def automatic_prune_due(policy, c: dict) -> bool:
    """Whether automatic Smart Prune may be assessed after a Smart Compact reading ``c``.

    Off unless pruneEnabled. Over the Smart Compact trigger Smart Compact wins (it is what
    runs, or waits for the seam), so prune is only ever the operation below the trigger.
    """
    return bool(policy["pruneEnabled"]) and c["pressure"] is not None and c["pressure"] < c["trigger"]


UNSETTLED = "not at a settled seam"  # how an assessment that waits for its seam begins its reason


def assess(home, hostdb, store, thread_id, session_id, policy, *, prompt_estimate=0,
           manual=False, swap=False, idle=False, prune=False, gone=False) -> Assessment:
    """Read the pressure of a session, check its seam, classify and receipt it.

    ``manual`` (the panel) runs below the trigger too, but never off a settled seam;
    ``swap`` means the Claude process would be replaced, so background work it owns and
    that cannot be carried makes the seam skip. ``idle``: no Claude is writing the
    transcript now (before a launch), see unsettled_reason. ``prune``: the operation is
    Smart Prune, judged against pruneThresholdTokens. ``gone``: Claude cannot go on with the
    session as it is (its transcript no longer exists, or the mod compacted it in process),
    so its conversation is written again from the thread, settled or not (a turn left open
    is in the view as far as it went).
    """
    c, unsettled = current_classification(store, session_id, policy, prompt_estimate, idle, prune)
    if gone:
        manual, unsettled = True, ""
    receipts = Receipts(hostdb, home)
    receipt = receipts.classified(store, thread_id, session_id, c)
    a = Assessment(c, receipt, receipts, unsettled, "")
    if unsettled and (manual or c["state"] == STATE_OVER_OPEN):
        a.reason = f"{UNSETTLED} ({unsettled})"
        a.outcome("deferred: waits for a settled seam")
        return a
    if not manual and not c["would_mutate"]:
        a.reason = "under the trigger" if c["pressure"] is not None else "no provider reading yet"
        a.outcome("no_action")
        return a
    prior = receipts.prior_outcome(receipt)
    done = _already_rebuilt(home, prior)
    if done:
        # A reading scheduled before a restart is not run twice: its rebuild still stands.
        a.reason = f"this reading was already rebuilt as session {done}"
        return a
    if swap:
        # Work a swap can carry goes with it (BackgroundCarry); anything it could not is
        # never killed: keep the current session and decide again at the next seam.
        stuck = [why for why in (uncarriable(i, os.name == "posix") for i in background_items(store))
                 if why]
        if stuck:
            a.reason = "background work that cannot be carried is open: " + "; ".join(stuck)
            a.outcome("skipped: background work open: " + "; ".join(stuck))
            home.log("handoff_skipped", reason="background work open", items=stuck)
    return a


REBUILD_WRITE_ATTEMPTS = 3


def write_rebuild(path: str, data: bytes) -> None:
    """Write a rebuilt transcript, retrying a few times over a transient failure.

    The bytes are the installed view, computed once; only the write is repeated. A file
    already at the path is never overwritten (write_atomic refuses it).
    """
    import time
    for attempt in range(1, REBUILD_WRITE_ATTEMPTS + 1):
        try:
            write_atomic(path, data)
            return
        except LhcError:
            raise
        except OSError:
            if attempt == REBUILD_WRITE_ATTEMPTS:
                raise
            time.sleep(0.05 * attempt)


def rebuild(home, hostdb, store, thread_id, from_session, policy, cwd, *, envelope_from=None,
            assessment=None, session_id=None, projects_root=None, pending=True,
            plan_view=None, native=False, in_process=None, instructions="", manifest=(),
            idle=False, gone=False, recorded=True) -> PendingRebuild:
    """Build the view, record it as pending, write it, and record its lineage.

    ``pending=False`` is `rollout write`: the caller makes the session current at once
    (still recorded as a pending rebuild until then, unless not ``recorded``: a fork's
    session, whose thread fork_thread records, and rolls back, itself).
    ``plan_view`` replaces the Smart Compact view (Smart Prune passes its own).
    ``native``: the view names the cc-lhc mod's tools. ``in_process`` (the live session's
    descriptor) serves the view through the mod's session.compact hook instead: see
    rebuild_in_process; ``instructions`` are the person's words after their /compact.
    ``manifest``: the background work a swap carries, written into the session.
    ``idle``: no Claude is writing the transcript; ``gone``: nor will any (plan_rebuild).
    """
    if in_process is not None:
        return rebuild_in_process(home, store, thread_id, from_session, policy, cwd, in_process,
                                  assessment=assessment, plan_view=plan_view, envelope_from=envelope_from,
                                  instructions=instructions)
    new_sid = session_id or new_session_id()
    plan = (plan_view or plan_rebuild)(home, store, thread_id, policy, new_sid, cwd,
                                       projects_root=projects_root, envelope_from=envelope_from,
                                       manifest=manifest, idle=idle, gone=gone)
    if plan.boundary:
        # The thread's boundary moves to this one only once the session is accepted.
        note_built_boundary(store, new_sid, plan.boundary)
    if not pending:
        if plan.view.empty:
            raise usage_error(f"thread {thread_id} has nothing to put in a view yet")
        if os.path.exists(plan.path):
            raise usage_error(f"{plan.path} already exists")
    registry = Registry(home)
    # (`rollout write` too: a session file it leaves behind, killed before the thread was
    # moved onto it, is one the next launch of the thread rolls back like any other)
    if recorded:
        record_pending(registry, thread_id, from_session, plan, cwd,
                       what="Smart Compact" if pending else "rollout write")
    if assessment is not None:
        assessment.outcome(f"scheduled:{new_sid}")
    failpoint("after-pending-record")
    try:
        write_rebuild(plan.path, plan.data)
    except (OSError, LhcError) as e:
        if recorded:
            abandon(home, registry, new_sid, f"its transcript could not be written: {e}")
        if assessment is not None:
            assessment.outcome(f"failed: write: {e}")
        raise LhcError(f"the rebuilt session could not be written: {e}")
    record_lineage(hostdb, new_sid, thread_id, plan.path, cwd, plan.data)
    # (the sessions up to the one rebuilt from: those after it are another branch, a fork
    # of an earlier session say, whose agents' later work this branch never saw)
    sources = store.db.execute("SELECT session_id, path FROM sources ORDER BY first_seen, rowid").fetchall()
    upto = next((i for i, (sid, _path) in enumerate(sources) if sid == from_session), len(sources) - 1)
    carry_subagents(home, [path for _sid, path in sources[:upto + 1]], plan.path)
    if pending:
        failpoint("after-rollout-write")
        if assessment is not None:
            assessment.outcome(f"rebuilt:{new_sid}")
    else:
        advance_boundary(store, new_sid)
    home.log("smart_compact_rebuilt" if pending else "rollout_written", thread=thread_id,
             old_session=from_session, new_session=new_sid, path=plan.path, bytes=len(plan.data),
             bands={b: len(plan.view.turns_in(b)) for b in BANDS + ("omitted",)},
             boundary=plan.boundary, prune=plan_view is not None, thinking=plan.arm)
    return PendingRebuild(new_sid, from_session, plan.path, len(plan.data),
                          assessment.receipt if assessment is not None else None)


def carry_subagents(home, sources, new_path: str) -> int:
    """Copy the subagents' transcripts (agent-<id>.jsonl and .meta.json) of the thread's
    sessions (``sources``, their transcripts' paths, oldest first) into the folder of the
    session written at ``new_path``: SendMessage resumes an agent from its transcript in
    the session Claude runs, and Claude's resume tells of a background agent that did not
    finish only when it finds that agent's transcript there; in a rebuilt session neither
    worked. A newer session's copy of an agent is the one taken (an agent resumed there
    wrote more), and a copy already there is brought up to date only while it is still a
    start of the source (the replacement Claude has not written to it). Claude's own
    compaction agents are left out. Returns how many files were copied; one that cannot be
    is logged and skipped (that agent alone cannot be resumed)."""
    import shutil
    picked = {}
    for source in sources:
        if not source or not source.endswith(".jsonl") or os.path.abspath(source) == os.path.abspath(new_path):
            continue
        folder = os.path.join(source[:-len(".jsonl")], "subagents")
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if (name.startswith("agent-") and not name.startswith("agent-acompact-")
                    and name.endswith((".jsonl", ".meta.json"))):
                picked[name] = os.path.join(folder, name)
    target = os.path.join(new_path[:-len(".jsonl")], "subagents")
    copied = 0
    for name, source in sorted(picked.items()):
        dest = os.path.join(target, name)
        try:
            if not _copy_brings_up_to_date(source, dest, appended=name.endswith(".jsonl")):
                continue
            os.makedirs(target, exist_ok=True)
            tmp = f"{dest}.{os.getpid()}.tmp"
            shutil.copyfile(source, tmp)
            os.replace(tmp, dest)
            copied += 1
        except OSError as e:
            home.log("agent_transcript_not_carried", file=source, error=repr(e))
    if copied:
        home.log("agent_transcripts_carried", files=copied, to=target)
    return copied


def _copy_brings_up_to_date(source: str, dest: str, appended: bool) -> bool:
    """Whether copying ``source`` over ``dest`` adds to it and takes nothing away: there is
    no ``dest`` yet, or (a file Claude appends to) it is a shorter start of ``source``."""
    try:
        had = os.path.getsize(dest)
    except FileNotFoundError:
        return True
    if not appended or had >= os.path.getsize(source):
        return False
    with open(source, "rb") as a, open(dest, "rb") as b:
        while had > 0:
            size = min(had, 1 << 20)
            if a.read(size) != b.read(size):
                return False
            had -= size
    return True


def record_pending(registry, thread_id, from_session, plan, cwd, what="Smart Compact"):
    """Record the rebuild as not yet accepted, before its transcript exists; ``what`` made
    it (said if it is rolled back)."""
    now = utc_now_iso()
    with Tx(registry.db) as db:
        db.execute("INSERT INTO rebuilds (session_id, thread_id, from_session, path, cwd, owner, status, "
                   "created) VALUES (?, ?, ?, ?, ?, ?, 'pending', ?)",
                   (plan.session_id, thread_id, from_session, plan.path, cwd,
                    json.dumps({**process_identity(), "what": what}), now))
        db.execute("INSERT INTO aliases VALUES (?, ?, ?, 0, ?)",
                   (session_alias(plan.session_id), thread_id, plan.session_id, now))
    registry.save_copy(thread_id)


# -- In process: the view served back through the cc-lhc mod ---------------------------
#
# The same view, but handed to the running Claude by the mod's session.compact hook
# (REAL-CLAUDE-MODS.md): nothing is written into Claude's projects folder and no process
# is replaced. The registry row (status 'inprocess', keyed <session>#<id>) names the view
# file beside the descriptor; acceptance is Claude's next request on the compacted
# conversation, and recovery settles a dead owner's row without moving any file.

IN_PROCESS_ACK = ("Understood: the older turns above are cc-lhc's rendering of the thread; "
                  "the newest follow exactly as they were.")


def handle_floor(store, session_id) -> int:
    """The newest message of a session that Claude no longer holds under its own uuid.

    Records captured before the session's last compaction (Claude's own, or a view
    cc-lhc served) were written again under new uuids, so the hook cannot hand them back.
    """
    row = store.db.execute("SELECT max(seq) FROM messages WHERE source_session = ? AND kind = "
                           "'compact_summary'", (session_id,)).fetchone()
    return max(row[0] or 0, int(_meta(store, f"handles_after:{session_id}", 0)))


# A user text message that came from a queued_command attachment, or a prompt Claude took
# in mid-turn that only its enqueue record wrote down (their data is that attachment or
# record; a text block's own data is the block, of type text): Claude holds it as an
# attachment, under no handle the hook is given.
# (CASE, not AND: SQLite may evaluate every operand of an AND, and json_extract raises on
# data that is no JSON, such as a block kept whole behind a NUL)
QUEUED_PROMPT_SQL = ("(kind = 'user_text' AND data IS NOT NULL AND CASE WHEN json_valid(data) "
                     "THEN json_extract(data, '$.type') END IN ('queued_command', 'queue-operation'))")
HELD_AS_WORDS = -1  # live_handles' count for such a message: the view gives it back as text
# The record 2.1.328 writes with a background agent's summary, naming the tools that ran
# before it (isMeta, turnCompanion): Claude reads it with the next prompt but keeps no
# message of it, so the hook has no handle for it (asked for, the mod declines the view).
COMPANION_MARK = "<tools-used-before-summary>"
NOT_HELD = -2  # live_handles' count for such a record: the view leaves it out


def live_handles(store, session_id) -> dict:
    """Source uuid -> how many recorded messages it holds, for the records of a session
    Claude still has under their own uuids (what the hook gets as handles); HELD_AS_WORDS
    for a message sent mid-turn, which Claude holds but under no handle; NOT_HELD for a
    record Claude keeps no message of (COMPANION_MARK)."""
    # (a saved output is cc-lhc's own copy of a file the record names, in no record of Claude's)
    return dict(store.db.execute(
        f"SELECT source_uuid, CASE WHEN max({QUEUED_PROMPT_SQL}) THEN {HELD_AS_WORDS} "
        f"WHEN max(kind = 'user_meta' AND instr(lhc_text(text), ?) > 0) THEN {NOT_HELD} ELSE count(*) END "
        "FROM messages WHERE source_session = ? AND agent IS NULL AND seq > ? AND kind != ? "
        "GROUP BY source_uuid", (COMPANION_MARK, session_id, handle_floor(store, session_id),
                                 SAVED_OUTPUT)).fetchall())


def _opens_turn(rec) -> bool:
    content = rec["message"]["content"]
    return rec["type"] == "user" and not rec.get("isMeta") and not (isinstance(content, list) and any(
        isinstance(b, dict) and b.get("type") == "tool_result" for b in content))


def _caveat(rec) -> bool:
    """Whether a record is a local command's caveat (isMeta, before the command's own)."""
    message = rec.get("message")
    if rec.get("type") != "user" or not rec.get("isMeta") or not isinstance(message, dict):
        return False
    content = message.get("content")
    first = content if isinstance(content, str) else next(
        (b.get("text") for b in content or () if isinstance(b, dict) and b.get("type") == "text"), None)
    return isinstance(first, str) and first.lstrip().startswith(LOCAL_COMMAND_CAVEAT)


def in_process_messages(records, sources, handles, instructions="") -> list:
    """The view as the mod's hook returns it (pure): cc-lhc's header with the older records
    rendered as text in one built message, then the newest records by handle, each one
    whole and verbatim in the view, and last the closing line IN_PROCESS_VIEW_END by which
    capture knows where the view ends. The records by handle start at a user prompt, or,
    when the newest turn is too long to be verbatim from its prompt on (its oldest part is
    lean), at the first of its responses that is (right after the header, which is on the
    user's side, so the tool calls that follow keep their results and signed thinking)."""
    n = len(records)
    if n > 1 and sources[n - 1] is None and records[n - 1]["type"] == "assistant":
        n -= 1  # the closing line the swap's view adds when it ends on the user's side
    start = response = n
    for i in range(n - 1, 0, -1):
        src = sources[i]
        if src is None or not src[1] or handles.get(src[0]) not in (src[2], HELD_AS_WORDS, NOT_HELD):
            break
        if _opens_turn(records[i]):
            start = i
        elif records[i]["type"] == "assistant" and records[i - 1]["type"] == "user":
            response = i  # a response's first record
    mid_turn = start == n and response < n
    if mid_turn:
        start = response
    header = records[0]["message"]["content"]
    if instructions:
        header += f"\nThe person asked for this compaction with: {instructions}"
    end = start
    if 1 < start < n and _caveat(records[start - 1]):
        end -= 1  # (the kept part starts at a local command, whose handle brings its caveat along)
    older = [_rendered_record(r) for r in records[1:end] if r.get("type") in ("user", "assistant")]
    text = "\n\n".join([header] + [o for o in older if o])
    out = [{"role": "user", "text": text}]
    if start < n:
        if not mid_turn:
            out.append({"role": "assistant", "text": IN_PROCESS_ACK})
        for i in range(start, n):
            if handles.get(sources[i][0]) == NOT_HELD:
                continue  # (Claude keeps no message of it: there is nothing to hand back)
            if handles.get(sources[i][0]) == HELD_AS_WORDS:
                # (sent mid-turn, Claude holds it inside the result it came with, which goes
                # back by its handle; only one that opens the kept part has none to come with)
                if i == start:
                    out.append({"role": "user", "text": _user_words(records[i])})
            elif i == start or sources[i][0] != sources[i - 1][0]:
                out.append({"handle": sources[i][0]})
    out.append({"role": "assistant", "text": IN_PROCESS_VIEW_END})
    return out


def _user_words(rec) -> str:
    """The text of a view's user record that holds only text (a message sent mid-turn)."""
    content = rec["message"]["content"]
    if isinstance(content, str):
        return content
    return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict))


def _rendered_record(rec) -> str:
    """One older view record as text: thinking cannot go back unsigned, so it is left out."""
    content = rec["message"]["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
    parts = [_markdown_block(b) for b in blocks if not (isinstance(b, dict) and b.get("type") in (
        "thinking", "redacted_thinking"))]
    parts = [p for p in parts if p]
    return f"[{rec['type']}]\n" + "\n".join(parts) if parts else ""


def rebuild_in_process(home, store, thread_id, from_session, policy, cwd, descriptor, *,
                       assessment=None, plan_view=None, envelope_from=None, instructions=""):
    """Record an in-process rebuild as pending, build the view and leave it for the hook."""
    import time
    key = f"{from_session}#{os.urandom(16).hex()[:12]}"
    sources = []
    plan = (plan_view or plan_rebuild)(home, store, thread_id, policy, from_session, cwd,
                                       envelope_from=envelope_from, native=True, sources=sources)
    records = [json.loads(line) for line in plan.data.splitlines()]
    messages = in_process_messages(records, sources, live_handles(store, from_session), instructions)
    if plan.boundary:
        note_built_boundary(store, key, plan.boundary)
    path = os.path.join(descriptor["shim_dir"], MOD_VIEW_FILE)
    registry = Registry(home)
    now = utc_now_iso()
    with Tx(registry.db) as db:
        db.execute("INSERT INTO rebuilds (session_id, thread_id, from_session, path, cwd, owner, status, "
                   "created) VALUES (?, ?, ?, ?, ?, ?, 'inprocess', ?)",
                   (key, thread_id, from_session, path, cwd, json.dumps(process_identity()), now))
    registry.save_copy(thread_id)
    if assessment is not None:
        assessment.outcome(f"scheduled:{key}")
    failpoint("after-pending-record")
    body = {"token": descriptor["token"], "session_id": from_session, "key": key,
            "messages": messages}
    for attempt in range(1, REBUILD_WRITE_ATTEMPTS + 1):
        try:
            _write_private_json(path, body)
            break
        except OSError as e:
            if attempt == REBUILD_WRITE_ATTEMPTS:
                abandon(home, registry, key, f"its view could not be written: {e}")
                if assessment is not None:
                    assessment.outcome(f"failed: write: {e}")
                raise LhcError(f"the in-process view could not be written: {e}")
            time.sleep(0.05 * attempt)
    failpoint("after-view-write")
    if assessment is not None:
        assessment.outcome(f"rebuilt:{key}")
    home.log("smart_compact_rebuilt", thread=thread_id, old_session=from_session, new_session=from_session,
             key=key, in_process=True, path=path, messages=len(messages),
             kept=sum(1 for m in messages if "handle" in m),
             bands={b: len(plan.view.turns_in(b)) for b in BANDS + ("omitted",)},
             boundary=plan.boundary, prune=plan_view is not None, thinking=plan.arm)
    return PendingRebuild(key, from_session, path, 0,
                          assessment.receipt if assessment is not None else None, descriptor,
                          in_process=True)


def accept_in_process(home, thread_id, pending, replayed_at: int) -> bool:
    """Settle an in-process rebuild Claude has sent a request on: the session stays the
    same, so nothing advances but the row, the prune boundary and the handle floor."""
    registry = Registry(home)
    failpoint("before-acceptance")
    with Tx(registry.db) as db:
        db.execute("UPDATE rebuilds SET status = 'accepted', settled = ? WHERE session_id = ? "
                   "AND status = 'inprocess'", (utc_now_iso(), pending.session_id))
        db.execute("DELETE FROM thread_alarms WHERE thread_id = ?", (thread_id,))
    registry.save_copy(thread_id)
    store = ThreadStore(home, thread_id)
    try:
        boundary = advance_boundary(store, pending.session_id)
        _set_meta(store, f"handles_after:{pending.from_session}", replayed_at)
    finally:
        store.close()
    home.log("smart_compact_accepted", thread=thread_id, session=pending.from_session,
             key=pending.session_id, in_process=True, boundary=boundary)
    return True


def accept(home, thread_id, pending) -> bool:
    """Advance the thread to the rebuilt session only if Claude was seen accepting it."""
    registry, hostdb = Registry(home), HostDB(home)
    failpoint("before-acceptance")
    try:
        accepted = os.path.getsize(pending.path) > pending.prefix
    except OSError:
        accepted = False
    if not accepted:
        abandon(home, registry, pending.session_id, "the new session never accepted the prompt")
        say("the rebuilt session was not accepted; the thread stays on its previous session "
            "and nothing was re-sent")
        return False
    failpoint("after-acceptance-before-alias")
    keep_branch_of(home, thread_id, pending.from_session, pending.session_id)
    try:
        advance_current(registry, thread_id, pending.session_id)
    except Exception as e:
        # The swap happened; remember the pointer we meant to write and repair it at the
        # next launch, touching only that exact predecessor.
        with Tx(hostdb.db) as db:
            db.execute("INSERT INTO pointer_repairs (thread_id, from_session, to_session, created) "
                       "VALUES (?, ?, ?, ?)", (thread_id, pending.from_session,
                                               pending.session_id, utc_now_iso()))
        home.log("pointer_write_failed", thread=thread_id, error=repr(e))
        return True
    failpoint("after-alias-advance")
    settle_boundary(home, thread_id, pending.session_id)
    return True


def settle_boundary(home, thread_id, session_id, **fields) -> None:
    """After the thread moved to an accepted rebuild: its boundary becomes the thread's, and
    the branch in force is the rebuild's (took_branch)."""
    store = ThreadStore(home, thread_id)
    try:
        boundary = advance_boundary(store, session_id)
        took_branch(store, session_id)
    finally:
        store.close()
    home.log("smart_compact_accepted", thread=thread_id, session=session_id, boundary=boundary, **fields)


def keep_branch_of(home, thread_id, session_id, replaced_by) -> None:
    """leave_branch for a session a rebuild is about to replace (its own store opened)."""
    if not session_id:
        return
    store = ThreadStore(home, thread_id)
    try:
        leave_branch(store, session_id, replaced_by)
    finally:
        store.close()


def abandon(home, registry, session_id, reason):
    """Move an unused rebuilt transcript out of Claude's projects folder; returns where to.

    Only a file proven to be this rebuild is moved; anything else the record names is
    left in place (and logged), while the record itself is still settled as abandoned.
    """
    row = registry.db.execute("SELECT path, cwd, thread_id, status FROM rebuilds WHERE session_id = ?",
                              (session_id,)).fetchone()
    if row is None:
        return
    path, cwd, thread_id, status = row
    moved = None
    if status == "inprocess":
        # Its view lies beside the descriptor, never in Claude's folder: an unused one is
        # removed so no later /compact is answered with it.
        try:
            os.unlink(path)
        except OSError:
            pass
    elif isinstance(path, str) and os.path.lexists(path):
        known = HostDB(home).session(session_id)
        lineage = (known["replayed_prefix_bytes"], known["replayed_prefix_sha256"]) if known else None
        unproven = unproven_rebuild_reason(path, thread_id, lineage, session_id)
        if unproven:
            home.log("rebuild_not_moved", thread=thread_id, session=session_id, path=path,
                     why=unproven)
        else:
            folder = home.ensure("abandoned-rebuilds", project_slug(cwd or "unknown"))
            moved = free_name(os.path.join(folder, os.path.basename(path)))
            move_file(path, moved)
            # (and the session's folder: the subagent transcripts the rebuild was given)
            beside, goes_to = path[:-len(".jsonl")], moved[:-len(".jsonl")]
            if path.endswith(".jsonl") and moved.endswith(".jsonl") and os.path.isdir(beside) \
                    and not os.path.islink(beside) and not os.path.lexists(goes_to):
                try:
                    move_file(beside, goes_to)
                except OSError as e:
                    home.log("rebuild_folder_not_moved", thread=thread_id, session=session_id, path=beside,
                             error=repr(e))
    with Tx(registry.db) as db:
        db.execute("UPDATE rebuilds SET status = 'abandoned', settled = ? WHERE session_id = ?",
                   (utc_now_iso(), session_id))
    registry.save_copy(thread_id)
    home.log("rebuild_abandoned", thread=thread_id, session=session_id, reason=reason, moved_to=moved)
    return moved


# == 13. Terminal relay ==========================================================


# Terminal modes a program turns on with one sequence and off with another. Claude turns
# several on (the alternate screen, a hidden cursor, mouse and focus reports, bracketed
# paste, kitty's and xterm's key encodings) and off again as it exits; a Claude that
# dies by a signal, or a panel still open at its end, would leave the person's shell in
# them (its output drawn on a dead screen, mouse moves typed as text).
# (one pattern, so a write is scanned once: DEC private modes, kitty's key-encoding stack,
# xterm's modifyOtherKeys)
MODE_SEQ = re.compile(rb"\x1b\[(?:\?([0-9;]+)([hl])|([<>])([0-9]*)u|>4(?:;([0-9]*))?m)")
RESET_MODES = {1000, 1002, 1003, 1005, 1006, 1015, 1016, 1004, 2004, 2031}  # turned off when left on
SYNC_OUTPUT = 2026  # a synchronized update: a terminal shows nothing new until it ends


class TerminalModes:
    """What the bytes written to the person's terminal left switched on (pure)."""

    TAIL = 24  # a sequence cut between two writes is read whole with the next one
    OPEN_STRING = re.compile(rb"\x1b[\]PX^_][^\x07\x1b\x18\x1a]*\Z")  # OSC, DCS...: no BEL or ST yet
    OPEN_CONTROL = re.compile(rb"\x1b(?:\[[\x20-\x3f]*)?\Z")           # ESC or CSI: no final byte yet

    def __init__(self):
        self.dec = {}         # mode -> on
        self.kitty = 0        # entries pushed on kitty's key-encoding stack
        self.other_keys = False
        self._tail = b""
        self._last = b""

    LAST = 4096  # the bytes kept to tell whether the stream ended inside a sequence

    def feed(self, data: bytes) -> None:
        if not data:
            return
        self._last = (self._last + data[-self.LAST:])[-self.LAST:]
        if b"\x1b" not in data and b"\x1b" not in self._tail:
            return
        buf, old = self._tail + data, len(self._tail)
        for m in MODE_SEQ.finditer(buf):
            if m.end() <= old:
                continue  # (read whole with the write before)
            modes, switch, stack, count, other = m.groups()
            if modes is not None:
                for mode in modes.split(b";"):
                    if mode.isdigit():
                        self.dec[int(mode)] = switch == b"h"
            elif stack == b">":
                self.kitty += 1
            elif stack == b"<":
                self.kitty = max(0, self.kitty - int(count or 1))
            else:
                self.other_keys = bool(other) and other != b"0"
        self._tail = buf[-self.TAIL:]

    def left_open(self) -> bool:
        """Whether the bytes written end inside a sequence (a program killed while writing it)."""
        last = self._last
        return bool(self.OPEN_STRING.search(last[max(0, last.rfind(b"\x1b")):]) or self.OPEN_CONTROL.search(last))

    def reset(self) -> bytes:
        """The sequences that switch off what is still on; b"" when nothing is. A program
        killed while writing a sequence leaves the terminal reading what follows as part of
        it (an OSC title without its end swallows it all): CAN ends it first. One killed in
        the middle of drawing leaves a synchronized update open, in which a terminal shows
        nothing new: ended next."""
        out = []
        if self.dec.get(SYNC_OUTPUT):
            out.append(b"\x1b[?%dl" % SYNC_OUTPUT)
        if self.kitty:
            out.append(b"\x1b[<%du" % self.kitty)
        if self.other_keys:
            out.append(b"\x1b[>4m")
        out += [b"\x1b[?%dl" % mode for mode in sorted(RESET_MODES) if self.dec.get(mode)]
        for mode in (1049, 1047, 47):
            if self.dec.get(mode):
                out.append(b"\x1b[?%dl" % mode)
                break
        if self.dec.get(7) is False:
            out.append(b"\x1b[?7h")  # line wrap
        if self.dec.get(25) is False:
            out.append(b"\x1b[?25h")
        cancel = b"\x18" if self.left_open() else b""
        return cancel + (b"\x1b[0m" + b"".join(out) if out else b"")


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
        # The end of a terminal's input is its hangup (in raw mode no key gives an end of
        # file): the terminal is gone though no SIGHUP came (a shell that ignores it kept it
        # from us), and Claude is ended as SIGHUP would end it. A pipe's end is only its end.
        self.input_tty = in_fd is not None and os.isatty(in_fd)
        self.always_ready = {}  # tag -> wanted events, for fds the selector refuses
        # Hooks for a live handoff: extra descriptors to read, a periodic tick, and input
        # that is dropped (and counted) rather than delivered while a swap is under way.
        self.readers = {}       # tag -> (fd, callback(relay))
        self.timeout = None
        self.on_tick = None
        self.drop_input = False
        self.dropped = 0
        self.last_drop = None   # when typing was last dropped (see in_drop_tail)
        self.tail_dropped = 0   # bytes dropped as the tail of a dropped run
        self._sel = None
        # The control panel: input passes through on_input first, and while the panel
        # is open the child's output is held back and shown when it closes.
        self.on_input = None
        self.hold_output = False
        self.held = bytearray()
        self.child_alt_screen = False  # whether the child itself drew on the alternate screen
        self.child_output_at = None    # time.monotonic() of the child's newest output
        self.child_cleared_at = None   # ... of its newest whole-screen clear (a first frame, say)
        self.modes = TerminalModes()    # what the bytes written to the person's terminal switched on
        # Job control. Claude runs in a session of its own, so the SIGTSTP it sends itself
        # on ctrl-z is discarded by the kernel (an orphaned process group may not stop):
        # it would leave the terminal and wait for a SIGCONT that never comes. So when a
        # ctrl-z reached it and it let go of its terminal (the PTY back in canonical
        # mode), or cc-lhc itself is sent SIGTSTP, on_suspend(relay) stops the whole job
        # the shell's way and brings it back on fg.
        self.on_suspend = None
        self.suspend_asked = None   # (monotonic time, whether to stop even if Claude does not)
        self.raw_awaited = None     # after fg: keys wait (until then) for Claude's raw mode

    SUSPEND_KEYS = (b"\x1a", b"\x1b[122;5u", b"\x1b[27;5;122~")  # ctrl-z, and its kitty and xterm forms
    SUSPEND_WAIT_SECONDS = 1.0

    def run(self) -> None:
        import selectors
        os.set_blocking(self.master_fd, False)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        watched = (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD) + (
            (signal.SIGTSTP,) if self.on_suspend else ())
        previous = {s: signal.signal(s, lambda *_: None) for s in watched}
        old_wakeup = signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
        sel = self._sel = selectors.DefaultSelector()
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
        if tag in self.always_ready:
            self.always_ready[tag] = events
        elif events:
            try:
                sel.modify(fd, events, tag)
            except KeyError:
                try:
                    sel.register(fd, events, tag)
                except PermissionError:
                    # epoll refuses regular files and /dev/null (`cc-lhc < file`,
                    # `cc-lhc > log`); they never block, so they count as always ready.
                    self.always_ready[tag] = events
        else:
            try:
                sel.unregister(fd)
            except KeyError:
                pass

    def _loop(self, sel, wake_r):
        import selectors
        import time
        master_open = True
        while master_open:
            m_events = 0
            if len(self.to_user) < self.HIGH_WATER and len(self.held) < self.HIGH_WATER:
                m_events |= selectors.EVENT_READ
            if self.to_child and not self._awaiting_raw():
                m_events |= selectors.EVENT_WRITE
            self._interest(sel, self.master_fd, m_events, "master")
            if self.input_open:
                try:
                    self._interest(sel, self.in_fd,
                                   selectors.EVENT_READ if len(self.to_child) < self.HIGH_WATER else 0,
                                   "in")
                except PermissionError:  # /dev/null or a regular file: nothing will ever arrive
                    self.input_open = False
            self._interest(sel, self.out_fd, selectors.EVENT_WRITE if self.to_user else 0, "out")
            for tag, (fd, _cb) in self.readers.items():
                self._interest(sel, fd, selectors.EVENT_READ, tag)
            ready = [(tag, events) for tag, events in self.always_ready.items() if events]
            wait = 0 if ready else (0.02 if self.suspend_asked or self.raw_awaited else self.timeout)
            for tag, mask in [(k.data, m) for k, m in sel.select(wait)] + ready:
                if tag in self.readers:
                    self.readers[tag][1](self)
                elif tag == "wake":
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
                            self.child_output_at = time.monotonic()
                            if b"\x1b[?10" in data:
                                self._note_alt_screen(data)
                            if b"\x1b[2J" in data:
                                self.child_cleared_at = self.child_output_at
                            if self.hold_output:
                                self.held += data
                            else:
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
                        if self.input_tty and self.on_signal:
                            self.on_signal(signal.SIGHUP, self)
                    else:
                        # (the panel still takes its keys while Claude's are dropped)
                        data = self.on_input(data) if self.on_input else data
                        if self.drop_input:
                            typed = typed_bytes(data)  # (a focus or mouse report is no typing)
                            self.dropped += typed
                            if typed:
                                self.last_drop = time.monotonic()
                        elif self.in_drop_tail(data):
                            self.last_drop = time.monotonic()
                            self.tail_dropped += len(data)
                        else:
                            self.to_child += data
                            if self.on_suspend and any(k in data for k in self.SUSPEND_KEYS):
                                self._ask_suspend(force=False)
                elif tag == "out":
                    self._to_user()
            if self.suspend_asked and master_open:
                self._check_suspend()
            if self.on_tick:
                self.on_tick(self)
        self._flush_user()

    DROP_PAUSE_SECONDS = 1.0

    def in_drop_tail(self, data) -> bool:
        """Whether keys typed once dropping has ended go on with what was dropped (the
        relay then drops them too, and the draft watch never sees them): a sentence typed
        through a compaction is dropped whole (Enter too), not delivered from the middle on
        into Claude's box, where it could be sent clipped. It goes on until the person
        stops typing for DROP_PAUSE_SECONDS; a report the terminal sends is no typing."""
        import time
        return (self.last_drop is not None and time.monotonic() - self.last_drop <= self.DROP_PAUSE_SECONDS
                and bool(typed_bytes(data) or any(key in data for key in (b"\r", b"\x7f", b"\x08"))))

    def _ask_suspend(self, force: bool) -> None:
        import time
        self.suspend_asked = (time.monotonic(), force or bool(self.suspend_asked and self.suspend_asked[1]))

    def _child_cooked(self) -> bool:
        """Whether the child's terminal is in canonical mode (Claude let go of it)."""
        import termios
        try:
            return bool(termios.tcgetattr(self.master_fd)[3] & termios.ICANON)
        except (termios.error, OSError):
            return False

    def _check_suspend(self) -> None:
        """Stop the job once Claude has let go of its terminal after a ctrl-z (or at once,
        when the stop came as a signal and Claude did not take it as one)."""
        import time
        cooked = self._child_cooked()
        since, force = self.suspend_asked
        late = time.monotonic() - since > self.SUSPEND_WAIT_SECONDS
        if not cooked and not late:
            return
        self.suspend_asked = None
        if cooked or force:
            self._flush_user()  # Claude's own words on leaving ("Claude Code is suspended...")
            self.on_suspend(self)
            # Keys typed right after fg would reach a Claude still in canonical mode, where
            # Enter is a new line in its box, not a send: they wait for it to be raw again.
            self.raw_awaited = time.monotonic() + self.SUSPEND_WAIT_SECONDS

    def _awaiting_raw(self) -> bool:
        import time
        if self.raw_awaited is None:
            return False
        if time.monotonic() < self.raw_awaited and self._child_cooked():
            return True
        self.raw_awaited = None
        return False

    def _note_alt_screen(self, data: bytes) -> None:
        on = max(data.rfind(b"\x1b[?1049h"), data.rfind(b"\x1b[?1047h"))
        off = max(data.rfind(b"\x1b[?1049l"), data.rfind(b"\x1b[?1047l"))
        if on != off:
            self.child_alt_screen = on > off
        if on >= 0:  # (a switch to the alternate screen shows it blank: a whole-screen clear)
            self.child_cleared_at = self.child_output_at

    def remove_reader(self, tag) -> None:
        fd, _cb = self.readers.pop(tag, (None, None))
        if fd is not None and self._sel is not None:
            try:
                self._sel.unregister(fd)
            except (KeyError, ValueError):
                pass

    def switch_master(self, fd) -> None:
        """Route to another child from now on; what the old one still had to say is dropped."""
        if self._sel is not None:
            try:
                self._sel.unregister(self.master_fd)
            except (KeyError, ValueError):
                pass
        self.master_fd = fd
        os.set_blocking(fd, False)
        self.to_child.clear()
        self.to_user.clear()

    @staticmethod
    def _write_some(fd, buf: bytearray) -> bytes:
        """Write what fd takes of buf now, and drop it from buf; returns what was written."""
        chunk = bytes(buf[: Relay.CHUNK])
        try:
            n = os.write(fd, chunk)
        except BlockingIOError:
            return b""
        except OSError:
            buf.clear()  # the reader went away; nothing more can be delivered
            return b""
        del buf[:n]
        return chunk[:n]

    def _to_user(self) -> None:
        """Write what waits for the person's terminal, noting the modes it switches."""
        self.modes.feed(self._write_some(self.out_fd, self.to_user))

    def restore_modes(self) -> None:
        """Switch off what the session left on in the person's terminal (see TerminalModes)."""
        self.to_user += self.modes.reset()
        self._deliver_all()

    def _deliver_all(self) -> None:
        blocking = os.get_blocking(self.out_fd)
        os.set_blocking(self.out_fd, True)
        try:
            while self.to_user:
                self._to_user()
        finally:
            os.set_blocking(self.out_fd, blocking)

    def _flush_user(self):
        """Deliver what the child wrote before it exited (its goodbye screen)."""
        self.to_user += self.held
        self.held.clear()
        try:
            while True:
                data = os.read(self.master_fd, self.CHUNK)
                if not data:
                    break
                self.to_user += data
        except OSError:
            pass
        self._deliver_all()

    def _drain_signals(self, wake_r):
        try:
            data = os.read(wake_r, 512)
        except BlockingIOError:
            return
        for signum in data:
            if signum == signal.SIGTSTP and self.on_suspend:
                # Stopped from outside (kill -TSTP): Claude is asked to leave its terminal
                # as on ctrl-z; the job stops when it has, or after a moment regardless.
                self.to_child += b"\x1a"
                self._ask_suspend(force=True)
            elif signum == signal.SIGWINCH and self.get_size and self.set_child_size:
                size = self.get_size()
                if size:
                    self.set_child_size(*size)
            elif self.on_signal:
                self.on_signal(signum, self)


# The keys that open the control panel: ctrl-] as a raw byte, and as the kitty
# (CSI-u) and xterm modifyOtherKeys encodings some terminals send for it.
LEADER_NAMES = {"ctrl-]": b"\x1d"}
# Windows Terminal's win32-input-mode sends every key press and release as
# ESC [ Vk ; Sc ; Uc ; Kd ; Cs ; Rc _ (virtual key, scan code, the character as a
# number, 1 for down and 0 for up, modifier state, repeat count; an empty field is 0,
# except the repeat count, which is then 1).
WIN32_KEY = re.compile(rb"\x1b\[(\d*);(\d*);(\d*);(\d*);(\d*)(?:;(\d*))?_")
WIN32_CTRL = 0x0008 | 0x0004   # LEFT_CTRL_PRESSED | RIGHT_CTRL_PRESSED
VK_OEM_6 = 0xDD                # the "]" key on a US layout


def win32_key(match) -> dict:
    """The fields of one win32-input-mode key event (pure)."""
    vk, sc, uc, kd, cs, rc = (int(g) if g else 0 for g in match.groups())
    return {"vk": vk, "uc": uc, "down": kd == 1, "ctrl": bool(cs & WIN32_CTRL),
            "repeat": max(1, rc) if match.group(6) else 1}


# What a terminal sends that starts with ESC, besides a lone Esc: keys (arrows, function
# keys, CSI-u), mouse and focus reports (Claude Code 2.1.328 turns on mouse tracking, with
# every motion, and focus events), and replies to the queries Claude sends as it starts
# (device attributes \x1b[?..c, its version as DCS \x1bP>|..\x1b\\, OSC colours, mode
# reports \x1b[?..$y, kitty keyboard flags \x1b[?..u). A string (OSC, DCS, APC, PM, SOS)
# ends at BEL or ST. A sequence a read cuts short waits for the rest (a lone Esc at the
# end of a read is the Esc key: terminals send nothing after it).
TERMINAL_CSI = re.compile(rb"\x1b\[([0-9;:<=>?]*)[ -/]*([@-~])")
TERMINAL_CSI_CUT = re.compile(rb"\x1b\[[0-9;:<=>?]*[ -/]*\Z")
TERMINAL_STRING_END = re.compile(rb"\x07|\x1b\\")
TERMINAL_STRING_MAX = 1 << 16  # longer than any answer: a string never ended is taken as it is


def terminal_sent(data: bytes, i: int):
    """(end, kind) of the sequence at data[i] (an ESC): kind 'key', 'mouse', 'reply', or
    'cut' (end None: the read ends inside it); None for a lone Esc."""
    nxt = data[i + 1:i + 2]
    if nxt and nxt in b"]P_^X":
        m = TERMINAL_STRING_END.search(data, i + 2)
        if m:
            return m.end(), "reply"
        return (None, "cut") if len(data) - i < TERMINAL_STRING_MAX else (len(data), "reply")
    if nxt == b"\\":
        return i + 2, "reply"  # the end of a string whose start came in an earlier read
    if nxt == b"O":
        return (i + 3, "key") if i + 2 < len(data) else (None, "cut")
    m = TERMINAL_CSI.match(data, i)
    if not m:
        return (None, "cut") if nxt and TERMINAL_CSI_CUT.match(data, i) else None
    params, final = m.group(1), m.group(2)
    if params.startswith(b"<") and final in b"Mm":
        return m.end(), "mouse"
    if params[:1] in (b"?", b">", b"=") or (not params and final in b"IO"):
        return m.end(), "reply"  # (focus in and out too: Claude asked for those as well)
    return m.end(), "key"


def typed_bytes(data: bytes) -> int:
    """How many bytes of what the terminal sent were text typed (what a person would have
    to type again): its reports (mouse, focus, the answers to Claude's queries) left out,
    and so are keys that write nothing (Esc, arrows and other sequences, Enter, ctrl-c and
    the other control keys)."""
    typed, i = 0, 0

    def text(part) -> int:
        return sum(1 for b in part if b >= 0x20 and b != 0x7F)
    while i < len(data):
        at = data.find(b"\x1b", i)
        if at < 0:
            return typed + text(data[i:])
        typed += text(data[i:at])
        sent = terminal_sent(data, at)
        if sent is None:  # a lone Esc: a key that writes nothing
            i = at + 1
        elif sent[1] == "cut":  # (the rest of a report a read cut: no typing either)
            return typed
        else:
            i = sent[0]
    return typed


# The most rows one of cc-lhc's lines over Claude's screen takes: a longer one would cover
# Claude's input box and most of its screen (the panel, ctrl-], has room for the rest).
OVERLAY_ROWS = 4


def overlay_lines(texts, size) -> bytes:
    """cc-lhc's own lines written over the bottom rows of the screen Claude draws, the
    cursor put back where Claude left it: nothing Claude drew moves (a line written at the
    cursor scrolled its screen under it, and its next partial redraws landed in the wrong
    cells). Each stands until Claude next draws its row. ``size``: (rows, cols) or None."""
    rows, cols = size if size and size[0] > 1 and size[1] > 8 else (24, 80)  # (0x0: never set)
    width, lines = cols - 1, []
    for text in texts:  # each one whole, over as many rows as it takes, up to OVERLAY_ROWS
        rest, own = escape_controls(f"{PROG}: {text}"), []
        while rest:
            piece = cells_prefix(rest, width) or rest[:1]
            if len(piece) < len(rest) and rest[len(piece)] != " ":
                cut = piece.rfind(" ")  # (between words, when a word does not take most of the row)
                if cut >= len(piece) // 2:
                    piece = piece[:cut + 1]
            own.append(piece)
            rest = rest[len(piece):].lstrip(" ") if len(piece) < len(rest) else ""
        if len(own) > OVERLAY_ROWS:  # (its start says what it is; its end is marked as cut)
            own = own[:OVERLAY_ROWS]
            own[-1] = cells_prefix(own[-1], width - 1) + "…"
        lines += own
    lines = lines[-(rows - 1):]
    out = ["\x1b7"]
    for i, line in enumerate(lines):
        out.append(f"\x1b[{rows - len(lines) + 1 + i};1H\x1b[2K\x1b[7m{line}\x1b[0m")
    out.append("\x1b8")
    return "".join(out).encode("utf-8")


def cell_width(text: str) -> int:
    """How many terminal cells text takes: wide and fullwidth characters (CJK, most emoji)
    two, combining marks and format characters none, everything else one."""
    if text.isascii():
        return len(text)
    import unicodedata
    return sum(0 if unicodedata.category(ch) in ("Mn", "Me", "Cf")
               else 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1 for ch in text)


def cells_prefix(text: str, width: int) -> str:
    """The longest start of text that fits in ``width`` cells."""
    if text.isascii():
        return text[:width]
    used = 0
    for i, ch in enumerate(text):
        used += cell_width(ch)
        if used > width:
            return text[:i]
    return text


def wrap_cells(text: str, width: int) -> list:
    """text as rows of at most ``width`` terminal cells, broken between words where it can
    be (a paragraph's indentation kept, the spaces at a break dropped), a longer word cut;
    a character wider than a whole row is shown as '?'."""
    rows, row, used = [], "", 0
    for word in re.findall(r"\s+|\S+", text):
        w = cell_width(word)
        if used + w <= width:
            row, used = row + word, used + w
            continue
        if word.isspace():  # a break here: its spaces go
            rows.append(row)
            row, used = "", 0
            continue
        if row.strip():  # the word starts the next row
            rows.append(row)
            row, used = "", 0
        while used + w > width:  # longer than what is left of the row: cut it
            head = cells_prefix(word, width - used)
            if not head and used:
                rows.append(row)
                row, used = "", 0
                continue
            head, word = (head, word[len(head):]) if head else ("?", word[1:])
            rows.append(row + head)
            row, used, w = "", 0, cell_width(word)
        row, used = row + word, used + w
    if row or not rows:
        rows.append(row)
    return [r.rstrip() if r.strip() else r for r in rows]


def win32_is_leader(key: dict, leader: bytes) -> bool:
    """Whether a win32 key event is the leader pressed (its release never is)."""
    if not key["down"] or len(leader) != 1:
        return False
    if key["uc"] == leader[0]:
        return True
    # Some layouts report ctrl-] with no character: the key and the modifier say it.
    return leader == b"\x1d" and key["uc"] == 0 and key["vk"] == VK_OEM_6 and key["ctrl"]


def win32_to_bytes(key: dict) -> bytes:
    """What a win32 key event types: its character on a press, nothing on a release."""
    if not key["down"] or not key["uc"]:
        return b""
    return chr(key["uc"]).encode("utf-8", "replace") * key["repeat"]

PANEL_COMMANDS = {
    "/status": "capture, retrieval and context-policy status",
    "/stats": "what the thread holds and what summaries cost",
    "/smart-compact": "run Smart Compact now and hand Claude over to the rebuilt session",
    "/smart-prune": "/smart-prune [tokens]: move the oldest turns out of view, down to the prune "
                    "target (or tokens), and hand over if the view changed",
    "/export": "write this session's transcript and the view Smart Compact would serve now to files",
    "/bounds": "/bounds <target> <trigger>: change them for this session",
    "/allocation": "/allocation [default|balanced|historical]: change the profile for this session",
    "/details": "configuration sources, Claude native Compact, the running operation, the last action",
    "/help": "this list",
    "/introduction": "what cc-lhc does, in a few lines",
}
INTRODUCTION = """\
cc-lhc keeps every line of this Claude session in a thread (labels tN for turns, mN for
messages) and never deletes any of it. When the context Claude's provider reports passes
the trigger, Smart Compact rebuilds the session from the thread: the newest turns word for
word (full), older ones with tool outputs replaced by stubs (lean), older still as short
summaries, the rest named by range. Claude continues on the rebuilt session and can read
anything back exactly with `cc-lhc get-turns`, `get-messages` or `search`."""


def leader_key():
    """The key that opens the panel: $CC_LHC_LEADER (e.g. ctrl-g or ^g), or ctrl-].

    Returns (its byte, its name as the panel says it, why the variable was not used or
    None): a value that names no control key falls back to ctrl-], and the panel says so.
    """
    given = os.environ.get("CC_LHC_LEADER")
    name = (given if given is not None else "ctrl-]").strip().lower()
    if name in LEADER_NAMES:
        return LEADER_NAMES[name], name, None
    m = re.fullmatch(r"(?:ctrl-|\^)([a-z@\[\\\]^_])", name)
    if m and m.group(1) in LEADER_TAKEN:
        return (LEADER_NAMES["ctrl-]"], "ctrl-]",
                f"CC_LHC_LEADER={given!r} is the key {LEADER_TAKEN[m.group(1)]} already is, which the panel "
                "must not take: ctrl-] opens this panel")
    if m:
        return bytes([ord(m.group(1).upper()) & 0x1F]), f"ctrl-{m.group(1)}", None
    return (LEADER_NAMES["ctrl-]"], "ctrl-]",
            f"CC_LHC_LEADER={given!r} names no control key (ctrl-a to ctrl-z, ctrl-]...): ctrl-] opens this panel")


# Control keys a terminal sends for keys of their own: as the leader, each press of the
# other key would open the panel (Enter, Tab, Esc, Backspace; NUL, which some send for
# ctrl-space), and a focus report (ESC [ O) would open it by itself.
LEADER_TAKEN = {"m": "Enter", "j": "Enter (a line feed)", "i": "Tab", "[": "Esc", "h": "Backspace",
                "@": "ctrl-space"}


def leader_sequences(leader: bytes) -> tuple:
    """The ways a terminal sends the leader: its byte, and as kitty's CSI-u and xterm's
    modifyOtherKeys write it pressed with ctrl (Claude turns both modes on)."""
    code = leader[0]
    key = ord("a") + code - 1 if 1 <= code <= 26 else code + 0x40  # ctrl-g: g; ctrl-]: ]
    return (leader, f"\x1b[{key};5u".encode(), f"\x1b[27;5;{key}~".encode())


class ControlPanel:
    """The panel on ctrl-]: an alternate screen over Claude's, so nothing lands in its input.

    While it is open, keys go to the panel's own line and Claude's output is held back;
    closing it (Esc or ctrl-]) restores Claude's screen and delivers what was held.
    """

    # How long an ESC that ends a read waits for the rest of a sequence before it is the Esc
    # key, and how long any other sequence a read cut short waits for its end before it is
    # taken for keys (an Esc, then what was typed after it).
    ESC_WAIT_SECONDS = 0.05
    CUT_WAIT_SECONDS = 0.3

    def __init__(self, session, host, handoff):
        self.session, self.host, self.handoff = session, host, handoff
        self.relay = None
        self.open = False
        self.over_alt = False
        self.restore_at = None
        self.line = ""
        self.output = []
        self.last_action = "none yet"
        self.told_fallback = False  # the configuration fallback is said on the first opening
        self.cut = b""              # a terminal sequence the last read cut short (terminal_sent)
        self.cut_at = None          # when it began (monotonic)
        self.hold_until = None      # when a cut still not completed is taken as keys after all
        leader, self.leader_name, self.leader_problem = leader_key()
        self.leaders = leader_sequences(leader)

    # -- keys ---------------------------------------------------------------------------

    def on_input(self, data: bytes) -> bytes:
        """Bytes for Claude; the leader and everything typed into the open panel stay here
        (but the terminal's replies to Claude's own queries go on to it)."""
        out = bytearray()
        while True:  # (a loop, not recursion: a paste may hold any number of leaders)
            if not self.open:
                data, self.cut = self.cut + data, b""  # (a panel closed meanwhile: it is Claude's)
                cut = self._find_leader(data)
                if cut is None:
                    return bytes(out + data)
                at, end = cut
                out += data[:at]
                self._show()
                data = data[end:]
            claudes, rest = self._keys(data)
            out += claudes
            if rest is None:
                return bytes(out)
            data = rest  # typed after the key that closed the panel: Claude's

    def _find_leader(self, data: bytes):
        """(start, end) of the first leader key in data, in any encoding, or None."""
        cuts = [(data.find(s), data.find(s) + len(s)) for s in self.leaders if s in data]
        if b"\x1b[" in data:
            cuts += [(m.start(), m.end()) for m in WIN32_KEY.finditer(data)
                     if win32_is_leader(win32_key(m), self.leaders[0])][:1]
        return min(cuts, default=None)

    def _from_win32(self, data: bytes) -> bytes:
        """The panel's keys with win32-input-mode events turned into what they type."""
        if b"_" not in data:
            return data

        def typed(m):
            key = win32_key(m)
            return self.leaders[0] if win32_is_leader(key, self.leaders[0]) else win32_to_bytes(key)
        return WIN32_KEY.sub(typed, data)

    def _keys(self, data: bytes):
        """Type data into the open panel: (what of it is for Claude after all, and what
        follows the key that closed the panel, or None when it is still open or a command
        closed it)."""
        raw = self.cut + data
        since = self.cut_at if self.cut else None  # when the sequence held back began
        data = self._from_win32(raw)
        self.cut, self.cut_at, self.hold_until = b"", None, None
        i, claudes = 0, bytearray()
        while i < len(data) and self.open:
            leader = next((s for s in self.leaders if data.startswith(s, i)), None)
            if leader is not None:
                self._hide()
                return bytes(claudes), data[i + len(leader):]
            c = data[i]
            if c == 0x1B:
                sent = terminal_sent(data, i)
                if sent is None and i == len(data) - 1 and raw.endswith(b"\x1b"):
                    # The last byte of a read: the Esc key, or the first byte of an answer
                    # the next read completes. As terminals do, wait briefly to tell (a
                    # win32-input Esc key event says what it is).
                    self._hold(data[i:], since if i == 0 else None, self.ESC_WAIT_SECONDS)
                    break
                if sent is None:  # a lone Esc closes the panel
                    self._hide()
                    return bytes(claudes), data[i + 1:]
                end, kind = sent
                if kind == "cut":  # the rest of it comes in the next read, or it was keys
                    self._hold(data[i:], since if i == 0 else None, self.CUT_WAIT_SECONDS)
                    break
                if kind == "reply":  # Claude asked its terminal something: the answer is Claude's
                    claudes += data[i:end]
                i = end  # arrows, mouse reports and the like: not for the panel's line
                continue
            if c in (0x0D, 0x0A):
                self._run(self.line.strip())
                if not self.open:
                    return bytes(claudes), None
            elif c in (0x7F, 0x08):
                self.line = self.line[:-1]
            elif c == 0x09:
                self.line = self._complete(self.line)
            elif c == 0x03:  # ctrl-c clears the line
                self.line = ""
            elif c >= 0x20:
                j = i
                while j < len(data) and data[j] >= 0x20 and data[j] != 0x7F:
                    j += 1
                self.line += data[i:j].decode("utf-8", "replace")
                i = j
                continue
            i += 1
        if self.open:
            self._render()
        return bytes(claudes), None

    def _hold(self, cut: bytes, since, wait: float) -> None:
        """Keep back a sequence a read cut short until the next read completes it, or
        until ``wait`` after it began: then it was keys (see on_tick)."""
        import time
        self.cut, self.cut_at = cut, since or time.monotonic()
        self.hold_until = self.cut_at + wait

    @staticmethod
    def _complete(line: str) -> str:
        """Tab (or Enter on a partial name) completes a command without running it."""
        name, _, rest = line.partition(" ")
        matches = [c for c in PANEL_COMMANDS if c.startswith(name or "/")]
        return matches[0] + " " + rest.lstrip(" ") if len(matches) == 1 else line  # (what follows kept)

    # -- screen -------------------------------------------------------------------------

    def _show(self) -> None:
        relay = self.relay
        self.open, self.cut = True, b""
        relay.hold_output = True
        self.output = self._opening_notes() + [
            f"Type a command (/help lists them); Esc or {self.leader_name} returns to Claude."]
        # Claude drawing inline: the panel goes on the alternate screen, keeping Claude's
        # as it is. Claude already on the alternate screen (its full-screen mode): the
        # panel draws over it, and Claude repaints when the panel closes.
        self.over_alt = relay.child_alt_screen
        if not self.over_alt:
            relay.to_user += b"\x1b[?1049h"
        self._render()

    def _opening_notes(self) -> list:
        """What the panel says before anything is typed: the configuration fallback (on
        the first opening), the --autocompact advisory, and the thread's standing alarm."""
        session = self.session
        notes = []
        policy = session.policy
        if self.leader_problem:
            notes.append(self.leader_problem)
            self.leader_problem = None  # said once
        if policy.fell_back and not self.told_fallback:
            self.told_fallback = True
            notes.append("\n".join([MSG_CONFIG_FALLBACK] + policy_problem_lines(policy.problems)))
        if autocompact_arg(session.spec):
            notes.append("advisory: Claude native Compact may run before Smart Compact "
                         f"({autocompact_arg(session.spec)} was given; /details says more)")
        notes += [f"alarm: {a}" for a in standing_alarms(session.home, session.capture.thread_id,
                                                          session.alarms)]
        return notes

    def _hide(self) -> None:
        import time
        relay = self.relay
        self.open = False
        self.line = ""
        relay.hold_output = False
        if not self.over_alt:
            relay.to_user += b"\x1b[?1049l" + bytes(relay.held)  # Claude's screen, then what it said meanwhile
        else:
            # Claude's updates are differences against a screen the panel covered: drop
            # them and have Claude repaint it all, through a size change and back.
            relay.to_user += b"\x1b[H\x1b[2J"
            rows, cols = self.host.size()
            self.host.child.setwinsize(rows, max(1, cols - 1))
            self.restore_at = time.monotonic() + 0.15
            relay.timeout = 0.05
        relay.held.clear()

    def resized(self, _rows, _cols) -> None:
        """The terminal changed size: an open panel is drawn again to fit it."""
        if self.open:
            self._render()

    def on_tick(self, relay) -> None:
        import time
        now = time.monotonic()
        if self.hold_until is not None and now >= self.hold_until:
            held, self.cut, self.cut_at, self.hold_until = self.cut, b"", None, None
            if self.open:  # nothing completed it: the Esc key, and what was typed after it
                self._hide()
                relay.to_child += self.on_input(held[1:])
        if self.restore_at is not None and now >= self.restore_at:
            self.restore_at = None
            self.host.child.setwinsize(*self.host.size())

    @property
    def wants_tick(self) -> bool:
        return self.restore_at is not None or self.hold_until is not None

    def _render(self) -> None:
        """One frame: the title and the output above, wrapped to the terminal's width and cut
        to its height, and the line being typed on the last row. Nothing is ever written
        past the last column or row, so no frame scrolls the screen, however small."""
        rows, cols = self.host.size()
        rows, cols = max(1, rows), max(1, cols)
        thread, session = self.session.capture.thread_id[:8], self.session.spec.session_id[:8]
        # the longest title that fits on one row; the blank row under it only when there is room
        title = next((t for t in (f"cc-lhc control panel \u00b7 thread {thread} \u00b7 session {session}",
                                  f"cc-lhc control panel \u00b7 thread {thread}",
                                  f"cc-lhc panel \u00b7 {thread}") if cell_width(t) <= cols), "cc-lhc panel"[:cols])
        lines = [title] + ([""] if rows > 8 else [])
        for text in self.output:
            for part in text.split("\n"):
                lines += wrap_cells(part, cols)
        lines = lines[:rows - 1]
        hint = ""
        typed = self.line.split(" ")[0]
        if typed.startswith("/") and typed not in PANEL_COMMANDS:
            hint = "   " + " ".join(c for c in PANEL_COMMANDS if c.startswith(typed))
        # the end of a line longer than the row, so the cursor after it stays in sight
        shown = "> " + self.line
        while shown and cell_width(shown) > cols - 1:
            shown = shown[1:]
        prompt = cells_prefix(shown + hint, cols)
        screen = ("\x1b[H\x1b[2J" + "\r\n".join(lines) + f"\x1b[{rows};1H{prompt}"
                  f"\x1b[{rows};{min(cols, cell_width(shown) + 1)}H")
        self.relay.to_user += screen.encode("utf-8", "replace")

    # -- commands -----------------------------------------------------------------------

    def _run(self, line: str) -> None:
        if not line:
            return
        name, _, rest = line.partition(" ")
        if name not in PANEL_COMMANDS:
            matches = [c for c in PANEL_COMMANDS if c.startswith(name)]
            if len(matches) == 1:
                self.line = matches[0] + " " + rest.lstrip(" ")  # a partial name completes; Enter runs it
                return
            self.line = ""
            self.output = [f"{name}: could be {', '.join(matches)}" if matches
                           else f"unknown command {name}; /help lists them"]
            return
        self.line = ""
        try:
            self.output = [getattr(self, "cmd_" + name[1:].replace("-", "_"))(rest.split())]
        except LhcError as e:
            self.output = [str(e)]
        except Exception as e:  # the panel must never take the session down
            self.output = [f"{name} failed: {e}"]
            self.session.home.log("panel_error", command=name, error=repr(e))
        self.last_action = f"{line} at {utc_now_iso()[11:19]}"

    def _store(self):
        return ThreadStore(self.session.home, self.session.capture.thread_id)

    def cmd_help(self, _args) -> str:
        return "\n".join(f"{name:<15} {text}" for name, text in PANEL_COMMANDS.items()) + \
            "\nChanges made here last for this session only; config files are for lasting ones."

    def cmd_introduction(self, _args) -> str:
        return INTRODUCTION

    def cmd_status(self, _args) -> str:
        session, capture = self.session, self.session.capture
        store = self._store()
        try:
            c, _ = current_classification(store, session.spec.session_id, session.policy)
            degraded = store.source(capture.session_id) or {}
        finally:
            store.close()
        p = session.policy
        # (read once each: the capture thread clears both when a read works again; the
        # preview's stand-in capture has neither)
        failing, since = getattr(capture, "error", None), getattr(capture, "error_since", None) or "?" * 19
        return "\n".join([
            f"capture: {capture.lines} lines read live, "
            + (f"FAILING since {since[11:19]} UTC ({failing}): what Claude writes "
               "is read once the state folder takes it again; the context below is from before"
               if failing else
               f"DEGRADED ({degraded.get('degraded')})" if degraded.get("degraded") else "healthy"),
            f"retrieval: {'ready' if session.descriptor else 'not available'} "
            f"(cc-lhc get-turns / get-messages / search)",
            f"context: {describe_reading(c)}; state {c['state']}",
            f"policy: target {describe_target(p)}, trigger {p['upperBoundTokens']:,}, "
            f"runway {p['minRunwayTokens']:,}, profile {p['profile']}",
            f"thread {capture.thread_id[:8]}, session {session.spec.session_id}",
        ] + ([f"NOT FOLLOWING: {session.detached}"] if session.detached else [])
          + [f"Claude native Compact ran: its summary is turn t{turn} ({when})"
             for turn, when in session.native_compacts]
          + [f"alarm: {a}" for a in standing_alarms(session.home, capture.thread_id, session.alarms)]
          + (self.handoff.carry.status() if self.handoff is not None else [])
          + [f"notice: {line}" for line in session.announced[-5:]])

    def cmd_stats(self, _args) -> str:
        store = self._store()
        try:
            info, cost = store.summary(), derivation_cost(store)
            kinds = store.db.execute("SELECT kind, count(*) FROM messages GROUP BY kind "
                                     "ORDER BY count(*) DESC").fetchall()
        finally:
            store.close()
        return "\n".join([
            f"turns {info['turns']}, messages {info['messages']}, "
            f"{info['captured_bytes']:,} bytes of transcript captured",
            "by kind: " + ", ".join(f"{k} {n}" for k, n in kinds),
            f"summaries: {cost['calls']} calls, {cost['input_tokens']:,} tokens in, "
            f"{cost['output_tokens']:,} out",
        ])

    CAPTURE_WAIT = 2.0  # seconds _nothing_yet gives capture to take in what the transcript holds

    def _nothing_yet(self) -> bool:
        """Whether this session's thread holds no conversation yet (a rebuild of it would be
        cc-lhc's header over nothing). An answer on the screen a moment ago may not be
        captured yet (capture looks every few ms, later on a loaded machine): while the
        transcript holds more than the thread took in, capture is given a moment."""
        import time
        deadline = time.monotonic() + self.CAPTURE_WAIT
        capture = self.session.capture
        store = self._store()  # (opened once: each look is one read of what capture committed)
        try:
            while True:
                if store.db.execute("SELECT 1 FROM messages WHERE agent IS NULL LIMIT 1").fetchone():
                    return False
                src = store.source(capture.session_id) if capture is not None else None
                try:
                    behind = capture is not None and os.path.getsize(capture.path) > ((src or {}).get("offset") or 0)
                except (OSError, TypeError):
                    behind = False
                if not behind or time.monotonic() > deadline:
                    return True
                time.sleep(0.05)
        finally:
            store.close()

    SETTLE_WAIT = 3.0  # seconds a request waits for the turn on the screen to be over

    def _start_once_settled(self, **how):
        """handoff.start, given a moment when the turn just answered is not over in the
        transcript yet (Claude writes its end a moment after the answer shows; asked at once,
        the request was refused as not at a settled seam)."""
        import time
        deadline = time.monotonic() + self.SETTLE_WAIT
        while True:
            why_not = self.handoff.start(self.relay, **how)
            if not (why_not and why_not.startswith(UNSETTLED)) or time.monotonic() > deadline:
                return why_not
            time.sleep(0.1)

    def cmd_smart_compact(self, _args) -> str:
        if self.handoff is None:
            return "Smart Compact is not available in this session"
        if self._nothing_yet():
            return "Smart Compact did not start: nothing is captured in this session yet"
        why_not = self._start_once_settled(manual=True)
        if why_not:
            if why_not.startswith(LiveHandoff.PASSING):  # (only an automatic one comes back by itself)
                why_not += "; this request is not kept: run /smart-compact again then"
            return f"Smart Compact did not start: {why_not}"
        self._hide()  # back to Claude's screen; the switch follows once the replacement is up
        return "Smart Compact started"

    def cmd_smart_prune(self, args) -> str:
        if len(args) > 1:
            raise usage_error("usage: /smart-prune [tokens], e.g. /smart-prune 100000")
        target = self.session.policy["pruneTargetTokens"]
        if args:
            target = token_count_text(args[0])
            if token_count_problem(target):
                raise usage_error(f"the prune target is a positive whole number of tokens up to "
                                  f"{TOKEN_FIELD_MAX:,}; nothing changed")
        if self.handoff is None:
            return "Smart Prune is not available in this session"
        if self._nothing_yet():
            return "Smart Prune did not start: nothing is captured in this session yet"
        why_not = self._start_once_settled(manual=True, prune=target)
        if why_not:
            return f"Smart Prune did not hand over: {why_not}"
        self._hide()  # back to Claude's screen; the switch follows once the replacement is up
        return f"Smart Prune started (down to {target:,} tokens)"

    def cmd_bounds(self, args) -> str:
        if len(args) != 2:
            raise usage_error("usage: /bounds <target> <trigger>, e.g. /bounds 150000 300000")
        target, trigger = (token_count_text(a) for a in args)
        if isinstance(target, str) or isinstance(trigger, str):
            raise usage_error("both bounds are whole numbers of tokens (digits, e.g. 150000 or 150,000); "
                              "nothing changed")
        p = self.session.policy
        if token_count_problem(target) or token_count_problem(trigger):
            raise usage_error(f"bounds are positive whole numbers of tokens up to {TOKEN_FIELD_MAX:,}; "
                              "nothing changed")
        if not 0 < target < trigger or p["minRunwayTokens"] >= trigger:
            raise usage_error("the target must be above 0 and below the trigger, and the trigger "
                              f"above the runway ({p['minRunwayTokens']:,}); nothing changed")
        p.values.update(lowerBoundTokens=target, upperBoundTokens=trigger)
        p.sources.update(lowerBoundTokens="panel", upperBoundTokens="panel")
        self.session.home.log("panel_bounds", target=target, trigger=trigger)
        return f"target {describe_target(p)}, trigger {trigger:,} for the rest of this session"

    def cmd_allocation(self, args) -> str:
        p = self.session.policy
        if not args:
            return (f"profile {p['profile']}; choose with /allocation <name>:\n" + "\n".join(
                f"  {name:<11} full {s['full']:.0%}, lean {s['lean']:.0%}, summary {s['summary']:.0%}"
                for name, s in PROFILE_SHARES.items()))
        if len(args) > 1:
            raise usage_error("usage: /allocation [name], e.g. /allocation balanced; nothing changed")
        name = args[0].lower()  # (Default, Balanced, Historical as the panel's help names them)
        if name not in PROFILES:
            raise usage_error(f"profiles: {', '.join(PROFILES)}")
        p.values["profile"], p.sources["profile"] = name, "panel"
        return f"profile {name} for the rest of this session"

    def cmd_export(self, _args) -> str:
        session = self.session
        store = self._store()
        try:
            mod = session.spec.mod
            paths = write_session_export(session.home, store, session.capture.thread_id,
                                         session.policy, session.capture.path, session.spec.cwd,
                                         in_process=bool(mod and mod.active and session.descriptor))
        finally:
            store.close()
        session.home.log("panel_export", thread=session.capture.thread_id, **paths)
        return "\n".join(["written (readable by you only):",
                          f"  this session's transcript   {paths['rollout']}",
                          f"  served view, as Claude reads it  {paths['view_jsonl']}",
                          f"  served view, to read             {paths['view_markdown']}"])

    def cmd_details(self, _args) -> str:
        p, spec = self.session.policy, self.session.spec
        if autocompact_arg(spec):
            native = (f"allowed: the launch gave {autocompact_arg(spec)}, so Claude native Compact "
                      "may run before Smart Compact; relaunch without --autocompact to go back")
        elif spec.autocompact:
            native = ("allowed while the thread's standing alarm lasts (rebuilt sessions are not "
                      "loading); the next accepted Smart Compact ends it")
        else:
            native = "off for this session (DISABLE_AUTO_COMPACT=1)"
        running = ("Smart Compact handoff under way" if self.handoff and self.handoff.candidate
                   else "none")
        store = self._store()
        try:
            boundary, arm = visibility_boundary(store), _meta(store, THINKING_KEY)
        finally:
            store.close()
        shown = {k: json.dumps(p.values[k]) for k in BUILTIN_POLICY}  # (as a configuration file writes them)
        width = max(map(len, shown.values()))
        return "\n".join(
            ["configuration (value, source):"]
            + [f"  {k:<21} {shown[k]:<{width}} {p.sources[k]}" for k in BUILTIN_POLICY]
            + ([f"  thread thinking replay: {arm} (the API refused replayed thinking for this "
                "thread)"] if arm else [])
            + [f"visibility boundary: m{boundary} (Smart Prune; earlier messages are not in view)"
               if boundary else "visibility boundary: none (nothing pruned)"]
            + ([f"  fallback: {MSG_CONFIG_FALLBACK}"] + policy_problem_lines(p.problems, "    ") if p.fell_back else [])
            + [f"retrieval descriptor: {self.session.descriptor['path'] if self.session.descriptor else 'none'}",
               f"Claude native Compact: {native}",
               f"cc-lhc mod: {spec.mod.details() if spec.mod else 'not offered (one-shot)'}",
               f"running operation: {running}",
               f"last action: {self.last_action}"])


# -- Previewing the panel ----------------------------------------------------------------
#
# `cc-lhc preview` draws the panel's frames with the very renderer a session uses, in a
# throwaway state folder, for named situations and terminal sizes, so its wording and
# layout can be looked at (and tested) without a Claude to run.

PREVIEW_GEOMETRIES = {"normal": (24, 80), "narrow": (24, 40), "20x5": (5, 20)}  # rows, columns
PREVIEW_FIXTURES = {
    "first-load": ("the panel as it first opens", b""),
    "config-fallback": ("first opening after a configuration file failed to load", b""),
    "autocompact": ("first opening of a launch given --autocompact", b""),
    "alarm": ("the standing alarm: rebuilt sessions are not loading", b""),
    "suggestions": ("a partial command typed: the names it could be", b"/s"),
    "unknown": ("an unknown command entered", b"/nope\r"),
    "help": ("/help", b"/help\r"),
    "status": ("/status", b"/status\r"),
    "details": ("/details", b"/details\r"),
}
PREVIEW_THREAD = "5e1ec7ed-0000-4000-8000-000000000001"
PREVIEW_SESSION = "5e55104e-0000-4000-8000-000000000002"


def preview_frame(fixture: str, geometry: str) -> bytes:
    """The bytes the panel writes for its last frame of ``fixture`` at ``geometry``."""
    import tempfile
    import types
    rows, cols = PREVIEW_GEOMETRIES[geometry]
    _what, keys = PREVIEW_FIXTURES[fixture]
    values, problems = dict(BUILTIN_POLICY), []
    if fixture == "config-fallback":
        problems = ["upperBoundTokens from ./.cc-lhc.json: not a whole number of tokens"]
    policy = Policy(values, {k: "builtin" for k in values}, problems)
    found = {"autocompact_arg": "--autocompact"} if fixture == "autocompact" else {}
    with tempfile.TemporaryDirectory(prefix="cc-lhc-preview-") as tmp:
        home = StateHome(tmp)
        home.ensure()
        ThreadStore(home, PREVIEW_THREAD).close()
        session = types.SimpleNamespace(
            home=home, policy=policy, descriptor=None, detached="", native_compacts=[], announced=[],
            alarms=[LiveHandoff.ALARM] if fixture == "alarm" else [],
            capture=types.SimpleNamespace(thread_id=PREVIEW_THREAD, session_id=PREVIEW_SESSION, lines=0),
            spec=types.SimpleNamespace(session_id=PREVIEW_SESSION, found=found, autocompact=bool(found),
                                       mod=None))
        host = types.SimpleNamespace(size=lambda: (rows, cols))
        panel = ControlPanel(session, host, None)
        panel.relay = Relay(-1, None, -1)
        panel.leaders = (b"\x1d",)
        panel.on_input(b"\x1d" + keys)
        data = bytes(panel.relay.to_user)
    return data[data.rfind(b"\x1b[H\x1b[2J"):]


def frame_text(data: bytes, rows: int, cols: int) -> list:
    """A frame as the rows a terminal of that size would show (the panel's own escapes:
    home, clear, cursor moves, CR and LF); the cursor's cell is marked with an underscore
    when it is blank."""
    grid = [[" "] * cols for _ in range(rows)]
    r = c = 0
    text = data.decode("utf-8", "replace")
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "\x1b":
            m = re.match(r"\x1b\[(\??)([0-9;]*)([A-Za-z])", text[i:])
            if m:
                if m.group(3) == "H" and not m.group(1):
                    nums = [int(x) for x in m.group(2).split(";") if x] or [1, 1]
                    r, c = max(0, min(rows - 1, nums[0] - 1)), max(0, min(cols - 1, (nums + [1])[1] - 1))
                elif m.group(3) == "J":
                    grid = [[" "] * cols for _ in range(rows)]
                i += m.end()
                continue
        elif ch == "\r":
            c = 0
        elif ch == "\n":
            r = min(rows - 1, r + 1)
        elif c < cols:
            grid[r][c] = ch
            if cell_width(ch) == 2 and c + 1 < cols:
                grid[r][c + 1] = ""  # the second cell of a wide character
            c += max(1, cell_width(ch))
        i += 1
    c = min(c, cols - 1)
    if grid[r][c] == " ":
        grid[r][c] = "_"
    return ["".join(row) for row in grid]


def cmd_preview(args) -> int:
    """The control panel's frames for named situations and sizes; never starts Claude."""
    raw = _take_flag(args, "--raw")
    listed = _take_flag(args, "--list")
    fixture = _take_option(args, "--fixture")
    geometry = _take_option(args, "--geometry")
    # a size names its geometry too: 80x24 is normal
    geometry = {f"{c}x{r}": name for name, (r, c) in PREVIEW_GEOMETRIES.items()}.get(geometry, geometry)
    _no_more(args, "preview")
    if listed:
        for name, (what, _keys) in PREVIEW_FIXTURES.items():
            print(f"fixture  {name:<16} {what}")
        for name, (rows, cols) in PREVIEW_GEOMETRIES.items():
            print(f"geometry {name:<16} {cols} columns, {rows} rows")
        return EXIT_OK
    for value, known, flag in ((fixture, PREVIEW_FIXTURES, "--fixture"), (geometry, PREVIEW_GEOMETRIES, "--geometry")):
        if value is not None and value not in known:
            raise usage_error(f"{flag} is one of {', '.join(known)} (cc-lhc preview --list)")
    if raw:
        if fixture is None or geometry is None:
            raise usage_error("--raw prints one frame: give --fixture and --geometry too")
        sys.stdout.flush()
        sys.stdout.buffer.write(preview_frame(fixture, geometry))
        sys.stdout.buffer.flush()
        return EXIT_OK
    out = []
    for f in [fixture] if fixture else list(PREVIEW_FIXTURES):
        for g in [geometry] if geometry else list(PREVIEW_GEOMETRIES):
            rows, cols = PREVIEW_GEOMETRIES[g]
            out.append(f"{f} at {g} ({cols}x{rows}): {PREVIEW_FIXTURES[f][0]}")
            out += ["+" + "-" * cols + "+"] + [f"|{line}|" for line in frame_text(preview_frame(f, g), rows, cols)] \
                + ["+" + "-" * cols + "+", ""]
    print("\n".join(out).rstrip("\n"))
    return EXIT_OK


def write_session_export(home, store, thread_id, policy, rollout, cwd, in_process=False) -> dict:
    """Copy the live transcript and dump the view Smart Compact would serve now.

    Everything goes to a new folder under exports/ (0700, files 0600), never into
    Claude's projects folder, so Claude can never pick a dump up as a session. The view
    is built exactly as a rebuild builds it (same policy, same envelope), but no
    rebuild is recorded and no session is made current. ``in_process``: the cc-lhc mod
    is active, so the view is the one it would install in the running Claude (naming its
    tools, carrying no file-state pairs: that Claude still knows what it read).
    """
    import time
    if not os.path.isfile(rollout):
        raise LhcError("nothing to export yet: Claude has not written this session's transcript "
                       "(it does with the first prompt)")
    # (planned first: a view that cannot be made leaves no half-written export behind)
    plan = plan_rebuild(home, store, thread_id, policy, new_session_id(), cwd, envelope_from=rollout,
                        native=in_process, sources=[] if in_process else None)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{thread_id[:8]}-{stamp}-{os.getpid()}"
    home.ensure("exports")
    for n in itertools.count(1):  # (two exports within a second: a folder each)
        folder = home.path("exports", base if n == 1 else f"{base}-{n}")
        try:
            os.mkdir(folder, 0o700)
            break
        except FileExistsError:
            continue
    paths = {"rollout": os.path.join(folder, "rollout.jsonl"),
             "view_jsonl": os.path.join(folder, "served-view.jsonl"),
             "view_markdown": os.path.join(folder, "served-view.md")}
    copy_private(rollout, paths["rollout"])
    write_atomic(paths["view_jsonl"], plan.data)
    write_atomic(paths["view_markdown"], served_view_markdown(plan.data, thread_id).encode("utf-8"))
    return paths


def copy_private(source: str, dest: str) -> None:
    """Copy a (possibly large, still growing) file to a new 0600 file, in chunks."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o600)
    with os.fdopen(fd, "wb") as out, open_regular(source) as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)


def served_view_markdown(data: bytes, thread_id: str) -> str:
    """A served view's transcript lines as markdown to read: one heading per record (pure)."""
    out = [f"# Served view of thread {thread_id}", ""]
    for raw in data.splitlines():
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(rec, dict) or rec.get("type") not in ("user", "assistant"):
            continue
        content = (rec.get("message") or {}).get("content")
        out.append(f"## {rec['type']}")
        out.append("")
        for block in ([{"type": "text", "text": content}] if isinstance(content, str) else content or []):
            out.append(_markdown_block(block))
            out.append("")
    return "\n".join(out)


def _markdown_block(block) -> str:
    if not isinstance(block, dict):
        return f"`{json.dumps(block, ensure_ascii=False)}`"
    kind = block.get("type")
    if kind == "text":
        return block.get("text") or ""
    if kind == "thinking":
        return "> (thinking) " + (block.get("thinking") or "").replace("\n", "\n> ")
    if kind == "tool_use":
        return (f"**tool call {block.get('name')}** (`{block.get('id')}`)\n\n```json\n"
                + json_as_written(block.get("input"), indent=2, ensure_ascii=False) + "\n```")
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            content = "\n".join(b.get("text", "") if isinstance(b, dict) else str(b) for b in content)
        err = " · error" if block.get("is_error") else ""
        return f"**tool result{err}** (`{block.get('tool_use_id')}`)\n\n```\n{content}\n```"
    return f"`{json.dumps(block, ensure_ascii=False)}`"


def autocompact_arg(spec) -> str:
    """The --autocompact argument the launch gave Claude, as written, or ""."""
    return (getattr(spec, "found", None) or {}).get("autocompact_arg", "")


LIFECYCLE_NOTES = {
    "clear": ("/clear starts a new conversation: this one stays in its cc-lhc thread, and cc-lhc "
              "follows the new one as a new thread"),
    "resume": ("in-app /resume moves Claude to another session: cc-lhc follows it when no other "
               "cc-lhc holds that session's thread, and otherwise stops serving this window"),
    "compact": ("/compact runs Claude's own summary: cc-lhc keeps every earlier turn word for word "
                "and records the summary as one turn"),
}
LIFECYCLE_LINE = re.compile(r"/(clear|resume|compact)(?:\s.*)?")


class LifecycleNotifier:
    """Advisory only: one line when a person submits /clear, /resume or /compact to Claude.

    It watches the keys on their way to Claude (it never changes or holds them) and keeps
    the line being typed. Only a line typed and submitted on its own counts: a paste
    (bracketed, or several lines at once), a cursor or completion key makes the line
    uncertain, and an uncertain line says nothing. Correctness never depends on it: the
    session follower notices from what Claude writes that it moved.
    """

    def __init__(self, announce):
        self.announce = announce
        self.line = ""
        self.uncertain = False
        self.pasting = False

    def observe(self, data: bytes) -> bytes:
        i, n = 0, len(data)
        while i < n:
            if data.startswith(b"\x1b[200~", i):
                self.pasting, i = True, i + 6
                continue
            if data.startswith(b"\x1b[201~", i):
                self.pasting, self.uncertain, i = False, True, i + 6
                continue
            b = data[i]
            if self.pasting:
                i += 1
            elif b == 0x1b:
                end, report = _escape_sequence(data, i)
                # A terminal's own reports (focus, device attributes, cursor position) are
                # not keys; arrows, history and the rest change the line out of our sight.
                self.uncertain = self.uncertain or not report
                i = end
            elif b in (0x0d, 0x0a):
                self._submitted(alone=(i == n - 1 and not self._several_lines(data)))
                i += 1
            elif b in (0x7f, 0x08):
                self.line, i = self.line[:-1], i + 1
            elif b in (0x03, 0x15):  # ctrl-c, ctrl-u: the line is gone
                self.line, self.uncertain, i = "", False, i + 1
            elif b < 0x20:
                self.uncertain, i = True, i + 1
            else:
                self.line, i = self.line + chr(b) if b < 0x80 else self.line + "\ufffd", i + 1
        return data

    @staticmethod
    def _several_lines(data: bytes) -> bool:
        """Line ends inside the chunk, not only at its end: text pasted without brackets.

        Keys typed quickly can arrive together with their Enter when the relay is busy,
        so that alone is no sign of a paste; several lines at once are.
        """
        return data.count(b"\r") + data.count(b"\n") > 1

    def _submitted(self, alone: bool) -> None:
        m = LIFECYCLE_LINE.fullmatch(self.line.strip()) if alone and not self.uncertain else None
        self.line, self.uncertain = "", False
        if m:
            self.announce(LIFECYCLE_NOTES[m.group(1)])


def _escape_sequence(data: bytes, i: int):
    """(index after the escape sequence at data[i], whether it is a terminal report)."""
    kind = data[i + 1:i + 2]
    if kind in (b"P", b"]", b"_", b"^"):  # DCS, OSC, APC, PM: up to ST or BEL
        for end, terminator in ((data.find(b"\x1b\\", i + 2), 2), (data.find(b"\x07", i + 2), 1)):
            if end >= 0:
                return end + terminator, True
        return len(data), True
    if kind == b"[":
        j = i + 2
        while j < len(data) and not 0x40 <= data[j] <= 0x7E:
            j += 1
        params, final = data[i + 2:j], data[j:j + 1]
        report = (final in (b"I", b"O") and not params) or final == b"R" \
            or (final == b"c" and params[:1] in (b"?", b">"))
        return j + 1, report
    return i + (3 if kind == b"O" else 2), False


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
        # TCSAFLUSH: drop input typed for the dead child instead of handing it to the shell.
        self._set(lambda termios, tty: termios.tcsetattr(self.fd, termios.TCSAFLUSH, self.saved))
        return False

    def suspend(self) -> None:
        """The terminal as it was, while cc-lhc is stopped (ctrl-z)."""
        self._set(lambda termios, tty: termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved))

    def resume(self) -> None:
        """Raw again once the shell hands the terminal back (fg)."""
        self._set(lambda termios, tty: tty.setraw(self.fd, termios.TCSANOW))

    def _set(self, change) -> None:
        if self.saved is None:
            return
        import termios
        import tty
        try:
            change(termios, tty)
        except (termios.error, OSError):
            pass  # the terminal is gone (its window closed): nothing is left to set


# == 14. Hosts: the managed interactive session and the one-shot ================


# The lines said before Claude started (the configuration fallback, a standing alarm) are
# written again over its screen once it has drawn its first one: when its output has been
# quiet for a moment, or at the latest this long after it started (a Claude loading MCP
# servers for long).
STARTUP_QUIET_SECONDS = 0.5
STARTUP_NOTICE_SECONDS = 20.0


def run_interactive(spec, home: StateHome) -> int:
    """Run Claude in a PTY on the user's terminal until it exits."""
    if os.name != "posix":
        return run_interactive_windows(spec, home)
    return InteractiveHost(spec, home).run()


class InteractiveHost:
    """The user's terminal, relayed to whichever Claude child currently owns it."""

    def __init__(self, spec, home):
        self.spec, self.home = spec, home
        self.in_fd, self.out_fd = sys.stdin.fileno(), sys.stdout.fileno()
        self.child = None
        self.watchdogs = []
        self.stopping = None  # the SIGTERM or SIGHUP that asked cc-lhc to stop, once one did

    def size(self):
        return terminal_size(self.out_fd) or terminal_size(self.in_fd) or (24, 80)

    def watch(self, pid):
        dog = start_watchdog(pid)
        if dog:
            self.watchdogs.append(dog)

    def suspend(self, terminal, set_child_size) -> None:
        """ctrl-z (see Relay.on_suspend): the terminal as the shell left it, Claude's process
        group stopped, this job stopped; on fg all of it back, at the terminal's size now."""
        pid = self.child.pid
        terminal.suspend()
        _signal_group(pid, signal.SIGSTOP)
        self.home.log("suspended", child_pid=pid)
        try:
            _stop_this_job()
        finally:
            terminal.resume()
            _signal_group(pid, signal.SIGCONT)
            size = terminal_size(self.out_fd)
            if size:
                set_child_size(*size)
            self.home.log("resumed", child_pid=pid)

    def run(self) -> int:
        try:
            import ptyprocess
        except ImportError:
            raise LhcError("interactive sessions need the ptyprocess package "
                           "(pip install ptyprocess==0.7.0)")
        spec, home = self.spec, self.home
        try:
            argv = spec.mod.argv(spec.child_argv) if spec.mod else spec.child_argv
            self.child = ptyprocess.PtyProcess.spawn(
                argv, cwd=spec.cwd, env=child_environment(spec), dimensions=self.size(),
                preexec_fn=_death_link_preexec(os.getpid()))
        except (OSError, FileNotFoundError) as e:
            raise LhcError(f"cannot start {spec.child_argv[0]}: {e}", EXIT_NOT_FOUND)
        self.child_since = utc_now_iso()  # (what this Claude process did itself is from then on)
        home.log("child_started", mode="interactive", child_pid=self.child.pid,
                 session=spec.session_id, argv=argv[1:])
        if spec.mod:
            spec.mod.expect(self.child.pid)
        if spec.after_spawn:
            spec.after_spawn()
        self.watch(self.child.pid)

        def on_signal(signum, relay):
            if signum in (signal.SIGTERM, signal.SIGHUP):
                # The user's terminal is going away or we were asked to stop: pass it on
                # and keep relaying until the child has said its last words (a swap under
                # way is given up: see LiveHandoff.on_tick).
                self.stopping = signum
                try:
                    self.child.kill(signum)
                except OSError:
                    pass

        resized = []  # what else follows the terminal's size (the swap's candidate, the panel)

        def set_child_size(rows, cols):
            self.child.setwinsize(rows, cols)
            for follow in resized:
                follow(rows, cols)

        relay = Relay(self.child.fd, self.in_fd if _readable(self.in_fd) else None, self.out_fd,
                      get_size=lambda: terminal_size(self.out_fd), set_child_size=set_child_size,
                      on_signal=on_signal)
        session = spec.session
        handoff = None
        if session is not None and session.control_r is not None:
            handoff = LiveHandoff(session, self)
            relay.readers["control"] = (session.control_r, handoff.on_request)
            relay.on_tick = handoff.on_tick
            panel = ControlPanel(session, self, handoff)
            panel.relay = relay
            resized += [handoff.resized, panel.resized]
            follower = SessionFollower(session, self, handoff)
            if spec.flags.get("--lhc-no-notifier"):
                relay.on_input = panel.on_input
            else:
                def advise(text):
                    # The mod answers a person's /compact itself and says so (InProcessCompact).
                    if not (text == LIFECYCLE_NOTES["compact"] and handoff.inproc.usable
                            and not session.policy["nativeCompact"]):
                        session.announce(text, relay)

                notifier = LifecycleNotifier(advise)

                def typed(data):
                    out = panel.on_input(data)
                    return out if relay.drop_input else notifier.observe(out)  # (dropped: never typed)
                relay.on_input = typed

            handoff.listen(relay)

            import time
            since = time.monotonic()

            def tick(relay):
                now = time.monotonic()
                drawn = relay.child_output_at is not None and now - relay.child_output_at >= STARTUP_QUIET_SECONDS
                if spec.said_at_start and (drawn or now - since >= STARTUP_NOTICE_SECONDS):
                    # Claude has drawn its first screen (and gone quiet) over what was said
                    # before it started
                    for text in spec.said_at_start:
                        session.said_before.add(text)  # (on the terminal already: not again at exit)
                        session.announce(text, relay)
                    spec.said_at_start = []
                handoff.on_tick(relay)
                panel.on_tick(relay)
                if spec.mod and handoff.candidate is None:
                    moved = spec.mod.on_tick(session, self.child.pid)
                    if moved:  # the mod saw Claude start another session in this process
                        follower.take(relay, moved)
                follower.on_tick(relay)
                relay.timeout = tick_seconds(panel, handoff, spec.mod, relay.child_output_at, now)

            relay.on_tick = tick
            relay.timeout = SessionFollower.POLL_SECONDS
        try:
            with RawTerminal(self.in_fd) as terminal:
                if terminal.saved is not None and os.name == "posix":
                    relay.on_suspend = lambda _relay: self.suspend(terminal, set_child_size)
                try:
                    relay.run()
                finally:
                    relay.restore_modes()
        finally:
            if handoff is not None and handoff.candidate is not None:
                handoff._fail(relay, "the session ended during the handoff")
            if handoff is not None:
                handoff.inproc.close()
            status = _reap(self.child)
            if handoff is not None:
                handoff.carry.close()
            for dog in self.watchdogs:
                dog.kill()
        home.log("child_exited", mode="interactive", child_pid=self.child.pid, status=status)
        return status


def _signal_group(pid, signum) -> None:
    try:
        os.killpg(pid, signum)
    except OSError:
        pass  # gone already


def _stop_this_job() -> None:
    """Stop this process's job as ctrl-z in a shell does; returns once it is continued (at
    once where nothing does job control: there the stop is discarded)."""
    previous = signal.signal(signal.SIGTSTP, signal.SIG_DFL)
    try:
        os.killpg(os.getpgrp(), signal.SIGTSTP)
    finally:
        signal.signal(signal.SIGTSTP, previous)


def _readable(fd) -> bool:
    if fd in CLOSED_AT_START:
        return False
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
    child.delayafterclose = 0  # already reaped: ptyprocess would sleep 0.1 s on every exit
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
    job = tie_to_wrapper_windows(child.pid)  # noqa: F841 - held for our lifetime
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


def run_host(spec, home) -> int:
    return run_oneshot(spec, home) if spec.print_mode else run_interactive(spec, home)


WAY_BACK = ("to go on with this conversation under cc-lhc: cc-lhc --resume {session} (or cc-lhc -c in "
            "this folder); `claude --resume` goes on without cc-lhc's record and Smart Compact")


class ManagedSession:
    """Everything around one Claude child on a thread, set up before it and settled after.

    Before: Smart Compact when a resumed session is over the trigger, the retrieval
    descriptor and shim, live capture, background summaries. After, whatever happened
    to the child: the last lines captured, the pressure it ended at, the rebuild's
    acceptance settled, the descriptor removed, and the thread's lease handed back last.
    """

    ON_SCREEN_SECONDS = 5.0  # how long a line written over Claude's screen is written again with a newer one

    def __init__(self, spec, home, policy, capture):
        self.spec, self.home, self.policy, self.capture = spec, home, policy, capture
        self.hostdb = HostDB(home)
        self.pending = self.descriptor = self.worker = None
        self.kept_notes = None  # (files, first note) of notes a one-shot's prompt carries
        self.control_r = self.control_w = None  # the capture thread asks for a live handoff here
        self.survivors, self.alarms, self.notices = [], [], []
        self.announced = []               # lines shown on the terminal as they happened
        self.said_no_room = set()         # (thread, budget) with no room for a turn, said once each
        self.left_sessions = []           # (thread, session) this Claude process was on before it moved
        self.said_before = set()          # of those, lines also said before Claude started
        self._to_show = collections.deque()  # lines waiting for the relay (any thread adds)
        self.on_screen = collections.deque(maxlen=6)  # (when, line) written over Claude's screen lately
        self.overlay_until = None  # when the lines written over Claude's screen have had their time
        self.overlay_drawn_at = None  # when they were last written
        self.detached = ""                # why cc-lhc no longer follows this Claude, if so
        self.native_compacts = []         # (turn, when) of each Claude native Compact seen
        self.views_replayed = []          # newest seq when capture saw a view served in process
        # Turn summaries are written in the background while a person works; a one-shot
        # exits too soon for them and keeps its one prompt's cost predictable.
        self.summaries = not spec.print_mode and not env_off("CC_LHC_SUMMARIES")
        self.too_long = None              # (turn, tool calls that ran) of the newest rejection
        self.too_long_handled = set()
        self.continued = False            # the one automatic continuation has been used
        self.thinking_refused = ""        # the rebuilt session whose thinking the API refused
        spec.session = self

    def __enter__(self):
        spec, home = self.spec, self.home
        try:
            remove_stale_descriptors(home, self.hostdb)
            if spec.resume:
                self.capture, self.pending = smart_compact_before_launch(spec, home, self.policy,
                                                                         self.capture)
            self.descriptor = create_descriptor(home, self.hostdb, self.capture.thread_id,
                                                spec.session_id)
            spec.extra_env[RUNTIME_ENV] = self.descriptor["path"]
            spec.extra_env["PATH"] = self.descriptor["shim_dir"] + os.pathsep + os.environ.get("PATH", "")
            spec.child_argv[1:1] = retrieval_allow_args()
            if not spec.print_mode:
                self.control_r, self.control_w = os.pipe()
                os.set_blocking(self.control_r, False)
                os.set_blocking(self.control_w, False)
                self.capture.request_handoff = self.request_handoff
            self.capture.start()
            if spec.print_mode:
                self.kept_notes = give_kept_notes_to_prompt(spec, home, self.capture.thread_id)
            if self.pending:
                spec.after_spawn = lambda: failpoint("after-spawn")
            if self.summaries:
                self.worker = DerivationWorker(home, self.capture.thread_id).start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *_exc):
        spec, home, capture = self.spec, self.home, self.capture
        self._each_step(
            ("worker", lambda: self.worker and self.worker.stop()),
            ("capture", lambda: finish_capture(capture, spec, home, at_exit=True)),
            ("counts ahead", lambda: finish_counting_ahead(home)),
            ("pressure", lambda: spec.print_mode or report_pressure_at_exit(capture, spec, home,
                                                                             self.policy)),
            ("acceptance", self._settle),
            ("continued elsewhere", self._continued_elsewhere),
            ("way back", self._way_back),
            ("kept notes", self._kept_notes_told),
            ("descriptor", lambda: self.descriptor and remove_descriptor(
                home, self.hostdb, self.descriptor, "session ended")),
            ("notices", self._last_words),
            ("control pipe", self._close_control),
            ("empty thread", lambda: forget_empty_thread(spec, home, self.hostdb, capture.lease)),
            ("lease", lambda: capture.lease and capture.lease.release()))
        return False

    def _each_step(self, *steps) -> None:
        """Run every cleanup step even when an earlier one fails (a dead terminal, a full
        disk): a skipped step would leave a live descriptor or an unsettled rebuild.
        An interrupt is passed on once all steps have run."""
        interrupted = None
        for name, step in steps:
            try:
                step()
            except Exception as e:
                try:
                    self.home.log("cleanup_step_failed", step=name, error=repr(e))
                except Exception:
                    pass  # the log is one more thing that can be gone; the next step still runs
            except BaseException as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted

    def _kept_notes_told(self) -> None:
        """The notes a one-shot's prompt carried are told once the thread holds that prompt."""
        if not self.kept_notes:
            return
        files, first = self.kept_notes
        store = ThreadStore(self.home, self.capture.thread_id)
        try:
            told = store.db.execute("SELECT 1 FROM messages WHERE kind = 'user_text' AND agent IS NULL "
                                    "AND instr(text, ?) > 0 LIMIT 1", (first,)).fetchone()
        finally:
            store.close()
        if not told:
            return  # (Claude never took the prompt: the next launch gives them again)
        for path in files:
            try:
                os.unlink(path)
            except OSError:
                pass
        self.home.log("kept_notes_told", thread=self.capture.thread_id, mode="oneshot")

    def _settle(self) -> None:
        if not self.pending:
            return
        try:
            accept(self.home, self.capture.thread_id, self.pending)
        except Exception as e:  # Claude's own status must still come back
            say(f"could not settle the rebuilt session ({e}); it stays pending and "
                "the next launch of this thread settles it")
            self.home.log("settle_failed", thread=self.capture.thread_id, error=repr(e))

    def _continued_elsewhere(self) -> None:
        """"Move to background and exit" in Claude's exit dialog: a Claude daemon goes on with
        the conversation in a session of its own (the transcript's last `continued-in`
        record names it), where cc-lhc neither captures nor compacts it. Said, with the way
        back."""
        moved = continued_in(self.capture.path)
        if not moved:
            return
        self.home.log("continued_in_background", thread=self.capture.thread_id,
                      session=self.capture.session_id, continued_in=moved)
        self.notices.append(
            f"Claude went on with this conversation in the background, as session {moved} "
            f"(`claude agents` lists it); cc-lhc does not capture or Smart Compact it there, and "
            f"Claude's own compaction is off in it. Once it is done, `cc-lhc --resume {moved}` "
            "takes it up again under cc-lhc.")

    def _way_back(self) -> None:
        """Claude's own last line names `claude --resume <session>`, which would go on without
        cc-lhc: the way back through cc-lhc is said after it (an interactive session that
        holds a turn, and went on nowhere else)."""
        if self.spec.print_mode or self.detached or any("cc-lhc --resume" in n for n in self.notices):
            return
        store = ThreadStore(self.home, self.capture.thread_id)
        try:
            held = store.db.execute("SELECT 1 FROM messages WHERE agent IS NULL LIMIT 1").fetchone()
        finally:
            store.close()
        if held:
            self.notices.append(WAY_BACK.format(session=self.capture.session_id))

    def _last_words(self) -> None:
        # What was shown inside Claude's screen is said again once the terminal is the
        # user's own, where it stays readable (each line once).
        for line in dict.fromkeys(self.notices + self.alarms + self.announced):
            if line not in self.said_before:
                say(line)

    def _close_control(self) -> None:
        for fd in (self.control_r, self.control_w):
            if fd is not None:
                os.close(fd)
        self.control_r = self.control_w = None

    def announce(self, text: str, relay=None) -> None:
        """Tell the person now, on their terminal: from the relay's thread or any other."""
        self.home.log("notice", text=text)
        if self.control_w is None:  # a one-shot: stderr is the user's
            say(text)
            return
        self._to_show.append(text)
        if relay is not None:
            self.show_notices(relay)
            return
        try:
            os.write(self.control_w, b"n")
        except (BlockingIOError, OSError):
            pass

    def show_notices(self, relay, again=False) -> None:
        """On the relay's thread: write waiting notices as their own lines (``again``: the
        recent ones once more, over a screen Claude drew anew)."""
        import time
        now, fresh = time.monotonic(), again
        while self._to_show:
            text = self._to_show.popleft()
            self.announced.append(text)
            self.on_screen.append((now, text))
            fresh = True
        if fresh:
            relay.to_user += self._recent_lines(now, relay.get_size() if relay.get_size else None)

    def _recent_lines(self, now, size) -> bytes:
        """The lines of the last few seconds written together, each over its own rows: a
        second line a moment later does not write over the first."""
        while self.on_screen and now - self.on_screen[0][0] > self.ON_SCREEN_SECONDS:
            self.on_screen.popleft()
        if self.on_screen:
            self.overlay_until = now + self.ON_SCREEN_SECONDS
            self.overlay_drawn_at = now
        return overlay_lines([text for _at, text in self.on_screen], size)

    def overlay_cleared(self, relay) -> bool:
        """Once per clear: whether Claude cleared its whole screen (its late first frame, say)
        after cc-lhc's lines were written, while they still have time to stand."""
        cleared_at = relay.child_cleared_at
        if cleared_at is None or self.overlay_until is None or self.overlay_drawn_at is None \
                or cleared_at <= self.overlay_drawn_at:
            return False
        self.overlay_drawn_at = cleared_at
        return True

    def overlay_done(self, now) -> bool:
        """Once, when the lines written over Claude's screen have had their time: Claude
        redraws only the cells it changes, so what is left of them stays mixed into its
        own rows until it draws its whole screen again."""
        if self.overlay_until is None or now < self.overlay_until:
            return False
        self.overlay_until = None
        return True

    def shown_in_frame(self, text, size) -> bytes:
        """A line the caller writes in a frame of its own (a swap's first one), as
        show_notices writes one: kept with the recent ones, so a line said a moment later
        (what the swap carried) is written together with it, not over it."""
        import time
        now = time.monotonic()
        self.announced.append(text)
        self.on_screen.append((now, text))
        return self._recent_lines(now, size)

    def wake(self) -> None:
        """From another thread: have the relay tick now rather than at its next timeout."""
        try:
            os.write(self.control_w, b"w")
        except (BlockingIOError, OSError, TypeError):
            pass  # a wake-up is already waiting, or the session is closing

    def request_handoff(self, too_long=None, prune=False, thinking="") -> None:
        """Called on the capture thread: wake the relay to run a live handoff (Smart
        Prune's when ``prune``; a rebuild without thinking when the API refused the
        thinking replayed into session ``thinking``)."""
        if too_long is not None:
            self.too_long = too_long
        if thinking:
            self.thinking_refused = thinking
        what = b"t" if too_long is not None else b"k" if thinking else b"p" if prune else b"h"
        try:
            os.write(self.control_w, what)
        except (BlockingIOError, OSError, TypeError):
            pass  # already asked, or the session is closing


def standing_alarms(home, thread_id, raised=()) -> list:
    """Alarms raised in this process, and the thread's standing one from any earlier process."""
    alarms = list(raised)
    try:
        row = Registry(home).db.execute("SELECT message FROM thread_alarms WHERE thread_id = ?",
                                        (thread_id,)).fetchone()
    except Exception:  # a status line must never fail over the registry
        row = None
    if row and row[0] not in alarms:
        alarms.append(row[0])
    return alarms


def survivor_note(pid: int) -> str:
    return (f"an earlier Claude process (pid {pid}) did not exit when it was replaced; "
            "it is still running")


def finish_capture(capture, spec, home, at_exit=False):
    """Read Claude's last lines into the record before cc-lhc exits (or leaves the session).

    A last line Claude left without its newline (killed while writing it), in the session's
    file or a subagent's, is then mended as the next resume would mend it: a whole record
    gets its newline and is read in, a cut-off fragment is kept in the thread
    (keep_cut_line) and trimmed. Otherwise a session never resumed would keep its last
    record out of the thread for good. ``at_exit``: Claude has ended and the terminal is
    cc-lhc's own again, so a wait for another process's lock on the thread is said.
    """
    if at_exit:  # (the last reads wait for such a lock, up to half a minute each)
        say_if_thread_busy(home, capture.thread_id, "to take in Claude's last lines")
    try:
        capture.stop()
        # The session's own file and its subagents' files alike (a background agent killed
        # with Claude leaves its last line as torn as Claude's own).
        files = [(capture.session_id, capture.path)] + [(key, path) for key, path, *_ in capture.agent_files()]
        mended = [repair_torn_tail(path, home, key, keep_cut_line(home, capture.thread_id, key, path))
                  for key, path in files]
        if "newline" in mended:
            capture.stop()  # (a second stop is one more catch-up)
    except Exception as e:  # the session already ended well; say what was not captured
        say(f"capture of session {capture.session_id} did not finish: {e}")
        home.log("capture_error", thread=capture.thread_id, error=repr(e))
        return
    # The capture's own session: after a swap spec already names the next one.
    home.log("capture_done", thread=capture.thread_id, session=capture.session_id, lines=capture.lines)


def forget_empty_thread(spec, home, hostdb, lease) -> None:
    """The thread this launch made, removed again when Claude never wrote its session
    (it refused its arguments, say, or was left before the first prompt): nothing was
    captured and there is nothing Claude could resume, so it would only be an empty row
    in `cc-lhc threads`. A fork cc-lhc wrote goes the same way, with the session it
    wrote, when Claude never added to it. After capture has finished, and only under the
    thread's lease (``lease`` is the capture's, which names another thread after an
    in-app /resume). A launch killed before this step leaves the thread's mark in
    recovery/, and the next launch anywhere does it (sweep_new_threads)."""
    if spec.new_thread is None:
        return
    if _drop_if_empty(home, hostdb, lease, *spec.new_thread):
        _unmark_new_thread(home, spec.new_thread[0])


NEW_THREAD_MARK = "new-thread-{}.json"  # in recovery/: a thread a launch made and has not yet looked at again


def mark_new_thread(home, new_thread) -> None:
    """Note, before Claude starts, the thread this launch made (see forget_empty_thread)."""
    thread, session, path, written = new_thread
    try:
        home.ensure("recovery")
        _write_private_json(home.path("recovery", NEW_THREAD_MARK.format(thread)),
                            {"thread": thread, "session": session, "path": path, "written": written})
    except OSError:
        pass  # (only a later sweep is lost: the thread itself is sound)


def _unmark_new_thread(home, thread) -> None:
    try:
        os.unlink(home.path("recovery", NEW_THREAD_MARK.format(thread)))
    except OSError:
        pass


def sweep_new_threads(home, hostdb) -> None:
    """The threads launches made and were killed before looking at again (a SIGKILL before
    Claude wrote its session): each removed when it holds nothing, else kept; one another
    launch holds is left to it."""
    folder = home.path("recovery")
    try:
        names = [n for n in os.listdir(folder) if n.startswith("new-thread-") and n.endswith(".json")]
    except OSError:
        return
    for name in names:
        try:
            mark = load_json(read_small_file(os.path.join(folder, name), DESCRIPTOR_FILE_LIMIT))
            new_thread = tuple(mark[k] for k in ("thread", "session", "path", "written"))
            if not (is_uuid(new_thread[0]) and name == NEW_THREAD_MARK.format(new_thread[0])
                    and isinstance(new_thread[2], str) and isinstance(new_thread[3], (int, type(None)))):
                raise ValueError(name)
        except (OSError, ValueError, KeyError, TypeError, LhcError):
            continue  # (not one this version wrote: left as it is)
        lease = Lease(home, new_thread[0])
        if not lease.try_acquire():
            continue  # its launch still runs
        try:
            if _drop_if_empty(home, hostdb, lease, *new_thread):
                _unmark_new_thread(home, new_thread[0])
        except LhcError:
            continue  # (a thread file that cannot be read is doctor's to name)
        finally:
            lease.release()


def _drop_if_empty(home, hostdb, lease, thread, session, path, written) -> bool:
    """forget_empty_thread's work on one thread; False when another holds it (undecided)."""
    if not Registry(home).db.execute("SELECT 1 FROM threads WHERE id = ?", (thread,)).fetchone():
        return True  # (gone already)
    if written is None and (os.path.lexists(path) or transcript_elsewhere(path)):
        return True
    if written is not None and not _unopened(path, written):
        return True  # Claude wrote into the fork: it is a session now
    own = None
    if lease is None or lease.thread_id != thread:
        own = Lease(home, thread)
        if not own.try_acquire():
            return False  # someone holds it now: it is theirs
    try:
        store = ThreadStore.existing(home, thread)
        try:
            # (a fork's copied record is the source's: only what came from its own session counts)
            kept = store.db.execute(
                "SELECT (SELECT count(*) FROM messages WHERE ?1 IS NULL OR source_session = ?2) "
                "+ (SELECT count(*) FROM raw_lines WHERE ?1 IS NULL OR session = ?2) "
                "+ (SELECT count(*) FROM problems WHERE ?1 IS NULL OR session = ?2) "
                "+ (SELECT count(*) FROM turns WHERE ?1 IS NULL)", (written, session)).fetchone()[0]
        finally:
            store.close()
        registry = Registry(home)
        if kept or registry.db.execute("SELECT count(*) FROM aliases WHERE thread_id = ?",
                                       (thread,)).fetchone()[0] != 1:
            return True  # it recorded something, or took another session (a rebuild)
        discard_thread(home, registry, hostdb, thread, session)
        (own or lease).forget()  # (the lease's lock file goes with the thread)
        home.log("empty_thread_dropped", thread=thread, session=session,
                 reason=f"Claude never wrote {path}")
        return True
    finally:
        if own is not None:
            own.release()


def _unopened(path, written) -> bool:
    """Whether a session cc-lhc wrote (``written`` bytes) still holds only those."""
    try:
        return os.path.getsize(path) == written
    except OSError:
        return False


def discard_thread(home, registry, hostdb, thread_id, session) -> None:
    """Remove a thread that holds nothing of its own, under its lease: its registry rows
    and file, its session's row in cc-lhc.sqlite, and the transcript cc-lhc wrote for that
    session when Claude never opened it."""
    known = hostdb.session(session) if session else None
    known = known if known and known["thread_id"] == thread_id else None
    registry.drop_thread(thread_id)
    if known and known["rollout_path"] and known["replayed_prefix_bytes"] \
            and _unopened(known["rollout_path"], known["replayed_prefix_bytes"]):
        os.unlink(known["rollout_path"])
    if session:
        with Tx(hostdb.db) as db:
            db.execute("DELETE FROM sessions WHERE session_id = ? AND thread_id = ?", (session, thread_id))


TOO_LONG = re.compile(r"too long", re.I)


def rejected_too_long(store, session_id=None):
    """The newest turn, when the API rejected it as too long: (turn, tool calls that ran).
    With ``session_id``, only a rejection on that session (a rebuild since has answered it)."""
    row = store.db.execute("SELECT n, status FROM turns ORDER BY n DESC LIMIT 1").fetchone()
    if not row or row[1] == "open":
        return None
    last = store.db.execute("SELECT kind, text, source_session FROM messages WHERE turn = ? AND agent IS NULL "
                            "ORDER BY seq DESC LIMIT 1", (row[0],)).fetchone()
    if not last or last[0] != "api_error" or not TOO_LONG.search(last[1] or ""):
        return None
    if session_id is not None and last[2] != session_id:
        return None
    ran = [f"{name} m{seq}" for seq, name in store.db.execute(
        "SELECT c.seq, c.tool_name FROM messages c WHERE c.turn = ? AND c.kind = 'tool_call' AND "
        "c.agent IS NULL AND EXISTS "
        "(SELECT 1 FROM messages r WHERE r.kind = 'tool_result' AND r.tool_use_id = c.tool_use_id) "
        "ORDER BY c.seq", (row[0],))]
    return row[0], ran


# What the API says when a replayed thinking block does not match the history it is
# now sent over ("Invalid `signature` in `thinking` block", "thinking blocks ... cannot
# be modified"): a 400 invalid_request_error naming thinking or its signature.
THINKING_REFUSAL = re.compile(r"(?=.*\b(?:400|invalid_request_error)\b)(?=.*\b(?:thinking|signature)\b)",
                              re.I | re.S)


def thinking_refused(home, hostdb, store, policy) -> str:
    """The rebuilt session whose first request the API refused over replayed thinking, or ''.

    Only a rebuild cc-lhc wrote (it has a replayed prefix) that never got an answer
    counts, and only while the thread still replays thinking: once it rebuilt with
    `omit`, a refusal has some other cause and is not rebuilt again.
    """
    if thinking_arm(store, policy) == "omit":
        return ""
    row = store.db.execute("SELECT n, status FROM turns ORDER BY n DESC LIMIT 1").fetchone()
    if not row or row[1] == "open":
        return ""
    last = store.db.execute("SELECT kind, text, source_session FROM messages WHERE turn = ? AND "
                            "agent IS NULL ORDER BY seq DESC LIMIT 1", (row[0],)).fetchone()
    if not last or last[0] != "api_error" or not THINKING_REFUSAL.search(last[1] or ""):
        return ""
    known = hostdb.session(last[2])
    # Claude gives its own error notice a synthetic usage of zeros: that is no answer.
    answered = store.db.execute("SELECT 1 FROM usage WHERE source_session = ? AND "
                                "coalesce(model, '') != '<synthetic>' LIMIT 1", (last[2],)).fetchone()
    return last[2] if known and known["replayed_prefix_bytes"] and not answered else ""


def classify_live(capture, home, policy) -> dict:
    """Classify a running session after each new response, and receipt it once.

    Runs on the capture thread, on its own connections. At a settled seam over the
    trigger, or after the API rejected a turn as too long, it asks the host for a live
    handoff; the host decides on its own thread.
    """
    if capture.hostdb is None:
        capture.hostdb = HostDB(home)
    a = assess(home, capture.hostdb, capture.store, capture.thread_id, capture.session_id, policy)
    rejected = rejected_too_long(capture.store)
    refused = thinking_refused(home, capture.hostdb, capture.store, policy) \
        if capture.request_handoff is not None else ""
    if refused:
        _set_meta(capture.store, THINKING_KEY, "omit")
        a.outcome("thinking refusal: live rebuild with omit requested")
        home.log("thinking_refused", thread=capture.thread_id, session=refused)
        capture.request_handoff(thinking=refused)
    elif rejected is not None and capture.request_handoff is not None:
        a.outcome("too-long rejection: live handoff requested")
        home.log("too_long_rejection", thread=capture.thread_id, turn=rejected[0], ran=rejected[1])
        capture.request_handoff(too_long=rejected)
    elif a.go and capture.request_handoff is not None:
        a.outcome("live handoff requested")
        home.log("governor", thread=capture.thread_id, session=capture.session_id, **a.c)
        capture.request_handoff()
    elif a.c["state"] in (STATE_OVER_OPEN, STATE_OVER_SETTLED):
        home.log("governor", thread=capture.thread_id, session=capture.session_id, **a.c)
    elif automatic_prune_due(policy, a.c) and capture.request_handoff is not None:
        p = assess(home, capture.hostdb, capture.store, capture.thread_id, capture.session_id,
                   policy, prune=True)
        if p.go:
            p.outcome("live prune requested")
            home.log("governor", thread=capture.thread_id, session=capture.session_id,
                     operation="prune", **p.c)
            capture.request_handoff(prune=True)
    return a.c


# How long a session's end waits for the counts made ahead of its seams (TokenCounter.
# count_ahead) to be done: then they are kept for the next launch, not left half made.
COUNT_AHEAD_EXIT_SECONDS = 2.0


def finish_counting_ahead(home) -> None:
    """At a session's end: let the counting ahead finish (bounded), and say if it failed."""
    if not TOKENS.drain_ahead(COUNT_AHEAD_EXIT_SECONDS):
        home.log("count_ahead_unfinished", waited=COUNT_AHEAD_EXIT_SECONDS)
    if TOKENS.ahead_error is not None:
        home.log("count_ahead_failed", error=repr(TOKENS.ahead_error))


def report_pressure_at_exit(capture, spec, home, policy) -> None:
    """After an interactive session: receipt its pressure, and say if it ended over the trigger.

    A session can end over the trigger without a swap (its last seam came with background
    work open, replacements would not load, or the seam was never settled); the user
    should know the next resume runs Smart Compact before Claude starts.
    """
    try:
        store = ThreadStore(home, capture.thread_id)
        try:
            a = assess(home, HostDB(home), store, capture.thread_id, spec.session_id, policy)
        finally:
            store.close()
    except LhcError as e:
        home.log("exit_reading_failed", thread=capture.thread_id, error=str(e))
        return
    c = a.c
    if c["pressure"] is not None and c["pressure"] >= c["trigger"]:
        a.outcome("deferred: runs before the next resume")
        say(f"this session ended over the Smart Compact trigger ({describe_reading(c)}); "
            f"`cc-lhc --resume {spec.session_id}` rebuilds it before Claude starts")


ONESHOT_INTERRUPT_GRACE_SECONDS = 1.0


def run_oneshot(spec, home: StateHome) -> int:
    """Run `claude -p` as a plain child sharing our stdin, stdout and stderr."""
    import subprocess
    kwargs = {}
    if os.name == "posix":
        kwargs["preexec_fn"] = _death_link_preexec(os.getpid())
    started = []  # the child, once it runs
    early = []    # signals that came before it did: passed on once it runs

    def forward(signum, _frame):
        if not started:
            early.append(signum)
            return
        if os.name == "nt":
            close_tree_windows(started[0].pid)
            return
        try:
            started[0].send_signal(signum)
        except OSError:
            pass

    def interrupted(signum, _frame):
        # ctrl-c reaches Claude through the shared process group and Claude decides what it
        # means; a SIGINT sent to cc-lhc alone (kill -INT <pid>, a supervisor) would not.
        # So it is passed on if Claude is still running a moment later, which it is not
        # once it took the first: it never gets a second one in the middle of its exit.
        if not started:
            early.append(signum)
            return
        import threading
        child = started[0]

        def late():
            if child.poll() is None:
                try:
                    child.send_signal(signal.SIGINT)
                except OSError:
                    pass
        timer = threading.Timer(ONESHOT_INTERRUPT_GRACE_SECONDS, late)
        timer.daemon = True
        timer.start()

    # The handlers are in place before Claude starts: a signal in between would otherwise
    # end cc-lhc (KeyboardInterrupt) with Claude still running, or be lost.
    previous = {signal.SIGINT: signal.signal(
        signal.SIGINT, interrupted if os.name == "posix" else signal.SIG_IGN)}
    for s in (signal.SIGTERM, getattr(signal, "SIGHUP", None), getattr(signal, "SIGBREAK", None)):
        if s is not None:
            previous[s] = signal.signal(s, forward)

    def restore():
        for s, handler in previous.items():
            signal.signal(s, handler)
    try:
        env = child_environment(spec)
        if early:
            # Stopped before Claude ran: nothing to pass the signal on to, so Claude is
            # not started at all, and the status is the signal's as if it had been.
            restore()
            home.log("child_not_started", mode="oneshot", signal=early[0])
            return 128 + early[0]
        child = subprocess.Popen(spec.child_argv, cwd=spec.cwd, env=env, **kwargs)
    except OSError as e:
        restore()
        raise LhcError(f"cannot start {spec.child_argv[0]}: {e}", EXIT_NOT_FOUND)
    except BaseException:
        restore()
        raise
    started.append(child)
    for signum in early:
        (interrupted if signum == signal.SIGINT else forward)(signum, None)
    home.log("child_started", mode="oneshot", child_pid=child.pid, session=spec.session_id,
             argv=spec.child_argv[1:])
    watchdog = job = None
    try:
        if spec.after_spawn:
            spec.after_spawn()
        watchdog = start_watchdog(child.pid)
        job = tie_to_wrapper_windows(child.pid) if os.name == "nt" else None
        returncode = child.wait()
    finally:
        restore()
        if watchdog:
            watchdog.kill()
    del job  # the job handle lived as long as we waited; Claude has exited by now
    status = 128 - returncode if returncode < 0 else returncode
    home.log("child_exited", mode="oneshot", child_pid=child.pid, status=status)
    return status


def with_resume(args, found, session_id, also=()):
    """Claude's argv with its own session selectors (and the spans ``also`` names, as
    (index, count)) replaced by --resume <session_id>."""
    drop = set()
    for i, n in [*found.get("selectors", ()), *also]:
        drop.update(range(i, i + n))
    return ["--resume", session_id] + [a for j, a in enumerate(args) if j not in drop]


def _session_rollout(hostdb, session_id, cwd):
    known = hostdb.session(session_id)
    if known and known["rollout_path"]:
        return known["rollout_path"]
    return rollout_path(session_id, cwd)


def _resume_session(spec, session_id):
    """Point the launch at session_id; a fork keeps writing its own new session."""
    spec.resume = session_id
    spec.continue_ = spec.resume_picker = False
    if spec.fork:
        spec.child_argv = ([spec.child_argv[0], "--session-id", spec.session_id]
                           + with_resume(spec.claude_args, spec.found, session_id))
        return
    spec.session_id = session_id
    spec.assigned_session = False
    spec.child_argv = [spec.child_argv[0]] + with_resume(spec.claude_args, spec.found, session_id)


def attach_thread(spec, home, policy):
    """Resolve this launch's session to a thread, own it, and prepare its capture.

    A fresh session gets a new thread; --resume of a session seen before lands on
    its thread's current session (read again under the thread's lease); --resume of
    a session never seen adopts its whole transcript; --continue and bare --resume
    are resolved here, before spawn. Interrupted Smart Compacts of the thread are
    settled before anything else touches it.
    """
    unmanaged = ((MSG_UNGOVERNED, "--no-session-persistence: Claude writes no transcript")
                 if spec.found.get("no_persistence") else
                 (MSG_BACKGROUND, "--bg: Claude's background daemon runs the session")
                 if spec.found.get("background") else None)
    if unmanaged:
        # No transcript (or one only Claude's daemon writes, after this launch ends) means
        # nothing to capture or rebuild from, so cc-lhc must not also switch off Claude's own
        # compaction: the session would then have none at all.
        spec.governed = False
        say(unmanaged[0])
        home.log("capture_off", reason=unmanaged[1])
        return None
    registry, hostdb = Registry(home), HostDB(home)
    sweep_unfinished_forks(home, registry, hostdb)
    sweep_new_threads(home, hostdb)
    if spec.continue_:
        target = continue_target(spec, registry, hostdb)
        if target is None and (spec.fork or not spec.print_mode or spec.piped_input):
            return None  # nothing to continue here: Claude says so itself
        if target is None:
            # With nothing to continue, `claude -p -c` starts a new conversation: this
            # launch does too, as a fresh one cc-lhc captures (the session id its own).
            spec.continue_, spec.session_id, spec.assigned_session = False, new_session_id(), True
            spec.child_argv = ([spec.child_argv[0], "--session-id", spec.session_id]
                               + with_resume(spec.claude_args, spec.found, spec.session_id)[2:])
        else:
            _resume_session(spec, target)
    elif spec.resume_picker:
        term = spec.found.get("resume")
        named = (session_named(term, spec.cwd, registry.thread_for_session)
                 if isinstance(term, str) and term.strip() else None)
        _resume_session(spec, named or pick_thread_session(spec, registry, hostdb))
    origin = "fresh"
    lease = None
    if spec.fork and spec.resume:
        # A fork starts a new session as a copy of the source: a thread of its own. Claude
        # copies the transcript and capture adopts it, unless that copy would not be the
        # whole thread or would start over the trigger (then fork_thread writes it). The
        # source's thread is only read, never changed.
        source = registry.thread_for_session(spec.resume)
        current = registry.current_session(source) if source else None
        if current and current != spec.resume:  # (said, as a resume of such a session says it)
            say(f"session {spec.resume} is not thread {source[:8]}'s current session (that is {current}); "
                "the fork holds the thread as it was on that session: its turns, not those the thread "
                "took in after it")
        if source is not None:
            capture = fork_thread(spec, home, policy, registry, hostdb, source)
            if capture is not None:
                return capture
        current = registry.current_session(source) if source else None
        if current and current != spec.resume:
            _resume_session(spec, current)
        spec.resume = None
    adopted_at = None
    if spec.resume:
        thread = registry.thread_for_session(spec.resume)
        if thread is None:
            refuse_running_session(spec.resume)  # (one cc-lhc knows is refused by its lease, below)
            path = _session_rollout(hostdb, spec.session_id, spec.cwd)
            if not os.path.exists(path):
                # Claude finds a session it wrote in another folder's projects folder too (and
                # goes on writing it there): adopted where it is.
                adopted_at = transcript_elsewhere(path)
                if adopted_at is None:
                    # (Claude will say it finds no such session: with nothing to capture, its
                    # own compaction stays on)
                    spec.governed = False
                    home.log("capture_off", reason=f"no transcript at {path} to adopt")
                    return None
                path = adopted_at
            refuse_irregular_transcript(path, spec.session_id, home)
            refuse_orphan(path, spec, home, registry)
            import sqlite3
            try:
                thread = registry.create_thread(spec.session_id, spec.cwd, "adopted")
                origin = "adopted"
            except sqlite3.IntegrityError:
                # Another cc-lhc adopted this session a moment ago: contend for its thread.
                thread = registry.thread_for_session(spec.session_id)
                if thread is None:
                    raise
        lease = Lease(home, thread)
        lease.acquire()
        try:
            say_if_thread_busy(home, thread, "before Claude starts")  # (what follows writes the thread)
            refuse_lost_thread(home, hostdb, registry, thread, spec)
            recover_thread(home, registry, hostdb, thread)
            current = registry.current_session(thread)
            if current and current != spec.session_id:
                say(f"session {spec.session_id} continues as {current} in thread {thread[:8]}; "
                    "resuming that")
                _resume_session(spec, current)
            refuse_running_session(spec.resume)  # (a Claude on it that no cc-lhc runs)
            path = adopted_at or _session_rollout(hostdb, spec.session_id, spec.cwd)
            refuse_irregular_transcript(path, spec.session_id, home)
            repair_torn_tail(path, home, spec.session_id, keep_cut_line(home, thread, spec.session_id, path))
        except BaseException:
            lease.release()
            raise
    else:
        if registry.thread_for_session(spec.session_id):
            raise usage_error(f"session {spec.session_id} already exists; continue it with "
                              f"--resume {spec.session_id}")
        path = rollout_path(spec.session_id, spec.cwd)
        origin = "fork" if spec.fork else "fresh"
        thread = registry.create_thread(spec.session_id, spec.cwd, origin)
        spec.new_thread = (thread, spec.session_id, path, None)
        lease = Lease(home, thread)
        lease.acquire()
        mark_new_thread(home, spec.new_thread)
    hostdb.note_session(spec.session_id, thread, path, spec.cwd)
    registry.save_copy(thread)  # a thread file from before copies existed gets one now
    home.log("thread_attached", thread=thread, session=spec.session_id, origin=origin)
    alarm = registry.db.execute("SELECT message FROM thread_alarms WHERE thread_id = ?",
                                (thread,)).fetchone()
    if alarm:
        # Standing since rebuilt sessions stopped loading: Claude native Compact stays
        # allowed for this thread until a rebuild is accepted again.
        say(alarm[0])
        spec.said_at_start.append(alarm[0])
        spec.autocompact = True
    capture = new_capture(spec, home, policy, hostdb, thread, spec.session_id, path)
    capture.lease = lease
    return capture


def _catch_up_source(spec, home, policy, registry, hostdb, thread_id):
    """The current session of a thread about to be forked, its record read up to the
    transcript's end first when no one holds the thread (a live cc-lhc that does is
    capturing it already); an interrupted Smart Compact of it is settled on the way."""
    import time
    lease = Lease(home, thread_id)
    if not lease.try_acquire():
        return registry.current_session(thread_id)
    try:
        recover_thread(home, registry, hostdb, thread_id)
        current = registry.current_session(thread_id)
        if current is None:
            return None
        capture = new_capture(spec, home, policy, hostdb, thread_id, current,
                              _session_rollout(hostdb, current, spec.cwd), live=False)
        try:
            capture.catch_up(deadline=time.monotonic() + CATCHUP_SECONDS)
        finally:
            capture.stop()
        return current
    finally:
        lease.release()


# A fork cc-lhc writes is a thread of origin FORKING until its session is written; one a
# crash left that way is removed by the next launch (sweep_unfinished_forks).
FORKING = "forking"


def sweep_unfinished_forks(home, registry, hostdb) -> None:
    """Remove the forks a killed cc-lhc left half made (origin FORKING, no one holding
    them): their record is a copy of a thread that still has it, and the session written
    for them, if any, was never opened."""
    for (thread_id,) in registry.db.execute("SELECT id FROM threads WHERE origin = ?", (FORKING,)).fetchall():
        lease = Lease(home, thread_id)
        if not lease.try_acquire():
            continue  # still being made
        try:
            session = registry.current_session(thread_id)
            discard_thread(home, registry, hostdb, thread_id, session)
            home.log("unfinished_fork_removed", thread=thread_id, session=session)
        finally:
            lease.release()


def _copy_thread_file(home, source_store, thread_id, session_id, cwd) -> None:
    """threads/<thread_id>.sqlite as a copy of the source thread's record: every message,
    turn, summary and index under the same labels, with the registry rows of a new thread
    whose current session is session_id (so a crash before the registry has it leaves a
    file restore_missing brings back whole). Written beside, privately, and renamed into
    place."""
    import sqlite3
    path = home.path("threads", f"{thread_id}.sqlite")
    tmp = os.path.join(os.path.dirname(path), f".{thread_id}.{os.getpid()}.copy")
    now = utc_now_iso()
    try:
        _touch_private(tmp)
        db = sqlite3.connect(tmp)
        try:
            source_store.db.backup(db)
            with db:
                db.execute("UPDATE meta SET value = ? WHERE key = 'thread_id'", (thread_id,))
                db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", {
                    "cwd": cwd, "created": now, "origin": FORKING, "project_slug": project_slug(cwd),
                    "registry_copied": now, "forked_from": source_store.thread_id}.items())
                db.execute("DELETE FROM registry_aliases")
                db.execute("INSERT INTO registry_aliases VALUES (?, 1, ?)", (session_id, now))
                db.execute("DELETE FROM registry_rebuilds")
                db.execute("DELETE FROM registry_alarm")
                db.execute("DELETE FROM inference_cost")  # spent by the source, not by the fork
                # summaries the source's own process was writing are the fork's to write again
                db.execute("UPDATE work SET status = 'queued', owner = NULL, claimed_at = NULL "
                           "WHERE status = 'claimed'")
        finally:
            db.close()
        os.replace(tmp, path)
        fsync_folder(os.path.dirname(path))
    except BaseException:
        for leftover in (tmp, tmp + "-journal", tmp + "-wal", tmp + "-shm"):
            try:
                os.unlink(leftover)
            except OSError:
                pass
        raise


def fork_thread(spec, home, policy, registry, hostdb, source):
    """--fork-session of a session of thread ``source``, when Claude's own copy will not do.

    Claude copies only the current transcript. That is the whole thread while the thread
    has one session and fits; otherwise (a rebuilt session holds a header and a view, not
    the turns; or the copy would start over the trigger) the fork is made here: a new
    thread holding a copy of the source's record under the same labels, and a session
    written from it (Smart Compact when over the trigger) that Claude resumes. Returns
    its Capture, or None to let Claude fork as it does: also when the source is not at a
    settled seam, or its rebuilt sessions stopped loading (its alarm stands).
    """
    if registry.thread_for_session(spec.session_id):
        raise usage_error(f"session {spec.session_id} already exists; continue it with "
                          f"--resume {spec.session_id}")
    named = spec.resume
    current = _catch_up_source(spec, home, policy, registry, hostdb, source)
    alarm = registry.db.execute("SELECT 1 FROM thread_alarms WHERE thread_id = ?", (source,)).fetchone()
    if not current or alarm:
        return None
    earlier = named if named and named != current else None  # (a session the thread went on from)
    store = ThreadStore.existing(home, source)
    try:
        # (Claude's copy holds neither the turns of earlier sessions nor subagents' records)
        elsewhere = store.db.execute("SELECT 1 FROM messages WHERE agent IS NOT NULL OR "
                                     "source_session IS NOT ? LIMIT 1", (current,)).fetchone()
        c, unsettled = current_classification(store, current, policy, prompt_estimate(spec), idle=True)
        if earlier is None and (unsettled or not (elsewhere or c["would_mutate"])):
            return None
        fork_id = new_session_id()
        _copy_thread_file(home, store, fork_id, spec.session_id, spec.cwd)
        turns = store.summary()["turns"]
    finally:
        store.close()
    failpoint("fork-after-copy")
    lease = None
    try:
        lease = Lease(home, fork_id)
        lease.acquire()
        registry.create_thread(spec.session_id, spec.cwd, FORKING, thread_id=fork_id)
        failpoint("fork-after-register")
        fork_store = ThreadStore(home, fork_id)
        try:
            if earlier is not None:
                # The branch that session had: what the thread took in after it is left out
                # of the fork (kept in its record, off the branch, as a /resume back does).
                resumed_back(fork_store, earlier, current)
            written = rebuild(home, hostdb, fork_store, fork_id, earlier or current, policy, spec.cwd,
                              envelope_from=_session_rollout(hostdb, earlier or current, spec.cwd),
                              session_id=spec.session_id, pending=False, idle=True, recorded=False)
        finally:
            fork_store.close()
        failpoint("fork-after-write")
        with Tx(registry.db) as db:
            db.execute("UPDATE threads SET origin = 'fork' WHERE id = ?", (fork_id,))
        registry.save_copy(fork_id)
    except BaseException:
        discard_thread(home, registry, hostdb, fork_id, spec.session_id)
        if lease is not None:
            lease.release()
        raise
    if c["would_mutate"]:
        say(f"Smart Compact of the fork: {describe_reading(c)}")
    say(f"the fork of thread {source[:8]} is thread {fork_id[:8]}: its {turns} turns under the same labels")
    home.log("thread_forked", thread=fork_id, source=source, from_session=current,
             session=spec.session_id, compacted=c["would_mutate"], turns=turns)
    spec.child_argv = [spec.child_argv[0]] + with_resume(spec.claude_args, spec.found, spec.session_id,
                                                         also=spec.found.get("fork_args", ()))
    spec.resume, spec.fork, spec.assigned_session = spec.session_id, False, False
    spec.new_thread = (fork_id, spec.session_id, written.path, written.prefix)
    mark_new_thread(home, spec.new_thread)
    home.log("thread_attached", thread=fork_id, session=spec.session_id, origin="fork")
    capture = new_capture(spec, home, policy, hostdb, fork_id, spec.session_id, written.path)
    capture.lease = lease
    return capture


def new_capture(spec, home, policy, hostdb, thread, session_id, path, live=True):
    """The Capture of a session this launch runs (``live``: its responses are classified
    as they come, unless it is a one-shot), or only reads (live=False)."""
    known = hostdb.session(session_id)

    def on_event(event, capture):
        kind, turn = event
        if kind == "in_process_view":
            # The capture thread: the relay's InProcessCompact reads it at its next tick.
            if spec.session is not None:
                newest = capture.store.db.execute("SELECT max(seq) FROM messages").fetchone()[0]
                spec.session.views_replayed.append(newest or 0)
                spec.session.wake()
            home.log("in_process_view_captured", thread=capture.thread_id, turn=turn)
        if kind in ("capture_failing", "capture_recovered"):
            # (the capture thread: said once a streak, never from each of its retries)
            note = (f"cc-lhc cannot write its record of this session ({turn}); Claude goes on, and "
                    "what it writes is taken in once cc-lhc can write again " +
                    ("(cc-lhc's next launch of this session, at the latest)" if spec.print_mode else
                     "(the control panel's /status)")
                    if kind == "capture_failing" else
                    "cc-lhc writes its record of this session again; nothing Claude wrote meanwhile was lost")
            if spec.session is not None:
                spec.session.announce(note)
            return
        if kind == "native_compact":
            note = (f"Claude native Compact ran in session {capture.session_id}; its summary is kept "
                    f"as turn t{turn} and every earlier turn stays in the thread")
            home.log("native_compact", thread=capture.thread_id, turn=turn, note=note)
            if spec.session is not None:
                spec.session.native_compacts.append((turn, utc_now_iso()))
                spec.session.announce(note)
            else:
                say(note)

    live = None if spec.print_mode or not live else (lambda capture: classify_live(capture, home, policy))
    if live is not None:
        note_stop_hooks(home, thread, spec)
    return Capture(home, thread, session_id, path, policy,
                   start_offset=known["replayed_prefix_bytes"] if known else 0, on_event=on_event,
                   on_responses=live)


CATCHUP_SECONDS = 10.0


def prompt_estimate(spec) -> int:
    """LHC estimate of the prompt a one-shot is about to send: its argv text, and what its
    standard input holds for Claude (`-p < prompt.txt`, `cat big.log | cc-lhc -c -p ...`:
    the only way to send a prompt longer than an argument may be)."""
    words = estimate_tokens(" ".join(spec.positionals))
    return words + (waiting_input_bytes() + 3) // 4 if spec.print_mode else words


def waiting_input_bytes(fd: int = 0) -> int:
    """How many bytes standard input holds for Claude, read without taking any: the rest of
    a file, or what a pipe holds now (a writer may add more: the least it will be); 0 for a
    terminal or what cannot be told."""
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode):
            return max(0, st.st_size - os.lseek(fd, 0, os.SEEK_CUR))
        if (stat.S_ISFIFO(st.st_mode) or stat.S_ISSOCK(st.st_mode)) and os.name == "posix":  # (Node pipes: sockets)
            import fcntl
            import termios
            import array
            held = array.array("i", [0])
            fcntl.ioctl(fd, termios.FIONREAD, held)
            return max(0, held[0])
    except (OSError, ValueError, ImportError, AttributeError):
        pass
    return 0


def smart_compact_before_launch(spec, home, policy, capture):
    """Smart Compact before Claude starts on a resumed session over the trigger.

    A one-shot seat always works this way. An interactive --resume does too: with no
    child running yet there is nothing to hand off, so the rebuilt session is simply
    the one Claude opens. Returns the Capture for the session Claude will run on (a new
    one after a rebuild) and the PendingRebuild, if any.
    """
    import time
    hostdb = HostDB(home)
    capture.catch_up(deadline=time.monotonic() + CATCHUP_SECONDS)
    if not capture.caught_up:
        say("context check skipped: capture is still catching up with the transcript; "
            "Smart Compact will run on the next invocation if needed")
        return capture, None
    orphaned = close_orphaned_background(home, capture.store)
    # Claude Code deletes old sessions' transcripts (cleanupPeriodDays, 30 days unless set):
    # the thread still holds the conversation, so Claude resumes it written again from there.
    held = capture.store.db.execute("SELECT 1 FROM messages WHERE agent IS NULL LIMIT 1").fetchone()
    gone = held is not None and not os.path.lexists(capture.path) and transcript_elsewhere(capture.path) is None
    astray = held is not None and os.path.lexists(capture.path) and not claude_reads(capture.path)
    cut = 0 if gone or astray or held is None else records_cut_from(capture.store, spec.session_id, capture.path)
    if gone:
        say(f"the transcript of session {spec.session_id} is gone (Claude Code removes old "
            f"sessions); writing the conversation again from thread {capture.thread_id[:8]}")
        home.log("transcript_gone", thread=capture.thread_id, session=spec.session_id, path=capture.path)
    elif cut:
        # Cut or written over after capture read it: resumed as it is, Claude would go on
        # without the records it lost.
        say(f"the transcript of session {spec.session_id} no longer holds {cut} record(s) cc-lhc "
            f"captured from it (it was cut or written over); writing the conversation again from "
            f"thread {capture.thread_id[:8]}")
        home.log("transcript_cut", thread=capture.thread_id, session=spec.session_id, path=capture.path,
                 records=cut)
    elif astray:
        # (`rollout write --projects-root` put it there, or CLAUDE_CONFIG_DIR changed since)
        say(f"session {spec.session_id} is in {os.path.dirname(capture.path)}, where Claude Code "
            f"does not look for sessions; writing the conversation again from thread "
            f"{capture.thread_id[:8]}")
        home.log("transcript_astray", thread=capture.thread_id, session=spec.session_id, path=capture.path)
        gone = True
    compacted = not gone and not cut and compacted_in_process(home, spec.session_id, capture.store)
    unresumable = gone or bool(cut) or compacted  # as it is, Claude cannot go on with it: written again
    if compacted:
        # Claude reads a session back by its records' message ids, and the newest records the
        # mod's compaction kept are written after its boundary with the ids they had before
        # it: resumed as it is, Claude would hold each of them twice (its text and signed
        # thinking repeated). The thread holds the compacted conversation: written again.
        say(f"session {spec.session_id} was compacted inside Claude by the cc-lhc mod, which "
            f"Claude cannot resume as it is; writing it again from thread {capture.thread_id[:8]}")
        home.log("resume_rewrites_in_process_compaction", thread=capture.thread_id, session=spec.session_id)
    refused = thinking_refused(home, hostdb, capture.store, policy)
    if refused:
        # The rebuilt session's first request was refused over its replayed thinking: the
        # thread gives up replaying thinking from now on and is rebuilt without it.
        _set_meta(capture.store, THINKING_KEY, "omit")
        say(f"the API refused the thinking replayed into rebuilt session {refused}; rebuilding "
            "without it (thinking replay: omit for this thread from now on), nothing is lost")
        home.log("thinking_refused", thread=capture.thread_id, session=refused)
    too_long = None if refused else rejected_too_long(capture.store, spec.session_id)
    if too_long is not None:
        # The API refused this session's last request as too long (a one-shot's, which never
        # continues by itself): whatever the last reading said, it is rebuilt before Claude
        # is started on it again. Nothing is sent for the refused turn.
        say(f"the API rejected this session's last request as too long (t{too_long[0]}); Smart "
            "Compact rebuilds it before Claude starts")
        home.log("too_long_rejection", thread=capture.thread_id, turn=too_long[0], ran=too_long[1],
                 before_launch=True)
    a = assess(home, hostdb, capture.store, capture.thread_id, spec.session_id, policy,
               prompt_estimate=prompt_estimate(spec), idle=True,
               manual=bool(refused) or too_long is not None, gone=unresumable)
    home.log("governor", thread=capture.thread_id, session=spec.session_id, **a.c)
    plan_view = None
    if not a.go and automatic_prune_due(policy, a.c):
        a = assess(home, hostdb, capture.store, capture.thread_id, spec.session_id, policy,
                   prompt_estimate=prompt_estimate(spec), idle=True, prune=True)
        home.log("governor", thread=capture.thread_id, session=spec.session_id, operation="prune",
                 **a.c)
        plan_view = prune_planner(policy["pruneTargetTokens"])
    if not a.go:
        if a.c["state"] == STATE_OVER_OPEN:
            say(f"over the trigger but {a.reason}; launching on the current session, "
                "Smart Compact runs on the next invocation")
        return capture, None
    say(f"{'Smart Prune' if plan_view else 'Smart Compact'}: {describe_reading(a.c)}")
    try:
        pending = rebuild(home, hostdb, capture.store, capture.thread_id, spec.session_id, policy,
                          spec.cwd, envelope_from=None if gone else capture.path, assessment=a,
                          plan_view=plan_view, idle=True, gone=unresumable, manifest=orphan_lines(orphaned))
    except LhcError as e:
        if isinstance(e, NoRebuild):
            note_no_rebuild(home, capture.thread_id, a, e)
        if unresumable:
            # (no session to fall back on: Claude could not go on with the one it was on)
            raise LhcError(f"session {spec.session_id} has to be written again from thread "
                           f"{capture.thread_id[:8]} for Claude to go on with it, and it could not be: {e}",
                           e.status) from e
        if isinstance(e, NoRebuild):
            say(f"Smart Prune: {e}" if plan_view else
                f"Smart Compact did not run: {e}; launching on the current session")
            return capture, None
        # The session Claude was on is still whole: launch on it rather than not at all.
        say(f"{e}; launching on the current session")
        return capture, None
    lease = capture.lease
    capture.lease = None
    capture.stop()
    _resume_session(spec, pending.session_id)
    fresh = new_capture(spec, home, policy, hostdb, capture.thread_id, pending.session_id,
                        pending.path)
    fresh.lease = lease
    return fresh, pending


def records_cut_from(store, session_id, path) -> int:
    """How many records of the session the thread holds that its transcript no longer does:
    looked for only once capture saw the file cut or written over (and read it again from
    its start, keeping all it held)."""
    if store.db.execute("SELECT 1 FROM problems WHERE session = ? AND kind IN (?, ?) LIMIT 1",
                        (session_id, "transcript_shrank", "transcript_rewritten")).fetchone() is None:
        return 0
    try:
        with open(path, "rb") as f:
            found = set(re.findall(rb'"uuid"\s*:\s*"([^"\\]+)"', f.read()))
    except OSError:
        return 0
    return sum(1 for (uuid,) in store.db.execute("SELECT uuid FROM chain WHERE session = ?", (session_id,))
               if uuid.encode("utf-8", "surrogatepass") not in found)


def compacted_in_process(home, session_id, store=None) -> bool:
    """Whether the cc-lhc mod compacted this session inside Claude: an accepted in-process
    rebuild of it is on record, or its transcript holds a view cc-lhc served (Claude wrote
    it, and cc-lhc was killed before Claude's next request accepted it)."""
    row = Registry(home).db.execute(
        "SELECT 1 FROM rebuilds WHERE from_session = ? AND status = 'accepted' AND session_id LIKE ? LIMIT 1",
        (session_id, session_id + "#%")).fetchone()
    if row is None and store is not None:
        row = store.db.execute("SELECT 1 FROM telemetry WHERE session = ? AND type = ? AND count > 0",
                               (session_id, VIEW_OPENED)).fetchone()
    return row is not None


def _cwd_threads(registry, hostdb, cwd):
    """This folder's threads with their current session and when each was last written to:
    its transcript's age, or, once Claude Code deleted that (cleanupPeriodDays), its
    record's (resuming it writes the conversation again from there). A thread with
    neither is left out."""
    rows = []
    home = StateHome()
    for thread_id, tcwd, _created, _origin, session in registry.threads():
        if tcwd != cwd or not session:
            continue
        path = _session_rollout(hostdb, session, cwd)
        try:
            rows.append((os.path.getmtime(path), thread_id, session, path))
            continue
        except OSError:
            pass
        # (a thread whose Claude has not written its transcript yet, a launch just started
        # say, holds no conversation: it is no thread to continue)
        record = home.path("threads", f"{thread_id}.sqlite")
        try:
            store = ThreadStore.existing(home, thread_id)
            try:
                held = store.db.execute("SELECT 1 FROM messages WHERE agent IS NULL LIMIT 1").fetchone()
            finally:
                store.close()
            if held:
                rows.append((os.path.getmtime(record), thread_id, session, path))
        except (LhcError, OSError, sqlite3_errors()):
            try:  # (listed, so the picker names it and --continue says what is wrong with it)
                rows.append((os.path.getmtime(record), thread_id, session, path))
            except OSError:
                continue  # (no record either: doctor names the loss)
    rows.sort(reverse=True)
    return rows


def refuse_lost_thread(home, hostdb, registry, thread_id, spec) -> None:
    """A resume of a thread whose record is gone (or empty). With Claude Code's transcript of
    its current session gone too, nothing is left to go on with, so the launch is refused
    (exit 1) before anything makes a new, empty record in its place, which would hide the
    loss from `cc-lhc doctor`. Else the record is made again from the transcripts: every
    earlier session of the thread Claude Code still keeps is taken in here, oldest first
    (a rebuilt one from after the part it replayed), and the launch captures the current one
    as always; the thread then holds what they hold, under the labels it gave them before.
    Said, with the sessions whose transcripts are gone."""
    record = home.path("threads", f"{thread_id}.sqlite")
    try:
        if os.stat(record).st_size:
            return
        state = "is empty"
    except FileNotFoundError:
        state = "is missing"
    except OSError:
        return  # (opening it says what is wrong)
    session = registry.current_session(thread_id) or spec.session_id
    path = _session_rollout(hostdb, session, spec.cwd)
    if not (os.path.lexists(path) or transcript_elsewhere(path) is not None):
        raise LhcError(f"thread {thread_id}: its record {record} {state}, and Claude Code's transcript of "
                       f"its session {session} is gone too, so there is nothing to resume; "
                       "cc-lhc doctor says more")
    earlier = [sid for (sid,) in registry.db.execute(
        "SELECT session_id FROM aliases WHERE thread_id = ? AND session_id != ? ORDER BY created, rowid",
        (thread_id, session))]
    taken, gone = [], []
    for sid in earlier:
        known = hostdb.session(sid)
        where = (known["rollout_path"] if known and known["rollout_path"] else None) or \
            _session_rollout(hostdb, sid, spec.cwd)
        if not os.path.isfile(where):
            gone.append(sid)
            continue
        capture = Capture(home, thread_id, sid, where,
                          start_offset=known["replayed_prefix_bytes"] if known else 0)
        try:
            capture.catch_up()
        finally:
            capture.stop()
        taken.append(sid)
    said = (f"thread {thread_id[:8]}: its record {record} {state}; it is made again from Claude Code's "
            f"transcripts of its sessions ({len(taken) + 1} of {len(earlier) + 1} still there)")
    if gone:
        said += (f"; what only the gone ones held ({', '.join(g[:8] for g in gone)}) is in the thread "
                 "no more, beyond what the current session replays of it")
    say(said)
    home.log("thread_record_retaken", thread=thread_id, state=state, sessions=taken + [session], gone=gone)


def continue_target(spec, registry, hostdb):
    """--continue: this folder's most recent thread, else Claude's most recent session."""
    rows = _cwd_threads(registry, hostdb, spec.cwd)
    if rows:
        return went_on_in(rows[0][2], spec.cwd)
    folder = os.path.join(claude_config_dir(), "projects", project_slug(spec.cwd))
    try:
        candidates = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".jsonl")]
    except OSError:
        return None
    dated = []
    for c in candidates:
        if is_uuid(os.path.basename(c)[:-6]):
            try:  # (a link that leads nowhere, a file Claude Code removed meanwhile: passed over)
                dated.append((os.path.getmtime(c), c))
            except OSError:
                continue
    if not dated:
        return None
    return os.path.basename(max(dated)[1])[:-6]


def went_on_in(session_id: str, cwd: str, hops: int = 16) -> str:
    """The session a conversation went on in, by the `continued-in` records Claude writes
    when its exit dialog moves a session to the background (the daemon forks it into a new
    session of this folder): ``session_id`` itself when it did not, or when that session's
    transcript is not there (yet)."""
    for _ in range(hops):
        moved = continued_in(rollout_path(session_id, cwd))
        if not moved or not os.path.isfile(rollout_path(moved, cwd)):
            break
        session_id = moved
    return session_id


# The records in which Claude Code names a session (`--name`, /rename; or a title it made):
# `claude --resume <name>` resumes the one session of this folder whose name is that.
SESSION_NAME_TYPES = {b'"custom-title"': "customTitle", b'"ai-title"': "aiTitle"}


def session_named(name: str, cwd: str, thread_of=lambda session: None):
    """The session of this folder's projects folder named ``name`` as Claude Code reads
    names (its newest custom title, else its newest made title; case and surrounding
    spaces aside), when exactly one is, or all that are belong to one thread (whose
    current session a resume lands on anyway); None when none is. Sessions of different
    threads under the name are a refusal naming them."""
    import mmap
    want = name.strip().lower()
    folder = os.path.join(claude_config_dir(), "projects", project_slug(cwd))
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".jsonl") and is_uuid(n[:-6]))
    except OSError:
        return None
    matches = []
    for entry in names:
        titles = {}
        try:
            with open_regular(os.path.join(folder, entry)) as f:
                if os.fstat(f.fileno()).st_size == 0:
                    continue
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            continue
        with data:
            for marker, key in SESSION_NAME_TYPES.items():
                at = data.find(marker)
                while at >= 0:  # (a marker inside some text is no such record: its line says so)
                    start = data.rfind(b"\n", 0, at) + 1
                    end = data.find(b"\n", at)
                    end = len(data) if end < 0 else end
                    try:
                        rec = json.loads(data[start:end])
                    except (ValueError, RecursionError):
                        rec = None
                    if (isinstance(rec, dict) and rec.get("type") == marker[1:-1].decode()
                            and isinstance(rec.get(key), str)):
                        titles[key] = rec[key]
                    at = data.find(marker, end)
        title = titles.get("customTitle") or titles.get("aiTitle")
        if title is not None and title.strip().lower() == want:
            matches.append(entry[:-6])
    if len({thread_of(m) or m for m in matches}) > 1:
        # (as Claude itself refuses such a name: which one was meant, only the person knows)
        raise usage_error(f"--resume {shown_arg(name)} names {len(matches)} sessions of different threads; "
                          "resume one by its id: " + ", ".join(matches))
    return matches[0] if matches else None


def ask_terminal(question: str):
    """Ask the user at their terminal (even when stdin/stdout are redirected); None if there is none."""
    if os.name != "posix":
        if not sys.stdin.isatty():
            return None
        sys.stderr.write(question)
        sys.stderr.flush()
        line = sys.stdin.readline()
        if not line:
            raise usage_error("nothing chosen (end of input)")
        return line.strip()
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return None
    with os.fdopen(fd, "r+b", buffering=0) as tty:
        tty.write(question.encode("utf-8"))
        line = b""
        while not line.endswith(b"\n"):
            chunk = tty.read(1)
            if not chunk:
                if not line:
                    tty.write(b"\n")
                    raise usage_error("nothing chosen (end of input)")
                break
            line += chunk
    return line.decode("utf-8", "replace").strip()


def pick_thread_session(spec, registry, hostdb):
    """Bare --resume: let the user choose one of this folder's threads."""
    rows = _cwd_threads(registry, hostdb, spec.cwd)
    term = spec.found.get("resume") if isinstance(spec.found.get("resume"), str) else None
    if not rows:
        raise usage_error("no cc-lhc threads in this folder yet; start one with cc-lhc, "
                          "or pass --resume <session-id>")
    home = StateHome()
    listed, unreadable = [], False
    for mtime, thread_id, session, _path in rows:
        try:
            store = ThreadStore.existing(home, thread_id)
            try:
                last = store.db.execute("SELECT text FROM messages WHERE kind = 'user_text' "
                                        "AND agent IS NULL ORDER BY seq DESC LIMIT 1").fetchone()
                info = store.summary()
            finally:
                store.close()
        except (LhcError, OSError, sqlite3_errors()) as e:  # (named, as `cc-lhc threads` names it; the rest offered)
            say(f"thread {thread_id[:8]} left out of this list: {e}; cc-lhc doctor says how to fix it")
            unreadable = True
            continue
        prompt = (last[0] if last else "").replace("\n", " ")
        if term and term.lower() not in prompt.lower() and not thread_id.startswith(term):
            continue
        when = datetime.datetime.fromtimestamp(mtime).strftime("%Y-%m-%d %H:%M")
        held = Lease(home, thread_id).held_elsewhere()
        listed.append((session, f"{thread_id[:8]}  {when}  {info['turns']:>4} turns  "
                                f"{escape_controls(prompt[:60])}"
                                + ("" if held is None else f"  (in use{held})"), held is None))
    if not listed and unreadable and not term:
        raise LhcError("no thread of this folder can be read (named above)")
    if not listed:
        raise usage_error(f"no thread in this folder matches {term!r}")
    default = next((str(i) for i, (_s, _l, free) in enumerate(listed, 1) if free), "1")  # (the newest free one)
    answer = ask_terminal("Threads in this folder (newest first):\n"
                          + "".join(f"  {i:>2}. {line}\n" for i, (_s, line, _f) in enumerate(listed, 1))
                          + f"Resume which? [{default}] ")
    if answer is None:
        raise usage_error("choosing a thread needs a terminal; pass --resume <session-id> "
                          "(cc-lhc threads lists them)")
    answer = answer or default
    if not answer.isdigit() or not 1 <= int(answer) <= len(listed):
        raise usage_error(f"no thread numbered {answer!r}")
    return listed[int(answer) - 1][0]


# == 15. Live Smart Compact: the swap, the in-process path, session changes =====


# Claude options that take no value: they carry into a replacement child as they are.
CLAUDE_FLAG_OPTIONS = frozenset((
    "--allow-dangerously-skip-permissions", "--ax-screen-reader", "--bare", "--brief", "--chrome",
    "--dangerously-skip-permissions", "--disable-slash-commands",
    "--exclude-dynamic-system-prompt-sections", "--forward-subagent-text", "--ide",
    "--include-hook-events", "--include-partial-messages", "--no-chrome", "--replay-user-messages",
    "--restricted", "--safe-mode", "--strict-mcp-config", "--verbose",
))
# What a replacement child never inherits: it continues the conversation, it does not
# start, choose or fork one, and it is not a one-shot.
_NOT_INHERITED = frozenset(("-p", "--print", "-c", "--continue", "-r", "--resume", "--session-id",
                            "--fork-session", "--no-session-persistence", "--bg", "--background"))


def replacement_args(args):
    """Claude's argv for a wrapper-owned replacement child, and what was left out (pure).

    The launch's options carry over; its prompt, session selectors and print flags never
    do (a prompt would run again; a print child would exit at once). A variadic option
    (--allowedTools a b) took every argument up to the next option when Claude parsed
    the launch, so its values carry as one `--opt=value` each, which no later argument
    can join. An option whose value boundary the argv does not establish (optional-value
    or unknown, in its space form) is left out and named, since guessing could swallow or
    split a value; the `--opt=value` form of the same option carries through.
    """
    kept, left_out = [], []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            break  # after it only positionals: the launch's prompt
        if not a.startswith("-") or a == "-":
            i += 1
            continue
        name, eq, _value = a.partition("=")
        if value_attached(a):
            name, eq = a[:2], "="  # (the value's end is the argument's)
        kind = CLAUDE_VALUE_OPTIONS.get(name)
        if name in _NOT_INHERITED:
            i += 1
            if not eq and kind in ("value", "optional") and i < len(args) and not args[i].startswith("-"):
                i += 1
            continue
        if eq:
            kept.append(a)
            i += 1
        elif kind == "value" and i + 1 < len(args):
            kept += [a, args[i + 1]]
            i += 2
        elif name in CLAUDE_FLAG_OPTIONS:
            kept.append(a)
            i += 1
        elif kind == "variadic":
            i += 1
            while i < len(args) and not args[i].startswith("-"):
                kept.append(f"{name}={args[i]}")
                i += 1
        else:
            left_out.append(a)
            i += 1
            if kind in ("optional", "variadic"):
                while i < len(args) and not args[i].startswith("-"):
                    left_out.append(args[i])
                    i += 1
                    if kind == "optional":
                        break
    return kept, left_out


def _close_child(child) -> None:
    """End a ptyprocess child and close its terminal, without waiting more than needed."""
    import ptyprocess
    child.delayafterclose = 0
    try:
        child.close(force=True)
    except (OSError, ptyprocess.PtyProcessError):
        pass


EFFORT_LEVELS = frozenset(("low", "medium", "high", "xhigh", "max"))
PERMISSION_MODES = frozenset(("default", "acceptEdits", "plan", "auto", "dontAsk", "bypassPermissions"))
DANGEROUS_FLAGS = frozenset(("--dangerously-skip-permissions", "--allow-dangerously-skip-permissions"))


def confirmed_runtime(path: str, window: int = 4 << 20) -> dict:
    """The newest effort and permission mode Claude itself recorded in a transcript.

    Only values Claude wrote (an assistant record's ``effort``, a user record's
    ``permissionMode``) and that cc-lhc knows are returned; anything else is left
    unknown rather than inferred.
    """
    found = {}
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - window))
            lines = f.read().split(b"\n")
    except OSError:
        return found
    for raw in reversed(lines):
        if b'"effort"' not in raw and b'"permissionMode"' not in raw:
            continue
        rec = json_record(raw)
        if rec is None:
            continue
        if "effort" not in found and rec.get("type") == "assistant" and rec.get("effort") in EFFORT_LEVELS:
            found["effort"] = rec["effort"]
        if "permission_mode" not in found and rec.get("type") == "user" \
                and rec.get("permissionMode") in PERMISSION_MODES:
            found["permission_mode"] = rec["permissionMode"]
        if len(found) == 2:
            break
    return found


def with_runtime(kept, runtime: dict):
    """A replacement's argv carrying the confirmed effort and permission mode.

    The confirmed values replace the launch's own (the user may have changed them in the
    session); bypassing permissions is carried only where the launch allowed it.
    """
    out, i = [], 0
    drop = set()
    if "effort" in runtime:
        drop.add("--effort")
    mode = runtime.get("permission_mode")
    if mode == "bypassPermissions" and not DANGEROUS_FLAGS & set(kept):
        mode = None  # never broaden permissions beyond what the launch allowed
    if mode:
        drop.add("--permission-mode")
    while i < len(kept):
        name = kept[i].partition("=")[0]
        if name in drop:
            i += 1 if "=" in kept[i] else 2
            continue
        out.append(kept[i])
        i += 1
    if "effort" in runtime:
        out += ["--effort", runtime["effort"]]
    if mode:
        out += ["--permission-mode", mode]
    return out


# A key in the kitty (CSI code;mods u) or xterm modifyOtherKeys (CSI 27;mods;code ~)
# encodings, which Claude Code turns on where the terminal has them.
ENCODED_KEY = re.compile(rb"\x1b\[(\d+)(?:;(\d+))?u|\x1b\[27;(\d+);(\d+)~")
HISTORY_KEY = re.compile(rb"\x1b(?:\[(?:1;\d+)?|O)([AB])")  # up and down, either cursor mode
# Left and Home (plain or modified, either cursor mode): the cursor leaves the draft's end
LEFTWARD_KEY = re.compile(rb"\x1b(?:\[(?:1;\d+)?|O)[DH]|\x1b\[[17]~")


DIGIT_KEYS = frozenset(str(n).encode() for n in range(1, 10))


def _decided_by_person(path, tool_use_id, tail=1 << 22) -> bool:
    """Whether the transcript's record of a call's result says the person decided it in a
    permission dialog (its permissionDecision's source is the user's, or its
    toolDenialKind says the user rejected it), read from the end."""
    data = file_tail(path, tail)
    if data is None:
        return False
    at = data.rfind(b'"tool_use_id":"' + tool_use_id.encode("utf-8", "replace") + b'"')
    while at >= 0:
        start, end = data.rfind(b"\n", 0, at) + 1, data.find(b"\n", at)
        rec = json_record(data[start:end if end >= 0 else len(data)])
        decision = rec.get("permissionDecision") if rec else None
        if isinstance(decision, dict):  # (a call the person allowed)
            return str(decision.get("source") or "").startswith("user")
        if rec and "toolDenialKind" in rec:  # (one refused: by the person, or by a rule)
            return rec.get("toolDenialKind") == "user-rejected"
        at = data.rfind(b'"tool_use_id":"' + tool_use_id.encode("utf-8", "replace") + b'"', 0, start)
    return False


class DraftWatch:
    """Whether Claude's input box holds a message the person has begun and not sent, told
    from the keys that reach Claude: the characters typed since the last Enter that sent
    something, less those erased (backspace; ctrl-u, ctrl-w and alt-backspace on a one-line
    draft; ctrl-c and Esc twice empty the box). A backslash or a paste before an Enter makes it a new line, not a send. Terminal
    sequences (focus reports, answers, most cursor keys) are no text. Up (or ctrl-p) brings
    back an earlier prompt the keys never showed, as ctrl-r's history search and ctrl-y's
    yank put in text they do not show, and as a cursor moved off the draft's end (Left,
    Home, ctrl-a, ctrl-b, alt-b) makes what the keys erase unknown: until Down (ctrl-n)
    undoes each Up, or Enter or ctrl-c empties the box, the box is taken to hold a draft
    (waiting on one that is not there costs a wait; typing /compact under one that is
    sends it).

    Smart Compact waits while there is one: typed /compact would be sent with it, and a swap
    would end the Claude that holds it. ``sent_at`` is when the last prompt went: Claude
    writes it into its transcript a moment later, so until then the seam only looks settled.
    """

    # Commands that open a dialog of Claude's over the box (a picker, a settings screen)
    # when sent with no argument: until Enter or Esc closes it, keys typed there go to it.
    DIALOG_COMMANDS = frozenset((
        "/model", "/config", "/settings", "/resume", "/agents", "/mcp", "/permissions",
        "/allowed-tools", "/hooks", "/memory", "/theme", "/status", "/help", "/doctor", "/login",
        "/logout", "/ide", "/output-style", "/export", "/add-dir", "/privacy-settings", "/bashes",
        "/tasks", "/plugin", "/plugins", "/rewind", "/usage", "/statusline", "/branch",
    ))

    DIALOG_BYTES = frozenset(c.encode() for c in DIALOG_COMMANDS)

    def __init__(self):
        self.sent_at = None       # monotonic time of the last prompt sent (not a /command)
        self.compact_sent_at = None  # monotonic time the person sent a /compact of their own
        self.began_at = None      # wall-clock time (time.time()) the draft in the box began
        self.clear()

    def clear(self) -> None:
        """The box is empty (a new Claude's, say)."""
        self.dialog = False       # a dialog of Claude's (or its ctrl-o transcript) is open
        self._command = b""       # the first word of a draft that began with "/"
        self.chars = 0            # characters in the box, as far as the keys tell
        self.lines = 0            # new lines in it
        self.recalled = 0         # Up presses Down has not undone: an earlier prompt may be there
        self.unseen = False       # ctrl-r or ctrl-y put in text the keys do not show
        self._text = bytearray()  # the draft as typed, new lines as LF (backspace, ctrl-w, alt-backspace)
        self._escs = 0            # Esc presses in a row: a second one empties the box
        self._slash = False       # the draft began with "/": a command, not a prompt
        self._last = 0
        self._paste = False
        self._cut = b""           # a sequence the last read cut short

    @property
    def pending(self) -> bool:
        return self.chars > 0 or self.lines > 0 or self.recalled > 0 or self.unseen or self.dialog

    @property
    def one_digit(self) -> bool:
        """Whether all the keys tell of the box is one digit: as likely the number of an
        option chosen in a permission dialog of Claude's (which takes it without an Enter)
        as the start of a message."""
        return (self.chars == 1 and not (self.lines or self.recalled or self.unseen or self.dialog)
                and bytes(self._text) in DIGIT_KEYS)

    def _empty(self) -> None:
        self.chars = self.lines = self.recalled = 0
        self.unseen = False
        self._command = b""
        self._text.clear()

    def _cursor_moved(self) -> None:
        """The cursor left the end of a draft: what the keys erase or add from here is no
        longer known, so the box is taken to hold a draft until it is sent or emptied."""
        if self.chars or self.lines:
            self.unseen = True

    def _backspace(self) -> None:
        """Backspace: the character or new line before the cursor (taken to be at the end)
        goes; what the keys did not show (a recalled prompt) is gone from the count first."""
        if not self._text:
            if self.chars:
                self.chars -= 1
            elif self.lines:
                self.lines -= 1
            return
        last = self._text.pop()
        while 0x80 <= last < 0xC0 and self._text:  # (the rest of a UTF-8 character)
            last = self._text.pop()
        if last == 0x0A:
            self.lines = max(0, self.lines - 1)
        else:
            self.chars = max(0, self.chars - 1)
            self._command = self._command[:self.chars]

    def _erase_word(self) -> None:
        """ctrl-w or alt-backspace: the word before the cursor (taken to be at the end) and
        the spaces after it go. Only a one-line draft whose text the keys showed is known."""
        if self.lines or self.recalled or self.unseen:
            return
        text = self._text.rstrip(b" ")
        cut = max(text.rfind(b" "), -1) + 1
        del self._text[cut:]
        self.chars = sum(1 for b in self._text if not 0x80 <= b < 0xC0)
        self._command = self._command[:self.chars]

    def feed(self, data: bytes, now: float) -> bool:
        """Take keys that reached Claude; True when they sent a prompt."""
        import time
        empty = not self.pending
        try:
            return self._feed(data, now)
        finally:
            if empty and self.pending:
                self.began_at = time.time()

    def _feed(self, data: bytes, now: float) -> bool:
        if self.dialog and self._cut + data == b"\x1b":
            self.dialog, self._cut = False, b""  # Esc closes the dialog
            return False
        if self._cut == b"\x1b" and data[:1] == b"\x1b":  # a lone Esc, then another key
            self._cut = b""
            self._esc()
        if data == b"\x1b" and self._escs and not self._cut:
            self._esc()  # (a second Esc of a pair: no more is coming with it)
            return False
        data, self._cut = self._cut + data, b""
        sent, i = False, 0
        while i < len(data):
            b = data[i]
            if b == 0x1B:
                if data.startswith(b"\x1b[200~", i) or data.startswith(b"\x1b[201~", i):
                    self._paste = data[i + 4] == 0x30
                    i += 6
                    continue
                if data[i + 1:i + 2] in (b"\r", b"\n"):  # alt- or shift-Enter: a new line
                    self.lines += 1
                    self._text.append(0x0A)
                    i += 2
                    continue
                seq = terminal_sent(data, i)
                if seq is not None and seq[0] is None or seq is None and i == len(data) - 1:
                    self._cut = data[i:]  # the rest comes with the next read (or it was Esc)
                    break
                if seq is None:
                    if data[i + 1:i + 2] in (b"\x7f", b"\x08"):  # alt-backspace
                        self._erase_word()
                        i += 2
                        continue
                    if data[i + 1:i + 2] in (b"b", b"B"):  # alt-b: a word back
                        self._cursor_moved()
                        i += 2
                        continue
                    i += 1
                    continue
                key = ENCODED_KEY.fullmatch(data, i, seq[0])
                arrow = HISTORY_KEY.fullmatch(data, i, seq[0])
                if LEFTWARD_KEY.fullmatch(data, i, seq[0]):
                    self._cursor_moved()
                i = seq[0]
                if arrow is not None:
                    self.recalled = self.recalled + 1 if arrow.group(1) == b"A" else max(0, self.recalled - 1)
                if key is None:
                    continue  # a cursor key, a focus report, an answer: no text
                code = int(key.group(1) or key.group(4))
                mods = int(key.group(2) or key.group(3) or 1) - 1
                b = (code & 0x1F if mods & 4 and 0x40 <= code < 0x80 else
                     0x0A if code == 13 and mods else code)  # ctrl-c as 3, shift-Enter as LF
                if b >= 0x20 and b != 0x7F:
                    continue  # a printable key comes as itself in the modes Claude turns on
            if b == 0x0D and not self._paste and self._last != 0x5C:
                if self.dialog:
                    self.dialog = False  # Enter picks in the dialog and closes it
                elif self.pending and (not self._slash or self.recalled or self.unseen):
                    self.sent_at, sent = now, True
                elif self._slash and not self.lines and self._names_compact():
                    self.compact_sent_at = now  # (Claude runs it now, or queues it until its turn ends)
                elif (self._slash and not self.lines and not self.recalled and not self.unseen
                        and self._command in self.DIALOG_BYTES):
                    self.dialog = True
                self._empty()
            elif b in (0x0D, 0x0A):  # a new line in the box (ctrl-j, backslash-Enter, a paste's)
                self.lines += 1
                self._text.append(0x0A)
            elif b == 0x03:
                self._empty()
                self._paste = self.dialog = False
            elif b == 0x0F:  # ctrl-o: Claude's transcript view, over the box until closed
                self.dialog = not self.dialog
            elif b in (0x12, 0x19):  # ctrl-r, ctrl-y
                self.unseen = True
            elif b in (0x01, 0x02):  # ctrl-a, ctrl-b: the cursor to the start, or back one
                self._cursor_moved()
            elif b == 0x10:  # ctrl-p: Claude's Up
                self.recalled += 1
            elif b == 0x0E:  # ctrl-n: its Down
                self.recalled = max(0, self.recalled - 1)
            elif b == 0x15 and not self.lines:
                self.chars, self._command = 0, b""
                self._text.clear()
            elif b == 0x17:  # ctrl-w
                self._erase_word()
            elif b in (0x7F, 0x08):
                self._backspace()
            elif b == 0x09 and self._completes_to_compact():
                # Tab: Claude's menu puts "/compact " in the box, and words may follow it
                self._text[:] = b"/compact "
                self._command, self.chars = b"/compact\0", len(b"/compact ")
            elif b >= 0x20:
                self._text.append(b)
                if not 0x80 <= b < 0xC0:  # (a UTF-8 character once, by its first byte)
                    if not self.pending:
                        self._slash = b == 0x2F
                        self._command = b""
                    if self._slash and self.chars == len(self._command):
                        # (still the command's first word: a space or any argument ends it)
                        self._command += bytes([b]) if b != 0x20 else b"\0"
                    self.chars += 1
            if b != 0x1B:
                self._escs = 0
            self._last = b
            i += 1
        return sent

    def _completes_to_compact(self) -> bool:
        """Whether the box holds only a command's first word that begins /compact (/comp)."""
        word = self._command
        return (self._slash and not (self.lines or self.recalled or self.unseen) and self.chars == len(word)
                and bytes(self._text) == word and len(word) >= 4 and b"/compact".startswith(word))

    def _names_compact(self) -> bool:
        """Whether the command sent is /compact: as typed (with or without words after it), or
        begun (/comp) and finished by Claude's menu, which Enter or Tab takes from."""
        word = self._command.partition(b"\0")[0]
        return word == b"/compact" or (not self._command.endswith(b"\0") and word == self._command
                                       and len(word) >= 4 and b"/compact".startswith(word))

    def _esc(self) -> None:
        """The Esc key: Claude empties its box on the second of two in a row."""
        self._escs += 1
        if self._escs >= 2 and not self.dialog:
            self._empty()
            self._escs = 0


class LiveHandoff:
    """Spawn-first Smart Compact for a running interactive session.

    Asked for by the capture thread when a settled seam is over the trigger, it runs on
    the relay's thread: rebuild the session, spawn `claude --resume <new>` off-route (its
    own PTY, nothing routed to it), and only once it has rendered and survived a
    stabilisation window switch input, output, descriptor and capture over together.
    The old child is ended last. A replacement that does not come up costs nothing: the
    old child keeps running, the rebuild is moved aside, and the next seam tries again.
    """

    STABILISE_SECONDS = 1.0
    REPLAY_LIMIT = 1 << 20
    GIVE_UP_SECONDS = 30.0
    # A swap that must serve now (the in-process path was refused) but finds the seam
    # unsettled, because Claude is still writing the records of the /compact it declined,
    # is tried again this often, for this long; later seams ask for it as usual.
    SEAM_RETRY_SECONDS = 0.2
    SEAM_WAIT_SECONDS = 10.0
    MAX_FAILURES = 3
    NOTICE = "input typed during compaction was not delivered \u2014 please resend"
    asked = repaint_at = reshow_at = None  # (see __init__)
    compact_mark, compact_looked = (0.0, None), 0.0
    RESHOW_SECONDS = 0.4  # after a repaint nudge, when Claude has drawn its screen again
    RUNTIME_NOTE = ("[runtime note] The API rejected your last request as too long, so cc-lhc rebuilt "
                    "this session (Smart Compact); nothing was lost. Tool calls that had already run "
                    "for it: {ran}. Please continue the task from where it stopped; read back "
                    "anything you need with cc-lhc get-messages or get-turns.")
    SPLIT_NOTE = ("the API rejected a request as too long again after a rebuild; split the task "
                  "into smaller steps")
    THINKING_NOTICE = ("the API refused the thinking replayed into rebuilt session {session}; "
                       "rebuilding without it (thinking replay: omit for this thread from now on), "
                       "nothing is lost")
    THINKING_NOTE = ("[runtime note] The API refused your last request because of thinking replayed "
                     "into this rebuilt session, so cc-lhc rebuilt it without thinking (Smart "
                     "Compact); nothing was lost. Please answer the last request now.")
    ALARM = ("cc-lhc rebuilt sessions are not loading \u2014 likely a compatibility problem with "
             "the installed Claude version")
    # Raised instead when no replacement was even started: cc-lhc itself failed to prepare
    # the rebuild each time, which says nothing about the installed Claude.
    UNPREPARED_ALARM = ("cc-lhc failed {n} times before a replacement started (last: {why}); Claude's "
                        "own compaction is back on for this session, and every turn is still recorded")

    def __init__(self, session, host):
        self.session = session      # the ManagedSession around the child
        self.host = host            # the running InteractiveHost
        self.pending = None
        self.candidate = None
        self.started = None
        self.first_output = None
        self.failures = 0
        self.unprepared = 0         # of those, failures before any replacement was started
        self.alarm = self.ALARM     # what the standing alarm says, once raised
        self.alarmed = False
        self.survival = False       # the candidate is a survival relaunch, not a rebuild
        self.continue_note = None   # sent to the replacement once it owns the terminal
        self.submit_at = None       # when to press Enter on it
        self.carry = BackgroundCarry(session)
        self.carrying = []          # the open background items of the seam being swapped
        self.told_at_turn = None    # a note was typed: the next one waits for a newer settled turn
        self.last_input = 0.0       # when the person last typed (monotonic)
        self.retry_at = None        # swap_soon: when to try the waiting swap again (monotonic)
        self.no_room = None         # (thread, target, newest turn, why) when no turn fitted (_no_rebuild)
        self.retry_until = None     # and until when
        self.seam_turn = None       # the newest turn at the seam the swap under way rebuilt at
        self.draft = DraftWatch()   # what the person has typed into Claude's box and not sent
        self.sent_mark = (0, 0.0)   # (newest recorded prompt, time.time()) when the person last sent one
        self.compact_mark = (0.0, None)  # (time.time() of the person's /compact, the first seam it held)
        self.compact_looked = 0.0   # when on_tick last looked whether that /compact came
        self.missed = None          # (kind, prune target) a seam asked for while one was under way
        self.held = None            # the prune target (or False) of an automatic one a draft held back
        self.asked = None           # "Smart Compact" / "Smart Prune" the person asked for (the panel)
        self.repaint_at = None      # when to give Claude back its size after a repaint nudge
        self.reshow_at = None       # when to write cc-lhc's recent lines again over that repaint
        self.inproc = InProcessCompact(self)

    # -- asked for ---------------------------------------------------------------

    def on_request(self, relay) -> None:
        try:
            asked = os.read(self.session.control_r, 512)
        except BlockingIOError:
            asked = b""
        session = self.session
        if b"n" in asked:
            session.show_notices(relay)
        if b"t" in asked and session.too_long and session.too_long[0] not in session.too_long_handled:
            turn, ran = session.too_long
            session.too_long_handled.add(turn)
            if session.continued:
                # One automatic continuation per session: a second rejection means the
                # task itself is too big for one request.
                session.announce(self.SPLIT_NOTE, relay)
                session.home.log("too_long_again", turn=turn)
                return
            self.continue_note = self.RUNTIME_NOTE.format(ran=", ".join(ran) or "none")
            if self.inproc.pending is not None and self.inproc.replayed is not None:
                # The conversation the mod installed was refused itself: it is not accepted,
                # and the swap serves this one (a view of its own, the runtime note after it).
                self.inproc._refuse(relay, "the API refused the compacted conversation as too long",
                                    swap=False)
            if self.start(relay, manual=True):
                self.continue_note = None
            return
        if b"k" in asked and session.thinking_refused:
            refused, session.thinking_refused = session.thinking_refused, ""
            session.announce(self.THINKING_NOTICE.format(session=refused), relay)
            if not session.continued:
                self.continue_note = self.THINKING_NOTE
            # (the API refuses every request of this session until it is rebuilt: no waiting)
            if self.start(relay, manual=True, urgent=True):
                self.continue_note = None
            return
        if self.alarmed or not (b"h" in asked or b"p" in asked):
            return  # after the alarm only manual Smart Compact runs; the automatic swap stops
        if b"h" in asked:
            self.start(relay)
        else:
            self.start(relay, prune=session.policy["pruneTargetTokens"])

    def start(self, relay, manual=False, prune=None, urgent=False) -> str:
        """Begin a handoff if the seam allows; returns why not, or ''.

        ``prune`` (a target in tokens) makes it Smart Prune: the same steps with the
        pruned view, and no handoff at all when the visibility boundary would not move.
        """
        if self.candidate is not None or self.inproc.pending is not None:
            if not manual:  # asked again once that one is over (InProcessCompact)
                self.missed = ("prune", prune) if prune is not None else ("compact", None)
            return "a Smart Compact is already under way"
        if not self.continue_note and not urgent:
            why = self._person_is_writing()
            if why:
                self.session.home.log("handoff_waits_for_person", why=why, manual=manual)
                if not manual and why in (self.DRAFT_WAITS, self.DIALOG_WAITS, self.PERSON_COMPACT):
                    self.held = prune if prune is not None else False  # (asked again once it is gone)
                return why
        if self.submit_at is not None:
            # A runtime note or the continuation is typed but not yet submitted: a swap now
            # would drop it with the old Claude. The next settled seam asks again.
            return "a message to Claude is being typed"
        if self.session.detached:
            return self.session.detached
        self.asked = ("Smart Prune" if prune is not None else "Smart Compact") if manual else None
        try:
            return self._begin(relay, manual, prune, urgent=urgent) or ""
        except Exception as e:  # a failed attempt must never take the session down
            self.session.home.log("handoff_error", error=repr(e))
            self._fail(relay, f"could not prepare the rebuild: {e}", spawned=self.candidate is not None)
            return f"it could not start: {e}"

    # How long after the person sent a prompt Claude may still be writing it down: until
    # its turn is recorded (or this long has passed) the last seam recorded is not the one
    # Claude is at.
    SENT_SETTLE_SECONDS = 2.0
    DRAFT_WAITS = ("Claude's input box holds a message not sent yet; Smart Compact waits for it "
                   "(send it, or clear it with ctrl-c)")
    DIALOG_WAITS = ("a dialog of Claude's is open over its input box (a picker, the ctrl-o transcript); "
                    "Smart Compact waits for it to close")
    JUST_SENT = "a prompt was just sent to Claude"
    # The person's own /compact, sent while Claude worked, waits in Claude's queue until the
    # turn ends: the seam that ends it is theirs (through the mod's hook, as a Smart Compact
    # with their words; without the mod, Claude's own summary, which writes nothing until
    # its summary is back). cc-lhc's own /compact or a swap there would run over it. Held
    # until the hook asks or capture records a command turn begun after the send (by the
    # clock both read: a turn Claude had begun before may be recorded after it; a command
    # the menu made of a /com... that was not /compact is one too), for at most this long
    # from the first seam it held back.
    PERSON_COMPACT = "your /compact is on its way to Claude; this seam is left to it"
    PERSON_COMPACT_SECONDS = 300.0
    THREAD_BUSY = ("another process is writing this thread (a search bringing its index up to date, "
                   "say); Smart Compact waits for a seam after it is done")
    # How the reasons for not starting that pass by themselves begin (swap_soon waits them out).
    PASSING = (UNSETTLED, DRAFT_WAITS, DIALOG_WAITS, JUST_SENT, PERSON_COMPACT, THREAD_BUSY)

    def _person_is_writing(self) -> str:
        """Why Smart Compact must not start at this seam because of the person ('' if not)."""
        import time
        if self.draft.dialog:
            return self.DIALOG_WAITS
        if self.draft.one_digit and self._answered_since(self.draft.began_at):
            # The digit chose an option of Claude's permission dialog (1. Yes ... 4. No): the
            # call it was asked about was answered after it, so no text is in the box.
            self.draft.clear()
        if self.draft.pending:
            return self.DRAFT_WAITS
        if (self.draft.sent_at is not None and time.monotonic() - self.draft.sent_at < self.SENT_SETTLE_SECONDS
                and not self._sent_prompt_recorded()):
            return self.JUST_SENT + "; Smart Compact waits for it to be recorded"
        if self._person_compact_due():
            return self.PERSON_COMPACT
        return ""

    def _person_compact_due(self) -> bool:
        """Whether a /compact the person sent has yet to reach Claude's compaction (see
        PERSON_COMPACT); once it has, or the wait ran out, it is forgotten."""
        import time
        sent = self.draft.compact_sent_at
        if sent is None:
            return False
        now = time.monotonic()
        sent_at, since = self.compact_mark
        if since is None:
            since = now
            self.compact_mark = (sent_at, since)
        try:
            # (by the clock both read: capture may not have recorded the turn it was typed
            # during when it was sent, so a count of turns then would not do)
            written = record_time(self._newest(
                "SELECT m.created FROM turns t JOIN messages m ON m.seq = t.first_seq "
                "WHERE t.kind = 'command' ORDER BY t.n DESC LIMIT 1"))
            # (a prompt sent after it is no sign: Claude queues it behind the /compact)
            recorded = written is not None and written >= sent_at - self.SENT_CLOCK_SLACK
        except Exception:  # (a thread file that cannot be read now: the wait below still ends)
            recorded = False
        if not recorded and now - since < self.PERSON_COMPACT_SECONDS:
            return True
        if not recorded:
            self.session.home.log("person_compact_not_seen", waited=round(now - since, 1))
        self.person_compact_done()
        return False

    def _person_compact_gone(self, now) -> bool:
        """Whether no /compact of the person's holds a seam back (looked at twice a second)."""
        if self.draft.compact_sent_at is None:
            return True
        if now < self.compact_looked + 0.5:
            return False
        self.compact_looked = now
        return not self._person_compact_due()

    def person_compact_done(self) -> None:
        """The person's /compact reached Claude's compaction (or is given up on)."""
        self.draft.compact_sent_at = None
        self.compact_mark = (0.0, None)

    def _no_rebuild(self, relay, assessment, e, manual) -> str:
        """A rebuild that would serve nothing better (NoRebuild): logged, and the reason
        returned as why it did not start. A target with no room for a turn is said on the
        terminal too, once a session when Smart Compact asked by itself (it asks again at
        every seam, and nothing changes until the person does)."""
        session = self.session
        note_no_rebuild(session.home, session.capture.thread_id, assessment, e)
        if isinstance(e, ViewHoldsNoTurn):
            # (until the target, the thread or its newest turn changes, later seams are spared
            # the attempt, and the in-process one its /compact typed into Claude each time; a
            # header over the target alone leaves no room for any turn, however small)
            self.no_room = (session.capture.thread_id, session.policy.effective_target,
                            None if e.header >= e.budget else self._last_turn(), str(e))
            said = (session.capture.thread_id, e.budget)
            if not manual and said not in session.said_no_room:
                session.said_no_room.add(said)
                session.announce(f"Smart Compact did not run: {e}", relay)
        return str(e)

    def _left_behind(self, store, here) -> list:
        """Shell jobs and monitors this Claude process started in a session it has since left
        (a /clear, an in-app /resume): they run on in it, as plain Claude keeps them, and a
        swap ends it, so they are carried with the rest. Each keeps its own thread, where
        it is recorded as carried. ``here``: the session's own open items (background_items)."""
        session, items = self.session, []
        taken = {i.tool_use_id for i in here}
        here = end_evidence(store)  # (its end is told in the conversation Claude is in now)
        for thread, sid in dict.fromkeys(session.left_sessions):
            try:
                other = ThreadStore.existing(session.home, thread)
            except LhcError:
                continue  # (a thread dropped since: nothing of it runs)
            try:
                for item in background_items(other):
                    started_in = other.db.execute("SELECT source_session FROM messages WHERE seq = ?",
                                                  (item.seq,)).fetchone()
                    if (item.kind in ("shell", "monitor") and started_in == (sid,) and item.tool_use_id not in taken
                            and not _closed(item, 0, *here)):
                        item.thread = thread
                        taken.add(item.tool_use_id)
                        items.append(item)
            finally:
                other.close()
        return items

    def _begin(self, relay, manual=False, prune=None, urgent=False):
        session, spec, home = self.session, self.session.spec, self.session.home
        if self.host.stopping is not None:
            return "cc-lhc is stopping"
        if prune is None and self.no_room is not None:
            thread, budget, newest, why = self.no_room
            if ((thread, budget) == (session.capture.thread_id, session.policy.effective_target)
                    and (newest is None or newest == self._last_turn())):
                return why  # (see _no_rebuild)
        if not (urgent or self.continue_note) and thread_busy(home, session.capture.thread_id):
            # (before anything the person types is held back: the rebuild would wait for that
            # lock, up to half a minute, with their keys going nowhere; a recovery after the
            # API refused a request does not wait for a later seam: it waits for the lock)
            home.log("handoff_waits_for_thread", manual=manual)
            return self.THREAD_BUSY
        if self.inproc.usable and not self.continue_note:
            # In process when the mod is active: no swap unless that is refused.
            why = self.inproc.start(relay, manual, prune)
            if why is not None:
                return why
        capture = session.capture
        store = ThreadStore(home, capture.thread_id)
        try:
            a = assess(home, session.hostdb, store, capture.thread_id, spec.session_id, session.policy,
                       manual=manual, swap=True, prune=prune is not None)
            if not a.go:
                return a.reason
            here = background_items(store)
            self.carrying = here + self._left_behind(store, here)
            self.seam_turn = store.db.execute("SELECT max(n) FROM turns").fetchone()[0]
            manifest = self.carry.plan(self.carrying, spec.session_id, capture.path, store)
            # From here Smart Compact owns the settled session: bytes bound for Claude are
            # dropped (never buffered or replayed) until the switch or the failure says so.
            relay.drop_input = True
            held = bytes(relay.to_child)
            relay.to_child.clear()
            try:
                pending = rebuild(home, session.hostdb, store, capture.thread_id, spec.session_id,
                                  session.policy, spec.cwd, envelope_from=capture.path, assessment=a,
                                  plan_view=prune_planner(prune) if prune is not None else None,
                                  manifest=manifest)
            except NoRebuild as e:
                # Nothing was written and nothing swaps: Claude gets its input back.
                relay.drop_input = False
                relay.to_child[:0] = held
                return self._no_rebuild(relay, a, e, manual)
        finally:
            store.close()
        pending.descriptor = create_descriptor(home, session.hostdb, capture.thread_id,
                                               pending.session_id)
        self.pending = pending
        self._spawn(relay, pending.session_id, pending.descriptor, child_environment(spec))
        home.log("handoff_spawned", thread=capture.thread_id, old_session=spec.session_id,
                 new_session=pending.session_id, candidate_pid=self.candidate.pid,
                 argv=self.candidate_argv, **a.c)
        failpoint("after-candidate-spawn")

    def _spawn(self, relay, session_id, descriptor, env) -> None:
        """Start `claude --resume <session_id>` off-route: its own PTY, nothing routed to it."""
        import time
        import ptyprocess
        spec, home = self.session.spec, self.session.home
        kept, left_out = replacement_args(spec.claude_args)
        if left_out:
            home.log("replacement_args_left_out", args=left_out)
        kept = with_runtime(kept, confirmed_runtime(self.session.capture.path))
        env[RUNTIME_ENV] = descriptor["path"]
        env["PATH"] = descriptor["shim_dir"] + os.pathsep + os.environ.get("PATH", "")
        argv = [spec.child_argv[0], *retrieval_allow_args(), "--resume", session_id] + kept
        if spec.mod:
            argv = spec.mod.argv(argv)
        self.candidate = ptyprocess.PtyProcess.spawn(
            argv, cwd=spec.cwd, env=env, dimensions=self.host.size(),
            preexec_fn=_death_link_preexec(os.getpid()))
        self.candidate_since = utc_now_iso()
        self.candidate_argv = argv[1:]
        self.started, self.first_output = time.monotonic(), None
        self.replay, self.replay_overflow = bytearray(), False
        relay.readers["candidate"] = (self.candidate.fd, self._candidate_output)
        relay.timeout = 0.1

    def _survive(self, relay) -> None:
        """After repeated nonviable swaps (or rebuilds that could not be prepared at all):
        relaunch the same session with Claude native Compact allowed, so it can keep itself
        alive in degraded form. Persists per thread."""
        session, spec, home = self.session, self.session.spec, self.session.home
        self.survival = True
        registry = Registry(home)
        with Tx(registry.db) as db:
            db.execute("INSERT OR REPLACE INTO thread_alarms VALUES (?, ?, ?)",
                       (session.capture.thread_id, self.alarm, utc_now_iso()))
        registry.save_copy(session.capture.thread_id)
        spec.autocompact = True  # from now on no child of this thread gets the disable
        env = child_environment(spec)
        env.pop("DISABLE_AUTO_COMPACT", None)
        self._spawn(relay, spec.session_id, session.descriptor, env)
        home.log("survival_relaunch_spawned", session=spec.session_id, candidate_pid=self.candidate.pid)

    # -- waiting for the replacement ---------------------------------------------------

    def _candidate_output(self, relay) -> None:
        import time
        try:
            data = os.read(self.candidate.fd, Relay.CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            relay.remove_reader("candidate")  # it closed its terminal: the tick will see it
            return
        if self.first_output is None:
            self.first_output = time.monotonic()
        # What the replacement drew on its own blank terminal is replayed onto the user's at
        # the switch, so the screen and Claude's idea of it agree from the first byte.
        if len(self.replay) + len(data) <= self.REPLAY_LIMIT:
            self.replay += data
        else:
            self.replay_overflow = True

    def swap_soon(self, relay) -> None:
        """Swap now, or as soon as the seam settles (within SEAM_WAIT_SECONDS)."""
        import time
        why = self.start(relay, manual=True)
        if why.startswith(self.PASSING):
            now = time.monotonic()
            if self.retry_until is None:
                self.retry_until = now + self.SEAM_WAIT_SECONDS
                self.session.home.log("handoff_waits_for_seam", why=why)
            if now < self.retry_until:
                self.retry_at = now + self.SEAM_RETRY_SECONDS
                return
            self.session.home.log("handoff_seam_wait_over", why=why)
        self.retry_at = self.retry_until = None

    @property
    def wants_tick(self) -> bool:
        return (self.candidate is not None or self.submit_at is not None or self.retry_at is not None
                or self.repaint_at is not None or self.reshow_at is not None or self.inproc.wants_tick
                or self.session.overlay_until is not None)

    def _repaint(self) -> None:
        import time
        rows, cols = self.host.size()
        try:
            self.host.child.setwinsize(rows, max(1, cols - 1))
        except OSError:
            return
        self.repaint_at = time.monotonic() + 0.15

    def on_tick(self, relay) -> None:
        import time
        self.inproc.on_tick(relay)
        now = time.monotonic()
        if self.session.overlay_done(now) and relay.child_alt_screen and not relay.hold_output \
                and self.candidate is None and self.repaint_at is None:
            # cc-lhc's lines have had their time: Claude draws its whole screen again, with
            # nothing of them left in its rows (on the alternate screen, which it draws whole)
            relay.to_user += b"\x1b[H\x1b[2J"
            self._repaint()
        if self.reshow_at is None and self.session.overlay_cleared(relay) and not relay.hold_output:
            # Claude drew its whole screen over lines that still have time to stand (the
            # startup lines, when its first frame comes late): written again once it is done
            self.reshow_at = now + self.RESHOW_SECONDS
        if self.repaint_at is not None and now >= self.repaint_at:
            self.repaint_at = None
            try:
                self.host.child.setwinsize(*self.host.size())
            except OSError:
                pass
            self.reshow_at = now + self.RESHOW_SECONDS
        if self.reshow_at is not None and now >= self.reshow_at:
            # Claude's repaint wrote over the lines that said why: written again over it
            self.reshow_at = None
            self.session.show_notices(relay, again=True)
        if self.retry_at is not None and now >= self.retry_at and self.candidate is None:
            self.swap_soon(relay)
        if self.submit_at is not None and now >= self.submit_at:
            self.submit_at = None
            relay.to_child += b"\r"
        if self.candidate is None:
            if (self.held is not None and not self.draft.pending
                    and now - self.last_input >= self.QUIET_SECONDS and self._person_compact_gone(now)):
                # The draft (or dialog) that held an automatic Smart Compact back was erased
                # (or closed) without a send, or the person's /compact never came: the seam
                # it held back is asked again.
                held, self.held = self.held, None
                self.start(relay, prune=held if held is not False else None)
            self._tell_carried(relay)
            return
        if self.host.stopping is not None:
            # (the old Claude was told to stop too: switching to the replacement would go on
            # with a session asked to end, and carry jobs the old Claude ended as it stopped)
            self._fail(relay, f"cc-lhc was asked to stop ({signal.Signals(self.host.stopping).name}) "
                              "during the swap", nonviable=False)
        elif not self.candidate.isalive():
            self._fail(relay, "the replacement exited before it was shown")
        elif self.first_output is not None and now - self.first_output >= self.STABILISE_SECONDS:
            self._switch(relay)
        elif now - self.started > self.GIVE_UP_SECONDS:
            self._fail(relay, "the replacement did not render in time")

    # -- the switch, in one step ---------------------------------------------------------

    def _after_switch(self, step: str, fn, *args):
        """One step after the switch that writes cc-lhc's own state: the person is on the
        replacement already, so a state folder that cannot take the write (a full disk, a
        thread locked for long) costs that step, logged, never the session (what is left
        undone is done by the session's end or the next launch: capture catches up, an
        unaccepted rebuild Claude works in is accepted)."""
        try:
            return fn(*args)
        except Exception as e:
            self.session.home.log("handoff_step_failed", step=step, error=repr(e))
            return None

    def _switch(self, relay) -> None:
        session, spec, home = self.session, self.session.spec, self.session.home
        new, pending = self.candidate, self.pending
        old_child, old_capture, old_descriptor = self.host.child, session.capture, session.descriptor
        if not self.survival:
            failpoint("before-switch")
            try:  # (before the terminal moves: a state folder that cannot take it leaves the old Claude on)
                fresh = new_capture(spec, home, session.policy, session.hostdb, old_capture.thread_id,
                                    pending.session_id, pending.path)
            except Exception as e:
                self._fail(relay, f"cc-lhc's state folder could not take the new session ({e})",
                           nonviable=False)  # (told, when the person asked for it)
                return
        self.asked = None
        relay.remove_reader("candidate")
        relay.timeout = None
        relay.switch_master(new.fd)
        self.host.child, self.host.child_since = new, self.candidate_since
        if spec.mod:
            spec.mod.expect(new.pid)  # the replacement's mod shakes hands anew
        rows, cols = self.host.size()
        try:
            if tuple(new.getwinsize()) != (rows, cols):  # (resized while it was starting)
                new.setwinsize(rows, cols)
        except OSError:
            pass
        # The old screen (and the notice, when input was dropped) scrolls up into the
        # terminal's history; the replacement's own first frame is drawn on a clean screen.
        notice = f"\r\n{PROG}: {self.NOTICE}" if relay.dropped else ""
        frame = (notice + "\r\n" * rows + "\x1b[H\x1b[2J").encode() + bytes(self.replay)
        if relay.dropped:
            session.notices.append(self.NOTICE)
            home.log("notice", text=self.NOTICE, dropped_bytes=relay.dropped)
            # On the alternate screen Claude draws on, nothing scrolls into history: the
            # notice is also written over the replacement's bottom line, where it stands
            # until Claude next draws that line (the cursor put back where Claude left it).
            frame += session.shown_in_frame(self.NOTICE, (rows, cols))
        if relay.hold_output:
            # The panel is open: the old Claude's held output belongs to a screen that is
            # gone, so the replacement's first frame is what the panel's closing shows.
            relay.held[:] = frame
        else:
            relay.to_user += frame
        relay.dropped = 0
        relay.drop_input = False
        if self.replay_overflow:  # too much to replay: a size change makes Claude redraw
            new.setwinsize(rows, max(1, cols - 1))
            new.setwinsize(rows, cols)
        if self.survival:  # same session, same transcript: capture and descriptor stay
            self.candidate, self.survival = None, False
            home.log("survival_relaunched", session=spec.session_id, old_pid=old_child.pid,
                     new_pid=new.pid)
            self._end_old(old_child)
            self.host.watch(new.pid)
            return
        # capture generation and descriptor move with the routing
        lease = old_capture.lease
        old_capture.lease = None
        carried = self.carry.take(self.carrying, spec.session_id, old_capture.path, old_child.pid)
        self.carrying = []
        session.left_sessions = []  # (the replacement is a new process: what it left is carried)
        spec.session_id = spec.resume = pending.session_id
        fresh.lease = lease
        fresh.request_handoff = old_capture.request_handoff
        session.capture, session.descriptor = fresh, pending.descriptor
        self.candidate, self.pending = None, None
        self.draft.clear()  # the replacement's box is empty
        # The old Claude is ended before its last lines are read: whatever it still wrote
        # reaches the record, and a turn it opened after the seam (a notification that came
        # meanwhile) is known to be over, not left open under every later seam.
        self._end_old(old_child, self.carry.end_signal())
        self._after_switch("finish_capture", finish_capture, old_capture, spec, home)
        self._after_switch("interrupt_left_turn", self._interrupt_left_turn, old_capture)
        self._after_switch("tell_after_seam", self._tell_after_seam, old_capture)
        fresh.start()
        self._after_switch("remove_descriptor", remove_descriptor, home, session.hostdb, old_descriptor,
                           "handed off")
        home.log("handoff_switched", thread=fresh.thread_id, new_session=spec.session_id,
                 old_pid=old_child.pid, new_pid=new.pid)
        self._after_switch("carry_journals", self.carry.carry_journals, old_capture.path, pending.path)
        self.host.watch(new.pid)
        if carried:
            session.announce(carried, relay)
        failpoint("after-switch-before-accept")
        if self.continue_note:
            # The one automatic continuation after a too-long rejection, marked as such.
            # Enter follows a moment later: arriving with the text, Claude reads it as part
            # of a paste instead of a submit.
            import time
            relay.to_child += self.continue_note.encode()
            self.submit_at = time.monotonic() + 0.3
            session.continued, self.continue_note = True, None
            self.told_at_turn = self._last_turn()
            home.log("too_long_continued", session=spec.session_id)
        for waiting in [p for p in (session.pending, pending) if p]:
            if os.path.getsize(waiting.path) > waiting.prefix:
                if self._after_switch("accept", accept, home, fresh.thread_id, waiting) is None:
                    session.pending = waiting  # (it failed: tried again when the session ends)
                elif waiting is session.pending:
                    session.pending = None
            else:
                session.pending = waiting  # settled when the session ends
                home.log("handoff_acceptance_deferred", session=waiting.session_id)

    # -- telling Claude about carried work -------------------------------------------

    QUIET_SECONDS = 1.5

    def listen(self, relay) -> None:
        """Note when the person types, so a runtime note never lands in the middle of it."""
        import time
        inner = relay.on_input

        def heard(data):
            self.last_input = time.monotonic()
            out = inner(data) if inner else data
            delivered = out and not (relay.drop_input or relay.in_drop_tail(out))
            compact_sent = self.draft.compact_sent_at
            if delivered and self.draft.feed(out, self.last_input):
                # (what is dropped never reached the box) a prompt went: the next one recorded
                # is newer than the newest now, and Claude wrote it after this moment (by the
                # clock both read here): a prompt captured late, sent before, is not it
                try:
                    newest = self._last_prompt() or 0
                except Exception:  # (a thread file that cannot be read now: the keys still go)
                    newest = self.sent_mark[0]
                self.sent_mark = (newest, time.time())
                self.held = None  # (the seam it held back is gone: the next one asks again)
            if delivered and self.draft.compact_sent_at != compact_sent:
                self.compact_mark = (time.time(), None)  # (the command turn Claude writes comes after)
            return out

        relay.on_input = heard

    def _tell_carried(self, relay) -> None:
        """Type the next note about carried work, marked [runtime note], at a settled seam
        and only after the person has not typed for a moment, so it does not land in the
        middle of what they are writing."""
        import time
        if (self.submit_at is not None or relay.to_child or self.session.detached or self.draft.pending
                or time.monotonic() - self.last_input < self.QUIET_SECONDS):
            return
        note = self.carry.next_note(self._settled_for_note)
        if not note:
            return
        relay.to_child += note.encode("utf-8")
        self.submit_at = time.monotonic() + 0.3  # Enter apart from the text, as for the continuation
        self.told_at_turn = self._last_turn()
        self.session.home.log("carried_note_sent", session=self.session.spec.session_id,
                              note=note[:200])

    def _last_turn(self):
        return self._newest("SELECT max(n) FROM turns")

    def _answered_since(self, began) -> bool:
        """Whether the person answered a permission dialog of Claude's after wall-clock time
        ``began``: a tool call made before it got its result after it, and that result's
        record says the decision was the person's (``permissionDecision``; an allow rule's
        is the settings', and a call run without asking shows no dialog)."""
        if began is None:
            return False
        at = datetime.datetime.fromtimestamp(began, datetime.timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
        store = ThreadStore(self.session.home, self.session.capture.thread_id)
        try:
            calls = [row[0] for row in store.db.execute(
                "SELECT c.tool_use_id FROM messages c JOIN messages r ON r.kind = 'tool_result' "
                "AND r.tool_use_id = c.tool_use_id AND r.agent IS NULL WHERE c.kind = 'tool_call' "
                "AND c.agent IS NULL AND c.created <= ? AND r.created >= ?", (at, at))]
        finally:
            store.close()
        return any(_decided_by_person(self.session.capture.path, call) for call in calls)

    def _last_prompt(self):
        """The newest message the person sent that capture has recorded: a prompt opens a
        turn with one, a message sent while Claude works joins the running turn as one."""
        return self._newest("SELECT max(seq) FROM messages WHERE kind = 'user_text' AND agent IS NULL")

    def _sent_prompt_recorded(self) -> bool:
        """Whether the prompt last sent is recorded: a message of the person's newer than
        the newest at the send, written by Claude at or after it. (A prompt sent before,
        captured only since, is newer too: cc-lhc stopped or far behind while it went.)"""
        seq, sent = self.sent_mark
        store = ThreadStore(self.session.home, self.session.capture.thread_id)
        try:
            row = store.db.execute("SELECT seq, created FROM messages WHERE kind = 'user_text' AND "
                                   "agent IS NULL ORDER BY seq DESC LIMIT 1").fetchone()
        finally:
            store.close()
        if row is None or row[0] <= seq:
            return False
        written = record_time(row[1])
        return written is None or written >= sent - self.SENT_CLOCK_SLACK

    SENT_CLOCK_SLACK = 0.05  # seconds: Claude stamps its records to the millisecond

    def _newest(self, sql):
        store = ThreadStore(self.session.home, self.session.capture.thread_id)
        try:
            row = store.db.execute(sql).fetchone()
        finally:
            store.close()
        return row[0] if row else None

    def _settled_for_note(self) -> bool:
        """A settled seam that is not the one a note was last typed at."""
        store = ThreadStore(self.session.home, self.session.capture.thread_id)
        try:
            if unsettled_reason(store):
                return False
            row = store.db.execute("SELECT max(n) FROM turns").fetchone()
        finally:
            store.close()
        newest = row[0] if row else None
        if self.told_at_turn is not None and (newest or 0) <= self.told_at_turn:
            return False
        self.told_at_turn = None
        return True

    def _on_thread(self, thread_id, fn, failed: str):
        """fn(store) on the thread's store, or None (logged as ``failed``) when it fails: a
        note about the thread at the switch must never take the session down."""
        store = None
        try:
            store = ThreadStore(self.session.home, thread_id)
            return fn(store)
        except Exception as e:  # noqa: BLE001 - the record stays as it was
            self.session.home.log(failed, error=repr(e))
            return None
        finally:
            if store is not None:
                store.close()

    def _interrupt_left_turn(self, old_capture) -> None:
        # (on failure the next prompt ends that turn)
        n = self._on_thread(old_capture.thread_id, lambda store: store.interrupt_open_turn(
            old_capture.session_id, "swapped"), "left_turn_not_ended")
        if n is not None:
            self.session.home.log("left_turn_interrupted", thread=old_capture.thread_id,
                                  session=old_capture.session_id, turn=n)

    def resized(self, rows, cols) -> None:
        """The terminal changed size: a replacement still starting off-route follows it."""
        if self.candidate is not None:
            try:
                self.candidate.setwinsize(rows, cols)
            except OSError:
                pass

    def _tell_after_seam(self, old_capture) -> None:
        """The replacement runs on what the thread held at the seam; what reached the old
        Claude since (see after_seam_note) is told to it as a runtime note."""
        note = self._on_thread(old_capture.thread_id, lambda store: after_seam_note(
            store, self.seam_turn, old_capture.session_id), "after_seam_not_told")
        if note:
            self.carry.tell(note)
            self.session.home.log("after_seam_told", thread=old_capture.thread_id, note=note[:200])

    def _end_old(self, old_child, first=None) -> None:
        taking = False
        if first is not None:
            # Claude ends its background jobs on SIGTERM and SIGHUP (a closing terminal);
            # only SIGKILL leaves the jobs the replacement's session carries running. What
            # it started (the carried jobs' shells among them) is taken in by cc-lhc as it
            # ends (Linux), so a job's exit status is read when it ends, as Claude would have;
            # only for that moment: what those processes leave later goes to init as before.
            left = children_of(old_child.pid)
            taking = bool(left) and set_subreaper(True)
            if taking:
                self.carry.taken_in.update(left)
            try:
                os.kill(old_child.pid, first)
                if taking:
                    _wait_dead(old_child.pid)  # (its children are taken in as it dies: then no more)
            except OSError:
                pass
            finally:
                if taking:
                    set_subreaper(False)
            if taking:
                # As it died, the hangup of its terminal ended what ran in its foreground, and
                # what those had started came to cc-lhc too, some a moment later: found by
                # their sessions (its own, its jobs'), started before now (no process cc-lhc
                # starts from now on is taken for one, should it get a pid of theirs).
                sessions = {old_child.pid} | {pid for pid in left if _leads_session(pid)}
                self.carry.taken_sessions.append((frozenset(sessions), clock_ticks()))
                self.carry.take_in_left()
        _close_child(old_child)
        if old_child.isalive():
            self.session.home.log("old_child_survived", pid=old_child.pid)
            self.session.survivors.append(old_child.pid)
            self.session.announce(survivor_note(old_child.pid))

    def _fail(self, relay, why: str, spawned=True, nonviable=True) -> None:
        home = self.session.home
        relay.remove_reader("candidate")
        relay.timeout = None
        relay.drop_input = False
        if relay.dropped:
            home.log("dropped_input", bytes=relay.dropped)
            self.session.announce(self.NOTICE, relay)  # (logged, kept for the end, stacked)
            relay.dropped = 0
        if self.candidate is not None:
            _close_child(self.candidate)
        if self.pending:
            # (each on its own: a state folder that takes no write leaves the record pending,
            # which the thread's next launch rolls back, and the session goes on all the same)
            pending = self.pending
            self._after_switch("revoke_descriptor", remove_descriptor, home, self.session.hostdb,
                               pending.descriptor, "nonviable")
            self._after_switch("abandon", abandon, home, Registry(home), pending.session_id, why)
            self._after_switch("receipt", Receipts(self.session.hostdb, home).outcome, pending.receipt,
                               f"failed: {why}")
        self.candidate, self.pending = None, None
        self.continue_note = None
        self.carrying = []
        if self.asked and not self.survival:
            # The person asked from the panel and is looking at a screen cleared for the
            # switch: said, and Claude made to draw its screen again (a size change and back).
            self.session.announce(f"{self.asked} did not complete ({why}); the session goes on as "
                                  "it was, and nothing was lost", relay)
            self._repaint()
        self.asked = None
        if self.survival:
            self.survival = False
            home.log("survival_relaunch_failed", why=why)  # the old child simply keeps running
            return
        if not nonviable:  # (nothing was wrong with the replacement: no step toward the alarm)
            home.log("handoff_given_up", why=why)
            return
        self.failures += 1
        self.unprepared += not spawned
        home.log("handoff_failed", why=why, failures=self.failures)
        if self.failures >= self.MAX_FAILURES and not self.alarmed:
            self.alarmed = True
            if self.unprepared == self.failures:
                self.alarm = self.UNPREPARED_ALARM.format(n=self.failures, why=why)
            home.log("handoff_alarm", message=self.alarm)
            self.session.alarms.append(self.alarm)
            try:
                self._survive(relay)
            except Exception as e:  # the old child keeps running either way
                self.survival = False
                home.log("survival_relaunch_failed", why=repr(e))


class InProcessCompact:
    """Smart Compact inside the running Claude, through the cc-lhc mod (DESIGN step 6).

    Same assessment and view as a swap (section 12, rebuild with ``in_process``), but the
    view goes to the mod's session.compact hook: cc-lhc types `/compact` into the PTY it
    owns under the swap's input-drop rule and notice, the hook takes the view, Claude
    installs it on the same session and process, and capture sees it written back. The
    first request Claude sends afterwards accepts it. A person's own /compact reaches
    here as the hook's request. Anything refused (no view taken, nothing installed within
    SERVE_SECONDS) settles the row and falls back to the swap, said once. Relay's thread.
    """

    SERVE_SECONDS = 10.0
    # Enter in a read of its own, after the text. Claude takes a long burst of input for a
    # paste (a newline in it does not submit), which is why the runtime notes wait 0.3 s;
    # `/compact` is nine bytes, and with no gap at all it still submitted in every run
    # measured (scripts/bench.py live-compact), so a short gap is enough.
    SUBMIT_DELAY = 0.02
    FALLBACK = "in-process Smart Compact was refused ({why}); cc-lhc swaps the Claude process instead"
    PERSON = ("your /compact runs as a cc-lhc Smart Compact through the cc-lhc mod: the newest turns "
              "stay word for word, nothing is summarised away")
    PERSON_NATIVE = "your /compact runs Claude's own summary ({why}); cc-lhc still keeps every turn"
    PERSON_JUST_DONE = ("your /compact is not needed: cc-lhc compacted this conversation a moment ago, "
                        "with the newest turns word for word")

    def __init__(self, handoff):
        self.handoff = handoff
        self.session = handoff.session
        self.pending = None
        self.deadline = None
        self.typed = False         # cc-lhc typed this /compact (its input is dropped until served)
        self.replayed = None       # the newest seq when capture saw the view written back
        self.refused = ""          # once refused in this window, the swap serves from then on
        self.started = None
        self.seen = 0              # views capture had seen when this one started

    @property
    def usable(self) -> bool:
        mod = self.session.spec.mod
        return bool(mod and mod.active and not self.refused and self.session.descriptor)

    @property
    def wants_tick(self) -> bool:
        return self.pending is not None

    # A request from the mod's hook (a /compact running) comes right after the person typed or
    # while Claude draws; this long after either, Claude is idle at its prompt.
    LISTEN_SECONDS = 5.0

    def listening(self, now: float, output_at) -> bool:
        """Whether a request from the mod's hook is to be looked for often now."""
        last = max(self.handoff.last_input, output_at or 0.0)
        return self.usable and now - last < self.LISTEN_SECONDS

    def start(self, relay, manual=False, prune=None, person=None):
        """'' once the in-process path runs, a reason when nothing should run now, or None
        when it was refused and the swap should go ahead.

        For a plain Smart Compact cc-lhc types /compact first and builds the view while
        Claude gets to its hook, which waits for it in its file; Smart Prune builds first,
        since a prune that would change nothing types nothing.
        """
        session, spec, home = self.session, self.session.spec, self.session.home
        capture = session.capture
        spec.mod.ready()
        store = ThreadStore(home, capture.thread_id)
        early = person is None and prune is None
        try:
            a = assess(home, session.hostdb, store, capture.thread_id, spec.session_id, session.policy,
                       manual=manual or person is not None, prune=prune is not None)
            if not a.go:
                return a.reason
            since = getattr(self.handoff.host, "child_since", None)
            forgets = reads_claude_would_forget(store, project_folders(spec), since) if since else []
            if person is None and forgets:
                # Claude forgets them when it compacts; a swap's resume carries them (a person's
                # own /compact still runs in process: Claude's summary would lose far more).
                home.log("in_process_compact_skipped", why="reads it would forget", files=forgets[:20])
                return None
            if person is None:
                relay.drop_input = True
                relay.to_child.clear()
            if early:
                self._write_view_state(preparing=True)
                self._type_compact(relay)
            try:
                self.pending = rebuild(home, session.hostdb, store, capture.thread_id, spec.session_id,
                                       session.policy, spec.cwd, envelope_from=capture.path, assessment=a,
                                       plan_view=prune_planner(prune) if prune is not None else None,
                                       in_process=session.descriptor, instructions=person or "")
            except NoRebuild as e:
                relay.drop_input = False
                if early:
                    self._write_view_state(refused=str(e))  # the waiting hook leaves Claude as it is
                return self.handoff._no_rebuild(relay, a, e, manual or person is not None)
            except LhcError as e:
                relay.drop_input = False
                if early:
                    self._write_view_state(refused=str(e))  # the waiting hook leaves Claude as it is
                self._refuse(relay, str(e), swap=False)  # the caller goes on with the swap
                return None
        finally:
            store.close()
        import time
        self.started = time.monotonic()
        self.deadline = self.started + self.SERVE_SECONDS
        self.replayed, self.typed = None, person is None
        self.seen = len(session.views_replayed)
        if self.typed and not early:
            self._type_compact(relay)
        if self.typed:
            failpoint("after-compact-typed")
        home.log("in_process_compact_started", thread=capture.thread_id, session=spec.session_id,
                 key=self.pending.session_id, typed=self.typed, **a.c)
        return ""

    def _type_compact(self, relay) -> None:
        """Type /compact into Claude's terminal now, Enter SUBMIT_DELAY after the text."""
        import time
        # ctrl-u first: a draft left in Claude's box must not become part of the command
        self._send(relay, b"\x15/compact")
        time.sleep(self.SUBMIT_DELAY)
        self._send(relay, b"\r")

    @staticmethod
    def _send(relay, data: bytes) -> None:
        """Straight to Claude's terminal, behind anything the relay still holds for it."""
        if not relay.to_child:
            try:
                data = data[os.write(relay.master_fd, data):]
            except BlockingIOError:
                pass
        relay.to_child += data

    def _view_path(self) -> str:
        return os.path.join(self.session.descriptor["shim_dir"], MOD_VIEW_FILE)

    def _write_view_state(self, **state) -> None:
        """The view file while no view is in it: being built, or given up (why)."""
        descriptor = self.session.descriptor
        try:
            _write_private_json(self._view_path(), {"token": descriptor["token"],
                                                    "session_id": self.session.spec.session_id, **state})
        except OSError as e:  # the hook then finds no view: Claude's own summary, said in the log
            self.session.home.log("in_process_view_state_unwritten", error=repr(e))

    def _hook_said(self) -> dict:
        """What the mod's hook left in the view file: {'taken': True}, {'declined': why}, or {}
        while the view (or nothing) stands there. A taken view gone from it was claimed by
        `cc-lhc mod-compact`."""
        path = self._view_path()
        try:
            if os.path.getsize(path) > 4096:
                return {}  # the view itself, not yet read
            body = load_json(read_small_file(path, 4096))
        except FileNotFoundError:
            return {"taken": True}
        except (OSError, ValueError, LhcError):
            return {}
        if not isinstance(body, dict) or "token" in body or body.get("key") != self.pending.session_id:
            return {}
        return body

    def on_tick(self, relay) -> None:
        import time
        if self.pending is None:
            if not self.usable:
                self._rebound_by_request()
            if self.usable:
                self._answer_request(relay)
            return
        now = time.monotonic()
        session = self.session
        if self.replayed is None:
            said = self._hook_said() if self.typed else {}
            if len(session.views_replayed) > self.seen:
                self.replayed = session.views_replayed[-1]
                self._release(relay)
                self._clear_view()
                session.home.log("in_process_compact_served", session=session.spec.session_id,
                                 key=self.pending.session_id, seconds=round(now - self.started, 3))
                failpoint("after-view-replayed")
            elif "declined" in said:
                self._refuse(relay, f"the cc-lhc mod declined it: {said['declined']}")
            elif now > self.deadline:
                took = "taken" in said or not self.typed and not os.path.exists(self.pending.path)
                self._refuse(relay, ("the hook took the view but Claude did not install it" if took else
                                     "the hook did not take the view") + f" within {self.SERVE_SECONDS:g} s",
                             swap=self.typed)
            return
        if self.usable:
            self._answer_request(relay)  # a person's /compact before the first request on this one
        if self.pending is None:
            return
        store = ThreadStore(session.home, session.capture.thread_id)
        try:
            # (an API error Claude writes as an answer carries a usage of its own: not one)
            answered = store.db.execute("SELECT 1 FROM usage WHERE source_session = ? AND seq > ? AND "
                                        "coalesce(model, '') != '<synthetic>' LIMIT 1",
                                        (session.spec.session_id, self.replayed)).fetchone()
        finally:
            store.close()
        if answered:
            pending, self.pending = self.pending, None
            accept_in_process(session.home, session.capture.thread_id, pending, self.replayed)
            if self.handoff.missed:
                # A seam (the first answer on the compacted conversation, say) asked for Smart
                # Compact (or Smart Prune) while this one waited to be accepted: looked at now.
                (kind, target), self.handoff.missed = self.handoff.missed, None
                self.session.home.log("handoff_asked_again", session=session.spec.session_id, kind=kind)
                self.handoff.start(relay, prune=target)

    def _clear_view(self) -> None:
        """The view is in Claude now: no later compaction may find it again."""
        for name in (MOD_VIEW_FILE, MOD_SERVED_FILE):
            try:
                os.unlink(os.path.join(self.session.descriptor["shim_dir"], name))
            except OSError:
                pass

    def _release(self, relay) -> None:
        """Input reaches Claude again; what was dropped meanwhile is said once."""
        if not self.typed:
            return
        relay.drop_input = False
        if relay.dropped:
            self.session.notices.append(LiveHandoff.NOTICE)
            self.session.announce(LiveHandoff.NOTICE, relay)
            relay.dropped = 0

    def _refuse(self, relay, why: str, swap: bool = True) -> None:
        session, home = self.session, self.session.home
        if self.pending is not None:
            abandon(home, Registry(home), self.pending.session_id, why)
            Receipts(session.hostdb, home).outcome(self.pending.receipt, f"failed: {why}")
            if self.typed:
                self._write_view_state(refused=why)  # a hook still waiting leaves Claude as it is
        self.pending = None
        self._release(relay)
        relay.drop_input = False
        self.refused = why
        home.log("in_process_compact_refused", why=why)
        session.announce(self.FALLBACK.format(why=why), relay)
        if swap:
            self.handoff.swap_soon(relay)

    def _rebound_by_request(self) -> None:
        """After /clear the mod gives no handshake for the new session, but its compact
        hook asking for a view through this session's descriptor shows it serves it: the
        person's /compact goes through the hook, not Claude's own lossy summary."""
        mod = self.session.spec.mod
        if mod is None or not mod.unbound_for or self.refused or self.session.descriptor is None:
            return
        descriptor = self.session.descriptor
        request = _read_bound_json(descriptor["shim_dir"], MOD_REQUEST_FILE, descriptor["token"])
        session_id = self.session.spec.session_id
        if request is not None and request.get("session_id") == session_id:
            mod.confirm(session_id)

    def _answer_request(self, relay) -> None:
        """A person's own /compact: the hook asks for a view; prepare one or refuse it."""
        descriptor = self.session.descriptor
        folder = descriptor["shim_dir"]
        request = _read_bound_json(folder, MOD_REQUEST_FILE, descriptor["token"])
        if request is None:
            return
        try:
            os.unlink(os.path.join(folder, MOD_REQUEST_FILE))
        except OSError:
            pass
        # (the person's /compact has come: the seam it held back is its own)
        self.handoff.person_compact_done()
        self.handoff.held = None
        why = ""
        if self.pending is not None:
            # Installed a moment ago and not yet sent: there is nothing older to compact, and
            # Claude's own summary would only take the newest turns' exact words away.
            reason = "cc-lhc compacted this conversation a moment ago"
            _write_private_json(os.path.join(folder, MOD_REFUSED_FILE),
                                {"token": descriptor["token"], "reason": reason, "skip": True})
            self.session.announce(self.PERSON_JUST_DONE, relay)
            self.session.home.log("person_compact_skipped", reason=reason)
            return
        if request.get("session_id") != self.session.spec.session_id:
            why = "it came from another session"
        elif request.get("trigger") != "manual":
            why = f"cc-lhc leaves a compaction triggered {request.get('trigger')!r} to Claude"
        elif self.session.policy["nativeCompact"]:
            why = "nativeCompact is on"
        else:
            try:
                why = self.start(relay, person=str(request.get("instructions") or ""))
            except Exception as e:  # a failed attempt must never take the session down
                self.session.home.log("in_process_compact_error", error=repr(e))
                why = f"its view could not be built: {e}"
            if why is None:
                why = self.refused
        if why:
            _write_private_json(os.path.join(folder, MOD_REFUSED_FILE),
                                {"token": descriptor["token"], "reason": why})
            self.session.announce(self.PERSON_NATIVE.format(why=why), relay)
        else:
            self.session.announce(self.PERSON, relay)

    def close(self, relay=None, why="the session ended before Claude took the view") -> None:
        """The session ends, or Claude leaves it (/clear, an in-app /resume; with ``relay``):
        a view Claude installed stands (its transcript holds it and a resume continues from
        it); one it never took is settled as unused. Either way no compaction is under way
        any more, and input reaches Claude."""
        if self.pending is None:
            return
        pending, self.pending = self.pending, None
        home = self.session.home
        if self.replayed is not None:
            accept_in_process(home, self.session.capture.thread_id, pending, self.replayed)
        else:
            abandon(home, Registry(home), pending.session_id, why)
        if relay is not None:
            self._release(relay)


CLEAR_COMMAND = "<command-name>/clear</command-name>"


def tick_seconds(panel, handoff, mod, output_at, now: float) -> float:
    """How long the relay may wait for its next tick: a twentieth of a second while the
    control panel is open, a tenth while a handoff (or the mod's handshake, or a request
    from its hook) may need it, else SessionFollower's half a second: Claude idle at its
    prompt costs a few looks a second."""
    if panel.wants_tick:
        return 0.05
    if handoff.wants_tick or (mod and mod.waiting) or handoff.inproc.listening(now, output_at):
        return 0.1
    return SessionFollower.POLL_SECONDS


class SessionFollower:
    """Follows Claude when it moves to another session inside the same process.

    /clear starts a new session file and an in-app /resume reopens another one; Claude
    says which session it is on in the file it keeps for its pid. When that is not the
    session cc-lhc bound, the old binding fails closed at once (retrieval refuses, capture
    of the old session ends cleanly), and then cc-lhc follows: a /clear becomes a new
    thread, captured and governed from its first line; a resumed session's thread is
    taken when its lease is free. Runs on the relay's thread, between handoffs.
    """

    POLL_SECONDS = 0.5

    def __init__(self, session, host, handoff):
        self.session, self.host, self.handoff = session, host, handoff
        self.next_poll = 0.0
        self.refused = None  # a session cc-lhc could not take: not asked again
        self.left = None     # the bound session, let go when Claude moved to a refused one
        self.seen, self.sid = None, None  # (pid, mtime, size) of Claude's pid file, its session

    def on_tick(self, relay) -> None:
        import time
        now = time.monotonic()
        if now < self.next_poll or self.handoff.candidate is not None:
            return
        self.next_poll = now + self.POLL_SECONDS
        # Twice a second on the relay's thread: a stat, and the file read again only when
        # Claude has rewritten it.
        pid = self.host.child.pid
        try:
            st = os.stat(os.path.join(claude_config_dir(), "sessions", f"{pid}.json"))
            seen = (pid, st.st_mtime_ns, st.st_size)
        except OSError:
            return
        if seen != self.seen:
            self.seen = seen
            self.sid = claude_session_of(pid)
        self.take(relay, self.sid)

    def take(self, relay, sid) -> None:
        """Follow Claude to ``sid`` when it is another session than the bound one; the
        poll above and the mod's own session.start report both land here."""
        # (back on the session it was bound to after a refused move: taken again)
        if sid and sid != self.refused and (sid != self.session.spec.session_id or sid == self.left):
            try:
                self.follow(relay, sid)
            except Exception as e:  # never take the session down over following it
                self.session.home.log("follow_error", session=sid, error=repr(e))
                self.refused = sid
                self.session.detached = f"could not follow Claude to session {sid}: {e}"
                self.session.announce(self.session.detached, relay)

    def follow(self, relay, new_sid: str) -> None:
        session, spec, home = self.session, self.session.spec, self.session.home
        old_sid, old = spec.session_id, session.capture
        path = rollout_path(new_sid, spec.cwd)
        registry = Registry(home)
        thread = registry.thread_for_session(new_sid)
        cleared = thread is None and starts_a_conversation(path)  # (a session cc-lhc knows is resumed)
        if self.left is None:
            self._let_go(old_sid)
            self.left = old_sid  # until another binding is taken (a failure below keeps it)
        created = thread is None
        if created:
            thread = registry.create_thread(new_sid, spec.cwd, "fresh" if cleared else "adopted")
        lease = Lease(home, thread)
        if not lease.try_acquire():
            self.refused = new_sid
            held = getattr(lease, "held_by", "") or " by another cc-lhc"
            session.detached = (f"Claude moved to session {new_sid}, whose thread {thread[:8]} is held"
                                f"{held}: cc-lhc does not capture or serve retrieval for it in this "
                                f"window; going back to session {old_sid} is followed again")
            home.log("follow_refused", old_session=old_sid, new_session=new_sid, thread=thread)
            if session.descriptor:  # (what retrieval in this window tells Claude from now on)
                with Tx(session.hostdb.db) as db:
                    db.execute("UPDATE descriptors SET revoked = ? WHERE token = ?",
                               (f"{utc_now_iso()} {session.detached}", session.descriptor["token"]))
            session.announce(session.detached, relay)
            return
        try:
            recover_thread(home, registry, session.hostdb, thread)
            back = None
            if registry.current_session(thread) != new_sid:
                if not created:  # (back to a session the thread went on from)
                    store = ThreadStore(home, thread)
                    try:
                        back = resumed_back(store, new_sid, registry.current_session(thread))
                    finally:
                        store.close()
                advance_current(registry, thread, new_sid)  # the session Claude now writes
        except BaseException:
            lease.release()
            raise
        session.hostdb.note_session(new_sid, thread, path, spec.cwd)
        # An in-process compaction of the old session is settled with the old thread: Claude
        # will never send a request on that conversation again, and the new one is governed
        # from its first line (it was refused as "already under way" for good).
        self.handoff.inproc.close(relay, "Claude left the session before it took the view")
        fresh = new_capture(spec, home, session.policy, session.hostdb, thread, new_sid, path)
        fresh.lease = lease
        fresh.request_handoff = old.request_handoff
        spec.session_id = spec.resume = new_sid
        self.left = self.refused = None
        if spec.mod:
            spec.mod.rebind(new_sid)
        session.capture, session.detached = fresh, ""
        session.left_sessions.append((old.thread_id, old_sid))  # (its background jobs still run in this Claude)
        session.descriptor = rebind_descriptor(home, session.hostdb, session.descriptor, thread, new_sid)
        fresh.start()
        if session.worker:
            session.worker.stop()
            session.worker = DerivationWorker(home, thread).start() if session.summaries else None
        kind = "clear" if cleared else "resume"
        home.log("session_followed", kind=kind, old_session=old_sid, new_session=new_sid,
                 thread=thread, created=created, **({"off_branch": f"m{back[0]}-m{back[1]}"} if back else {}))
        session.announce(f"/clear started a new conversation: cc-lhc follows it as thread "
                         f"{thread[:8]} (the earlier one stays in thread {old.thread_id[:8]})"
                         if cleared else
                         f"Claude moved to session {new_sid}: cc-lhc follows it in thread {thread[:8]}",
                         relay)
        if not cleared and not created and compacted_in_process(home, new_sid):
            # Claude read that session back by its records' message ids, and the newest ones
            # the mod's compaction kept are written after its boundary under the ids they had
            # before it: Claude now holds each of them twice (a launch's resume writes such a
            # session again before Claude starts). Compacted again now, before its next request.
            session.announce(f"session {new_sid} was compacted inside Claude by the cc-lhc mod, and "
                             "Claude's /resume of it holds its newest turns twice: cc-lhc compacts it "
                             "again now", relay)
            home.log("resume_rewrites_in_process_compaction", thread=thread, session=new_sid, live=True)
            self.handoff.swap_soon(relay)

    def _let_go(self, old_sid: str) -> None:
        """Fail closed for the binding Claude left, before anything else happens."""
        session, spec, home = self.session, self.session.spec, self.session.home
        old = session.capture
        if session.descriptor:
            revoke_descriptor(home, session.hostdb, session.descriptor,
                              f"Claude left session {old_sid}")
        finish_capture(old, spec, home)
        if session.pending:
            pending, session.pending = session.pending, None
            try:
                accept(home, old.thread_id, pending)
            except Exception as e:
                home.log("settle_failed", thread=old.thread_id, error=repr(e))
        if old.lease:
            old.lease.release()
            old.lease = None
        session.detached = f"Claude left session {old_sid}"


def file_tail(path, size: int):
    """The last ``size`` bytes of a regular file (all of a shorter one), or None when it
    cannot be read."""
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            return f.read(size)
    except OSError:
        return None


def continued_in(path: str, tail: int = 1 << 16):
    """The session a transcript says its conversation went on in (Claude's `continued-in`
    record, written when its exit dialog moved the session to the background), when its
    last such record, near its end and after its last message, names one; else None."""
    data = file_tail(path, tail)
    if data is None:
        return None
    at = data.rfind(b'"continued-in"')
    if at < 0:
        return None
    end = data.find(b"\n", at)
    end = len(data) if end < 0 else end
    if re.search(rb'"type":\s*"(user|assistant)"', data[end:]):
        return None  # (a conversation went on in this session since: resumed here later)
    rec = json_record(data[data.rfind(b"\n", 0, at) + 1:end])
    new = rec.get("continuedInSessionId") if rec and rec.get("type") == "continued-in" else None
    return new if isinstance(new, str) and is_uuid(new) else None


def starts_a_conversation(path: str, lines: int = 40) -> bool:
    """Whether a session file Claude just moved to is a new conversation (/clear), not an
    older one it reopened (/resume).

    Claude names the new session in its pid file a moment before it writes the file, so
    a file not there yet is new; so is one holding nothing but bookkeeping and the /clear
    command itself (and perhaps the first prompt after it). Any earlier prompt or answer
    means a resumed conversation; so does an answer after the /clear, unless the /clear
    itself is recent (a prompt sent at once after it can be answered before cc-lhc looks):
    a session /clear began long ago, reopened.
    """
    import time
    try:
        f = open_regular(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    cleared = None  # the /clear's time, once met
    with f:
        for _ in range(lines):
            line = f.readline(1 << 20)
            if not line:
                return True
            if CLEAR_COMMAND.encode() in line:
                if cleared is None:  # (the requests Claude logs after it quote it again)
                    try:
                        cleared = record_time(json.loads(line).get("timestamp")) or 0.0
                    except (ValueError, AttributeError):
                        cleared = 0.0
                continue
            said = re.search(rb'"type":\s*"(user|assistant)"', line)
            if said and b'"isMeta":true' not in line and b'"isMeta": true' not in line:
                if cleared is None:
                    return False
                if said.group(1) == b"assistant":
                    return time.time() - cleared < CLEAR_FRESH_SECONDS
    return cleared is not None


CLEAR_FRESH_SECONDS = 30.0  # a /clear this recent is the one Claude just ran


# == 16. Background work carried across a swap ==================================


def _holders(path: str) -> list:
    """Pids of processes that have ``path`` open (a carried job writing its output file)."""
    pids = []
    if os.path.isdir("/proc/self/fd"):
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                        pids.append(int(pid))
                        break
                except OSError:
                    continue
        return pids
    import subprocess
    try:  # macOS: no /proc
        out = subprocess.run(["lsof", "-t", "--", path], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [int(p) for p in out.split() if p.isdigit()]


def _leads_session(pid: int) -> bool:
    """Whether pid leads a session of its own (as Claude starts each background command)."""
    try:
        return os.getsid(pid) == pid
    except (OSError, AttributeError):  # (gone; or no sessions here)
        return False


def _alive(pid: int, start=None) -> bool:
    """Whether pid still runs (and, given its start time, is still that same process)."""
    if start is not None and process_start_time(pid) != start:
        return False  # gone, and its pid may already belong to someone else
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has finished: only its parent has not collected it yet
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return True


def _stop_job(pid: int, start) -> None:
    """End a carried job: its whole process group (Claude starts each in its own), never ours.

    Only while pid is still the process that was carried (same start time): pids are
    reused quickly, and a signal to a reused one would end an unrelated program.
    """
    try:
        group = os.getpgid(pid)
    except OSError:
        return
    kill = (lambda s: os.killpg(group, s)) if group != os.getpgrp() else (lambda s: os.kill(pid, s))
    _end_with(kill, lambda: _alive(pid, start))


def _end_with(kill, running) -> None:
    """SIGTERM, two seconds to go, then SIGKILL, each only while running() says so."""
    import time
    for sig, wait in ((signal.SIGTERM, 2.0), (signal.SIGKILL, 0)):
        if not running():
            return
        try:
            kill(sig)
        except OSError:
            return
        deadline = time.monotonic() + wait
        while running() and time.monotonic() < deadline:
            time.sleep(0.02)


class CarriedJob:
    """A shell job that outlived the Claude process which started it, or a monitor command
    cc-lhc relaunched for the replacement."""

    def __init__(self, item, pids, offset=0, finished=False, output="", process=None, deadline=0.0):
        self.item = item
        self.offset = offset        # how much of the output file Claude has already been told about
        self.finished = finished
        self.output = output        # the file to watch: Claude's own for a shell job, ours for a monitor
        self.process = process      # a relaunched monitor: our child, reaped here
        self.deadline = deadline    # a monitor's timeout_ms, counted from its first launch (time.time)
        self.starts = {}            # pid -> start time, when seen
        self.thread = None          # the thread whose swap carried it: its notes go there
        self.watch(pids)            # each process holding its output file (or our monitor)
        # The shell Claude ran the command in (it leads a session of its own): the job is over
        # when it ends, as Claude tells it, though a process it started in the background
        # (`server &`) still holds the output file. None when no holder leads one.
        self.root = next((pid for pid in self.pids if _leads_session(pid)), None)
        self.status = None          # the root's exit status (Linux), once it ended under cc-lhc

    def watch(self, pids) -> None:
        """Take these pids as the job's, remembering each one's start time: a pid is
        reused quickly, and only the process that was carried may ever be signalled."""
        self.pids = list(pids)
        for pid in self.pids:
            self.starts.setdefault(pid, process_start_time(pid))

    def alive(self, pid) -> bool:
        return _alive(pid, self.starts.get(pid))

    def stop(self) -> None:
        for pid in self.pids:
            _stop_job(pid, self.starts.get(pid))

    @property
    def name(self) -> str:
        return self.item.task_id or self.item.label


MONITOR_TIMEOUT_CAP_MS = 1800000  # Claude caps a monitor's deadline at 30 minutes


def _children_running(parent: int, command: str) -> list:
    """Pids of ``parent``'s children whose command line holds ``command`` (Linux /proc), as
    written or as a shell quotes it inside '...' (Claude runs it under eval '<command>',
    each ' in it written '"'"')."""
    if not command:
        return []
    forms = {command, command.replace("'", "'\"'\"'")}
    found = []
    for pid in children_of(parent):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            continue
        if any(form in cmdline for form in forms):
            found.append(pid)
    return found


class BackgroundCarry:
    """Background work carried across live swaps (the swap path of Smart Compact).

    At the switch, each open item goes with the session its own way: a shell job or a
    monitor command is a process of its own, left running (the old Claude is ended with
    SIGKILL, the only signal it does not pass on to its jobs) and watched here through
    its pids and output file; a workflow, a pending wake-up and a background agent lived
    inside the old Claude, so the replacement is told in a manifest what was pending and
    how to go on (Workflow{resumeFromRunId}, SendMessage(<id>)), and a wake-up is fired
    by cc-lhc when it falls due. Everything Claude is told arrives as a message marked
    [runtime note], typed at a settled seam, never mixed into what the person types.
    A result that arrives when no Claude is left to tell is kept under continuity/ and
    told at the next launch of the thread.
    """

    POLL_SECONDS = 0.5
    REAP_SECONDS = 5.0
    TAIL_BYTES = 4000

    def __init__(self, session):
        self.session = session
        self.jobs = []
        self.planned = {}          # tool_use_id -> its line in the manifest of the rebuild under way
        self.journals = []         # workflows whose journal follows the session at this switch
        self.carried_items = []    # every item a swap of this session carried, oldest first
        self.recarry = []          # carried workflows the rebuild under way offers again
        self._saved = None         # what undelivered.json holds now (see _persist)
        self.inflight = []         # [note, transcript, offset]: typed, not yet seen as a prompt
        self.wakeups = []          # (due, item) the wrapper fires itself
        self.taken_in = {}          # pid -> start time: what a Claude a swap ended left to cc-lhc
        self.taken_sessions = []    # (its sessions, the clock tick it ended by): see LiveHandoff._end_old
        self.exit_codes = {}        # pid -> exit status of those, once collected
        self.reap_at = 0.0          # when to look for those that ended (time.time)
        self.notes = collections.deque()
        self.next_poll = 0.0
        self.stops_seen = 0        # the newest TaskStop call looked at for carried jobs
        self.stops_size = None     # the transcript's size when they were last looked for
        self.carried = ""          # the last swap's one line, for the person and /status
        self._kept_for = None      # the thread whose undelivered.json holds self._saved
        self.guard = CarryGuard(session.home, self.thread_id)
        self._load_kept()

    @property
    def taken(self) -> set:
        """The tool_use_ids carried already: a later swap does not carry them anew."""
        return {i.tool_use_id for i in self.carried_items}

    @property
    def thread_id(self):
        """The thread of the session now: after /clear or /resume it is another one."""
        capture = self.session.capture
        return capture.thread_id if capture else None

    @property
    def holds_processes(self) -> bool:
        """Whether a shell job Claude started is still running (a monitor we relaunched is
        our own child and needs no special end of the old Claude)."""
        return any(not j.finished and j.process is None for j in self.jobs)

    # -- at the swap -------------------------------------------------------------

    def plan(self, items, old_session: str, old_path: str, store) -> list:
        """The manifest lines for the rebuilt session, one per item a swap would carry now.

        Written into the rollout before the replacement starts (view_records), so Claude
        knows from its first turn what goes on and how; take() tells it later only what
        turned out otherwise at the switch (a monitor that would not start again, an agent
        that finished in the seconds between).
        """
        self.planned = {}
        for item in items:
            if item.tool_use_id not in self.taken:
                self.planned[item.tool_use_id] = self._manifest_line(item, old_session, old_path, store)
        return self._still_carried_lines(store) + list(self.planned.values())

    def _still_carried_lines(self, store) -> list:
        """What earlier swaps carried that still goes on, for the next rebuilt session too:
        the thread holds those items as carried (no longer open), and a manifest is never
        captured, so without these lines the next replacement would not know of them."""
        lines, self.recarry = [], []
        for item in self.carried_items:
            name = item.task_id or item.label
            if item.kind in ("shell", "monitor"):
                job = next((j for j in self.jobs if j.item.tool_use_id == item.tool_use_id), None)
                if job is None or job.finished:
                    continue
                lines.append(f"{item.kind} {name} ({item.command}), carried across an earlier Smart "
                             f"Compact, still runs under cc-lhc's watch; its output is in {job.output}; "
                             "cc-lhc will tell you " + ("each new event" if item.kind == "monitor"
                                                        else "when it finishes"))
            elif item.kind == "wakeup":
                if any(pending is item for _due, pending in self.wakeups):
                    lines.append(self._manifest_line(item, "", "", store))
            elif not _taken_up(item, store):
                # A workflow or an agent not resumed yet: the same offer, and the workflow's
                # journal follows once more (from the session it was copied into).
                lines.append(self._manifest_line(item, "", "", store) if item.kind == "workflow"
                             else f"background agent {name} was interrupted by an earlier swap; resume "
                                  f"it with SendMessage({name})")
                if item.run_id if item.kind == "workflow" else item.task_id:
                    self.recarry.append(item)  # (its journal, or the agent's transcript, follows once more)
        return lines

    def _manifest_line(self, item, old_session, old_path, store) -> str:
        name = item.task_id or item.label
        if item.kind == "shell":
            return (f"background command {name} ({item.command}) keeps running as its own process; "
                    f"its output is in {item.output_file}; cc-lhc will tell you when it finishes "
                    f"(TaskStop of {name} stops it)")
        if item.kind == "monitor":
            return (f"monitor {name} ({item.command}) stops with the previous Claude process, so "
                    f"cc-lhc starts its command again and tells you each new event (its output "
                    f"is kept in {self._monitor_output(item)})")
        if item.kind == "wakeup":
            due = datetime.datetime.fromtimestamp(self._wakeup_due(item, store)).strftime("%H:%M")
            return (f"a wake-up you scheduled ({item.args.get('reason') or 'no reason given'}) is "
                    f"still pending; cc-lhc will deliver its prompt when it falls due (about {due})")
        if item.kind == "workflow":
            name = item.args.get("name") or item.label
            if not item.run_id:
                return (f"workflow {name} stopped with the previous Claude process and its launch "
                        "named no run id to resume from; run it again with Workflow if it is "
                        "still needed")
            call = (f'Workflow({{scriptPath: "{item.script}", resumeFromRunId: "{item.run_id}"}})'
                    if item.script else f'Workflow with resumeFromRunId "{item.run_id}" and the same script')
            return (f"workflow {name} (run {item.run_id}) stopped with the previous Claude process; "
                    f"cc-lhc carries its journal into this session, so {call} continues it, the "
                    "agent calls it had finished coming back from the journal")
        return self._agent_report(item, old_session, old_path)

    def take(self, items, old_session: str, old_path: str, old_pid=None) -> str:
        """Carry the open items of the session being replaced; returns the line to show."""
        said, failed, changed = [], [], []
        planned = self.planned
        # Carried at an earlier swap: it goes on as it is (a relaunched monitor keeps its
        # process), and nothing is said to Claude again.
        for job in self.jobs:
            if not job.finished:
                said.append(f"{job.item.kind} {job.name} (still running, pid "
                            f"{', '.join(map(str, job.pids))})")
        taken = self.taken
        items = [i for i in items if i.tool_use_id not in taken]
        for item in items:
            name = item.task_id or item.label
            line = ""
            if item.kind == "shell":
                pids = _holders(item.output_file)
                self.jobs.append(CarriedJob(item, pids, output=item.output_file))
                said.append(f"shell {name} (pid {', '.join(map(str, pids)) or 'already finished'})")
            elif item.kind == "monitor":
                job, why = self._relaunch(item, old_pid)
                if job is None:
                    line = (f"monitor {name} ({item.command}) could not be restarted after the swap "
                            f"({why}); start it again with Monitor if you still need it")
                    failed.append(f"monitor {name} ({why})")
                else:
                    self.jobs.append(job)
                    said.append(f"monitor {name} (relaunched, pid {job.pids[0]})")
            elif item.kind == "wakeup":
                self.wakeups.append((self._wakeup_due(item), item))
                said.append("wake-up")
            elif item.kind == "workflow":
                if item.run_id:
                    self.journals.append(item)
                said.append(f"workflow {item.run_id or item.label} (resume offered)")
            elif item.kind == "agent":
                line = self._agent_report(item, old_session, old_path)
                finished = " had finished" in line
                if not finished and item.task_id:
                    self.journals.append(item)  # (SendMessage resumes it from its transcript)
                said.append(f"agent {name} "
                            f"({'finished, result told' if finished else 'interrupted, resume offered'})")
            if item.tool_use_id not in planned:
                line = line or self._manifest_line(item, old_session, old_path, None)
            if line and line != planned.get(item.tool_use_id):
                changed.append(line)
        self.planned = {}
        self.journals += [i for i in self.recarry if i not in self.journals]
        self.recarry = []
        self.carried_items += items
        self._record_carried(items, old_session)
        for job in self.jobs:
            job.thread = job.thread or self.thread_id  # (a later /clear or /resume does not move it)
        if changed:
            self.notes.append("[runtime note] cc-lhc replaced the Claude process for Smart Compact. "
                              "Background work from before, since the rebuilt session was written: "
                              + "; ".join(changed) + ".")
        parts = (["carried across the swap: " + ", ".join(said)] if said else []) + (
            ["could not carry: " + ", ".join(failed)] if failed else [])
        self.carried = "; ".join(parts)
        self.session.home.log("background_carried", items=[i.label for i in items], said=said,
                              failed=failed, told_after_rebuild=len(changed))
        self.guard.sync(self.jobs)
        self._persist()
        return self.carried

    def _record_carried(self, items, old_session) -> None:
        """Close the carried items in their thread (see CARRIED_PREFIX), so no later swap or
        launch takes them for work still open in Claude: the session's, or for work Claude
        started before a /clear, the thread it was started in."""
        by_thread = collections.defaultdict(list)
        for item in items:
            by_thread[item.thread or self.thread_id].append(item)
        for thread, carried in by_thread.items():
            if not thread:
                continue
            store = ThreadStore(self.session.home, thread)
            try:
                with Tx(store.db) as db:
                    db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                                   [(CARRIED_PREFIX + i.tool_use_id, f"{i.kind} from {old_session}")
                                    for i in carried])
            finally:
                store.close()

    def carry_journals(self, old_path: str, new_path: str) -> None:
        """Copy each carried workflow's run folder (journal and agent transcripts), and each
        interrupted background agent's transcript, from the old session's folder into the
        new one's, once the old Claude has ended and wrote its last line:
        Workflow{resumeFromRunId} reads the journal from the session it runs in, and serves
        the agent calls it holds from it instead of running them again; SendMessage resumes
        an agent from its transcript in the session it runs in. (Capture takes each record
        of an agent once, whichever of its files it is read from.)
        """
        import shutil
        for item in self.journals:
            old_folder, new_folder = old_path[:-len(".jsonl")], new_path[:-len(".jsonl")]
            if item.kind == "agent":
                names = [f"agent-{item.task_id}.jsonl", f"agent-{item.task_id}.meta.json"]
                try:
                    os.makedirs(os.path.join(new_folder, "subagents"), exist_ok=True)
                    for name in names:
                        source = os.path.join(old_folder, "subagents", name)
                        if os.path.isfile(source):
                            shutil.copyfile(source, os.path.join(new_folder, "subagents", name))
                except OSError as e:
                    self.session.home.log("agent_transcript_not_carried", agent=item.task_id, error=repr(e))
                    self.notes.append(f"[runtime note] The transcript of background agent {item.task_id} "
                                      f"could not be carried into this session ({e}); SendMessage cannot "
                                      "resume it: start it again if it is still needed.")
                    continue
                self.session.home.log("agent_transcript_carried", agent=item.task_id)
                continue
            parts = ("subagents", "workflows", item.run_id)
            source = os.path.join(old_folder, *parts)
            target = os.path.join(new_folder, *parts)
            try:
                shutil.copytree(source, target, dirs_exist_ok=True)
            except (OSError, shutil.Error) as e:
                self.session.home.log("workflow_journal_not_carried", run=item.run_id, error=repr(e))
                self.notes.append(f"[runtime note] The journal of workflow run {item.run_id} could "
                                  f"not be carried into this session ({e}); resuming it will run "
                                  "every agent call again.")
                continue
            self.session.home.log("workflow_journal_carried", run=item.run_id, to=target)
        # (the rebuild copied every agent's transcript; what the old Claude wrote since, an
        # agent that finished meanwhile say, is added now)
        carry_subagents(self.session.home, [old_path], new_path)
        self.journals = []
        self._persist()

    def _monitor_output(self, item) -> str:
        return os.path.join(self.session.home.path("continuity", self.thread_id, "monitors"),
                            f"{item.task_id or item.tool_use_id}.output")

    def _relaunch(self, item, old_pid):
        """Start a monitor's command again under continuity/<thread>/monitors/, as our own
        child: (the job, '') or (None, why it could not be)."""
        import shutil
        import subprocess
        import time
        command = str(item.args.get("command") or "")
        if old_pid:
            # The old copy dies at its next line anyway (its stdout is the old Claude's
            # socket); stopping it now keeps one copy of the command running, never two.
            for pid in _children_running(old_pid, command):
                _stop_job(pid, process_start_time(pid))
        if not command:
            return None, ("it watches a WebSocket, which cc-lhc cannot reopen" if item.args.get("ws")
                          else "its launch names no command")
        timeout = min(float(item.args.get("timeout_ms") or 300000), MONITOR_TIMEOUT_CAP_MS) / 1000
        deadline = self._launched_at(item) + timeout
        if time.time() >= deadline:
            return None, "its timeout_ms had run out"
        output = self._monitor_output(item)
        try:
            self.session.home.ensure("continuity", self.thread_id, "monitors")
            offset = os.path.getsize(output) if os.path.exists(output) else 0
            with open(output, "ab") as out, open(output[:-len(".output")] + ".stderr", "ab") as err:
                process = subprocess.Popen(
                    [shutil.which("bash") or "/bin/sh", "-c", command], cwd=self.session.spec.cwd,
                    env=child_environment(self.session.spec), stdin=subprocess.DEVNULL, stdout=out,
                    stderr=err, start_new_session=True, preexec_fn=_death_link_preexec(os.getpid()))
        except OSError as e:
            return None, f"its command could not be started again: {e}"
        self.session.home.log("monitor_relaunched", item=item.label, task=item.task_id,
                              pid=process.pid, output=output)
        return CarriedJob(item, [process.pid], offset=offset, output=output, process=process,
                          deadline=deadline), ""

    def _wakeup_due(self, item, store=None) -> float:
        """When Claude would have fired it: the first whole minute after launch + delay,
        the delay clamped to [60, 3600] s as Claude clamps it."""
        import math
        try:
            delay = float(item.args.get("delaySeconds") or 60)
        except (TypeError, ValueError):
            delay = 60.0
        return math.ceil((self._launched_at(item, store) + min(3600.0, max(60.0, delay))) / 60) * 60

    def _recorded_at(self, item, store=None):
        """When the item's launch was recorded (epoch seconds; ``store``: the thread's, when
        one is open), or None when that cannot be told."""
        own = store is None
        try:
            store = store or ThreadStore(self.session.home, self.thread_id)
        except LhcError:
            return None
        try:
            row = store.db.execute("SELECT created FROM messages WHERE seq = ?", (item.seq,)).fetchone()
        except Exception:  # (a thread that cannot be read now: no time to tell by)
            return None
        finally:
            if own:
                store.close()
        return record_time(row[0]) if row else None

    def _launched_at(self, item, store=None) -> float:
        """_recorded_at, or now when that cannot be told."""
        import time
        launched = self._recorded_at(item, store)
        return time.time() if launched is None else launched

    def _agent_report(self, item, old_session, old_path) -> str:
        """An agent's final answer if its own transcript shows one written since this launch
        of it (a SendMessage runs a finished agent again, and its transcript holds the
        answer of the run before until the new run's first records are written), else how
        to resume it."""
        name = f"background agent {item.task_id or item.label}"
        path = os.path.join(os.path.dirname(old_path), old_session, "subagents",
                            f"agent-{item.task_id}.jsonl")
        last = None
        try:
            with open_regular(path) as f:
                for raw in f:
                    rec = json_record(raw)
                    if rec is not None and rec.get("type") in ("user", "assistant"):
                        last = rec
        except OSError:
            pass
        message = (last or {}).get("message") or {}
        launched = self._recorded_at(item)
        if (last or {}).get("type") == "assistant" and message.get("stop_reason") == "end_turn" and not (
                launched is not None and (record_time(last.get("timestamp")) or launched) < launched):
            answer = " ".join(b.get("text", "") for b in message.get("content") or []
                              if isinstance(b, dict) and b.get("type") == "text")
            return f"{name} had finished; its final result: {answer.strip()}"
        return (f"{name} was interrupted by the swap (it ran inside the previous Claude process); "
                f"resume it with SendMessage({item.task_id or item.label})")

    def status(self) -> list:
        """The /status rows: the last swap's line and what cc-lhc is watching now."""
        rows = [f"background: {self.carried}"] if self.carried else []
        running = [f"{j.item.kind} {j.name} (pid {', '.join(map(str, j.pids))})"
                   for j in self.jobs if not j.finished]
        running += [f"wake-up due {datetime.datetime.fromtimestamp(due).strftime('%H:%M')}"
                    for due, _item in self.wakeups]
        if running:
            rows.append("background carried now: " + ", ".join(running))
        return rows

    def end_signal(self):
        """How the old Claude must end: SIGKILL while it leaves carried jobs behind."""
        return signal.SIGKILL if self.holds_processes else None

    # -- while the session runs ----------------------------------------------------

    def poll(self) -> None:
        """Turn finished jobs, new monitor events and due wake-ups into notes (once each)."""
        import time
        now = time.time()
        if self.inflight:
            self._confirm_inflight()
        if any(not job.finished for job in self.jobs):
            self._stops_asked()
        for job in self.jobs:
            if not job.finished:
                self._poll_job(job, now)
        if (self.taken_in or self.taken_sessions) and now >= self.reap_at:
            self.reap_at = now + self.REAP_SECONDS
            self.take_in_left()
            reap_taken_in(self.taken_in, self.exit_codes)
            roots = {job.root for job in self.jobs if not job.finished}
            self.exit_codes = {pid: code for pid, code in self.exit_codes.items() if pid in roots}
        for due, item in list(self.wakeups):
            if now >= due:
                self.wakeups.remove((due, item))
                self.notes.append(f"[runtime note] your scheduled wake-up is due "
                                  f"({item.args.get('reason') or 'no reason given'}): "
                                  f"{item.args.get('prompt') or ''}")
        self.guard.sync(self.jobs)
        self._persist()

    def take_in_left(self) -> None:
        """Add to taken_in what cc-lhc took in from an ended Claude's sessions (see
        LiveHandoff._end_old); each is collected as it ends."""
        for sessions, by in self.taken_sessions:
            for pid, start in children_of(os.getpid(), sessions).items():
                if by is not None and start <= by:
                    self.taken_in.setdefault(pid, start)

    def _stops_asked(self) -> None:
        """Claude's TaskStop (KillShell) of a carried job's id: since the swap the job runs
        under cc-lhc, not in Claude's task list, so Claude's own stop cannot find it; cc-lhc
        stops it and says so."""
        if not self.thread_id:
            return
        try:  # (a TaskStop is in the transcript first: no store is opened while it has not grown)
            size = os.path.getsize(self.session.capture.path)
        except (OSError, AttributeError, TypeError):
            size = None
        if size is not None and size == self.stops_size:
            return
        self.stops_size = size
        store = ThreadStore(self.session.home, self.thread_id)
        try:
            rows = store.db.execute(
                "SELECT seq, tool_name, text FROM messages WHERE kind = 'tool_call' AND agent IS NULL "
                f"AND tool_name IN ({','.join('?' * len(TASK_STOP_TOOLS))}) AND seq > ? ORDER BY seq",
                (*TASK_STOP_TOOLS, self.stops_seen)).fetchall()
        finally:
            store.close()
        for seq, tool, text in rows:
            self.stops_seen = seq
            args = _json_object(text)
            target = str(args.get("task_id") or args.get("shell_id") or args.get("id") or "")
            for job in self.jobs:
                if job.finished or not target or job.item.task_id != target or seq < job.item.seq:
                    continue
                self._stop(job)
                self.session.home.log("carried_job_stopped", item=job.item.label, pids=job.pids, asked=tool)
                self.notes.append(f"[runtime note] cc-lhc stopped {job.item.kind} {job.name} "
                                  f"({job.item.command}) as your {tool} asked: it was carried across a "
                                  "Smart Compact swap and runs under cc-lhc since, so it is in no task "
                                  "list of yours.")

    def _poll_job(self, job, now) -> None:
        if job.process is not None:
            running = job.process.poll() is None
        else:
            job.watch([p for p in job.pids if job.alive(p)]
                      or [p for p in _holders(job.output) if _alive(p)])
            running = bool(job.pids) if job.root is None or job.item.kind == "monitor" else job.alive(job.root)
            if job.root is not None and not running and job.status is None:
                # (taken in when its Claude ended: LiveHandoff._end_old)
                if job.root in self.taken_in:
                    reap_taken_in({job.root: self.taken_in.pop(job.root)}, self.exit_codes)
                job.status = self.exit_codes.pop(job.root, None)
        if job.item.kind != "monitor":
            if not running:
                job.finished = True
                self.notes.append(self._shell_result(job))
            return
        for event in self._read_from(job):
            self.notes.append(f"[runtime note] monitor {job.name} ({job.item.command}) event: {event}")
        if running and job.deadline and now >= job.deadline:
            self._stop(job)
            self.notes.append(f"[runtime note] monitor {job.name} expired (its timeout_ms ran out); "
                              "start it again with Monitor if you still need it.")
        elif not running:
            job.finished = True
            self.notes.append(f"[runtime note] monitor {job.name} has ended.")

    def _stop(self, job) -> None:
        job.stop()
        if job.process is not None:
            try:
                job.process.wait(timeout=5)
            except Exception:  # noqa: BLE001 - one that will not die is logged, never waited on
                self.session.home.log("carried_job_survived", item=job.item.label, pids=job.pids)
        job.finished = True

    def _read_from(self, job) -> list:
        try:
            with open_regular(job.output) as f:
                f.seek(job.offset)
                data = f.read(1 << 20)
        except OSError:
            return []
        complete = data[:data.rfind(b"\n") + 1]
        job.offset += len(complete)
        return [line for line in complete.decode("utf-8", "replace").splitlines() if line.strip()]

    def _shell_result(self, job) -> str:
        item = job.item
        try:
            with open_regular(item.output_file) as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - self.TAIL_BYTES))
                tail = f.read().decode("utf-8", "replace").strip()
        except OSError as e:
            size, tail = 0, f"(its output file could not be read: {e})"
        shown = ("the end of its output" if size > self.TAIL_BYTES else "its output") + f":\n{tail}"
        status = job.status
        how = ("" if status is None else f" with exit code {status}" if status >= 0
               else f", ended by signal {_signal_name(-status)}")
        return (f"[runtime note] The background command {item.task_id} ({item.command}), carried "
                f"across a Smart Compact swap, has finished{how}. Its output file is "
                f"{item.output_file}; {shown}")

    def next_note(self, settled) -> str:
        """The next note to type, when there is one and the session is at a settled seam."""
        import time
        now = time.monotonic()
        if now >= self.next_poll:
            self.next_poll = now + self.POLL_SECONDS
            self.poll()
        if not self.notes or not settled():
            self._persist()
            return ""
        # Everything waiting goes in one prompt: each event once, none held back a turn.
        told = typeable("\n".join(self.notes))
        self.notes.clear()
        path = self.session.capture.path
        try:
            offset = os.path.getsize(path)
        except OSError:
            offset = 0
        self.inflight.append([told, path, offset])
        self._persist()
        return told

    def _confirm_inflight(self) -> None:
        """Drop each typed note once Claude's transcript holds it as a prompt; until then it
        stays kept (a note typed into a Claude that was already exiting never arrives)."""
        still = []
        for entry in self.inflight:
            note, path, offset = entry
            key = note.split("\n", 1)[0][:200]
            try:
                with open_regular(path) as f:
                    f.seek(offset)
                    data = f.read(4 << 20)
            except OSError:
                data = b""
            complete = data[:data.rfind(b"\n") + 1]
            entry[2] = offset + len(complete)
            if not any(key in _prompt_text(json_record(line)) for line in complete.splitlines()):
                still.append(entry)
        self.inflight = still

    # -- at the end ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop what cc-lhc carried (nobody asked for it to outlive the session) and keep
        what Claude was not told yet, for the next launch of the thread."""
        self.poll()
        stopped = []
        for job in self.jobs:
            if job.finished:
                continue
            self._stop(job)
            stopped.append(f"{job.item.kind} {job.name}")
            for event in self._read_from(job):  # written between the last poll and the stop
                self.notes.append(f"[runtime note] monitor {job.name} ({job.item.command}) "
                                  f"event: {event}")
            self.session.home.log("carried_job_stopped", item=job.item.label, pids=job.pids)
            self.notes.append(stopped_note(job.item.kind, job.name, job.item.command, job.output))
        self.notes.extend(self._pending_wakeup_notes())
        for note, _path, _offset in self.inflight:  # typed, but Claude never took it
            self.session.home.log("carried_note_not_delivered", note=note[:200])
            self.notes.append(note)
        self.inflight = []
        self.guard.sync(self.jobs)  # every job is finished now: the guard holds none
        self.jobs, self.wakeups = [], []
        self._persist()
        self.guard.end()
        if stopped:
            # (the replacement Claude has no task list of them, so no exit dialog of its own
            # asked whether to stop them)
            self.session.notices.append(self.STOPPED_AT_END.format(n=len(stopped), jobs=", ".join(stopped)))

    STOPPED_AT_END = ("stopped {n} background job(s) carried across a Smart Compact swap as the session "
                      "ended ({jobs}); the next launch of this thread tells Claude so, with their output")

    def _pending_wakeup_notes(self) -> list:
        return [f"[runtime note] a wake-up was still pending when the previous session ended "
                f"({item.args.get('reason') or 'no reason given'}): {item.args.get('prompt') or ''}"
                for _due, item in self.wakeups]

    def tell(self, note: str) -> None:
        """A note to type at the next settled seam (kept for the next launch meanwhile)."""
        self.notes.append(note)
        self._persist()

    def _persist(self) -> None:
        """Keep undelivered.json equal to what the next launch must tell Claude if this
        process ended now: the notes not yet typed and the wake-ups still pending. Written
        as they change, so even a SIGKILL of cc-lhc loses none of them (the guard adds what
        it stops to the same file)."""
        kept = list(self.notes) + [note for note, _p, _o in self.inflight] + self._pending_wakeup_notes()
        moved = self._saved and self._kept_for != self.thread_id
        if kept == (self._saved or []) and not moved:
            return  # (nothing to keep and nothing kept: no continuity folder is made for it)
        try:
            if moved:
                # The session changed thread (/clear, /resume): what is still to tell goes
                # with it, and the old thread's file, which held the same notes, goes.
                old = kept_notes_path(self.session.home, self._kept_for)
                if os.path.exists(old):
                    os.unlink(old)
                self._saved = None
            path = self._kept_path()
            if path is None:
                return
            if kept:
                _write_private_json(path, kept)
            elif os.path.exists(path):
                os.unlink(path)
        except OSError as e:
            self.session.home.log("undelivered_not_saved", error=repr(e))
            return
        self._saved, self._kept_for = kept, self.thread_id

    def _kept_path(self):
        return kept_notes_path(self.session.home, self.thread_id) if self.thread_id else None

    def _load_kept(self) -> None:
        if not self.thread_id or not os.path.isdir(self.session.home.path("continuity", self.thread_id)):
            return  # (looked for without making the folder: most sessions never need it)
        path = self.session.home.path("continuity", self.thread_id, "undelivered.json")
        if os.path.exists(path) and read_kept_notes(path) is None:
            # Not ours to overwrite: set aside as it is, and said in the log.
            os.replace(path, f"{path}.{os.getpid()}.unreadable")
            self.session.home.log("undelivered_unreadable", moved_to=f"{path}.{os.getpid()}.unreadable")
        kept, guards = kept_notes(self.session.home, self.thread_id)
        if not kept:
            return
        # From here on they are this session's: undelivered.json holds them all until they
        # are told (see _persist), so a crash before then keeps them for the launch after;
        # a guard's own file goes only once its notes are safe in there.
        self.notes.extend(kept)
        self._kept_for = self.thread_id
        self._persist()
        if self._saved == kept:
            for path in guards:
                try:
                    os.unlink(path)
                except OSError:
                    pass


def _taken_up(item, store) -> bool:
    """Whether Claude has since resumed a carried workflow (Workflow{resumeFromRunId} of its
    run) or agent (SendMessage to it)."""
    if store is None:
        return False
    tool, key, want = (("Workflow", "resumeFromRunId", item.run_id) if item.kind == "workflow"
                       else ("SendMessage", "to", item.task_id))
    if not want:
        return False
    return any(_json_object(text).get(key) == want for (text,) in store.db.execute(
        "SELECT text FROM messages WHERE kind = 'tool_call' AND tool_name = ? AND seq > ? "
        "AND agent IS NULL", (tool, item.seq)))


def typeable(text: str) -> str:
    """Text that can be typed into Claude's prompt as it reads: a job's output may hold a
    carriage return (which would submit the prompt half-typed), ESC (a key press to
    Claude) or tabs; those become a newline, a visible escape and spaces. An @ that starts
    a word (Claude reads `@path` in a prompt as "attach that file") is escaped as \\@, so
    the output is read as words, not as files to attach (Claude drops a zero-width space
    typed before it). A last backslash gets a space after it: Claude takes backslash-Enter
    for a new line, so the Enter typed after the text would leave it in the box, unsent,
    for the person's next words to join."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = MENTION.sub(r"\1\\@", text)
    text = "".join(ch if ch == "\n" or not (ord(ch) < 32 or 127 <= ord(ch) < 160)
                   else f"\\x{ord(ch):02x}" for ch in text)
    return text + " " if text.endswith("\\") else text


MENTION = re.compile(r"(^|\s)@", re.M)  # (as Claude Code finds a file mention in a prompt)


def _prompt_text(rec) -> str:
    """The text of a user record's prompt ('' for anything else)."""
    if not rec or rec.get("type") != "user":
        return ""
    content = (rec.get("message") or {}).get("content")
    if isinstance(content, str):
        return content
    return "\n".join(b.get("text", "") for b in content or () if isinstance(b, dict)
                     and isinstance(b.get("text"), str))


def stopped_note(kind: str, name: str, command: str, output: str) -> str:
    """What the next launch of the thread tells Claude about carried work the end stopped."""
    return (f"[runtime note] The background {kind} {name} ({command}) was stopped when the "
            f"previous cc-lhc session ended; its output so far is in {output}.")


def kept_notes_path(home, thread_id: str) -> str:
    """continuity/<thread>/undelivered.json: notes for the next launch of the thread."""
    return os.path.join(home.ensure("continuity", thread_id), "undelivered.json")


def kept_notes(home, thread_id: str):
    """Every note kept for the next launch of a thread: undelivered.json, then what carry
    guards wrote (guard-<pid>.json); returns (notes, the guard files they came from)."""
    folder = home.path("continuity", thread_id)
    notes = read_kept_notes(os.path.join(folder, "undelivered.json")) or []
    try:
        names = sorted(n for n in os.listdir(folder) if n.startswith("guard-") and n.endswith(".json"))
    except OSError:
        names = []
    guards = [os.path.join(folder, n) for n in names]
    for path in guards:
        notes += read_kept_notes(path) or []
    return notes, guards


def give_kept_notes_to_prompt(spec, home, thread_id):
    """A one-shot's Claude gets the notes kept for the thread's next launch (background
    work the last session's end stopped) ahead of its prompt, which cc-lhc has as an
    argument; returns (the files to clear once Claude took them, the first note), or None.
    A prompt on standard input is left alone: the notes wait for a launch that can say them."""
    if not os.path.isdir(home.path("continuity", thread_id)):
        return None
    notes, guards = kept_notes(home, thread_id)
    # (where the prompt is in the argv Claude gets, as Claude reads it: never an option's
    # value that happens to read the same)
    at = scan_claude_args(spec.child_argv[1:])["positional_at"]
    if not notes or not at:
        if notes:
            say(f"{len(notes)} note(s) about stopped background work wait for this thread's next launch "
                "that takes its prompt as an argument")
        return None
    at = at[-1] + 1
    spec.child_argv[at] = "\n".join(notes) + "\n\n" + spec.child_argv[at]
    home.log("kept_notes_given", thread=thread_id, notes=len(notes), mode="oneshot")
    return [kept_notes_path(home, thread_id)] + guards, notes[0]


def read_kept_notes(path: str):
    """The notes kept in that file (a JSON list of strings), or None when it cannot be read."""
    try:
        with open_regular(path) as f:
            kept = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return [str(n) for n in kept if isinstance(n, str)] if isinstance(kept, list) else None


class CarryGuard:
    """A process that outlives cc-lhc to stop the work it carried if cc-lhc itself is killed.

    BackgroundCarry.close() ends carried work when a session ends, but a SIGKILL or a hard
    crash of cc-lhc never gets there, and a shell job whose Claude was swapped out has no
    parent left to die with. So the first carried process starts `cc-lhc __carry-guard
    <home> <thread>` (spawn_self), fed through a pipe on its stdin with one JSON line per
    change: the pids (with start times) to guard for a job, a job that is done, and at a
    clean end "end". The pipe ending without "end" means cc-lhc is gone (run_carry_guard).
    Sessions that carry no process never start one.
    """

    def __init__(self, home, thread_id):
        self.home, self.thread_id = home, thread_id
        self.process = None
        self.told = {}          # job key -> the [pid, start time] pairs the guard holds for it
        self.broken = False     # it could not start or its pipe broke: the session goes on

    def sync(self, jobs) -> None:
        """Tell the guard about each job that appeared, changed its pids or ended since last time."""
        for job in jobs:
            key = job.item.tool_use_id
            # Only pids whose start time is known: an unknown one could be signalled after reuse.
            pids = [] if job.finished else [[p, job.starts[p]] for p in job.pids
                                            if job.starts.get(p) is not None]
            if self.told.get(key, []) == pids:
                continue
            self.told[key] = pids
            if pids:
                self._send({"op": "guard", "id": key, "pids": pids, "groups": _groups_of(pids),
                            "kind": job.item.kind, "name": job.name, "command": job.item.command,
                            "output": job.output, "thread": job.thread})
            else:
                self._send({"op": "done", "id": key})

    def end(self) -> None:
        """The session ended cleanly (close() stopped and kept everything): the guard leaves."""
        if self.process is None:
            return
        self._send({"op": "end"})
        process, self.process = self.process, None
        try:
            process.stdin.close()
            process.wait(timeout=5)
        except Exception:  # noqa: BLE001 - a guard slow to go exits on its own, nothing to stop
            pass

    def _send(self, message: dict) -> None:
        if self.process is None and message["op"] == "guard" and not self.broken and os.name == "posix":
            self._start()
        if self.process is None:
            return
        try:
            self.process.stdin.write(json.dumps(message).encode("utf-8") + b"\n")
            self.process.stdin.flush()
        except OSError as e:
            self.home.log("carry_guard_lost", guard_pid=self.process.pid, error=str(e))
            self.process, self.broken = None, True

    def _start(self) -> None:
        import subprocess
        # subprocess's pipe is close-on-exec on our side: no Claude or job started later holds
        # it open, so the guard sees the end of it when cc-lhc dies, however it dies.
        try:
            self.process = spawn_self(["__carry-guard", self.home.root, self.thread_id or ""],
                                      stdin=subprocess.PIPE)
        except OSError as e:
            self.broken = True
            self.home.log("carry_guard_failed", error=str(e))
            return
        self.home.log("carry_guard_started", guard_pid=self.process.pid)


def run_carry_guard(root: str, thread_id: str) -> int:
    """`cc-lhc __carry-guard <home> <thread>`: the guard's side of CarryGuard.

    Reads the wrapper's lines until the pipe ends; without a clean "end" the wrapper died,
    so every guarded job still running as the same process is stopped, logged, and told to
    the next launch of the thread. Small and stdlib only: no tokenizer, no thread store.
    """
    guarded, clean = {}, False
    for raw in sys.stdin.buffer:
        message = json_record(raw) or {}
        if message.get("op") == "guard" and isinstance(message.get("pids"), list):
            guarded[message.get("id")] = message
        elif message.get("op") == "done":
            guarded.pop(message.get("id"), None)
        elif message.get("op") == "end":
            clean = True
    if clean or not guarded:
        return EXIT_OK
    home = StateHome(root)
    by_thread = collections.defaultdict(list)
    for job in guarded.values():
        # (each job's note goes to the thread whose swap carried it: after a /clear or an
        # in-app /resume that is not the one the session was launched on)
        mine = job.get("thread")
        by_thread[mine if isinstance(mine, str) and is_uuid(mine) else thread_id].append(_guard_stop(home, job))
    for thread, notes in by_thread.items():
        if thread:
            # A file of its own, never undelivered.json: stopping the jobs can take seconds,
            # and a next launch of the thread may be reading and rewriting that one meanwhile.
            # The next launch to open the thread takes it in (kept_notes).
            folder = os.path.dirname(kept_notes_path(home, thread))
            _write_private_json(os.path.join(folder, f"guard-{os.getpid()}.json"), notes)
    return EXIT_OK


def _groups_of(pids) -> list:
    """[group, its leader's start time] for each guarded process's group, noted while it runs
    (the guard may first read them after the leader is gone)."""
    groups = {}
    for pid, start in pids:
        try:
            group = os.getpgid(pid) if _alive(pid, start) else None
        except OSError:
            group = None
        if group is not None and group != os.getpgrp():
            groups[group] = process_start_time(group)
    return [[group, leader] for group, leader in groups.items()]


def _guard_stop(home, job: dict) -> str:
    """Stop one guarded job (the wrapper died) and say what became of it."""
    running = [pid for pid, start in job["pids"] if _alive(pid, start)]
    for pid, start in job["pids"]:
        _stop_job(pid, start)
    for group, leader_start in job.get("groups") or []:
        _stop_group_left(group, leader_start)
    home.log("carried_job_stopped_by_guard", item=job.get("name"), pids=running)
    if running or job.get("kind") == "monitor":  # a relaunched monitor dies with the wrapper
        return stopped_note(job.get("kind"), job.get("name"), job.get("command"), job.get("output"))
    return (f"[runtime note] The background {job.get('kind')} {job.get('name')} "
            f"({job.get('command')}) ended as the previous cc-lhc session ended, before cc-lhc "
            f"could tell you; its output is in {job.get('output')}.")


def _stop_group_left(group: int, leader_start) -> None:
    """Stop what is left in a job's group once its leader is gone (a monitor's bash ended by
    its death link leaves the pipeline it ran).

    While a group has members the OS gives its number to no new process, so the group is
    still the job's when that number names no process or still its leader (a zombie); a
    number naming a process with another start time was reused, and is left alone.
    """
    now = process_start_time(group)
    if now is not None and now != leader_start:
        return

    def running():
        try:
            os.killpg(group, 0)
            return True
        except OSError:
            return False
    _end_with(lambda sig: os.killpg(group, sig), running)


# == 17. Recovery at launch =====================================================


REBUILT_MARKER = "[cc-lhc] This conversation was rebuilt by Smart Compact"


def advance_current(registry, thread_id, session_id) -> None:
    """Make an accepted rebuild the thread's current session, in one transaction."""
    with Tx(registry.db) as db:
        db.execute("UPDATE aliases SET is_current = 0 WHERE thread_id = ?", (thread_id,))
        db.execute("UPDATE aliases SET is_current = 1 WHERE alias = ? AND thread_id = ?",
                   (session_alias(session_id), thread_id))
        db.execute("UPDATE rebuilds SET status = 'accepted', settled = ? WHERE session_id = ? "
                   "AND status = 'pending'", (utc_now_iso(), session_id))
        # a rebuild loaded after all: the standing alarm and the survival mode end
        db.execute("DELETE FROM thread_alarms WHERE thread_id = ?", (thread_id,))
    registry.save_copy(thread_id)


def free_name(path: str) -> str:
    """``path``, or the first of path-2, path-3, ... (before its extension) that names
    nothing: a move into a folder of kept files never replaces one already there."""
    stem, ext = os.path.splitext(path)
    n = 1
    while os.path.lexists(path):
        n += 1
        path = f"{stem}-{n}{ext}"
    return path


def move_file(src: str, dst: str) -> None:
    """Rename when we can; copy and remove when the two folders are on different devices."""
    import shutil
    try:
        os.replace(src, dst)
    except OSError as e:
        import errno
        if e.errno != errno.EXDEV:
            raise
        shutil.move(src, dst)


def unproven_rebuild_reason(path: str, thread_id: str, lineage, session_id=None) -> str:
    """Why the file the registry names may not be moved as this thread's rebuild ('' if it may).

    A registry row is only a claim: the file must sit in Claude's projects folder once
    links are resolved (or, given ``session_id``, be named for it: `rollout write
    --projects-root` writes elsewhere), and start either with the header cc-lhc writes
    into a rebuild of this thread or with exactly the bytes cc-lhc recorded writing (lineage).
    """
    import hashlib
    root = os.path.realpath(os.path.join(claude_config_dir(), "projects"))
    real = os.path.realpath(path)
    inside = os.path.commonpath([root, real]) == root and real != root
    if not os.path.isfile(real) or not inside and (
            session_id is None or os.path.basename(real) != f"{session_id}.jsonl"):
        return f"{real} is not a file inside Claude's projects folder"
    try:
        with open(real, "rb") as f:
            head = f.read(max(lineage[0] if lineage else 0, 0) or (1 << 20))
    except OSError as e:
        return f"{real} cannot be read ({e.strerror})"
    if head.split(b"\n", 1)[0].find(f"{REBUILT_MARKER} from thread {thread_id}".encode()) != -1:
        return ""
    if lineage and lineage[1] and len(head) == lineage[0] and hashlib.sha256(head).hexdigest() == lineage[1]:
        return ""
    return f"{real} does not start as cc-lhc's rebuild of thread {thread_id}"


def recover_thread(home, registry, hostdb, thread_id) -> None:
    """Under the thread's lease: settle what a crash left behind."""
    # Accepted swaps whose pointer could not be written come first: their rebuild is
    # still 'pending' in the registry, and must not be mistaken for an unused one.
    for rid, from_s, to_s in hostdb.db.execute(
            "SELECT id, from_session, to_session FROM pointer_repairs WHERE thread_id = ? "
            "AND repaired IS NULL ORDER BY id", (thread_id,)).fetchall():
        if registry.current_session(thread_id) == from_s:
            advance_current(registry, thread_id, to_s)
            home.log("pointer_repaired", thread=thread_id, from_session=from_s, to_session=to_s)
        with Tx(hostdb.db) as db:
            db.execute("UPDATE pointer_repairs SET repaired = ? WHERE id = ?", (utc_now_iso(), rid))
    for session_id, owner, path, from_session in registry.db.execute(
            "SELECT session_id, owner, path, from_session FROM rebuilds WHERE thread_id = ? "
            "AND status = 'pending' ORDER BY created", (thread_id,)).fetchall():
        if owner_alive(owner):
            continue
        try:
            what = json.loads(owner).get("what") or "Smart Compact"
        except (TypeError, ValueError, AttributeError):
            what = "Smart Compact"
        keep_what_it_holds(home, hostdb, thread_id, session_id, path)
        if registry.current_session(thread_id) == from_session and rebuild_was_used(
                hostdb, thread_id, session_id, path):
            # Claude already held a turn in it: going back would drop that turn from what
            # Claude sees and return to the oversized session, so the swap is completed.
            keep_branch_of(home, thread_id, from_session, session_id)
            advance_current(registry, thread_id, session_id)
            settle_boundary(home, thread_id, session_id, recovered=True)
            say(f"an interrupted {what} of thread {thread_id[:8]} was completed: Claude had "
                f"already worked in its rebuilt session {session_id}, which the thread now continues")
            continue
        moved = abandon(home, registry, session_id, f"its {what} was interrupted")
        say(f"an interrupted {what} of thread {thread_id[:8]} was rolled back; the thread "
            "stays on its accepted session" + (f" (the unused rebuild is in {moved})" if moved else
                                                f" (its file {path} was left where it is)"
                                                if path and os.path.lexists(path) else ""))
    for key, owner in registry.db.execute(
            "SELECT session_id, owner FROM rebuilds WHERE thread_id = ? AND status = 'inprocess'",
            (thread_id,)).fetchall():
        if owner_alive(owner):
            continue
        # The session never changed: whether or not Claude took the view, it is the
        # thread's current one and its transcript says what happened. Nothing is moved.
        abandon(home, registry, key, "its in-process Smart Compact was interrupted")
        say(f"an interrupted in-process Smart Compact of thread {thread_id[:8]} was settled; "
            "the thread stays on its session")
    import shutil
    for name in os.listdir(home.ensure("recovery")):
        if name.startswith(thread_id):
            target = home.path("recovery", name)
            if os.path.isdir(target):
                shutil.rmtree(target, ignore_errors=True)
            else:
                os.unlink(target)
    if os.path.exists(home.path("threads", f"{thread_id}.sqlite")):
        repair_branch(home, thread_id, registry.current_session(thread_id))


def rebuild_was_used(hostdb, thread_id, session_id, path) -> bool:
    """Whether Claude wrote a turn of its own (a prompt or an answer) into a rebuild past
    the bytes cc-lhc replayed. Opening a session writes bookkeeping only, which does not
    count: a rebuild that merely started is still unused."""
    known = hostdb.session(session_id)
    if not known or not known["replayed_prefix_bytes"]:
        return False
    lineage = (known["replayed_prefix_bytes"], known["replayed_prefix_sha256"])
    if unproven_rebuild_reason(path, thread_id, lineage, session_id):  # (as abandon() proves it)
        return False
    try:
        with open_regular(path) as f:
            f.seek(known["replayed_prefix_bytes"])
            for raw in f:
                rec = json_record(raw)
                if (rec is not None and rec.get("type") in ("user", "assistant")
                        and not rec.get("isSidechain") and not rec.get("isMeta")
                        and isinstance(rec.get("message"), dict)):
                    return True
    except OSError:
        return False
    return False


def keep_what_it_holds(home, hostdb, thread_id, session_id, path) -> None:
    """Capture anything Claude wrote into an interrupted rebuild before it is moved away.

    The wrapper may have died after Claude answered in the rebuilt session but before
    that answer reached the thread; moving the file first would lose it.
    """
    known = hostdb.session(session_id)
    if not known or not os.path.exists(path) or os.path.getsize(path) <= known["replayed_prefix_bytes"]:
        return
    capture = Capture(home, thread_id, session_id, path, start_offset=known["replayed_prefix_bytes"])
    try:
        lines = capture.catch_up()
    finally:
        capture.stop()
    home.log("rebuild_content_kept", thread=thread_id, session=session_id, lines=lines)


def refuse_irregular_transcript(path, session_id, home) -> None:
    """A FIFO or device where a session's transcript belongs is never resumed.

    Reading a FIFO waits for a writer and a device never ends, for cc-lhc and for Claude
    alike, so the launch stops here with the reason instead of hanging.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return  # not there at all: the caller decides what that means
    if stat.S_ISREG(mode):
        return
    kind = _file_kind(mode)
    home.log("transcript_refused", session=session_id, path=path, kind=kind)
    raise usage_error(f"the transcript of session {session_id} ({path}) is a {kind}, not a "
                      "regular file; cc-lhc will not resume it")


def looks_rebuilt(path) -> bool:
    try:
        with open_regular(path) as f:
            first = f.readline(1 << 20)
        rec = load_json(first)
        content = (rec.get("message") or {}).get("content")
        return isinstance(content, str) and content.startswith(REBUILT_MARKER)
    except (OSError, ValueError, AttributeError):
        return False


def refuse_orphan(path, spec, home, registry) -> None:
    """A rebuilt-looking session no record knows of is never linked by guesswork."""
    if not looks_rebuilt(path):
        return
    texts = []
    with open_regular(path) as f:
        for raw in f:
            rec = json_record(raw)
            if rec is None:
                continue
            message = rec.get("message")
            content = message.get("content") if isinstance(message, dict) else None
            if rec.get("type") == "user" and isinstance(content, str) and not content.startswith(REBUILT_MARKER):
                texts.append(content)
            if len(texts) >= 5:
                break
    matches = []
    for thread_id, _cwd, _c, _o, _s in registry.threads():
        store = ThreadStore(home, thread_id)
        try:
            if any(store.db.execute("SELECT 1 FROM messages WHERE text = ? LIMIT 1", (t,)).fetchone()
                   for t in texts):
                matches.append(thread_id)
        finally:
            store.close()
    lines = [f"session {spec.session_id} looks like a rebuilt session that no cc-lhc record knows "
             "(left by an older version); it is not linked to any thread by guesswork.",
             "Choose the thread to continue with: cc-lhc --resume"]
    lines += [f"  unverified possible match: thread {m}" for m in matches]
    home.log("orphan_rebuild", session=spec.session_id, path=path, possible=matches)
    raise usage_error("\n".join(lines))


def file_is_held(path: str):
    """True when another process has the file open, False when provably not, None when unsure."""
    if sys.platform.startswith("linux"):
        return _held_linux(path)
    if sys.platform == "darwin":
        return _held_macos(path)
    if os.name == "nt":
        return _held_windows(path)
    return None


def _held_linux(path):
    target = os.path.realpath(path)
    try:
        st = os.stat(target)
    except OSError:
        return None
    # A process we may not inspect can only hold the file if the file lets it read.
    others_can_read = bool(st.st_mode & 0o044)
    me = os.getpid()
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    unsure = False
    for pid in pids:
        if int(pid) == me:
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue
        except PermissionError:
            unsure = unsure or others_can_read
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    return True
            except OSError:
                continue
    return None if unsure else False


def _held_macos(path):  # pragma: no cover - macOS only
    import subprocess
    try:
        out = subprocess.run(["lsof", "-t", "--", path], capture_output=True, text=True, timeout=10,
                             env=outside_environment())
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode == 0 and out.stdout.strip():
        return True
    if out.returncode == 1 and not out.stdout.strip() and not out.stderr.strip():
        return False
    return None


def _held_windows(path):  # pragma: no cover - Windows only
    """An exclusive-open probe: with no sharing allowed, any other open handle makes it fail."""
    import ctypes
    GENERIC_READ, OPEN_EXISTING, SHARING_VIOLATION = 0x80000000, 3, 32
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    kernel32.CreateFileW.restype = ctypes.c_void_p
    handle = kernel32.CreateFileW(path, GENERIC_READ, 0, None, OPEN_EXISTING, 0, None)
    if handle in (None, ctypes.c_void_p(-1).value):
        return True if ctypes.get_last_error() == SHARING_VIOLATION else None
    kernel32.CloseHandle(ctypes.c_void_p(handle))
    return False


def repair_torn_tail(path: str, home, session_id: str, on_trim=None):
    """Fix a transcript whose last line was cut off, before Claude resumes it.

    A complete record that only lacks its newline gets one; an incomplete fragment is
    saved under torn-lines/ and trimmed (then on_trim(fragment, offset) is told). Nothing
    is touched unless no other process can be shown to have the file open. Returns what
    was done, or None.
    """
    try:
        with open_regular(path) as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size == 0:
                return None
            window = min(size, 1 << 20)
            while True:
                f.seek(size - window)
                tail = f.read(window)
                cut = tail.rfind(b"\n")
                if cut >= 0 or window == size:
                    break
                window = min(size, window * 4)
    except OSError:
        return None
    if tail.endswith(b"\n"):
        return None
    fragment = tail[cut + 1:]
    held = file_is_held(path)
    if held is not False:
        home.log("torn_tail_left", session=session_id, path=path,
                 reason="held by another process" if held else "could not prove the file unheld")
        return None
    if whole_record(fragment, any_value=True):
        with open(path, "ab") as f:
            f.write(b"\n")
            f.flush()
            os.fsync(f.fileno())
        home.log("torn_tail_newline", session=session_id, path=path)
        return "newline"
    folder = home.ensure("torn-lines")
    name = session_id.replace("/", "~")  # (a subagent file's key names its folders)
    saved = os.path.join(folder, f"{name}-{utc_now_iso().replace(':', '')}.fragment")
    fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(fragment)
        out.flush()
        os.fsync(out.fileno())
    with open(path, "r+b") as f:
        f.truncate(size - len(fragment))
        os.fsync(f.fileno())
    home.log("torn_tail_trimmed", session=session_id, path=path, saved=saved, bytes=len(fragment))
    if on_trim is not None:
        on_trim(fragment, size - len(fragment))
    return "trimmed"


TORN_LINE = "torn_line"  # a last line cut off while Claude wrote it, trimmed from the file


def keep_cut_line(home, thread_id, session_id, path):
    """The on_trim of repair_torn_tail for a thread: the trimmed fragment is kept in the
    thread as a raw line (reason torn_line; export --format raw-lines shows it) and
    counted, so the thread holds every byte Claude wrote even after the file is mended."""
    def keep(fragment, offset):
        import sqlite3
        try:
            store = ThreadStore(home, thread_id)
            try:
                src = store.source(session_id)
                begin = (src["start_offset"] or 0) if src else 0  # where capture's line numbers start
                store.keep_raw_line(session_id, line_at(path, begin, offset), offset, TORN_LINE, fragment)
            finally:
                store.close()
        except (OSError, LhcError, sqlite3.Error) as e:  # it is saved under torn-lines/ all the same
            home.log("torn_line_not_kept", thread=thread_id, session=session_id, error=repr(e))
    return keep


# == 18. Launch: argument parsing, help, the managed launch =====================

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
        "--append-system-prompt-file",
        # options `claude --help` does not list, which take a value all the same (2.1.328):
        # the Agent SDK's argv holds some (--permission-prompt-tool stdio, --max-turns 3)
        "--accept-command", "--advisor", "--agent-color", "--agent-id", "--agent-name",
        "--agent-type", "--append-subagent-system-prompt", "--append-subagent-system-prompt-file",
        "--attach-serve", "--client-data-url", "--correlation-id", "--deep-link-cwd-b64",
        "--deep-link-last-fetch", "--deep-link-repo", "--event", "--fast-mode",
        "--forward-home-settings", "--inherit-permission-mode", "--initialize-fields",
        "--lead-verify-key", "--list", "--managed-settings", "--max-cost", "--max-thinking-tokens",
        "--max-turns", "--messaging-socket-path", "--metadata", "--on-branch", "--output",
        "--parent-session-id", "--permission-prompt-tool", "--plan-mode-instructions",
        "--plugin-dir-no-mcp", "--pool", "--prefill", "--prefill-b64", "--proactivity", "--profile",
        "--project-config-root", "--ref", "--result-format", "--resume-drops-turn",
        "--resume-session-at", "--review-md", "--rewind-files", "--runner-declares", "--sdk-url",
        "--session-began-as-copy", "--task-budget", "--team-name", "--teammate-mode", "--thinking",
        "--thinking-display", "--transport", "--watch-artifact", "--watch-artifact-no-autoreact",
        "--workload")},
    **{o: "optional" for o in (
        "-r", "--resume", "-d", "--debug", "--cloud", "--from-pr", "--prompt-suggestions",
        "--remote-control", "--teleport", "-w", "--worktree", "--rc", "--remote")},
    **{o: "variadic" for o in (
        "--add-dir", "--allowedTools", "--allowed-tools", "--betas", "--disallowedTools",
        "--disallowed-tools", "--file", "--mcp-config", "--tools", "--channels",
        "--dangerously-load-development-channels")},
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
        try:
            self.cwd = os.getcwd()
        except FileNotFoundError:
            raise usage_error("the current folder no longer exists; cd to a folder first")
        self.flags = {}               # lhc launch flags: name -> value
        self.found = {}               # what scan_claude_args saw
        self.mod = None               # the ModBridge of an interactive managed session
        self.extra_env = {}           # added to the child's environment
        self.after_spawn = None       # called once the child exists (failpoints)
        self.session = None           # the ManagedSession around the child, once there is one
        self.said_at_start = []       # lines said before Claude started, said again over its screen
        self.new_thread = None        # (thread, session, transcript, bytes cc-lhc wrote into it or
                                      # None) when this launch made the thread
        self.governed = True          # False when Claude keeps no transcript to capture
        self.piped_input = False      # an interactive Claude whose input is a pipe (a plain child)


# Claude's one-letter options that take no value. Its parser (commander) reads a run of
# one-letter options as each in turn (-cp is -c -p); a letter that takes a value takes
# the rest of the run as it (-pr<id> is -p -r <id>).
CLAUDE_SHORT_FLAGS = frozenset(("-c", "-h", "-p", "-v"))


def split_short_options(args):
    """Claude's argv with each run of one-letter options written out one by one (pure):
    ["-cp", "x"] -> ["-c", "-p", "x"], so the session selectors and the print flag in it
    are found, and a selector can be replaced without losing the letters beside it. A run
    holding a letter Claude does not know is left as it is (Claude says what is wrong)."""
    out, value_next = [], False
    for i, a in enumerate(args):
        if value_next:  # the value of the option before it (`-n -pc` names a session "-pc")
            out.append(a)
            value_next = False
            continue
        if a == "--":
            return out + args[i:]
        value_next = CLAUDE_VALUE_OPTIONS.get(a) == "value"
        parts = []
        if a.startswith("-") and not a.startswith("--") and len(a) > 2 and a[2] != "=":
            rest = a[1:]
            while rest:
                letter = "-" + rest[0]
                if letter in CLAUDE_SHORT_FLAGS:
                    parts.append(letter)
                    rest = rest[1:]
                elif CLAUDE_VALUE_OPTIONS.get(letter) in ("value", "optional"):
                    parts.append("-" + rest)  # (its value written onto it, when there is one)
                    rest = ""
                else:
                    parts = None
                    break
            value_next = bool(parts) and CLAUDE_VALUE_OPTIONS.get(parts[-1]) == "value"  # (-pn <name>)
        out.extend(parts or [a])
    return out


def scan_claude_args(args):
    """Walk Claude's argv once and describe it (pure; the argv is never changed).

    Returns a dict: print_mode, resume (value or True for bare), continue_,
    session_id, fork, autocompact, help_or_version, positionals.
    """
    found = {"print_mode": False, "resume": None, "continue_": False, "session_id": None,
             "fork": False, "autocompact": False, "help_or_version": False,
             "positional_at": [], "selectors": [], "fork_args": [],
             "no_persistence": False, "background": False}
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            found["positional_at"].extend(range(i + 1, len(args)))
            break
        if not a.startswith("-") or a == "-":
            found["positional_at"].append(i)
            i += 1
            continue
        name, eq, inline = a.partition("=")
        if value_attached(a):
            name, eq, inline = a[:2], "=", a[2:]
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
            found["selectors"].append((i, consumed))
            if found["resume"] is not None:
                raise usage_error("--resume is given more than once")
            if name == "-r" and value is not None and a.startswith("-r="):
                meant = (value[1:] if len(value) <= 65 and value.isprintable() and " " not in value
                         else shown_arg(value[1:])) or "<session id>"
                given = a if len(a) <= 68 and a.isprintable() else shown_arg(a)
                raise usage_error(f"{given}: Claude reads all that follows -r as its value, its \"=\" "
                                  f"too, which names no session; write -r {meant} or --resume={meant}")
            found["resume"] = value if value is not None else True
        elif name in ("-c", "--continue"):
            found["selectors"].append((i, consumed))
            found["continue_"] = True
        elif name == "--session-id":
            found["fork_args"].append((i, consumed))  # (a fork cc-lhc writes names it itself)
            if value is None:
                raise usage_error("--session-id needs a session id (a UUID)")
            if not is_uuid(value):
                raise usage_error(f"--session-id {shown_arg(value)} is not a UUID")
            found["session_id"] = value
        elif name == "--fork-session":
            found["fork_args"].append((i, consumed))
            found["fork"] = True
        elif name == "--autocompact":
            found["autocompact"] = True
            found["autocompact_arg"] = " ".join(args[i:i + consumed])  # as given, for /details
        elif name == "--no-session-persistence":
            found["no_persistence"] = True
        elif name in ("--bg", "--background"):
            found["background"] = True
        elif name in ("-h", "--help", "-v", "--version"):
            found["help_or_version"] = True
        i += consumed
    found["positionals"] = [args[at] for at in found["positional_at"]]
    return found


def value_attached(arg: str) -> bool:
    """Whether an argument is a short option with its value written onto it (-r<id>,
    -nfoo): all of the rest is the value, as Claude reads it, an "=" included (-n=x names
    the session "=x")."""
    return not arg.startswith("--") and len(arg) > 2 and CLAUDE_VALUE_OPTIONS.get(arg[:2]) in ("value", "optional")


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
    "--lhc-thinking-replay": ("thinkingReplay", True,
                              "thinking in rebuilt sessions: signed_verbatim (default) or omit"),
    "--lhc-no-notifier": (None, False, "no advisory line when /clear, /resume or /compact is typed to Claude"),
}


def option_value(name: str, value: str) -> str:
    """The word after a value-taking cc-lhc option, refused when it is another option.

    `--lhc-target --resume <id>` would otherwise take `--resume` as the target and hand
    the session id to Claude as a prompt, launching a fresh session instead.
    The `name=value` form is never ambiguous, so it is how such a value is written.
    """
    if value.startswith("-"):
        raise usage_error(f"{name} needs a value, but {value!r} looks like an option; "
                          f"write {name}=VALUE if that is really the value")
    return value


def parse_launch(argv) -> tuple:
    """Split our argv into the wrapper's own flags and Claude's arguments.

    Everything after the first standalone `--` belongs to Claude untouched. Before any
    Claude argument that `--` is cc-lhc's own separator (`cc-lhc -- doctor`); after one it
    is Claude's, and goes on with the rest (`cc-lhc -p -- "-5 degrees?"` asks Claude what
    `claude -p -- "-5 degrees?"` asks).
    """
    flags, claude_args = {}, []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            claude_args.extend(argv[i:] if claude_args else argv[i + 1:])
            break
        if a.startswith("--lhc-"):
            name, eq, inline = a.partition("=")
            if name not in LHC_FLAGS:
                raise usage_error(f"unknown cc-lhc flag {name} (see cc-lhc --lhc-help)")
            field, takes_value, _ = LHC_FLAGS[name]
            if name in flags:  # (the last would win without a word: which one was meant?)
                raise usage_error(f"{name} is given twice; give it once")
            if takes_value:
                if eq:
                    value = inline
                elif i + 1 < len(argv):
                    value = option_value(name, argv[i + 1])
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
            value = token_count_text(str(value))  # (text that is no count: the fallback names it)
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
  search <text> [--limit N] [--thread T | --all]  find an exact string (else the
                                 words), at most N hits (20): in a session its thread;
                                 outside one this folder's threads
  measure <transcript|folder>    what Smart Compact would do, counts only
  rollout write ...              write a thread's view as a Claude session
  backfill-labels <thread>       add stable labels to older stored renderings
  preview [--fixture F] [--geometry G] [--raw] [--list]
                                 draw the control panel's frames (never starts Claude)
  doctor [--repair]              check this installation (--repair: rebuild the
                                 registry from the thread files)

Environment:
  CC_LHC_HOME          state folder (default ~/.cc-lhc)
  CC_LHC_CLAUDE_BIN    the claude program to run (default: claude on PATH)
  CC_LHC_TOKENIZER_FILE  o200k_base rank file for exact token counts
  CC_LHC_SUMMARIES     "off" (or 0, false, no) stops background turn summaries (extractive ones are used)
  CC_LHC_LEADER        the key that opens the control panel (default ctrl-])
  CC_LHC_MOD           "off" (or 0, false, no) keeps the cc-lhc mod out of Claude (Smart Compact swaps)
  CC_LHC_MOD_COMPACT   "decline": the mod keeps its tools but Smart Compact swaps
  CLAUDE_CONFIG_DIR    Claude's own folder (default ~/.claude)
  CLAUDE_CODE_PLUGIN_DIRS  read, not set: plugin folders Claude loads (their Stop hooks)
  XDG_CONFIG_HOME      where config.json is looked for (cc-lhc/config.json)
  TMPDIR (TEMP, TMP on Windows)  where measure keeps its throwaway copy while it runs
  CC_LHC_RUNTIME_DESCRIPTOR  set by cc-lhc for Claude's retrieval; do not set it
  CC_LHC_FAILPOINT     tests only: kill cc-lhc at a named step to prove recovery

Configuration: ~/.config/cc-lhc/config.json, then .cc-lhc.json in the project,
then the flags above. Fields: lowerBoundTokens, upperBoundTokens, profile,
pruneEnabled, pruneThresholdTokens, pruneTargetTokens, minRunwayTokens,
thinkingReplay (signed_verbatim or omit), nativeCompact (true or false). Token
values are whole numbers from 1 to 10,000,000; anything else falls back to the
default. A flag value starting with `-` is refused: write --lhc-target=VALUE.

Exit status: Claude's own status when Claude ran (128+N when it died of signal N);
2 for a usage error or a refusal; 127 when claude cannot be found; 1 for an
internal error, an unusable state folder, or when `doctor` finds something broken.
"""


def render_help() -> str:
    rows = []
    for flag, (_field, takes_value, text) in LHC_FLAGS.items():
        left = f"{flag} N" if takes_value and flag not in ("--lhc-profile", "--lhc-thinking-replay") else (
            f"{flag} NAME" if takes_value else flag)
        rows.append(f"  {left:<27} {text}")
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
    """cc-lhc's own lines go to stderr, so Claude's stdout stays Claude's.

    Never raises: when the terminal is gone (closed window: EIO, EBADF, EPIPE, or a
    closed stream) the line is lost, but the cleanup that called us must still run.
    """
    try:
        sys.stderr.write(f"{PROG}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # (AttributeError: no stderr at all)
        pass


POLICY_PROBLEMS_SHOWN = 8  # configuration problems listed on the terminal; wrapper.log has all


def policy_problem_lines(problems, indent="  ") -> list:
    """The configuration problems as listed for a person: the first POLICY_PROBLEMS_SHOWN,
    then how many more wrapper.log names (a file of hundreds of unknown fields would
    bury the fallback line, and Claude's screen with it)."""
    lines = [f"{indent}{problem}" for problem in problems[:POLICY_PROBLEMS_SHOWN]]
    if len(problems) > POLICY_PROBLEMS_SHOWN:
        lines.append(f"{indent}and {len(problems) - POLICY_PROBLEMS_SHOWN} more (wrapper.log names every one)")
    return lines


def announce_policy(policy: Policy, home: StateHome, spec=None) -> None:
    """The configuration fallback said at startup (and, for a launch ``spec``, kept to be
    said again over Claude's screen, which an interactive Claude draws over these lines)."""
    if not policy.fell_back:
        return
    say(MSG_CONFIG_FALLBACK)
    for line in policy_problem_lines(policy.problems):
        say(line)
    home.log("config_fallback", message=MSG_CONFIG_FALLBACK, problems=policy.problems)
    if spec is not None:
        more = len(policy.problems) - 1
        spec.said_at_start.append(f"{MSG_CONFIG_FALLBACK} ({policy.problems[0]}"
                                  + (f"; and {more} more: {leader_key()[1]} shows them)" if more else ")"))


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def build_launch(argv) -> LaunchSpec:
    flags, claude_args = parse_launch(argv)
    claude_args = split_short_options(claude_args)
    spec = LaunchSpec()
    spec.flags = flags
    spec.claude_args = claude_args
    found = scan_claude_args(claude_args)
    # Claude itself answers and exits when its output is no terminal (`cc-lhc "x" > out`,
    # a pipe, a CI job), -p or not; in a PTY it would wait for keys nobody types. When its
    # input is no terminal (`echo x | cc-lhc`) it takes the piped words as the prompt and
    # reads the keyboard from the terminal itself: a PTY between would hand it the words as
    # typed, never sent, and the keyboard to nobody. Both run Claude as a plain child.
    spec.piped_input = not found["print_mode"] and _is_terminal(sys.stdout) and not _is_terminal(sys.stdin)
    spec.print_mode = found["print_mode"] or not _is_terminal(sys.stdout) or spec.piped_input
    spec.autocompact = found["autocompact"]
    spec.positionals = found["positionals"]
    first = found["positionals"][0] if found["positionals"] else None
    # (`doctor` reaches here only after `--`: `cc-lhc doctor` is cc-lhc's own check)
    if found["help_or_version"] or ((first in CLAUDE_SUBCOMMANDS or first == "doctor") and claude_args
                                    and claude_args[0] == first):
        spec.passthrough = True
        spec.child_argv = [find_claude_binary()] + claude_args
        return spec
    spec.found = found
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
    if spec.passthrough:  # (it keeps nothing but log lines: Claude's --help answers whatever the state folder)
        return run_oneshot(spec, home)
    home.ensure()
    policy = load_policy(spec.cwd, policy_flag_values(spec.flags))
    announce_policy(policy, home, spec)
    if spec.piped_input:
        say(MSG_PIPED_INPUT)
    capture = attach_thread(spec, home, policy)
    home.log("launch", version=VERSION, mode="oneshot" if spec.print_mode else "interactive",
             session=spec.session_id, resume=spec.resume, cwd=spec.cwd,
             thread=capture.thread_id if capture else None,
             policy={k: policy.values[k] for k in ("lowerBoundTokens", "upperBoundTokens",
                                                   "minRunwayTokens", "profile")})
    if capture is None:
        return run_host(spec, home)
    if not spec.print_mode:
        spec.mod = ModBridge.offer(spec, home)
    with ManagedSession(spec, home, policy, capture) as session:
        status = run_host(spec, home)
    killed = status - 128 if status > 128 else None
    if killed in CRASH_SIGNALS:
        # (a signal the person sends, or one cc-lhc passes on as it ends, needs no word; the
        # thread is the one Claude was on at the end, after a /clear too)
        say(f"Claude ended by signal {signal.Signals(killed).name}, not by itself; everything up to then is "
            f"in thread {session.capture.thread_id[:8]}, and `cc-lhc --continue` (or `--resume "
            f"{spec.session_id}`) goes on from there")
    return status


CRASH_SIGNALS = {getattr(signal, name) for name in ("SIGKILL", "SIGSEGV", "SIGABRT", "SIGBUS", "SIGILL", "SIGFPE")
                 if hasattr(signal, name)}


# == 19. Commands: threads, export, retrieval, search, measure, doctor, main ====


def _take_option(args, name, default=None, cast=str):
    """Remove `name VALUE` / `name=VALUE` from args and return the value."""
    for i, a in enumerate(args):
        if a == name:
            if i + 1 >= len(args):
                raise usage_error(f"{name} needs a value")
            value = option_value(name, args[i + 1])
            del args[i:i + 2]
            break
        if a.startswith(name + "="):
            value = a[len(name) + 1:]
            del args[i]
            break
    else:
        return default
    if any(a == name or a.startswith(name + "=") for a in args):
        raise usage_error(f"{name} is given more than once")
    try:
        return cast(value)
    except ValueError:
        raise usage_error(f"{name}: {shown_arg(value)} is not valid")


def token_count_text(text: str):
    """A token count as a person writes it: ASCII digits, in groups of three marked by ","
    or "_" if at all (180000, 180,000, 180_000). Anything else (5,0,0,0; +40000; other
    scripts' digits) is given back as it is, for the check to name."""
    if re.fullmatch(r"[0-9]+|[0-9]{1,3}(?:,[0-9]{3})+|[0-9]{1,3}(?:_[0-9]{3})+", text):
        return int(text.replace(",", "").replace("_", ""))
    return text


def whole_number(text: str) -> int:
    """An option's integer as written in ASCII digits (a leading minus allowed, so a range
    check can say what is wrong): int() alone would also take "1_000", " 5" or other
    scripts' digits."""
    if not re.fullmatch(r"-?[0-9]+", text):
        raise ValueError(text)
    return int(text)


def _take_number(args, name, default, low, high=None):
    """An integer option within low..high (no upper bound when high is None): a value out
    of range is refused, never quietly moved into it."""
    value = _take_option(args, name, default, whole_number)
    if value != default and (value < low or (high is not None and value > high)):
        span = f"from {low:,} to {high:,}" if high is not None else f"{low:,} or more"
        raise usage_error(f"{name}: {value} is out of range ({span})")
    return value


def _take_flag(args, name) -> bool:
    if name in args:
        args.remove(name)
        if name in args:
            raise usage_error(f"{name} is given more than once")
        return True
    return False


def _no_more(args, command):
    if args:
        raise usage_error(f"{command}: unexpected argument {shown_arg(args[0])}")


def _turn_number(text: str) -> int:
    m = re.fullmatch(r"t?([0-9]+)", text.strip())
    if not m:
        raise usage_error(f"{shown_arg(text)} is not a turn label like t12")
    return label_number(m.group(1), text.strip())


def cmd_threads(args) -> int:
    """List captured threads."""
    as_json = _take_flag(args, "--json")
    _no_more(args, "threads")
    home = StateHome()
    broken, registry = [], None
    if not registry_known(home):
        rows = []
    else:
        registry = Registry(home)
        rows = []
        for thread_id, cwd, created, origin, session in registry.threads():
            try:
                store = ThreadStore.existing(home, thread_id)
                try:
                    info = store.summary()
                    cost = derivation_cost(store)
                finally:
                    store.close()
            except (LhcError, OSError, sqlite3_errors()) as e:
                # One damaged file must not hide every other thread: name it and go on.
                if not registry.dropped(thread_id):  # (else a launch just removed an empty one)
                    broken.append((thread_id, e))
                continue
            rows.append({"id": thread_id, "cwd": cwd, "current_session": session, "origin": origin,
                         "created": created, **info, "degraded": bool(info["degraded"]),
                         "degraded_reason": info["degraded"], "summariser": cost})
    for thread_id, e in broken:
        say(f"thread {thread_id[:8]} left out of this list: {e}; cc-lhc doctor says how to fix it")
    status = EXIT_ERROR if broken or (registry is not None and registry.unreadable) else EXIT_OK
    if as_json:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return status
    if not rows:
        print("no threads yet" if not broken else "no readable threads")
        return status
    print(f"{'thread':<10} {'turns':>6} {'msgs':>7} {'captured':>10}  {'summaries':>18}  "
          f"{'last activity':<20} {'current session':<37} cwd")
    for r in rows:
        flag = "  DEGRADED: " + escape_controls(r["degraded_reason"]) if r["degraded"] else ""
        s = r["summariser"]
        spent = f"{s['calls']} calls/{s['input_tokens'] + s['output_tokens']} tok"
        print(f"{r['id'][:8]:<10} {r['turns']:>6} {r['messages']:>7} {r['captured_bytes']:>10}  "
              f"{spent:>18}  {(r['last_activity'] or '-')[:19]:<20} {r['current_session'] or '-':<37} "
              f"{escape_controls(r['cwd'] or '')}{flag}")
    return status


def export_record(m: dict, agents=None) -> dict:
    """One message as the export format shows it: verbatim content, nothing re-worded.

    A subagent's record carries ``agent``: which agent wrote it and the call that started
    it (``agents`` is ThreadStore.agents()); it is not part of the main conversation.
    """
    out = {"label": f"m{m['seq']}", "turn": f"t{m['turn']}", "role": m["role"], "kind": m["kind"]}
    if m.get("agent"):
        info = (agents or {}).get(m["agent"], {})
        tool_use_id, call = agent_run_call(info, m)
        out["agent"] = {"id": m["agent"], "kind": info.get("kind"), "tool_use_id": tool_use_id,
                        "call": f"m{call}" if call else None}
    data = json.loads(m["data"]) if m["data"] else None
    if m["kind"] == "tool_call":
        out["tool"] = m["tool_name"]
        out["input"] = data.get("input") if isinstance(data, dict) else None
    elif m["kind"] == "tool_result":
        out["output"] = data.get("content") if isinstance(data, dict) else m["text"]
        out["is_error"] = bool(m["is_error"])
    elif m["kind"] == "thinking":
        out["text"] = m["text"]
        out["signature"] = data.get("signature") if isinstance(data, dict) else None
    elif m["kind"] == SAVED_OUTPUT and isinstance(data, dict):
        out["text"] = m["text"]  # (the file's bytes are raw_base64 when they are not UTF-8)
        out.update({k: data[k] for k in ("path", "bytes", "raw_base64") if k in data})
        if "raw_zlib_base64" in data:  # (kept compressed)
            import base64
            import zlib
            out["raw_base64"] = base64.b64encode(zlib.decompress(base64.b64decode(data["raw_zlib_base64"]))
                                                 ).decode("ascii")
    elif m["text"] is not None:
        out["text"] = m["text"]
        if data is not None:  # (a text block that held more than its text: citations, say)
            out["block"] = data
    else:
        out["block"] = data
    if m["tool_use_id"]:
        out["tool_use_id"] = m["tool_use_id"]
    if m["model"]:
        out["model"] = m["model"]
    out["source_session"] = m["source_session"]
    out["source_uuid"] = m["source_uuid"]
    return out


def code_fence(text) -> str:
    """A Markdown fence longer than any run of backticks in text, so text cannot end it."""
    runs = re.findall(r"`+", text or "")
    return "`" * max(3, max(map(len, runs), default=0) + 1)


# What a Markdown export writes as an escape (\xNN): control characters other than newline
# and tab, whose effect on a terminal (colours, a cleared screen, a carriage return over a
# line, a changed title) could hide or fake what the export shows. The JSON form keeps them.
MARKDOWN_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def agent_run_call(info: dict, m: dict) -> tuple:
    """(tool_use_id, seq) of the call whose run of its agent wrote ``m``: the newest
    SendMessage to the agent sent before ``m`` was written (it ran the agent again, see
    RolloutParser), else the call that started the agent. ``info``: ThreadStore.agents()'s
    entry for the agent."""
    at = m.get("created")
    if isinstance(at, str):
        for when, _turn, seq, tool_use_id in reversed(info.get("sends") or ()):
            if when <= at:
                return tool_use_id, seq
    return info.get("tool_use_id"), info.get("call")


def render_markdown_message(m: dict, agents=None) -> str:
    return MARKDOWN_CONTROL.sub(lambda c: f"\\x{ord(c.group()):02x}", _markdown_message(m, agents))


def _markdown_message(m: dict, agents=None) -> str:
    """One message in the Markdown export; a subagent's names its agent and, when known
    (``agents``: ThreadStore.agents()), the call that started it."""
    label = f"m{m['seq']}"
    if m.get("agent"):
        _tool_use_id, call = agent_run_call((agents or {}).get(m["agent"], {}), m)
        label += f" · subagent {m['agent']}" + (f", started by m{call}" if call else "")
    if m["kind"] == "tool_call":
        fence = code_fence(m["text"])
        return f"**{label} · tool call {m['tool_name']}** (`{m['tool_use_id']}`)\n\n{fence}json\n{m['text']}\n{fence}\n"
    if m["kind"] == "tool_result":
        err = " · error" if m["is_error"] else ""
        fence = code_fence(m["text"])
        out = f"**{label} · tool result{err}** (`{m['tool_use_id']}`)\n\n{fence}\n{m['text']}\n{fence}\n"
        extra, _images = other_blocks(m)  # (an MCP tool's search_result or document: its text names only the type)
        if extra:
            fence = code_fence(extra)
            out += f"\nthe strings of its other blocks:\n\n{fence}\n{extra}\n{fence}\n"
        return out
    if m["kind"] == SAVED_OUTPUT:
        fence = code_fence(m["text"])
        return (f"**{label} · the whole tool output Claude saved to a file** (`{m['tool_use_id']}`)\n\n"
                f"{fence}\n{m['text']}\n{fence}\n")
    if m["kind"] == "thinking":
        thought = m["text"] or ""
        if EXPORT_HEADING_LINE.search(thought):  # (in a quote, such a line is still a heading or a label)
            fence = code_fence(thought)
            return f"**{label} · thinking**\n\n{fence}\n{thought}\n{fence}\n"
        return f"**{label} · thinking**\n\n> " + thought.replace("\n", "\n> ") + "\n"
    body = m["text"] if m["text"] is not None else f"`{m['data']}`"
    if _breaks_markdown(body):
        fence = code_fence(body)
        body = f"{fence}\n{body}\n{fence}"
    return f"**{label} · {m['role']} · {m['kind']}**\n\n{body}\n"


MARKDOWN_FENCE_OPEN = re.compile(r" {0,3}(`{3,}(?=[^`]*$)|~{3,})")
EXPORT_HEADING_LINE = re.compile(r"^ {0,3}(## t\d+ *$|# Thread |\*\*m\d+ · )", re.M)
# A line that can open a CommonMark HTML block: some run to their closing text, to the
# document's end when it never comes, and read no fence inside. One such line is reason
# enough to fence the message (a fence too many costs nothing).
MARKDOWN_HTML_OPEN = re.compile(r" {0,3}<[A-Za-z/!?]")


def _breaks_markdown(text: str) -> bool:
    """Whether a message's own Markdown could run on past it in an export (a code fence it
    leaves open, as CommonMark reads fences, or an HTML block) or pass for the export's
    own turn and message headings. One pass over its lines."""
    if EXPORT_HEADING_LINE.search(text):
        return True
    fence = None  # the open fence's closing pattern
    for line in text.split("\n"):
        if fence is not None:
            if fence.fullmatch(line):
                fence = None
            continue
        if MARKDOWN_HTML_OPEN.match(line):
            return True
        opened = MARKDOWN_FENCE_OPEN.match(line)
        if opened:
            mark = opened.group(1)
            fence = re.compile(rf" {{0,3}}{re.escape(mark[0])}{{{len(mark)},}}[ \t]*")
    return fence is not None


def cmd_export(args) -> int:
    """Print a thread's canonical record in label order."""
    fmt = _take_option(args, "--format", "json")
    first = _take_option(args, "--from", None, _turn_number)
    last = _take_option(args, "--to", None, _turn_number)
    if fmt not in ("json", "markdown", "raw-lines"):
        raise usage_error("--format is json, markdown or raw-lines")
    if len(args) != 1:
        raise usage_error(COMMAND_USAGE["export"])
    if first is not None and last is not None and first > last:
        raise usage_error(f"--from t{first} --to t{last} is not a usable range (the first turn comes first)")
    if fmt == "raw-lines" and (first is not None or last is not None):
        raise usage_error("--format raw-lines keeps no turns: give it without --from and --to")
    home = StateHome()
    if not registry_known(home):
        raise usage_error("no threads yet")
    thread_id = Registry(home).resolve_prefix(args[0])
    store = ThreadStore.existing(home, thread_id)
    out = sys.stdout
    try:
        if first is not None or last is not None:
            low, high = store.db.execute("SELECT min(n), max(n) FROM turns").fetchone()
            if low is None or (first or low) > high or (last if last is not None else high) < low:
                holds = ("it holds no turn yet" if low is None else f"it holds only t{low}" if low == high
                         else f"it holds t{low}\u2013t{high}")
                asked = " ".join(f"{flag} t{n}" for flag, n in (("--from", first), ("--to", last)) if n is not None)
                raise usage_error(f"thread {thread_id[:8]} has no turn in {asked}: {holds}")
        agents = store.agents() if fmt != "raw-lines" else {}
        if fmt == "raw-lines":
            for row in store.db.execute("SELECT session, line, offset, reason, raw, created FROM raw_lines "
                                        "ORDER BY created, session, offset"):
                write_raw_line(out, *row)
        elif fmt == "json":
            out.write("[")
            sep = "\n"
            for m in store.messages(first, last, agents=True):
                out.write(sep + json_as_written(export_record(m, agents), ensure_ascii=False))
                sep = ",\n"
            out.write("\n]\n")
        else:
            out.write(f"# Thread {thread_id}\n")
            turn = None
            # (turn by turn: a subagent file is read after its session's, so its records
            # come later in label order than the turns after the one that started them)
            for m in store.messages(first, last, agents=True, by_turn=True):
                if m["turn"] != turn:
                    turn = m["turn"]
                    out.write(f"\n## t{turn}\n\n")
                out.write(render_markdown_message(m, agents) + "\n")
    finally:
        store.close()
    return EXIT_OK


def one_line_json(value) -> str:
    """JSON on one line for any reader: the characters some take for a line break (U+2028,
    U+2029, U+0085, which JSON may hold as they are) written as escapes."""
    return json.dumps(value, ensure_ascii=False).translate(LINE_BREAK_ESCAPES)


LINE_BREAK_ESCAPES = {0x2028: "\\u2028", 0x2029: "\\u2029", 0x85: "\\u0085"}


RAW_LINE_CHUNK = 1 << 20  # bytes of a kept line written at a time


def write_raw_line(out, session, line, offset, reason, raw, created) -> None:
    """raw_line_record's JSON, on one line, written to ``out`` a piece at a time: a kept
    line can be hundreds of MB (a run of NULs a crash left in the file), and its escapes
    (six characters for a NUL) would otherwise be made whole, twice, before any went out."""
    raw = bytes(raw or b"")
    head = {"session": session, "line": line, "offset": offset, "reason": reason, "created": created}
    if len(raw) <= RAW_LINE_CHUNK:
        out.write(one_line_json(raw_line_record(session, line, offset, reason, raw, created)) + "\n")
        return
    import codecs
    check, view = codecs.getincrementaldecoder("utf-8")(), memoryview(raw)
    try:
        for at in range(0, len(raw), RAW_LINE_CHUNK):
            check.decode(view[at:at + RAW_LINE_CHUNK], final=at + RAW_LINE_CHUNK >= len(raw))
        text = True
    except UnicodeDecodeError:
        text = False
    out.write(one_line_json(head)[:-1] + (', "raw": "' if text else ', "raw_base64": "'))
    if text:
        decoder = codecs.getincrementaldecoder("utf-8")()
        for at in range(0, len(raw), RAW_LINE_CHUNK):
            piece = decoder.decode(view[at:at + RAW_LINE_CHUNK], final=at + RAW_LINE_CHUNK >= len(raw))
            out.write(one_line_json(piece)[1:-1])
    else:
        import base64
        step = RAW_LINE_CHUNK - RAW_LINE_CHUNK % 3  # (whole groups of three: no padding inside)
        for at in range(0, len(raw), step):
            out.write(base64.b64encode(view[at:at + step]).decode("ascii"))
    out.write('"}\n')


def raw_line_record(session, line, offset, reason, raw, created) -> dict:
    """One transcript line the record keeps as it was (malformed, or repaired on the way
    in): where it stood, why, and its bytes (as text when they are UTF-8, else base64)."""
    out = {"session": session, "line": line, "offset": offset, "reason": reason, "created": created}
    raw = bytes(raw or b"")
    try:
        out["raw"] = raw.decode("utf-8")
    except UnicodeDecodeError:
        import base64
        out["raw_base64"] = base64.b64encode(raw).decode("ascii")
    return out


RETRIEVAL_CEILING = 24_000  # whole stdout of one retrieval, envelope included
REQUEST_SHOWN_CHARS = 300   # of a retrieval's request, in its envelope's opening line
LABEL_RANGE_RE = re.compile(r"^([tm])([0-9]+)(?:(?:-|\.\.|\u2013)\1?([0-9]+))?$")


# The most labels one retrieval names in all (its ranges added up): far more than one
# answer holds (the rest comes with --from), and a bound on what a request can cost.
LABELS_MAX = 100_000


def parse_labels(args, letter: str):
    """['t3', 't5-t7'] -> [3, 5, 6, 7] (order kept, duplicates dropped)."""
    out, seen, named = [], set(), 0
    for a in args:
        for piece in a.replace(",", " ").split():
            m = LABEL_RANGE_RE.match(piece.strip())
            if not m or m.group(1) != letter:
                raise usage_error(f"{shown_arg(piece)} is not a {'turn' if letter == 't' else 'message'} "
                                  f"label like {letter}12 or {letter}12-{letter}15")
            a_n = label_number(m.group(2), piece)
            b_n = label_number(m.group(3) or m.group(2), piece)
            if b_n < a_n:
                raise usage_error(f"{shown_arg(piece)} is not a usable range (the first label comes first)")
            if b_n - a_n > MESSAGE_RANGE_SPAN:
                raise usage_error(f"{shown_arg(piece)} is not a usable range: ask for at most "
                                  f"{MESSAGE_RANGE_SPAN:,} labels past its first at a time")
            named += b_n - a_n + 1
            if named > LABELS_MAX:
                raise usage_error(f"more than {LABELS_MAX:,} labels in one request; ask for fewer "
                                  "(an answer holds a part of them anyway, the rest comes with --from)")
            for n in range(a_n, b_n + 1):
                if n not in seen:
                    seen.add(n)
                    out.append(n)
    if not out:
        raise usage_error(f"name at least one label, like {letter}12")
    return out


def render_message_body(m: dict) -> str:
    """One message as retrieval shows it: a label line, then the content exactly as recorded."""
    head = f"--- m{m['seq']} \u00b7 {m['role']} \u00b7 {m['kind']}"
    if m.get("agent"):
        head += f" \u00b7 subagent {m['agent']}"
    if m["tool_name"]:
        head += f" \u00b7 {m['tool_name']}"
    if m["tool_use_id"]:
        head += f" ({m['tool_use_id']})"
    if m["is_error"]:
        head += " \u00b7 error"
    content = _output_blocks_text(m)
    if content is None:
        content = m["text"] if m["text"] is not None else (m["data"] or "")
    return f"{head}\n{content}\n"


def _output_blocks_text(m):
    """A tool output of blocks other than one text (an MCP tool's search_result or document,
    an image, several texts) as retrieval shows it: each text block's text, each other
    block whole as JSON, in order (the text column holds only placeholders for them);
    None for an output that is one text, which the text column holds exactly."""
    content = result_blocks(m)
    if content is None:
        return None
    texts = [isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in content]
    if len(content) == 1 and texts[0]:
        return None  # (one text, its fields for the API aside (cache_control): the text column)
    return "\n".join(b["text"] if is_text else json_as_written(b, ensure_ascii=False, separators=(",", ":"))
                     for b, is_text in zip(content, texts))


def _char_start(body: bytes, i: int) -> int:
    """The first UTF-8 character boundary at or after byte i."""
    while i < len(body) and (body[i] & 0xC0) == 0x80:
        i += 1
    return i


def slice_body(body: bytes, start_tokens: int, room: int):
    """Cut body at a token offset (4 bytes a token) to at most `room` bytes.

    A token offset T means the first character boundary at or after byte 4*T, so every
    piece is whole UTF-8 and the pieces of a continued retrieval join back into the
    exact original bytes, whatever characters sit at the cuts. Returns (piece, the
    token offset of the rest or None).
    """
    start = _char_start(body, start_tokens * 4)
    if start >= len(body):
        return b"", None
    limit = start + max(room, 64)
    if limit >= len(body):
        return body[start:], None
    next_from = (limit - 3) // 4  # its boundary lies at most 3 bytes further on
    return body[start:_char_start(body, next_from * 4)], next_from


def _request_text(letter: str, numbers) -> str:
    """Labels as a short request that parse_labels reads back: [3, 4, 5, 9] -> "t3-t5 t9"."""
    return " ".join(message_request(a, b, letter) for a, b in label_ranges(numbers))


def emit_retrieval(command: str, thread_id: str, request: str, body: str, start: int, frozen: str = "") -> int:
    """Write one retrieval envelope within the stdout ceiling; returns bytes written.

    When the body does not fit, the piece shown is followed by one added newline and a
    continuation receipt naming the bytes shown so far and the `--from` offset of the rest.
    """
    # (the request as an attribute on one line: a quote or a newline in it ends neither,
    # and a backslash is doubled so that an escape in it reads as one; a long one, such as
    # a search for a pasted block of output, is shown by its start: the receipt below, when
    # one is needed, gives it whole)
    asked = f"{command} {request}"
    if len(asked) > REQUEST_SHOWN_CHARS:
        asked = f"{asked[:REQUEST_SHOWN_CHARS]}… ({len(asked) - REQUEST_SHOWN_CHARS:,} more characters)"
    shown = escape_controls(asked.replace("\\", "\\\\")).replace(
        "&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    opening = f'<cc-lhc-recall thread="{thread_id[:8]}" request="{shown}">\n'.encode()
    closing = b"</cc-lhc-recall>\n"
    data = body.encode("utf-8")

    def receipt(shown, next_from):
        return (f"\n[cut: {shown} of {len(data)} bytes shown so far. The rest: "
                f"cc-lhc {command} --from {next_from} {frozen}{request}]\n").encode()

    piece, next_from = slice_body(data, start, RETRIEVAL_CEILING - len(opening) - len(closing) - 1)
    if next_from is not None:  # it does not fit whole: room for the receipt too
        room = RETRIEVAL_CEILING - len(opening) - len(closing) - len(receipt(len(data), len(data)))
        if room < 1024:
            raise usage_error(f"{command}: the request is too long to answer within the "
                              f"{RETRIEVAL_CEILING:,}-byte output ceiling; ask for fewer labels or "
                              "shorter text")
        piece, next_from = slice_body(data, start, room)
    out = [opening, piece]
    if next_from is not None:
        out.append(receipt(_char_start(data, start * 4) + len(piece), next_from))
    else:
        if piece and not piece.endswith(b"\n"):
            out.append(b"\n")
        if start and not piece:
            out.append(b"[nothing after that offset]\n")
    out.append(closing)
    blob = b"".join(out)
    sys.stdout.flush()
    sys.stdout.buffer.write(blob)
    sys.stdout.buffer.flush()
    return len(blob)


def _retrieval_store(home):
    body = check_descriptor(home)
    return body, ThreadStore.existing(home, body["thread_id"])  # (a record that is gone is named, never made anew)


def _record_impression(store, session, command, labels, turns, size):
    """Note what a retrieval showed (the next view favours those turns), after its answer
    was printed: a thread another process holds locked for long gets no note, said in the
    log, rather than a retrieval that waits and then fails."""
    def note():
        with Tx(store.db):
            store.db.execute("INSERT INTO impressions (session, command, labels, turns, bytes, created) "
                             "VALUES (?, ?, ?, ?, ?, ?)",
                             (session, command, ",".join(labels), ",".join(str(t) for t in sorted(turns)),
                              size, utc_now_iso()))
    import sqlite3
    try:
        if written_briefly(store.db, note, IMPRESSION_LOCK_WAIT_MS):
            return
        reason = "the thread was locked by another process"
    except (sqlite3.Error, OSError) as e:  # (a full disk, a folder made read-only: the answer stands)
        if store.db.in_transaction:
            store.db.execute("ROLLBACK")
        reason = f"the thread could not be written: {e}"
    StateHome().log("impression_not_recorded", thread=store.thread_id, command=command, reason=reason)


def _retrieve(args, letter: str, command: str, render) -> int:
    """The shared shell of get-turns and get-messages: labels in, one envelope out.

    ``render(store, numbers)`` returns (body parts, turns they came from); the descriptor
    is checked before the store is opened, and the impression recorded after the output.
    """
    start = _take_number(args, "--from", 0, 0)
    through = _take_option(args, "--through", None, _through_label)
    numbers = parse_labels(args, letter)
    desc, store = _retrieval_store(StateHome())
    try:
        if through is None:
            # A turn still open grows while it is read: Claude's own retrieval calls join it.
            # The answer is made of the messages there are now, and a continuation names the
            # newest (--through), so its pieces join into this answer, not a longer one.
            through = store.db.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0]
        parts, turns = render(store, numbers, through)
        size = emit_retrieval(command, store.thread_id, _request_text(letter, numbers), "".join(parts),
                              max(0, start), frozen=f"--through m{through} ")
        _record_impression(store, desc["session_id"], command, [f"{letter}{n}" for n in numbers],
                           turns, size)
    finally:
        store.close()
    return EXIT_OK


class _Missing:
    """Labels asked for that the thread does not hold, said once a run: a range past the
    thread's end (t30-t10000 of 31 turns) is one line naming what it holds, not a line
    for each label (10,000 lines, 19 pieces for Claude to read on through)."""

    def __init__(self, letter, noun, held, opener, closer):
        self.letter, self.noun, self.held, self.opener, self.closer = letter, noun, held, opener, closer
        self.run = None  # [first, last] of the run being gathered

    def add(self, parts, n) -> None:
        if self.run is not None and n == self.run[1] + 1:
            self.run[1] = n
            return
        self.flush(parts)
        self.run = [n, n]

    def flush(self, parts) -> None:
        if self.run is None:
            return
        (a, b), self.run = self.run, None
        if a == b:
            parts.append(f"{self.opener} {self.letter}{a}: no such {self.noun} in this thread{self.closer}\n")
            return
        low, high = self.held
        holds = f"it holds {self.letter}{low}-{self.letter}{high}" if low is not None else "it holds none yet"
        parts.append(f"{self.opener} {self.letter}{a}-{self.letter}{b}: no such {self.noun}s in this thread "
                     f"({holds}){self.closer}\n")


def _render_turns(store, numbers, through):
    """Turns as they stood when message m``through`` was the newest: a turn that closed after
    it (or had not begun) reads as it did then, open (or missing)."""
    parts = []
    held = store.db.execute("SELECT min(n), max(n) FROM turns WHERE first_seq IS NULL OR first_seq <= ?",
                            (through,)).fetchone()
    missing = _Missing("t", "turn", held, "===", " ===")
    for n in numbers:
        row = store.db.execute("SELECT kind, status, last_seq, first_seq FROM turns WHERE n = ?", (n,)).fetchone()
        if row is None or (row[3] is not None and row[3] > through):
            missing.add(parts, n)
            continue
        missing.flush(parts)
        kind, status, last_seq, _first = row
        if status != "open" and (last_seq is None or last_seq > through):
            status = "open"
        parts.append(f"=== t{n} ({kind}, {status}) ===\n")
        parts.extend(render_message_body(m) for m in store.messages(n, n) if m["seq"] <= through)
    missing.flush(parts)
    return parts, numbers


def _render_messages(store, numbers, through):
    parts, turns = [], set()
    cols = ", ".join(MESSAGE_COLUMNS)
    held = store.db.execute("SELECT min(seq), max(seq) FROM messages WHERE seq <= ?", (through,)).fetchone()
    missing = _Missing("m", "message", held, "---", "")
    for n in numbers:
        row = store.db.execute(f"SELECT {cols} FROM messages WHERE seq = ? AND seq <= ?", (n, through)).fetchone()
        if row is None:
            missing.add(parts, n)
            continue
        missing.flush(parts)
        m = message_row(row)
        turns.add(m["turn"])
        parts.append(render_message_body(m))
    missing.flush(parts)
    return parts, turns


def _through_label(value: str) -> int:
    """--through's message label (one, such as m57: the newest message a continued answer holds)."""
    m = re.fullmatch(r"m([0-9]+)", value)  # (m0: the thread held no message when it began)
    if not m or not 0 <= int(m.group(1)) <= LABEL_NUMBER_MAX:
        raise ValueError(value)
    return int(m.group(1))


def cmd_get_turns(args) -> int:
    """Give back whole turns exactly as recorded (run by Claude through Bash)."""
    return _retrieve(args, "t", "get-turns", _render_turns)


def cmd_get_messages(args) -> int:
    """Give back single messages exactly as recorded (run by Claude through Bash)."""
    return _retrieve(args, "m", "get-messages", _render_messages)


SEARCH_WORDS_MAX = 12  # words of a text asked of the word index: its longest distinct ones


def search_words(text: str) -> list:
    """The words a words search asks for: distinct, the longest first, at most
    SEARCH_WORDS_MAX of them. A pasted log excerpt holds hundreds, and each is a phrase the
    index matches position by position: all of them took minutes and gigabytes on a
    message of a few MB, and a dozen long ones already pick the messages out."""
    words = list(dict.fromkeys(re.findall(r"\w[\w./-]*", text, flags=re.UNICODE)))
    return sorted(words, key=len, reverse=True)[:SEARCH_WORDS_MAX]


def fts_query(text: str):
    """User text as an FTS5 word query (each of search_words must appear, each quoted so no
    syntax leaks), or None when the text has no words."""
    words = search_words(text)
    if not words:
        return None
    return " ".join('"' + w.replace('"', '""') + '"' for w in words)


EXACT_QUERY_TERMS = 40        # trigrams asked of the substring index; instr() checks the rest
SEARCH_CONTEXT_CHARS = 60     # shown either side of an exact match, within its line


def exact_query(text: str):
    """The substring index's query for text: all of a spread of its trigrams (None under 3
    characters). Each trigram is one quoted term, so quotes, backslashes, ^ * ( ) : in the
    text are only characters; rows holding them all are candidates for instr() to confirm."""
    if len(text) < 3:
        return None
    starts = list(range(0, len(text) - 2, 3))
    if starts[-1] != len(text) - 3:
        starts.append(len(text) - 3)
    if len(starts) > EXACT_QUERY_TERMS:
        step = len(starts) / EXACT_QUERY_TERMS
        starts = [starts[int(i * step)] for i in range(EXACT_QUERY_TERMS - 1)] + [starts[-1]]
    terms = dict.fromkeys(text[i:i + 3] for i in starts)
    return " AND ".join('"' + t.replace('"', '""') + '"' for t in terms)


# Format characters that are part of how a script or an emoji is written, shown as they
# are: the joiners, and the visible marks that Arabic, Syriac and Kaithi numbers begin
# with; tag characters only in an emoji flag's sequence (England's: a black flag, then tags).
SHOWN_FORMAT = re.compile("[\u200c\u200d\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\U000110bd\U000110cd]")
FLAG_TAGS = re.compile("\U0001f3f4[\U000e0020-\U000e007f]+")


def escape_controls(text: str) -> str:
    """Text on one line: control characters (newlines, tabs, ESC, ...) and the format
    characters that change how the rest of a line reads without showing themselves (Unicode's
    Cf: bidirectional overrides, embeddings, isolates and marks, under which a hit's line
    could show text in another order than its message holds it; zero-width spaces, a soft
    hyphen, a byte-order mark; not SHOWN_FORMAT) written as escapes."""
    import unicodedata
    out = []
    flags = {at for m in FLAG_TAGS.finditer(text) for at in range(m.start() + 1, m.end())}
    for at, ch in enumerate(text):
        if at in flags:
            out.append(ch)
        elif ch in "\n\t\r":
            out.append({"\n": "\\n", "\t": "\\t", "\r": "\\r"}[ch])
        elif (ord(ch) < 32 or 127 <= ord(ch) < 160 or ch in "\u2028\u2029"
              or (ord(ch) >= 0xAD and unicodedata.category(ch) == "Cf" and not SHOWN_FORMAT.match(ch))):
            out.append(f"\\x{ord(ch):02x}" if ord(ch) < 256 else f"\\u{ord(ch):04x}" if ord(ch) < 0x10000
                       else f"\\U{ord(ch):08x}")
        else:
            out.append(ch)
    return "".join(out)


def shown_query(text: str) -> str:
    """The searched text as a message repeats it: quoted, and cut when it is long."""
    return repr(text if len(text) <= 200 else text[:100] + "\u2026" + text[-60:])


def match_context(body: str, text: str) -> str:
    """The line holding the first match of text, cut to some characters either side of it,
    with the match between » and «, on one line."""
    at = body.find(text)
    if at < 0:
        return escape_controls(body[:2 * SEARCH_CONTEXT_CHARS])
    end = at + len(text)
    match = text if len(text) <= 2 * SEARCH_CONTEXT_CHARS else (
        text[:SEARCH_CONTEXT_CHARS] + "\u2026" + text[-SEARCH_CONTEXT_CHARS:])
    return _context_line(body, at, end, lambda before, after: (
        f"{escape_controls(before)}\u00bb{escape_controls(match)}\u00ab{escape_controls(after)}"))


def _context_line(body: str, at: int, end: int, show) -> str:
    """The part of the line holding body[at:end] that a hit shows: up to SEARCH_CONTEXT_CHARS
    either side of it, marked with … where it is cut; show(before, after) renders it."""
    line_start = body.rfind("\n", 0, at) + 1
    line_end = body.find("\n", end)
    line_end = len(body) if line_end < 0 else line_end
    left = max(line_start, at - SEARCH_CONTEXT_CHARS)
    right = min(line_end, end + SEARCH_CONTEXT_CHARS)
    return (("\u2026" if left > 0 else "") + show(body[left:at], body[end:right])
            + ("\u2026" if right < len(body) else ""))


class SearchHit:
    """One message search found: its label, where it stands, and a line of context."""

    def __init__(self, thread_id, seq, turn, kind, tool_name, created, how, context, rank=0.0, agent=None,
                 own=0):
        self.thread_id, self.seq, self.turn, self.kind = thread_id, seq, turn, kind
        self.agent = agent  # the subagent whose record it is (the main chain: None)
        self.own = own  # 1: a retrieval of cc-lhc's own (OWN_RETRIEVAL_SQL), shown after the rest
        self.tool_name, self.created, self.how, self.context = tool_name, created, how, context
        self.rank = rank  # the word index's bm25 (lower is better); 0 for exact matches

    def line(self, with_thread=False) -> str:
        what = f"{self.kind} {self.tool_name}" if self.tool_name else self.kind
        if self.agent:
            what += f" in subagent {self.agent}"
        when = f"{self.created[:16].replace('T', ' ')} UTC" if self.created else "time unknown"
        head = f"{self.thread_id[:8]} " if with_thread else ""
        return f"{head}m{self.seq} (t{self.turn}, {what}, {when}, {self.how}): {self.context}"


# A command line that runs one (not one that only names it: a grep for it, a file written
# about it): cc-lhc (by any path) first in the line or after a separator, its variables set
# before it or not.
RETRIEVAL_RUN = re.compile(r"(?:^|[;&|({`\n]|\$\()\s*(?:\w+=\S*\s+)*(?:\S*/)?cc-lhc(?:\.exe)?\s+"
                           r"(?:search|get-turns|get-messages)(?![\w-])")
RETRIEVAL_TOOLS = ("lhc_get_turns", "lhc_get_messages", "lhc_search")


def _retrieval_call(tool_name, text) -> int:
    """lhc_retrieval_call() in SQL: 1 when a tool call (its name, its JSON input) runs one
    of cc-lhc's retrievals: the mod's tools, or a command line (RETRIEVAL_RUN)."""
    if tool_name in RETRIEVAL_TOOLS:
        return 1
    if not isinstance(text, str) or "cc-lhc" not in text:
        return 0
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return 0
    command = value.get("command") if isinstance(value, dict) else None
    return int(isinstance(command, str) and RETRIEVAL_RUN.search(command) is not None)


# A message that is cc-lhc's own retrieval, in a query's columns (kind, body, call_id, and
# seq of the row named hit): a call of get-turns, get-messages or search (as a command line
# or the mod's tool) and what one answered (its envelope, or whatever the call's output
# became when the command piped it through grep or tail). Claude searching for a string
# twice finds its first search as well: such hits come after every other one, so they
# never push the original out.
OWN_RETRIEVAL_SQL = ("coalesce(CASE WHEN kind = 'tool_result' THEN substr(body, 1, 15) = '<cc-lhc-recall ' "
                     "OR EXISTS (SELECT 1 FROM messages c WHERE c.tool_use_id = call_id AND c.kind = 'tool_call' "
                     "AND lhc_retrieval_call(c.tool_name, c.text)) "
                     "WHEN kind = 'tool_call' THEN (SELECT lhc_retrieval_call(c.tool_name, c.text) "
                     "FROM messages c WHERE c.seq = hit.seq) ELSE 0 END, 0)")
# What a search reads of a message (m), the columns above among them.
HIT_COLUMNS_SQL = f"m.seq, m.turn, m.kind, m.tool_name, m.created, m.agent, m.tool_use_id AS call_id, " \
                  f"{SEARCH_BODY_SQL} AS body"


SEQ_MAX = 2 ** 63 - 1


def _exact_hits(store, text: str, limit: int, behind=False, through=SEQ_MAX):
    """Messages holding text exactly, newest first (cc-lhc's own retrievals last): through
    the substring index when there is one and text is 3 characters or more, else by a scan;
    either stops once it has `limit`. ``behind``: the index does not cover the newest
    messages yet, which are scanned. ``through``: messages after m``through`` are left out."""
    query = exact_query(text)
    cols = HIT_COLUMNS_SQL
    # (read before the index is: a chunk the index takes in meanwhile is then both matched
    # and scanned, and its hits are counted once, never neither)
    upto = store.db.execute("SELECT value FROM meta WHERE key = 'exact_upto'").fetchone() if behind else None
    scanned = []
    if query is not None and store.has_exact_index():
        # (LIMIT -1 keeps the query below from folding this one into it: body is then
        # made once a candidate, not once for each use of it)
        inner = (f"SELECT {cols} FROM messages_exact x JOIN messages m ON m.seq = x.rowid "
                 "WHERE messages_exact MATCH ? ORDER BY x.rowid DESC LIMIT -1")
        args = (query, text)
        scanned = store.exact_scanned(text)
    else:
        inner = f"SELECT {cols} FROM messages m ORDER BY m.seq DESC LIMIT -1"
        args = (text,)

    def found(inner, args):
        # One pass, newest first: it stops once `limit` hits are not cc-lhc's own (which
        # come after every other); a string few messages hold is read through once, not
        # once for each kind of hit.
        hits = ([], [])
        for seq, turn, kind, tool, created, agent, _call, body, own in store.db.execute(
                f"SELECT *, {OWN_RETRIEVAL_SQL} FROM ({inner}) AS hit WHERE seq <= ? AND instr(body, ?) > 0",
                (*args[:-1], through, args[-1])):
            if len(hits[own]) < limit:
                hits[own].append(SearchHit(store.thread_id, seq, turn, kind, tool, created, "exact",
                                           match_context(body, text), agent=agent, own=own))
            if len(hits[0]) >= limit:
                break
        return (hits[0] + hits[1])[:limit]
    hits = found(inner, args)
    # Each part holds its best `limit` in this order, so the merge holds the whole's.
    if scanned:
        hits += found(f"SELECT {cols} FROM messages m WHERE m.seq IN ({','.join('?' * len(scanned))}) "
                      "ORDER BY m.seq DESC LIMIT -1", (*scanned, text))
    if behind and query is not None and store.has_exact_index():
        hits += found(f"SELECT {cols} FROM messages m WHERE m.seq > ? ORDER BY m.seq DESC LIMIT -1",
                      (int(upto[0]) if upto else 0, text))
    once = {h.seq: h for h in hits}
    return sorted(once.values(), key=lambda h: (h.own, -h.seq))[:limit]


def _word_hits(store, text: str, limit: int, through=SEQ_MAX):
    """Messages holding every word of text, ranked by the word index (cc-lhc's own
    retrievals after the rest). Pages of the index's order are read until `limit` hits
    that are not its own are in hand, so only the messages shown are decoded. Messages
    after m``through`` are left out."""
    query = fts_query(text)
    if query is None:
        return []
    db = store.db
    hits, own_hits, offset, page = [], [], 0, limit
    while len(hits) < limit:
        ranked = db.execute("SELECT rowid, rank FROM messages_fts WHERE messages_fts MATCH ? ORDER BY rank "
                            "LIMIT ? OFFSET ?", (query, page, offset)).fetchall()
        offset += len(ranked)
        seqs = [seq for seq, _rank in ranked if seq <= through]
        # The line of context is cut here, not by FTS5's snippet(): on one message of a few
        # hundred KB holding the words many times that took seconds to minutes.
        found = {row[0]: row for row in db.execute(
            f"SELECT *, {OWN_RETRIEVAL_SQL} FROM (SELECT {HIT_COLUMNS_SQL} "
            f"FROM messages m WHERE m.seq IN ({','.join('?' * len(seqs))}) LIMIT -1) AS hit",
            seqs)} if seqs else {}
        for seq, rank in ranked:
            if seq not in found:
                continue
            _s, turn, kind, tool, created, agent, _call, body, own = found[seq]
            (own_hits if own else hits).append(SearchHit(store.thread_id, seq, turn, kind, tool, created, "words",
                                                         word_context(body or "", text), rank, agent, own))
        if len(ranked) < page:
            break
    return (hits + own_hits)[:limit]


def word_context(body: str, text: str) -> str:
    """The line around the first of text's words the body holds (whole words first, in
    any case), cut as match_context cuts it, each of the words in it between » and «."""
    words = sorted({w for w in re.findall(r"\w+", text)}, key=len, reverse=True)
    either = "|".join(re.escape(w) for w in words)
    found = None
    for pattern in ((rf"\b(?:{either})\b", either) if words else ()):
        pattern = re.compile(pattern, re.IGNORECASE)
        found = pattern.search(body)
        if found:
            break
    if found is None and words and not (text.isascii() and body.isascii()):
        # The word index reads letters without their accents ("naive" finds "naïve"): so
        # does this look, on the body's letters folded the same way, mapped back.
        import unicodedata
        folded, where = _accents_folded(body[:FOLDED_CONTEXT_CHARS])
        for pattern in (rf"\b(?:{either})\b", either):
            hit = re.search(_accents_folded(pattern)[0], folded, re.IGNORECASE)
            if hit:
                at, end = where[hit.start()], where[hit.end() - 1] + 1
                while end < len(body) and unicodedata.combining(body[end]):  # (its accents with it)
                    end += 1
                return _context_line(body, at, end, lambda before, after: escape_controls(
                    f"{before}\u00bb{body[at:end]}\u00ab{after}"))
    if found is None:
        return escape_controls(" ".join(body[:2 * SEARCH_CONTEXT_CHARS].split()))
    at, end = found.span()
    return _context_line(body, at, end, lambda before, after: escape_controls(
        pattern.sub(lambda m: f"\u00bb{m.group(0)}\u00ab", before + found.group(0) + after)))


FOLDED_CONTEXT_CHARS = 200_000  # of a message, looked through without accents for a words hit's line


def _accents_folded(text: str):
    """The text with its letters' accents (combining marks) taken off, and for each of its
    characters the index of the character of ``text`` it came from."""
    import unicodedata
    out, where = [], []
    for i, c in enumerate(text):
        if c.isascii():
            out.append(c)
            where.append(i)
            continue
        for part in unicodedata.normalize("NFD", c):
            if not unicodedata.combining(part):
                out.append(part)
                where.append(i)
    return "".join(out), where


# How long a search waits for the thread's write lock to bring its indexes up to date
# (the session's own capture holds it for a batch at a time; a long index build, seconds)
# before it searches without them what they do not cover yet.
SEARCH_LOCK_WAIT_MS = 2_000
IMPRESSION_LOCK_WAIT_MS = 100  # a retrieval's note of what it showed: a hint, worth no page's wait


def search_thread(store, text: str, limit: int, through=SEQ_MAX):
    """Messages holding text exactly, newest first; only when none does, the messages that
    hold its words, best ranked first (the text was vague: words that never stand so).

    "None" leaves cc-lhc's own retrievals aside: a search Claude runs is recorded before it
    runs, so its own call always holds the text; such hits come last, after the words."""
    def found(hits):
        return any(not h.own for h in hits)
    indexed = written_briefly(store.db, store.index_search)  # (False: another process holds the lock)
    hits = _exact_hits(store, text, limit, behind=not indexed, through=through)
    if not found(hits) and not text.isascii():
        # Pasted text of another Unicode normal form than the thread's (an accented letter as
        # one character, or as a letter and a mark, as macOS writes file names) finds it
        # too; its words are read composed (decomposed, they are cut at each mark).
        import unicodedata
        for form in ("NFC", "NFD"):
            other = unicodedata.normalize(form, text)
            more = _exact_hits(store, other, limit, behind=not indexed, through=through) if other != text else []
            if found(more):
                hits = _merged(more, hits, limit)
                break
        text = unicodedata.normalize("NFC", text)
    if found(hits):
        return hits
    return _merged(_word_hits(store, text, limit, through), hits, limit)


def _merged(first, then, limit) -> list:
    """Two lists of hits as one: each message once, cc-lhc's own retrievals after the rest."""
    seen, out = {}, []
    for hit in first + then:
        if hit.seq not in seen:
            seen[hit.seq] = len(out)
            out.append(hit)
        elif hit.how == "exact":  # (found both ways: it holds the text as it was given)
            out[seen[hit.seq]] = hit
    return sorted(out, key=lambda h: h.own)[:limit]


class RawLineHit(collections.namedtuple("RawLineHit", "thread_id session line reason created context")):
    """A transcript line the thread keeps as written and holds as no message (see
    raw_line_record) that holds the searched text."""

    def line_text(self, with_thread=False) -> str:
        when = f"captured {self.created[:16].replace('T', ' ')} UTC" if self.created else "time unknown"
        head = f"{self.thread_id[:8]} " if with_thread else ""
        return f"{head}line {self.line} of session {self.session[:8]} ({self.reason}, {when}): {self.context}"


RAW_HITS_NOTE = ("A line kept as written is no message (a damaged record, or one the thread could not place): "
                 "cc-lhc export {thread} --format raw-lines shows it whole.")
# Lines kept as written whose records are messages all the same (a number stored as null,
# half an emoji mended): search finds those as the messages.
RAW_LINES_OF_MESSAGES = ("number_out_of_range", "text_repaired")


def raw_line_hits(store, text: str, limit: int) -> list:
    """The lines the thread keeps as written, and holds as no message, that hold text in one
    of their strings (for a line that is no JSON, in any way JSON spells it), newest captured
    first. They are few: each is read whole."""
    spellings = list(dict.fromkeys((text, _dump_json(text)[1:-1], json.dumps(text)[1:-1])))
    hits = []
    for session, line, reason, raw, created in store.db.execute(
            "SELECT session, line, reason, raw, created FROM raw_lines WHERE reason NOT IN "
            f"({','.join('?' * len(RAW_LINES_OF_MESSAGES))}) AND ("
            + " OR ".join(["instr(raw, ?) > 0"] * len(spellings)) + ") ORDER BY created DESC, session, line",
            (*RAW_LINES_OF_MESSAGES, *[t.encode("utf-8", "surrogatepass") for t in spellings])):
        raw = bytes(raw or b"")
        try:
            value = json.loads(raw, parse_int=str, parse_float=str, parse_constant=str)
        except (ValueError, RecursionError):
            value = None
        if value is not None:
            found = [(core_text(v), text) for v in json_strings(value) if text in v][:1]
        else:  # (a torn or damaged line: its bytes, the text as JSON would have written it)
            whole = raw.decode("utf-8", "replace")
            found = [(whole, t) for t in spellings if t in whole][:1]
        if found:
            hits.append(RawLineHit(store.thread_id, session, line, reason, created, match_context(*found[0])))
            if len(hits) >= limit:
                break
    return hits


THREAD_BUSY_WAIT_SECONDS = 1.0


def thread_busy(home, thread_id) -> bool:
    """Whether another process holds the thread file's write lock (waited for at most
    THREAD_BUSY_WAIT_SECONDS: a commit of this process's own capture is over by then)."""
    import sqlite3
    import urllib.parse
    path = home.path("threads", f"{thread_id}.sqlite")
    try:  # (mode=rw: a thread file that is not there is not made here)
        db = sqlite3.connect(f"file:{urllib.parse.quote(path)}?mode=rw", uri=True,
                             timeout=THREAD_BUSY_WAIT_SECONDS, isolation_level=None)
    except sqlite3.Error:
        return False
    try:
        db.execute("BEGIN IMMEDIATE")
        db.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as e:
        return lock_error(e)
    finally:
        db.close()


def say_if_thread_busy(home, thread_id, until: str) -> None:
    """Say, before a wait for it, that another process holds the thread's write lock: the
    terminal is otherwise silent for as long as that lasts."""
    if thread_busy(home, thread_id):
        say(f"waiting for another process that is writing thread {thread_id[:8]} to finish (a search "
            f"bringing its index up to date, say) {until}")


def lock_error(e) -> bool:
    """Whether an SQLite error is another connection holding the lock asked for."""
    return "locked" in str(e) or "busy" in str(e)


def written_briefly(db, work, wait_ms=None) -> bool:
    """work() with the connection waiting ``wait_ms`` (SEARCH_LOCK_WAIT_MS unless given), not
    its own timeout, for another process's write lock; False when it did not get it (what
    work() had committed stays)."""
    import sqlite3
    (usual,) = db.execute("PRAGMA busy_timeout").fetchone()
    db.execute(f"PRAGMA busy_timeout = {int(SEARCH_LOCK_WAIT_MS if wait_ms is None else wait_ms)}")
    try:
        work()
        return True
    except sqlite3.OperationalError as e:
        if not lock_error(e):
            raise
        if db.in_transaction:  # (a COMMIT that could not get the lock leaves its transaction open)
            db.execute("ROLLBACK")
        return False
    finally:
        db.execute(f"PRAGMA busy_timeout = {int(usual)}")


SEARCH_LIMIT_MAX = 200
SEARCH_USAGE = "usage: cc-lhc search <text> [--limit N] [--thread T | --all] [--from N] [-- <text>]"


def cmd_search(args) -> int:
    """Find where threads hold a string or some words; prints labels to read back.

    Inside a session (a runtime descriptor is set) it searches that session's thread only,
    for Claude, after the descriptor's checks; outside one it is for people: this folder's
    threads, one (--thread) or all (--all).
    """
    text_args = []
    if "--" in args:
        at = args.index("--")
        args, text_args = args[:at], args[at + 1:]
    limit = _take_number(args, "--limit", 20, 1, SEARCH_LIMIT_MAX)
    start = _take_number(args, "--from", None, 0)
    through = _take_option(args, "--through", None, _through_label)
    thread = _take_option(args, "--thread")
    every = _take_flag(args, "--all")
    odd = next((a for a in args if re.fullmatch(r"--[A-Za-z][\w-]*(=.*)?", a)), None)
    if odd is not None:
        raise usage_error(f"search: unknown option {odd} (to search for text that starts with --, "
                          f"put -- before it, after any options: cc-lhc search [--limit N] [--thread T] -- {odd})")
    text = " ".join(args + text_args)
    if not text:
        raise usage_error(SEARCH_USAGE)
    if os.environ.get(RUNTIME_ENV) is None:  # (set but empty names no session: refused below)
        if start is not None or through is not None:
            raise usage_error(f"search: {'--from' if start is not None else '--through'} continues a search "
                              "inside a session; outside one the whole answer is printed")
        return _search_for_people(text, limit, thread, every)
    desc, store = _retrieval_store(StateHome())
    try:
        if thread is not None or every:
            raise usage_error("search: inside a session it searches this session's thread; "
                              "--thread and --all are for use outside one")
        _search_in_session(desc, store, text, limit, start or 0, through)
    finally:
        store.close()
    return EXIT_OK


def more_hits_line(limit: int) -> str:
    """Said under a list of hits that stopped at its limit while more match."""
    if limit >= SEARCH_LIMIT_MAX:
        return f"(more messages match than the {limit} shown: search for a longer string to narrow it)"
    return f"(more messages match than the {limit} shown: --limit {SEARCH_LIMIT_MAX} shows up to {SEARCH_LIMIT_MAX})"


def _search_in_session(desc, store, text, limit, start, through):
    import shlex
    continued = through is not None
    if through is None:
        # The answer holds the messages there are now, and a continuation names the newest
        # (--through), so its pieces join into this answer even when messages holding the
        # text came meanwhile (they came first in a list read newest first).
        through = store.db.execute("SELECT coalesce(max(seq), 0) FROM messages").fetchone()[0]
    request = ((f"--limit {limit} " if limit != 20 else "") + ("-- " if text.startswith("-") else "")
               + shlex.quote(text))  # after `--`, text that looks like an option stays text
    # An answer cut into pieces is kept beside the session's descriptor until it ends, and a
    # continuation reads on in those very bytes: the word index ranks by figures of the whole
    # thread, which the messages that came meanwhile change, so hits found again could come
    # in another order.
    kept = _kept_answer_path(store.thread_id, request, through)
    body = _read_kept_answer(kept) if continued and kept else None
    hits = []
    if body is None:
        hits = search_thread(store, text, limit + 1, through)
        more, hits = len(hits) > limit, hits[:limit]
        lines = [h.line() for h in hits]
        if not lines:
            lines = [f"no messages match {shown_query(text)}"]
        else:
            if more:
                lines.append(more_hits_line(limit))
            lines.append("Read one back with cc-lhc get-messages mN or cc-lhc get-turns tN"
                         + (" (a subagent's record: get-messages only)." if any(h.agent for h in hits) else "."))
        raw = raw_line_hits(store, text, limit)
        if raw:
            lines += [h.line_text() for h in raw] + [RAW_HITS_NOTE.format(thread=store.thread_id[:8])]
        body = "\n".join(lines) + "\n"
        if kept and len(body.encode("utf-8")) > RETRIEVAL_CEILING // 2:
            try:
                _write_private_json(kept, {"body": body})
            except OSError:
                pass  # (a continuation then searches again)
    size = emit_retrieval("search", store.thread_id, request, body, max(0, start),
                          frozen=f"--through m{through} ")
    _record_impression(store, desc["session_id"], "search", [f"m{h.seq}" for h in hits],
                       {h.turn for h in hits}, size)


def _kept_answer_path(thread_id, request, through):
    """Where a search answer that needs pieces is kept for its continuations: the session's
    shim folder (removed with its descriptor), or None outside one."""
    import hashlib
    descriptor = os.environ.get(RUNTIME_ENV)
    if not descriptor:
        return None
    key = hashlib.sha256(f"{thread_id}\0{request}\0{through}".encode("utf-8", "surrogatepass")).hexdigest()
    return os.path.join(shim_dir_of(descriptor), f"search-{key[:24]}.json")


def _read_kept_answer(path):
    try:
        body = load_json(read_small_file(path, 4 << 20)).get("body")
    except (OSError, ValueError, AttributeError, LhcError):
        return None
    return body if isinstance(body, str) else None


def _search_for_people(text, limit, thread, every) -> int:
    if thread is not None and every:
        raise usage_error("search: give --thread T or --all, not both")
    home = StateHome()
    if not registry_known(home):
        if thread is not None:  # (an id that names nothing is the same mistake with or without threads)
            raise usage_error(f"no thread matches {thread!r}: no threads yet")
        print("no threads yet")
        return EXIT_OK
    registry = Registry(home)
    if thread is not None:
        thread_ids = [registry.resolve_prefix(thread)]
    else:
        try:
            here = os.path.realpath(os.getcwd())
        except OSError:  # the folder this runs in was removed: only --all can say anything
            if not every:
                raise usage_error("this folder no longer exists; search every thread with --all")
            here = None
        thread_ids = [t[0] for t in registry.threads()
                      if every or (t[1] and os.path.realpath(t[1]) == here)]
        if not thread_ids:
            print("no threads yet" if every else f"no thread was captured in {here}; search every thread with --all")
            return EXIT_OK
    exact, words, raw, skipped = [], [], [], 0
    for thread_id in thread_ids:
        try:
            store = ThreadStore.existing(home, thread_id)
        except LhcError as e:  # one unreadable thread does not hide what the others hold
            if not registry.dropped(thread_id):  # (else a launch just removed an empty one)
                say(f"thread {thread_id[:8]} skipped: {e}")
                skipped += 1
            continue
        try:
            for hit in search_thread(store, text, limit + 1):
                (exact if hit.how == "exact" else words).append(hit)
            raw += raw_line_hits(store, text, limit)
        except sqlite3_errors() as e:
            if not registry.dropped(thread_id):
                say(f"thread {thread_id[:8]} skipped: {store.path} cannot be searched ({e})")
                skipped += 1
        finally:
            store.close()
    exact.sort(key=lambda h: h.created or "", reverse=True)
    exact.sort(key=lambda h: h.own)
    words.sort(key=lambda h: (h.own, h.rank))
    # words only for a text no thread holds exactly, cc-lhc's own retrievals left aside
    # (each search Claude ran holds its text): those come last either way
    found = exact if any(not h.own for h in exact) else (
        [h for h in words if not h.own] + exact + [h for h in words if h.own])
    hits = found[:limit]
    status = EXIT_ERROR if skipped else EXIT_OK
    raw.sort(key=lambda h: h.created or "", reverse=True)
    if not hits:
        if skipped < len(thread_ids):  # (nothing searched: the skip notices said all there is)
            print(f"no messages match {shown_query(text)}")
    else:
        for hit in hits:
            print(hit.line(with_thread=True))
        if len(found) > limit:
            print(more_hits_line(limit))
        print("Show a hit's turns with: cc-lhc export <thread> --from tN --to tN --format markdown")
    for hit in raw[:limit]:
        print(hit.line_text(with_thread=True))
    if raw:
        print(RAW_HITS_NOTE.format(thread="<thread>"))
    return status


def _write_fork_rollout(home, registry, hostdb, thread_id, session_id, cwd, projects_root,
                        envelope_from):
    """rollout write, under the thread's lease: the view as a new current session."""
    recover_thread(home, registry, hostdb, thread_id)  # (an earlier one killed half-way is rolled back first)
    bound = registry.thread_for_session(session_id)
    if bound is not None and registry.forget_abandoned(session_id):
        bound = None  # (an earlier rollout write of this id was rolled back: the id is free again)
    if bound is not None:
        raise usage_error(f"session {session_id} is already bound to thread {bound}")
    if projects_root is not None and not os.path.isdir(projects_root):
        raise usage_error(f"--projects-root {shown_arg(projects_root)} is not a folder")
    # Claude finds a session by its id in any folder of its projects folder: an id that
    # names a transcript there already is another conversation, never written over or hidden.
    claude_projects = os.path.join(claude_config_dir(), "projects")
    taken = session_transcripts(session_id, [claude_projects] + ([projects_root] if projects_root else []))
    if taken:
        raise usage_error(f"session {session_id} already exists: {taken[0]}")
    cwd = os.path.abspath(cwd or registry.thread_cwd(thread_id) or os.getcwd())
    policy = load_policy(cwd, {})
    announce_policy(policy, home)  # (the view is cut to the built-in's bounds: said, as a launch says it)
    store = ThreadStore.existing(home, thread_id)  # (a record that is gone is named, never made anew)
    try:
        left = registry.current_session(thread_id)
        written = rebuild(home, hostdb, store, thread_id, left,
                          policy, cwd, envelope_from=envelope_from, session_id=session_id,
                          projects_root=projects_root, pending=False, idle=True)
        failpoint("after-rollout-written")
        if left:
            leave_branch(store, left, session_id)
        try:
            advance_current(registry, thread_id, session_id)
        except Exception as e:
            # Not made current: the file goes (to abandoned-rebuilds/), never a session no
            # record leads to. A registry too busy for that too is settled at the next launch.
            where = None
            try:
                where = abandon(home, registry, session_id, f"the thread could not be moved onto it: {e}")
            except Exception as again:
                home.log("abandon_failed", session=session_id, error=repr(again))
            raise LhcError(f"rollout write: thread {thread_id} could not be moved onto session {session_id} "
                           f"({e}); " + (f"the session written was moved to {where}" if where else
                                         f"the session written, {written.path}, is rolled back at the "
                                         "thread's next launch")) from e
        took_branch(store, session_id)
    finally:
        store.close()
    return written


def check_envelope_source(path) -> None:
    """--envelope-from names a transcript to copy attachments from: it must be one."""
    try:
        with open_regular(path):
            pass
    except NotRegularFile as e:
        raise usage_error(f"--envelope-from: {e}")
    except OSError as e:
        raise usage_error(f"--envelope-from: cannot read {path} ({e.strerror or e})")


def cmd_rollout(args) -> int:
    """`rollout write`: write a thread's served view as a new Claude session (the fork entry)."""
    if not args or args[0] != "write":
        raise usage_error(COMMAND_USAGE["rollout"])
    args = args[1:]
    thread_arg = _take_option(args, "--thread-id")
    session_id = _take_option(args, "--session-id")
    cwd = _take_option(args, "--cwd")
    projects_root = _take_option(args, "--projects-root")
    envelope_from = _take_option(args, "--envelope-from")
    _no_more(args, "rollout write")
    if not thread_arg or not session_id:
        raise usage_error("rollout write needs --thread-id and --session-id")
    if not is_uuid(session_id):
        raise usage_error(f"--session-id {shown_arg(session_id)} is not a UUID")
    if envelope_from is not None:
        check_envelope_source(envelope_from)
    home = StateHome()
    if not registry_known(home):
        raise usage_error("no threads yet")
    registry, hostdb = Registry(home), HostDB(home)
    thread_id = registry.resolve_prefix(thread_arg)
    # The thread's current session changes here, so nobody else may be driving it.
    lease = Lease(home, thread_id)
    lease.acquire("rollout write moves its current session, so it can run only once that session "
                  "ends: run it again then (nothing was written)")
    try:
        written = _write_fork_rollout(home, registry, hostdb, thread_id, session_id, cwd,
                                      projects_root, envelope_from)
    finally:
        lease.release()
    print(written.path)
    return EXIT_OK


class _EstimateOnly:
    """A token counter that always estimates (what a view counts at without the tokenizer)."""

    exact = False

    def usable(self) -> bool:
        return False

    def count_many(self, texts) -> list:
        return [safe_estimate(t) for t in texts]


class ScratchHome:
    """``with ScratchHome(kind) as home``: a StateHome for one command's throwaway stores,
    removed after it: a private folder of a new random name in the system's temporary
    folder, made without tempfile (whose import, with shutil's compressors, is 4-8 ms of
    a 90 ms measure)."""

    def __init__(self, kind: str):
        self.kind, self.root = kind, None

    def __enter__(self) -> "StateHome":
        base = (os.environ.get("TMPDIR") or "/tmp" if os.name == "posix" else
                os.environ.get("TEMP") or os.environ.get("TMP"))
        if base:
            root = os.path.join(base, f"cc-lhc-{self.kind}-{os.urandom(16).hex()}")
            try:
                os.mkdir(root, 0o700)  # (fails on anything already there: the name is its own)
                self.root = root
            except OSError:
                pass
        if self.root is None:
            import tempfile
            self.root = tempfile.mkdtemp(prefix=f"cc-lhc-{self.kind}-")
        return StateHome(self.root, scratch=True)

    def __exit__(self, *_exc) -> None:
        for folder, _dirs, names in os.walk(self.root, topdown=False):
            for name in names:
                try:
                    os.unlink(os.path.join(folder, name))
                except OSError:
                    pass
            try:
                os.rmdir(folder)
            except OSError:
                pass


def measure_transcript(path: str, profile: str, target: int) -> dict:
    """What each band and Smart Compact would make of one transcript (counts only).

    The transcript is read through the same capture code as a live session, into a
    throwaway state folder, so the figures are the product's own, not a model of it.
    """
    import hashlib
    with ScratchHome("measure") as home:
        # The thread id is written into the view's header, so it is counted: one derived
        # from the transcript's bytes makes the same input give the same figures.
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        thread_id = name_uuid(f"measure/{digest.hexdigest()}")
        cap = Capture(home, thread_id, "measured", path)
        try:  # (stopped before its folder goes: an open store cannot be removed everywhere)
            cap.take_unended = True
            cap.catch_up(index=False)
            store = cap.store
            turns = load_turns(store, closed_only=False)
            # A rebuild made now (no Claude writes the file) leaves out a turn the file left
            # open mid-way, as plan_rebuild does; Smart Compact itself waits for the seam.
            unsettled = unsettled_reason(store, idle=True)
            served = load_turns(store, closed_only=True) if unsettled else turns
            problems = store.db.execute("SELECT count(*) FROM problems").fetchone()[0]
            agent_messages, agent_count, compactions = store.db.execute(
                "SELECT count(*), count(DISTINCT CASE WHEN a.kind IS NOT 'compaction' THEN m.agent END), "
                "count(DISTINCT CASE WHEN a.kind = 'compaction' THEN m.agent END) FROM messages m "
                "LEFT JOIN agents a ON a.agent_id = m.agent WHERE m.agent IS NOT NULL").fetchone()
            captured = store.db.execute("SELECT count(*) FROM messages WHERE agent IS NULL").fetchone()[0]
            cut_tail = cap.cut_tail
        finally:
            cap.stop()
    messages = [m for t in turns for m in t.messages]  # (what a view can hold: on Claude's branch)
    tool_calls = sum(1 for m in messages if m["kind"] == "tool_call")
    texts, index = [], {}

    def slot(text):
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        return index[text]

    per_turn, known = [], {}
    for t in turns:
        row = {}
        for band in ("full", "lean"):
            row[band] = []
            for m, stub in visible_messages(t, band):
                text, ids, images = counted_parts(m, stub)
                i, j = slot(text), slot(ids)
                row[band].append((i, j, images))
                known[(m["seq"], stub)] = (i, j, images)
        row["summary"] = slot(extractive_summary(t.messages))  # (a line of the header: no message)
        per_turn.append(row)
    carried, _estimate = carried_file_state(served, target)
    for pair in carried:  # (counted below with the rest, in one batch)
        for part in _pair_parts(*pair):
            slot(part)
    # (its count is not used: its words are, by the encoder the view's header is counted with)
    counts = TOKENS.count_many(texts + [header_vocabulary(thread_id)])  # serve_view below saves them for the next run
    # (each message as a view counts it: its text, a call's id and name, its images, MESSAGE_TOKENS)
    totals = {band: sum(counts[i] + counts[j] + images + MESSAGE_TOKENS for row in per_turn
                        for i, j, images in row[band]) for band in ("full", "lean")}
    totals["summary"] = sum(counts[row["summary"]] for row in per_turn)
    summaries = {t.n: (extractive_summary(t.messages), "extractive") for t in turns}
    counter = ViewCounter()
    if TOKENS.exact:
        # Every message was just counted in one batch: fitting the view needs no second count.
        counter.prefill({key: counts[i] + counts[j] + images for key, (i, j, images) in known.items()})
    # As a rebuild does: the file-state pairs are set aside first, and those the view does
    # not already hold are written into it (plan_rebuild).
    view, header = serve_view(thread_id, served, target - pairs_tokens(carried, counter), profile, summaries,
                              counter=counter)
    carried_tokens = carried_pairs_tokens(view, served, carried, counter)
    in_view = view.tokens + carried_tokens if captured else 0  # (an empty session: nothing to rebuild)
    # The same figures by the estimate used without the tokenizer, for comparison.
    safe = [safe_estimate(t) for t in texts]
    estimated_full = sum(safe[i] + safe[j] + images + MESSAGE_TOKENS for row in per_turn
                         for i, j, images in row["full"])
    by_estimate = ViewCounter(_EstimateOnly())
    by_estimate.prefill({key: safe[i] + safe[j] + images for key, (i, j, images) in known.items()})
    estimated_view = (view_tokens(view, header, served, by_estimate)["total"]
                      + carried_pairs_tokens(view, served, carried, by_estimate)) if captured else 0
    original = totals["full"]

    def cut(after):
        return round(100.0 * (original - after) / original, 1) if original else 0.0

    return {
        "messages": captured, "off_branch_messages": captured - len(messages),
        "tool_calls": tool_calls, "turns": len(turns),
        "subagents": agent_count, "compaction_agents": compactions, "subagent_messages": agent_messages,
        "tokens": original, "lean_tokens": totals["lean"], "lean_cut_pct": cut(totals["lean"]),
        "summary_tokens": totals["summary"], "summary_cut_pct": cut(totals["summary"]),
        "smart_compact_tokens": in_view, "smart_compact_cut_pct": cut(in_view),
        "carried_file_state_tokens": carried_tokens,
        "bands": {b: len(view.turns_in(b)) for b in BANDS + ("omitted", SPLIT)},
        "settled": not unsettled, "unsettled_reason": unsettled or None,
        "open_turn_left_out": bool(unsettled) and len(served) < len(turns),
        "integrity_problems": problems, "cut_off_last_line_bytes": cut_tail, "exact": TOKENS.exact,
        "counting": "exact o200k_base" if TOKENS.exact else "approximate (a safe estimate, never under)",
        "target": target, "view_within_target": in_view <= target,
        "estimate": {"tokens": estimated_full, "smart_compact_tokens": estimated_view,
                     "method": "safe estimate (never under o200k)"},
    }


def _change(cut_pct) -> str:
    """A cut as the change it makes to the size: -72.9% for a 72.9% cut, 0.0% for none."""
    return f"{-cut_pct:+.1f}%" if round(cut_pct, 1) else "0.0%"


def _percentile(values, p):
    values = sorted(values)
    if not values:
        return None
    k = (len(values) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return round(values[lo] + (values[hi] - values[lo]) * (k - lo), 1)


def holds_transcript_records(path) -> bool:
    """Whether any line of a file is a record as Claude Code writes them: a JSON object
    with a type, and a uuid or session id beside it (a session that holds no conversation
    yet still has such lines, or none at all; a file of other JSON has none)."""
    empty = True
    try:
        with open_regular(path) as f:
            for line in f:
                if not line.strip():
                    continue
                empty, rec = False, json_record(line)
                if (isinstance(rec, dict) and isinstance(rec.get("type"), str)
                        and any(isinstance(rec.get(k), str) for k in ("uuid", "sessionId", "leafUuid", "messageId"))):
                    return True
    except OSError:
        return False
    return empty


def agent_of_file(path) -> str | None:
    """The agent id a subagent's own transcript file is written for (its conversation
    records are all side-chain records naming the one agent), else None."""
    agent = None
    try:
        with open_regular(path) as f:
            for line in f:
                rec = json_record(line) if line.strip() else None
                if not isinstance(rec, dict) or rec.get("type") not in ("user", "assistant"):
                    continue
                named = rec.get("agentId")
                if rec.get("isSidechain") is not True or not isinstance(named, str) or not named \
                        or agent not in (None, named):
                    return None
                agent = named
    except OSError:
        return None
    return agent


def cmd_measure(args) -> int:
    """Offline: what Smart Compact and each band would do to sessions. Counts only."""
    as_json = _take_flag(args, "--json")
    as_md = _take_flag(args, "--markdown")
    profile = _take_option(args, "--profile")
    target = _take_option(args, "--target", None, whole_number)
    if profile is None or target is None:
        # What Smart Compact would use here: the user's and this folder's configuration.
        policy = load_policy(os.getcwd(), {})
        announce_policy(policy, StateHome())  # (each problem named, as a launch names them)
        profile = policy["profile"] if profile is None else profile
        target = policy.effective_target if target is None else target
    if profile not in PROFILES:
        raise usage_error(f"--profile is one of {', '.join(PROFILES)}")
    if token_count_problem(target):
        raise usage_error(f"--target must be a positive number of tokens up to {TOKEN_FIELD_MAX:,}")
    if len(args) != 1:
        raise usage_error(COMMAND_USAGE["measure"])
    if as_json and as_md:
        raise usage_error("--json and --markdown: give one of them")
    where = args[0]
    unread = []  # (path, why): named on stderr, and the exit status says the report is not whole
    if os.path.isdir(where):
        found = [(d, f) for d, _s, names in os.walk(where, onerror=lambda e: unread.append((e.filename, e.strerror)))
                 for f in names if f.endswith(".jsonl")]
        files = sorted(os.path.join(d, f) for d, f in found
                       if os.path.isfile(os.path.join(d, f))  # no FIFOs or devices
                       and "subagents" not in os.path.relpath(d, where).split(os.sep)
                       and not f.startswith("agent-"))  # a 2.0 subagent file: measured with its session
        # (a name that is not UTF-8 cannot be recorded as a source: named, the rest measured)
        unread += [(path, "its name is not UTF-8 text") for path in files if SURROGATE.search(path)]
        files = [path for path in files if not SURROGATE.search(path)]
        # A link to a session the folder holds as well is that session once, not a second one;
        # a link that leads nowhere is named.
        seen, unique = set(), []
        for path in files:
            real = os.path.realpath(path)
            if real not in seen:
                seen.add(real)
                unique.append(path)
        files = unique
        unread += [(os.path.join(d, f), "it is a link to nothing") for d, f in found
                   if os.path.islink(os.path.join(d, f)) and not os.path.exists(os.path.join(d, f))]
        if not files and not unread:
            if any(f.startswith("agent-") and f.endswith(".jsonl") for _d, _s, names in os.walk(where)
                   for f in names):
                raise usage_error(f"{where!r} holds only subagents' transcripts (agent-*.jsonl): measure "
                                  "the session they belong to, which counts them with it")
            raise usage_error(f"{where!r} holds no transcripts (.jsonl files)")
    elif os.path.isfile(where):
        files = [where]
    else:
        try:
            os.stat(where)
        except OSError as e:
            if not isinstance(e, FileNotFoundError):  # (a folder on the way it may not enter, say)
                say(f"{where} could not be read ({e.strerror or e})")
                return EXIT_ERROR
        raise usage_error(f"{where!r} is neither a transcript nor a folder")
    # Counts are kept in the state folder's cache, so the next measure of these sessions
    # (or a rebuild of their threads) counts nothing again: a first use makes the folder.
    try:
        StateHome().ensure("cache")
    except OSError:
        pass  # (counting goes on; nothing is kept)
    rows = []
    for path in files:
        try:
            row = measure_transcript(path, profile, target)
        except OSError as e:
            unread.append((path, e.strerror or str(e)))
            continue
        row["session"] = len(rows) + 1
        rows.append(row)
        agent = None if row["messages"] else agent_of_file(path)
        if agent is not None:
            # (a compaction agent's records chain onto the session's own: alone, none is placed)
            what = "Claude's own compaction agent" if agent.startswith("acompact") else "a subagent"
            say(f"{path} is the transcript of {what} ({agent}), not a session's: measure the session "
                f"it belongs to, which counts it with its subagents; session {row['session']} counts nothing")
        elif not row["messages"] and row["subagent_messages"]:  # (several agents' records: 1.0's sidechains)
            say(f"{path} is a subagent's own transcript ({row['subagent_messages']} messages): measure the "
                f"session it belongs to, which counts it with its subagents; session {row['session']} "
                "counts nothing")
        elif not row["messages"] and (row["integrity_problems"] or not holds_transcript_records(path)):
            # (lines, but none a transcript record: the wrong file more likely than a session)
            unread.append((path, "none of its lines is a Claude Code transcript record"
                                 + (f"; {row['integrity_problems']} could not be read or placed in a conversation"
                                    if row["integrity_problems"]
                                    else "")))
            rows.pop()
        elif not row["messages"]:
            say(f"{path} holds no conversation yet: session {row['session']} counts nothing")
    for path, why in unread:
        say(f"{path} could not be read ({why}): left out of the figures")
    if not rows:
        return EXIT_ERROR  # (each file or folder was named above: there is nothing to report)
    status = EXIT_ERROR if unread else EXIT_OK
    report = {"profile": profile, "target": target, "sessions": rows}
    if len(rows) > 1:
        for key in ("lean_cut_pct", "summary_cut_pct", "smart_compact_cut_pct"):
            vals = [r[key] for r in rows if r["tokens"]]
            report[f"median_{key}"] = _percentile(vals, 0.5)
            report[f"p90_{key}"] = _percentile(vals, 0.9)
    if as_json:
        print(json.dumps(report, indent=2))
        return status
    # No timings: the same input prints the same bytes (scripts/bench.py times measure).
    head = ["session", "messages", "tool calls", "tokens", "lean", "summary", "smart compact"]
    lines = []
    for r in rows:
        lines.append([str(r["session"]), str(r["messages"]), str(r["tool_calls"]), f"{r['tokens']:,}",
                      f"{r['lean_tokens']:,} ({_change(r['lean_cut_pct'])})",
                      f"{r['summary_tokens']:,} ({_change(r['summary_cut_pct'])})",
                      f"{r['smart_compact_tokens']:,} ({_change(r['smart_compact_cut_pct'])})"])
    counting = rows[0]["counting"] if rows else TOKENS.reason
    if as_md:
        print("| " + " | ".join(head) + " |")
        print("|" + " --- |" * len(head))
        for ln in lines:
            print("| " + " | ".join(ln) + " |")
    else:
        widths = [max(len(h), *(len(ln[i]) for ln in lines)) if lines else len(h) for i, h in enumerate(head)]
        print("  ".join(h.ljust(w) for h, w in zip(head, widths)))
        for ln in lines:
            print("  ".join(c.ljust(w) for c, w in zip(ln, widths)))
    notes = []
    for r in rows:
        if r["unsettled_reason"]:
            left = "; its open turn is left out of the smart compact figure" if r["open_turn_left_out"] else ""
            notes.append(f"session {r['session']}: not at a settled seam ({r['unsettled_reason']}): Smart "
                         f"Compact would wait for the turn to end{left}")
        if r["cut_off_last_line_bytes"]:
            notes.append(f"session {r['session']}: its last line is cut off ({r['cut_off_last_line_bytes']:,} bytes, "
                         "no whole record: Claude was stopped while writing it) and left out")
        if r["messages"] and not r["view_within_target"]:
            notes.append(f"session {r['session']}: the smart compact view ({r['smart_compact_tokens']:,} tokens) "
                         f"is over the target ({target:,})")
        if r["exact"] and r["messages"] and len(rows) == 1:  # (what it comes to without the tokenizer)
            est = r["estimate"]
            notes.append(f"session {r['session']}: the safe estimate used without the tokenizer counts it "
                         f"{est['tokens']:,} tokens and this view {est['smart_compact_tokens']:,} "
                         "(a view fitted by it holds less)")
    estimated = [r for r in rows if r["exact"]]  # (without the tokenizer the table is that estimate)
    if len(estimated) > 1:
        exact, safe = sum(r["tokens"] for r in estimated), sum(r["estimate"]["tokens"] for r in estimated)
        notes.append(f"the safe estimate used without the tokenizer counts these sessions {safe:,} tokens "
                     f"against {exact:,} (per session: --json)")
    if len(rows) > 1 and report["median_lean_cut_pct"] is not None:
        # (as the table writes them: the change to the size, so a 72.9% cut reads -72.9%)
        notes.append(f"median: lean {_change(report['median_lean_cut_pct'])}, smart compact "
                     f"{_change(report['median_smart_compact_cut_pct'])}; at p90: lean "
                     f"{_change(report['p90_lean_cut_pct'])}, smart compact "
                     f"{_change(report['p90_smart_compact_cut_pct'])}")
    notes.append(f"tokens: {counting}; profile {profile}, target {target:,}")
    if as_md:
        # (a line straight after a table reads as one more of its rows, and lines next to
        # each other as one paragraph)
        print("\n" + "\n\n".join(notes))
    else:
        print("\n".join(notes))
    return status


def cmd_backfill_labels(args) -> int:
    """Give older stored turn renderings the stable tN/mN labels (operator command)."""
    dry = _take_flag(args, "--dry-run")
    if len(args) != 1:
        raise usage_error(COMMAND_USAGE["backfill-labels"])
    home = StateHome()
    if not registry_known(home):
        raise usage_error("no threads yet")
    thread_id = Registry(home).resolve_prefix(args[0])
    store = ThreadStore.existing(home, thread_id)
    try:
        legacy = store.db.execute(
            "SELECT id, turn, kind FROM derivations WHERE format_version < 2 AND kind = 'turn_rendering' "
            "AND NOT EXISTS (SELECT 1 FROM derivations d2 WHERE d2.turn = derivations.turn "
            "AND d2.kind = derivations.kind AND d2.format_version >= 2) ORDER BY turn").fetchall()
        planned = []
        for did, turn, kind in legacy:
            text = f"=== t{turn} ===\n" + "".join(render_message_body(m) for m in store.messages(turn, turn))
            planned.append((turn, kind, text, did))
        for turn, _kind, text, did in planned:
            print(f"{'would recompose' if dry else 'recomposed'} t{turn} (derivation {did}, "
                  f"{len(text.encode())} bytes with labels)")
        if not dry and planned:
            with Tx(store.db) as db:
                db.executemany("INSERT INTO derivations (turn, kind, text, source, format_version, created) "
                               "VALUES (?, ?, ?, 'backfill', 2, ?)",
                               [(t, k, x, utc_now_iso()) for t, k, x, _d in planned])
        if not planned:
            print(f"thread {thread_id[:8]}: nothing to backfill; every stored rendering has labels")
    finally:
        store.close()
    return EXIT_OK


def store_file_check(path: str, what: str, migrations, damaged_fix=None):
    """(status, what, detail, fix) for doctor: can this SQLite file of ours be used?
    ``damaged_fix``: the fix for a damaged file, when there is a better one than salvage.

    Read only: no migration is applied and nothing is written (a quick_check reads
    every page, which is what finds a damaged file before a session needs it).
    """
    import sqlite3
    import shlex
    chmod = f"make it readable and writable by you: chmod 600 {shlex.quote(path)}"
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):  # (a FIFO is no empty file: nothing was lost from it)
            return ("fail", what, f"{path} is a {_file_kind(mode)}, not a regular file",
                    "move it out of the way; if the file it replaced is somewhere, put that back")
        if not os.access(path, os.R_OK | os.W_OK):
            return ("fail", what, f"{path} cannot be read and written by you", chmod)
        if os.path.getsize(path) == 0:
            return ("fail", what, f"{path} is empty: what it held is gone",
                    "restore it from a backup, or remove it (cc-lhc then starts that file anew)")
        db = sqlite3.connect(path, timeout=5)
        try:
            have = db.execute("PRAGMA user_version").fetchone()[0]
            damage = [r[0] for r in db.execute("PRAGMA quick_check(3)")]
        finally:
            db.close()
    except sqlite3.Error as e:
        damage, have = [str(e)], 0
        why = _why_unopened(path, e)
        if why:  # (no room on the disk, or no way to write beside it: the file may be whole)
            return ("fail", what, f"{path} cannot be opened now ({e}){why}",
                    "mend that, then run doctor again; the file is not known to be damaged")
    except OSError as e:
        return ("fail", what, f"{path}: {e}", chmod)
    if damage != ["ok"]:
        # (.recover fails where sqlite3 was built without it; with && that stops there, where
        # a pipe went on and made an empty file to put in the damaged one's place)
        return ("fail", what, f"{path} is damaged: {'; '.join(damage)}", damaged_fix or (
                f"restore it from a backup, or salvage it with `sqlite3 {shlex.quote(path)} .recover > "
                f"{shlex.quote(path + '.sql')} && sqlite3 {shlex.quote(path + '.recovered')} < "
                f"{shlex.quote(path + '.sql')}` (sqlite3 3.40 or later, built with .recover) and put "
                "the result in its place, keeping the damaged file (Claude's own transcripts are "
                "not affected)"))
    if have > len(migrations):
        return ("fail", what, f"schema {have}, newer than the {len(migrations)} this cc-lhc knows",
                "upgrade cc-lhc to the version that wrote it; the file is left unchanged")
    return ("ok", what, f"schema {have} of {len(migrations)} known")


# What doctor says of a transcript capture found cut, written over or unreadable.
TRANSCRIPT_TROUBLES = {"transcript_shrank": "was cut after cc-lhc captured it",
                       "transcript_rewritten": "was written over after cc-lhc captured it",
                       "transcript_unreadable": "cannot be read"}
TRANSCRIPT_TROUBLE_FIX = {
    "transcript_shrank": "nothing to do: the thread keeps every record it captured, and the next launch of "
                         "the session writes it again from the thread if the transcript lost any",
    "transcript_unreadable": "make it a regular file you can read; capture takes it in then"}
TRANSCRIPT_TROUBLE_FIX["transcript_rewritten"] = TRANSCRIPT_TROUBLE_FIX["transcript_shrank"]


def transcript_troubles(record: str, current) -> list:
    """(session, kind, what doctor says) when the transcript of the thread's current session
    was found cut, written over or unreadable (its newest such problem), read only. (Once a
    launch wrote the session again from the thread, the current one is another.)"""
    import sqlite3
    if not current:
        return []
    try:
        db = sqlite3.connect(f"file:{record}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return []
    try:
        rows = db.execute(
            f"SELECT session, kind, max(id) FROM problems WHERE kind IN ({','.join('?' * len(TRANSCRIPT_TROUBLES))}) "
            "AND session = ? GROUP BY session", (*TRANSCRIPT_TROUBLES, current)).fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()
    return [(session, kind, TRANSCRIPT_TROUBLES[kind]) for session, kind, _id in rows]


def cmd_doctor(args) -> int:
    """Check this installation; exit 1 when something is broken, saying how to fix it.
    --repair also rebuilds registry entries from the thread files and refreshes every
    thread file's copy."""
    import shlex
    import subprocess
    repair = _take_flag(args, "--repair")
    _no_more(args, "doctor")
    home = StateHome()
    results = []

    def check(status, what, detail="", fix=""):
        results.append(status)
        print(f"[{status:>4}] {what}" + (f": {detail}" if detail else ""))
        if fix and status != "ok":
            print(f"       fix: {fix}")

    check("ok", "cc-lhc", render_version())
    claude_fix = ("install Claude Code (npm install -g @anthropic-ai/claude-code) or point "
                  "CC_LHC_CLAUDE_BIN at a working claude")
    try:
        claude = find_claude_binary()
        out = subprocess.run([claude, "--version"], capture_output=True, text=True, timeout=20,
                             stdin=subprocess.DEVNULL, env=outside_environment())
        check("ok" if out.returncode == 0 else "fail", "claude",
              f"{claude} {out.stdout.strip()}" + (f" (exit {out.returncode})" if out.returncode else ""),
              claude_fix)
    except (LhcError, OSError, subprocess.SubprocessError) as e:
        check("fail", "claude", str(e), claude_fix)
    try:
        import importlib.util
        have_tiktoken = importlib.util.find_spec("tiktoken") is not None
    except (ImportError, ValueError):
        have_tiktoken = False
    check("ok" if TOKENS.encoding() is not None and TOKENS.exact else "warn", "token counts", TOKENS.reason,
          ("install tiktoken for this Python (pip install tiktoken; requirements.txt names the version): "
           "the zipapp and a checkout carry the tokenizer's data, not tiktoken itself; or install "
           "cc-lhc's bundle, which carries both" if not have_tiktoken and not getattr(sys, "frozen", False) else
           "install cc-lhc from a release (its bundle carries the tokenizer), or in a checkout run "
           "python3 build/tokenizer.py with tiktoken installed")
          + "; counts stay safe estimates until then")
    import sqlite3
    check("ok" if trigram_available() else "warn", "exact-string search",
          f"SQLite {sqlite3.sqlite_version}: " + ("trigram index" if trigram_available() else
                                                  "no trigram tokenizer (3.34+), so search scans"),
          "run cc-lhc with a Python whose SQLite is 3.34 or newer (the release bundle's is); "
          "search works meanwhile, more slowly")
    if not os.path.isdir(home.root):
        if os.path.lexists(home.root):
            check("fail", "state home", f"{home.root} is not a folder",
                  "move that file away, or point CC_LHC_HOME at a folder")
        else:
            problem, mend = state_folder_problem(home.root)
            if problem:
                check("fail", "state home", problem, mend)
            else:
                check("ok", "state home", f"{home.root} (not created yet)")
        return EXIT_ERROR if "fail" in results else EXIT_OK
    def readable_by_others(path):
        try:
            return bool(os.stat(path).st_mode & 0o077)
        except OSError:  # a WAL or temporary file that went away while we looked
            return False

    loose = []
    for d, _dirs, files in os.walk(home.root):
        if os.name == "posix":
            if d != home.root and readable_by_others(d) and not claudes_own_mod_file(home, d):
                loose.append(d)
            loose += [os.path.join(d, f) for f in files
                      if not f.endswith(("-wal", "-shm")) and readable_by_others(os.path.join(d, f))
                      and not claudes_own_mod_file(home, os.path.join(d, f))]
    problem, mend = state_folder_problem(home.root)
    if problem:
        check("fail", "state home", f"{problem}, so cc-lhc cannot use its threads", mend)
        return EXIT_ERROR
    mode_ok = os.name != "posix" or not (os.stat(home.root).st_mode & 0o077)
    check("ok" if mode_ok and not loose else "warn", "state home permissions",
          home.root + ("" if not loose else f"; readable by others: {', '.join(loose[:5])}"),
          f"chmod -R go-rwx {shlex.quote(home.root)}")
    for name in ("wrapper.log", "wrapper.log.1"):  # (anything else there is never written to)
        path = home.path(name)
        if os.path.lexists(path) and not os.path.isfile(path):
            check("fail", "log", f"{path} is not a regular file, so nothing is logged",
                  f"rm {shlex.quote(path)}")
    for name, migrations in (("registry.sqlite", REGISTRY_MIGRATIONS), ("cc-lhc.sqlite", HOST_MIGRATIONS)):
        path = home.path(name)
        if os.path.exists(path):
            check(*store_file_check(path, f"schema {name}", migrations))
    threads = sorted(_thread_file_ids(home))
    unlisted = ""
    try:
        os.listdir(home.path("threads"))
    except FileNotFoundError:
        pass
    except OSError as e:  # (then every thread would seem gone: said once, as what it is)
        unlisted = e.strerror or str(e)
        check("fail", "thread files", f"{home.path('threads')} cannot be listed ({unlisted}), so no "
              "thread can be read", f"chmod u+rwx {shlex.quote(home.path('threads'))}")
    unusable = 0

    def current_of(thread_id):
        try:
            return Registry(home).current_session(thread_id)
        except (sqlite3.Error, LhcError, OSError):
            return None  # (the registry's own check says what is wrong with it)
    for thread_id in threads:  # each thread store on its own: one damaged file is named alone
        record = home.path("threads", f"{thread_id}.sqlite")
        aside = home.path("damaged")
        found = store_file_check(record, f"thread {thread_id}", THREAD_MIGRATIONS, damaged_fix=(
            f"move its files aside, `mkdir -p {shlex.quote(aside)} && mv {shlex.quote(record)}* "
            f"{shlex.quote(aside)}/`: the thread's next launch (cc-lhc -c in its folder) makes it again "
            "from Claude Code's transcripts of its sessions, under the same labels; what only the "
            "damaged file holds (sessions Claude Code has since removed) can be salvaged from it "
            "with sqlite3's .recover"))
        if found[0] != "ok" and not _dropped_meanwhile(home, thread_id):
            unusable += 1
            check(*found)
        elif found[0] == "ok":
            for session, kind, detail in transcript_troubles(record, current_of(thread_id)):
                check("warn", f"thread {thread_id}", f"the transcript of session {session} {detail}",
                      TRANSCRIPT_TROUBLE_FIX[kind])
    if not unlisted:
        check("ok" if not unusable else "fail", "thread files",
              f"{len(threads)} checked" + (f", {unusable} unusable (named above)" if unusable else ""))
    try:
        lost = [] if unlisted else sorted(_registry_thread_ids(home) - set(threads))
    except sqlite3.Error:
        lost = []  # (the registry check below says what is wrong with it)
    for thread_id in lost:
        check("fail", f"thread {thread_id}",
              f"registry.sqlite names it, but its record {home.path('threads', thread_id + '.sqlite')} is gone",
              "put the file back from a backup; while Claude Code still keeps the thread's session, "
              "cc-lhc --resume <session id> captures it again into a new record")
    stale = 0
    folder = home.path("owners")
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            if name.endswith(".json"):
                try:
                    held = json.loads(read_small_file(os.path.join(folder, name), DESCRIPTOR_FILE_LIMIT))
                    owner = held.get("owner") if isinstance(held, dict) else None
                except (OSError, ValueError, RecursionError):
                    owner = None
                stale += 0 if identity_alive(owner) else 1
    check("ok" if not stale else "warn", "leases", f"{stale} left by processes that are gone"
          if stale else "none stale", "nothing to do: the next cc-lhc to use such a thread takes its lease over")
    if os.path.exists(home.path("cc-lhc.sqlite")):
        try:
            hostdb = HostDB(home)
            dead = sum(1 for (owner,) in hostdb.db.execute(
                "SELECT owner FROM descriptors WHERE revoked IS NULL") if not owner_alive(owner))
            check("ok" if not dead else "warn", "runtime descriptors",
                  f"{dead} stale" if dead else "none stale", "nothing to do: the next launch removes them")
        except (LhcError, sqlite3.Error) as e:  # named above; the checks after it still run
            check("fail", "runtime descriptors", f"cc-lhc.sqlite cannot be read: {e}",
                  "mend what the line says, then run doctor again" if _why_unopened(
                      home.path("cc-lhc.sqlite"), e) else
                  f"restore {shlex.quote(home.path('cc-lhc.sqlite'))} from a backup, or move it away: the "
                  "next launch starts a new one (the governor's receipts in it go with it; threads keep "
                  "everything they captured)")
    try:
        check(*registry_check(home, repair))
    except (LhcError, sqlite3.Error) as e:
        check("fail", "registry", f"registry.sqlite cannot be read: {e}",
              "mend what the line says, then run doctor again" if _why_unopened(
                  home.path("registry.sqlite"), e) else
              "cc-lhc doctor --repair rebuilds it from the thread files once it is moved away")
    return EXIT_ERROR if "fail" in results else EXIT_OK


def _dropped_meanwhile(home, thread_id: str, looks: int = 5) -> bool:
    """doctor: a thread file that failed its check because a launch removed the thread
    (an empty one) meanwhile: its file and its registry row both gone, looked for a few
    times while such a drop commits. doctor opens the registry read-only, so it cannot
    wait on the drop's transaction itself."""
    import time
    path = home.path("threads", f"{thread_id}.sqlite")
    for _ in range(looks):
        try:
            if not os.path.exists(path) and thread_id not in _registry_thread_ids(home):
                return True
        except sqlite3_errors():
            return False
        time.sleep(0.05)
    return False


def _registry_thread_ids(home) -> set:
    """The threads registry.sqlite names, read as it is: doctor applies no migration and
    writes nothing there."""
    path = home.path("registry.sqlite")
    if not (os.path.exists(path) and os.path.getsize(path)):
        return set()
    import sqlite3
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        return {r[0] for r in db.execute("SELECT id FROM threads")}
    finally:
        db.close()


def registry_check(home, repair: bool):
    """(status, what, detail) for doctor: thread files the registry lacks, repaired on request."""
    if repair:
        registry = Registry(home, restore=False)
        restored = registry.restore_missing(announce=False)
        # (a thread whose file is gone gets no copy: doctor names it above)
        copied = sum(registry.save_copy(thread_id)
                     for (thread_id,) in registry.db.execute("SELECT id FROM threads").fetchall())
        return ("ok", "registry", f"rebuilt {len(restored)} thread(s) from their thread files; "
                f"{copied} thread file(s) carry a fresh copy of their entries")
    files = _thread_file_ids(home)
    known = _registry_thread_ids(home)
    missing = len(files - known)
    if not missing:
        return ("ok", "registry", f"{len(known)} thread(s)")
    return ("warn", "registry", f"{missing} thread file(s) not in registry.sqlite",
            "cc-lhc doctor --repair (or the next launch) puts them back in")


COMMAND_USAGE = {
    "threads": "usage: cc-lhc threads [--json]",
    "export": "usage: cc-lhc export <thread-id-or-prefix> [--format json|markdown|raw-lines] [--from tN] [--to tN]",
    "get-turns": "usage: cc-lhc get-turns [--from N [--through mN]] <tN>... (inside a session cc-lhc started)",
    "get-messages": "usage: cc-lhc get-messages [--from N [--through mN]] <mN>... (inside a session cc-lhc started)",
    "search": SEARCH_USAGE,
    "rollout": "usage: cc-lhc rollout write --thread-id ID --session-id UUID [--cwd DIR] [--projects-root DIR] "
               "[--envelope-from ROLLOUT]",
    "measure": "usage: cc-lhc measure <transcript.jsonl | folder> [--json | --markdown] [--profile P] [--target N]",
    "backfill-labels": "usage: cc-lhc backfill-labels <thread-id-or-prefix> [--dry-run]",
    "doctor": "usage: cc-lhc doctor [--repair]",
    "preview": "usage: cc-lhc preview [--fixture F] [--geometry G] [--raw] [--list]",
}


def asks_for_help(command, args) -> bool:
    """Whether a command's arguments ask for its usage: -h or --help before any --, or for
    search, whose words they may be (`cc-lhc search du -h`), as its only argument."""
    if command == "search":
        return args in (["-h"], ["--help"])
    before = args[:args.index("--")] if "--" in args else args
    return any(a in ("-h", "--help") for a in before)


COMMANDS = {"threads": cmd_threads, "export": cmd_export, "get-turns": cmd_get_turns,
            "get-messages": cmd_get_messages, "search": cmd_search, "rollout": cmd_rollout,
            "measure": cmd_measure, "backfill-labels": cmd_backfill_labels, "doctor": cmd_doctor,
            "mod-hello": cmd_mod_hello, "mod-compact": cmd_mod_compact, "preview": cmd_preview}


# The standard streams cc-lhc was started with closed (`cc-lhc 2>&-`), now on the null device.
CLOSED_AT_START = set()


def fill_closed_standard_fds() -> None:
    """Put the null device on each standard stream started closed: else the first file
    cc-lhc opens (a database, its log) takes that number, and what is written to the stream
    (a message, Claude's own output) goes into the file. cc-lhc's messages then go nowhere,
    as they would have; an input so filled is still no input (_readable)."""
    for fd, flags in ((0, os.O_RDONLY), (1, os.O_WRONLY), (2, os.O_WRONLY)):
        try:
            os.fstat(fd)
            continue
        except OSError:
            pass
        null = os.open(os.devnull, flags)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
        os.set_inheritable(fd, True)  # (os.open's own are not: Claude must get it too)
        CLOSED_AT_START.add(fd)
    if sys.stderr is None and 2 in CLOSED_AT_START:
        sys.stderr = open(2, "w", encoding="utf-8", errors="replace", closefd=False)


def write_utf8() -> None:
    """cc-lhc writes UTF-8 whatever the locale says (JSON, search hits with their marks, a
    path): a stream set to another encoding (PYTHONIOENCODING=ascii, a C locale with
    PYTHONUTF8=0) raised on the first character beyond it."""
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "").replace("_", "")
        if encoding not in ("utf8", "") and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(encoding="utf-8")
            except (ValueError, OSError):
                pass


def not_utf8(what: str, value: str) -> str:
    """Why a name read as bytes the interpreter could not decode is refused: bytes that are
    not UTF-8, or UTF-8 read as ASCII (Python's UTF-8 mode turned off in a C locale)."""
    raw = os.fsencode(value)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return f"{what} {raw!r} is not UTF-8 text"
    return (f"{what} {raw!r} is UTF-8 text this Python reads as {sys.getfilesystemencoding()} "
            "(PYTHONUTF8=0 in a C locale?): unset PYTHONUTF8 or use a UTF-8 locale such as C.UTF-8")


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    fill_closed_standard_fds()
    write_utf8()
    try:
        if argv and argv[0] == "__watchdog" and len(argv) == 3:  # (cc-lhc's own: two pids)
            pids = [int(a) if re.fullmatch(r"[0-9]{1,10}", a) else 0 for a in argv[1:]]
            if not all(0 < pid < 2 ** 31 for pid in pids):  # (0 would signal a whole process group)
                raise usage_error("__watchdog is cc-lhc's own: it takes two process ids")
            return run_watchdog(*pids)
        if argv and argv[0] == "__carry-guard" and len(argv) == 3:
            return run_carry_guard(argv[1], argv[2])
        command = argv[0] if argv and argv[0] in LHC_SUBCOMMANDS else None
        if command and sys.stdout is None:  # (started with its standard output closed: `cc-lhc ... >&-`)
            raise LhcError(f"{command}: standard output is closed, so there is nowhere to write "
                           "the answer", EXIT_ERROR)
        if command in COMMAND_USAGE and asks_for_help(command, argv[1:]):
            print(COMMAND_USAGE[command])  # (whatever state the folders are in: nothing is kept)
            return EXIT_OK
        if not (command is None and only_help_or_version(argv)):
            check_environment(command)
        if command:
            bad = next((a for a in argv[1:] if SURROGATE.search(a)), None)
            if bad is not None:  # (bytes the locale could not decode: nothing can match them)
                raise usage_error(f"{argv[0]}: {not_utf8('the argument', bad)}")
            return COMMANDS[argv[0]](argv[1:])
        return cmd_launch(argv)
    except LhcError as e:
        say(str(e))
        return e.status
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        _reader_gone()
        return EXIT_ERROR
    except (OSError, sqlite3_errors()) as e:
        # The state folder or a file in it could not be used: say which, not a traceback.
        where = f" ({e.filename})" if getattr(e, "filename", None) else ""
        # (SQLite names no file: what keeps the state folder from use, a full disk say, is told)
        root = StateHome().root
        why = "" if where else _why_unopened(os.path.join(root, "registry.sqlite"), e)
        if why:
            why = f"; the state folder {root}{why}"
        elif not where and "database is locked" in str(e):
            why = (f"; another process has kept a database of the state folder {root} busy "
                   "(a cc-lhc at work, or one that hangs): try again once it is done")
        elif not where and isinstance(e, sqlite3_errors()) and ("malformed" in str(e) or "not a database" in str(e)):
            why = f"; a database of the state folder {root} is damaged: cc-lhc doctor names it and says how to fix it"
        say(f"{e.__class__.__name__}: {e}{where}{why}")
        return EXIT_ERROR


def only_help_or_version(argv) -> bool:
    """Whether a launch asks only for help or a version, cc-lhc's or Claude's: it keeps
    nothing, so it answers whatever state the folders are in. (A word after Claude's `--`,
    `cc-lhc -p -- -v`, is a prompt, not a question.)"""
    flags, claude_args = parse_launch(argv)
    return ("--lhc-help" in flags or "--lhc-version" in flags
            or scan_claude_args(split_short_options(claude_args))["help_or_version"])


def check_environment(command) -> None:
    """Refuse, before anything is written, what cc-lhc cannot keep: the working folder, the
    state folder and Claude's config folder are recorded in cc-lhc's databases as text, so a
    name holding bytes that are not UTF-8 is a refusal (2); a state folder that is a file or
    a device is an unusable state folder (1). doctor reports the latter instead."""
    try:
        cwd = os.getcwd()
    except OSError:  # a folder removed under us: each command says what that means for it
        cwd = ""
    home = os.environ.get("CC_LHC_HOME", "")
    for what, value in (("working folder", cwd), ("state folder (CC_LHC_HOME)", home),
                        ("Claude config folder (CLAUDE_CONFIG_DIR)", os.environ.get("CLAUDE_CONFIG_DIR", ""))):
        if SURROGATE.search(value):
            raise LhcError(f"{not_utf8('the ' + what, value)}; cc-lhc records it in its threads as "
                           "text, so it needs a folder whose name it reads as UTF-8", EXIT_USAGE)
    config = os.environ.get("CLAUDE_CONFIG_DIR", "")
    if command is None and config and os.path.lexists(config) and not os.path.isdir(config):
        say(f"Claude's config folder {config} (CLAUDE_CONFIG_DIR) is not a folder: Claude keeps no "
            "transcript there, so cc-lhc has nothing of this session to capture")
    if home and not os.path.isabs(home):
        # Claude's tools run cc-lhc from other folders than this one: they must find the same home
        os.environ["CC_LHC_HOME"] = os.path.abspath(home)
    root = StateHome().root
    apart = command in ("doctor", "preview")  # (doctor reports it; preview keeps nothing there)
    if not apart and os.path.lexists(root) and not os.path.isdir(root):
        raise LhcError(f"the state folder {root} is not a folder; point CC_LHC_HOME at a folder "
                       "(cc-lhc doctor checks it)", EXIT_ERROR)
    problem, mend = state_folder_problem(root) if not apart else ("", "")
    if problem:
        # (read as empty, it would say "no threads yet" of a folder full of them)
        raise LhcError(f"{problem}; {mend} (cc-lhc doctor checks it)", EXIT_ERROR)


def state_folder_usable(root: str) -> bool:
    """Whether this user can list, read and write the state folder (true of one that does
    not exist yet: it is made when first needed)."""
    return not os.path.isdir(root) or os.access(root, os.R_OK | os.W_OK | os.X_OK)


def _free_bytes(path: str):
    try:
        st = os.statvfs(path)
        return st.f_bavail * st.f_frsize
    except (OSError, AttributeError):
        return None


def _read_only_fs(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):  # (no statvfs on Windows)
        return False


def state_folder_problem(root: str) -> tuple:
    """(what is wrong, how to mend it) when the state folder cannot be used, else ('', ''):
    one that exists but this user cannot read and write, or lies on a read-only file
    system; one that does not exist yet and cannot be made where it is named."""
    import shlex
    elsewhere = "or point CC_LHC_HOME at a folder this user can write"
    if os.path.isdir(root):
        if state_folder_usable(root) and not _read_only_fs(root):
            return "", ""
        if _read_only_fs(root):
            return (f"the state folder {root} is on a read-only file system",
                    f"mount it read-write, {elsewhere}")
        return (f"the state folder {root} cannot be read and written by this user",
                f"give it back to them: chown -R \"$(id -un)\" {shlex.quote(root)} && "
                f"chmod u+rwx {shlex.quote(root)}; {elsewhere}")
    if os.path.lexists(root):
        return "", ""  # (not a folder: said on its own)
    parent = os.path.dirname(os.path.abspath(root))
    while parent and not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        return (f"the state folder {root} cannot be made: {parent} is not a folder", elsewhere)
    if _read_only_fs(parent):
        return (f"the state folder {root} cannot be made: {parent} is on a read-only file system",
                elsewhere)
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"the state folder {root} cannot be made: this user cannot write in {parent}", elsewhere
    return "", ""


def sqlite3_errors():
    import sqlite3
    return sqlite3.Error


def _reader_gone() -> None:
    """Standard output's reader has gone (`| head`, `| true`): what is still buffered for
    it goes nowhere, so the flush at exit does not fail again with a traceback."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


def cli() -> None:
    status = main()
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _reader_gone()
        status = status or EXIT_ERROR
    sys.exit(status)


if _LOADING_INTERRUPT and signal.getsignal(signal.SIGINT) is _interrupted_while_loading:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # (loaded: KeyboardInterrupt again)

if __name__ == "__main__":
    cli()
