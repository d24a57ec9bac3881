#!/usr/bin/env python3
"""Finish a release folder: embed checksums in the installers and write SHA256SUMS.

    python3 build/release.py --assets DIR --version X.Y.Z --repo OWNER/NAME

DIR holds what the build jobs produced: the bundles (cc-lhc-X.Y.Z-<os>-<arch>.tar.gz /
.zip), cc-lhc.pyz and rollback-unaccepted.py. This script

  1. computes the SHA-256 of each of those assets;
  2. writes DIR/install.sh and DIR/install.ps1 from the repository's copies with the
     release block filled in (version, repository, those checksums), so an installer
     fetched from the release refuses a bundle that a mirror swapped together with
     its SHA256SUMS;
  3. writes DIR/SHA256SUMS over every asset, installers included, and the same list to
     checksums/SHA256SUMS-X.Y.Z.

Run by the release workflow's publish job; also usable locally on a dist/ folder.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BEGIN, END = "# BEGIN CC_LHC_RELEASE", "# END CC_LHC_RELEASE"
SAFE_NAME = re.compile(r"^[A-Za-z0-9._+-]+$")
SAFE_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
SAFE_VERSION = re.compile(r"^\d+\.\d+\.\d+[0-9A-Za-z.+-]*$")


class ReleaseError(Exception):
    pass


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def payload_assets(assets: Path, version: str) -> list[Path]:
    bundles = sorted(p for p in assets.glob(f"cc-lhc-{version}-*") if p.name.endswith((".tar.gz", ".zip")))
    if not bundles:
        raise ReleaseError(f"{assets} holds no cc-lhc-{version}-<os>-<arch> bundle")
    extras = [p for p in (assets / "cc-lhc.pyz", assets / "rollback-unaccepted.py") if p.is_file()]
    return bundles + extras


def sums_of(paths: list[Path]) -> list[tuple[str, str]]:
    rows = []
    for path in sorted(paths, key=lambda p: p.name):
        if not SAFE_NAME.match(path.name):
            raise ReleaseError(f"unsafe asset name {path.name!r}")
        rows.append((sha256_file(path), path.name))
    return rows


def replace_block(text: str, block: str, what: str) -> str:
    lines = text.splitlines(keepends=True)
    starts = [i for i, line in enumerate(lines) if line.strip() == BEGIN or line.strip().startswith(BEGIN + " ")]
    ends = [i for i, line in enumerate(lines) if line.strip() == END]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ReleaseError(f"{what}: expected one {BEGIN} … {END} block")
    indent = lines[starts[0]][: len(lines[starts[0]]) - len(lines[starts[0]].lstrip())]
    body = "".join(indent + line + "\n" if line else "\n" for line in block.splitlines())
    return "".join(lines[: starts[0] + 1]) + body + "".join(lines[ends[0]:])


def fill_install_sh(text: str, version: str, repo: str, sums: list[tuple[str, str]]) -> str:
    listing = "".join(f"{digest}  {name}\n" for digest, name in sums)
    block = (f'RELEASE_VERSION="{version}"\n'
             f'RELEASE_REPO="{repo}"\n'
             f'RELEASE_SUMS="\\\n{listing}"')
    return replace_block(text, block, "install.sh")


def fill_install_ps1(text: str, version: str, repo: str, sums: list[tuple[str, str]]) -> str:
    entries = "".join(f"    '{name}' = '{digest}'\n" for digest, name in sums)
    block = (f"$ReleaseVersion = '{version}'\n"
             f"$ReleaseRepo = '{repo}'\n"
             f"$ReleaseSums = @{{\n{entries}}}")
    return replace_block(text, block, "install.ps1")


def check_inputs(version: str, repo: str) -> None:
    if not SAFE_VERSION.match(version):
        raise ReleaseError(f"not a version: {version!r}")
    if not SAFE_REPO.match(repo):
        raise ReleaseError(f"not a GitHub owner/name: {repo!r}")


def finish_release(assets: Path, version: str, repo: str, checksums_dir: Path | None,
                   source: Path = REPO) -> str:
    check_inputs(version, repo)
    sums = sums_of(payload_assets(assets, version))
    sh = assets / "install.sh"
    sh.write_text(fill_install_sh((source / "install.sh").read_text(encoding="utf-8"), version, repo, sums),
                  encoding="utf-8")
    sh.chmod(0o755)
    ps1 = assets / "install.ps1"
    ps1.write_text(fill_install_ps1((source / "install.ps1").read_text(encoding="utf-8"), version, repo, sums),
                   encoding="utf-8")
    listing = "".join(f"{d}  {n}\n" for d, n in sums_of(payload_assets(assets, version) + [sh, ps1]))
    (assets / "SHA256SUMS").write_text(listing, encoding="utf-8")
    if checksums_dir is not None:
        checksums_dir.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(assets / "SHA256SUMS", checksums_dir / f"SHA256SUMS-{version}")
    return listing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Embed checksums in the installers and write SHA256SUMS.")
    parser.add_argument("--assets", type=Path, required=True, help="folder with the release assets")
    parser.add_argument("--version", required=True)
    parser.add_argument("--repo", required=True, help="GitHub owner/name the installers download from")
    parser.add_argument("--checksums-dir", type=Path, default=REPO / "checksums")
    args = parser.parse_args(argv)
    try:
        sys.stdout.write(finish_release(args.assets, args.version, args.repo, args.checksums_dir))
    except (ReleaseError, OSError) as exc:
        print(f"release: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
