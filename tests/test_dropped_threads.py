"""A thread a launch drops (it held nothing: Claude was opened and closed without a prompt)
while a person's `threads`, `search --all` or `doctor` runs is not reported as damaged:
it was removed, not lost, so it is simply not listed (exit 0)."""

from __future__ import annotations

import uuid

import pytest

import cc_lhc
from test_capture_integrity import capture_once
from test_capture_live import registered_thread, run_main
from test_capture_parse import Transcript, text


@pytest.fixture
def two_threads(tmp_path):
    """A kept thread (with a prompt) and one a launch is about to drop."""
    home, kept = registered_thread()
    t = Transcript()
    t.user("a prompt worth keeping")
    t.assistant(text("an answer"))
    capture_once(home, kept, t.write(tmp_path / "t.jsonl"))
    registry = cc_lhc.Registry(home)
    dropped = registry.create_thread(str(uuid.uuid4()), str(tmp_path), "fresh")
    cc_lhc.ThreadStore(home, dropped).close()
    registry.db.close()
    return home, kept, dropped


def drop_when_opened(monkeypatch, home, dropped, name, where=cc_lhc):
    """The drop lands between the reader's listing and its opening of the thread's file."""
    original = getattr(where, name)

    def racing(*args, **kwargs):
        if dropped in " ".join(map(str, args)):
            cc_lhc.Registry(home).drop_thread(dropped)
        return original(*args, **kwargs)
    monkeypatch.setattr(where, name, racing)


def test_threads_leaves_out_a_thread_dropped_meanwhile(two_threads, monkeypatch, capsys):
    home, kept, dropped = two_threads
    drop_when_opened(monkeypatch, home, dropped, "existing", cc_lhc.ThreadStore)
    status, out = run_main("threads", "--json")
    assert status == 0 and "left out" not in capsys.readouterr().err
    assert [row["id"] for row in __import__("json").loads(out)] == [kept]


def test_search_all_leaves_out_a_thread_dropped_meanwhile(two_threads, monkeypatch, capsys):
    home, kept, dropped = two_threads
    drop_when_opened(monkeypatch, home, dropped, "existing", cc_lhc.ThreadStore)
    status, out = run_main("search", "worth keeping", "--all")
    assert status == 0 and "skipped" not in capsys.readouterr().err
    assert "a prompt »worth keeping«" in out


def test_doctor_says_nothing_of_a_thread_dropped_meanwhile(two_threads, monkeypatch, fake_claude):
    home, kept, dropped = two_threads
    drop_when_opened(monkeypatch, home, dropped, "store_file_check")
    status, out = run_main("doctor")
    assert status == 0, out
    assert dropped[:8] not in out and "unusable" not in out


def test_a_thread_whose_file_is_gone_but_still_registered_is_still_named(two_threads, capsys):
    home, kept, dropped = two_threads
    import os
    os.unlink(home.path("threads", f"{dropped}.sqlite"))
    status, _out = run_main("threads", "--json")
    assert status == 1 and f"thread {dropped[:8]} left out of this list" in capsys.readouterr().err
