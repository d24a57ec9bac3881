#!/usr/bin/env python3
"""Roll back Smart Compact rebuilds that were never accepted (cc-lhc state repair tool).

    python3 rollback-unaccepted.py            # dry run: say what would be done
    python3 rollback-unaccepted.py --apply    # do it

A Smart Compact records its rebuilt session as *pending* in cc-lhc's registry before it
writes the new transcript, and marks it *accepted* only once Claude was seen taking the
prompt on it. If cc-lhc was killed in between, the pending row and an unused transcript are
left behind. cc-lhc cleans these up itself the next time the thread is launched; this
script does the same for every thread at once, without launching anything:

- the rebuilt transcript is moved out of Claude's projects folder into
  ``$CC_LHC_HOME/abandoned-rebuilds/<project folder>/`` (nothing is deleted);
- the pending row and the rebuilt session's (never current) alias are removed, in one
  transaction, and then from the copy of them the thread file keeps. The thread stays on the session it was on: a pending rebuild was never
  made current.

Skipped: records that are malformed (no usable thread or session id), transcripts that
are not provably cc-lhc rebuilds inside Claude's projects folder (the path resolves
elsewhere, or the file's first line is not the rebuild header of that thread and its bytes
do not match the prefix cc-lhc recorded), rebuilds whose cc-lhc process is still running, threads another cc-lhc currently
owns, rebuilds that were accepted but whose pointer is still waiting to be repaired (the
next cc-lhc launch of that thread finishes them), and rebuilds whose transcript grew past
the prefix cc-lhc wrote into it. Those hold records Claude wrote after cc-lhc stopped
(it accepted the prompt); cc-lhc's own recovery captures them into the thread before it
moves the file, so launch cc-lhc on that thread once instead, or pass
``--discard-unsaved`` to move them anyway (the file is kept, its new records stay out of
the thread).

Honours ``CC_LHC_HOME`` (default ``~/.cc-lhc``) and ``CLAUDE_CONFIG_DIR`` (default
``~/.claude``). Stdlib only, Python 3.8+; it reads the state files directly and does not
need cc-lhc itself. Running it again after ``--apply`` finds nothing to do.

Exit status: 0 when it finished (including "nothing to do"), 1 when the state could not be
read or changed, 2 for a usage error.
"""

import argparse
import hashlib
import json
import os
import re
import shutil
import sqlite3
import sys

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
PROG = "rollback-unaccepted"


# -- state layout ------------------------------------------------------------------------

def state_home():
    root = os.environ.get("CC_LHC_HOME") or os.path.join(os.path.expanduser("~"), ".cc-lhc")
    return os.path.abspath(root)


def claude_config_dir():
    return os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(os.path.expanduser("~"), ".claude")


