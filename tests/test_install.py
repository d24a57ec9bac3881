"""install.sh against a loopback HTTP server serving release folders.

The bundles here are small fakes made by the tests (a tar.gz whose `cc-lhc` is a shell
script), so every case runs in well under a second and needs no PyInstaller. One test at
the end installs the real bundle from dist/ when there is one (or CC_LHC_TEST_BUNDLE=1).

Each install runs with its own HOME, CC_LHC_HOME, XDG_CONFIG_HOME and CLAUDE_CONFIG_DIR
under tmp_path, and under both dash and bash.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import load_module

REPO = Path(__file__).resolve().parent.parent
INSTALL_SH = REPO / "install.sh"

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="install.sh is for Linux and macOS")


BUILD = load_module("cc_lhc_build_for_tests", REPO / "build" / "build.py")
RELEASE = load_module("cc_lhc_release_for_tests", REPO / "build" / "release.py")
OS_NAME, ARCH = BUILD.host_target()
SHELLS = [s for s in ("dash", "bash") if shutil.which(s)]


# == A release folder with fake bundles ======================================

FAKE_CC_LHC = """#!/bin/sh
case "${1:-}" in
    --lhc-version) echo "cc-lhc @VERSION@ (fake bundle)"; exit @STATUS@ ;;
    *) echo "fake cc-lhc @VERSION@: $*" ;;
