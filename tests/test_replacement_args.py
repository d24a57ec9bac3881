"""What a wrapper-owned replacement child inherits from the launch's argv (pure)."""

from __future__ import annotations

import pytest

import cc_lhc


@pytest.mark.parametrize("argv, kept, left_out", [
    # the launch's prompt never runs again, whatever form it took
    (["fix the bug"], [], []),
    (["--model", "opus", "fix the bug"], ["--model", "opus"], []),
    (["--model", "opus", "--", "--looks-like-a-flag"], ["--model", "opus"], []),
    # no form of print mode is inherited: a print child would exit at once
    (["-p", "hi"], [], []),
    (["--print", "hi"], [], []),
    (["-p=yes", "hi"], [], []),
    (["--print=yes", "--model", "m"], ["--model", "m"], []),
    # session selectors belong to the launch, not the replacement
    (["--resume", "6f3c1a8e-1111-4222-8333-444455556666", "--effort", "high"], ["--effort", "high"], []),
    (["-r", "search term"], [], []),
    (["--resume"], [], []),
    (["-c", "--verbose"], ["--verbose"], []),
    (["--session-id", "6f3c1a8e-1111-4222-8333-444455556666"], [], []),
    (["--fork-session", "--verbose"], ["--verbose"], []),
    # value options keep their value; flags carry as they are
    (["--permission-mode", "plan", "--dangerously-skip-permissions"],
     ["--permission-mode", "plan", "--dangerously-skip-permissions"], []),
    (["--autocompact", "auto"], ["--autocompact", "auto"], []),
    # optional-value options in space form: the value boundary is unknown
    (["--debug", "api"], [], ["--debug", "api"]),
    (["--debug", "--verbose"], ["--verbose"], ["--debug"]),
    # a variadic option took every argument up to the next option: each carries in =form,
    # so nothing after it in the replacement's argv can become one of its values
    (["--allowedTools", "Bash", "Edit", "--verbose"],
     ["--allowedTools=Bash", "--allowedTools=Edit", "--verbose"], []),
    (["--add-dir", "/a b", "--model", "m", "--disallowedTools", "WebFetch"],
     ["--add-dir=/a b", "--model", "m", "--disallowedTools=WebFetch"], []),
    # ... while their =value form carries through
    (["--debug=api", "--allowedTools=Bash,Edit"], ["--debug=api", "--allowedTools=Bash,Edit"], []),
    # a short option's value written onto it is bounded by the argument's end: it carries
    (["-nfoo", "-dapi", "-wtree", "--verbose"], ["-nfoo", "-dapi", "-wtree", "--verbose"], []),
    (["-n=x"], ["-n=x"], []),  # (Claude names the session "=x": carried as written)
    (["-r6f3c1a8e-1111-4222-8333-444455556666", "-nfoo"], ["-nfoo"], []),
    # --bg starts no conversation the replacement could continue
    (["--bg", "--model", "m"], ["--model", "m"], []),
    # an option this table does not know is left out in space form, kept with =
    (["--brand-new-option", "x"], [], ["--brand-new-option"]),
    (["--brand-new-option=x"], ["--brand-new-option=x"], []),
])
def test_replacement_args(argv, kept, left_out):
    assert cc_lhc.replacement_args(argv) == (kept, left_out)


@pytest.mark.parametrize("kept, runtime, expected", [
    # what Claude confirmed in the session wins over what the launch said
    (["--permission-mode", "plan", "--effort=low"], {"effort": "high", "permission_mode": "acceptEdits"},
     ["--effort", "high", "--permission-mode", "acceptEdits"]),
    # nothing confirmed: the launch's own values stay
    (["--effort", "low"], {}, ["--effort", "low"]),
    # bypass is carried only where the launch allowed it, never broadened
    (["--verbose"], {"permission_mode": "bypassPermissions"}, ["--verbose"]),
    (["--dangerously-skip-permissions"], {"permission_mode": "bypassPermissions"},
     ["--dangerously-skip-permissions", "--permission-mode", "bypassPermissions"]),
])
def test_confirmed_runtime_carries_into_the_replacement(kept, runtime, expected):
    assert cc_lhc.with_runtime(kept, runtime) == expected


def test_confirmed_runtime_reads_only_what_claude_wrote(tmp_path):
    import json
    lines = [
        {"type": "user", "permissionMode": "plan", "message": {"content": "a"}},
        {"type": "assistant", "effort": "high", "message": {"content": []}},
        {"type": "user", "permissionMode": "someFutureMode", "message": {"content": "b"}},
        {"type": "assistant", "effort": "ludicrous", "message": {"content": []}},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    # unknown newer values are not inferred: the newest known ones are used
    assert cc_lhc.confirmed_runtime(str(path)) == {"effort": "high", "permission_mode": "plan"}