def project_slug(cwd):
    """Claude Code's folder name for a working directory under projects/.

    Every character outside [A-Za-z0-9] becomes '-' (counted in UTF-16 units, as Claude
    Code does); a slug longer than 200 characters is cut and gets '-' and a base-36 hash.
    """
    slug = "".join(c if (c.isascii() and c.isalnum()) else "-" * (2 if ord(c) > 0xFFFF else 1)
                   for c in cwd)
    if len(slug) <= 200:
        return slug
    data, h = cwd.encode("utf-16-le", "surrogatepass"), 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | (data[i + 1] << 8))) & 0xFFFFFFFF
    if h & 0x80000000:
        h -= 1 << 32
    h = abs(h)
    digits = ""
    while True:
        h, r = divmod(h, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if h == 0:
            break
    return slug[:200] + "-" + digits


def private_folders(folder):
    """Make ``folder`` and each missing folder above it 0700, as cc-lhc makes its own
    (os.makedirs gives its mode only to the last one; the others get the umask's)."""
    missing = []
    while folder and not os.path.isdir(folder):
        missing.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass


def lease_lock_path(home, thread_id):
    """The OS-lock file cc-lhc holds for a thread while a session of it runs."""
    key = hashlib.sha256(thread_id.encode()).hexdigest()[:24]
    return os.path.join(home, "owners", key + ".lock")


# -- process identity ----------------------------------------------------------------------

def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def process_start_time(pid):
    """Field 22 (starttime) of /proc/<pid>/stat, or None if the process is gone/unknown."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def pid_exists(pid):
    """Best effort where /proc is not available (macOS, Windows)."""
    if os.name == "nt":  # pragma: no cover - Windows only
        import ctypes
        kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.get_last_error() == 5  # access denied: it exists
        code = ctypes.c_ulong()
        kernel32.GetExitCodeProcess(handle, ctypes.byref(code))
        kernel32.CloseHandle(handle)
        return code.value == 259  # STILL_ACTIVE
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def owner_alive(owner_text):
    """True when the exact process recorded as owner (pid + start time + boot) still runs.

    Where the OS gives no start time or boot id, a live pid counts as alive: skipping a
    rebuild that could be rolled back is safe, rolling back a running one is not.
    """
    try:
        owner = json.loads(owner_text)
    except (TypeError, ValueError):
        return False
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int) \
            or isinstance(owner.get("pid"), bool):
        return False
    pid = owner["pid"]
    here_boot = boot_id()
    if here_boot is not None and os.path.exists("/proc/self/stat"):
        if owner.get("boot") != here_boot:
            return False
        start = process_start_time(pid)
        return start is not None and start == owner.get("start")
    return pid_exists(pid)


class ThreadBusy(Exception):
    pass


class ThreadLock:
    """Take the thread's cc-lhc lease lock for the duration of a change (non-blocking)."""

    def __init__(self, home, thread_id):
        self.path = lease_lock_path(home, thread_id)
        self.fd = None

    def __enter__(self):
        folder = os.path.dirname(self.path)
        private_folders(folder)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.name == "nt":  # pragma: no cover - Windows only
                import msvcrt
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
            else:
                import fcntl
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise ThreadBusy()
        self.fd = fd
        return self

    def __exit__(self, *_):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        return False


def thread_in_use(home, thread_id):
    """True when a running cc-lhc holds the thread (its lease lock is taken)."""
    if not os.path.exists(lease_lock_path(home, thread_id)):
        return False
    try:
        with ThreadLock(home, thread_id):
            return False
    except ThreadBusy:
        return True
    except OSError:
        return False


# -- the work ------------------------------------------------------------------------------

def connect(path):
    db = sqlite3.connect(path, timeout=30, isolation_level=None)
    db.execute("PRAGMA busy_timeout = 30000")
    return db


def has_table(db, name):
    return db.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                      (name,)).fetchone() is not None


def awaiting_repair(home):
    """Rebuilt sessions that were accepted but whose pointer write failed (cc-lhc.sqlite)."""
    path = os.path.join(home, "cc-lhc.sqlite")
    if not os.path.exists(path):
        return set()
    db = connect(path)
    try:
        if not has_table(db, "pointer_repairs"):
            return set()
        return {r[0] for r in db.execute(
            "SELECT to_session FROM pointer_repairs WHERE repaired IS NULL")}
    finally:
        db.close()


def lineages(home):
    """session id -> (bytes, sha256) of the prefix cc-lhc wrote into that transcript."""
    path = os.path.join(home, "cc-lhc.sqlite")
    if not os.path.exists(path):
        return {}
    db = connect(path)
    try:
        if not has_table(db, "sessions"):
            return {}
        return {r[0]: (r[1], r[2]) for r in db.execute(
            "SELECT session_id, replayed_prefix_bytes, replayed_prefix_sha256 FROM sessions")}
    finally:
        db.close()


