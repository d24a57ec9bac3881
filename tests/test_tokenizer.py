"""Exact o200k_base token counts with no network, and honest "approximate" labels when the
shipped data or tiktoken is missing or broken (DESIGN.md; issue 4 "Tokenizer").

Each case runs in a fresh interpreter, because TOKENS loads once per process.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap

from pathlib import Path

import pytest

from conftest import REPO

DATA = REPO / ".cache" / "tokenizer" / "o200k_base.tiktoken"
SAMPLES_DIR = REPO / "tests" / "fixtures" / "samples"

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


# -- counts made once are kept (CountsCache) --------------------------------------------

COUNTS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    import cc_lhc
    built = []  # encoders built: the whole one, or one for the texts at hand
    real, for_texts = cc_lhc.TokenCounter._load, cc_lhc.TokenCounter._encoder_for
    def spy(self):
        built.append("whole")
        return real(self)
    def spy_for_texts(self, texts):
        n = len(self._for_texts)
        encoder = for_texts(self, texts)
        built.extend(["for texts"] * (len(self._for_texts) - n))
        return encoder
    cc_lhc.TokenCounter._load = spy
    cc_lhc.TokenCounter._encoder_for = spy_for_texts
    {body}
    if not globals().get("saved_later"):
        cc_lhc.TOKENS.save()
    print(json.dumps({{"out": out, "built": bool(built), "encoders": built, "exact": cc_lhc.TOKENS.exact,
                       "reason": cc_lhc.TOKENS.reason}}))
""")


