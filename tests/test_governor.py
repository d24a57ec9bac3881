"""The governor: how context pressure is measured and classified, and its receipts.

Pure: measure_pressure/classify are called directly; governor_reading and Receipts run
in-process on a private state home (the autouse fixture points CC_LHC_HOME at a temp dir).
No Claude, no subprocesses.
"""

from __future__ import annotations

import json

import pytest

import cc_lhc
from cc_lhc import classify, measure_pressure

TRIGGER = cc_lhc.BUILTIN_POLICY["upperBoundTokens"]


# -- measuring ------------------------------------------------------------------------------

def test_builtin_policy_numbers():
    p = cc_lhc.BUILTIN_POLICY
    assert (p["lowerBoundTokens"], p["upperBoundTokens"], p["minRunwayTokens"], p["pruneEnabled"]) \
        == (180_000, 360_000, 50_000, False)


def test_provider_usage_is_input_plus_cache_creation_plus_cache_read():
    r = measure_pressure((1_000, 20_000, 300_000), (1_000, 20_000, 300_000), 0, 0)
    assert r == {"source": "provider", "provider_tokens": 321_000, "estimate_tokens": 0,
                 "pressure": 321_000}


def test_estimate_is_added_once_not_double_counted():
    # Content captured after the newest response is an estimate on top of the provider
    # figure; the estimate "after the last valid" one is not used when latest is valid.
    r = measure_pressure((100_000, 0, 0), (100_000, 0, 0), 700, 99_999, prompt_estimate=30)
    assert r["source"] == "provider"
    assert r["provider_tokens"] == 100_000
    assert r["estimate_tokens"] == 730
    assert r["pressure"] == 100_730


def test_zero_usage_is_a_reading_not_missing():
    r = measure_pressure((0, 0, 0), None, 5, 5)
    assert r["source"] == "provider" and r["pressure"] == 5


@pytest.mark.parametrize("bad", [None, (None, 0, 0), (5, None, 0), (5, 0, None)])
def test_invalid_latest_falls_back_to_last_known_plus_estimate(bad):
    # A session at 900k must never look healthy because its newest usage line went bad.
    r = measure_pressure(bad, (850_000, 30_000, 20_000), 10, 4_000, prompt_estimate=6)
    assert r["source"] == "last_known"
    assert r["provider_tokens"] == 900_000
    assert r["estimate_tokens"] == 4_006  # everything after the last good reading, + prompt
    assert r["pressure"] == 904_006
    c = classify(r, TRIGGER, settled=True)
    assert c["state"] == cc_lhc.STATE_OVER_SETTLED and c["would_mutate"]


def test_nothing_observed_is_not_observed_never_zero():
    r = measure_pressure(None, None, 123, 123, prompt_estimate=7)
    assert r["source"] == cc_lhc.STATE_NOT_OBSERVED
    assert r["pressure"] is None and r["provider_tokens"] is None
    assert r["estimate_tokens"] == 130
    c = classify(r, TRIGGER, settled=True)
    assert c["state"] == cc_lhc.STATE_NOT_OBSERVED
    assert c["pressure"] is None and not c["would_mutate"]
    assert "not observed" in cc_lhc.describe_reading(c)
    assert " 0 " not in cc_lhc.describe_reading(c)


def test_invalid_everything_is_not_observed():
    r = measure_pressure((None, None, None), (1, None, 3), 0, 0)
    assert r["source"] == cc_lhc.STATE_NOT_OBSERVED and r["pressure"] is None


# -- classifying ----------------------------------------------------------------------------

def reading(pressure):
    return measure_pressure((pressure, 0, 0), None, 0, 0)


def test_below_trigger_is_healthy():
    c = classify(reading(TRIGGER - 1), TRIGGER, settled=True)
    assert c["state"] == cc_lhc.STATE_HEALTHY and not c["would_mutate"]
    assert c["trigger"] == TRIGGER