def grown_past_prefix(row, prefixes):
    """(size, prefix) when the rebuilt transcript holds more than cc-lhc wrote, else None.

    Only a session cc-lhc recorded a prefix for is judged, as cc-lhc's own recovery does.
    """
    prefix = prefixes.get(row["session_id"])
    if prefix is None:
        return None
    source = find_transcript(row)
    if not source:
        return None
    try:
        size = os.path.getsize(source)
    except OSError:
        return None
    return (size, int(prefix or 0)) if size > int(prefix or 0) else None


def find_transcript(row):
    """The rebuilt transcript: the stored path, else where it sits under CLAUDE_CONFIG_DIR."""
    stored = row["path"]
    if isinstance(stored, str) and stored and os.path.isfile(stored):
        return stored
    if isinstance(row["cwd"], str) and row["cwd"]:
        guess = os.path.join(claude_config_dir(), "projects", project_slug(row["cwd"]),
                             row["session_id"] + ".jsonl")
        if os.path.isfile(guess):
            return guess
    return None


REBUILT_MARKER = "[cc-lhc] This conversation was rebuilt by Smart Compact"


def inside_projects(path):
    """True when the path, links resolved, is a file under Claude's projects folder."""
    root = os.path.realpath(os.path.join(claude_config_dir(), "projects"))
    real = os.path.realpath(path)
    return os.path.commonpath([root, real]) == root and real != root and os.path.isfile(real)


def has_rebuild_header(path, thread_id):
    """The file's first line is the header cc-lhc writes into a rebuild of this thread."""
    try:
        with open(path, "rb") as f:
            first = f.readline(1 << 20)
        rec = json.loads(first)
    except (OSError, ValueError, RecursionError):
        return False
    message = rec.get("message") if isinstance(rec, dict) else None
    content = message.get("content") if isinstance(message, dict) else None
    return isinstance(content, str) and content.startswith(
        "%s from thread %s" % (REBUILT_MARKER, thread_id))


def matches_lineage(path, lineage):
    """The file starts with exactly the bytes cc-lhc recorded writing (size and sha256)."""
    if not lineage or not isinstance(lineage[0], int) or not isinstance(lineage[1], str):
        return False
    size, digest = lineage
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except OSError:
        return False
    return len(head) == size and hashlib.sha256(head).hexdigest() == digest


def unproven_reason(row, source, lineages):
    """Why the file at source may not be moved as this rebuild, or None when it may."""
    if not inside_projects(source):
        root = os.path.join(claude_config_dir(), "projects")
        return ("it is not inside Claude's projects folder %s (is CLAUDE_CONFIG_DIR set as it was for "
                "that session?)" % root)
    if has_rebuild_header(source, row["thread_id"]):
        return None
    if matches_lineage(source, lineages.get(row["session_id"])):
        return None
    return "it does not start as cc-lhc's rebuild of that thread"


def destination(home, row, source):
    cwd = row["cwd"] if isinstance(row["cwd"], str) and row["cwd"] else "unknown"
    folder = os.path.join(home, "abandoned-rebuilds", project_slug(cwd))
    target = os.path.join(folder, os.path.basename(source))
    n = 1
    while os.path.exists(target):
        n += 1
        stem, ext = os.path.splitext(os.path.basename(source))
        target = os.path.join(folder, "%s.%d%s" % (stem, n, ext))
    return folder, target


def alias_of(session_id):
    return "claude-code:" + session_id


