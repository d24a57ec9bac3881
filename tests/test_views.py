"""Views (section 6) and rebuilt records (section 7), in process: bands, budgets, stubs,
thinking replay, the header, determinism, and a randomized proof that everything a view
leaves out is named and comes back byte for byte through get-turns / get-messages.

Threads reach the store the way a live session does: transcript lines (written here by
``Transcript``, or by scripts/gen_transcript.py) read in by ``cc_lhc.Capture``.
"""

from __future__ import annotations

import datetime
import json
import random
import re
import sys
import uuid
from pathlib import Path

import pytest

import cc_lhc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from gen_transcript import generate  # noqa: E402

RANK = {"full": 0, "lean": 1, "summary": 2, "omitted": 3}
NOW = "2026-05-01T12:00:00.000Z"
NS = uuid.UUID("0b7f6d1e-3c2a-4e55-8d21-6a9e0f1c2b3d")
STUB_RE = re.compile(r"^\[output of (\S+) m(\d+): (\d+) lines, ([\d.]+ (?:B|KB|MB)) "
                     r"\u00b7 cc-lhc get-messages m(\d+)\]$")
RECEIPT_RE = re.compile(rb"\n\[cut: (\d+) of (\d+) bytes shown so far\. The rest: "
                        rb"cc-lhc (\S+) --from (\d+) (.*)\]\n</cc-lhc-recall>\n\Z")
CLOSING = b"</cc-lhc-recall>\n"


# -- transcripts written by hand ----------------------------------------------------------

class Transcript:
    """Claude Code-shaped transcript lines (REAL-CLAUDE.md "Transcripts"): one record per
    content block of a response, sharing message.id; tool results as user records."""

    def __init__(self, session_id=None, cwd="/home/u/proj", model="claude-test-model"):
        self.session_id = session_id or str(uuid.uuid4())
        self.cwd, self.model = cwd, model
        self.records = []
        self.parent = None
        self.n = self.responses = self.tools = 0

    def _record(self, rtype, **body):
        self.n += 1
        uid = str(uuid.uuid5(NS, f"{self.session_id}/{self.n}"))
        ts = (datetime.datetime(2026, 5, 1, tzinfo=datetime.timezone.utc)
              + datetime.timedelta(seconds=self.n)).isoformat(timespec="milliseconds")
        rec = {"parentUuid": self.parent, "isSidechain": False, "userType": "external",
               "entrypoint": "cli", "cwd": self.cwd, "sessionId": self.session_id,
               "version": "2.1.328", "gitBranch": "main", "type": rtype, **body,
               "uuid": uid, "timestamp": ts.replace("+00:00", "Z")}
        self.records.append(rec)
        self.parent = uid
        return rec

    def envelope(self):
        self._record("attachment", attachment={"type": "environment", "cwd": self.cwd,
                                               "platform": "linux"})
        self._record("attachment", attachment={"type": "date", "date": "2026-05-01"})

    def prompt(self, text):
        self._record("user", message={"role": "user", "content": text})

    def response(self, *blocks, stop="end_turn"):
        """One API response; returns its blocks (tool_use blocks get ids)."""
        self.responses += 1
        mid = f"msg_test_{self.responses:05d}"
        out = []
        for block in blocks:
            if block["type"] == "tool_use" and "id" not in block:
                self.tools += 1
                block = dict(block, id=f"toolu_test_{self.session_id[:4]}_{self.tools:05d}")
            self._record("assistant", requestId=f"req_{mid}",
                         message={"id": mid, "type": "message", "role": "assistant",
                                  "model": self.model, "content": [block], "stop_reason": stop,
                                  "stop_sequence": None,
                                  "usage": {"input_tokens": 10, "output_tokens": 5}})
            out.append(block)
        return out

    def results(self, *items):
        """One user record holding tool results: (tool_use_id, content, is_error)."""
        content = [{"type": "tool_result", "tool_use_id": tid, "content": text, "is_error": err}
                   for tid, text, err in items]
        self._record("user", message={"role": "user", "content": content},
                     toolUseResult=items[0][1] if isinstance(items[0][1], str) else "")

    def write(self, path):
        with open(path, "w", encoding="utf-8") as f:
            for rec in self.records:
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")
        return path


def thinking(text, signature="sig-" + "A" * 40):
    block = {"type": "thinking", "thinking": text}
    if signature is not None:
        block["signature"] = signature
    return block


def text(t):
    return {"type": "text", "text": t}


def tool_use(name, **inp):
    return {"type": "tool_use", "name": name, "input": inp}


WORDS = ("cache parser token view band stub lease thread alias budget label turn segment "
         "émigré naïve 東京 データ Ωμέγα 😀 🚀 € ü").split()


def words(r, n):
    return " ".join(r.choice(WORDS) for _ in range(n))


def tool_output(r):
    """(content, is_error): tiny, medium, large (multi-byte) outputs, short and long errors."""
    kind = r.choice(("tiny", "medium", "large", "error", "long_error", "lines", "blocks"))
    if kind == "tiny":
        return words(r, r.randint(0, 8)), False
    if kind == "medium":
        return "\n".join(words(r, 10) for _ in range(r.randint(5, 40))), False
    if kind == "large":
        return "\n".join(f"{i:05d} " + words(r, 12) for i in range(r.randint(200, 900))), False
    if kind == "error":
        return "Error: exit status 2\n" + words(r, r.randint(3, 30)), True
    if kind == "long_error":
        return "Traceback:\n" + "\n".join(words(r, 12) for _ in range(60)), True
    if kind == "lines":
        return "\n".join(str(i) for i in range(r.randint(1, 3000))) + "\n", False
    return [{"type": "text", "text": words(r, 20)}, {"type": "text", "text": words(r, 300)}], False


def random_transcript(seed, turns=10):
    """A thread with thinking (signed and unsigned), parallel tool calls, large and error
    outputs, multi-byte text, and interrupted turns whose tool call never got a result."""
    r = random.Random(seed)
    tr = Transcript(session_id=str(uuid.UUID(int=r.getrandbits(128), version=4)))
    tr.envelope()
    for i in range(turns):
        tr.prompt(f"prompt {i}: " + words(r, r.randint(2, 40)))
        interrupted = r.random() < 0.2
        steps = r.randint(0, 3) + (1 if interrupted else 0)
        for step in range(steps):
            blocks = []
            if r.random() < 0.5:
                blocks.append(thinking(words(r, r.randint(5, 80)),
                                       None if r.random() < 0.25 else f"sig-{seed}-{i}-{step}=="))
            if r.random() < 0.5:
                blocks.append(text(words(r, r.randint(1, 30))))
            calls = []
            for _ in range(r.randint(1, 3)):
                name = r.choice(("Bash", "Read", "Edit", "Grep"))
                if name in ("Read", "Edit"):
                    calls.append(tool_use(name, file_path=f"/home/u/proj/f{r.randint(1, 5)}.py"))
                else:
                    calls.append(tool_use(name, command=words(r, 4)))
            sent = tr.response(*blocks, *calls, stop="tool_use")
            if interrupted and step == steps - 1:
                break  # the user pressed Esc: no result ever comes for these calls
            ids = [b["id"] for b in sent if b["type"] == "tool_use"]
            outputs = [(tid, *tool_output(r)) for tid in ids]
            if r.random() < 0.5:
                tr.results(*outputs)
            else:
                for item in outputs:
                    tr.results(item)
        if interrupted:
            continue
        final = [text(words(r, r.randint(1, 60)))]
        if r.random() < 0.5:
            final.insert(0, thinking(words(r, 20), f"sig-final-{seed}-{i}=="))
        tr.response(*final, stop="end_turn")
    tr.prompt("the last word")
    tr.response(text("the last answer"), stop="end_turn")
    return tr


# -- intake and retrieval -----------------------------------------------------------------

class Thread:
    def __init__(self, home, thread_id, session_id, store):
        self.home, self.id, self.session_id, self.store = home, thread_id, session_id, store

    @property
    def turns(self):
        return cc_lhc.load_turns(self.store)

    def messages(self):
        return {m["seq"]: m for m in self.store.messages()}


def intake(path, session_id, cwd="/home/u/proj") -> Thread:
    """Read a transcript into a new thread of the current CC_LHC_HOME, as capture does."""
    home = cc_lhc.StateHome()
    home.ensure()
    thread_id = cc_lhc.Registry(home).create_thread(session_id, cwd, "test")
    cap = cc_lhc.Capture(home, thread_id, session_id, str(path))
    cap.catch_up()
    cap.stop()
    return Thread(home, thread_id, session_id, cc_lhc.ThreadStore(home, thread_id))


def intake_transcript(tr: Transcript, tmp_path) -> Thread:
    return intake(tr.write(tmp_path / f"{tr.session_id}.jsonl"), tr.session_id, tr.cwd)


def grant(thread: Thread, monkeypatch) -> dict:
    """A real retrieval descriptor for the thread's current session, inherited as Claude would."""
    desc = cc_lhc.create_descriptor(thread.home, cc_lhc.HostDB(thread.home), thread.id,
                                    thread.session_id)
    monkeypatch.setenv(cc_lhc.RUNTIME_ENV, desc["path"])
    return desc


def retrieve(capsysbinary, command, *labels, limit_calls=1000, between=None):
    """Run get-turns / get-messages in process, following --from receipts to the end, each
    run as its receipt words it (``between()`` runs before each continuation).

    Returns (body, calls): the exact body bytes the pieces join into."""
    import shlex
    fn = {"get-turns": cc_lhc.cmd_get_turns, "get-messages": cc_lhc.cmd_get_messages,
          "search": cc_lhc.cmd_search}[command]
    body, calls, args = b"", 0, list(labels)
    capsysbinary.readouterr()
    while True:
        calls += 1
        assert calls <= limit_calls, "continuation never ends"
        assert fn(args) == 0
        out = capsysbinary.readouterr().out
        assert len(out) <= cc_lhc.RETRIEVAL_CEILING
        opening, _, rest = out.partition(b"\n")
        assert opening.startswith(b'<cc-lhc-recall thread="') and opening.endswith(b'">')
        out.decode("utf-8")  # every piece is whole UTF-8
        cut = RECEIPT_RE.search(rest)
        if cut is None:
            assert rest.endswith(CLOSING)
            return body + rest[:-len(CLOSING)], calls
        body += rest[:cut.start()]
        assert int(cut.group(1)) == len(body)
        assert cut.group(3).decode() == command
        args = ["--from", cut.group(4).decode(), *shlex.split(cut.group(5).decode())]
        if between is not None:
            between()


