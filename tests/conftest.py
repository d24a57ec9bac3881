"""Shared fixtures: an isolated home for every test, a fake Anthropic API, the real CLI.

Fixtures
- ``iso_env`` -> IsoEnv: temp ``home/ config/ lhc/ xdg/ work/`` and ``.env``, a full
  environment pointing HOME, CLAUDE_CONFIG_DIR, CC_LHC_HOME and XDG_CONFIG_HOME there.
- (autouse) the same variables are set in ``os.environ`` for every test, and outer
  CC_LHC_* / ANTHROPIC_* / CLAUDE_CODE_* variables removed, so in-process code never reaches
  the developer's real ~/.claude, ~/.cc-lhc or ~/.config.
- ``fake_api`` -> FakeAPI (started; see tests/fakeapi.py).
- ``claude_bin`` -> Path of the pinned real CLI (session scope; installs it once).
- ``real_claude`` -> RealClaude: iso_env + fake_api + claude_bin wired together, first-run
  dialogs pre-answered, with ``run``/``run_claude``/``run_lhc`` and ``transcripts()``.
- ``fake_claude`` -> FakeClaude: env that makes cc-lhc launch tests/fake_claude.py.
- ``tmux`` -> factory ``tmux(cmd, cols=, rows=, env=, cwd=, after=) -> Tmux`` whose sessions
  are killed after the test (see tests/tmuxdrive.py).

Tests that use the real CLI get the ``real_cli`` marker automatically
(``pytest -m "not real_cli"`` skips them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
CC_LHC = REPO / "cc_lhc.py"
FAKE_CLAUDE = TESTS / "fake_claude.py"

from claude_install import ensure_claude  # tests/ and the repo are on sys.path (pytest.ini)
from fakeapi import FakeAPI
from tmuxdrive import Tmux

# Captured before any fixture swaps HOME, so tests can check the real one stayed untouched.
REAL_HOME = Path(os.path.expanduser("~"))

# The token the real CLI sends; ANTHROPIC_AUTH_TOKEN (not _API_KEY) skips the
# "Detected a custom API key" dialog. The key below is pre-approved too, for tests that
# want ANTHROPIC_API_KEY instead.
FAKE_AUTH_TOKEN = "fake-auth-token-for-tests"
FAKE_API_KEY = "sk-ant-api03-fake-key-for-cc-lhc-tests-0123456789"

QUIET_ENV = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_AUTOUPDATER": "1",
}


def _scrubbed(name: str) -> bool:
    """Outer variables that would leak the developer's setup into a test."""
    return (name.startswith(("CC_LHC_", "ANTHROPIC_", "CLAUDE_CODE_", "FAKE_CLAUDE_"))
            or name in ("CLAUDECODE", "CLAUDE_CONFIG_DIR", "TMUX", "TMUX_PANE"))


def project_slug(path: str | os.PathLike) -> str:
    """Claude Code's folder name for a cwd under projects/ (see REAL-CLAUDE.md)."""
    text = str(path)
    # JavaScript strings are UTF-16: a character outside the BMP is two units, two dashes.
    slug = "".join(c if c.isascii() and c.isalnum() else "-" * (1 + (ord(c) > 0xFFFF))
                   for c in text)
    if len(slug) <= 200:
        return slug
    data, h = text.encode("utf-16-le"), 0
    for i in range(0, len(data), 2):
        h = (31 * h + (data[i] | data[i + 1] << 8)) & 0xFFFFFFFF
    h = abs(h - (1 << 32) if h >= 1 << 31 else h)
    digits = ""
    while True:
        h, r = divmod(h, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if h == 0:
            break
    return slug[:200] + "-" + digits


# -- isolation ----------------------------------------------------------------------------

@dataclass
class IsoEnv:
    root: Path
    home: Path
    config: Path   # CLAUDE_CONFIG_DIR
    lhc: Path      # CC_LHC_HOME
    xdg: Path      # XDG_CONFIG_HOME
    work: Path     # cwd for sessions
    env: dict[str, str] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, str]:
        """Only the variables this fixture sets (what the autouse fixture puts in os.environ)."""
        # Background turn summaries would take the fake API's scripted replies; the tests
        # that exercise them turn them back on.
        # The real CLI also writes under XDG_DATA_HOME (a URL-handler .desktop file), so
        # every XDG base folder points inside the test's root too.
        return {"HOME": str(self.home), "CLAUDE_CONFIG_DIR": str(self.config),
                "CC_LHC_HOME": str(self.lhc), "XDG_CONFIG_HOME": str(self.xdg),
                "XDG_DATA_HOME": str(self.root / "xdg-data"),
                "XDG_CACHE_HOME": str(self.root / "xdg-cache"),
                "XDG_STATE_HOME": str(self.root / "xdg-state"),
                "CC_LHC_SUMMARIES": "off", **QUIET_ENV}


