"""The built artifacts, as a user gets them, driving the real Claude Code CLI.

Builds the zipapp and this machine's PyInstaller bundle once (into a temporary dist
folder), then checks each one the way the release promises: the stamped identity, a
real one-shot through the real CLI against the fake API, and exact o200k_base counts
with the network unreachable.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "build"))
import build as BUILD  # noqa: E402

SAMPLE = REPO / "tests" / "fixtures" / "samples" / "02_tool_roundtrip_thinking.jsonl"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    if shutil.which("npm") is None:
        pytest.skip("npm is needed for the tokenizer data")
    dist = tmp_path_factory.mktemp("dist")
    sums = tmp_path_factory.mktemp("checksums")
    home = tmp_path_factory.mktemp("build-home")
    # A module fixture runs outside the per-test isolation: give the build its own home,
    # so PyInstaller's cache and npm's never touch the developer's.
    env = dict(os.environ, HOME=str(home), PYINSTALLER_CONFIG_DIR=str(home / "pyinstaller"),
               XDG_CACHE_HOME=str(home / "cache"))
    proc = subprocess.run([sys.executable, str(REPO / "build" / "build.py"), "--dist", str(dist),
                           "--checksums-dir", str(sums)], capture_output=True, text=True, timeout=900,
                          env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    os_name, arch = BUILD.host_target()
    exe = next(dist.glob(f"cc-lhc-*-{os_name}-{arch}/cc-lhc"))
    return {"pyz": [sys.executable, str(dist / "cc-lhc.pyz")], "bundle": [str(exe)], "dist": dist}


def _flavours():
    return ["pyz", "bundle"]


@pytest.mark.parametrize("flavour", _flavours())
def test_artifact_reports_its_stamped_identity(artifacts, flavour):
    out = subprocess.run(artifacts[flavour] + ["--lhc-version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    assert "stamped" in out.stdout and commit[:12] in out.stdout


@pytest.mark.parametrize("flavour", _flavours())
def test_artifact_runs_a_real_oneshot(artifacts, flavour, real_claude):
    real_claude.api.script(["answer from the fake API through the artifact"])
    proc = real_claude.run(artifacts[flavour] + ["-p", "hello", "--output-format", "json"])
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["result"] == "answer from the fake API through the artifact"
    threads = real_claude.run(artifacts[flavour] + ["threads", "--json"])
    (thread,) = json.loads(threads.stdout)
    assert thread["messages"] == 2 and not thread["degraded"]


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) to cut the network")
@pytest.mark.parametrize("flavour", _flavours())
def test_artifact_counts_exactly_with_no_network(artifacts, flavour, tmp_path):
    probe = subprocess.run(["unshare", "-rn", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this machine does not allow a private network namespace")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CC_LHC_TOKENIZER", "TIKTOKEN"))}
    env["TIKTOKEN_CACHE_DIR"] = str(tmp_path / "empty-cache")
    proc = subprocess.run(["unshare", "-rn"] + artifacts[flavour] + ["measure", str(SAMPLE), "--json"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["sessions"][0]["exact"] is True
    assert report["sessions"][0]["counting"] == "exact o200k_base"
    # the vocabulary index it carries beside its rank file was read: none was made and kept
    cache = Path(os.environ["CC_LHC_HOME"]) / "cache"
    assert cache.is_dir() and not list(cache.glob("*index*"))


@pytest.mark.parametrize("flavour", _flavours())
def test_plain_cc_lhc_in_claudes_bash_is_the_artifact_itself(artifacts, flavour, real_claude):
    # The view tells the model to run `cc-lhc get-messages`; whichever way cc-lhc was
    # installed, that command must reach this same program and its descriptor.
    from fakeapi import tool_results, tool_use_reply
    real_claude.api.script(["the secret is 4242"])
    first = real_claude.run(artifacts[flavour] + ["-p", "remember this", "--output-format", "json"])
    assert first.returncode == 0, first.stderr
    session = json.loads(first.stdout)["session_id"]
    real_claude.api.script([tool_use_reply("Bash", {"command": "cc-lhc get-messages m2 && cc-lhc --lhc-version",
                                                    "description": "read back"}), "done"])
    proc = real_claude.run(artifacts[flavour] + ["--resume", session, "-p", "what was it?",
                                                 "--allowedTools", "Bash"])
    assert proc.returncode == 0, proc.stderr
    (result,) = tool_results(real_claude.api.message_requests[-1]["body"])
    text = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert "the secret is 4242" in text and "stamped" in text