def run_counts(tmp_path, body, env_extra=None):
    """Run ``body`` (which sets ``out``) in a fresh interpreter with its state folder under
    tmp_path; says what it printed and whether tiktoken's encoder had to be built."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CC_LHC_TOKENIZER")}
    env["CC_LHC_HOME"] = str(tmp_path / "state")
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-c", COUNTS.format(repo=str(REPO), body=body)],
                          capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def counts_of(texts):
    if len(repr(texts)) < 20_000:
        return f"out = cc_lhc.TOKENS.count_many({texts!r})"
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(texts, f)
    return f"out = cc_lhc.TOKENS.count_many(json.load(open({path!r})))"


def counts_file(tmp_path):
    sys.path.insert(0, str(REPO))
    import cc_lhc
    return Path(cc_lhc.CountsCache(cc_lhc.StateHome(str(tmp_path / "state"))).path)


TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog. " * 50, "ünïcödé 日本語 <|endoftext|>"]


def test_a_text_counted_once_is_not_counted_again_by_the_next_process(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    first = run_counts(tmp_path, counts_of(TEXTS))
    assert first["exact"] and first["built"] and first["out"][:2] == [2, 501]
    again = run_counts(tmp_path, counts_of(TEXTS))
    assert again == dict(first, built=False, encoders=[])  # the same exact counts, no encoder built
    # one new text among known ones: only then is the encoder built, and the rest still agree
    mixed = run_counts(tmp_path, counts_of(TEXTS[:2] + ["a text never seen before"]))
    assert mixed["built"] and mixed["out"][:2] == [2, 501] and mixed["exact"]
    # the cache holds hashes and numbers, never the text
    blob = b"".join(p.read_bytes() for p in counts_file(tmp_path).parent.glob("o200k-counts-*"))
    assert b"quick brown" not in blob and b"hello" not in blob


def test_counts_from_the_cache_are_the_counts_tiktoken_makes(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    texts = [line for path in sorted((REPO / "tests" / "fixtures").rglob("*.jsonl"))[:6]
             for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:40]]
    assert len(texts) > 50
    fresh = run_counts(tmp_path, counts_of(texts))
    known = run_counts(tmp_path, counts_of(texts))
    listed = tmp_path / "texts.json"
    listed.write_text(json.dumps(texts))
    direct = run_counts(tmp_path, f"enc = cc_lhc.TOKENS.encoding(); "
                                  f"out = [len(enc.encode_ordinary(t)) for t in json.load(open({str(listed)!r}))]")
    assert not known["built"] and fresh["out"] == known["out"] == direct["out"]


def test_a_damaged_counts_cache_is_set_aside_and_counting_goes_on(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    run_counts(tmp_path, counts_of(TEXTS))
    path = counts_file(tmp_path)
    for extra in path.parent.glob(path.name + "-*"):
        extra.unlink()
    path.write_bytes(b"this is not a database" * 100)
    report = run_counts(tmp_path, counts_of(TEXTS))
    assert report["exact"] and report["built"] and report["out"][:2] == [2, 501]
    assert list(path.parent.glob(path.name + ".unreadable-*"))  # kept for a look, never trusted
    assert not run_counts(tmp_path, counts_of(TEXTS))["built"]  # a new cache took its place


def test_without_a_state_folder_nothing_is_written_and_counts_stay_exact(tmp_path):
    pytest.importorskip("tiktoken")
    for _ in range(2):
        report = run_counts(tmp_path, counts_of(TEXTS))
        assert report["exact"] and report["built"] and report["out"][:2] == [2, 501]
    assert not (tmp_path / "state").exists()


def test_a_rank_file_changed_after_its_check_is_checked_again(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    copy = tmp_path / "copy.tiktoken"
    copy.write_bytes(DATA.read_bytes())
    env = {"CC_LHC_TOKENIZER_FILE": str(copy)}
    assert run_counts(tmp_path, counts_of(TEXTS), env)["exact"]
    assert not run_counts(tmp_path, counts_of(TEXTS), env)["built"]  # known, and the file's check kept
    data = bytearray(DATA.read_bytes())
    data[100] ^= 0x01
    copy.write_bytes(bytes(data))
    report = run_counts(tmp_path, counts_of(TEXTS), env)
    assert report["exact"] is False and "checksum" in report["reason"]
    assert report["out"][0] >= 2  # a safe estimate, not the counts kept for the good file


def test_measure_a_second_time_builds_no_tokenizer_and_prints_the_same(tmp_path):
    """Also on a first use: measure makes the state folder (private) to keep its counts."""
    pytest.importorskip("tiktoken")
    sample = sorted((REPO.parent / "shared" / "samples").glob("*.jsonl")) or \
        sorted((REPO / "tests" / "fixtures").rglob("*.jsonl"))
    body = ("import io, contextlib\n"
            "buf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n"
            f"    cc_lhc.cmd_measure([{str(sample[0])!r}, '--json'])\n"
            "out = json.loads(buf.getvalue())")
    first, second = run_counts(tmp_path, body), run_counts(tmp_path, body)
    assert first["built"] and not second["built"]
    if os.name == "posix":
        assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert first["out"] == second["out"] and second["out"]["sessions"][0]["counting"] == "exact o200k_base"


def test_counts_saved_on_a_thread_are_written_before_the_process_exits(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    body = counts_of(TEXTS) + "\ncc_lhc.TOKENS.save_later(); saved_later = True"
    assert run_counts(tmp_path, body)["built"]
    assert not run_counts(tmp_path, counts_of(TEXTS))["built"]


def test_exactness_asked_while_another_thread_settles_it_waits_for_the_answer(tmp_path):
    pytest.importorskip("tiktoken")
    # the host builds the encoder on a thread of its own; a view built meanwhile must not
    # be told "approximate" because the check had started but not finished
    body = ("import threading, time\n"
            "slow, started = cc_lhc._tokenizer_location, threading.Event()\n"
            "def late():\n"
            "    started.set(); time.sleep(0.3); return slow()\n"
            "cc_lhc._tokenizer_location = late\n"
            "t = threading.Thread(target=cc_lhc.TOKENS.encoding); t.start()\n"
            "started.wait()\n"
            "out = [cc_lhc.TOKENS.usable(), cc_lhc.TOKENS.count('hello world')]\n"
            "t.join()")
    assert run_counts(tmp_path, body)["out"] == [True, 2]


def _cache_in(tmp_path):
    sys.path.insert(0, str(REPO))
    import cc_lhc
    home = cc_lhc.StateHome(str(tmp_path / "state"))
    home.ensure()
    return cc_lhc, cc_lhc.CountsCache(home)


def test_a_full_counts_cache_lets_its_oldest_half_go(tmp_path, monkeypatch):
    cc_lhc, cache = _cache_in(tmp_path)
    monkeypatch.setattr(cc_lhc, "COUNTS_CACHE_ROWS", 100)
    first = {i.to_bytes(16, "big"): i for i in range(60)}
    cache.put(first)
    later = {(1000 + i).to_bytes(16, "big"): i for i in range(60)}
    cache.put(later)  # 120 rows: over the cap, so the oldest go, down to half of it
    kept = cache.get(list(first) + list(later))
    newest = list(later)[-51:]
    assert sorted(kept) == sorted(newest) and all(kept[k] == later[k] for k in newest)
    cache.close()


def test_a_busy_counts_cache_loses_one_write_and_is_kept(tmp_path):
    import sqlite3
    cc_lhc, cache = _cache_in(tmp_path)
    cache.put({b"k" * 16: 7})
    cache.close()
    other = sqlite3.connect(cache.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process is writing
    try:
        busy = cc_lhc.CountsCache(cache.home)
        busy.put({b"j" * 16: 8})      # waits its half second, then gives up: no error
        assert busy.get([b"k" * 16]) == {}  # set aside for this process
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert not list(Path(cache.path).parent.glob("*.unreadable-*"))  # the file is sound
    again = cc_lhc.CountsCache(cache.home)
    assert again.get([b"k" * 16, b"j" * 16]) == {b"k" * 16: 7}
    again.close()


def test_a_counts_cache_of_a_newer_cc_lhc_is_left_alone(tmp_path):
    import sqlite3
    cc_lhc, cache = _cache_in(tmp_path)
    cache.put({b"k" * 16: 7})
    cache.close()
    db = sqlite3.connect(cache.path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    before = Path(cache.path).read_bytes()
    newer = cc_lhc.CountsCache(cache.home)
    assert newer.get([b"k" * 16]) == {} and newer.verified("x") is False
    newer.put({b"j" * 16: 8})
    assert Path(cache.path).read_bytes() == before
    assert not list(Path(cache.path).parent.glob("*.unreadable-*"))


LIVE_CAPTURE = """
import os, threading
home = cc_lhc.StateHome()
home.ensure()
cap = cc_lhc.Capture(home, "thread-1", "session-1", {path!r})
cap.request_handoff = {live}
cap.catch_up()
cap.stop()
drained = cc_lhc.TOKENS.drain_ahead(60)
ahead = [t for t in threading.enumerate() if t.name == "cc-lhc-count-ahead"]
nice = os.getpriority(os.PRIO_PROCESS, ahead[0].native_id) if ahead and hasattr(os, "getpriority") else None
out = [drained, len(ahead), nice, os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") else None]
saved_later = True  # no save here: the counting thread's own must have kept them
"""

SHOWN_TEXTS = """
store = cc_lhc.ThreadStore(cc_lhc.StateHome(), "thread-1")
texts = [cc_lhc.shown_text(m, None) for m in store.messages() if m["agent"] is None and m["kind"] != "api_error"]
counted = cc_lhc.TOKENS.count_many(texts)
was_built = bool(built)
enc = cc_lhc.TokenCounter().encoding()
out = [len(texts), was_built, counted == [len(enc.encode_ordinary(t)) if t else 0 for t in texts]]
"""


@pytest.mark.parametrize("sample", [
    SAMPLES_DIR / "02_tool_roundtrip_thinking.jsonl",  # tool calls and results, signed thinking
    # empty signed thinking: what a view shows of it is its block JSON
    REPO / "tests" / "fixtures" / "versions" / "2.0.76" / "20760000-0000-4000-8000-000000000002.jsonl",
], ids=lambda p: p.parent.name)
def test_a_live_capture_counts_what_it_stores_so_a_later_view_finds_it_counted(tmp_path, sample):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    live = run_counts(tmp_path, LIVE_CAPTURE.format(path=str(sample), live="lambda **_: None"))
    drained, threads, nice, own = live["out"]
    assert drained and threads == 1 and live["built"]
    if sys.platform.startswith("linux"):
        assert nice == max(10, own)  # it takes only what the host and Claude leave over
    # Another process reads the thread back as a view does: every text is counted already,
    # and the counts are tiktoken's own.
    later = run_counts(tmp_path, SHOWN_TEXTS)
    n, was_built, same = later["out"]
    assert n >= 4 and not was_built and same


def test_a_capture_outside_a_live_host_counts_nothing_ahead(tmp_path):
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    sample = SAMPLES_DIR / "02_tool_roundtrip_thinking.jsonl"
    done = run_counts(tmp_path, LIVE_CAPTURE.format(path=str(sample), live="None"))
    assert done["out"][:2] == [True, 0] and not done["built"]


def test_a_count_ahead_that_fails_keeps_no_event_of_its_batch_back(tmp_path, monkeypatch):
    import cc_lhc
    monkeypatch.setenv("CC_LHC_HOME", str(tmp_path / "state"))

    def broken(_texts):
        raise RuntimeError("counting broke")
    monkeypatch.setattr(cc_lhc.TOKENS, "count_ahead", broken)
    monkeypatch.setattr(cc_lhc.TOKENS, "ahead_error", None)  # put back as it was afterwards
    events = []
    home = cc_lhc.StateHome(str(tmp_path / "state"))
    home.ensure()
    sample = SAMPLES_DIR / "08_synthetic_resume_prompt_too_long_reactive_compact.jsonl"
    cap = cc_lhc.Capture(home, "thread-1", "session-1", str(sample),
                         on_event=lambda event, _cap: events.append(event.kind),
                         on_responses=lambda _cap: events.append("responses"))
    cap.request_handoff = lambda **_: None
    assert cap.catch_up() > 0
    assert "responses" in events and str(cc_lhc.TOKENS.ahead_error) == "counting broke"
    cap.stop()


def test_the_split_pattern_and_special_tokens_are_tiktokens_own(monkeypatch):
    """cc-lhc builds tiktoken's core with o200k_base's pattern and special tokens held in
    its own code (importing the package costs more than the core): they must be the ones
    tiktoken_ext.openai_public defines."""
    pytest.importorskip("tiktoken")
    import tiktoken_ext.openai_public as public
    import cc_lhc
    monkeypatch.setattr(public, "load_tiktoken_bpe", lambda *_a, **_k: {})  # no download
    spec = public.o200k_base()
    assert cc_lhc.O200K_PATTERN == spec["pat_str"]
    assert cc_lhc.O200K_SPECIAL == spec["special_tokens"]


CORE_COUNTS = """
listed = json.load(open({listed!r}))
counts = cc_lhc.TOKENS.count_many(listed)
package_imported = "tiktoken" in sys.modules
import tiktoken
import tiktoken_ext.openai_public as public
public.load_tiktoken_bpe = lambda *_a, **_k: cc_lhc.TOKENS._ranks()
enc = tiktoken.Encoding(**public.o200k_base())
same_core = enc._core_bpe.__class__ is type(cc_lhc.TOKENS.encoding())
out = [counts, [len(enc.encode_ordinary(t)) for t in listed], package_imported, same_core]
"""


def test_counts_from_the_core_loaded_on_its_own_are_tiktokens(tmp_path):
    """The same counts as tiktoken's own Encoding (threads sharing the batch, lone surrogates
    read as tiktoken reads them, special tokens' text counted as text), without the tiktoken
    package imported for them; importing it afterwards takes the same core."""
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    texts = [line for path in sorted((REPO / "tests" / "fixtures").rglob("*.jsonl"))[:8]
             for line in path.read_text(encoding="utf-8", errors="replace").splitlines()[:30]]
    texts += ["a lone \ud800 surrogate", "\udfff", "<|endoftext|> and <|endofprompt|>", "", "日本語 ünïcödé"]
    listed = tmp_path / "texts.json"
    listed.write_text(json.dumps(texts))
    report = run_counts(tmp_path, CORE_COUNTS.format(listed=str(listed)))
    counts, tiktokens, package_imported, same_core = report["out"]
    assert report["built"] and report["exact"] and len(counts) == len(texts) > 100
    assert counts == tiktokens
    assert not package_imported and same_core


# -- an encoder built for the texts at hand (VocabIndex) --------------------------------

@pytest.fixture(scope="module")
def o200k():
    """(the whole o200k_base encoder, its ranks in rank order, their VocabIndex)."""
    pytest.importorskip("tiktoken")
    import base64
    import cc_lhc
    ranks = {}
    for line in DATA.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    core = cc_lhc._tiktoken_core()
    whole = core.CoreBPE(ranks, cc_lhc.O200K_SPECIAL, cc_lhc.O200K_PATTERN)
    tokens = cc_lhc._rank_order(ranks)
    return whole, tokens, cc_lhc.VocabIndex(cc_lhc.build_vocab_index(tokens))


# Characters that sit at the edges of o200k's pieces: every ASCII whitespace byte and the
# other whitespace Python's split() knows (U+001C..U+001F are not whitespace to the
# tokenizer's pattern), line ends after signs, contractions, digits in threes, marks,
# other scripts, emoji and lone surrogates.
EDGES = (list(" \t\n\r\x0b\x0c") * 6 + list("\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2009\u2028\u2029\u202f\u205f\u3000")
         + list(".,;:!?()[]{}<>/\\|\"'`~@#$%^&*-_=+") * 2 + ["'s", "'T", "'re", "'LL", "'d", "\r\n", ".\n/", "//\n"]
         + list("0123456789") + ["\u0663", "\u00bd", "\u2167"] + list("aeiouxyzAEQZ") * 3
         + ["é", "ß", "Σ", "ж", "日本", "語", "\u0301", "\u0e33", "한", "ـ", "👍", "🏳️‍🌈", "\ud800", "\udfff", "\ufffd", "\x00", "\x1b[31m"])


def fuzz_texts(seed, n):
    import random
    rnd = random.Random(seed)
    words = ["the", " quick", "Brown", "fox's", "HTTPServer", "snake_case", "kebab-case", "don't", "x86_64",
             "/usr/local/bin", "C:\\Users\\a", "deadbeef", "0xFF", "1234567", "==", "->", "…", "“quoted”",
             "Ünïcödé", "naïve", "straße", "日本語のテキスト", "Привет", "مرحبا", "שלום", "नमस्ते", "🙂🙃"]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rnd.randint(1, 40)):
            parts.append(rnd.choice(words) if rnd.random() < 0.4 else rnd.choice(EDGES) * rnd.choice([1, 1, 1, 2, 3, 9]))
        out.append("".join(parts))
    return out


def test_an_encoder_for_the_texts_at_hand_counts_exactly_as_the_whole_one(o200k):
    """Each text gets the smallest encoder there is for it (its own words only), the
    harshest case for the ranks it leaves out: every count equals the whole encoder's."""
    import cc_lhc
    whole, _tokens, index = o200k
    core = cc_lhc._tiktoken_core()
    texts = fuzz_texts(11, 1500) + [line for path in sorted(SAMPLES_DIR.glob("*.jsonl"))
                                    for line in path.read_text(encoding="utf-8").splitlines()[:60]]
    differ = []
    for text in texts:
        own = core.CoreBPE(index.ranks_for(cc_lhc.text_grams([text])[0]), cc_lhc.O200K_SPECIAL, cc_lhc.O200K_PATTERN)
        if cc_lhc._token_count(own, text) != cc_lhc._token_count(whole, text):
            differ.append(text)
    assert differ == []


def test_an_encoder_for_the_texts_at_hand_holds_a_fraction_of_the_ranks(o200k):
    """What makes it worth building: a session's worth of texts needs a few of the ranks."""
    import cc_lhc
    _whole, tokens, index = o200k
    texts = [line for path in sorted(SAMPLES_DIR.glob("*.jsonl")) for line in path.read_text(encoding="utf-8").splitlines()]
    assert sum(map(len, texts)) > 100_000
    picked = index.ranks_for(cc_lhc.text_grams(texts)[0])
    assert len(picked) < len(tokens) / 4
    assert all(tokens[rank] == token for token, rank in picked.items())  # each with its own rank


def test_too_many_words_for_an_encoder_of_their_own_take_the_whole_one():
    import cc_lhc
    assert cc_lhc.text_grams(["x" * (cc_lhc.SUBSET_TEXT_LIMIT + 1)]) is None
    many = [" ".join(f"w{i:07d}" for i in range(j, j + 1000)) for j in range(0, 80_000, 1000)]
    assert cc_lhc.text_grams(many) is None  # 80,000 distinct words: more than SUBSET_WORDS_LIMIT bytes
    assert cc_lhc.text_grams(many[:10])


FOR_TEXTS = """
batches = json.load(open({listed!r}))
out = [cc_lhc.TOKENS.count_many(batch) for batch in batches]
"""


def test_one_off_counts_build_encoders_for_their_texts_then_the_whole_one(tmp_path):
    """A process that counts a batch (measure, a rebuild before a launch) builds an encoder
    for it; a later batch its encoder covers reuses it; after SUBSET_BUILDS different ones
    the whole encoder is built. The counts are tiktoken's all along."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    (tmp_path / "state").mkdir()
    texts = [text * 200 for text in fuzz_texts(5, 40)]  # batches longer than SMALL_BATCH
    batches = [texts[:20], texts[3:9], texts[20:25], texts[25:30], texts[30:35], texts[35:]]
    assert min(sum(map(len, batch)) for batch in batches) > cc_lhc.SMALL_BATCH
    listed = tmp_path / "batches.json"
    listed.write_text(json.dumps(batches))
    report = run_counts(tmp_path, FOR_TEXTS.format(listed=str(listed)))
    assert report["encoders"] == ["for texts"] * cc_lhc.SUBSET_BUILDS + ["whole"]
    (tmp_path / "again").mkdir()
    direct = run_counts(tmp_path / "again", f"enc = cc_lhc.TOKENS.encoding(); out = [[cc_lhc._token_count(enc, t) "
                                             f"for t in b] for b in json.load(open({str(listed)!r}))]")
    assert report["out"] == direct["out"] and direct["encoders"] == ["whole"]


def test_a_batch_of_words_mostly_seen_reuses_the_encoder_whose_ranks_its_new_words_need(tmp_path):
    """A later batch made of a session's words plus a few new ones (a view's header with
    new labels, numbers and paths, however long) is counted with the encoder built for the
    session when that holds every rank the new words can use; new words needing ranks it
    lacks get an encoder of their own. Every count is the whole encoder's."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    (tmp_path / "state").mkdir()
    session = [line for path in sorted(SAMPLES_DIR.glob("*.jsonl"))
               for line in path.read_text(encoding="utf-8").splitlines()] + ["t1 t2 m10 m20 /home/user/a.py"]
    words = " ".join(session).split()[:3000]
    assert not any("日本" in w for w in words)
    header = " ".join(words) + " t3 m21 m22 /home/user/b.py"  # long: no short batch
    assert len(header) > cc_lhc.SMALL_BATCH
    batches = [session, [header], [header + " 日本語のテキスト"]]
    listed = tmp_path / "batches.json"
    listed.write_text(json.dumps(batches))
    (tmp_path / "again").mkdir()
    direct = run_counts(tmp_path / "again", f"enc = cc_lhc.TOKENS.encoding(); out = [[cc_lhc._token_count(enc, t) "
                                             f"for t in b] for b in json.load(open({str(listed)!r}))]")
    steps = run_counts(tmp_path, "batches = json.load(open({!r}))\nout = []\nfor b in batches:\n"
                       "    n = len(cc_lhc.TOKENS._for_texts)\n    c = cc_lhc.TOKENS.count_many(b)\n"
                       "    out.append([c, len(cc_lhc.TOKENS._for_texts) - n])".format(str(listed)))
    assert [c for c, _n in steps["out"]] == direct["out"]
    assert [n for _c, n in steps["out"]] == [1, 0, 1]  # the header reuses the session's; the CJK one cannot


