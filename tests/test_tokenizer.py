"""Exact o200k_base token counts with no network, and honest "approximate" labels when the
shipped data or tiktoken is missing or broken (DESIGN.md; issue 4 "Tokenizer").

Each case runs in a fresh interpreter, because TOKENS loads once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

DATA = REPO / ".cache" / "tokenizer" / "o200k_base.tiktoken"

# Every socket connect fails and every proxy points at a closed port: any download attempt
# (tiktoken's own, or anything else) raises instead of quietly succeeding.
NO_NETWORK = textwrap.dedent("""
    import socket

    def _refuse(*args, **kwargs):
        raise OSError("network disabled by the test")

    socket.socket.connect = _refuse
    socket.socket.connect_ex = _refuse
    socket.create_connection = _refuse
    socket.getaddrinfo = _refuse
""")

REPORT = textwrap.dedent("""
    import json, sys
    {prelude}
    sys.path.insert(0, {repo!r})
    import cc_lhc
    n = cc_lhc.TOKENS.count("hello world")
    report = {{"exact": cc_lhc.TOKENS.exact, "reason": cc_lhc.TOKENS.reason, "hello": n,
               "long": cc_lhc.TOKENS.count("The quick brown fox jumps over the lazy dog. " * 50)}}
    try:
        import tiktoken
        tiktoken.get_encoding("o200k_base")  # tiktoken's own way needs the network
        report["tiktoken_download"] = "worked"
    except Exception as e:
        report["tiktoken_download"] = type(e).__name__
    print(json.dumps(report))
""")


def run_report(tmp_path, env_extra=None, prelude=""):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_NETWORK)
    cache = tmp_path / "empty-tiktoken-cache"
    cache.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CC_LHC_TOKENIZER")}
    env.update({"PYTHONPATH": str(site), "TIKTOKEN_CACHE_DIR": str(cache),
                "DATA_GYM_CACHE_DIR": str(cache), "HTTP_PROXY": "http://127.0.0.1:9",
                "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9",
                "https_proxy": "http://127.0.0.1:9", "NO_PROXY": "", "no_proxy": ""})
    env.update(env_extra or {})
    code = REPORT.format(prelude=prelude, repo=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert os.listdir(tmp_path / "empty-tiktoken-cache") == []  # nothing was fetched or cached
    return json.loads(proc.stdout)


def test_exact_counts_load_with_no_network(tmp_path):
    pytest.importorskip("tiktoken")
    assert DATA.exists(), "run python3 build/tokenizer.py"
    report = run_report(tmp_path)
    assert report["exact"] is True, report["reason"]
    assert report["hello"] == 2
    assert report["long"] == 501  # o200k_base; bytes/4 would say 563
    assert "o200k_base from" in report["reason"]
    # the network really was unreachable: tiktoken's own loader could not fetch the data
    assert report["tiktoken_download"] != "worked"


def test_explicit_data_file_is_used(tmp_path):
    pytest.importorskip("tiktoken")
    copy = tmp_path / "copy.tiktoken"
    copy.write_bytes(DATA.read_bytes())
    report = run_report(tmp_path, {"CC_LHC_TOKENIZER_FILE": str(copy)})
    assert report["exact"] is True and str(copy) in report["reason"] and report["hello"] == 2


def test_corrupted_data_is_approximate_with_a_reason(tmp_path):
    data = bytearray(DATA.read_bytes())
    data[100] ^= 0x01  # one flipped bit: the checksum no longer matches
    bad = tmp_path / "bad.tiktoken"
    bad.write_bytes(bytes(data))
    report = run_report(tmp_path, {"CC_LHC_TOKENIZER_FILE": str(bad)})
    assert report["exact"] is False
    assert "checksum" in report["reason"] and "approximate" in report["reason"]
    assert report["hello"] == (len("hello world") + 3) // 4  # bytes/4, never a crash


def test_truncated_data_is_approximate(tmp_path):
    bad = tmp_path / "short.tiktoken"
    bad.write_bytes(DATA.read_bytes()[:1000])
    report = run_report(tmp_path, {"CC_LHC_TOKENIZER_FILE": str(bad)})
    assert report["exact"] is False and "approximate" in report["reason"]


def test_missing_tiktoken_is_approximate(tmp_path):
    report = run_report(tmp_path, prelude="sys.modules['tiktoken'] = None")
    assert report["exact"] is False
    assert "tiktoken is not installed" in report["reason"]
    assert report["hello"] == 3


def test_missing_data_is_approximate(tmp_path):
    # a copy of the program with no data beside it, and the override naming a missing file
    lonely = tmp_path / "lonely"
    lonely.mkdir()
    (lonely / "cc_lhc.py").write_bytes((REPO / "cc_lhc.py").read_bytes())
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import cc_lhc; "
            "n = cc_lhc.TOKENS.count('hello world'); "
            "print(json.dumps([cc_lhc.TOKENS.exact, cc_lhc.TOKENS.reason, n]))")
    env = dict(os.environ, CC_LHC_TOKENIZER_FILE=str(tmp_path / "missing.tiktoken"))
    proc = subprocess.run([sys.executable, "-c", code, str(lonely)], capture_output=True,
                          text=True, env=env, timeout=60)
    exact, reason, n = json.loads(proc.stdout)
    assert exact is False and "not found" in reason and n == 3
