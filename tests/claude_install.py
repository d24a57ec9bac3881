#!/usr/bin/env python3
"""Install the pinned real Claude Code CLI for the tests, once, into a cache folder.

    ensure_claude(cache_dir=None) -> Path   # path of the `claude` executable

The default cache is ``<repo>/.cache/claude`` (git-ignored). The first call runs npm, later
calls only check ``claude --version``. Several pytest-xdist workers may call it at the same
time: an fcntl lock on ``<cache>/.install.lock`` makes one of them install while the others
wait and then reuse the result.

Why the extra step after ``npm install``: the npm package is a stub whose postinstall
script copies the native binary out of the platform package. npm 11 does not run install
scripts of packages it has not been told to trust, so the stub stays and ``claude
--version`` says the native binary is not installed. Running the package's own
``install.cjs`` by hand does what the postinstall would have done.

Run ``python3 tests/claude_install.py [CACHE_DIR]`` to install and print the path.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGE = "@anthropic-ai/claude-code"
PINNED_VERSION = "2.1.328"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = REPO / ".cache" / "claude"


class ClaudeInstallError(RuntimeError):
    """npm or the installed CLI did not do what we need."""


def ensure_claude(cache_dir: Path | str | None = None) -> Path:
    """Return the path of a working ``claude`` at PINNED_VERSION, installing it if needed."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    cache.mkdir(parents=True, exist_ok=True)
    cache = cache.resolve()
    claude = cache / "node_modules" / ".bin" / "claude"
    with open(cache / ".install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _version_of(claude).startswith(PINNED_VERSION):
            return claude
        _npm_install(cache)
        if not _version_of(claude).startswith(PINNED_VERSION):
            # The stub is still in place: the postinstall was blocked (see module docstring).
            _run(["node", str(cache / "node_modules" / PACKAGE / "install.cjs")], cache)
        version = _version_of(claude)
        if not version.startswith(PINNED_VERSION):
            raise ClaudeInstallError(
                f"{claude} --version said {version!r}, expected {PINNED_VERSION}")
        return claude


def _npm_install(cache: Path) -> None:
    if shutil.which("npm") is None:
        raise ClaudeInstallError("npm is not on PATH; it is needed to install the real claude CLI")
    if not (cache / "package.json").exists():
        _run(["npm", "init", "-y"], cache)
    _run(["npm", "install", "--no-audit", "--no-fund", "--save-exact",
          f"{PACKAGE}@{PINNED_VERSION}"], cache)


def _version_of(claude: Path) -> str:
    """First line of ``claude --version``, or "" when it is missing or fails."""
    if not claude.exists():
        return ""
    # A throwaway HOME/config so a version probe can never write into the real ~/.claude.
    with tempfile.TemporaryDirectory(prefix="claude-version-") as tmp:
        env = dict(os.environ, HOME=tmp, CLAUDE_CONFIG_DIR=tmp, DISABLE_AUTOUPDATER="1",
                   DISABLE_TELEMETRY="1", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1")
        try:
            proc = subprocess.run([str(claude), "--version"], env=env, cwd=tmp,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return ""
    out = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return out[0] if proc.returncode == 0 and out else ""


def _run(argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=900)
    if proc.returncode != 0:
        raise ClaudeInstallError(
            f"{' '.join(argv)} failed with exit {proc.returncode} in {cwd}:\n"
            f"{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


if __name__ == "__main__":
    print(ensure_claude(sys.argv[1] if len(sys.argv) > 1 else None))