def expected_turn_body(thread: Thread, n: int) -> bytes:
    kind, status = thread.store.db.execute("SELECT kind, status FROM turns WHERE n = ?", (n,)).fetchone()
    parts = [f"=== t{n} ({kind}, {status}) ===\n"]
    parts += [cc_lhc.render_message_body(m) for m in thread.store.messages(n, n)]
    return "".join(parts).encode("utf-8")


def content_of(m) -> str:
    return m["text"] if m["text"] is not None else (m["data"] or "")


def assert_in_order(body: bytes, messages):
    """Each message's label line and exact content appear in the body, in order."""
    at = 0
    for m in messages:
        head = f"--- m{m['seq']} \u00b7 {m['role']} \u00b7 {m['kind']}".encode()
        at = body.index(head, at)
        at = body.index(b"\n" + content_of(m).encode("utf-8") + b"\n", at) + 1


# -- record checks ------------------------------------------------------------------------

def blocks_of(rec):
    content = rec["message"]["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def assert_tool_blocks_paired(records):
    """As the API sees it: every tool_use answered by a tool_result before the next response
    or prompt, every tool_result answering a tool_use just made, nothing left open."""
    pending, current = set(), None
    for rec in records:
        if rec["type"] == "assistant":
            mid = rec["message"]["id"]
            if mid != current:
                assert not pending, f"tool calls {pending} have no result before response {mid}"
                current = mid
            for b in blocks_of(rec):
                if b.get("type") == "tool_use":
                    pending.add(b["id"])
                assert b.get("type") != "tool_result"
        elif rec["type"] == "user":
            blocks = blocks_of(rec)
            results = [b for b in blocks if b.get("type") == "tool_result"]
            if not results:
                assert not pending, f"tool calls {pending} have no result before a prompt"
                current = None
            for b in results:
                assert b["tool_use_id"] in pending, f"tool_result {b['tool_use_id']} without its call"
                pending.discard(b["tool_use_id"])
    assert not pending


def assert_chain(records):
    parent = None
    for rec in records:
        assert rec["parentUuid"] == parent
        parent = rec["uuid"]
    assert len({r["uuid"] for r in records}) == len(records)


BAND_WORDS = {"full": "verbatim", "lean": "lean (tool outputs replaced by stubs; thinking left out)",
         "summary": "summarised below"}
LINE_PREFIXES = (("full", "In view, verbatim: "),
                 ("lean", "In view, lean (tool outputs replaced by stubs; thinking left out): "),
                 ("summary", "In view, summarised below: "))


def header_parts(header: str):
    """turn -> how the header names it: 'full', 'lean', 'summary' (range lines and summary
    labels) or 'omitted' (the contract's line)."""
    named, splits, split = {}, {}, None

    def expand(spec):
        for piece in spec.split(", "):
            a, _, b = piece.partition("\u2013")
            for n in range(int(a[1:]), int((b or a)[1:]) + 1):
                yield n

    for line in header.splitlines():
        for band, prefix in LINE_PREFIXES:
            if line.startswith(prefix):
                for n in expand(line[len(prefix):]):
                    assert n not in named
                    named[n] = band
        m = re.fullmatch(r"turns t(\d+)\u2013t(\d+) not in view; use get-turns", line)
        if m:
            for n in range(int(m.group(1)), int(m.group(2)) + 1):
                assert n not in named
                named[n] = "omitted"
        m = re.fullmatch(r"t(\d+) is long, so it is in view in parts:", line)
        if m:
            split = int(m.group(1))
            assert split not in named
            named[split] = "split"
            splits[split] = []
            continue
        m = re.fullmatch(r"  m(\d+)(?:\u2013m(\d+))? (.*)", line)
        if m and split is not None:
            a, b = int(m.group(1)), int(m.group(2) or m.group(1))
            words = {w: band for band, w in BAND_WORDS.items()}
            rest = m.group(3)
            band = words.get(rest) or ("omitted" if rest.startswith("not in view; use get-messages ")
                                       else None)
            assert band, line
            splits[split].append((a, b, band, rest.partition("get-messages ")[2]))
            continue
        split = None
    summary_labels = {int(m.group(1)) for m in re.finditer(r"^  t(\d+): ", header, re.M)}
    part_labels = {(int(m.group(1)), int(m.group(2)), int(m.group(3) or m.group(2)))
                   for m in re.finditer(r"^  t(\d+) m(\d+)(?:\u2013m(\d+))?: ", header, re.M)}
    return named, summary_labels, splits, part_labels


def build(thread: Thread, budget, profile="default", favoured=(), arm=None, fallback=False):
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    view = cc_lhc.build_view(thread.id, turns, budget, profile, summaries, favoured)
    header = cc_lhc.render_header(view, cc_lhc.working_set(turns), fallback)
    records = cc_lhc.view_records(view, turns, header, "11111111-2222-4333-8444-555555555555",
                                  "/home/u/proj", NOW, arm=arm)
    return turns, view, header, records


# -- allocation ---------------------------------------------------------------------------

def test_profile_shares_are_written_down():
    assert set(cc_lhc.PROFILE_SHARES) == set(cc_lhc.PROFILES)
    for profile, shares in cc_lhc.PROFILE_SHARES.items():
        assert set(shares) == {"full", "lean", "summary"}
        assert abs(sum(shares.values()) - 1.0) < 1e-9, profile
    # newest-first favours detail by default, history in `historical`
    d, h = cc_lhc.PROFILE_SHARES["default"], cc_lhc.PROFILE_SHARES["historical"]
    assert d["full"] > h["full"] and d["summary"] < h["summary"]


def _uniform_turns(count, out_bytes=4000):
    """Turns that all cost the same in each band (pure Turn objects, no store)."""
    cols = cc_lhc.MESSAGE_COLUMNS

    def msg(**kw):
        d = dict.fromkeys(cols)
        d.update(kw)
        return d

    turns = []
    for n in range(1, count + 1):
        s = 1000 + 4 * n  # same digit count in every stub: equal costs
        tid = f"toolu_{n}"
        turns.append(cc_lhc.Turn(n, "prompt", "closed", [
            msg(seq=s, turn=n, role="user", kind="user_text", text="q" * 36),
            msg(seq=s + 1, turn=n, role="assistant", kind="tool_call", text='{"command":"x"}',
                data=json.dumps({"type": "tool_use", "id": tid, "name": "Bash",
                                 "input": {"command": "x"}}),
                tool_use_id=tid, tool_name="Bash", response_id=f"r{n}", model="m"),
            msg(seq=s + 2, turn=n, role="user", kind="tool_result", text="y" * out_bytes,
                tool_use_id=tid, is_error=0),
            msg(seq=s + 3, turn=n, role="assistant", kind="assistant_text", text="a" * 36,
                response_id=f"r{n}b", model="m")]))
    return turns


@pytest.mark.parametrize("profile", sorted(cc_lhc.PROFILE_SHARES))
@pytest.mark.parametrize("budget", [3_000, 9_000, 20_000])
def test_each_profile_splits_the_budget_by_its_shares(profile, budget):
    turns = _uniform_turns(40)
    summaries = {t.n: ("s" * 80, "extractive") for t in turns}
    F, L = cc_lhc.band_cost(turns[0], "full"), cc_lhc.band_cost(turns[0], "lean")
    S = cc_lhc.band_cost(turns[0], "summary", "s" * 80)
    assert F > L > S
    shares = cc_lhc.PROFILE_SHARES[profile]
    caps = {b: int(budget * shares[b]) for b in ("full", "lean", "summary")}
    # the allocation worked out by hand: each band fills its share, what it leaves passes down
    n_full = min(40, caps["full"] // F)
    left = caps["full"] - n_full * F + caps["lean"]
    n_lean = min(40 - n_full, left // L)
    left = left - n_lean * L + caps["summary"]
    n_summary = min(40 - n_full - n_lean, left // S)
    # whole turns here (no segment cut): the shares alone decide
    view = cc_lhc.build_view("t", turns, budget, profile, summaries, soft_tokens=10**9)
    got = [len(view.turns_in(b)) for b in ("full", "lean", "summary", "omitted")]
    assert got == [n_full, n_lean, n_summary, 40 - n_full - n_lean - n_summary]
    assert view.costs == {"full": n_full * F, "lean": n_lean * L, "summary": n_summary * S}


def _cumulative_room(view, budget, profile, band, without=0, without_band="omitted"):
    """What each cumulative cap from ``band`` on leaves free, were ``without`` tokens taken
    back out of ``without_band`` (they free room only at that band's level and below)."""
    shares = cc_lhc.PROFILE_SHARES[profile]
    return [sum(int(budget * shares[b]) for b in cc_lhc.BANDS[:k + 1])
            - sum(view.costs[b] for b in cc_lhc.BANDS[:k + 1])
            + (without if k >= RANK[without_band] else 0)
            for k in range(cc_lhc.BANDS.index(band), len(cc_lhc.BANDS))]


def test_bands_best_that_fits_and_within_budget():
    """Whole turns of mixed sizes: every band within its share plus what better bands left,
    and no turn in a worse band than the budget required (a better one would not fit even
    with the turn's own cost taken back out)."""
    r = random.Random(7)
    for seed in range(120):
        turns = _uniform_turns(25)
        for t in turns:  # vary each turn's size
            t.messages[2]["text"] = "y" * r.choice((10, 300, 2000, 9000, 40000))
        summaries = {t.n: ("s" * r.randint(20, 600), "extractive") for t in turns if r.random() < 0.9}
        for profile in cc_lhc.PROFILE_SHARES:
            budget = r.choice((200, 1000, 4000, 12000, 30000, 100000))
            view = cc_lhc.build_view("t", turns, budget, profile, summaries, soft_tokens=10**9)
            assert sum(view.costs.values()) <= budget, (seed, profile, budget, view.costs)
            cost = {}
            for t in turns:
                for band in ("full", "lean", "summary"):
                    cost[t.n, band] = cc_lhc.band_cost(t, band, summaries.get(t.n, ("", ""))[0])
            for band in ("full", "lean", "summary"):
                assert view.costs[band] == sum(cost[t.n, band] for t in turns if view.bands[t.n] == band)
            # cumulatively no band takes more than its share plus what better bands left
            shares = cc_lhc.PROFILE_SHARES[profile]
            cap = used = 0
            for band in ("full", "lean", "summary"):
                cap += int(budget * shares[band])
                used += view.costs[band]
                assert used <= cap
            for t in turns:
                got = view.bands[t.n]
                own = cost[t.n, got] if got != "omitted" else 0
                for better in ("full", "lean", "summary")[:RANK[got]]:
                    if better == "summary" and t.n not in summaries:
                        continue
                    room = _cumulative_room(view, budget, profile, better, own, got)
                    assert min(room) < cost[t.n, better], (seed, profile, budget, t.n, got, better)


def test_a_big_turn_does_not_push_the_small_turns_before_it_down():
    # The old allocation was monotone by age: once the big turn fell to lean, every older
    # turn followed it. Small turns that fit the full share stay verbatim.
    turns = _uniform_turns(12, out_bytes=400)
    turns[8].messages[2]["text"] = "y" * 60_000  # t9: far bigger than the full share
    summaries = {t.n: ("s" * 80, "extractive") for t in turns}
    view = cc_lhc.build_view("t", turns, 12_000, "default", summaries, soft_tokens=10**9)
    assert view.bands[9] in ("lean", "summary")
    assert all(view.bands[n] == "full" for n in range(1, 13) if n != 9), view.bands
    assert sum(view.costs.values()) <= 12_000


def test_turns_retrieved_recently_are_favoured():
    turns = _uniform_turns(30)
    for t in turns:
        t.messages[3]["text"] = "a" * 800  # a lean turn costs more than its summary
    summaries = {t.n: ("s" * 200, "extractive") for t in turns}
    plain = cc_lhc.build_view("t", turns, 5000, "default", summaries)
    omitted, summarised = plain.turns_in("omitted"), plain.turns_in("summary")
    assert omitted and summarised
    favoured = {omitted[0], summarised[0], 30}
    lifted = cc_lhc.build_view("t", turns, 5000, "default", summaries, favoured=favoured)
    assert lifted.bands[omitted[0]] == lifted.bands[summarised[0]] == "lean"
    assert lifted.bands[30] == plain.bands[30] == "full"  # already in view: left alone
    assert sum(lifted.costs.values()) <= 5000
    rest = [lifted.bands[t.n] for t in reversed(turns) if t.n not in favoured]
    assert [RANK[b] for b in rest] == sorted(RANK[b] for b in rest)
    # favour is bounded by the lean share: a turn too big for it is not lifted
    big = _uniform_turns(30)
    big[0].messages[3]["text"] = "a" * 60_000  # too big for lean even with stubs
    view = cc_lhc.build_view("t", big, 5000, "default", summaries, favoured={1})
    assert view.bands[1] in ("summary", "omitted")


# -- over real threads ----------------------------------------------------------------------

@pytest.fixture
def random_threads(tmp_path):
    return [intake_transcript(random_transcript(seed, turns=8 + seed % 5), tmp_path)
            for seed in range(6)]


def test_tool_pairs_kept_or_stubbed_together_and_records_are_valid(random_threads):
    for thread in random_threads:
        messages = thread.messages()
        unpaired_calls = {m["tool_use_id"] for m in messages.values() if m["kind"] == "tool_call"} - \
            {m["tool_use_id"] for m in messages.values() if m["kind"] == "tool_result"}
        assert unpaired_calls, "the generator makes interrupted turns"
        for budget in (300, 2_000, 6_000, 15_000, 60_000, 10**6):
            for profile in cc_lhc.PROFILE_SHARES:
                turns, view, header, records = build(thread, budget, profile)
                assert_chain(records)
                assert_tool_blocks_paired(records)
                seen_calls, seen_results = set(), set()
                for rec in records:
                    for b in blocks_of(rec):
                        if b.get("type") == "tool_use":
                            seen_calls.add(b["id"])
                        if b.get("type") == "tool_result":
                            seen_results.add(b["tool_use_id"])
                assert seen_calls == seen_results
                assert not seen_calls & unpaired_calls
                for t in turns:
                    band_of = {}
                    for m in t.messages:
                        if m["kind"] in ("tool_call", "tool_result") and \
                                m["tool_use_id"] not in unpaired_calls:
                            band_of.setdefault(m["tool_use_id"], set()).add(
                                view.band_of(t.n, m["seq"]))
                    for tid, bands in band_of.items():
                        assert len(bands) == 1, (tid, bands)  # a call and its result never part
                        assert (tid in seen_calls) == (bands <= {"full", "lean"})
                assert records[-1]["type"] == "assistant"  # never ends on the header alone


def test_lean_stubs_state_lines_size_and_the_way_back(random_threads):
    checked = verbatim_errors = 0
    for thread in random_threads:
        messages = thread.messages()
        for t in thread.turns:
            names = {m["tool_use_id"]: m["tool_name"] for m in t.messages if m["kind"] == "tool_call"}
            for m, stub in cc_lhc.visible_messages(t, "lean"):
                assert m["kind"] != "thinking"
                if m["kind"] != "tool_result":
                    continue
                size = len((m["text"] or "").encode("utf-8"))
                if stub is None:
                    assert size <= cc_lhc.STUB_KEEP_BYTES or (
                        m["is_error"] and size <= cc_lhc.ERROR_KEEP_BYTES)
                    verbatim_errors += bool(m["is_error"] and size > cc_lhc.STUB_KEEP_BYTES)
                    continue
                match = STUB_RE.match(stub)
                assert match, stub
                name, seq, lines, human, back = match.groups()
                assert int(seq) == int(back) == m["seq"] and name == names[m["tool_use_id"]]
                text_ = messages[m["seq"]]["text"]
                assert int(lines) == len(text_.splitlines())
                assert human == cc_lhc._human_size(size)
                checked += 1
    assert checked > 10 and verbatim_errors > 0


def test_short_error_output_stays_verbatim_in_lean(tmp_path):
    tr = Transcript()
    tr.prompt("run it")
    calls = tr.response(tool_use("Bash", command="make"), tool_use("Bash", command="make all"),
                        stop="tool_use")
    short_error = "make: *** No rule to make target 'x'.  Stop.\n" + "détail " * 40
    long_error = "E" * (cc_lhc.ERROR_KEEP_BYTES + 1)
    tr.results((calls[0]["id"], short_error, True), (calls[1]["id"], long_error, True))
    tr.response(text("it failed"))
    thread = intake_transcript(tr, tmp_path)
    (turn,) = thread.turns
    lean = {m["tool_use_id"]: stub for m, stub in cc_lhc.visible_messages(turn, "lean")
            if m["kind"] == "tool_result"}
    assert lean[calls[0]["id"]] is None  # verbatim
    assert STUB_RE.match(lean[calls[1]["id"]])
    view = cc_lhc.View(thread.id, {1: "lean"}, {}, 0, "default", {})
    records = cc_lhc.view_records(view, [turn], "h", "s", "/", NOW)
    results = [b for r in records for b in blocks_of(r) if b.get("type") == "tool_result"]
    assert results[0]["content"] == short_error and results[0]["is_error"] is True
    assert results[1]["content"].startswith("[output of Bash m")


# -- thinking -------------------------------------------------------------------------------

SIGNATURE = "EqQBCkgIARABGAIiQL+/9x1y2z==\u00e9\\/\"quoted\"" + "Zm9v" * 50


@pytest.fixture
def thinking_thread(tmp_path):
    tr = Transcript()
    tr.prompt("think please")
    tr.response(thinking("signed thought", SIGNATURE), thinking("unsigned thought", None),
                text("answer one"))
    tr.prompt("and a redacted one")
    tr.response({"type": "redacted_thinking", "data": "ENCRYPTED-BLOB=="}, text("answer two"))
    return intake_transcript(tr, tmp_path)


def _thinking_blocks(records):
    return [b for r in records if r["type"] == "assistant" for b in blocks_of(r)
            if b.get("type") in ("thinking", "redacted_thinking")]


def test_signed_thinking_replayed_verbatim_in_full_turns(thinking_thread):
    turns, view, header, records = build(thinking_thread, 10**6)
    assert set(view.bands.values()) == {"full"}
    got = _thinking_blocks(records)
    assert got == [{"type": "thinking", "thinking": "signed thought", "signature": SIGNATURE},
                   {"type": "redacted_thinking", "data": "ENCRYPTED-BLOB=="}]
    data = cc_lhc.records_bytes(records)
    assert json.dumps(SIGNATURE, ensure_ascii=False).encode() in data  # byte-identical
    assert b"unsigned thought" not in data  # never given a signature, never replayed
    for r in records:
        if r["type"] == "assistant":
            assert r["message"]["model"] == "claude-test-model"  # the CLI drops thinking without it


def test_unsigned_thinking_never_gets_a_signature(thinking_thread):
    for band in ("full", "lean"):
        for t in thinking_thread.turns:
            for m, _ in cc_lhc.visible_messages(t, band, "signed_verbatim"):
                assert "unsigned thought" not in (m["text"] or "")


def test_thinking_arm_omit_drops_it(thinking_thread, monkeypatch):
    _, _, _, records = build(thinking_thread, 10**6, arm="omit")
    assert _thinking_blocks(records) == []
    # flipping the constant takes effect without passing an arm
    monkeypatch.setattr(cc_lhc, "THINKING_REBUILD_ARM", "omit")
    _, _, _, records = build(thinking_thread, 10**6)
    assert _thinking_blocks(records) == []
    assert [b["text"] for r in records for b in blocks_of(r) if r["type"] == "assistant"
            and b.get("type") == "text"] == ["answer one", "answer two"]


def test_lean_turns_drop_all_thinking(thinking_thread):
    turns = thinking_thread.turns
    view = cc_lhc.View(thinking_thread.id, {t.n: "lean" for t in turns}, {}, 0, "default", {})
    records = cc_lhc.view_records(view, turns, "h", "s", "/", NOW)
    assert _thinking_blocks(records) == []


def test_plan_rebuild_passes_the_arm(thinking_thread, tmp_path):
    policy = cc_lhc.resolve_policy([])
    kw = dict(projects_root=str(tmp_path / "p"), now=NOW)
    signed = cc_lhc.plan_rebuild(thinking_thread.home, thinking_thread.store, thinking_thread.id,
                                 policy, str(uuid.uuid4()), "/home/u/proj", **kw)
    omitted = cc_lhc.plan_rebuild(thinking_thread.home, thinking_thread.store, thinking_thread.id,
                                  policy, str(uuid.uuid4()), "/home/u/proj", arm="omit", **kw)
    assert b"signed thought" in signed.data and b"signed thought" not in omitted.data


# -- the header -------------------------------------------------------------------------------

def test_omitted_ranges_named_with_the_contracts_line(tmp_path):
    tr = Transcript()
    for i in range(1, 16):
        tr.prompt(f"question {i} " + "x" * 400)
        tr.response(text(f"answer {i} " + "y" * 400))
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    summaries = {t.n: ("short summary", "model") for t in turns}
    first = cc_lhc.build_view(thread.id, turns, 2000, "default", summaries)
    k = max(first.turns_in("summary"))
    for n in range(1, k + 1):
        del summaries[n]  # turns with no summary, and no room in a better band: omitted
    view = cc_lhc.build_view(thread.id, turns, 2000, "default", summaries)
    assert view.turns_in("omitted") == list(range(1, k + 1))
    header = cc_lhc.render_header(view, [], False)
    assert f"turns t1\u2013t{k} not in view; use get-turns" in header.splitlines()
    assert cc_lhc.omitted_line(3, 5) == "turns t3\u2013t5 not in view; use get-turns"
    # a retrieved turn in the middle splits the omitted range in two
    lifted = cc_lhc.build_view(thread.id, turns, 2000, "default", summaries, favoured={3})
    assert lifted.bands[3] == "lean"
    lines = cc_lhc.render_header(lifted, [], False).splitlines()
    assert "turns t1\u2013t2 not in view; use get-turns" in lines
    assert any(re.fullmatch(r"turns t4\u2013t\d+ not in view; use get-turns", ln) for ln in lines)
    for text_ in ("cc-lhc get-turns", "cc-lhc get-messages", "cc-lhc search"):
        assert text_ in header


def test_working_set_lists_edited_files_first_with_the_label_that_last_showed_each(tmp_path):
    tr = Transcript()
    tr.prompt("work")
    c = tr.response(tool_use("Read", file_path="/p/a.py"), tool_use("Read", file_path="/p/b.py"),
                    stop="tool_use")
    tr.results((c[0]["id"], "a", False), (c[1]["id"], "b", False))
    c2 = tr.response(tool_use("Edit", file_path="/p/b.py", old_string="b", new_string="B"),
                     stop="tool_use")
    tr.results((c2[0]["id"], "edited b", False))
    tr.response(text("done"))
    tr.prompt("more")
    c3 = tr.response(tool_use("Read", file_path="/p/c.py"), tool_use("Write", file_path="/p/d.py",
                                                                      content="d"),
                     stop="tool_use")
    tr.results((c3[0]["id"], "c", False), (c3[1]["id"], "wrote d", False))
    c4 = tr.response(tool_use("Read", file_path="/p/b.py"), stop="tool_use")
    tr.results((c4[0]["id"], "B", False))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    by_text = {(m["kind"], m["text"]): m["seq"] for m in thread.messages().values()}
    result = lambda t: by_text[("tool_result", t)]  # noqa: E731
    files = cc_lhc.working_set(thread.turns)
    assert files == [("/p/b.py", "edited", result("B")), ("/p/d.py", "edited", result("wrote d")),
                     ("/p/c.py", "read", result("c")), ("/p/a.py", "read", result("a"))]
    _, view, header, _ = build(thread, 10**6)
    lines = header.splitlines()
    at = lines.index("Working set (edited first; the label last showed the file):")
    assert lines[at + 1] == f"  edited /p/b.py  (m{result('B')})"
    assert lines[at + 4] == f"  read   /p/a.py  (m{result('a')})"


@pytest.mark.parametrize("calls", [32, 12])
def test_a_long_newest_turn_keeps_its_newest_tool_output_verbatim(tmp_path, calls):
    """A newest turn of many large outputs, over the target on its own: cut where capture
    closed its segments, its newest parts held two calls each, none of which fits the full
    band, while an older part of one call did: that older output was verbatim and the
    newest ones stubs. The view now holds the newest output verbatim."""
    import base64
    rnd = random.Random(calls)
    tr = Transcript()
    tr.prompt("hello")
    tr.response(text("hi"))
    tr.prompt("do the long job")
    for i in range(calls):
        c = tr.response(tool_use("Bash", command=f"echo LONGSTART{i}; head -c 12000 /dev/urandom | base64"),
                        stop="tool_use")
        out = f"LONGSTART{i}\n" + base64.encodebytes(rnd.randbytes(12000)).decode()
        tr.results((c[0]["id"], out, False))
    tr.response(text("long turn finished"))
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    view, _header = cc_lhc.serve_view(thread.id, turns, 20_000, "default", summaries)
    newest = max(m["seq"] for m in turns[-1].messages if m["kind"] == "tool_result")
    assert view.band_of(turns[-1].n, newest) == "full", view.pieces
    assert view.tokens <= 20_000

def newest_turn_outputs(tr: Transcript, tmp_path, target):
    """Rebuild the transcript's thread at ``target`` (plan_rebuild, as Smart Compact does):
    whether each tool output of its newest turn is served verbatim, and the rebuild. The
    rebuilt records pair every call with its result."""
    thread = intake_transcript(tr, tmp_path)
    policy = cc_lhc.resolve_policy([("t", {"lowerBoundTokens": target, "upperBoundTokens": target * 3,
                                           "minRunwayTokens": 1})])
    rebuilt = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, "11111111-2222-4333-8444-555555555555",
                                  "/home/u/proj", projects_root=str(tmp_path / "p"), now=NOW, idle=True)
    records = [json.loads(line) for line in rebuilt.data.splitlines()]
    assert_tool_blocks_paired(records)
    shown = {b["tool_use_id"]: b["content"] for r in records if r["type"] == "user"
             for b in blocks_of(r) if b.get("type") == "tool_result"}
    outputs = [m for m in thread.turns[-1].messages if m["kind"] == "tool_result"]
    return [shown[m["tool_use_id"]] == m["text"] for m in outputs], rebuilt

def parallel_last_step(sizes) -> Transcript:
    """Three short turns, then one whose last step calls Bash once for each size at once
    (outputs of those sizes, in that order), and its answer."""
    tr = Transcript()
    tr.envelope()
    for i in range(3):
        tr.prompt(f"q{i}")
        tr.response(text(f"a{i}"))
    tr.prompt("read the logs together")
    made = tr.response(*[tool_use("Bash", command=f"cat log{i}") for i in range(len(sizes))], stop="tool_use")
    tr.results(*[(c["id"], bash_output(i, size), False) for i, (c, size) in enumerate(zip(made, sizes))])
    tr.response(text("done"))
    return tr

@pytest.mark.parametrize("last", [40_000, 24_000])
def test_small_exchanges_before_one_too_large_to_be_verbatim_stay_verbatim(tmp_path, last):
    """A turn of a large output, two small ones, and one too large to be verbatim in any
    view (or one that fits): the small newer ones are never stubs while the older large
    one is verbatim (they rode in one part with the one too large, and went lean with it)."""
    tr = Transcript()
    tr.envelope()
    tr.prompt("investigate")
    outputs = [("X", 14_000), ("s1", 600), ("s2", 600), ("B", last)]
    for name, size in outputs:
        (c,) = tr.response(tool_use("Bash", command=f"cat {name}.log"), stop="tool_use")
        tr.results((c["id"], bash_output(len(name) + size % 97, size), False))
    tr.response(text("done"))
    verbatim, rebuilt = newest_turn_outputs(tr, tmp_path, 12_000)
    assert verbatim[1] and verbatim[2], (verbatim, rebuilt.view.pieces)
    assert rebuilt.view.tokens <= 12_000


@pytest.mark.parametrize("calls,size,target", [(4, 20_000, 12_000), (2, 30_000, 16_000), (1, 20_000, 8_000)])
def test_the_newest_of_outputs_claude_asked_for_at_once_are_verbatim_as_far_as_the_target_holds(
        tmp_path, calls, size, target):
    """A newest turn whose last step called several tools at once: that exchange is one
    part, too large for the verbatim share as a whole, and every output in it was a stub
    though the newest alone fitted with room to spare. Its newest outputs are verbatim now,
    newest first, as far as the target holds, the rest stubs; calls and results still pair."""
    verbatim, rebuilt = newest_turn_outputs(parallel_last_step([size] * calls), tmp_path, target)
    assert verbatim[-1], rebuilt.view.pieces
    assert verbatim == sorted(verbatim)  # (older ones stubs, newer ones verbatim)
    assert rebuilt.view.tokens <= target


@pytest.mark.parametrize("sizes", [[3000, 3000, 80_000], [80_000, 3000, 3000]])
def test_outputs_of_an_exchange_that_fit_are_verbatim_whichever_finished_last(tmp_path, sizes):
    """Claude Code writes the results of calls made at once as they finish, so the last one
    is often the largest: one that does not fit leaves the others of its exchange verbatim
    as far as they do (it kept every one a stub)."""
    verbatim, rebuilt = newest_turn_outputs(parallel_last_step(sizes), tmp_path, 12_000)
    assert verbatim == [size < 80_000 for size in sizes], rebuilt.view.pieces
    assert rebuilt.view.tokens <= 12_000


def test_working_set_leaves_out_calls_whose_result_was_an_error(tmp_path):
    """A Write refused (no permission) changed nothing and a Read of a missing file read
    nothing: neither names its file (the header told Claude it had edited a file that
    does not exist). A file a later call read does appear, by that call."""
    tr = Transcript()
    tr.prompt("work")
    c = tr.response(tool_use("Write", file_path="/p/denied.txt", content="x"),
                    tool_use("Read", file_path="/p/missing.txt"), tool_use("Edit", file_path="/p/e.py",
                                                                           old_string="a", new_string="b"),
                    stop="tool_use")
    tr.results((c[0]["id"], "Claude requested permissions to write to /p/denied.txt, but you haven't granted it yet.",
                True), (c[1]["id"], "File does not exist.", True), (c[2]["id"], "edited e", False))
    c2 = tr.response(tool_use("Read", file_path="/p/missing.txt"), stop="tool_use")
    tr.results((c2[0]["id"], "now there", False))
    tr.response(text("done"))
    thread = intake_transcript(tr, tmp_path)
    by_text = {(m["kind"], m["text"]): m["seq"] for m in thread.messages().values()}
    assert cc_lhc.working_set(thread.turns) == [("/p/e.py", "edited", by_text[("tool_result", "edited e")]),
                                                ("/p/missing.txt", "read", by_text[("tool_result", "now there")])]

def test_fallback_sentence_in_the_header_when_policy_fell_back(tmp_path, random_threads):
    thread = random_threads[0]
    _, _, header, _ = build(thread, 5000, fallback=True)
    assert cc_lhc.MSG_CONFIG_FALLBACK in header.splitlines()
    _, _, header, _ = build(thread, 5000, fallback=False)
    assert cc_lhc.MSG_CONFIG_FALLBACK not in header
    work = tmp_path / "proj"
    work.mkdir()
    (work / ".cc-lhc.json").write_text('{"lowerBoundTokens": "lots"}')
    policy = cc_lhc.load_policy(str(work), {})
    assert policy.fell_back
    rb = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()),
                             str(work), projects_root=str(tmp_path / "p"), now=NOW)
    first = json.loads(rb.data.splitlines()[0])
    assert first["message"]["content"].startswith("[cc-lhc] ")
    assert cc_lhc.MSG_CONFIG_FALLBACK in first["message"]["content"]


def test_same_history_and_settings_give_identical_bytes(random_threads, tmp_path):
    for thread in random_threads[:3]:
        for budget in (1500, 8000, 10**6):
            a = cc_lhc.records_bytes(build(thread, budget)[3])
            b = cc_lhc.records_bytes(build(thread, budget)[3])
            assert a == b
        policy = cc_lhc.resolve_policy([])
        sid = str(uuid.uuid4())
        one = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, sid, "/w",
                                  projects_root=str(tmp_path), now=NOW)
        two = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, sid, "/w",
                                  projects_root=str(tmp_path), now=NOW)
        assert one.data == two.data and one.path == two.path