esac
"""


def make_bundle(folder: Path, version: str, *, status: int = 0, with_sleeper: bool = True,
                links: dict[str, str] | None = None, mode: int = 0o755) -> Path:
    """cc-lhc-<v>-<os>-<arch>.tar.gz holding a scripted cc-lhc (and a real binary to run);
    `links` adds symbolic links, path inside the bundle -> target as written."""
    name = BUILD.bundle_basename(version, OS_NAME, ARCH)
    tree = folder / f".tree-{name}"
    (tree / "_internal").mkdir(parents=True)
    exe = tree / "cc-lhc"
    exe.write_text(FAKE_CC_LHC.replace("@VERSION@", version).replace("@STATUS@", str(status)))
    exe.chmod(mode)
    for where, target in (links or {}).items():
        (tree / where).parent.mkdir(parents=True, exist_ok=True)
        (tree / where).symlink_to(target)
    if with_sleeper:
        # A real executable inside the version folder, so a process can be seen "running
        # from" it in /proc (a script's /proc/PID/exe is its interpreter).
        shutil.copy2(shutil.which("sleep"), tree / "_internal" / "sleep")
    out = folder / f"{name}.tar.gz"
    BUILD.write_tar_gz(tree, name, out, 1767225600)
    shutil.rmtree(tree)
    return out


def make_release(root: Path, version: str, **kw) -> Path:
    folder = root / f"release-{version}"
    folder.mkdir(parents=True)
    make_bundle(folder, version, **kw)
    BUILD.write_sums(list(folder.glob("*.tar.gz")), folder / "SHA256SUMS")
    return folder


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# == Loopback server ==========================================================

class Server:
    """Serves one folder at a time on 127.0.0.1; can cut chosen files short mid-body."""

    def __init__(self):
        self.root: Path | None = None
        self.requests: list[str] = []
        self.truncate: set[str] = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                name = self.path.rsplit("/", 1)[-1]
                server.requests.append(name)
                path = server.root / name if server.root else None
                if path is None or not path.is_file():
                    self.send_error(404)
                    return
                data = path.read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if name in server.truncate:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/cc-lhc-release"

    def serve(self, folder: Path) -> None:
        self.root = folder
        self.requests.clear()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


# == Running the installer ====================================================

class Box:
    """An isolated user: HOME, cc-lhc state, config dirs; default install locations."""

    def __init__(self, tmp: Path, shell: str, server: Server):
        self.tmp, self.shell, self.server = tmp, shell, server
        self.home = tmp / "home"
        self.state = tmp / "cc-lhc-home"
        for d in (self.home, self.state, tmp / "xdg", tmp / "claude", tmp / "tmpdir"):
            d.mkdir(parents=True, exist_ok=True)
        self.install_dir = self.home / ".local" / "share" / "cc-lhc"
        self.bin = self.home / ".local" / "bin" / "cc-lhc"

    def env(self, path: str | None = None, **extra) -> dict:
        env = {
            "HOME": str(self.home),
            "CC_LHC_HOME": str(self.state),
            "XDG_CONFIG_HOME": str(self.tmp / "xdg"),
            "CLAUDE_CONFIG_DIR": str(self.tmp / "claude"),
            "TMPDIR": str(self.tmp / "tmpdir"),
            "PATH": path if path is not None else os.environ.get("PATH", "/usr/bin:/bin"),
            "CC_LHC_DOWNLOAD_BASE": self.server.base,
            "LC_ALL": "C",
        }
        env.update(extra)
        return env

    def install(self, *args: str, script: Path = INSTALL_SH, path: str | None = None, stdin: bytes | None = None,
                **extra) -> subprocess.CompletedProcess:
        cmd = [self.shell] if stdin is not None else [self.shell, str(script), *args]
        return subprocess.run(cmd, input=stdin, env=self.env(path, **extra), capture_output=True, timeout=120,
                              cwd=self.tmp)

    def run_cc_lhc(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin), *args], capture_output=True, text=True, timeout=60,
                              env=self.env())

    def version_dirs(self) -> list[str]:
        versions = self.install_dir / "versions"
        return sorted(p.name for p in versions.iterdir()) if versions.is_dir() else []

    def installed_version(self) -> str:
        out = self.run_cc_lhc("--lhc-version")
        assert out.returncode == 0, out.stderr
        return out.stdout.split()[1]


def tree_digest(root: Path) -> dict:
    return {p.relative_to(root).as_posix(): (sha256(p) if p.is_file() else "dir")
            for p in sorted(root.rglob("*"))}


def private_path(tmp: Path, tools: list[str], fakes: dict[str, str] | None = None) -> str:
    """A PATH folder holding only links to `tools` (and scripted `fakes`)."""
    bindir = tmp / "private-bin"
    bindir.mkdir(exist_ok=True)
    for tool in tools:
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    for name, body in (fakes or {}).items():
        (bindir / name).unlink(missing_ok=True)
        (bindir / name).write_text("#!/bin/sh\n" + body)
        (bindir / name).chmod(0o755)
    return str(bindir)


BASE_TOOLS = ["sh", "dash", "bash", "uname", "mkdir", "mktemp", "mv", "ln", "rm", "tar", "gzip", "tr", "grep",
              "sed", "cut", "cat", "readlink", "getconf", "ldd", "ls", "sleep", "env"]


@pytest.fixture(params=SHELLS)
def box(request, tmp_path, server) -> Box:
    return Box(tmp_path, request.param, server)


def stderr(proc) -> str:
    return proc.stderr.decode() if isinstance(proc.stderr, bytes) else proc.stderr


# == Tests ====================================================================

def test_clean_install(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    proc = box.install("--version", "0.1.0")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"
    assert box.bin.is_symlink()
    assert os.readlink(box.bin) == str(box.install_dir / "current" / "cc-lhc")
    assert os.readlink(box.install_dir / "current").startswith("versions/0.1.0-")
    # The bin folder is not on this PATH, so the installer says how to add it.
    assert "is not on your PATH" in stderr(proc)
    assert str(box.home / ".local" / "bin") in stderr(proc)
    # No leftovers: staging folders, the lock, the temporary download folder.
    assert sorted(p.name for p in box.install_dir.iterdir()) == ["current", "previous", "versions"]
    assert (box.install_dir / "previous").read_text() == "\n"  # (a first install: nothing to go back to)
    assert len(box.version_dirs()) == 1
    assert list((box.tmp / "tmpdir").iterdir()) == []
    assert not (box.home / ".cc-lhc").exists()


def test_quiet_install_prints_nothing_but_the_path_hint(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    path = f"{box.home / '.local' / 'bin'}:{os.environ['PATH']}"
    proc = box.install("--version", "0.1.0", "--quiet", path=path)
    assert proc.returncode == 0, stderr(proc)
    assert stderr(proc) == ""
    assert box.installed_version() == "0.1.0"


def test_version_is_read_from_sha256sums_when_not_given(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.3.1"))
    proc = box.install()
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.3.1"


def test_rerun_upgrades_and_keeps_state(box, server, tmp_path):
    # Records a user would not want to lose: cc-lhc state and a real ~/.cc-lhc.
    (box.state / "registry.sqlite").write_bytes(b"state that must survive")
    (box.state / "threads").mkdir()
    (box.state / "threads" / "t.sqlite").write_bytes(b"thread")
    dot = box.home / ".cc-lhc"
    dot.mkdir()
    (dot / "config.json").write_text('{"keep": true}')
    before = (tree_digest(box.state), tree_digest(dot))

    for version in ("0.1.0", "0.2.0", "0.3.0"):
        server.serve(make_release(tmp_path, version))
        proc = box.install("--version", version)
        assert proc.returncode == 0, stderr(proc)
        assert box.installed_version() == version
    assert "upgraded 0.2.0 -> 0.3.0" in stderr(proc)
    # The current and the previous version are kept; older ones are pruned.
    assert [d.split("-")[0] for d in box.version_dirs()] == ["0.2.0", "0.3.0"]
    assert (tree_digest(box.state), tree_digest(dot)) == before

    # Re-running the same version changes nothing and keeps working.
    proc = box.install("--version", "0.3.0")
    assert proc.returncode == 0, stderr(proc)
    assert "already unpacked" in stderr(proc)
    assert box.installed_version() == "0.3.0"


@pytest.mark.parametrize("damage", ["file-removed", "byte-added", "exec-bit-lost"])
def test_rerunning_the_same_version_repairs_a_damaged_copy(box, server, tmp_path, damage):
    """The same version installed again is compared with the download: a copy that lost a
    file, has one altered, or an executable that no longer is, is unpacked again (it was
    kept as "already unpacked", still broken, with exit 0)."""
    server.serve(make_release(tmp_path, "0.2.0"))
    assert box.install("--version", "0.2.0").returncode == 0
    [folder] = box.version_dirs()
    installed = box.install_dir / "versions" / folder
    if damage == "file-removed":
        (installed / "_internal" / "sleep").unlink()
    elif damage == "byte-added":
        with (installed / "cc-lhc").open("a") as f:
            f.write("exit 3\n")
    else:
        (installed / "_internal" / "sleep").chmod(0o644)
    proc = box.install("--version", "0.2.0")
    assert proc.returncode == 0, stderr(proc)
    assert "already unpacked" not in stderr(proc)
    assert "differs from the download (" in stderr(proc) and "unpacking it again" in stderr(proc)
    assert box.version_dirs() == [folder]
    assert (installed / "_internal" / "sleep").stat().st_mode & 0o111
    assert box.installed_version() == "0.2.0"
    assert "exit 3" not in (installed / "cc-lhc").read_text()
    assert not list((box.install_dir / "versions").glob(".staging.*"))
    # Whole again, a third run keeps it as it is.
    proc = box.install("--version", "0.2.0")
    assert "already unpacked" in stderr(proc) and "matches the download" in stderr(proc)
    assert " -> 0.2.0;" not in stderr(proc)


def test_going_back_to_an_older_version_says_so(box, server, tmp_path):
    """The line naming the switch compares the versions the installer moved between (after
    old versions were pruned it named the last one pruned: "upgraded 0.2.0 -> 0.2.0")."""
    for run, version in enumerate(("0.1.0", "0.3.0", "0.2.0", "0.2.0")):
        server.serve(make_release(tmp_path / str(run), version))
        proc = box.install("--version", version)
        assert proc.returncode == 0, stderr(proc)
        if version == "0.3.0":
            assert "upgraded 0.1.0 -> 0.3.0" in stderr(proc)
    assert " -> 0.2.0;" not in stderr(proc)  # (it said "upgraded 0.2.0 -> 0.2.0")
    assert box.installed_version() == "0.2.0"
    server.serve(make_release(tmp_path / "again", "0.1.0"))
    proc = box.install("--version", "0.1.0")
    assert "went back 0.2.0 -> 0.1.0" in stderr(proc) and "upgraded 0.2.0" not in stderr(proc)


@pytest.mark.parametrize("spelling", ["trailing-slash", "through-a-link"])
def test_a_bin_folder_on_path_in_another_spelling_needs_no_hint(box, server, tmp_path, spelling):
    server.serve(make_release(tmp_path, "0.1.0"))
    bin_dir = box.home / ".local" / "bin"
    bin_dir.mkdir(parents=True)
    if spelling == "trailing-slash":
        entry = f"{bin_dir}/"
    else:
        (tmp_path / "link-to-bin").symlink_to(bin_dir)
        entry = str(tmp_path / "link-to-bin")
    proc = box.install("--version", "0.1.0", path=f"{entry}:{os.environ['PATH']}")
    assert proc.returncode == 0, stderr(proc)
    assert "is not on your PATH" not in stderr(proc)
    assert "comes before" not in stderr(proc)


def test_rerunning_the_same_version_keeps_the_rollback_version(box, server, tmp_path):
    for version in ("0.1.0", "0.2.0"):
        server.serve(make_release(tmp_path, version))
        proc = box.install("--version", version)
        assert proc.returncode == 0, stderr(proc)
    old = next(d for d in box.version_dirs() if d.startswith("0.1.0-"))
    assert (box.install_dir / "previous").read_text().strip() == old

    for _ in range(2):  # the same version again, twice: the previous one stays
        proc = box.install("--version", "0.2.0")
        assert proc.returncode == 0, stderr(proc)
        assert "removed old version" not in stderr(proc)
        assert f"kept 0.1.0 for a rollback: {box.install_dir / 'versions' / old / 'cc-lhc'}" in stderr(proc)
        assert [d.split("-")[0] for d in box.version_dirs()] == ["0.1.0", "0.2.0"]
        assert (box.install_dir / "previous").read_text().strip() == old
        assert box.installed_version() == "0.2.0"
    rollback = subprocess.run([str(box.install_dir / "versions" / old / "cc-lhc"), "--lhc-version"],
                              capture_output=True, text=True, timeout=60, env=box.env())
    assert rollback.returncode == 0 and rollback.stdout.startswith("cc-lhc 0.1.0 "), rollback

    # Going back to 0.1.0 makes 0.2.0 the previous one; a new version then prunes 0.1.0.
    server.serve(tmp_path / "release-0.1.0")
    proc = box.install("--version", "0.1.0")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"
    assert (box.install_dir / "previous").read_text().strip().startswith("0.2.0-")
    server.serve(make_release(tmp_path, "0.3.0"))
    proc = box.install("--version", "0.3.0")
    assert proc.returncode == 0, stderr(proc)
    assert [d.split("-")[0] for d in box.version_dirs()] == ["0.1.0", "0.3.0"]


def test_install_from_an_older_installer_keeps_versions_until_an_upgrade(box, server, tmp_path):
    """No `previous` file yet (written by an installer that did not record it): re-running
    the same version cannot tell which old version is the rollback one, so none is pruned."""
    for version in ("0.1.0", "0.2.0", "0.3.0"):
        server.serve(make_release(tmp_path, version))
        assert box.install("--version", version).returncode == 0
    old = next(d for d in box.version_dirs() if d.startswith("0.2.0-"))
    # What an older installer leaves: 0.1.0 not pruned (in use then), no `previous`.
    shutil.copytree(box.install_dir / "versions" / old, box.install_dir / "versions" / old.replace("0.2.0", "0.1.0"))
    (box.install_dir / "previous").unlink()
    proc = box.install("--version", "0.3.0")
    assert proc.returncode == 0, stderr(proc)
    assert "not recorded" in stderr(proc) and "removed old version" not in stderr(proc)
    assert [d.split("-")[0] for d in box.version_dirs()] == ["0.1.0", "0.2.0", "0.3.0"]
    server.serve(make_release(tmp_path, "0.4.0"))
    proc = box.install("--version", "0.4.0")
    assert proc.returncode == 0, stderr(proc)
    assert [d.split("-")[0] for d in box.version_dirs()] == ["0.3.0", "0.4.0"]


@pytest.mark.skipif(not Path("/proc/self/exe").exists(), reason="needs /proc")
def test_version_in_use_is_kept_until_it_exits(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    # A long-running process started through the links, as a user's session would be.
    sleeper = subprocess.Popen([str(box.install_dir / "current" / "_internal" / "sleep"), "60"])
    try:
        for version in ("0.2.0", "0.3.0"):
            server.serve(make_release(tmp_path, version))
            proc = box.install("--version", version)
            assert proc.returncode == 0, stderr(proc)
        assert [d.split("-")[0] for d in box.version_dirs()] == ["0.1.0", "0.2.0", "0.3.0"]
        assert "keeping 0.1.0-" in stderr(proc)
        assert box.installed_version() == "0.3.0"
    finally:
        sleeper.send_signal(signal.SIGTERM)
        sleeper.wait(timeout=10)
    server.serve(make_release(tmp_path, "0.4.0"))
    proc = box.install("--version", "0.4.0")
    assert proc.returncode == 0, stderr(proc)
    assert [d.split("-")[0] for d in box.version_dirs()] == ["0.3.0", "0.4.0"]


def assert_still_on(box: Box, version: str, dirs_before: list[str]) -> None:
    assert box.installed_version() == version
    assert box.version_dirs() == dirs_before
    assert list((box.tmp / "tmpdir").iterdir()) == []
    assert not (box.install_dir / ".install-lock").exists()


def test_tampered_bundle_installs_nothing(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    dirs = box.version_dirs()

    release = make_release(tmp_path, "0.2.0")
    bundle = next(release.glob("*.tar.gz"))
    want = sha256(bundle)
    data = bytearray(bundle.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bundle.write_bytes(bytes(data))
    server.serve(release)

    proc = box.install("--version", "0.2.0")
    assert proc.returncode != 0
    err = stderr(proc)
    assert "checksum mismatch" in err
    assert f"want {want}" in err and f"got  {sha256(bundle)}" in err
    assert_still_on(box, "0.1.0", dirs)


@pytest.mark.parametrize("how", ["connection-cut", "short-file"])
def test_truncated_download_installs_nothing(box, server, tmp_path, how):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    dirs = box.version_dirs()

    release = make_release(tmp_path, "0.2.0")
    bundle = next(release.glob("*.tar.gz"))
    if how == "connection-cut":
        server.serve(release)
        server.truncate.add(bundle.name)  # promises the full length, sends half
    else:
        bundle.write_bytes(bundle.read_bytes()[:-100])  # a short file served "successfully"
        server.serve(release)
    proc = box.install("--version", "0.2.0")
    assert proc.returncode != 0
    assert ("could not download" in stderr(proc)) if how == "connection-cut" else ("checksum mismatch" in stderr(proc))
    assert_still_on(box, "0.1.0", dirs)


@pytest.mark.parametrize("good_first", [True, False])
def test_sums_listing_the_bundle_twice_are_refused(box, server, tmp_path, good_first):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    dirs = box.version_dirs()

    release = make_release(tmp_path, "0.2.0")
    sums = release / "SHA256SUMS"
    good = sums.read_text()
    name = good.split()[1]
    bad = f"{'0' * 64}  {name}\n"
    sums.write_text(good + bad if good_first else bad + good)
    server.serve(release)
    proc = box.install("--version", "0.2.0")
    assert proc.returncode != 0
    assert f"lists {name} more than once" in stderr(proc)
    assert name not in server.requests                       # the bundle was not even fetched
    assert_still_on(box, "0.1.0", dirs)

    sums.write_text(good + good)                              # the same sum twice: refused too
    assert "more than once" in stderr(box.install("--version", "0.2.0"))
    assert_still_on(box, "0.1.0", dirs)


@pytest.mark.parametrize("where,target", [
    ("_internal/passwd", "/etc/passwd"),
    ("_internal/up", "../../outside"),
    ("lib", "_internal/../.."),
    ("_internal/deep/link", "../../../elsewhere/x"),
])
def test_bundle_with_a_link_leading_outside_its_folder_is_refused(box, server, tmp_path, where, target):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    dirs = box.version_dirs()
    server.serve(make_release(tmp_path, "0.2.0", links={where: target}))
    proc = box.install("--version", "0.2.0")
    assert proc.returncode != 0
    err = stderr(proc)
    assert "contains a symbolic link that leads outside its own folder" in err, err
    assert f"{where} -> {target}" in err
    assert_still_on(box, "0.1.0", dirs)
    assert not list((box.install_dir / "versions").glob(".staging.*"))


def test_bundle_with_links_inside_its_folder_installs(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0", links={
        "_internal/sleep-again": "sleep", "bin/cc-lhc": "../cc-lhc", "lib": "_internal",
        "_internal/dangling": "not-there"}))
    proc = box.install("--version", "0.1.0")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"


def test_bundle_that_does_not_run_is_not_switched_to(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    dirs = box.version_dirs()
    server.serve(make_release(tmp_path, "0.2.0", status=3))
    proc = box.install("--version", "0.2.0")
    assert proc.returncode != 0
    assert "does not run on this system" in stderr(proc)
    assert_still_on(box, "0.1.0", dirs)


def test_missing_hash_tool_refuses(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    path = private_path(tmp_path, BASE_TOOLS + ["curl"])
    proc = box.install("--version", "0.1.0", path=path)
    assert proc.returncode != 0
    assert "no SHA-256 tool found" in stderr(proc)
    assert not any(r.endswith(".tar.gz") for r in server.requests)  # refused before downloading
    assert not box.install_dir.exists() and not box.bin.exists()


@pytest.mark.parametrize("hasher,downloader", [("openssl", "curl"), ("shasum", "curl"), ("sha256sum", "wget")])
def test_each_hash_tool_and_downloader_works(box, server, tmp_path, hasher, downloader):
    if not shutil.which(hasher) or not shutil.which(downloader):
        pytest.skip(f"{hasher} or {downloader} not on this machine")
    server.serve(make_release(tmp_path, "0.1.0"))
    extra = ["perl"] if hasher == "shasum" else []
    path = private_path(tmp_path, BASE_TOOLS + [hasher, downloader] + extra)
    proc = box.install("--version", "0.1.0", path=path)
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"


def test_wget_truncated_download_installs_nothing(box, server, tmp_path):
    if not shutil.which("wget"):
        pytest.skip("wget not on this machine")
    server.serve(make_release(tmp_path, "0.1.0"))
    path = private_path(tmp_path, BASE_TOOLS + ["sha256sum", "wget"])
    assert box.install("--version", "0.1.0", path=path).returncode == 0
    release = make_release(tmp_path, "0.2.0")
    server.serve(release)
    server.truncate.add(next(release.glob("*.tar.gz")).name)
    proc = box.install("--version", "0.2.0", path=path)
    assert proc.returncode != 0
    assert_still_on(box, "0.1.0", box.version_dirs())


def test_script_cut_short_runs_nothing(box, server, tmp_path):
    """Like `curl … | sh` with the connection dropping part way through."""
    server.serve(make_release(tmp_path, "0.1.0"))
    text = INSTALL_SH.read_bytes()
    last_line_start = text.rstrip(b"\n").rfind(b"\n") + 1
    cuts = [len(text) // 4, len(text) // 2, 3 * len(text) // 4, last_line_start]
    for cut in cuts:
        proc = box.install(stdin=text[:cut])
        assert server.requests == [], f"cut at {cut}: the partial script downloaded something"
        assert not (box.home / ".local").exists(), f"cut at {cut}: the partial script created files"
        assert list((box.tmp / "tmpdir").iterdir()) == []
    # The same text in full, through stdin, does install.
    proc = box.install(stdin=text, CC_LHC_VERSION="0.1.0")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"


def filled_installer(tmp: Path, release: Path, version: str) -> Path:
    """install.sh as the release job publishes it: checksums of `release` embedded."""
    folder = tmp / f"published-{version}"
    shutil.copytree(release, folder)
    RELEASE.finish_release(folder, version, "example/cc-lhc", None)
    return folder / "install.sh"


def test_embedded_checksums_catch_a_mirror_swapping_both_files(box, server, tmp_path):
    genuine = make_release(tmp_path, "0.5.0")
    script = filled_installer(tmp_path, genuine, "0.5.0")
    assert 'RELEASE_VERSION="0.5.0"' in script.read_text()

    # The mirror rebuilt the bundle and its SHA256SUMS consistently.
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    make_bundle(mirror, "0.5.0", status=0)
    bundle = next(mirror.glob("*.tar.gz"))
    bundle.write_bytes(bundle.read_bytes() + b"\0" * 512)
    BUILD.write_sums([bundle], mirror / "SHA256SUMS")
    server.serve(mirror)
    proc = box.install(script=script)
    assert proc.returncode != 0
    assert "does not match the checksums embedded in this installer" in stderr(proc)
    assert not box.install_dir.exists()

    # The genuine folder passes both checks (no --version: the script names its release).
    server.serve(genuine)
    proc = box.install(script=script)
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.5.0"


def test_published_installer_names_its_release_url(box, tmp_path):
    genuine = make_release(tmp_path, "0.5.0")
    script = filled_installer(tmp_path, genuine, "0.5.0")
    # No mirror: the default URL is the GitHub release; with no network it must fail
    # to download, and say where it tried.
    env_path = private_path(tmp_path, BASE_TOOLS + ["curl", "sha256sum"],
                            fakes={"curl": 'echo "curl $*" >&2; exit 7\n'})
    proc = subprocess.run([box.shell, str(script)], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in box.env(env_path).items() if k != "CC_LHC_DOWNLOAD_BASE"})
    assert proc.returncode != 0
    assert "https://github.com/example/cc-lhc/releases/download/cc-lhc-v0.5.0/SHA256SUMS" in proc.stderr
    assert "--proto =https" in proc.stderr


@pytest.mark.parametrize("case", ["rosetta", "musl", "old-glibc", "unknown-arch", "windows"])
def test_platform_detection(box, server, tmp_path, case):
    server.serve(make_release(tmp_path, "0.1.0"))
    fakes = {
        "rosetta": {"uname": 'case "$1" in -s) echo Darwin;; -m) echo x86_64;; esac\n',
                    "sysctl": 'echo 1\n'},
        "musl": {"getconf": "exit 1\n", "ldd": 'echo "musl libc (x86_64)" >&2; exit 1\n'},
        "old-glibc": {"getconf": 'echo "glibc 2.17"\n'},
        "unknown-arch": {"uname": 'case "$1" in -s) echo Linux;; -m) echo riscv64;; esac\n'},
        "windows": {"uname": 'case "$1" in -s) echo MINGW64_NT-10.0;; -m) echo x86_64;; esac\n'},
    }[case]
    path = private_path(tmp_path, [t for t in BASE_TOOLS if t not in fakes] + ["curl", "sha256sum"], fakes)
    proc = box.install("--version", "0.1.0", path=path)
    assert proc.returncode != 0
    expect = {
        "rosetta": "lists no cc-lhc-0.1.0-macos-arm64.tar.gz",
        "musl": "musl libc",
        "old-glibc": "glibc 2.17 is older than 2.28",
        "unknown-arch": "unsupported CPU architecture: riscv64",
        "windows": "use install.ps1",
    }[case]
    assert expect in stderr(proc)
    assert not box.install_dir.exists()


def test_help_and_bad_arguments(box):
    proc = box.install("--help")
    assert proc.returncode == 0
    assert b"--version X.Y.Z" in proc.stdout and b"CC_LHC_DOWNLOAD_BASE" in proc.stdout
    proc = box.install("--frobnicate")
    assert proc.returncode != 0 and "unknown argument" in stderr(proc)
    proc = box.install("--version", "1.0;rm -rf /")
    assert proc.returncode != 0 and "not a version" in stderr(proc)


def test_foreign_file_at_the_command_path_is_not_overwritten(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    box.bin.parent.mkdir(parents=True)
    box.bin.write_text("#!/bin/sh\necho someone else's cc-lhc\n")
    proc = box.install("--version", "0.1.0")
    assert proc.returncode != 0
    assert "was not made by this installer" in stderr(proc)
    assert "someone else" in box.bin.read_text()
    assert not any(r.endswith(".tar.gz") for r in server.requests)  # refused before downloading
    assert not box.install_dir.exists()


@pytest.mark.parametrize("target", ["npm", "dangling", "relative", "dotdot"])
def test_foreign_link_at_the_command_path_is_not_repointed(box, server, tmp_path, target):
    """A cc-lhc from elsewhere (e.g. npm's global bin) linked at the command path."""
    server.serve(make_release(tmp_path, "0.1.0"))
    npm = box.home / ".npm-global" / "lib" / "node_modules" / "cc-lhc" / "cli.js"
    npm.parent.mkdir(parents=True)
    npm.write_text("#!/bin/sh\necho npm cc-lhc\n")
    npm.chmod(0o755)
    link_to = {"npm": str(npm), "dangling": str(box.home / "gone" / "cc-lhc"),
               "relative": "../../.npm-global/lib/node_modules/cc-lhc/cli.js",
               "dotdot": f"{box.install_dir}/../../../.npm-global/lib/node_modules/cc-lhc/cli.js"}[target]
    box.bin.parent.mkdir(parents=True)
    box.bin.symlink_to(link_to)

    proc = box.install("--version", "0.1.0")
    assert proc.returncode != 0
    err = stderr(proc)
    assert f"{box.bin} is a link to {link_to}" in err
    assert "not part of this installation" in err
    assert f'rm "{box.bin}"' in err and "CC_LHC_BIN_DIR" in err
    assert os.readlink(box.bin) == link_to
    assert not any(r.endswith(".tar.gz") for r in server.requests)  # refused before downloading
    assert not box.install_dir.exists()

    # Elsewhere, as the message says: installs, and leaves the foreign link alone.
    other_bin = box.tmp / "other-bin"
    proc = box.install("--version", "0.1.0", CC_LHC_BIN_DIR=str(other_bin))
    assert proc.returncode == 0, stderr(proc)
    assert os.readlink(other_bin / "cc-lhc") == str(box.install_dir / "current" / "cc-lhc")
    assert os.readlink(box.bin) == link_to
    # Removed, as the message says: the installer's link takes its place.
    box.bin.unlink()
    proc = box.install("--version", "0.1.0")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"


def test_own_links_at_the_command_path_are_repointed(box, server, tmp_path):
    """Links into the install folder are this installer's: spelled through a symlinked
    folder, relative, or straight at a version folder, they are replaced."""
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    version = box.version_dirs()[0]
    alias = box.tmp / "alias-of-share"
    alias.symlink_to(box.install_dir.parent)
    for link_to in (f"{alias}/cc-lhc/versions/{version}/cc-lhc",
                    f"../share/cc-lhc/versions/{version}/cc-lhc",
                    str(box.install_dir / "versions" / version / "cc-lhc")):
        box.bin.unlink()
        box.bin.symlink_to(link_to)
        proc = box.install("--version", "0.1.0")
        assert proc.returncode == 0, (link_to, stderr(proc))
        assert os.readlink(box.bin) == str(box.install_dir / "current" / "cc-lhc")


# == The real bundle ==========================================================

def real_bundle() -> Path | None:
    dist = REPO / "dist"
    found = sorted(dist.glob(f"cc-lhc-*-{OS_NAME}-{ARCH}.tar.gz")) if dist.is_dir() else []
    return found[-1] if found else None


@pytest.mark.skipif(real_bundle() is None and os.environ.get("CC_LHC_TEST_BUNDLE") != "1",
                    reason="no built bundle in dist/ (python3 build/build.py) and CC_LHC_TEST_BUNDLE unset")
def test_slow_real_bundle_installs_and_reports_its_identity(tmp_path, server):
    bundle = real_bundle()
    if bundle is None:
        pytest.fail("CC_LHC_TEST_BUNDLE=1 but dist/ holds no bundle for this machine")
    release = tmp_path / "release"
    release.mkdir()
    shutil.copy2(bundle, release / bundle.name)
    BUILD.write_sums([release / bundle.name], release / "SHA256SUMS")
    server.serve(release)
    box = Box(tmp_path, "sh", server)
    version = bundle.name[len("cc-lhc-"):].split("-")[0]
    proc = box.install("--version", version)
    assert proc.returncode == 0, stderr(proc)
    # Through the two links (bin -> current -> versions/...), as a user runs it.
    started = time.monotonic()
    out = box.run_cc_lhc("--lhc-version")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"cc-lhc {version} (source ")
    assert "stamped" in out.stdout
    assert time.monotonic() - started < 30