def roll_back(home, db, row, apply):
    """Report (and with apply, do) the rollback of one pending rebuild. Returns lines."""
    sid = row["session_id"]
    source = find_transcript(row)
    lines = []
    beside = None  # the session's folder (the agent transcripts it was given) goes along
    if source:
        folder, target = destination(home, row, source)
        verb = "moved" if apply else "would move"
        lines.append("  %s %s -> %s" % (verb, source, target))
        if source.endswith(".jsonl") and target.endswith(".jsonl") and os.path.isdir(source[:-6]) \
                and not os.path.islink(source[:-6]) and not os.path.lexists(target[:-6]):
            beside = (source[:-6], target[:-6])
            lines.append("  %s %s -> %s" % (verb, beside[0], beside[1]))
    else:
        folder = target = None
        lines.append("  no transcript found (expected %s)" % row["path"])
    verb = "removed" if apply else "would remove"
    lines.append("  %s the pending record and alias %s" % (verb, alias_of(sid)))
    if not apply:
        return lines
    if source:
        # Move first: a crash after this leaves a pending row without a file, which the
        # next run (or cc-lhc's own recovery) still settles; never a lost transcript.
        private_folders(folder)
        for src, dst in [(source, target)] + ([beside] if beside else []):
            try:
                os.replace(src, dst)
            except OSError:
                shutil.move(src, dst)
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM rebuilds WHERE session_id = ? AND status = 'pending'", (sid,))
        db.execute("DELETE FROM aliases WHERE alias = ? AND is_current = 0", (alias_of(sid),))
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
    forget_in_thread_copy(home, row["thread_id"], sid)
    return lines