@pytest.fixture
def iso_env(tmp_path_factory: pytest.TempPathFactory) -> IsoEnv:
    """A private home for one test; ``.env`` is a complete environment for subprocesses."""
    root = tmp_path_factory.mktemp("iso").resolve()
    paths = {name: root / name for name in ("home", "config", "lhc", "xdg", "work", "tmp")}
    for p in paths.values():
        p.mkdir()
    paths.pop("tmp")
    iso = IsoEnv(root=root, **paths)
    env = {k: v for k, v in os.environ.items() if not _scrubbed(k)}
    env.update(iso.settings)
    env["TMPDIR"] = str(root / "tmp")  # the real CLI keeps per-session files under $TMPDIR
    env["PWD"] = str(iso.work)
    iso.env = env
    return iso


@pytest.fixture(autouse=True)
def _isolated_environ(iso_env: IsoEnv, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if _scrubbed(name):
            monkeypatch.delenv(name)
    for name, value in iso_env.settings.items():
        monkeypatch.setenv(name, value)


# -- fake API and real CLI ----------------------------------------------------------------

@pytest.fixture
def fake_api():
    with FakeAPI() as api:
        yield api


@pytest.fixture(scope="session")
def claude_bin() -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is needed to install the real claude CLI")
    return ensure_claude()


def _run(argv: Sequence[str | os.PathLike], env: Mapping[str, str], cwd: Path,
         input: str | None = None, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess:
    if input is None:
        kw.setdefault("stdin", subprocess.DEVNULL)
    kw.setdefault("capture_output", True)
    return subprocess.run([str(a) for a in argv], env=dict(env), cwd=cwd, input=input,
                          timeout=timeout, text=True, **kw)


@dataclass
class RealClaude:
    iso: IsoEnv
    api: FakeAPI
    claude: Path
    env: dict[str, str]
    cwd: Path

    @property
    def config_dir(self) -> Path:
        return self.iso.config

    @property
    def config_file(self) -> Path:
        return self.iso.config / ".claude.json"

    @property
    def project_dir(self) -> Path:
        """Where the CLI writes transcripts for ``self.cwd``."""
        return self.iso.config / "projects" / project_slug(self.cwd)

    def transcripts(self) -> list[Path]:
        """Top-level session transcripts of the cwd, oldest first."""
        return sorted(self.project_dir.glob("*.jsonl"), key=lambda p: p.stat().st_mtime_ns)

    def update_config(self, **keys: Any) -> None:
        """Merge keys into $CLAUDE_CONFIG_DIR/.claude.json."""
        data = json.loads(self.config_file.read_text())
        data.update(keys)
        self.config_file.write_text(json.dumps(data, indent=2))

    def run(self, argv: Sequence[str | os.PathLike], *, input: str | None = None,
            timeout: float = 60, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess:
        """Run argv with this env (plus ``env`` overrides) in the cwd; stdin is /dev/null
        unless ``input`` is given; output captured as text."""
        return _run(argv, {**self.env, **(env or {})}, cwd or self.cwd, input, timeout, **kw)

    def run_claude(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run([self.claude, *args], **kw)

    def lhc_argv(self, *args: str) -> list[str]:
        return [sys.executable, str(CC_LHC), *args]

    def run_lhc(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run(self.lhc_argv(*args), **kw)


def first_run_config(trusted: Sequence[Path], api_key: str = FAKE_API_KEY) -> dict:
    """The .claude.json keys that skip every interactive first-run dialog of the CLI."""
    return {
        "hasCompletedOnboarding": True,        # else it probes the real API host and exits 1
        "hasSeenAutoDefaultNotice": True,      # a banner
        "customApiKeyResponses": {"approved": [api_key[-20:]], "rejected": []},
        # folder trust; a parent folder covers its subfolders
        "projects": {str(p): {"hasTrustDialogAccepted": True} for p in trusted},
    }


@pytest.fixture
def real_claude(iso_env: IsoEnv, fake_api: FakeAPI, claude_bin: Path,
                monkeypatch: pytest.MonkeyPatch) -> RealClaude:
    config = first_run_config([iso_env.work, iso_env.root])
    (iso_env.config / ".claude.json").write_text(json.dumps(config, indent=2))
    # CC_LHC_MOD=off: with the cc-lhc mod active a live Smart Compact runs inside Claude
    # instead of swapping it; the swap is the fallback the other real-CLI tests cover, and
    # tests/test_mod_real.py turns the mod on.
    wiring = {"ANTHROPIC_BASE_URL": fake_api.url, "ANTHROPIC_AUTH_TOKEN": FAKE_AUTH_TOKEN,
              "CC_LHC_CLAUDE_BIN": str(claude_bin), "CC_LHC_MOD": "off"}
    for name, value in wiring.items():
        monkeypatch.setenv(name, value)
    return RealClaude(iso=iso_env, api=fake_api, claude=claude_bin,
                      env={**iso_env.env, **wiring}, cwd=iso_env.work)


# -- the stand-in CLI ---------------------------------------------------------------------

@dataclass
class FakeClaude:
    path: Path
    argv_file: Path
    env: dict[str, str]
    cwd: Path

    def script(self, steps: list[dict] | dict) -> None:
        """Set FAKE_CLAUDE_SCRIPT for the launches that follow (see tests/fake_claude.py)."""
        self.env["FAKE_CLAUDE_SCRIPT"] = json.dumps(steps)

    def launches(self) -> list[dict]:
        """One dict per start of the stand-in: argv, env, cwd, pid, ppid, tty."""
        if not self.argv_file.exists():
            return []
        return [json.loads(line) for line in self.argv_file.read_text().splitlines() if line]

    def run(self, argv: Sequence[str | os.PathLike], *, input: str | None = None,
            timeout: float = 60, env: Mapping[str, str] | None = None,
            cwd: Path | None = None, **kw: Any) -> subprocess.CompletedProcess:
        return _run(argv, {**self.env, **(env or {})}, cwd or self.cwd, input, timeout, **kw)

    def run_lhc(self, *args: str, **kw: Any) -> subprocess.CompletedProcess:
        return self.run([sys.executable, str(CC_LHC), *args], **kw)


@pytest.fixture
def fake_claude(iso_env: IsoEnv, monkeypatch: pytest.MonkeyPatch) -> FakeClaude:
    argv_file = iso_env.root / "fake-claude-launches.jsonl"
    wiring = {"CC_LHC_CLAUDE_BIN": str(FAKE_CLAUDE), "FAKE_CLAUDE_ARGV_FILE": str(argv_file)}
    for name, value in wiring.items():
        monkeypatch.setenv(name, value)
    return FakeClaude(path=FAKE_CLAUDE, argv_file=argv_file, env={**iso_env.env, **wiring},
                      cwd=iso_env.work)


# -- tmux ---------------------------------------------------------------------------------

@pytest.fixture
def tmux() -> Callable[..., Tmux]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    started: list[Tmux] = []

    def start(cmd: Sequence[str | os.PathLike] | str, **kw: Any) -> Tmux:
        session = Tmux(cmd if isinstance(cmd, str) else [str(c) for c in cmd], **kw)
        started.append(session)
        return session

    yield start
    for session in started:
        session.kill()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "claude_bin" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real_cli)


def load_module(name: str, path: Path):
    """Import a script that is not a package module (build/*.py) under its own name."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
