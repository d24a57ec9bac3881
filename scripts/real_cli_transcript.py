#!/usr/bin/env python3
"""Transcripts written by the real Claude Code CLI, for the benchmarks (intake, store, counts).

    python3 scripts/real_cli_transcript.py --out FILE [--size-mb 14]

    from real_cli_transcript import base_session, grow
    base = base_session(cache_dir)          # recorded once with the real CLI, then reused
    grow(base, "big.jsonl", size_mb=40)     # the same records again, fresh ids, one chain

The generator in gen_transcript.py writes mostly bookkeeping; a real coding session is
mostly tool output (file reads, command output, search hits), each held twice in the
transcript (the tool_result block and the tool's own ``toolUseResult``). Here the real CLI
(tests/claude_install.py) is driven by the fake API (tests/fakeapi.py) through several
``claude -p`` processes on one session, each asking for many Read, Bash and Grep calls on a
copy of this repository, with thinking and text between them. The real CLI runs the tools,
so every record is as it writes them.

``grow`` reaches a size by appending copies of the recorded conversation: every uuid
(except the session's), message, request and tool id is replaced per copy, the first
record of a copy hangs from the last of the one before, and timestamps keep rising, so the
result is one long session of the same shape.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

RECORDING_VERSION = 1      # bump when the recorded session would differ
PROCESSES = 4              # `claude -p` runs on the one session
CALLS_PER_PROCESS = 36
SEED = 11
MIB = 1 << 20

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
ID_RE = re.compile(r"\b((?:msg|toolu|req)_[A-Za-z0-9]+)")


def _project(work: Path) -> list[Path]:
    """A copy of this repository's source to work on; returns its text files."""
    files = []
    for src in sorted(list(REPO.glob("*.py")) + list(REPO.glob("*.md")) + list((REPO / "tests").glob("*.py"))
                      + list((REPO / "scripts").glob("*.py")) + list((REPO / "build").glob("*.py"))):
        dest = work / src.relative_to(REPO)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dest)
        files.append(dest)
    return files


def _calls(rng: random.Random, files: list[Path], work: Path, n: int) -> list:
    """One process's scripted replies: n tool calls (with some thinking and text), then an answer."""
    from fakeapi import thinking_reply, tool_use_reply
    words = ["def ", "class ", "return", "import", "self.", "error", "path", "json", "store", "view"]
    replies = []
    for i in range(n):
        f = rng.choice(files)
        rel = f.relative_to(work)
        lines = max(1, sum(1 for _ in open(f, encoding="utf-8", errors="replace")))
        kind = rng.choice(("Read", "Read", "Bash", "Bash", "Bash", "Grep"))
        if kind == "Read":
            start = rng.randint(1, max(1, lines - 200))
            call = ("Read", {"file_path": str(f), "offset": start, "limit": rng.randint(150, 700)})
        elif kind == "Grep":
            call = ("Grep", {"pattern": rng.choice(words), "path": str(work), "output_mode": "content",
                             "-n": True})
        else:
            cmd = rng.choice([
                f"sed -n '{rng.randint(1, lines)},+{rng.randint(80, 400)}p' {rel}",
                f"grep -n '{rng.choice(words)}' {rel} | head -n {rng.randint(50, 400)}",
                "python3 -c \"import json,sys; print(json.dumps(sorted(sys.modules), indent=1))\"",
                f"ls -la {work}/tests {work}/scripts",
                f"wc -l {work}/*.py {work}/tests/*.py",
                f"python3 -m pydoc {rng.choice(['json', 'sqlite3', 'zlib', 'pathlib', 'subprocess'])} | head -n 400",
                f"cat {rel} | head -n {rng.randint(100, 500)}",
            ])
            call = ("Bash", {"command": cmd, "description": "look at the code"})
        text = f"Step {i + 1}: checking {rel}." if rng.random() < 0.5 else None
        if rng.random() < 0.2:
            replies.append(thinking_reply(f"I should look at {rel} around the {rng.choice(words).strip()} "
                                          "handling before changing anything. " * rng.randint(2, 12),
                                          f"Looking at {rel}."))
            # the tool call follows in the same response, so the turn goes on
            replies[-1]["content"].append({"type": "tool_use", "name": call[0], "input": call[1]})
        else:
            replies.append(tool_use_reply(call[0], call[1], text=text))
    replies.append("I read through the parser and the store; the change belongs in the store's "
                   "insert path, and the tests cover the round trip. " * 3)
    return replies