def test_retrieved_turns_are_favoured_by_the_next_view(tmp_path, monkeypatch, capsysbinary):
    tr = Transcript()
    for i in range(1, 16):
        tr.prompt(f"question {i}")
        c = tr.response(tool_use("Bash", command=f"cat log{i}"), stop="tool_use")
        tr.results((c[0]["id"], "\n".join(f"log line {j}" for j in range(300)), False))
        # words, not one repeated letter: the view is fitted by exact count, and a run of
        # one letter costs twice the estimate, which would leave no room to favour anything
        tr.response(text(f"answer {i} " + "the value was fine " * 105))
    thread = intake_transcript(tr, tmp_path)
    grant(thread, monkeypatch)
    policy = cc_lhc.resolve_policy([("test", {"lowerBoundTokens": 4000, "upperBoundTokens": 100_000,
                                              "minRunwayTokens": 1000})])
    before = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()),
                                 "/w", projects_root=str(tmp_path), now=NOW).view
    old = min(n for n, b in before.bands.items() if b in ("summary", "omitted"))
    retrieve(capsysbinary, "get-turns", f"t{old}")
    assert old in cc_lhc.recent_impression_turns(thread.store)
    after = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()),
                                "/w", projects_root=str(tmp_path), now=NOW).view
    assert after.bands[old] == "lean"
    assert sum(after.costs.values()) <= policy.effective_target


