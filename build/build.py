#!/usr/bin/env python3
"""Build cc-lhc's release assets into dist/.

    python3 build/build.py                 # zipapp + PyInstaller bundle for this machine
    python3 build/build.py --zipapp-only   # just dist/cc-lhc.pyz (seconds)

Outputs (dist/ is ignored by git; nothing else in the tree is written but checksums/):
  cc-lhc.pyz                          zipapp: stamped cc_lhc.py, pexpect + ptyprocess vendored,
                                      the o200k_base data; runs on any Python >= 3.10
  cc-lhc-<ver>-<os>-<arch>.tar.gz     PyInstaller onedir bundle (.zip on Windows), top folder
                                      of the same name holding the `cc-lhc` executable
  cc-lhc-<ver>-<os>-<arch>/           the same bundle unpacked, to run in place (not an asset)
  rollback-unaccepted.py              copied from scripts/ when it exists
  SHA256SUMS                          sha256sum-format list of the assets above
  ../checksums/SHA256SUMS-<ver>       the same list, kept in the repository

Every copy that leaves this script is *stamped*: the one line
`SOURCE_STAMP = None  # build/build.py replaces this line` becomes a literal with the
commit, the dirty flag and the build date, so `--lhc-version` can say what it is without git.

Reproducibility: the zipapp is byte-for-byte reproducible for a given commit and Python
(fixed times, sorted entries, hash-checked .pyc). The bundle is built with PYTHONHASHSEED=0
and SOURCE_DATE_EPOCH = the commit time, and packed with sorted members and fixed
mtime/owner; PyInstaller's own output is as reproducible as PyInstaller makes it.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import py_compile
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _load_sibling(name: str):
    """Import build/<name>.py without writing a __pycache__ into the source tree."""
    spec = importlib.util.spec_from_file_location(f"cc_lhc_build_{name}", Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    saved, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = saved
    return module


tokenizer = _load_sibling("tokenizer")

STAMP_LINE = "SOURCE_STAMP = None  # build/build.py replaces this line"
DATA_DIR = "cc_lhc_data"
TOKENIZER_NAME = "o200k_base.tiktoken"
INDEX_NAME = "o200k_base.index"  # the rank file as cc-lhc reads it (cc_lhc.VOCAB_INDEX_FILE_NAME)
ZIPAPP_NAME = "cc-lhc.pyz"
ROLLBACK_SCRIPT = "rollback-unaccepted.py"
VENDORED = ("pexpect", "ptyprocess")  # pure Python, carried inside the zipapp
ZIP_EPOCH_MIN = 315532800  # 1980-01-01: zip cannot store earlier times

ZIPAPP_MAIN = '''\
# cc-lhc zipapp entry point (written by build/build.py).
import sys

if sys.version_info < (3, 10):
    sys.exit("cc-lhc needs Python 3.10 or newer (this is %d.%d)" % sys.version_info[:2])

import cc_lhc

cc_lhc.cli()
'''

BUNDLE_ENTRY = '''\
# cc-lhc bundle entry point (written by build/build.py).
import cc_lhc

cc_lhc.cli()
'''


class BuildError(Exception):
    pass


def log(msg: str) -> None:
    print(f"build: {msg}", file=sys.stderr, flush=True)


# == Source identity ==========================================================

def git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def source_identity(source: Path) -> dict:
    """Commit, dirty flag and build date for the copy we are about to package.

    The source counts as dirty when the tree has uncommitted changes to tracked files,
    or when the file being packaged is not byte-identical to the committed cc_lhc.py.
    """
    commit = git("rev-parse", "HEAD") or "unknown"
    dirty = True
    if commit != "unknown":
        tree_clean = git("status", "--porcelain", "--untracked-files=no") == ""
        committed = git("show", "HEAD:cc_lhc.py")
        dirty = not (tree_clean and committed is not None
                     and committed == source.read_text(encoding="utf-8").rstrip("\n"))
    return {"commit": commit, "dirty": dirty, "build_date": iso_utc(build_epoch(commit, dirty))}


def build_epoch(commit: str, dirty: bool) -> int:
    """SOURCE_DATE_EPOCH if given; else the commit time for a clean tree; else now."""
    if os.environ.get("SOURCE_DATE_EPOCH", "").isdigit():
        return int(os.environ["SOURCE_DATE_EPOCH"])
    if commit != "unknown" and not dirty:
        when = git("log", "-1", "--format=%ct", commit)
        if when and when.isdigit():
            return int(when)
    return int(time.time())


def iso_utc(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def epoch_of(iso: str) -> int:
    return int(datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ")
               .replace(tzinfo=datetime.timezone.utc).timestamp())


def read_version(text: str) -> str:
    match = re.search(r'^VERSION = "(\d+\.\d+\.\d+[0-9A-Za-z.+-]*)"$', text, re.M)
    if not match:
        raise BuildError('cc_lhc.py has no `VERSION = "x.y.z"` line')
    return match.group(1)


def stamp_source(text: str, identity: dict) -> str:
    """Replace the single SOURCE_STAMP placeholder line with the identity literal."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == STAMP_LINE]
    if len(hits) != 1:
        raise BuildError(f"cc_lhc.py must contain exactly one line {STAMP_LINE!r} (found {len(hits)})")
    literal = "{%s: %s, %s: %s, %s: %s}" % (
        json.dumps("commit"), json.dumps(identity["commit"]),
        json.dumps("dirty"), "True" if identity["dirty"] else "False",
        json.dumps("build_date"), json.dumps(identity["build_date"]),
    )
    lines[hits[0]] = f"SOURCE_STAMP = {literal}  # stamped by build/build.py\n"
    return "".join(lines)