UUID_SHAPE = re.compile(r"\A[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def forget_in_thread_copy(home, thread_id, sid):
    """Remove the same rows from the copy of the registry the thread file keeps (cc-lhc
    rebuilds a lost registry from it), so the rollback is not undone by such a rebuild."""
    path = os.path.join(home, "threads", thread_id + ".sqlite")
    if not UUID_SHAPE.match(thread_id) or not os.path.isfile(path):
        return
    db = connect(path)
    try:
        if not has_table(db, "registry_rebuilds"):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("DELETE FROM registry_rebuilds WHERE session_id = ? AND status = 'pending'", (sid,))
            db.execute("DELETE FROM registry_aliases WHERE session_id = ? AND is_current = 0", (sid,))
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()


class GrownRebuild(Exception):
    pass


class Unproven(Exception):
    """The named file is not provably this rebuild: it is left where it is."""


# Why a rebuild was skipped: the key counts it in the summary.
RUNNING = "still running"
AWAITING_REPAIR = "accepted, awaiting their pointer repair"
GROWN = "holding records Claude wrote after cc-lhc stopped"
MALFORMED = "malformed (no usable thread or session id)"
UNPROVEN = "not provably a cc-lhc rebuild inside Claude's projects folder"


def malformed(row):
    """A record whose ids are not non-empty text cannot be matched to a thread or lock."""
    return not all(isinstance(row[k], str) and row[k] for k in ("session_id", "thread_id"))


def summary_of(skips):
    return ", ".join("%d %s" % (n, reason) for reason, n in skips.items() if n)


def run(apply, out, discard_unsaved=False):
    home = state_home()
    registry = os.path.join(home, "registry.sqlite")
    if not os.path.exists(registry):
        out.write("nothing to do: no cc-lhc registry at %s\n" % registry)
        return EXIT_OK
    db = connect(registry)
    try:
        if not has_table(db, "rebuilds"):
            out.write("nothing to do: no rebuild records in %s\n" % registry)
            return EXIT_OK
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT session_id, thread_id, from_session, path, cwd, owner, created "
                          "FROM rebuilds WHERE status = 'pending' ORDER BY created").fetchall()
        db.row_factory = None
        if not rows:
            out.write("nothing to do: no unaccepted rebuilds\n")
            return EXIT_OK
        repairs = awaiting_repair(home)
        lineage_of = lineages(home)
        prefixes = {sid: size for sid, (size, _sha) in lineage_of.items()}
        done = 0
        skips = {RUNNING: 0, AWAITING_REPAIR: 0, GROWN: 0, MALFORMED: 0, UNPROVEN: 0}
        for row in rows:
            if malformed(row):
                out.write("skipped a pending record with thread %r and session %r: %s\n"
                          % (row["thread_id"], row["session_id"], MALFORMED))
                skips[MALFORMED] += 1
                continue
            head = "rebuild %s of thread %s (from session %s, created %s)" % (
                row["session_id"], row["thread_id"], row["from_session"], row["created"])
            if owner_alive(row["owner"]):
                out.write("skipped %s: session still running\n" % head)
                skips[RUNNING] += 1
                continue
            if row["session_id"] in repairs:
                out.write("skipped %s: it was accepted; the next cc-lhc launch of the thread "
                          "finishes writing its pointer\n" % head)
                skips[AWAITING_REPAIR] += 1
                continue
            try:
                with ThreadLock(home, row["thread_id"]) if apply else _NoLock():
                    if not apply and thread_in_use(home, row["thread_id"]):
                        raise ThreadBusy()
                    source = find_transcript(row)
                    unproven = source and unproven_reason(row, source, lineage_of)
                    if unproven:
                        raise Unproven(source, unproven)
                    grown = grown_past_prefix(row, prefixes)
                    if grown and not discard_unsaved:
                        raise GrownRebuild()
                    lines = roll_back(home, db, row, apply)
            except ThreadBusy:
                out.write("skipped %s: session still running (another cc-lhc owns the thread)\n"
                          % head)
                skips[RUNNING] += 1
                continue
            except Unproven as e:
                out.write("skipped %s: %s is left where it is: %s\n" % (head, e.args[0], e.args[1]))
                skips[UNPROVEN] += 1
                continue
            except GrownRebuild:
                out.write(
                    "skipped %s: Claude wrote into it after cc-lhc stopped (its transcript is %d "
                    "bytes, cc-lhc wrote %d), so moving it would drop those records from the "
                    "thread. Launch the newer cc-lhc on that thread once (e.g. cc-lhc --resume "
                    "%s; it keeps that content), then run this again, or pass --discard-unsaved "
                    "to move it anyway\n" % (head, grown[0], grown[1], row["from_session"]))
                skips[GROWN] += 1
                continue
            if grown:
                lines.insert(0, "  its transcript holds %d bytes Claude wrote after cc-lhc "
                                "stopped; %s (--discard-unsaved)"
                             % (grown[0] - grown[1], "not kept in the thread" if apply
                                else "they would not be kept in the thread"))
            out.write(("rolled back " if apply else "would roll back ") + head + "\n")
            for line in lines:
                out.write(line + "\n")
            done += 1
        skipped = sum(skips.values())
        why = " (%s)" % summary_of(skips) if skipped else ""
        if done == 0:
            out.write("nothing to do: %d unaccepted rebuild(s), all skipped: %s\n"
                      % (skipped, summary_of(skips)))
        elif apply:
            out.write("done: %d rolled back, %d skipped%s; the threads stay on their accepted "
                      "sessions\n" % (done, skipped, why))
        else:
            out.write("dry run: %d to roll back, %d skipped%s; run again with --apply to do it\n"
                      % (done, skipped, why))
        return EXIT_OK
    finally:
        db.close()


class _NoLock:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        sys.stderr.write("%s: error: %s\n" % (PROG, message))
        sys.exit(EXIT_USAGE)


def main(argv=None):
    parser = _Parser(prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
                     description=__doc__.split("\n", 1)[0] + "\n\n"
                     + __doc__.split("\n\n", 2)[2].strip())
    parser.add_argument("--apply", action="store_true",
                        help="move the unused transcripts and remove the records "
                             "(default: only say what would be done)")
    parser.add_argument("--discard-unsaved", action="store_true",
                        help="also move rebuilds Claude wrote into after cc-lhc stopped; what "
                             "it wrote stays in the moved file but not in the thread (default: "
                             "skip them; launching cc-lhc on the thread keeps that content)")
    args = parser.parse_args(argv)
    try:
        return run(args.apply, sys.stdout, discard_unsaved=args.discard_unsaved)
    except (sqlite3.Error, OSError) as e:
        sys.stderr.write("%s: cannot finish: %s\n" % (PROG, e))
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