def record_base(dest: Path) -> Path:
    """Run the real CLI against the fake API and copy the transcript it wrote to dest."""
    from claude_install import ensure_claude
    from fakeapi import FakeAPI
    sys.path.insert(0, str(REPO))
    from cc_lhc import project_slug
    claude = ensure_claude()
    rng = random.Random(SEED)
    with tempfile.TemporaryDirectory(prefix="cc-lhc-realcli-") as tmp:
        root = Path(tmp).resolve()
        home, config, work = root / "home", root / "config", root / "work"
        for p in (home, config, work, root / "tmp"):
            p.mkdir()
        files = _project(work)
        # What skips the CLI's first-run dialogs (as tests/conftest.py's first_run_config).
        (config / ".claude.json").write_text(json.dumps({
            "hasCompletedOnboarding": True, "hasSeenAutoDefaultNotice": True,
            "projects": {str(p): {"hasTrustDialogAccepted": True} for p in (work, root)}}))
        sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        with FakeAPI() as api:
            env = {k: v for k, v in os.environ.items()
                   if not k.startswith(("CC_LHC_", "ANTHROPIC_", "CLAUDE_CODE_"))}
            env.update(DISABLE_TELEMETRY="1", DISABLE_ERROR_REPORTING="1", DISABLE_AUTOUPDATER="1",
                       CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1", HOME=str(home), CLAUDE_CONFIG_DIR=str(config), TMPDIR=str(root / "tmp"),
                       XDG_CONFIG_HOME=str(root / "xdg"), XDG_DATA_HOME=str(root / "xdg-data"),
                       XDG_CACHE_HOME=str(root / "xdg-cache"), XDG_STATE_HOME=str(root / "xdg-state"),
                       ANTHROPIC_BASE_URL=api.url, ANTHROPIC_AUTH_TOKEN="fake-auth-token-for-bench", PWD=str(work))
            for i in range(PROCESSES):
                api.script(_calls(rng, files, work, CALLS_PER_PROCESS))
                which = ["--session-id", sid] if i == 0 else ["--resume", sid]
                p = subprocess.run([str(claude), *which, "-p", f"Work through the code base, part {i + 1}.",
                                    "--allowedTools", "Bash,Read,Grep", "--output-format", "json"],
                                   cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                                   text=True, timeout=600)
                if p.returncode:
                    raise RuntimeError(f"claude exited {p.returncode}: {p.stderr.strip()[-300:]}")
        src = config / "projects" / project_slug(str(work)) / f"{sid}.jsonl"
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Paths of the temp folder become a stable, realistic one.
        data = src.read_bytes().replace(str(work).encode(), b"/home/user/proj")
        tmp_dest = dest.with_suffix(".tmp")
        tmp_dest.write_bytes(data)
        tmp_dest.replace(dest)
    return dest


def base_session(cache_dir: Path) -> Path:
    """The recorded session, made once under cache_dir (keyed by this file's source)."""
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:10]
    path = Path(cache_dir) / f"realcli-base-r{RECORDING_VERSION}.{digest}.jsonl"
    if not path.exists():
        record_base(path)
    return path


def _shift_time(value: str, delta: timedelta) -> str:
    try:
        t = datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return value
    return (t + delta).strftime("%Y-%m-%dT%H:%M:%S.") + f"{(t + delta).microsecond // 1000:03d}Z"


def grow(base: Path, out: Path, size_mb: float) -> Path:
    """base's records repeated (fresh ids per copy, one chain) until out holds size_mb MiB."""
    lines = base.read_bytes().splitlines()
    records = [json.loads(ln) for ln in lines if ln.strip()]
    sid = next(r["sessionId"] for r in records if r.get("sessionId"))
    stamps = [r["timestamp"] for r in records if isinstance(r.get("timestamp"), str)]
    span = (datetime.strptime(max(stamps), "%Y-%m-%dT%H:%M:%S.%fZ")
            - datetime.strptime(min(stamps), "%Y-%m-%dT%H:%M:%S.%fZ")) + timedelta(seconds=30)
    last_uuid = [r["uuid"] for r in records if r.get("uuid")][-1]
    target = int(size_mb * MIB)
    written, copy, prev_last = 0, 0, None
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        while written < target:
            mapping: dict = {sid: sid}

            def fresh(m: re.Match) -> str:
                old = m.group(0)
                if old not in mapping:
                    mapping[old] = (str(uuid.uuid5(uuid.NAMESPACE_URL, f"{copy}/{old}")) if "-" in old
                                    else f"{old}c{copy}")
                return mapping[old]

            for rec in records:
                if copy:
                    text = json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
                    text = ID_RE.sub(fresh, UUID_RE.sub(fresh, text))
                    rec2 = json.loads(text)
                    if rec.get("parentUuid") is None and rec.get("uuid") and prev_last:
                        rec2["parentUuid"] = prev_last
                    if isinstance(rec2.get("timestamp"), str):
                        rec2["timestamp"] = _shift_time(rec2["timestamp"], span * copy)
                else:
                    rec2 = rec
                line = json.dumps(rec2, ensure_ascii=False, separators=(",", ":")) + "\n"
                fh.write(line)
                written += len(line.encode("utf-8"))
                if written >= target and rec2.get("type") == "assistant" and \
                        (rec2.get("message") or {}).get("stop_reason") == "end_turn":
                    break
            prev_last = mapping.get(last_uuid, last_uuid)
            copy += 1
    tmp.replace(out)
    return out


def transcript(cache_dir: Path, size_mb: float) -> Path:
    """A real-CLI-shaped session of about size_mb MiB, cached under cache_dir."""
    base = base_session(cache_dir)
    out = Path(cache_dir) / f"{base.stem}-{size_mb:g}mb.jsonl"
    if not out.exists():
        grow(base, out, size_mb)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--size-mb", type=float, default=14)
    ap.add_argument("--cache", default=str(REPO / ".cache" / "bench"))
    a = ap.parse_args(argv)
    grow(base_session(Path(a.cache)), Path(a.out), a.size_mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
