"""Which of a thread's turns are on Claude's branch when the person moves between the
thread's sessions with an in-app /resume (resumed_back) and rewinds inside them: each
session's views hold exactly what Claude on that session has, however often the person
moves back and forth. Each step here is what the live host does at that moment."""

from __future__ import annotations

import json
import uuid

import cc_lhc
from test_capture_live import registered_thread
from test_capture_parse import Transcript, text


class Thread:
    def __init__(self, tmp_path):
        self.A, self.B = str(uuid.uuid4()), str(uuid.uuid4())
        self.home, self.id = registered_thread(self.A)
        self.files = {self.A: tmp_path / "a.jsonl", self.B: tmp_path / "b.jsonl"}
        self.t = {self.A: Transcript(self.A), self.B: Transcript(self.B)}

    def turn(self, session, prompt, answer):
        t = self.t[session]
        t.user(prompt)
        reply = t.assistant(text(answer))
        t.write(self.files[session])
        cap = cc_lhc.Capture(self.home, self.id, session, str(self.files[session]))
        try:
            cap.catch_up()
        finally:
            cap.stop()
        return reply

    def _store(self, fn, *args):
        store = cc_lhc.ThreadStore(self.home, self.id)
        try:
            return fn(store, *args)
        finally:
            store.close()

    def swapped(self, old, new):  # a swap to ``new`` accepted: the session it left keeps its branch
        self._store(cc_lhc.leave_branch, old, new)

    def resume(self, to, left):  # an in-app /resume from ``left`` back to ``to``
        return self._store(cc_lhc.resumed_back, to, left)

    def on_branch(self) -> str:
        return self._store(lambda s: json.dumps([m.get("text") for t in cc_lhc.load_turns(s) for m in t.messages]))


def test_moving_back_and_forth_keeps_each_sessions_branch(tmp_path):
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.swapped(A, B)
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    assert th.resume(A, B)
    th.turn(A, "prompt back on the old", "answer ONE-AGAIN")
    now = th.on_branch()
    assert "ORIGINAL" in now and "ONE-AGAIN" in now and "REBUILT-TURN" not in now
    th.resume(B, A)
    th.turn(B, "prompt on the rebuilt again", "answer B-AGAIN")
    now = th.on_branch()
    assert "REBUILT-TURN" in now and "B-AGAIN" in now and "ONE-AGAIN" not in now
    th.resume(A, B)  # a second time: B's turns stay off, A's own come back
    th.turn(A, "prompt three on the old", "answer A-THIRD")
    now = th.on_branch()
    assert "ORIGINAL" in now and "ONE-AGAIN" in now and "A-THIRD" in now
    assert "REBUILT-TURN" not in now and "B-AGAIN" not in now