def test_over_trigger_and_settled_would_mutate():
    for pressure in (TRIGGER, TRIGGER + 1, 900_000):
        c = classify(reading(pressure), TRIGGER, settled=True)
        assert c["state"] == cc_lhc.STATE_OVER_SETTLED and c["would_mutate"] is True


def test_over_trigger_with_open_turn_does_not_mutate():
    c = classify(reading(900_000), TRIGGER, settled=False)
    assert c["state"] == cc_lhc.STATE_OVER_OPEN and c["would_mutate"] is False


def test_only_pressure_decides():
    # The prompt estimate alone can tip a session over; nothing else is consulted.
    under = measure_pressure((TRIGGER - 10, 0, 0), None, 0, 0, prompt_estimate=9)
    over = measure_pressure((TRIGGER - 10, 0, 0), None, 0, 0, prompt_estimate=10)
    assert not classify(under, TRIGGER, True)["would_mutate"]
    assert classify(over, TRIGGER, True)["would_mutate"]


def test_describe_reading_names_its_source():
    c = classify(measure_pressure(None, (400_000, 0, 0), 0, 12), TRIGGER, True)
    text = cc_lhc.describe_reading(c)
    assert "last known" in text and "400,000" in text and "400,012" in text


# -- reading from the record ------------------------------------------------------------------

@pytest.fixture
def store():
    home = cc_lhc.StateHome()
    s = cc_lhc.ThreadStore(home, "00000000-0000-4000-8000-00000000abcd")
    yield s
    s.close()


def add_message(store, seq, text, session="s1", kind="assistant_text"):
    with cc_lhc.Tx(store.db):
        store.db.execute("INSERT INTO messages (seq, turn, segment, role, kind, text, source_session, "
                         "source_uuid, block) VALUES (?, 1, 0, 'assistant', ?, ?, ?, ?, 0)",
                         (seq, kind, text, session, f"u{seq}"))


def add_usage(store, rid, seq, inp, cc, cr, session="s1"):
    with cc_lhc.Tx(store.db):
        store.db.execute("INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, 1, 'm', '')",
                         (rid, session, seq, inp, cc, cr))


def test_governor_reading_from_the_record(store):
    add_message(store, 1, "a" * 40)
    add_usage(store, "r1", 1, 900_000, 0, 0)
    add_message(store, 2, "b" * 400)
    add_usage(store, "r2", 2, None, 0, 0)          # the newest usage line went bad
    add_message(store, 3, "c" * 40)
    r = cc_lhc.governor_reading(store, "s1", prompt_estimate=5)
    assert r["source"] == "last_known" and r["provider_tokens"] == 900_000
    assert r["estimate_tokens"] == 1 + 110 + 5       # r1's output, (400 + 40) / 4 after it, + the prompt
    assert classify(r, TRIGGER, True)["state"] == cc_lhc.STATE_OVER_SETTLED


def test_governor_estimate_counts_bytes_like_estimate_tokens(store):
    add_message(store, 1, "x")
    add_usage(store, "r1", 1, 1_000, 0, 0)
    add_message(store, 2, "é" * 400)                 # 800 bytes of UTF-8
    r = cc_lhc.governor_reading(store, "s1")
    assert r["estimate_tokens"] == 1 + cc_lhc.estimate_tokens("é" * 400) == 201  # (r1's output, 1 token)