# == Target naming ============================================================

def host_target() -> tuple[str, str]:
    """(os, arch) of the Python running this build, in release-asset spelling."""
    os_name = {"linux": "linux", "darwin": "macos", "win32": "windows"}.get(sys.platform)
    if os_name is None:
        raise BuildError(f"unsupported build platform {sys.platform}")
    # On Windows, platform.machine() reports the emulated arch for an x64 Python on
    # ARM64; the interpreter's own platform tag says what PyInstaller will produce.
    machine = sysconfig.get_platform().rsplit("-", 1)[-1] if os_name == "windows" else platform.machine()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(machine.lower())
    if arch is None:
        raise BuildError(f"unsupported build architecture {machine}")
    return os_name, arch


def bundle_basename(version: str, os_name: str, arch: str) -> str:
    return f"cc-lhc-{version}-{os_name}-{arch}"


# == Deterministic archives ===================================================

def zip_time(epoch: int) -> tuple:
    return time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]


def add_zip_bytes(zf: zipfile.ZipFile, name: str, data: bytes, epoch: int, mode: int = 0o644,
                  stored: bool = False) -> None:
    info = zipfile.ZipInfo(name, zip_time(epoch))
    info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    info.external_attr = (0o100000 | mode) << 16
    info.create_system = 3  # unix, so the mode bits above are honoured by unzip
    zf.writestr(info, data, compresslevel=9)


