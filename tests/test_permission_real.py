"""Retrieval runs without a permission prompt in Claude's default permission mode, and
nothing else does: typed as a person would, in tmux, with the real Claude Code CLI.

Measured with the pinned CLI (2.1.328, `-p --permission-mode default`): with cc-lhc's
`--allowedTools=Bash(cc-lhc get-turns:*)` (and get-messages, search) rules, those commands
run; `cc-lhc export ...`, `cc-lhc get-turnsX`, `FOO=1 cc-lhc get-turns t1` and
`./cc-lhc get-turns t1` still ask; a compound line asks for its other part
(`cc-lhc get-turns t1; rm -rf x`, `&& touch x`, `| sh`, a second line), and `$(...)` or
backquotes ask for the whole line. A user's own --allowedTools or --settings allow rules
apply next to them (either order), and a user's deny rule for `cc-lhc search` wins.
"""

from __future__ import annotations

import json
import sys

from fakeapi import block_text, text_reply, tool_results, tool_use_reply
from realcli import CC_LHC, PROMPT, exit_cleanly, type_line

APPROVAL = "Do you want to proceed?"


def test_retrieval_runs_unprompted_and_other_commands_still_ask(real_claude, tmux):
    real_claude.api.script([
        "first answer",
        tool_use_reply("Bash", {"command": "cc-lhc get-turns t1", "description": "read back"}),
        text_reply("read it back"),
        tool_use_reply("Bash", {"command": "cc-lhc get-turns t1; touch made-by-claude",
                                "description": "read back, then write"}),
        text_reply("after the refusal"),
    ])
    # This CLI starts interactive sessions in its "auto" mode unless told otherwise; the
    # mode that asks a person is "default".
    t = tmux([sys.executable, CC_LHC, "--permission-mode", "default"], cols=110, rows=32, env=real_claude.env, cwd=real_claude.cwd)
    t.wait_for(PROMPT)
    type_line(t, "the secret word is heliotrope")
    t.wait_for("first answer")
    type_line(t, "read your first turn back")
    t.wait_for("read it back")
    assert APPROVAL not in t.capture(history=True)
    # the retrieval's output reached the API as the tool result
    (result,) = tool_results(real_claude.api.message_requests[2]["body"])
    assert "the secret word is heliotrope" in block_text(result) and "=== t1 " in block_text(result)

    type_line(t, "now read it and write a file")
    screen = t.wait_for(APPROVAL)  # the part that is not retrieval asks
    assert "touch made-by-claude" in screen
    t.send_keys("Escape")
    t.wait_for(PROMPT)
    exit_cleanly(t)
    assert not (real_claude.cwd / "made-by-claude").exists()


def _bash_result(rc, command: str, *args: str) -> str:
    """Run one `cc-lhc -p` whose model runs `command` through Bash; the tool result."""
    rc.api.script([tool_use_reply("Bash", {"command": command, "description": "x"}), "done"])
    seen = len(rc.api.message_requests)
    p = rc.run([sys.executable, CC_LHC, *args, "-p", "go", "--permission-mode", "default"])
    assert p.returncode == 0, p.stderr
    (result,) = [b for r in rc.api.message_requests[seen:] for b in tool_results(r["body"])]
    return block_text(result)


def test_the_users_own_permission_rules_still_apply_beside_cc_lhcs(real_claude):
    touch = json.dumps({"permissions": {"allow": ["Bash(touch:*)"]}})
    assert "requires approval" not in _bash_result(real_claude, "cc-lhc search heliotrope")
    # a user's allow rule, given either way, still allows what it names
    _bash_result(real_claude, "touch by-flag", "--allowedTools", "Bash(touch:*)")
    _bash_result(real_claude, "touch by-settings", "--settings", touch)
    assert (real_claude.cwd / "by-flag").exists() and (real_claude.cwd / "by-settings").exists()
    # a user's deny rule wins over cc-lhc's allow rule
    denied = _bash_result(real_claude, "cc-lhc search heliotrope",
                          "--disallowedTools", "Bash(cc-lhc search:*)")
    assert "denied" in denied
    # nothing else rides on the retrieval rule
    for command in ("cc-lhc get-turns t1; touch chained", "cc-lhc get-turns $(touch nested)",
                    "cc-lhc export all"):
        refused = _bash_result(real_claude, command)
        assert "approval" in refused or "can't be checked" in refused, (command, refused)
    assert not (real_claude.cwd / "chained").exists() and not (real_claude.cwd / "nested").exists()