def test_the_newest_answer_itself_is_in_the_predicted_pressure(store):
    """A response's usage says what its request held; the answer it gave goes into the next
    request too. Counted by its output_tokens (or its own bytes / 4 where the provider gave
    none): a large answer just under the trigger was left out, and Smart Compact ran a turn
    late (355,000 + 0 read healthy against 360,000)."""
    add_message(store, 1, "prompt")
    add_message(store, 2, "x" * 100_000)
    with cc_lhc.Tx(store.db):
        store.db.execute("INSERT INTO usage VALUES ('r1', 's1', 2, 355000, 0, 0, 30000, 'm', '')")
    r = cc_lhc.governor_reading(store, "s1")
    assert (r["provider_tokens"], r["estimate_tokens"], r["pressure"]) == (355_000, 30_000, 385_000)
    assert classify(r, 360_000, True)["state"] == cc_lhc.STATE_OVER_SETTLED
    with cc_lhc.Tx(store.db):  # no output_tokens given: the answer's bytes / 4 (its response's messages)
        store.db.execute("UPDATE usage SET output = NULL")
        store.db.execute("UPDATE messages SET response_id = 'r1' WHERE seq = 2")
    assert cc_lhc.governor_reading(store, "s1")["estimate_tokens"] == 25_000


def test_governor_reading_counts_only_this_session(store):
    add_message(store, 1, "x" * 8, session="old")
    add_usage(store, "r1", 1, 400_000, 0, 0, session="old")
    # A rebuilt session before its first answer has not been observed: its context is its
    # view, not the oversized session it replaced.
    r = cc_lhc.governor_reading(store, "new")
    assert r["source"] == cc_lhc.STATE_NOT_OBSERVED and r["pressure"] is None


# -- receipts --------------------------------------------------------------------------------

def a_classification():
    return classify(reading(TRIGGER + 5), TRIGGER, True)


def receipt_rows(hostdb):
    return hostdb.db.execute("SELECT id, replay_key, state, would_mutate, outcome "
                             "FROM cc_governor_receipts ORDER BY id").fetchall()


def test_receipt_replay_key_is_idempotent():
    home = cc_lhc.StateHome()
    hostdb = cc_lhc.HostDB(home)
    receipts = cc_lhc.Receipts(hostdb, home)
    c = a_classification()
    first = receipts.record("thread", "s1", c, "oneshot:s1:msg_1:over_trigger_settled")
    again = receipts.record("thread", "s1", c, "oneshot:s1:msg_1:over_trigger_settled")
    other = receipts.record("thread", "s1", c, "oneshot:s1:msg_2:over_trigger_settled")
    assert isinstance(first, int) and first == again and other != first
    rows = receipt_rows(hostdb)
    assert [r[1] for r in rows] == ["oneshot:s1:msg_1:over_trigger_settled",
                                    "oneshot:s1:msg_2:over_trigger_settled"]
    assert rows[0][2] == cc_lhc.STATE_OVER_SETTLED and rows[0][3] == 1
    receipts.outcome(first, "rebuilt:abc")
    assert receipt_rows(hostdb)[0][4] == "rebuilt:abc"


def test_receipt_of_not_observed_keeps_pressure_null():
    home = cc_lhc.StateHome()
    hostdb = cc_lhc.HostDB(home)
    c = classify(measure_pressure(None, None, 3, 3), TRIGGER, True)
    rid = cc_lhc.Receipts(hostdb, home).record("t", "s", c, "k")
    row = hostdb.db.execute("SELECT state, pressure, provider_tokens FROM cc_governor_receipts "
                            "WHERE id = ?", (rid,)).fetchone()
    assert row == (cc_lhc.STATE_NOT_OBSERVED, None, None)


@pytest.mark.parametrize("how", ["closed", "dropped"])
def test_unavailable_receipt_store_warns_and_goes_on(how, capsys):
    home = cc_lhc.StateHome()
    hostdb = cc_lhc.HostDB(home)
    if how == "closed":
        hostdb.db.close()
    else:
        hostdb.db.execute("DROP TABLE cc_governor_receipts")
    receipts = cc_lhc.Receipts(hostdb, home)
    rid = receipts.record("thread", "s1", a_classification(), "k1")
    assert isinstance(rid, str) and rid.startswith("memory-")
    err = capsys.readouterr().err
    assert "warning" in err and "receipt" in err and rid in err
    receipts.outcome(rid, "rebuilt:x")        # an in-memory receipt's outcome is a no-op
    with open(home.path("wrapper.log")) as f:
        assert "receipt_store_unavailable" in f.read()