def test_encoders_for_texts_at_hand_stop_at_a_bound_on_their_words(tmp_path):
    """Two large batches of different words: building a second encoder for them would cost
    more than the whole one, which is built instead."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    (tmp_path / "state").mkdir()
    half = cc_lhc.SUBSET_WORDS_LIMIT * 2 // 3 // 12  # words of 11 bytes and a space
    batches = [[" ".join(f"{p}{i:09d}" for i in range(j, min(j + 2000, half))) for j in range(0, half, 2000)]
               for p in ("a", "b")]
    listed = tmp_path / "batches.json"
    listed.write_text(json.dumps(batches))
    report = run_counts(tmp_path, FOR_TEXTS.format(listed=str(listed)))
    assert report["encoders"] == ["for texts", "whole"]


def test_a_process_that_asked_for_the_whole_encoder_builds_no_other(tmp_path):
    """A live session warms the whole encoder up (and counts ahead with it for hours)."""
    pytest.importorskip("tiktoken")
    (tmp_path / "state").mkdir()
    report = run_counts(tmp_path, "cc_lhc.TOKENS.encoding(); out = cc_lhc.TOKENS.count_many(['a', 'b c'])")
    assert report["encoders"] == ["whole"] and report["out"] == [1, 2]


SPIES = """
parsed, made = [], []
real_parse, real_make = cc_lhc.TokenCounter._parsed_ranks, cc_lhc.build_vocab_index
cc_lhc.TokenCounter._parsed_ranks = lambda self: parsed.append(1) or real_parse(self)
cc_lhc.build_vocab_index = lambda tokens: made.append(1) or real_make(tokens)
"""


def test_the_index_beside_the_rank_file_is_read_instead_of_the_rank_file(tmp_path):
    """A copy of cc-lhc as installed (the index the build made beside the rank file), no
    state folder: counts are exact and neither the rank file is parsed nor an index made,
    for a batch, a short text, or the whole encoder."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    assert (DATA.parent / cc_lhc.VOCAB_INDEX_FILE_NAME).is_file(), "run python3 build/tokenizer.py"
    body = SPIES + counts_of(TEXTS) + "\nout = [out, cc_lhc.TOKENS.encoding().encode_ordinary('hello world'), parsed, made]"
    report = run_counts(tmp_path, body)
    counts, whole, parsed, made = report["out"]
    assert report["exact"] and counts[:2] == [2, 501] and whole == [24912, 2375]
    assert parsed == [] and made == [] and not (tmp_path / "state").exists()