# -- the randomized proof ---------------------------------------------------------------------

def _named_and_retrievable(thread, budget, profile, capsysbinary):
    turns, view, header, records = build(thread, budget, profile)
    assert_tool_blocks_paired(records)
    named, summary_labels, splits, part_labels = header_parts(header)
    # every turn is named by the header: a band's range, a summary label, an omitted range,
    # or (a long turn) the runs of messages its parts went to
    assert set(named) == {t.n for t in turns}
    assert named == view.bands
    assert summary_labels == set(view.turns_in("summary"))
    assert {n: [r[:3] for r in runs] for n, runs in splits.items()} == view.pieces
    assert part_labels == {k for k in view.summaries if isinstance(k, tuple)}
    for n, runs in view.pieces.items():  # the summaries of a run cover it, in order
        for a, b, band in runs:
            if band == "summary":
                mine = sorted(k[1:] for k in part_labels if k[0] == n and a <= k[1] <= b)
                assert mine[0][0] == a and mine[-1][1] == b
                assert all(y[0] == x[1] + 1 for x, y in zip(mine, mine[1:]))
    data = cc_lhc.records_bytes(records).decode("utf-8")
    stubs = set()
    for rec in records[1:]:
        for b in blocks_of(rec):
            content = b.get("content") if b.get("type") == "tool_result" else b.get("text")
            if isinstance(content, str):
                stubs.update(int(s) for s in re.findall(r"\u00b7 cc-lhc get-messages m(\d+)\]$", content))
    # what a lean part replaced is named by its stub; a long turn resumes after a note
    for t in turns:
        notes, items = cc_lhc.turn_items(view, t)
        for _at, note in notes:
            assert json.dumps(note, ensure_ascii=False)[1:-1] in data
        for m, stub in items:
            if stub is not None:
                assert m["seq"] in stubs
            elif m["kind"] in ("user_text", "assistant_text") and m["text"]:
                assert json.dumps(m["text"], ensure_ascii=False)[1:-1] in data
    # retrieve what the header and stubs name, exactly as named
    for line in header.splitlines():
        m = re.fullmatch(r"turns (t\d+)\u2013(t\d+) not in view; use get-turns", line)
        if m:
            a, b = int(m.group(1)[1:]), int(m.group(2)[1:])
            body, _ = retrieve(capsysbinary, "get-turns", f"{m.group(1)}\u2013{m.group(2)}")
            assert body == b"".join(expected_turn_body(thread, n) for n in range(a, b + 1))
    by_seq = thread.messages()
    for n, runs in splits.items():
        for a, b, band, request in runs:
            if band == "omitted":
                body, _ = retrieve(capsysbinary, "get-messages", *request.split())
                assert body == "".join(cc_lhc.render_message_body(by_seq[s])
                                       for s in range(a, b + 1)).encode("utf-8")
    for seq in sorted(stubs):
        body, _ = retrieve(capsysbinary, "get-messages", f"m{seq}")
        assert body == cc_lhc.render_message_body(by_seq[seq]).encode("utf-8")
        assert_in_order(body, [by_seq[seq]])
    for n in [n for n, b in named.items() if b != "omitted"]:
        body, _ = retrieve(capsysbinary, "get-turns", f"t{n}")
        assert body == expected_turn_body(thread, n)
        assert_in_order(body, list(thread.store.messages(n, n)))
    return view


