"""Launch edge cases: forks, reused session ids, ownership during rollout write, broken
state, a vanished working folder, and a project that shadows the standard library."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import cc_lhc
from conftest import CC_LHC
from fakeapi import tool_results, tool_use_reply


def lhc(rc, *args, **kw):
    return rc.run([sys.executable, CC_LHC, *args], **kw)


def first_session(rc, prompt="the original topic", reply="noted") -> str:
    rc.api.script([reply])
    p = lhc(rc, "-p", prompt, "--output-format", "json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)["session_id"]


def threads(rc) -> list[dict]:
    return json.loads(lhc(rc, "threads", "--json").stdout)


def test_fork_session_becomes_a_thread_of_its_own(real_claude):
    source = first_session(real_claude)
    real_claude.api.script(["forked reply"])
    p = lhc(real_claude, "--resume", source, "--fork-session", "-p", "in the fork",
            "--output-format", "json")
    assert p.returncode == 0, p.stderr
    fork = json.loads(p.stdout)["session_id"]
    assert fork != source and real_claude.api.message_requests[-1]["session_id"] == fork
    by_session = {t["current_session"]: t for t in threads(real_claude)}
    assert set(by_session) == {source, fork}
    assert by_session[source]["messages"] == 2  # the source thread is untouched
    export = json.loads(lhc(real_claude, "export", by_session[fork]["id"]).stdout)
    texts = [m.get("text") for m in export]
    assert texts[:2] == ["the original topic", "noted"] and texts[-2:] == ["in the fork", "forked reply"]


def test_reusing_a_known_session_id_is_a_clear_refusal(real_claude):
    sid = first_session(real_claude)
    p = lhc(real_claude, "--session-id", sid, "-p", "again")
    assert p.returncode == 2 and f"--resume {sid}" in p.stderr and "Traceback" not in p.stderr


def test_rollout_write_waits_for_no_one_while_a_session_owns_the_thread(real_claude):
    sid = first_session(real_claude)
    (thread,) = threads(real_claude)
    home = cc_lhc.StateHome(real_claude.env["CC_LHC_HOME"])
    lease = cc_lhc.Lease(home, thread["id"])
    lease.acquire()  # as a live cc-lhc session would hold it
    try:
        p = lhc(real_claude, "rollout", "write", "--thread-id", thread["id"][:8],
                "--session-id", str(uuid.uuid4()))
    finally:
        lease.release()
    assert p.returncode == 2 and "already in use" in p.stderr
    assert threads(real_claude)[0]["current_session"] == sid


def test_a_corrupt_registry_is_named_not_a_traceback(iso_env):
    (iso_env.lhc / "registry.sqlite").write_bytes(b"this is not a database" * 100)
    p = subprocess.run([sys.executable, CC_LHC, "threads"], env=iso_env.env, capture_output=True,
                       text=True, cwd=iso_env.work)
    assert p.returncode == 1 and "registry.sqlite" in p.stderr and "Traceback" not in p.stderr


def test_launch_from_a_folder_that_was_removed(iso_env, tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    p = subprocess.run(f"cd {gone} && rmdir {gone} && {sys.executable} {CC_LHC} -p hi",
                       shell=True, env=iso_env.env, capture_output=True, text=True)
    assert p.returncode == 2 and "no longer exists" in p.stderr and "Traceback" not in p.stderr


def test_a_project_json_py_does_not_shadow_retrieval(real_claude):
    # Claude's Bash runs in the user's project; a json.py there must not reach cc-lhc.
    (real_claude.cwd / "json.py").write_text("raise SystemExit('shadowed the standard library')\n")
    sid = first_session(real_claude, "remember 9917", "remembered")
    real_claude.api.script([tool_use_reply("Bash", {"command": "cc-lhc get-messages m1",
                                                    "description": "read back"}), "done"])
    p = lhc(real_claude, "--resume", sid, "-p", "what was it?", "--allowedTools", "Bash")
    assert p.returncode == 0, p.stderr
    (result,) = tool_results(real_claude.api.message_requests[-1]["body"])
    content = result["content"] if isinstance(result["content"], str) else json.dumps(result["content"])
    assert "remember 9917" in content and "shadowed" not in content