def rewound_after_a_move(tmp_path) -> Thread:
    """A, a swap to B, a turn there, back on A, a turn, then Esc Esc on A to after its first answer."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    (first, *_) = th.turn(A, "prompt one", "answer ORIGINAL")
    th.turn(A, "prompt two", "answer TWO-BEFORE-SWAP")
    th.swapped(A, B)
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    th.resume(A, B)
    th.turn(A, "prompt back on the old", "answer ONE-AGAIN")
    th.t[A].parent = first["uuid"]
    th.turn(A, "prompt after the rewind", "answer REWOUND-ON")
    return th


def test_a_rewind_on_one_session_leaves_the_others_turns_alone(tmp_path):
    th = rewound_after_a_move(tmp_path)
    A, B = th.A, th.B
    now = th.on_branch()
    assert "ORIGINAL" in now and "REWOUND-ON" in now
    assert not any(s in now for s in ("TWO-BEFORE-SWAP", "ONE-AGAIN", "REBUILT-TURN"))
    th.resume(B, A)  # Claude on B has the turns before the swap and its own
    now = th.on_branch()
    assert "REBUILT-TURN" in now and "ORIGINAL" in now and "TWO-BEFORE-SWAP" in now
    assert "ONE-AGAIN" not in now and "REWOUND-ON" not in now
    th.resume(A, B)  # and back on A, its rewind holds again
    now = th.on_branch()
    assert "ORIGINAL" in now and "REWOUND-ON" in now
    assert not any(s in now for s in ("TWO-BEFORE-SWAP", "ONE-AGAIN", "REBUILT-TURN"))


def read_call(tid: str, path: str) -> dict:
    return {"type": "tool_use", "id": tid, "name": "Read", "input": {"file_path": path}}


def test_only_working_set_files_outside_the_project_send_a_compaction_to_the_swap(tmp_path):
    """reads_claude_would_forget looks at the files a swap carries (the working set, on
    the branch), not at every file the thread ever read: one read long ago outside the
    project, behind 35 newer ones inside it, keeps the in-process path."""
    project = tmp_path / "project"
    project.mkdir()
    home, thread = registered_thread()
    t = Transcript()
    t.user("read around")
    files = ["/etc/hosts"] + [str(project / f"f{i}.py") for i in range(35)]
    for i, path in enumerate(files):
        t.assistant(read_call(f"toolu_{i}", path), stop="tool_use")
        t.tool_result((f"toolu_{i}", f"contents of {path}"))
    t.assistant(text("read them all"))
    path = t.write(tmp_path / "t.jsonl")
    cap = cc_lhc.Capture(home, thread, "11111111-2222-4333-8444-555555555555", str(path))
    cap.catch_up()
    later = "9999-01-01T00:00:00.000Z"  # (a Claude started after every read)
    try:
        assert cc_lhc.reads_claude_would_forget(cap.store, [str(project)], later) == []
        assert cc_lhc.reads_claude_would_forget(cap.store, [str(tmp_path / "elsewhere")], later) == \
            sorted(files[-cc_lhc.WORKING_SET_LIMIT:])  # (the newest 30: the working set)
        assert cc_lhc.reads_claude_would_forget(cap.store, [str(project)], "2000-01-01T00:00:00.000Z") == []
    finally:
        cap.stop()


def test_a_rebuild_left_before_anything_was_typed_on_it_keeps_its_branch(tmp_path):
    """A swap's rebuild B holds only the view cc-lhc wrote (no record of its own yet); the
    person goes back to A, types there, and returns to B: what was typed on A is off B's
    branch, and back on A again, on it."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.swapped(A, B)
    th.resume(A, B)
    th.turn(A, "prompt back on the old", "answer OTURN")
    th.resume(B, A)
    now = th.on_branch()
    assert "ORIGINAL" in now and "OTURN" not in now
    th.turn(B, "prompt on B at last", "answer RTURN")
    th.resume(A, B)
    now = th.on_branch()
    assert "OTURN" in now and "RTURN" not in now


def test_a_kill_between_the_branch_and_the_pointer_is_mended_at_the_next_launch(tmp_path):
    """The branch in the thread moved to A's, and the registry's pointer never did (a kill,
    a busy registry): the next launch on the thread's current session B puts B's back."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.swapped(A, B)
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    th._store(cc_lhc.took_branch, B)
    th.resume(A, B)  # ... and the pointer stays on B
    assert "REBUILT-TURN" not in th.on_branch()
    registry = cc_lhc.Registry(th.home)
    registry.add_alias(B, th.id, current=True)
    cc_lhc.recover_thread(th.home, registry, cc_lhc.HostDB(th.home), th.id)
    assert "REBUILT-TURN" in th.on_branch()


def test_runs_an_earlier_build_wrote_for_a_resume_back_end_at_the_next_move(tmp_path):
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    store = cc_lhc.ThreadStore(th.home, th.id)
    (top,) = store.db.execute("SELECT max(seq) FROM messages").fetchone()
    with cc_lhc.Tx(store.db) as db:  # (the key such a build wrote, back on A)
        db.execute("INSERT INTO meta VALUES (?, ?)", (f"{cc_lhc.OFF_BRANCH_KEY}{A}@resumed:3", str(top)))
    store.close()
    assert "REBUILT-TURN" not in th.on_branch()
    th.resume(B, A)
    assert "REBUILT-TURN" in th.on_branch()


def test_a_swap_accepted_after_the_rebuilds_own_turns_keeps_them_off_the_old_branch(tmp_path):
    """Accept after the rebuilt session's turns were captured (interactive --resume over the
    trigger settles at exit or at the /resume's let-go; recover_thread completes a swap after
    keep_what_it_holds captured B's turn): A's snapshot must still end at A's branch."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")  # captured before accept
    th.swapped(A, B)                    # accept(): keep_branch_of(from_session, its rebuild)
    th._store(cc_lhc.took_branch, B)    # settle_boundary
    back = th.resume(A, B)              # in-app /resume back to A
    now = th.on_branch()
    assert "ORIGINAL" in now
    assert "REBUILT-TURN" not in now, (back, now)