@pytest.mark.parametrize("how", ["missing", "null"])
def test_a_newest_response_that_told_no_usage_reads_as_last_known(tmp_path, how):
    """A response recorded with no usage at all is no fresh reading: the last known one is
    used, labelled so, and the receipt names that newest response, not the older one."""
    from test_capture_parse import Transcript, text
    t = Transcript("s1")
    t.user("first")
    t.assistant(text("big"), usage={"input_tokens": 900_000, "output_tokens": 5})
    t.user("second")
    [rec] = t.assistant(text("newest"))
    if how == "missing":
        del rec["message"]["usage"]
    else:
        rec["message"]["usage"] = None
    t.lines[-1] = json.dumps(rec).encode()  # (the record as written, without its usage)
    path = t.write(tmp_path / "s1.jsonl")
    home = cc_lhc.StateHome(tmp_path / "lhc")
    home.ensure()
    cap = cc_lhc.Capture(home, "thread-1", "s1", str(path))
    cap.catch_up()
    try:
        r = cc_lhc.governor_reading(cap.store, "s1")
        assert r["source"] == "last_known" and r["provider_tokens"] == 900_000
        c = classify(r, TRIGGER, True)
        receipts = cc_lhc.Receipts(cc_lhc.HostDB(home), home)
        receipt = receipts.classified(cap.store, "thread-1", "s1", c)
        key = cc_lhc.HostDB(home).db.execute("SELECT replay_key FROM cc_governor_receipts WHERE id = ?",
                                             (receipt,)).fetchone()[0]
        assert key == f"s1:msg_0002:{c['state']}"
    finally:
        cap.stop()


def test_claudes_own_compaction_since_the_newest_response_leaves_no_reading(store):
    """After Claude compacted the conversation itself (sample 08's reactive compaction),
    the usage its last response reported before that is no reading of the context any
    more: until a response after it says more, the session is not observed."""
    add_message(store, 1, "x" * 40)
    add_usage(store, "r1", 1, 370_000, 0, 0)
    add_message(store, 2, "the summary " * 10, kind="compact_summary")
    r = cc_lhc.governor_reading(store, "s1", prompt_estimate=3)
    assert r["source"] == cc_lhc.STATE_NOT_OBSERVED and r["pressure"] is None
    assert r["provider_tokens"] is None and r["estimate_tokens"] == 30 + 3  # the summary on, + the prompt
    assert classify(r, TRIGGER, True)["would_mutate"] is False
    add_message(store, 3, "reply after compaction")
    add_usage(store, "r2", 3, 10, 0, 0)            # a response after it: read again
    r = cc_lhc.governor_reading(store, "s1")
    assert r["source"] == "provider" and r["provider_tokens"] == 10


def test_a_session_cut_just_after_claudes_compaction_is_not_smart_compacted(tmp_path, capsys):
    """Sample 08 up to its compaction (the 370,000 reading before it, nothing after):
    resumed, it is not rebuilt over that stale figure."""
    from test_capture_parse import SAMPLE_08
    lines = SAMPLE_08.read_bytes().splitlines(keepends=True)
    cut = next(i for i, line in enumerate(lines) if b"reply after compaction" in line)
    home = cc_lhc.StateHome()
    home.ensure()
    registry = cc_lhc.Registry(home)
    session = json.loads(lines[0])["sessionId"]
    thread = registry.create_thread(session, str(tmp_path), "adopted")
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"".join(lines[:cut]))
    cap = cc_lhc.Capture(home, thread, session, str(path))
    cap.catch_up()
    r = cc_lhc.governor_reading(cap.store, session)
    cap.stop()
    assert r["source"] == cc_lhc.STATE_NOT_OBSERVED and r["pressure"] is None