# == What a person meets in odd places =========================================

class StallingServer:
    """Accepts connections and then sends nothing: ``mid_body`` sends headers and half a
    body first. Every connection stays open until the server closes."""

    def __init__(self, mid_body: bool = False):
        import socket
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.held, self.mid_body = [], mid_body
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.mid_body:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 500)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/cc-lhc-release"

    def close(self):
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.mark.parametrize("downloader", ["curl", "wget"])
@pytest.mark.parametrize("mid_body", [False, True])
def test_a_server_that_stops_sending_is_given_up(box, tmp_path, downloader, mid_body):
    """A mirror that accepts the connection and then sends nothing, or stops half-way,
    held the installer forever (curl) or for 15 minutes (wget)."""
    if not shutil.which(downloader) or not shutil.which("sha256sum"):
        pytest.skip(f"{downloader} or sha256sum not on this machine")
    stalling = StallingServer(mid_body)
    try:
        path = private_path(tmp_path, BASE_TOOLS + ["sha256sum", downloader])
        proc = box.install("--version", "0.1.0", path=path, CC_LHC_DOWNLOAD_BASE=stalling.base,
                           CC_LHC_DOWNLOAD_STALL_SECONDS="2")
    finally:
        stalling.close()
    assert proc.returncode != 0 and "could not download" in stderr(proc), stderr(proc)
    assert not box.bin.exists()