def test_a_damaged_or_foreign_vocabulary_index_is_never_trusted(tmp_path):
    """An index that fails its hash, beside the rank file or kept in the state folder, is
    not used: the ranks are parsed from the rank file and an index made and kept."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    (tmp_path / "state").mkdir()
    copy = tmp_path / "ranks" / "o200k_base.tiktoken"  # a rank file with no index beside it
    copy.parent.mkdir()
    copy.write_bytes(DATA.read_bytes())
    env = {"CC_LHC_TOKENIZER_FILE": str(copy)}
    body = SPIES + counts_of(TEXTS) + "\nout = [out, len(parsed), len(made)]"
    first = run_counts(tmp_path, body, env)
    assert first["encoders"] == ["for texts"] and first["out"][1:] == [1, 1]
    kept = next((tmp_path / "state" / "cache").glob("o200k_base-*-index*"))
    beside = copy.with_name(cc_lhc.VOCAB_INDEX_FILE_NAME)
    for index in (kept, beside):
        if index == beside:
            kept.rename(beside)  # the same index, now as the build puts it
        data = bytearray(index.read_bytes())
        data[len(data) // 2] ^= 0x40  # a flipped bit: the file's own hash no longer matches
        index.write_bytes(bytes(data))
        for extra in (tmp_path / "state" / "cache").glob("o200k-counts-*"):
            extra.unlink()  # (nothing counted before; the check of the rank file forgotten)
        again = run_counts(tmp_path, body, env)
        assert again["out"] == [first["out"][0], 1, 1] and again["encoders"] == ["for texts"]
        assert kept.read_bytes() != bytes(data)  # made again from the ranks and kept
    other = "big" if sys.byteorder == "little" else "little"
    built = cc_lhc.build_vocab_index([b"a", b"b", b"ab"])
    with pytest.raises(ValueError):
        cc_lhc.VocabIndex((other,) + built[1:])
    # a sound file of other tokens (its own hash right) is not o200k_base's index
    assert cc_lhc.parse_vocab_index(cc_lhc.vocab_index_bytes(built)) is None
    assert cc_lhc.parse_vocab_index(b"") is None


def test_the_index_is_checked_against_o200k_base_s_own_tokens(o200k):
    """O200K_TOKENS_SHA256 is the digest of the rank file's tokens (a test makes it from the
    rank file, not from an index); an index whose tokens or bounds differ is refused."""
    import cc_lhc
    from array import array
    _whole, tokens, _index = o200k
    bounds = array("I", itertools.accumulate(map(len, tokens), initial=0))
    assert cc_lhc.tokens_digest(b"".join(tokens), bounds.tobytes(), sys.byteorder) == cc_lhc.O200K_TOKENS_SHA256
    good = cc_lhc.vocab_index_bytes(cc_lhc.build_vocab_index(tokens))
    assert cc_lhc.parse_vocab_index(good) is not None
    swapped = list(tokens)
    swapped[1000], swapped[1001] = swapped[1001], swapped[1000]  # two ranks traded
    assert cc_lhc.parse_vocab_index(cc_lhc.vocab_index_bytes(cc_lhc.build_vocab_index(swapped))) is None
    for cut in (1, 100, len(good) // 2):
        assert cc_lhc.parse_vocab_index(good[:-cut]) is None


def test_a_named_rank_file_that_fails_its_checksum_is_not_vouched_for_by_an_index_beside_it(tmp_path):
    """CC_LHC_TOKENIZER_FILE names that file or nothing: a sound index beside a damaged
    rank file does not make counts exact."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    folder = tmp_path / "ranks"
    folder.mkdir()
    data = bytearray(DATA.read_bytes())
    data[100] ^= 0x01
    (folder / "o200k_base.tiktoken").write_bytes(bytes(data))
    (folder / cc_lhc.VOCAB_INDEX_FILE_NAME).write_bytes((DATA.parent / cc_lhc.VOCAB_INDEX_FILE_NAME).read_bytes())
    report = run_report(tmp_path, {"CC_LHC_TOKENIZER_FILE": str(folder / "o200k_base.tiktoken")})
    assert report["exact"] is False and "checksum" in report["reason"]