@pytest.mark.parametrize("seed", range(4))
def test_randomized_everything_left_out_is_named_and_comes_back_exactly(
        seed, tmp_path, monkeypatch, capsysbinary):
    """Generated sessions (scripts/gen_transcript.py) and hand-made ones with interruptions:
    every turn not in view is named by a range or a summary label, every replaced output by
    its stub, and retrieving each named label gives back the record byte for byte."""
    r = random.Random(seed)
    path = tmp_path / "gen.jsonl"
    stats = generate(str(path), size_mb=r.choice((0.15, 0.3, 0.5)), seed=100 + seed,
                     thinking=bool(seed % 2), compact_every=3 if seed == 3 else None)
    threads = [intake(path, stats["session_id"], stats["cwd"]),
               intake_transcript(random_transcript(1000 + seed, turns=10), tmp_path)]
    bands_seen = set()
    for thread in threads:
        grant(thread, monkeypatch)
        total = sum(cc_lhc.band_cost(t, "full") for t in thread.turns)
        for fraction in (0.03, 0.15, 0.5):
            profile = r.choice(sorted(cc_lhc.PROFILE_SHARES))
            view = _named_and_retrievable(thread, max(200, int(total * fraction)), profile,
                                          capsysbinary)
            bands_seen.update(view.bands.values())
            bands_seen.update(band for runs in view.pieces.values() for _, _, band in runs)
        # a tiny budget leaves most of the thread omitted
        view = _named_and_retrievable(thread, 60, "default", capsysbinary)
        bands_seen.update(view.bands.values())
    assert bands_seen >= {"full", "lean", "summary", "omitted", cc_lhc.SPLIT}


def test_the_header_counts_against_the_budget(random_threads):
    # What Claude receives is the header plus the bands: together they stay inside the budget.
    for thread in random_threads:
        turns = thread.turns
        summaries = cc_lhc.thread_summaries(thread.store, turns)
        for budget in (800, 3000, 12000):
            view, header = cc_lhc.serve_view(thread.id, turns, budget, "default", summaries)
            # summaries are written inside the header, so they are counted there
            sent = view.costs["full"] + view.costs["lean"] + cc_lhc.estimate_tokens(header)
            assert sent <= budget + 64, (budget, sent)


# -- long agentic turns: the segment is the unit ------------------------------------------------

def bash_output(i, size):
    """A Bash output of about ``size`` bytes that reads like one: numbered log lines."""
    lines, total, j = [], 0, 0
    while total < size:
        line = f"{i:03d}:{j:05d} INFO worker-{j % 7} processed batch {j * 31 % 997} in {j % 89} ms ok"
        lines.append(line)
        total += len(line) + 1
        j += 1
    return "\n".join(lines)


def long_turn_transcript(calls, out_bytes, before=0, after=0, cwd="/home/u/proj",
                         model="claude-long-model"):
    """``before`` small turns, one prompt followed by ``calls`` Bash calls of ``out_bytes``
    each, then ``after`` small turns."""
    tr = Transcript(cwd=cwd, model=model)
    tr.envelope()
    for i in range(before):
        tr.prompt(f"small question {i}")
        tr.response(text(f"small answer {i}"))
    tr.prompt("run the whole migration, step by step")
    for i in range(calls):
        (call,) = tr.response(text(f"step {i}"), tool_use("Bash", command=f"./migrate --step {i}"),
                              stop="tool_use")[1:]
        tr.results((call["id"], bash_output(i, out_bytes), False))
    tr.response(text("migration finished"))
    for i in range(after):
        tr.prompt(f"later question {i}")
        tr.response(text(f"later answer {i}"))
    return tr


def served(thread, budget, profile="default"):
    """(view, header, records, served tokens) as plan_rebuild makes them."""
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    view, header = cc_lhc.serve_view(thread.id, turns, budget, profile, summaries)
    records = cc_lhc.view_records(view, turns, header, "11111111-2222-4333-8444-555555555555",
                                  "/home/u/proj", NOW)
    notes = [note for t in turns for _at, note in cc_lhc.turn_items(view, t)[0]]
    tokens = (view.costs["full"] + view.costs["lean"] + cc_lhc.estimate_tokens(header)
              + sum(cc_lhc.estimate_tokens(n) + 4 for n in notes))
    return turns, view, header, records, tokens