def write_tar_gz(src_dir: Path, arc_root: str, out: Path, epoch: int) -> None:
    """tar.gz of src_dir under arc_root/, sorted, owner 0:0, fixed mtime, no gzip name/time."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in [src_dir, *sorted(src_dir.rglob("*"), key=lambda p: p.relative_to(src_dir).as_posix())]:
            rel = path.relative_to(src_dir).as_posix()
            info = tar.gettarinfo(str(path), arcname=arc_root if rel == "." else f"{arc_root}/{rel}")
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = epoch
            if info.isdir():
                info.mode = 0o755
            elif info.isreg():
                info.mode = 0o755 if path.stat().st_mode & 0o111 else 0o644
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    with open(out, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=epoch,
                                             compresslevel=9) as gz:
        gz.write(raw.getvalue())


def write_zip_tree(src_dir: Path, arc_root: str, out: Path, epoch: int) -> None:
    with zipfile.ZipFile(out, "w") as zf:
        for path in sorted(src_dir.rglob("*"), key=lambda p: p.relative_to(src_dir).as_posix()):
            if path.is_file():
                mode = 0o755 if path.stat().st_mode & 0o111 or path.suffix == ".exe" else 0o644
                add_zip_bytes(zf, f"{arc_root}/{path.relative_to(src_dir).as_posix()}", path.read_bytes(),
                              epoch, mode)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(paths: list[Path], out: Path) -> str:
    text = "".join(f"{sha256_file(p)}  {p.name}\n" for p in sorted(paths, key=lambda p: p.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return text


# == Zipapp ===================================================================

def package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise BuildError(f"{name} is not installed: `python3 -m pip install -r requirements-build.txt`")
    return Path(list(spec.submodule_search_locations)[0])


def license_text(dist_name: str) -> bytes | None:
    try:
        dist = importlib.metadata.distribution(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if f.name.upper().startswith(("LICENSE", "COPYING")):
            return Path(dist.locate_file(f)).read_bytes()
    return None


def compiled(source: bytes, name: str) -> bytes:
    """A hash-based .pyc for the building Python: no mtime inside, so reproducible;
    zipimport uses it when the versions match and falls back to the .py otherwise.
    Unchecked: the archive never changes once built, so each start need not read the
    source again to hash it (with the modules stored uncompressed, 10-15 ms a start)."""
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp, "m.py"), Path(tmp, "m.pyc")
        src.write_bytes(source)
        py_compile.compile(str(src), cfile=str(dst), dfile=name, doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
        return dst.read_bytes()


def build_zipapp(stamped: str, tokenizer_file: Path, out: Path, epoch: int) -> None:
    files: dict[str, bytes] = {"__main__.py": ZIPAPP_MAIN.encode(), "cc_lhc.py": stamped.encode("utf-8")}
    for name in VENDORED:
        root = package_dir(name)
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root.parent).as_posix()
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                files[rel] = path.read_bytes()
        lic = license_text(name)
        if lic:
            files[f"{DATA_DIR}/licenses/{name}.LICENSE"] = lic
    for name in [n for n in files if n.endswith(".py")]:
        files[name[:-3] + ".pyc"] = compiled(files[name], name)
    files[f"{DATA_DIR}/{TOKENIZER_NAME}"] = tokenizer_file.read_bytes()
    files[f"{DATA_DIR}/{INDEX_NAME}"] = tokenizer.vocab_index_bytes(tokenizer_file)

    tmp = out.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(b"#!/usr/bin/env python3\n")
        with zipfile.ZipFile(f, "w") as zf:
            for name in sorted(files):
                # code stored as it is: zipimport then reads it without inflating it first
                # (and the vocabulary index, which each count reads whole: inflating it costs more)
                add_zip_bytes(zf, name, files[name], epoch, stored=name.endswith((".py", ".pyc", INDEX_NAME)))
    os.chmod(tmp, 0o755)
    os.replace(tmp, out)


# == PyInstaller bundle =======================================================

def requirement_pins() -> dict[str, str]:
    pins = {}
    req = REPO / "requirements-build.txt"
    for line in req.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


def ensure_pyinstaller() -> None:
    pins = requirement_pins()
    want = pins["pyinstaller"]
    try:
        have = importlib.metadata.version("pyinstaller")
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have == want:
        return
    log(f"installing pyinstaller=={want} (found {have or 'none'})")
    specs = [f"{n}=={pins[n]}" for n in ("pyinstaller", "pyinstaller-hooks-contrib", "altgraph") if n in pins]
    subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *specs], check=True)


def hidden_imports(os_name: str, without: set[str]) -> list[str]:
    wanted = ["psutil"]
    if "tiktoken" not in without:
        wanted += ["tiktoken", "tiktoken_ext", "tiktoken_ext.openai_public"]
    wanted += ["winpty"] if os_name == "windows" else ["ptyprocess", "pexpect"]
    missing = [m for m in wanted if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        raise BuildError(f"not installed for the bundle: {', '.join(missing)} "
                         "(`python3 -m pip install -r requirements-build.txt`, or --without NAME)")
    return wanted


# Standard modules the bundle leaves out (see build_bundle).
BUNDLE_LEAVES_OUT = ("inspect", "multiprocessing")


def build_bundle(stamped: str, tokenizer_file: Path | None, version: str, os_name: str, arch: str,
                 dist: Path, work: Path, epoch: int, without: set[str]) -> Path:
    ensure_pyinstaller()
    src = work / "src"
    src.mkdir(parents=True)
    (src / "cc_lhc.py").write_text(stamped, encoding="utf-8")
    entry = src / "cc_lhc_entry.py"
    entry.write_text(BUNDLE_ENTRY, encoding="utf-8")

    sep = ";" if os_name == "windows" else ":"
    args = [
        sys.executable, "-m", "PyInstaller", "--noconfirm", "--clean", "--onedir", "--console",
        "--name", "cc-lhc", "--log-level", "WARN", "--noupx",
        # Modules as loose .pyc files, not in a zlib-compressed archive inside the
        # executable: every command starts about 20 ms (a fifth) sooner, measured with
        # `--lhc-version` and `measure`, and the .tar.gz comes out no bigger.
        "--debug", "noarchive",
        "--distpath", str(work / "dist"), "--workpath", str(work / "build"), "--specpath", str(work),
        "--paths", str(src),
    ]
    for module in hidden_imports(os_name, without):
        args += ["--hidden-import", module]
    # tiktoken only reaches for requests/blobfile when downloading (the bundle never does)
    # and for numpy in encode_to_numpy (unused); numpy would drag in ~60 MB more.
    # inspect and multiprocessing are never imported by cc-lhc or what it runs (only by
    # code paths it does not take: asyncio, dataclasses, pkgutil.iter_modules, psutil's
    # PSUTIL_DEBUG output); bundled, each brings a runtime hook that imports it, with ast,
    # dis, pickle, socket and more, before every command: about 27 ms of an 80 ms start.
    # tests/test_build.py fails if cc-lhc's own imports ever reach for them.
    excluded = ["requests", "blobfile", "numpy", "yaml", "charset_normalizer", "tiktoken._educational",
                "tkinter", *BUNDLE_LEAVES_OUT, *sorted(without)]
    for module in excluded:
        args += ["--exclude-module", module]
    if os_name == "linux":
        args.append("--strip")  # debug symbols are most of libpython's 22 MB
    if tokenizer_file is not None:
        index = work / INDEX_NAME
        index.write_bytes(tokenizer.vocab_index_bytes(tokenizer_file))
        args += ["--add-data", f"{Path(tokenizer_file).resolve()}{sep}{DATA_DIR}",
                 "--add-data", f"{index.resolve()}{sep}{DATA_DIR}"]
    args.append(str(entry))

    env = dict(os.environ, PYTHONHASHSEED="0", SOURCE_DATE_EPOCH=str(epoch))
    started = time.monotonic()
    proc = subprocess.run(args, cwd=work, env=env)
    if proc.returncode != 0:
        raise BuildError(f"PyInstaller failed (exit {proc.returncode})")
    log(f"PyInstaller finished in {time.monotonic() - started:.0f}s")

    name = bundle_basename(version, os_name, arch)
    tree = work / "dist" / "cc-lhc"
    smoke_test(tree / ("cc-lhc.exe" if os_name == "windows" else "cc-lhc"), stamped)
    if os_name == "windows":
        out = dist / f"{name}.zip"
        write_zip_tree(tree, name, out, epoch)
    else:
        out = dist / f"{name}.tar.gz"
        write_tar_gz(tree, name, out, epoch)
    # Also leave the unpacked bundle in dist/<name>/, to run and benchmark in place.
    shutil.move(str(tree), str(dist / name))
    return out


def smoke_test(exe: Path, stamped: str) -> None:
    """The fresh bundle must start and report the stamped identity."""
    commit = re.search(r'"commit": "([^"]*)"', stamped).group(1)
    proc = subprocess.run([str(exe), "--lhc-version"], capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0 or commit[:12] not in out:
        raise BuildError(f"bundle smoke test failed (exit {proc.returncode}): {out.strip()}")
    log(f"bundle says: {proc.stdout.strip()}")


# == Main =====================================================================

def release_assets(dist: Path, version: str) -> list[Path]:
    """What SHA256SUMS lists: this version's bundles, the zipapp, the rollback script."""
    assets = [p for p in dist.glob(f"cc-lhc-{version}-*") if p.name.endswith((".tar.gz", ".zip"))]
    assets += [p for p in (dist / ZIPAPP_NAME, dist / ROLLBACK_SCRIPT) if p.exists()]
    return assets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build cc-lhc's zipapp and host bundle into dist/.")
    parser.add_argument("--zipapp-only", action="store_true", help="build only dist/cc-lhc.pyz")
    parser.add_argument("--source", type=Path, default=REPO / "cc_lhc.py", help="program file to package")
    parser.add_argument("--dist", type=Path, default=REPO / "dist", help="output folder (default dist/)")
    parser.add_argument("--checksums-dir", type=Path, default=REPO / "checksums",
                        help="where SHA256SUMS-<version> is kept (default checksums/)")
    parser.add_argument("--tokenizer", type=Path,
                        help="use this o200k_base.tiktoken (default: make .cache/tokenizer/ via build/tokenizer.py)")
    parser.add_argument("--without", action="append", default=[], choices=["tiktoken"],
                        help="leave an optional compiled dependency out of the bundle (counts become approximate)")
    parser.add_argument("--keep-work", action="store_true", help="keep the temporary work folder")
    args = parser.parse_args(argv)
    without = set(args.without)

    try:
        source = args.source.resolve()
        if not source.is_file():
            raise BuildError(f"{source} does not exist")
        text = source.read_text(encoding="utf-8")
        version = read_version(text)
        identity = source_identity(source)
        stamped = stamp_source(text, identity)
        epoch = epoch_of(identity["build_date"])
        log(f"cc-lhc {version}, commit {identity['commit'][:12]}"
            f"{' (dirty)' if identity['dirty'] else ''}, build date {identity['build_date']}")

        if args.tokenizer:
            tokenizer_file = args.tokenizer.resolve()
            if tokenizer.sha256_hex(tokenizer_file.read_bytes()) != tokenizer.O200K_SHA256:
                raise BuildError(f"{tokenizer_file} is not the verified o200k_base file")
        else:
            tokenizer_file = tokenizer.ensure_tokenizer()

        dist = args.dist.resolve()
        dist.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        build_zipapp(stamped, tokenizer_file, dist / ZIPAPP_NAME, epoch)
        log(f"wrote {dist / ZIPAPP_NAME} ({(dist / ZIPAPP_NAME).stat().st_size} bytes, "
            f"{time.monotonic() - started:.1f}s)")

        if not args.zipapp_only:
            os_name, arch = host_target()
            for old in dist.glob(f"cc-lhc-*-{os_name}-{arch}*"):
                # one bundle per target in dist/ (the archive and its unpacked folder)
                if old.is_dir() and not old.is_symlink():
                    shutil.rmtree(old)
                else:
                    old.unlink()
            work = Path(tempfile.mkdtemp(prefix="cc-lhc-build-"))
            try:
                bundle = build_bundle(stamped, None if "tiktoken" in without else tokenizer_file,
                                      version, os_name, arch, dist, work, epoch, without)
            finally:
                if args.keep_work:
                    log(f"work folder kept: {work}")
                else:
                    shutil.rmtree(work, ignore_errors=True)
            log(f"wrote {bundle} ({bundle.stat().st_size} bytes)")

        rollback = REPO / "scripts" / ROLLBACK_SCRIPT
        if rollback.is_file():
            shutil.copyfile(rollback, dist / ROLLBACK_SCRIPT)

        assets = release_assets(dist, version)
        sums = write_sums(assets, dist / "SHA256SUMS")
        checksums = args.checksums_dir.resolve()
        checksums.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dist / "SHA256SUMS", checksums / f"SHA256SUMS-{version}")
        sys.stdout.write(sums)
    except (BuildError, tokenizer.TokenizerError, subprocess.CalledProcessError) as exc:
        log(f"error: {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