def test_short_batches_get_encoders_of_their_own_and_never_the_whole_one(tmp_path):
    """A view's header is counted once per try at fitting the view, each time a little
    different: each gets an encoder of the ranks found in it (exact) when none built before
    holds them, and a few such never make a process build the whole encoder."""
    pytest.importorskip("tiktoken")
    import cc_lhc
    (tmp_path / "state").mkdir()
    texts = fuzz_texts(23, 60)
    batches = [[t * 200 for t in texts[:40]]] + [[t] for t in texts[40:40 + cc_lhc.SMALL_BUILDS]]
    listed = tmp_path / "batches.json"
    listed.write_text(json.dumps(batches))
    report = run_counts(tmp_path, FOR_TEXTS.format(listed=str(listed)))
    # (one each, unless an encoder built before holds every rank its new words can use)
    assert "whole" not in report["encoders"] and 2 <= len(report["encoders"]) <= 1 + cc_lhc.SMALL_BUILDS
    (tmp_path / "again").mkdir()
    direct = run_counts(tmp_path / "again", f"enc = cc_lhc.TOKENS.encoding(); out = [[cc_lhc._token_count(enc, t) "
                                             f"for t in b] for b in json.load(open({str(listed)!r}))]")
    assert report["out"] == direct["out"]


@pytest.mark.parametrize("order", ["little", "big"])
def test_a_4_gram_gives_its_first_3_and_those_their_first_2_bytes_in_either_byte_order(order):
    """The picker reads grams natively: the masks must agree with int.from_bytes in the
    machine's own order (on a big-endian one too, where 3 -> 2 is a shift of one byte)."""
    import random
    import cc_lhc
    three, two = cc_lhc._gram_masks(order)
    rnd = random.Random(7)
    for raw in [b"abcd", b"\x00\x00\x00\x00", b"\xff\xff\xff\xff"] + [rnd.randbytes(4) for _ in range(500)]:
        gram = int.from_bytes(raw, order)
        assert three(gram) == int.from_bytes(raw[:3], order)
        assert two(three(gram)) == int.from_bytes(raw[:2], order)