def test_runs_an_earlier_build_wrote_survive_a_round_trip(tmp_path):
    """A thread an earlier build left on A after a resume back (off_branch:A@resumed:N):
    the new build moves to B and back to A; B's turn must stay off A's branch."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    store = cc_lhc.ThreadStore(th.home, th.id)
    (lastA,) = store.db.execute("SELECT max(seq) FROM messages WHERE source_session = ?", (A,)).fetchone()
    (top,) = store.db.execute("SELECT max(seq) FROM messages").fetchone()
    with cc_lhc.Tx(store.db) as db:
        db.execute("INSERT INTO meta VALUES (?, ?)", (f"{cc_lhc.OFF_BRANCH_KEY}{A}@resumed:{lastA + 1}", str(top)))
    store.close()
    th.turn(A, "prompt back on A (old build)", "answer A-AGAIN")
    assert "REBUILT-TURN" not in th.on_branch()
    th.resume(B, A)      # new build: /resume to B
    now = th.on_branch()
    assert "REBUILT-TURN" in now and "A-AGAIN" not in now
    th.resume(A, B)      # and back to A
    now = th.on_branch()
    assert "A-AGAIN" in now
    assert "REBUILT-TURN" not in now, now


def test_a_snapshot_an_earlier_build_wrote_keeps_a_sessions_rewind(tmp_path):
    """An earlier build kept a snapshot as a JSON list of runs: read as such, the session's
    own rewind stays off its branch."""
    th = rewound_after_a_move(tmp_path)
    A, B = th.A, th.B
    th.resume(B, A)
    # the previous build wrote A's snapshot as a list of its runs
    store = cc_lhc.ThreadStore(th.home, th.id)
    key = cc_lhc.BRANCH_SNAPSHOT_KEY + A
    (value,) = store.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    with cc_lhc.Tx(store.db) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = ?", (json.dumps(json.loads(value)["runs"]), key))
    store.close()
    th.resume(A, B)
    now = th.on_branch()
    assert "ORIGINAL" in now and "REWOUND-ON" in now
    assert not any(s in now for s in ("TWO-BEFORE-SWAP", "ONE-AGAIN", "REBUILT-TURN")), now


def test_repair_after_a_kill_past_the_pointer_keeps_the_snapshot_taken_before_it(tmp_path):
    """accept(): A's snapshot is taken, the pointer moves to B, the kill comes before
    took_branch (failpoint after-alias-advance); B's first turn is in the thread. The next
    launch's repair_branch must not take A's snapshot again over B's turn."""
    th = Thread(tmp_path)
    A, B = th.A, th.B
    th.turn(A, "prompt one", "answer ORIGINAL")
    th._store(cc_lhc.took_branch, A)     # (A was reached by an earlier move: the key names it)
    th.swapped(A, B)                     # accept: keep_branch_of(A, B) before the pointer moves
    registry = cc_lhc.Registry(th.home)
    registry.add_alias(B, th.id, current=True)   # advance_current ... killed before took_branch
    th.turn(B, "prompt on the rebuilt", "answer REBUILT-TURN")
    cc_lhc.recover_thread(th.home, registry, cc_lhc.HostDB(th.home), th.id)   # next launch
    assert "REBUILT-TURN" in th.on_branch()
    th.resume(A, B)
    assert "REBUILT-TURN" not in th.on_branch(), th.on_branch()