def test_a_stall_limit_that_is_no_number_is_refused(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    proc = box.install("--version", "0.1.0", CC_LHC_DOWNLOAD_STALL_SECONDS="soon")
    assert proc.returncode != 0 and "CC_LHC_DOWNLOAD_STALL_SECONDS" in stderr(proc)


def test_the_path_hint_pastes_as_printed_whatever_home_holds(box, server, tmp_path):
    """A HOME holding a quote, a $ or a backslash made a hint that, pasted, left the shell
    waiting for the end of a quote (o'brien), or added another folder to PATH."""
    server.serve(make_release(tmp_path, "0.1.0"))
    box.home = tmp_path / "o'brien \"$HOME\" `x` \\ we!rd dir"
    box.home.mkdir()
    box.install_dir, box.bin = box.home / ".local/share/cc-lhc", box.home / ".local/bin/cc-lhc"
    proc = box.install("--version", "0.1.0", SHELL="/bin/bash")
    assert proc.returncode == 0, stderr(proc)
    hint = next(line.strip() for line in stderr(proc).splitlines() if line.strip().startswith("echo "))
    assert hint.endswith(" >> ~/.bashrc")
    rc = tmp_path / "bashrc"
    pasted = subprocess.run([box.shell, "-c", hint[:-len("~/.bashrc")] + '"$1"', "sh", str(rc)],
                            capture_output=True, text=True, timeout=30)
    assert pasted.returncode == 0, pasted.stderr
    path = subprocess.run([box.shell, "-c", '. "$1"; printf %s "$PATH"', "sh", str(rc)], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin"}).stdout
    assert path == f"{box.home}/.local/bin:/usr/bin:/bin"
    # the line to type at the prompt for now, as an interactive bash reads it (`!` expands there)
    now = stderr(proc).split("(or run: ", 1)[1].rsplit(").", 1)[0]
    out = tmp_path / "path-now"
    typed = subprocess.run(["bash", "--norc", "--noprofile", "-i"], input=f'{now}\nprintf %s "$PATH" > {out}\n',
                           capture_output=True, text=True, timeout=30, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.read_text() == f"{box.home}/.local/bin:/usr/bin:/bin", typed.stderr


def _started_at(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(") ", 1)[1].split()[19]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process start times from /proc")
@pytest.mark.parametrize("holder", ["reused-pid", "running"])
def test_a_lock_left_by_a_killed_install_is_taken_even_when_its_pid_is_in_use(box, server, tmp_path, holder):
    """An install killed with SIGKILL leaves its lock; once its pid belongs to another
    process (after a reboot, in a container) every later install was refused. The lock
    names when its installer started, so only that very process holds it."""
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0").returncode == 0
    other = subprocess.Popen(["sleep", "60"])
    try:
        lock = box.install_dir / ".install-lock"
        lock.mkdir()
        since = "1" if holder == "reused-pid" else _started_at(other.pid)
        (lock / "pid").write_text(f"{other.pid}\n{since}\n")
        proc = box.install("--version", "0.1.0")
    finally:
        other.kill()
        other.wait()
    if holder == "reused-pid":
        assert proc.returncode == 0, stderr(proc)
        assert not lock.exists()
    else:
        assert proc.returncode != 0
        assert f"another cc-lhc install (pid {other.pid}) is running" in stderr(proc)
        assert f"if none is, remove {lock}" in stderr(proc)


def test_a_home_ending_in_a_slash_reinstalls_over_its_own_command_link(box, server, tmp_path):
    """HOME=/x/home/: the installer spelled its folder /x/home//.local/..., and once that
    folder was gone took its own command link for another installation's."""
    server.serve(make_release(tmp_path, "0.1.0"))
    assert box.install("--version", "0.1.0", HOME=f"{box.home}/").returncode == 0
    shutil.rmtree(box.install_dir)
    proc = box.install("--version", "0.1.0", HOME=f"{box.home}/")
    assert proc.returncode == 0, stderr(proc)
    assert box.installed_version() == "0.1.0"


def test_running_a_first_install_again_says_nothing_of_unrecorded_versions(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    for _ in range(2):
        proc = box.install("--version", "0.1.0")
        assert proc.returncode == 0, stderr(proc)
        assert "not recorded" not in stderr(proc)


def test_a_mirror_with_no_bundle_for_this_system_says_so_without_a_version(box, server, tmp_path):
    """A folder of bundles for other systems only: "cannot tell which version" sent the person
    to --version, which only then named the missing build."""
    server.serve(make_release(tmp_path, "0.1.0"))
    fakes = {"uname": 'case "$1" in -s) echo Darwin;; -m) echo arm64;; esac\n', "sysctl": "echo 0\n"}
    path = private_path(tmp_path, [t for t in BASE_TOOLS if t not in fakes] + ["curl", "sha256sum"], fakes)
    proc = box.install(path=path)
    assert proc.returncode != 0 and "holds no cc-lhc for macos-arm64" in stderr(proc), stderr(proc)
    assert not box.install_dir.exists()


@pytest.mark.parametrize("profile", ["~/.profile", "~/.bash_profile"])
def test_a_bash_path_hint_reaches_login_shells_too(box, server, tmp_path, profile):
    """With SHELL=bash the hint added the folder to ~/.bashrc only, which a login bash (a new
    terminal on macOS, a tmux window, ssh) never reads: the command was not found there."""
    server.serve(make_release(tmp_path, "0.1.0"))
    if profile == "~/.bash_profile":
        (box.home / ".bash_profile").write_text("# mine\n")
    proc = box.install("--version", "0.1.0", SHELL="/bin/bash")
    assert proc.returncode == 0, stderr(proc)
    hints = [line.strip() for line in stderr(proc).splitlines() if line.strip().startswith("echo ")]
    assert [h.rsplit(" >> ", 1)[1] for h in hints] == ["~/.bashrc", profile]
    for hint in hints:
        assert subprocess.run(["bash", "-c", hint], env={"HOME": str(box.home), "PATH": "/usr/bin:/bin"},
                              timeout=30).returncode == 0
    login = subprocess.run(["bash", "-l", "-c", "command -v cc-lhc"], capture_output=True, text=True, timeout=30,
                           env={"HOME": str(box.home), "PATH": "/usr/bin:/bin"})
    assert login.stdout.strip() == str(box.bin), login.stderr


def test_folders_that_cannot_be_written_are_named_and_nothing_is_switched(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = box.install("--version", "0.1.0", CC_LHC_INSTALL_DIR=str(blocker / "cc-lhc"))
    assert proc.returncode != 0
    assert f"cannot make {blocker}/cc-lhc/versions" in stderr(proc) and "nothing was changed" in stderr(proc)
    proc = box.install("--version", "0.1.0", CC_LHC_BIN_DIR=str(blocker / "bin"))
    assert proc.returncode != 0 and f"cannot make {blocker}/bin" in stderr(proc), stderr(proc)
    assert "nothing was switched to it" in stderr(proc) and not (box.install_dir / "current").exists()


def test_a_bundle_whose_command_is_not_executable_is_refused_as_that(box, server, tmp_path):
    server.serve(make_release(tmp_path, "0.1.0", mode=0o644))
    proc = box.install("--version", "0.1.0")
    assert proc.returncode != 0 and "as a file that is not executable" in stderr(proc), stderr(proc)
    assert "does not contain" not in stderr(proc) and box.version_dirs() == []