def test_the_index_keeps_its_tables_in_order_whatever_the_vocabulary():
    """A vocabulary whose longer word-parts all start differently (as many first 4-byte
    keys as rows) or share one start: the keys stay sorted and every rank is found."""
    import cc_lhc
    single = [bytes([b]) for b in range(256)]
    for extra in ([b"zzzzz1", b"aaaaa1", b"mmmmm1"], [b"zzzzz1", b"aaaaa1", b"aaaaa2", b"mmmmm1"],
                  [b"qqqqq", b"qqqqqq", b"qqqqqqq"], [b" hello", b"world", b"hello world"]):
        tokens = single + extra
        index = cc_lhc.VocabIndex(cc_lhc.build_vocab_index(tokens))
        assert list(index.keys) == sorted(set(index.keys))
        for rank, token in enumerate(tokens[256:], start=256):
            picked = index.ranks_for(cc_lhc.text_grams([token.decode()])[0])
            assert picked.get(token) == rank, (extra, token)


def test_a_header_fitted_again_with_other_numbers_reuses_the_encoder_that_holds_its_ranks(o200k):
    """Fitting a view counts its header once a round, each time with other label numbers:
    an encoder built before that holds every rank the new one can use counts it (exactly),
    so a fitting builds one encoder for its headers, not one a round."""
    import cc_lhc
    whole, _tokens, _index = o200k
    counter = cc_lhc.TokenCounter()
    assert counter.usable()
    counter.count_many(["the parser reads each record; " * 400])
    headers = [f"[cc-lhc] rebuilt from thread 3f2a9c1e. In view, verbatim: t{a}-t{a + 19}; lean: t{a - 9}-t{a - 1}. "
               f"Out of view: m1-m{a * 7}." for a in range(10, 90, 10)]
    counts = [counter.count_many([h])[0] for h in headers]
    assert counts == [cc_lhc._token_count(whole, h) for h in headers]
    assert counter._small_builds == 1