def tool_results_in(records):
    return {b["tool_use_id"]: b["content"] for r in records if r["type"] == "user"
            for b in blocks_of(r) if b.get("type") == "tool_result"}


def assert_resumable(records, model):
    assert_chain(records)
    assert_tool_blocks_paired(records)
    assert records[-1]["type"] == "assistant"
    assert records[-1]["message"]["model"] == model


def test_fifty_big_tool_outputs_keep_the_newest_verbatim(tmp_path):
    # One prompt, 50 Bash calls of 16 KB: the whole turn is far over the full share, but
    # its newest tool outputs are the work in hand, so they stay verbatim (the old view
    # stubbed all 50, a 20 KB view for a 130k budget).
    thread = intake_transcript(long_turn_transcript(50, 16_384), tmp_path)
    turns, view, header, records, tokens = served(thread, 130_000)
    (turn,) = turns
    assert tokens <= 130_000
    results = tool_results_in(records)
    outputs = [m for m in turn.messages if m["kind"] == "tool_result"]
    assert len(results) == 50  # every call is in view, each with its result
    verbatim = [m for m in outputs if results[m["tool_use_id"]] == m["text"]]
    assert verbatim and verbatim == outputs[-len(verbatim):]  # the newest ones
    assert len(verbatim) >= 10
    for m in outputs[:-len(verbatim)]:
        assert STUB_RE.match(results[m["tool_use_id"]])
    assert view.bands[turn.n] == cc_lhc.SPLIT
    assert [b for _, _, b in view.pieces[turn.n]] == ["lean", "full"]
    assert len(cc_lhc.records_bytes(records)) > 200_000  # the full share is used, not left empty
    assert_resumable(records, "claude-long-model")


def test_a_turn_far_over_the_target_gives_a_valid_view_with_a_verbatim_tail(
        tmp_path, monkeypatch, capsysbinary):
    # 600k tokens in 200 tool calls, against the default target and a tiny one.
    thread = intake_transcript(long_turn_transcript(200, 12_000), tmp_path)
    (turn,) = thread.turns
    assert cc_lhc.band_cost(turn, "full") > 600_000
    outputs = [m for m in turn.messages if m["kind"] == "tool_result"]
    grant(thread, monkeypatch)
    by_seq = thread.messages()
    for budget in (180_000, 8_000):
        turns, view, header, records, tokens = served(thread, budget)
        assert tokens <= budget
        assert_resumable(records, "claude-long-model")
        results = tool_results_in(records)
        assert results[outputs[-1]["tool_use_id"]] == outputs[-1]["text"]  # newest: verbatim
        runs = view.pieces[turn.n]
        assert runs[-1][2] == "full" and runs[-1][1] == turn.messages[-1]["seq"]
        assert [RANK[b] for _, _, b in runs] == sorted((RANK[b] for _, _, b in runs), reverse=True)
        # every message is in one run, and the header names each run
        assert runs[0][0] == turn.messages[0]["seq"]
        assert all(a == prev[1] + 1 for prev, (a, _, _) in zip(runs, runs[1:]))
        _named, _s, splits, _p = header_parts(header)
        assert [r[:3] for r in splits[turn.n]] == runs
        omitted = [r for r in splits[turn.n] if r[2] == "omitted"]
        if budget == 8_000:
            assert omitted and any(b == "summary" for _, _, b in runs)
            [(at, note)] = cc_lhc.turn_items(view, turn)[0]
            assert at == 0 and f"m{runs[0][0]}\u2013" in note and "cc-lhc get-messages m" in note
            [(_at, native)] = cc_lhc.turn_items(view, turn, native=True)[0]  # the mod active: its tool, as the header
            assert "lhc_get_messages m" in native and "cc-lhc get-messages" not in native
            assert any(r["type"] == "user" and r["message"]["content"] == note for r in records)
            a, b, _band, request = omitted[0]
            assert request == f"m{a}-m{b}"
            body, calls = retrieve(capsysbinary, "get-messages", request)
            assert calls > 1  # paged within the 24,000-byte ceiling
            assert body == "".join(cc_lhc.render_message_body(by_seq[s])
                                   for s in range(a, b + 1)).encode("utf-8")
        else:
            assert not omitted  # at the default target the older calls all fit in lean


def test_small_turns_before_a_big_one_keep_the_band_the_budget_allows(tmp_path):
    thread = intake_transcript(long_turn_transcript(50, 16_384, before=3, after=1), tmp_path)
    turns, view, header, records, tokens = served(thread, 130_000)
    assert tokens <= 130_000
    big = turns[3].n
    assert view.bands[big] == cc_lhc.SPLIT
    # the big turn's old calls went lean, but the small turns before it still fit verbatim
    assert [view.bands[t.n] for t in turns] == ["full", "full", "full", cc_lhc.SPLIT, "full"]
    assert "In view, verbatim: t1\u2013t3, t5" in header.splitlines()
    assert_resumable(records, "claude-long-model")


def test_fitting_a_view_works_out_each_part_cost_once(tmp_path, monkeypatch):
    """serve_view allocates several times to fit by exact count; a part is the same run of
    messages in every round, so its cost in a band (and the working set) is worked out once."""
    tr = long_turn_transcript(40, 8_192, before=30, after=5)
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    costs, sets, rounds = [], [], []
    band_cost, working_set, serve = cc_lhc.band_cost, cc_lhc.working_set, cc_lhc._serve_view

    def counted_cost(turn, band, summary_text="", messages=None, tools=None):
        part = messages if messages is not None else turn.messages
        costs.append((turn.n, part[0]["seq"], part[-1]["seq"], band))
        return band_cost(turn, band, summary_text, messages, tools)

    monkeypatch.setattr(cc_lhc, "band_cost", counted_cost)
    monkeypatch.setattr(cc_lhc, "working_set", lambda t: sets.append(1) or working_set(t))
    monkeypatch.setattr(cc_lhc, "_serve_view", lambda *a, **k: rounds.append(1) or serve(*a, **k))
    budget = 20_000
    view, header = cc_lhc.serve_view(thread.id, turns, budget, "default", summaries)
    assert len(rounds) > 1 and view.tokens <= budget     # it did fit by more than one round
    assert len(sets) == 1
    assert costs and len(costs) == len(set(costs)), "a part's band cost was worked out again"


