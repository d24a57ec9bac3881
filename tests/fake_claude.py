#!/usr/bin/env python3
"""A scriptable stand-in for the `claude` CLI, for the cases the real one cannot stage.

Point cc-lhc at it with ``CC_LHC_CLAUDE_BIN=tests/fake_claude.py``. It accepts any argv.

On start, when ``FAKE_CLAUDE_ARGV_FILE`` is set, it appends one JSON line to that file:
``{"argv": [...], "retrieval_rules": [...], "env": {...}, "cwd": ..., "pid": ..., "ppid": ...,
"tty": {...}}`` (the leading ``--allowedTools=Bash(cc-lhc ...)`` rules cc-lhc adds are moved
from argv to retrieval_rules) where
``env`` holds HOME, TERM, DISABLE_AUTO_COMPACT and every CC_LHC_*, CLAUDE_* and ANTHROPIC_*
variable it sees, and ``tty`` says which of stdin/stdout/stderr are terminals. One line
per launch, so a test can see every child a wrapper started.

Then it runs the steps of ``FAKE_CLAUDE_SCRIPT``, a JSON list (a single object is a list of
one), in order; with no script it just exits 0. Steps (one key each):

  {"print": "text"}        write text and a newline to stdout
  {"stderr": "text"}       same to stderr
  {"burst": 1000000}       write that many bytes to stdout at once (numbered lines)
  {"size": true}           print "SIZE <cols>x<rows>" as seen on the terminal
  {"winch": true}          from now on print "WINCH <cols>x<rows>" on every SIGWINCH
  {"echo": true}           print "ECHO <line>" for each stdin line until end of input
  {"sleep": 2.5}           sleep that long; null sleeps until killed (signals still handled)
  {"transcript": {"path": "...", "record": {...}}}
                           append the record as one JSON line; in the path, {session_id}
                           (from --session-id/--resume in argv) and {config_dir}
                           (CLAUDE_CONFIG_DIR) are filled in; parent folders are created;
                           with "raw": "text" in place of "record", that text as it is
                           (a line cut off, or a record without its newline)
  {"run": ["cmd", "arg"]}  run a command as Claude's Bash tool would (a child of this
                           process, same env); print its output, then "EXIT <status>"
  {"signal": "TERM"}       kill itself with that signal (name or number; default action)
  {"exit": 3}              exit with that status

Example: FAKE_CLAUDE_SCRIPT='[{"print": "ready"}, {"winch": true}, {"sleep": null}]'.
"""

import json
import os
import signal
import sys
import time

ENV_PREFIXES = ("CC_LHC_", "CLAUDE_", "ANTHROPIC_")
ENV_NAMES = ("HOME", "TERM", "DISABLE_AUTO_COMPACT", "XDG_CONFIG_HOME")


def out(text, stream=None):
    stream = stream or sys.stdout
    stream.write(text + "\n")
    stream.flush()


def terminal_size():
    for fd in (1, 0, 2):
        try:
            size = os.get_terminal_size(fd)
            return f"{size.columns}x{size.lines}"
        except OSError:
            continue
    return "none"


def argv_value(names):
    args = sys.argv[1:]
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                return args[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return ""


RETRIEVAL_RULE = "--allowedTools=Bash(cc-lhc "


def record_launch(path):
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}
    # cc-lhc's own allow rules for its retrieval commands lead every managed child's argv;
    # they are kept apart so "argv" shows what the launch itself asked of Claude.
    args = sys.argv[1:]
    rules = []
    while args and args[0].startswith(RETRIEVAL_RULE):
        rules.append(args.pop(0))
    line = {"argv": args, "retrieval_rules": rules, "env": env, "cwd": os.getcwd(), "pid": os.getpid(),
            "ppid": os.getppid(), "tty": {name: os.isatty(fd) for fd, name in
                                          ((0, "stdin"), (1, "stdout"), (2, "stderr"))}}
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def run_step(step):
    (kind, arg), = step.items()
    if kind == "print":
        out(str(arg))
    elif kind == "stderr":
        out(str(arg), sys.stderr)
    elif kind == "burst":
        data, n = bytearray(), 0
        while len(data) < arg:
            data += b"burst line %08d ..........................................\n" % n
            n += 1
        sys.stdout.buffer.write(bytes(data[:arg]))
        sys.stdout.flush()
    elif kind == "size":
        out("SIZE " + terminal_size())
    elif kind == "winch":
        signal.signal(signal.SIGWINCH, lambda *_: out("WINCH " + terminal_size()))
    elif kind == "echo":
        for line in sys.stdin:
            out("ECHO " + line.rstrip("\n"))
    elif kind == "sleep":
        if arg is None:
            while True:
                signal.pause()
        deadline = time.monotonic() + float(arg)
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(left)  # resumes after a handled signal such as SIGWINCH
    elif kind == "transcript":
        path = arg["path"].format(session_id=argv_value(("--session-id", "--resume", "-r")),
                                  config_dir=os.environ.get("CLAUDE_CONFIG_DIR", ""))
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a") as f:
            f.write(arg["raw"] if "raw" in arg else json.dumps(arg["record"]) + "\n")
    elif kind == "run":
        import subprocess
        done = subprocess.run(arg, capture_output=True, text=True)
        out(done.stdout + done.stderr + f"EXIT {done.returncode}")
    elif kind == "signal":
        sig = arg if isinstance(arg, int) else getattr(signal, "SIG" + str(arg).upper().removeprefix("SIG"))
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        time.sleep(5)  # a stopped or ignored signal must not fall through to exit 0
    elif kind == "exit":
        sys.exit(int(arg))
    else:
        sys.exit(f"fake_claude: unknown step {step!r}")


def main():
    if os.environ.get("FAKE_CLAUDE_ARGV_FILE"):
        record_launch(os.environ["FAKE_CLAUDE_ARGV_FILE"])
    script = json.loads(os.environ.get("FAKE_CLAUDE_SCRIPT") or "[]")
    for step in [script] if isinstance(script, dict) else script:
        run_step(step)
    return 0


if __name__ == "__main__":
    sys.exit(main())