def test_measure_without_the_tokenizer_gives_no_second_estimate(tmp_path):
    """Without the tokenizer measure's table is the safe estimate already: no line under it
    sets that estimate against itself (it said "counts these sessions 1,190 tokens against
    1,190")."""
    samples = REPO / "tests" / "fixtures" / "samples"
    code = ("import sys; sys.modules['tiktoken'] = None; sys.path.insert(0, sys.argv[1]); import cc_lhc; "
            "cc_lhc.main(['measure', sys.argv[2]]); cc_lhc.main(['measure', sys.argv[3]])")
    env = dict(os.environ, CC_LHC_HOME=str(tmp_path / "state"))
    proc = subprocess.run([sys.executable, "-c", code, str(REPO), str(samples),
                           str(samples / "02_tool_roundtrip_thinking.jsonl")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.stdout.count("tokens: approximate") == 2, proc.stderr
    assert "the safe estimate used without the tokenizer" not in proc.stdout


def test_measure_counts_the_header_with_the_encoder_built_for_the_session(tmp_path):
    """measure counts a session's messages in one batch, then the view's header: the words a
    header is made of go into that batch, so the encoder built for the messages counts the
    header too (it built one of its own, about 15 ms of a first count), and the figures
    are the ones the whole encoder gives."""
    pytest.importorskip("tiktoken")
    sample = REPO / "tests" / "fixtures" / "samples" / "02_tool_roundtrip_thinking.jsonl"
    body = ("r = cc_lhc.measure_transcript({path!r}, 'default', 2_000)\n"
            "out = [r['tokens'], r['smart_compact_tokens'], len(cc_lhc.TOKENS._for_texts)]\nsaved_later = True")
    for d in ("a", "b"):
        (tmp_path / d / "state").mkdir(parents=True)
    subset = run_counts(tmp_path / "a", body.format(path=str(sample)))
    whole = run_counts(tmp_path / "b", "cc_lhc.TOKENS._whole_wanted = True\n" + body.format(path=str(sample)))
    assert subset["exact"] and whole["exact"]
    assert subset["out"][2] == 1, subset  # one encoder: none built for the header alone
    assert subset["out"][:2] == whole["out"][:2] and whole["out"][2] == 0


def test_a_long_text_counted_in_parts_counts_as_the_whole(o200k, monkeypatch):
    """A long text is counted a part at a time (the core's list of tokens for a 12 MB prompt
    was 100 MB of Python ints), cut only where o200k's pieces cannot span: the parts' counts
    add up to the whole text's, at every cut the fuzzed texts offer."""
    import tracemalloc
    import cc_lhc
    whole = o200k[0]
    monkeypatch.setattr(cc_lhc, "COUNT_PIECE_CHARS", 3)  # (a cut at each place allowed)
    for text in fuzz_texts(41, 3000) + [" ".join(fuzz_texts(42, 50)), "\n".join(fuzz_texts(43, 50))]:
        parts = list(cc_lhc._count_parts(text))
        assert "".join(parts) == text
        assert cc_lhc._token_count(whole, text) == len(whole.encode_ordinary(cc_lhc.core_text(text))), repr(text)
    monkeypatch.setattr(cc_lhc, "COUNT_PIECE_CHARS", 1 << 20)
    big = "\n".join(f"line {i}: the value was {i * 7} and then some words" for i in range(250_000))
    assert len(big) > 10_000_000 and len(list(cc_lhc._count_parts(big))) > 5
    tracemalloc.start()
    n = cc_lhc._token_count(whole, big)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert n == len(whole.encode_ordinary(big))
    assert peak < 30_000_000, peak  # (its 3.5 million tokens at once: 120 MB)