def test_parts_are_the_recorded_segments_when_the_target_is_the_capture_one(tmp_path):
    thread = intake_transcript(long_turn_transcript(40, 16_384), tmp_path)
    (turn,) = thread.turns
    policy = cc_lhc.resolve_policy([])
    soft = cc_lhc.segment_soft_bytes(policy) // 4
    assert soft == cc_lhc.segment_tokens(policy["lowerBoundTokens"], policy["profile"])
    recorded = thread.store.db.execute("SELECT first_seq, last_seq FROM segments WHERE turn = ? "
                                       "ORDER BY idx", (turn.n,)).fetchall()
    assert len(recorded) > 1
    parts = cc_lhc.turn_parts(turn, soft)
    assert [(p.first, p.last) for p in parts] == [tuple(r) for r in recorded]
    # a smaller target cuts the same turn finer, never between a call and its result
    finer = cc_lhc.turn_parts(turn, soft // 5)
    assert len(finer) > len(parts)
    for p in finer:
        assert p.messages[-1]["kind"] in ("tool_result", "assistant_text")
        ids = [m["tool_use_id"] for m in p.messages if m["tool_use_id"]]
        assert all(ids.count(i) == 2 for i in ids)


def _envelope_forward(path):
    """read_envelope as it was: every line of the file, in order, the newest of each kind kept."""
    latest, meta = {}, {}
    for raw in Path(path).read_bytes().splitlines():
        if not cc_lhc.ENVELOPE_LINE_RE.search(raw):
            continue
        rec = cc_lhc.json_record(raw)
        att = rec.get("attachment") if rec else None
        if rec and rec.get("type") == "attachment" and isinstance(att, dict) and \
                att.get("type") in cc_lhc.ENVELOPE_ATTACHMENTS:
            latest[att["type"]] = rec
            if rec.get("version"):
                meta.update(version=rec["version"], gitBranch=rec.get("gitBranch", ""))
    return [latest[k] for k in cc_lhc.ENVELOPE_ATTACHMENTS if k in latest], meta


@pytest.mark.parametrize("window", [1 << 20, 700, 97])
def test_the_envelope_read_from_the_end_is_the_newest_one(tmp_path, monkeypatch, window):
    # Searched backwards a window at a time (small windows cut through lines and through
    # the attachments of one prompt), it must find what a reading of every line finds.
    monkeypatch.setattr(cc_lhc, "ENVELOPE_WINDOW", window)
    fixtures = Path(__file__).resolve().parent / "fixtures"
    paths = sorted(fixtures.rglob("*.jsonl"))
    mixed = tmp_path / "mixed.jsonl"
    lines = []
    for i, (kind, version) in enumerate([("date", "2.1.1"), ("model", None), ("environment", "2.1.2"),
                                         ("date", "2.1.3"), ("environment", None), ("model", "2.1.4")]):
        rec = {"type": "attachment", "uuid": f"u{i}", "attachment": {"type": kind, "n": i}}
        if version:
            rec.update(version=version, gitBranch=f"b{i}")
        lines.append(json.dumps(rec))
        lines.append(json.dumps({"type": "user", "uuid": f"p{i}", "message": {"role": "user",
                                 "content": 'a tool said "type": "date" ' * 20}}))
        lines.append(json.dumps({"type": "system", "uuid": f"s{i}", "data": {"type": "model", "n": -1}}))
    mixed.write_text("\n".join(lines) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    for path in paths + [mixed, empty]:
        assert cc_lhc.read_envelope(str(path)) == _envelope_forward(path), path.name
    found, meta = cc_lhc.read_envelope(str(mixed))
    assert [r["attachment"]["n"] for r in found] == [4, 3, 5] and meta == {"version": "2.1.4", "gitBranch": "b5"}


def test_a_views_header_and_notes_are_counted_in_the_batch_of_its_messages(tmp_path):
    """Counted one by one, each short text of a view would need an encoder of its own in a
    one-off count: the header and every note go in the one batch with the messages."""
    thread = intake_transcript(long_turn_transcript(200, 12_000, before=3), tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    view, header = cc_lhc.serve_view(thread.id, turns, 8_000, "default", summaries)
    notes = [note for t in turns for _at, note in cc_lhc.turn_items(view, t)[0]]
    assert notes  # the long turn resumes after a note

    class Batches:
        def __init__(self):
            self.seen = []

        def usable(self):
            return False

        def count_many(self, texts):
            self.seen.append(list(texts))
            return [cc_lhc.safe_estimate(t) for t in texts]

    tokens = Batches()
    counted = cc_lhc.view_tokens(view, header, turns, cc_lhc.ViewCounter(tokens))
    first = tokens.seen[0]
    assert header in first and all(n in first for n in notes) and len(first) > 1 + len(notes)
    assert counted["header"] == cc_lhc.safe_estimate(header)


def _many_tool_turns(turns=40, calls=8):
    tr = Transcript()
    for t in range(turns):
        tr.prompt(f"question {t}")
        for i in range(calls):
            (c,) = tr.response(tool_use("Bash", command=f"step {t}.{i}"), stop="tool_use")
            tr.results((c["id"], "\n".join(f"line {j} of output {t}.{i} ok" for j in range(300)), False))
        tr.response(text(f"answer {t}"))
    return tr


def test_a_small_target_still_serves_the_newest_turn(tmp_path):
    """Forty long turns against a target smaller than the header could name all their
    parts: the newest turn is in view (split, its tail verbatim), never all of it left out."""
    thread = intake_transcript(_many_tool_turns(), tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    for target in (3_000, 5_000, 8_000):
        # (a counter of its own: what other tests left in this process's counter is theirs)
        view, _header = cc_lhc.serve_view(thread.id, turns, target, "default", summaries,
                                          counter=cc_lhc.ViewCounter(cc_lhc.TokenCounter()))
        assert view.tokens <= target
        assert view.bands[turns[-1].n] != "omitted", target
        assert view.tokens >= target * 0.6, (target, view.tokens)


def test_the_view_is_the_fullest_any_allocation_of_its_parts_serves(tmp_path):
    """The count is a step function of the allocation (parts come whole, and the quick
    estimate misjudges dense text), so scaling the allocation by the count overshoots:
    the fitting finds, in a few rounds, the fullest view that a scan of 80 allocations
    of the same parts finds under the target."""
    thread = intake_transcript(long_turn_transcript(60, 12_000), tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    counter = cc_lhc.ViewCounter()
    for target in (35_000, 60_000, 95_000, 150_000):
        view, _header = cc_lhc.serve_view(thread.id, turns, target, "default", summaries, counter=counter)
        fixed = cc_lhc._view_parts(thread.id, turns, target, "default", 0, False)
        best = 0
        for k in range(80):
            alloc = int(target / 2 * 8 ** (k / 80))
            scan, header = cc_lhc._serve_view(thread.id, turns, alloc, "default", summaries, (), False, 0,
                                              False, fixed)
            used = cc_lhc.view_tokens(scan, header, turns, counter)["total"]
            if used <= target:
                best = max(best, used)
        assert best * 0.99 <= view.tokens <= target, (target, view.tokens, best)


def test_fitting_stops_at_once_when_all_after_the_boundary_fits_and_on_a_budget_below_zero(tmp_path, monkeypatch):
    """A pruned thread whose visible turns all fit is served in one round (the turns before
    the boundary are out of view whatever the allocation); a budget a reserve took below
    zero serves the header, and the fitting ends."""
    thread = intake_transcript(_many_tool_turns(turns=6, calls=2), tmp_path)
    turns = thread.turns
    rounds = []
    real = cc_lhc._serve_view
    monkeypatch.setattr(cc_lhc, "_serve_view", lambda *a, **k: rounds.append(1) or real(*a, **k))
    boundary = turns[2].messages[-1]["seq"]
    view, _header = cc_lhc.serve_view(thread.id, turns, 200_000, "default", {}, boundary=boundary)
    assert len(rounds) == 1 and all(view.bands[t.n] == "full" for t in turns[3:])
    rounds.clear()
    view, _header = cc_lhc.serve_view(thread.id, turns, -300, "default", {})
    assert len(rounds) <= cc_lhc.VIEW_FIT_ROUNDS + 2 and all(b == "omitted" for b in view.bands.values())


def test_a_newest_exchange_too_big_for_verbatim_leaves_the_work_before_it_verbatim(tmp_path):
    """One response that calls eight tools at once, whose outputs together are more than
    the whole full share, cannot be verbatim in any view; the thirty calls before it can,
    and stay so (before, that one exchange held every older part of its turn to lean)."""
    tr = Transcript(cwd="/home/u/proj", model="claude-m")
    tr.envelope()
    tr.prompt("find the failure")
    for i in range(30):
        (call,) = tr.response(text(f"step {i}"), tool_use("Bash", command=f"./s {i}"), stop="tool_use")[1:]
        tr.results((call["id"], bash_output(i, 6_000), False))
    sent = tr.response(*[tool_use("Bash", command=f"cat log_{k}") for k in range(8)], stop="tool_use")
    for b in sent:
        tr.results((b["id"], bash_output(100, 28_000), False))
    tr.response(text("the failure is in log_3"))
    thread = intake_transcript(tr, tmp_path)
    turns, view, header, records, tokens = served(thread, 50_000)
    assert_resumable(records, "claude-m")
    results = tool_results_in(records)
    calls = {b["id"]: b["input"]["command"] for r in records if r["type"] == "assistant"
             for b in blocks_of(r) if b.get("type") == "tool_use"}
    verbatim = [calls[i] for i, out in results.items() if "processed batch" in (out if isinstance(out, str) else "")]
    assert "./s 29" in verbatim and "./s 20" in verbatim  # the work just before the big exchange
    assert not any(c.startswith("cat log_") for c in verbatim)  # (which no view holds verbatim)
    assert view.tokens > 25_000, view.tokens  # (before: 2-3k of a 50k target)


def test_a_long_turns_view_fills_its_target_and_grows_with_it(tmp_path):
    """Parts come whole, and a long turn's parts are a quarter of the full share each: with
    those alone a view could fall a part short of its target (71% of 100k on a real 1 MiB
    session), and a larger target could serve less. A view that fills less than nine
    tenths is fitted again with parts a quarter the size."""
    thread = intake_transcript(long_turn_transcript(60, 12_000), tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    served, counter = [], cc_lhc.ViewCounter(cc_lhc.TokenCounter())  # (exact, whatever came before)
    if not counter.exact:
        pytest.skip(f"exact counts are not to be had here: {counter.tokens.reason}")
    for target in range(50_000, 200_001, 15_000):  # (a step is one call and its 12 KB output, 3.9k)
        view, _header = cc_lhc.serve_view(thread.id, turns, target, "default", summaries, counter=counter)
        assert target * 0.88 <= view.tokens <= target, (target, view.tokens)
        assert view.tokens >= max(served, default=0) * 0.98, (target, view.tokens, served)
        served.append(view.tokens)



def test_a_run_left_out_between_two_shown_is_noted_where_it_was(tmp_path):
    """An exchange too large for the view in the middle of a long turn (a 200 KB Write) is
    summarised while the work before and after it stays verbatim: the note naming it stands
    where it was, after the result before it, not before the turn's prompt (where it said
    the turn "continues here" after messages that came later)."""
    tr = Transcript()
    tr.envelope()
    tr.prompt("first turn prompt")
    tr.response(text("first answer"))
    tr.prompt("PROMPT-OF-LONG-TURN please write the big file")
    (c1,) = tr.response(tool_use("Bash", command="ls small"), stop="tool_use")
    tr.results((c1["id"], "small-output", False))
    big = "\n".join(f"line {i} " + "lorem ipsum dolor sit amet " * 6 for i in range(400))
    (c2,) = tr.response(tool_use("Write", file_path="/home/u/proj/big.txt", content=big), stop="tool_use")
    tr.results((c2["id"], "File created successfully", False))
    (c3,) = tr.response(tool_use("Bash", command="echo done"), stop="tool_use")
    tr.results((c3["id"], "done", False))
    tr.response(text("LAST-ANSWER all finished"))
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    view, header = cc_lhc.serve_view(thread.id, turns, 4_000, "default",
                                     cc_lhc.thread_summaries(thread.store, turns))
    turn = turns[-1]
    runs = view.pieces[turn.n]
    shown = [b in ("full", "lean") for _a, _b, b in runs]
    assert shown[0] and shown[-1] and not all(shown), runs
    hidden = [(a, b) for a, b, band in runs if band not in ("full", "lean")]
    [(at, note)] = cc_lhc.turn_items(view, turn)[0]
    a, b = hidden[0][0], hidden[-1][1]
    assert note.startswith(f"[cc-lhc] t{turn.n} goes on here after m{a}\u2013m{b}, which are not shown")
    assert f"cc-lhc get-messages m{a}-m{b} " in note
    records = cc_lhc.view_records(view, turns, header, "11111111-1111-4111-8111-111111111111", "/home/u/proj", NOW)
    assert_chain(records)
    assert_tool_blocks_paired(records)
    said = [(r["type"], b.get("text") or b.get("content") or b.get("name")) for r in records for b in blocks_of(r)]
    where = said.index(("user", note))
    assert said[where - 1] == ("user", "small-output")  # after the result of the call before it
    assert said[where + 1] == ("assistant", "Bash")  # and before the call after it
    assert [i for i, (_r, t) in enumerate(said) if str(t).startswith("PROMPT-OF-LONG-TURN")][0] < where
    assert view_tokens_match(view, header, turns)


def view_tokens_match(view, header, turns):
    """Whether a view's count holds each of its notes once."""
    counted = cc_lhc.view_tokens(view, header, turns, cc_lhc.ViewCounter())
    notes = [note for t in turns for _at, note in cc_lhc.turn_items(view, t)[0]]
    return counted["notes"] == sum(cc_lhc.ViewCounter().text(n) + cc_lhc.MESSAGE_TOKENS for n in notes) > 0


def _interrupted_call_thread(tmp_path):
    """A turn that ends on a call Claude was killed in (no result: the view can never show
    it), then one more turn."""
    tr = Transcript()
    tr.envelope()
    tr.prompt("first prompt")
    (call,) = tr.response(tool_use("Bash", command="seq 1 3000"), stop="tool_use")
    tr.results((call["id"], "\n".join(str(i) for i in range(3000)), False))
    tr.response(tool_use("Bash", command="sleep 1000"), stop="tool_use")
    tr.prompt("second prompt")
    tr.response(text("second answer"))
    return intake_transcript(tr, tmp_path)


def test_a_part_the_view_can_show_nothing_of_is_never_named_in_view(tmp_path):
    """A call that never got its result is never served (the API refuses a call without its
    result), so the run holding it alone costs nothing: it goes with the run beside it. It
    took "full" on its own, and the header said "m4 verbatim" about a message that is not
    there; skipping the bands it cost nothing in, it was summarised on its own instead, the
    turn cut in two and noted, with all the room in the world."""
    thread = _interrupted_call_thread(tmp_path)
    turns = thread.turns
    summaries = cc_lhc.thread_summaries(thread.store, turns)
    for budget in (900, 1_200, 2_000, 5_000, 400_000):
        view, header = cc_lhc.serve_view(thread.id, turns, budget, "default", summaries, counter=cc_lhc.ViewCounter())
        served = {m["seq"] for t in turns for m, _stub in cc_lhc.turn_items(view, t)[1]}
        for t in turns:
            runs = view.pieces.get(t.n) or [(t.messages[0]["seq"], t.messages[-1]["seq"], view.bands[t.n])]
            for a, b, band in runs:
                if band in ("full", "lean"):
                    assert any(a <= seq <= b for seq in served), (budget, t.n, a, b, band, header)
        if budget == 400_000:  # room for all of it: each turn whole and verbatim, no note
            assert view.bands == {t.n: "full" for t in turns} and not view.pieces
            assert not any(cc_lhc.turn_items(view, t)[0] for t in turns)


def test_a_long_turn_ending_on_an_interrupted_call_is_served_whole_when_there_is_room(tmp_path):
    """Capture closed a segment of a long turn before the call Claude was killed in, so that
    call is a run of its own, which the view can show nothing of: with room for the whole
    thread the turn is served whole and verbatim (it was cut in two, the lone call
    summarised, with a note that the turn went on after it)."""
    tr = Transcript()
    tr.envelope()
    tr.prompt("first prompt")
    for k in range(6):
        (call,) = tr.response(tool_use("Bash", command=f"seq {k} 3000"), stop="tool_use")
        tr.results((call["id"], "\n".join(f"{k} line {i}" for i in range(3000)), False))
    tr.response(tool_use("Bash", command="sleep 1000"), stop="tool_use")
    tr.prompt("second prompt")
    tr.response(text("second answer"))
    thread = intake_transcript(tr, tmp_path)
    assert len({m["segment"] for m in thread.turns[0].messages}) > 1
    plan = cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, cc_lhc.resolve_policy([]),
                               str(uuid.uuid4()), "/home/u/proj", projects_root=str(tmp_path / "p"))
    assert plan.view.bands == {1: "full", 2: "full"} and not plan.view.pieces
    assert "goes on here after" not in plan.data.decode()


def test_a_target_under_the_header_is_refused_whatever_the_thread_ends_on(tmp_path):
    """With a target smaller than the header, no turn fits: Smart Compact does not run. A
    thread ending on an interrupted call got a view of its header alone, over the target,
    written as if it held something (its zero-cost part counted as in view)."""
    thread = _interrupted_call_thread(tmp_path)
    policy = cc_lhc.resolve_policy([("project", {"lowerBoundTokens": 150, "upperBoundTokens": 100_000,
                                                 "minRunwayTokens": 1_000})])
    with pytest.raises(cc_lhc.ViewHoldsNoTurn):
        cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, policy, str(uuid.uuid4()), "/home/u/proj",
                            projects_root=str(tmp_path / "p"))


def test_small_targets_give_views_within_them_or_none(tmp_path):
    """Random threads at targets of a few hundred tokens: each view is within its target by
    its own count, counted again the same, and valid; or it holds no turn at all."""
    for seed in range(9):
        folder = tmp_path / str(seed)
        folder.mkdir()
        thread = intake_transcript(random_transcript(seed, turns=12), folder)
        turns = thread.turns
        summaries = cc_lhc.thread_summaries(thread.store, turns)
        for budget in (300, 700, 1_500):
            view, header = cc_lhc.serve_view(thread.id, turns, budget, "default", summaries,
                                             counter=cc_lhc.ViewCounter())
            again = cc_lhc.view_tokens(view, header, turns, cc_lhc.ViewCounter())["total"]
            records = cc_lhc.view_records(view, turns, header, "11111111-1111-4111-8111-111111111111", "/x", NOW)
            assert_chain(records)
            assert_tool_blocks_paired(records)
            assert view.empty or view.tokens == again <= budget, (seed, budget, view.tokens, again)
        thread.store.close()


def test_a_long_thread_is_weighed_only_as_far_as_any_part_could_still_fit(tmp_path, monkeypatch):
    """A thread of 1,500 short turns at a small target: once OMITTED_RUN parts in a row found
    no room, the older turns are left out without being weighed or summarised; the view is
    the one weighing every turn gives. (Weighing all of them took seconds at 20,000 turns.)"""
    tr = Transcript()
    for i in range(1_500):
        tr.prompt(f"question {i}: what does item {i * 7} do?")
        tr.response(text(f"answer {i}: item {i * 7} reads the header, then the body. " * 3))
    thread = intake_transcript(tr, tmp_path)
    turns = thread.turns
    made = []
    real = cc_lhc.extractive_summary
    monkeypatch.setattr(cc_lhc, "extractive_summary", lambda *a, **k: made.append(1) or real(*a, **k))
    view, header = cc_lhc.serve_view(thread.id, turns, 12_000, "default", cc_lhc.thread_summaries(thread.store, turns))
    weighed = len(made)
    monkeypatch.setattr(cc_lhc, "OMITTED_RUN", 10 ** 9)
    every, every_header = cc_lhc.serve_view(thread.id, turns, 12_000, "default",
                                            cc_lhc.thread_summaries(thread.store, turns))
    assert view.bands == every.bands and header == every_header and view.tokens == every.tokens
    assert sum(b == "omitted" for b in view.bands.values()) > 1_000
    assert weighed < 1_500 / 2 < len(made) - weighed


def test_a_view_over_its_target_is_never_written_even_when_it_names_a_turn(tmp_path, monkeypatch):
    """The fitting's last resort (an allocation of nothing) can give a view over its target
    that still names a run in a band: Smart Compact is refused then, as for a view holding
    no turn, never written over its target."""
    thread = _interrupted_call_thread(tmp_path)
    real = cc_lhc.serve_view

    def over(thread_id, turns, budget, *a, **k):
        view, header = real(thread_id, turns, budget, *a, **k)
        view.tokens = budget + 100
        return view, header
    monkeypatch.setattr(cc_lhc, "serve_view", over)
    with pytest.raises(cc_lhc.ViewHoldsNoTurn):
        cc_lhc.plan_rebuild(thread.home, thread.store, thread.id, cc_lhc.resolve_policy([]), str(uuid.uuid4()),
                            "/home/u/proj", projects_root=str(tmp_path / "p"))


def test_claudes_own_summary_of_turns_the_thread_holds_is_in_no_view(tmp_path):
    """After Claude's own compaction (a person's /compact with the mod off, or its automatic
    one) a later view held both the turns word for word and Claude's summary of them, which
    asks Claude to go on without asking. The thread keeps the summary; views leave it out.
    A summary of what the thread never held (the first thing it saw) stays in views."""
    summary = ("This session is being continued from a previous conversation that ran out of context. "
               "SUMMARY-OF-THE-EARLIER-TURNS. Please continue the conversation from where we left it off "
               "without asking the user any further questions.")

    def compacted(tr):
        tr._record("system", subtype="compact_boundary", content="Conversation compacted",
                   compactMetadata={"trigger": "manual", "preTokens": 1000})
        tr._record("user", isCompactSummary=True, isVisibleInTranscriptOnly=True,
                   message={"role": "user", "content": summary})
    tr = Transcript()
    tr.prompt("remember the number 4711")
    tr.response(text("an answer worth keeping"))
    compacted(tr)
    tr.prompt("and now")
    tr.response(text("after the compact"))
    thread = intake_transcript(tr, tmp_path)
    assert any("SUMMARY-OF-THE-EARLIER-TURNS" in (m["text"] or "") for m in thread.messages().values())
    seen = [m["text"] for turn in thread.turns for m in turn.messages]
    assert seen == ["remember the number 4711", "an answer worth keeping", "and now", "after the compact"]
    view = cc_lhc.build_view(thread.id, thread.turns, 100_000, "default")
    assert [n for n, _band in sorted(view.bands.items())] == [1, 3]
    first = Transcript()
    compacted(first)
    first.prompt("go on")
    first.response(text("going on"))
    (tmp_path / "b").mkdir()
    kept = intake_transcript(first, tmp_path / "b")
    assert any("SUMMARY-OF-THE-EARLIER-TURNS" in (m["text"] or "") for turn in kept.turns for m in turn.messages)


def test_a_large_outputs_size_is_worked_out_once_and_an_acknowledgement_read_from_its_start(monkeypatch):
    """A Smart Compact of a thread with 30 MB outputs of other than ASCII took 14-22 s before
    Claude started: each fitting round encoded every one again to know its size, and the
    look for background work opened every output whole to read an acknowledgement that is a
    few hundred characters at its start."""
    import zlib
    text = ("résultat ligne\n" * 200_000)
    m = cc_lhc.StoredMessage(seq=5, text=text, is_error=0, tool_use_id="t", kind="tool_result")
    m._stored_data = None
    calls = []
    real = cc_lhc.utf8_len
    monkeypatch.setattr(cc_lhc, "utf8_len", lambda t: (calls.append(len(t)), real(t))[1])
    first = cc_lhc.tool_stub(m, "Bash")
    for _ in range(30):
        assert cc_lhc.tool_stub(m, "Bash") == first and not cc_lhc._keeps_verbatim(m)
    assert len(calls) == 1 and "200000 lines" in first
    packed = zlib.compress(text.encode(), 1)
    head = cc_lhc.stored_text_head(packed, 1000)
    assert head == text[:1000] and cc_lhc.stored_text_head(text, 10) == text[:10]
    assert cc_lhc.stored_text_head(zlib.compress("é".encode() * 10), 3) == "ééé"
