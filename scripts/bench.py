#!/usr/bin/env python3
"""cc-lhc benchmarks: measure, print figures and ratios, never assert.

    python3 scripts/bench.py                 # run every benchmark
    python3 scripts/bench.py json-floor intake
    python3 scripts/bench.py --list
    python3 scripts/bench.py --json          # machine-readable results on stdout
    python3 scripts/bench.py --runs 3 --size-mb 2   # quicker, smaller input

Adding a benchmark is writing one function:

    @bench("my-thing", "what it measures, in one line")
    def _my_thing(ctx: Ctx) -> dict:
        path = ctx.transcript()                    # the cached generated transcript
        secs, _times = ctx.median_time(lambda: work(path), ctx.runs(5))
        return {"time (median)": Figure(secs, "s"),
                "vs json floor": Ratio("my-thing / json floor", secs / ctx.result("json-floor")["_seconds"],
                                       target=3)}

A benchmark returns a dict of figure name -> Figure | Ratio | number | (value, unit).
Keys starting with "_" are kept for other benchmarks (``ctx.result(name)``) but not printed.
Raise NotAvailable("why") when what it measures does not exist yet: the runner prints
"not available yet" and goes on. The exit status is 0 whatever the figures are; 2 only for
an unknown benchmark name.

Benchmarks that time cc_lhc import it from the repository (``ctx.need_cc()``) and drive its
own functions (``Capture``, ``plan_rebuild``, ``smart_compact_before_launch``, ...) or run
``python3 cc_lhc.py ...`` as a child. All state lives in temp folders: the whole run is
sandboxed (HOME, CC_LHC_HOME, CLAUDE_CONFIG_DIR and XDG_CONFIG_HOME point into a temp
folder while benchmarks run), so the real home is never touched. Generated transcripts,
the peer tool's venv and its tokenizer cache are kept under .cache/bench/.

Numbers are wall times on whatever machine runs this; on a small, shared machine they are
noisy: compare figures taken in the same run, not across runs.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import py_compile
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
CACHE = REPO / ".cache" / "bench"
sys.path.insert(0, str(SCRIPTS))

import gen_transcript  # noqa: E402
import real_cli_transcript  # noqa: E402

ORIG_ENV = dict(os.environ)   # for package installs (pip reads its config from the real home)
CWD = "/home/user/proj"       # the project folder recorded in generated transcripts

# == Figures and the registry ===============================================================


@dataclass
class Figure:
    value: Any
    unit: str = ""
    note: str = ""


@dataclass
class Ratio:
    """numerator / denominator, shown as "label = 2.1× (target ≤ 3×)"."""
    label: str
    value: float
    target: float | None = None
    op: str = "≤"

    def meets(self) -> bool | None:
        if self.target is None or self.value is None:
            return None
        return self.value <= self.target if self.op == "≤" else self.value >= self.target

    def text(self) -> str:
        s = f"{self.label} = {_num(self.value)}×"
        if self.target is not None:
            verdict = {True: "meets", False: "misses", None: ""}[self.meets()]
            s += f" (target {self.op} {_num(self.target)}×{', ' + verdict if verdict else ''})"
        return s


class NotAvailable(Exception):
    """What the benchmark measures does not exist yet."""


@dataclass
class Bench:
    name: str
    doc: str
    fn: Callable[["Ctx"], dict]


REGISTRY: dict[str, Bench] = {}


def bench(name: str, doc: str = "") -> Callable:
    """Register a benchmark under name; the function gets a Ctx and returns figures."""
    def deco(fn: Callable[["Ctx"], dict]) -> Callable[["Ctx"], dict]:
        REGISTRY[name] = Bench(name, doc or (fn.__doc__ or "").strip().split("\n")[0], fn)
        return fn
    return deco


# == Context shared by the benchmarks =======================================================


class Ctx:
    def __init__(self, runs: int | None, size_mb: float, seed: int):
        self.runs_override = runs
        self.size_mb = size_mb
        self.seed = seed
        self.results: dict[str, dict] = {}
        self._running: set[str] = set()
        self._cc_lhc: Any = None
        self._cc_lhc_loaded = False
        self._scratch: list[Path] = []

    def runs(self, default: int) -> int:
        return self.runs_override or default

    def transcript(self, size_mb: float | None = None, seed: int | None = None, **opts: Any) -> Path:
        """A generated transcript, made once and kept under .cache/bench/."""
        size_mb = self.size_mb if size_mb is None else size_mb
        seed = self.seed if seed is None else seed
        extra = "".join(f"-{k}{v}" for k, v in sorted(opts.items()))
        # Keyed by the generator's own source too, so an edited generator never reuses old output.
        digest = hashlib.sha256(Path(gen_transcript.__file__).read_bytes()).hexdigest()[:10]
        path = CACHE / f"transcript-g{gen_transcript.GENERATOR_VERSION}.{digest}-{size_mb:g}mb-s{seed}{extra}.jsonl"
        if not path.exists():
            CACHE.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            gen_transcript.generate(str(path), size_mb, seed, **opts)
            print(f"# generated {path.relative_to(REPO)} in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
        return path

    def real_transcript(self, size_mb: float) -> Path:
        """A session the real CLI wrote (scripts/real_cli_transcript.py), grown to size_mb MiB.

        Recorded once against the fake API and kept under .cache/bench/ with its grown
        copies; tool output dominates it, as it does a real coding session.
        """
        CACHE.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        path = real_cli_transcript.transcript(CACHE, size_mb)
        if time.perf_counter() - t0 > 1:
            print(f"# made {path.relative_to(REPO)} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return path

    def result(self, name: str) -> dict:
        """Figures of another benchmark, running it first if needed (each runs once)."""
        if name not in self.results:
            if name in self._running:
                raise RuntimeError(f"benchmark cycle through {name}")
            self._running.add(name)
            try:
                self.results[name] = run_one(self, REGISTRY[name])
            finally:
                self._running.discard(name)
        return self.results[name]

    @property
    def cc_lhc(self) -> Any:
        """The cc_lhc module, or None while it does not exist or does not import."""
        if not self._cc_lhc_loaded:
            self._cc_lhc_loaded = True
            if (REPO / "cc_lhc.py").exists():
                sys.path.insert(0, str(REPO))
                try:
                    self._cc_lhc = importlib.import_module("cc_lhc")
                except Exception as exc:  # a broken module is a finding, not a crash
                    print(f"# cc_lhc did not import: {exc!r}", file=sys.stderr)
        return self._cc_lhc

    def need_cc(self) -> Any:
        """The cc_lhc module, or NotAvailable when it does not exist or does not import."""
        if self.cc_lhc is None:
            raise NotAvailable("cc_lhc.py not available yet (or it does not import)")
        return self.cc_lhc

    def scratch(self, prefix: str = "run") -> Path:
        """A fresh temp folder for one benchmark's state, removed when the run ends."""
        path = Path(tempfile.mkdtemp(prefix=f"cc-lhc-bench-{prefix}-"))
        self._scratch.append(path)
        return path

    def cleanup(self) -> None:
        for path in self._scratch:
            shutil.rmtree(path, ignore_errors=True)
        self._scratch.clear()

    def session_of(self, path: Path) -> str:
        """The session id a transcript records (its file name's, for a real one)."""
        with open(path, "rb") as fh:
            for _, line in zip(range(200), fh):
                try:
                    sid = json.loads(line).get("sessionId")
                except (ValueError, AttributeError):
                    continue
                if sid:
                    return sid
        return path.stem

    def estimate_of(self, path: Path) -> int:
        """Estimated tokens of the thread a transcript makes (captured into a throwaway store)."""
        cc = self.need_cc()
        root = self.scratch("calibrate")
        try:
            home, tid, _sid, _ = intake_into(self, root, path, index=False)
            store = cc.ThreadStore(home, tid)
            try:
                return thread_estimate(cc, store)
            finally:
                store.close()
        finally:
            shutil.rmtree(root, ignore_errors=True)

    def transcript_for_tokens(self, tokens: int) -> Path:
        """A generated transcript whose captured thread holds about ``tokens`` estimated tokens.

        The size is found by a few secant steps from the default transcript's density (the
        generator is not linear: bookkeeping per process, context growth) and remembered in
        .cache/bench/sizes.json, keyed by the generator's source and the seed.
        """
        digest = hashlib.sha256(Path(gen_transcript.__file__).read_bytes()).hexdigest()[:10]
        key = f"g{gen_transcript.GENERATOR_VERSION}.{digest}-s{self.seed}-{tokens}"
        memo = CACHE / "sizes.json"
        try:
            sizes = json.loads(memo.read_text())
        except (OSError, ValueError):
            sizes = {}
        if key in sizes:
            return self.transcript(size_mb=sizes[key])
        base = self.transcript()
        size = base.stat().st_size / gen_transcript.MIB
        est = self.estimate_of(base)
        for _ in range(4):
            nxt = max(0.5, round(size * tokens / est * 2) / 2)   # 0.5 MiB steps: cache hits
            if nxt == size:
                break
            size = nxt
            est = self.estimate_of(self.transcript(size_mb=size))
            if abs(est - tokens) <= 0.03 * tokens:
                break
        sizes[key] = size
        CACHE.mkdir(parents=True, exist_ok=True)
        memo.write_text(json.dumps(sizes, indent=1, sort_keys=True))
        return self.transcript(size_mb=size)

    @staticmethod
    def median_time(fn: Callable[[], Any], runs: int, warmup: int = 0) -> tuple[float, list[float]]:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times), times


def run_one(ctx: Ctx, b: Bench) -> dict:
    t0 = time.perf_counter()
    print(f"# {b.name} ...", file=sys.stderr, flush=True)
    try:
        out = b.fn(ctx)
    except NotAvailable as exc:
        out = {"_status": "not available yet", "_why": str(exc)}
    except Exception as exc:  # report and go on: a benchmark run is not a test run
        out = {"_status": "error", "_why": f"{type(exc).__name__}: {exc}"}
    out.setdefault("_status", "ok")
    print(f"# {b.name} done in {time.perf_counter() - t0:.1f} s ({out['_status']})", file=sys.stderr, flush=True)
    return out


# == Formatting =============================================================================


def _num(v: Any) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)


def _normalize(value: Any) -> Figure | Ratio:
    if isinstance(value, (Figure, Ratio)):
        return value
    if isinstance(value, tuple) and len(value) in (2, 3):
        return Figure(*value)
    if isinstance(value, dict) and "value" in value:
        return Figure(value["value"], value.get("unit", ""), value.get("note", ""))
    return Figure(value)


def rows_of(name: str, res: dict) -> list[tuple[str, str, str, str]]:
    if res.get("_status") != "ok":
        return [(name, "-", res.get("_status", "?"), res.get("_why", ""))]
    rows = []
    for key, value in res.items():
        if key.startswith("_"):
            continue
        f = _normalize(value)
        if isinstance(f, Ratio):
            rows.append((name, key, f.text(), ""))
        else:
            unit = f.unit + (f"  ({f.note})" if f.note else "")
            rows.append((name, key, _num(f.value), unit))
    return rows


def print_table(results: dict[str, dict]) -> None:
    rows = [("benchmark", "figure", "value", "unit")]
    for name, res in results.items():
        rows += rows_of(name, res)
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in rows)
    # Numbers are right-aligned in their column; words (ratios, statuses) just follow.
    w2 = max([len(r[2]) for r in rows[1:] if not r[2][:1].isalpha()] + [5])
    for i, (name, fig, value, unit) in enumerate(rows):
        cell = value.rjust(w2) if not value[:1].isalpha() else value.ljust(w2)
        print(f"{name:<{w0}}  {fig:<{w1}}  {cell}  {unit}".rstrip())
        if i == 0:
            print("-" * (w0 + w1 + w2 + 12))


def to_json(results: dict[str, dict]) -> dict:
    out = {}
    for name, res in results.items():
        entry: dict[str, Any] = {"status": res.get("_status"), "figures": {}, "ratios": {}}
        if res.get("_why"):
            entry["why"] = res["_why"]
        for key, value in res.items():
            if key.startswith("_"):
                continue
            f = _normalize(value)
            if isinstance(f, Ratio):
                entry["ratios"][key] = {"label": f.label, "value": f.value, "target": f.target, "op": f.op,
                                        "meets": f.meets()}
            else:
                entry["figures"][key] = {"value": f.value, "unit": f.unit, **({"note": f.note} if f.note else {})}
        out[name] = entry
    return out


# == Helpers shared by the benchmarks =======================================================


def sandbox_env(root: Path, base: dict | None = None, **extra: str) -> dict:
    """An environment whose every cc-lhc and Claude folder is under root (no CC_LHC_* inherited)."""
    env = dict(os.environ if base is None else base)
    for key in list(env):
        if key.startswith("CC_LHC_") and key != "CC_LHC_TOKENIZER_FILE":
            del env[key]
    env.update({"HOME": str(root), "CC_LHC_HOME": str(root / ".cc-lhc"),
                "CLAUDE_CONFIG_DIR": str(root / ".claude"), "XDG_CONFIG_HOME": str(root / ".config")})
    env.update(extra)
    return env


@contextlib.contextmanager
def sandboxed(root: Path, **extra: str):
    """This process's environment pointed at root while inside, restored after."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(sandbox_env(root, saved, **extra))
    try:
        yield root
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def chdir(path: Path):
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def intake_into(ctx: Ctx, root: Path, path: Path, thread_id: str | None = None,
                session_id: str | None = None, index: bool = True) -> tuple[Any, str, str, dict]:
    """A whole transcript into a fresh thread store under root/.cc-lhc, as capture does it.

    Timed: the thread file's creation (ThreadStore: schema and migrations), then
    Capture.catch_up(index=False) on it, then ThreadStore.index_search(), each apart.
    Returns (home, thread_id, session_id, figures).
    """
    cc = ctx.need_cc()
    home = cc.StateHome(str(root / ".cc-lhc"))
    home.ensure()
    thread_id = thread_id or str(uuid.uuid4())
    session_id = session_id or ctx.session_of(path)
    t_made = time.perf_counter()
    cc.ThreadStore(home, thread_id).close()
    t0, c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
    cap = cc.Capture(home, thread_id, session_id, str(path))
    lines = cap.catch_up(index=False)
    t1, c1, m1 = time.perf_counter(), time.process_time(), time.thread_time()
    indexed = cap.store.index_search() if index else 0
    t2 = time.perf_counter()
    summary = cap.store.summary()
    cap.stop()
    return home, thread_id, session_id, {"lines": lines, "intake_s": t1 - t0, "index_s": t2 - t1,
                                         "intake_cpu_s": c1 - c0, "intake_main_cpu_s": m1 - m0,
                                         "create_s": t0 - t_made,
                                         "indexed": indexed, **summary}


def thread_estimate(cc: Any, store: Any) -> int:
    """Estimated tokens of a thread's record (cc_lhc.estimate_tokens, 4 bytes a token)."""
    return sum(cc.estimate_tokens(m["text"] or m["data"] or "") for m in store.messages())


def pct(values: list[float], p: float) -> float:
    """The p-th quantile (0..1), linearly interpolated."""
    values = sorted(values)
    k = (len(values) - 1) * p
    lo = int(k)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (k - lo)


def target_note(value: float, target: float, unit: str, op: str = "≤") -> str:
    ok = value <= target if op == "≤" else value >= target
    return f"target {op} {_num(target)} {unit}: {'meets' if ok else 'misses'}"


def ms(seconds: float, target_ms: float | None = None, note: str = "") -> Figure:
    """A time in ms, with the verdict against an absolute target when there is one."""
    notes = [note] if note else []
    if target_ms is not None:
        notes.append(target_note(seconds * 1000, target_ms, "ms"))
    return Figure(seconds * 1000, "ms", "; ".join(notes))


def spread(times: list[float], unit: str = "ms") -> str:
    scale = 1000 if unit == "ms" else 1
    return f"{len(times)} runs, min {_num(min(times) * scale)} {unit}"


class CommandFailed(Exception):
    pass


def time_process(argv: list[str], runs: int, env: dict, cwd: Path, warmup: int = 1,
                 before: Callable[[], Any] | None = None) -> tuple[list[float], subprocess.CompletedProcess]:
    """Wall times of a whole child process (warm-up runs not counted); ``before`` runs untimed."""
    times, proc = [], None
    for i in range(warmup + runs):
        if before:
            before()
        t0 = time.perf_counter()
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL)
        dt = time.perf_counter() - t0
        if proc.returncode != 0:
            err = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
            raise CommandFailed(f"{Path(argv[1] if len(argv) > 1 else argv[0]).name} exit "
                                f"{proc.returncode}: {err[0][:160]}")
        if i >= warmup:
            times.append(dt)
    return times, proc


def time_interleaved(cmds: dict[str, list[str]], runs: int, env: dict, cwd: Path,
                     warmup: int = 1) -> tuple[dict[str, list[float]], dict[str, subprocess.CompletedProcess]]:
    """Like time_process for several commands, run in turn, so load on a shared machine hits all alike."""
    times: dict[str, list[float]] = {k: [] for k in cmds}
    procs: dict[str, subprocess.CompletedProcess] = {}
    for i in range(warmup + runs):
        for name, argv in cmds.items():
            t, procs[name] = time_process(argv, 1, env, cwd, warmup=0)
            if i >= warmup:
                times[name] += t
    return times, procs


def compile_time(path: Path, runs: int = 5) -> float:
    """Seconds to compile a source file to bytecode (what every `python3 cc_lhc.py` pays:
    a script run as __main__ never uses a cached .pyc)."""
    src = path.read_bytes()
    return min(Ctx.median_time(lambda: compile(src, str(path), "exec"), runs)[1])


def _time_command(argv: list[str], runs: int, cwd: Path, target_ms: float | None = None) -> Figure:
    with tempfile.TemporaryDirectory(prefix="cc-lhc-bench-") as tmp:
        try:
            times, _ = time_process(argv, runs, sandbox_env(Path(tmp)), cwd)
        except CommandFailed as exc:
            return Figure("failed", "", str(exc)[:100])
    return ms(statistics.median(times), target_ms, f"median of {runs}, min {_num(min(times) * 1000)} ms")


# == Benchmarks =============================================================================


@bench("json-floor", "bare json.loads over every line of the generated transcript: the parse floor")
def _json_floor(ctx: Ctx) -> dict:
    path = ctx.transcript()
    size = path.stat().st_size
    loads = json.loads

    def parse() -> int:
        n = 0
        with open(path, "rb") as fh:
            for line in fh:
                loads(line)
                n += 1
        return n

    lines = parse()  # warm the page cache
    secs, times = ctx.median_time(parse, ctx.runs(7))
    return {"transcript": Figure(size / gen_transcript.MIB, "MiB", f"{lines:,} lines, {path.name}"),
            "parse time (median)": Figure(secs, "s", f"{len(times)} runs, min {_num(min(times))} s"),
            "throughput": Figure(size / gen_transcript.MIB / secs, "MiB/s"),
            "per line": Figure(secs / lines * 1e6, "µs"),
            "_seconds": secs}


@bench("intake", "a whole transcript into a fresh thread store (Capture.catch_up), then its search index")
def _intake(ctx: Ctx) -> dict:
    ctx.need_cc()
    path = ctx.transcript()
    runs = ctx.runs(5)
    rows = []
    for _ in range(runs + 1):          # the first run warms imports and caches, not counted
        root = ctx.scratch("intake")
        rows.append(intake_into(ctx, root, path)[3])
        shutil.rmtree(root, ignore_errors=True)
    rows = rows[1:]
    intake = statistics.median(r["intake_s"] for r in rows)
    index = statistics.median(r["index_s"] for r in rows)
    last = rows[-1]
    out: dict[str, Any] = {
        "intake (median)": Figure(intake, "s", f"{spread([r['intake_s'] for r in rows], 's')}; "
                                               "catch_up(index=False) into a new thread file"),
        "thread file creation": Figure(statistics.median(r["create_s"] for r in rows), "s",
                                       "schema and migrations, before intake"),
        "search index after intake": Figure(index, "s", f"{last['indexed']:,} rows; ThreadStore.index_search"),
        "searchable after": Figure(intake + index, "s", target_note(intake + index, 2, "s")),
        "throughput": Figure(path.stat().st_size / gen_transcript.MIB / intake, "MiB/s"),
        "record": Figure(f"{last['messages']:,} msgs", "", f"{last['turns']:,} turns, {last['lines']:,} lines, "
                                                         f"degraded: {last['degraded'] or 'no'}"),
        "_seconds": intake}
    floor = ctx.result("json-floor").get("_seconds")
    if floor:
        out["vs json floor"] = Ratio("intake / json floor", intake / floor, target=3)
        out["with index vs json floor"] = Ratio("(intake + index) / json floor", (intake + index) / floor)
    return out


def floor_seconds(path: Path, runs: int, warm: bool = True) -> float:
    """The streaming parse floor of one file: json.loads of each line as it is read."""
    loads = json.loads

    def parse() -> None:
        with open(path, "rb") as fh:
            for line in fh:
                loads(line)

    if warm:
        parse()  # the page cache
    return Ctx.median_time(parse, runs)[0]


def store_bytes(home: Any, thread_id: str) -> int:
    """A thread file's size on disk, its write-ahead log included."""
    base = Path(home.path("threads", f"{thread_id}.sqlite"))
    return sum(p.stat().st_size for p in (base, base.with_name(base.name + "-wal")) if p.exists())


REAL_SIZES_MB = (1, 14, 40)


@bench("intake-real", "real-CLI sessions of 1, 14 and 40 MiB into a fresh store: time vs the floor, store size, "
                      "peak RSS at 40 MiB")
def _intake_real(ctx: Ctx) -> dict:
    ctx.need_cc()
    out: dict[str, Any] = {}
    for size_mb in REAL_SIZES_MB:
        path = ctx.real_transcript(size_mb)
        size = path.stat().st_size
        # Small sessions take milliseconds, so they get more runs; each run times the floor
        # and then the intake, so load on a shared machine falls on both alike.
        runs = ctx.runs({1: 15, 14: 5}.get(size_mb, 3))
        rows, floors, stored = [], [], 0
        for i in range(runs + 1):          # the first run warms imports and caches, not counted
            floors.append(floor_seconds(path, 1, warm=i == 0))
            root = ctx.scratch("intake-real")
            home, tid, _sid, row = intake_into(ctx, root, path)
            stored = store_bytes(home, tid)
            rows.append(row)
            shutil.rmtree(root, ignore_errors=True)
        rows, floor = rows[1:], statistics.median(floors[1:])
        intake = statistics.median(r["intake_s"] for r in rows)
        index = statistics.median(r["index_s"] for r in rows)
        tag = f"{size_mb} MiB"
        out[f"{tag}: intake (median)"] = Figure(intake, "s", f"{spread([r['intake_s'] for r in rows], 's')}; "
                                                          f"{rows[-1]['messages']:,} msgs")
        out[f"{tag}: intake CPU (median)"] = Figure(
            statistics.median(r["intake_cpu_s"] for r in rows), "s",
            f"every thread; the capture thread alone "
            f"{statistics.median(r['intake_main_cpu_s'] for r in rows):.3g} s (the rest overlaps it)")
        out[f"{tag}: streaming json floor"] = Figure(floor, "s", f"{runs} runs, each just before an intake run")
        out[f"{tag}: intake vs floor"] = Ratio("intake / json floor", intake / floor, target=2.5)
        out[f"{tag}: thread file creation"] = Figure(statistics.median(r["create_s"] for r in rows), "s",
                                                    "schema and migrations, once per thread, not in intake")
        out[f"{tag}: search index after"] = Figure(index, "s")
        out[f"{tag}: store"] = Figure(stored / gen_transcript.MIB, "MiB", "thread file + WAL, indexes included")
        out[f"{tag}: store vs transcript"] = Ratio("store / transcript", stored / size, target=0.6)
    path = ctx.real_transcript(REAL_SIZES_MB[-1])
    peak = memory_child(ctx, path, ctx.scratch("memory-real"))["peak"]
    out[f"{REAL_SIZES_MB[-1]} MiB: peak RSS"] = Figure(peak, "MB", "separate process, capture + index; "
                                                       + target_note(peak, 80, "MB"))
    return out


# Linux carries ru_maxrss across execve (the parent's high-water mark at fork/exec becomes
# the child's floor: it read 59 MB for a bare `python3 -c`), so the child reads its own
# address space's peak, VmHWM, and falls back to ru_maxrss where /proc does not exist.
MEMORY_CHILD = r"""
import json, resource, sys, uuid
def peak_mb():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1 << 20) if sys.platform == "darwin" else r / 1024
start = peak_mb()
sys.path.insert(0, sys.argv[1])
import cc_lhc
imported = peak_mb()
home = cc_lhc.StateHome(sys.argv[3])
home.ensure()
cap = cc_lhc.Capture(home, str(uuid.uuid4()), sys.argv[4], sys.argv[2])
lines = cap.catch_up(index=False)
cap.store.index_search()
cap.stop()
print(json.dumps({"start": start, "imported": imported, "peak": peak_mb(), "lines": lines}))
"""


def memory_child(ctx: Ctx, path: Path, root: Path) -> dict:
    """MEMORY_CHILD's report for capturing ``path`` into a state folder under ``root``."""
    proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(REPO), str(path), str(root / ".cc-lhc"),
                           ctx.session_of(path)], cwd=root, env=sandbox_env(root),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    if proc.returncode:
        raise CommandFailed(proc.stderr.decode(errors="replace").strip().splitlines()[-1][:160])
    return json.loads(proc.stdout)


@bench("capture-memory", "peak RSS of a separate process capturing the whole transcript (VmHWM / ru_maxrss)")
def _capture_memory(ctx: Ctx) -> dict:
    ctx.need_cc()
    try:
        import resource  # noqa: F401
    except ImportError:
        raise NotAvailable("resource.getrusage is POSIX only")
    path = ctx.transcript()
    runs = ctx.runs(3)
    reports = []
    for _ in range(runs):
        root = ctx.scratch("memory")
        reports.append(memory_child(ctx, path, root))
        shutil.rmtree(root, ignore_errors=True)
    peak = statistics.median(r["peak"] for r in reports)
    size = path.stat().st_size / gen_transcript.MIB
    return {"peak RSS while capturing": Figure(peak, "MB", f"median of {runs}, {size:.1f} MiB transcript; "
                                                           + target_note(peak, 80, "MB")),
            "after `import cc_lhc`": Figure(statistics.median(r["imported"] for r in reports), "MB"),
            "bare interpreter": Figure(statistics.median(r["start"] for r in reports), "MB"),
            "capture's own share": Figure(peak - statistics.median(r["imported"] for r in reports), "MB",
                                          "peak minus after-import")}


def live_latency(ctx: Ctx, path: Path, n: int) -> tuple[list[float], int]:
    """Start a live Capture on the transcript minus its last n lines, then append them one by one.

    Each latency is from the write of a complete line to the moment a separate SQLite
    connection sees the capture's committed offset reach the end of that line.
    """
    import sqlite3
    cc = ctx.need_cc()
    lines = path.read_bytes().splitlines(keepends=True)
    n = min(n, len(lines) - 1)
    prefix, tail = b"".join(lines[:-n]), lines[-n:]
    root = ctx.scratch("live")
    home = cc.StateHome(str(root / ".cc-lhc"))
    home.ensure()
    live = root / "live.jsonl"
    live.write_bytes(prefix)
    tid, sid = str(uuid.uuid4()), ctx.session_of(path)
    db_path = Path(home.path("threads", f"{tid}.sqlite"))
    reader = None

    def stored() -> int:
        nonlocal reader
        if reader is None:
            if not db_path.exists():
                return -1
            reader = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=30)
        try:
            row = reader.execute("SELECT offset FROM sources WHERE session_id = ?", (sid,)).fetchone()
        except sqlite3.OperationalError:
            return -1  # the schema is not there yet
        return row[0] if row else -1

    def wait_for(offset: int, timeout: float) -> None:
        deadline = time.perf_counter() + timeout
        while stored() < offset:
            if time.perf_counter() > deadline:
                raise TimeoutError(f"capture did not reach offset {offset} in {timeout} s "
                                   f"(error: {cap.error!r})")
            time.sleep(0.001)

    cap = cc.Capture(home, tid, sid, str(live))
    cap.start()
    latencies = []
    rng = random.Random(ctx.seed)
    fd = os.open(live, os.O_WRONLY | os.O_APPEND)
    try:
        pos = len(prefix)
        wait_for(pos, 120)
        for line in tail:
            time.sleep(rng.uniform(0.01, 0.08))   # land anywhere in the capture's poll cycle
            pos += len(line)
            t0 = time.perf_counter()
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view):]
            wait_for(pos, 30)
            latencies.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        cap.stop()
        if reader is not None:
            reader.close()
    shutil.rmtree(root, ignore_errors=True)
    return latencies, len(prefix)


@bench("capture-latency", "live Capture.start(): a complete line appended until the store shows it")
def _capture_latency(ctx: Ctx) -> dict:
    ctx.need_cc()
    n = ctx.runs(50)
    out: dict[str, Any] = {}
    for label, path in (("long session", ctx.transcript()), ("short session", ctx.transcript(size_mb=1))):
        lat, prefix = live_latency(ctx, path, n)
        where = f"{len(lat)} lines onto {prefix / gen_transcript.MIB:.1f} MiB already captured"
        out[f"{label}: median"] = ms(statistics.median(lat), 250, where)
        out[f"{label}: p95"] = ms(pct(lat, 0.95), 250)
        out[f"{label}: max"] = ms(max(lat))
    return out


def view_breakdown(cc: Any, store: Any, tid: str, policy: Any, folder: Path, runs: int) -> dict:
    """plan_rebuild's stages timed one by one (same functions, same order)."""
    stages: dict[str, list[float]] = {}
    for _ in range(runs):
        t = [time.perf_counter()]

        def mark(name: str) -> None:
            t.append(time.perf_counter())
            stages.setdefault(name, []).append(t[-1] - t[-2])

        turns = cc.load_turns(store)
        mark("load_turns")
        summaries = cc.thread_summaries(store, turns)
        mark("thread_summaries")
        favoured = cc.recent_impression_turns(store)
        view = cc.build_view(tid, turns, policy.effective_target, policy["profile"], summaries, favoured)
        mark("build_view")
        header = cc.render_header(view, cc.working_set(turns), policy.fell_back)
        mark("working_set + render_header")
        sid = cc.new_session_id()
        records = cc.view_records(view, turns, header, sid, CWD, cc.utc_now_iso())
        mark("view_records")
        data = cc.records_bytes(records)
        mark("records_bytes")
        cc.write_atomic(str(folder / f"{sid}.jsonl"), data)
        mark("write_atomic")
    return {name: statistics.median(v) for name, v in stages.items()}


@bench("view-build", "plan_rebuild + write_atomic of a rebuilt session for a ~400k-token thread")
def _view_build(ctx: Ctx) -> dict:
    cc = ctx.need_cc()
    path = ctx.transcript_for_tokens(400_000)
    root = ctx.scratch("view")
    home, tid, _sid, info = intake_into(ctx, root, path)
    store = cc.ThreadStore(home, tid)
    policy = cc.resolve_policy([])
    projects = root / "projects"
    runs = ctx.runs(5)
    last: dict[str, Any] = {}

    def once(envelope: str | None = None) -> None:
        rb = cc.plan_rebuild(home, store, tid, policy, cc.new_session_id(), CWD, projects_root=str(projects),
                             envelope_from=envelope)
        cc.write_atomic(rb.path, rb.data)
        last["rb"] = rb

    try:
        est = thread_estimate(cc, store)
        secs, times = ctx.median_time(once, runs, warmup=1)
        env_secs, env_times = ctx.median_time(lambda: once(str(path)), runs)
        try:
            parts: dict[str, Any] = view_breakdown(cc, store, tid, policy, root / "breakdown", runs)
        except Exception as exc:  # the stages moved: the headline still stands
            parts = {"breakdown": Figure("failed", "", f"{type(exc).__name__}: {exc}"[:100])}
    finally:
        store.close()
    rb = last["rb"]
    bands = ", ".join(f"{b} {len(rb.view.turns_in(b))}" for b in ("full", "lean", "summary", "omitted"))
    out: dict[str, Any] = {
        "thread": Figure(est, "est. tokens", f"{info['turns']} turns, {info['messages']:,} messages, "
                                             f"{path.stat().st_size / gen_transcript.MIB:.1f} MiB transcript"),
        "plan_rebuild + write_atomic (median)": ms(secs, 300, spread(times)),
        "same, with envelope_from=transcript": ms(env_secs, 300, spread(env_times) + "; as Smart Compact calls it"),
        "rebuilt rollout": Figure(len(rb.data) / 1024, "KiB", f"turns: {bands}"),
        "_seconds": secs}
    for name, value in parts.items():
        out[f"  stage {name}"] = value if isinstance(value, Figure) else ms(value, note="median")
    return out


def long_turn_transcript(path: Path, calls: int, tokens: int, seed: int) -> str:
    """One prompt followed by ``calls`` tool calls whose outputs (file reads, logs, search
    hits, as gen_transcript writes them) hold about ``tokens`` estimated tokens, then the
    final answer: the one-prompt-many-tools session. Returns its session id."""
    rng = random.Random(seed)
    text = gen_transcript.Text(rng, CWD)
    sid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    per_call = tokens * 4 // calls
    parent, clock, lines = None, gen_transcript.BASE_EPOCH_MS, []

    def emit(rtype: str, **body: Any) -> None:
        nonlocal parent, clock
        clock += rng.randint(50, 4000)
        uid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        lines.append(gen_transcript.dumps({
            "parentUuid": parent, "isSidechain": False, "userType": "external", "entrypoint": "cli",
            "cwd": CWD, "sessionId": sid, "version": gen_transcript.CLAUDE_VERSION, "gitBranch": "main",
            "type": rtype, **body, "uuid": uid, "timestamp": gen_transcript.iso(clock)}))
        parent = uid

    def response(i: int, blocks: list[dict], stop: str) -> None:
        mid = f"msg_bench{i:05d}{rng.getrandbits(40):010x}"
        usage = {"input_tokens": 6, "cache_creation_input_tokens": 900,
                 "cache_read_input_tokens": 20_000 + i * per_call // 4, "output_tokens": 120}
        for block in blocks:
            emit("assistant", requestId=f"req_{mid}", message={
                "id": mid, "type": "message", "role": "assistant", "model": gen_transcript.MODEL,
                "content": [block], "stop_reason": stop, "stop_sequence": None, "usage": usage})

    emit("user", message={"role": "user", "content": text.prompt()})
    for i in range(calls):
        kind = ("Read", "Bash", "Grep")[i % 3]
        target = rng.choice(text.files)
        if kind == "Read":
            body = gen_transcript.numbered(text.file_content(target, per_call // 40).splitlines(), 1)
            inp = {"file_path": text.abs(target)}
        elif kind == "Bash":
            body = "\n".join(text.log_line(clock + j * 37) for j in range(per_call // 110))
            inp = {"command": f"pytest -q {target}", "description": "run the tests"}
        else:
            body = "\n".join(f"{text.abs(rng.choice(text.files))}:{rng.randint(1, 900)}: {text.sentence()}"
                             for _ in range(per_call // 120))
            inp = {"pattern": rng.choice(text.idents), "output_mode": "content"}
        tid = f"toolu_bench{i:05d}{rng.getrandbits(40):010x}"
        response(i, [{"type": "text", "text": text.sentence()},
                     {"type": "tool_use", "id": tid, "name": kind, "input": inp}], "tool_use")
        emit("user", message={"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": body, "is_error": False}]},
            toolUseResult={"stdout": body, "stderr": "", "interrupted": False})
    response(calls, [{"type": "text", "text": text.paragraph(3, 6)}], "end_turn")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return sid


def time_rebuild(ctx: Ctx, path: Path, name: str) -> dict:
    """Intake a transcript, then time plan_rebuild + write_atomic of its rebuilt session."""
    cc = ctx.need_cc()
    root = ctx.scratch(name)
    home, tid, _sid, info = intake_into(ctx, root, path)
    store = cc.ThreadStore(home, tid)
    policy = cc.resolve_policy([])
    last: dict[str, Any] = {}

    def once() -> None:
        rb = cc.plan_rebuild(home, store, tid, policy, cc.new_session_id(), CWD,
                             projects_root=str(root / "projects"), envelope_from=str(path))
        cc.write_atomic(rb.path, rb.data)
        last["rb"] = rb

    try:
        est = thread_estimate(cc, store)
        secs, times = ctx.median_time(once, ctx.runs(5), warmup=1)
    finally:
        store.close()
    view = last["rb"].view
    bands = ", ".join(f"{b} {len(view.turns_in(b))}" for b in ("full", "lean", "summary", "omitted"))
    parts = "; ".join(f"t{n}: " + ", ".join(f"m{a}\u2013m{b} {band}" for a, b, band in runs)
                      for n, runs in sorted(view.pieces.items()))
    return {"thread": Figure(est, "est. tokens", f"{info['turns']} turns, {info['messages']:,} messages, "
                                                 f"{path.stat().st_size / gen_transcript.MIB:.1f} MiB transcript"),
            "plan_rebuild + write_atomic (median)": ms(secs, 300, spread(times)),
            "rebuilt rollout": Figure(len(last["rb"].data) / 1024, "KiB",
                                      f"turns: {bands}" + (f"; long turns in parts: {parts}" if parts else "")),
            "_seconds": secs}


@bench("view-build-1m", "plan_rebuild + write_atomic for a ~1M-token thread (Smart Compact's view build + write)")
def _view_build_1m(ctx: Ctx) -> dict:
    return time_rebuild(ctx, ctx.transcript_for_tokens(1_000_000), "view-1m")


@bench("view-build-long-turn", "plan_rebuild + write_atomic for one 600k-token turn of 200 tool calls")
def _view_build_long_turn(ctx: Ctx) -> dict:
    path = ctx.scratch("long-turn-src") / "long-turn.jsonl"
    long_turn_transcript(path, calls=200, tokens=600_000, seed=ctx.seed)
    return time_rebuild(ctx, path, "view-long-turn")


@bench("get-turns", "`python3 cc_lhc.py get-turns tN` of one turn from a ~1M-token thread, whole process")
def _get_turns(ctx: Ctx) -> dict:
    cc = ctx.need_cc()
    path = ctx.transcript_for_tokens(1_000_000)
    root = ctx.scratch("get-turns")
    home = cc.StateHome(str(root / ".cc-lhc"))
    home.ensure()
    sid = ctx.session_of(path)
    registry, hostdb = cc.Registry(home), cc.HostDB(home)
    tid = registry.create_thread(sid, CWD, "bench")      # the thread, with sid as its current alias
    hostdb.note_session(sid, tid, str(path), CWD)
    _, _, _, info = intake_into(ctx, root, path, thread_id=tid, session_id=sid)
    store = cc.ThreadStore(home, tid)
    try:
        est = thread_estimate(cc, store)
        numbers = [r[0] for r in store.db.execute("SELECT n FROM turns ORDER BY n")]
        n = numbers[len(numbers) // 2]
        turn_bytes = sum(len((m["text"] or m["data"] or "").encode()) for m in store.messages(n, n))
    finally:
        store.close()
    # The descriptor's owner is this benchmark process, which stays alive while the child runs.
    desc = cc.create_descriptor(home, hostdb, tid, sid)
    registry.db.close()
    hostdb.db.close()
    env = sandbox_env(root, CC_LHC_RUNTIME_DESCRIPTOR=desc["path"])
    runs = ctx.runs(15)
    lib, entry = compiled_entry(root)  # as installed copies run it: from compiled bytecode
    cmds = {"get-turns": entry + ["get-turns", f"t{n}"],
            "pass": [sys.executable, "-c", "pass"],
            "import": [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(lib)!r}); import cc_lhc"]}
    times, procs = time_interleaved(cmds, runs, env, root)
    out = procs["get-turns"].stdout
    if not out.startswith(b"<cc-lhc-recall"):
        raise CommandFailed(f"unexpected get-turns output: {out[:80]!r}")
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"thread": Figure(est, "est. tokens", f"{info['turns']:,} turns, {info['messages']:,} messages, "
                                                 f"{path.stat().st_size / gen_transcript.MIB:.1f} MiB transcript"),
            f"get-turns t{n} (median)": ms(med["get-turns"], 150, spread(times["get-turns"])
                                           + f"; turn {turn_bytes / 1024:.1f} KiB, {len(out):,} bytes out"),
            "python3 -c pass": ms(med["pass"], note=spread(times["pass"])),
            "python3 -c 'import cc_lhc'": ms(med["import"], note=spread(times["import"]) + "; compiled bytecode"),
            "  compiling cc_lhc.py": ms(compile_time(REPO / "cc_lhc.py"),
                                        note="paid on top by every `python3 cc_lhc.py` run "
                                             "when bytecode is not cached"),
            "get-turns own work": ms(med["get-turns"] - med["import"], note="median minus import median"),
            "_seconds": med["get-turns"]}


def _search_samples(cc: Any, store: Any, n: int, seed: int) -> list[tuple[str, int]]:
    """(string, the one message holding it): shell commands, error lines, paths and hashes
    of the thread's older half, each of 8+ characters and occurring once in the thread."""
    rng = random.Random(seed)
    rows = store.db.execute(f"SELECT m.seq, m.turn, m.kind, {cc.SEARCH_BODY_SQL} FROM messages m "
                            "ORDER BY m.seq").fetchall()
    half = (rows[-1][1] if rows else 0) // 2
    bodies = [body or "" for _, _, _, body in rows]
    everything = "\x00".join(bodies)
    starts, at = [], 0
    for body in bodies:
        starts.append(at)
        at += len(body) + 1
    found: list[str] = []
    for _seq, turn, kind, body in rows:
        if turn > half or not body:
            continue
        if kind == "tool_call":
            found += body.split("\n")[:1]                                # the command, the path
        found += [ln.strip() for ln in body.split("\n") if "Error" in ln][:2]
        found += [w for w in body.split() if len(w) >= 12 and ("/" in w or w.isalnum())][:2]
    picked, seen = [], set()
    for s in rng.sample(found, len(found)):
        if len(s) < 8 or s in seen or everything.count(s) != 1:
            continue
        seen.add(s)
        picked.append((s, rows[bisect.bisect_right(starts, everything.find(s)) - 1][0]))
        if len(picked) == n:
            break
    return picked


def _index_bytes(cc: Any, db_path: Path) -> int:
    """What the substring index adds to a thread file: its size less a copy without it, both vacuumed."""
    import sqlite3
    sizes = []
    for drop in (False, True):
        copy = db_path.with_name(f"copy-{drop}.sqlite")
        src = sqlite3.connect(db_path)
        src.execute("VACUUM INTO ?", (str(copy),))
        src.close()
        if drop:
            db = sqlite3.connect(copy)
            db.execute("DROP TABLE messages_exact")
            db.commit()
            db.execute("VACUUM")
            db.close()
        sizes.append(copy.stat().st_size)
        copy.unlink()
    return sizes[0] - sizes[1]


SEARCH_CHECKED = 300   # unique strings checked for a top-3 hit, in process
SEARCH_TIMED = 12      # of those, the ones timed as whole processes


def compiled_entry(root: Path) -> tuple[Path, list[str]]:
    """A command line that runs cc_lhc as installed copies do (zipapp, bundle): imported from
    bytecode compiled beforehand, which a copy beside its own __pycache__ gives even under
    PYTHONDONTWRITEBYTECODE. Returns (the copy's folder, the command's first words)."""
    lib = root / "lib"
    lib.mkdir(exist_ok=True)
    shutil.copy(REPO / "cc_lhc.py", lib / "cc_lhc.py")
    py_compile.compile(str(lib / "cc_lhc.py"), cfile=importlib.util.cache_from_source(str(lib / "cc_lhc.py")),
                       doraise=True)
    return lib, [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(lib)!r}); import cc_lhc; "
                                       "sys.exit(cc_lhc.main(sys.argv[1:]))"]


def counts_forgetter(cc: Any, state: Path) -> tuple[Path, Callable[[], None]]:
    """The counts cache of the state folder ``state`` (cc_lhc's own CountsCache path), and
    a function that empties it of counts, leaving the file (with the rank file's checksum
    it has noted): someone who has used cc-lhc before, whose texts were never counted."""
    import sqlite3
    counts = Path(cc.CountsCache(cc.StateHome(str(state))).path)

    def forget() -> None:
        if not counts.exists():
            return
        db = sqlite3.connect(counts)
        try:
            with db:
                db.execute("DELETE FROM counts")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            db.close()
    return counts, forget


@bench("search", "`cc-lhc search` of unique strings from the older half of a 40 MiB real-CLI session, whole process")
def _search(ctx: Ctx) -> dict:
    cc = ctx.need_cc()
    if not cc.trigram_available():
        raise NotAvailable("this SQLite has no trigram tokenizer (search scans instead)")
    path = ctx.real_transcript(40)
    root = ctx.scratch("search")
    home = cc.StateHome(str(root / ".cc-lhc"))
    home.ensure()
    sid = ctx.session_of(path)
    registry, hostdb = cc.Registry(home), cc.HostDB(home)
    tid = registry.create_thread(sid, CWD, "bench")
    hostdb.note_session(sid, tid, str(path), CWD)
    _, _, _, info = intake_into(ctx, root, path, thread_id=tid, session_id=sid, index=False)
    store = cc.ThreadStore(home, tid)
    try:
        real = cc.trigram_available
        cc.trigram_available = lambda: False      # the word index alone, then the substring index
        t0 = time.perf_counter()
        store.index_search()
        cc.trigram_available = real
        t1 = time.perf_counter()
        store.index_search()
        t2 = time.perf_counter()
        indexed_chars = store.db.execute(f"SELECT sum(length({cc.SEARCH_BODY_SQL})) FROM messages m").fetchone()[0]
        samples = _search_samples(cc, store, SEARCH_CHECKED, ctx.seed)
        in_process, missed = [], []
        for s, seq in samples:
            t = time.perf_counter()
            hits = cc.search_thread(store, s, 3)
            in_process.append(time.perf_counter() - t)
            if seq not in [h.seq for h in hits]:
                missed.append(s)
    finally:
        store.close()
    if not samples:
        raise NotAvailable("no unique strings found in the session")
    index_bytes = _index_bytes(cc, Path(home.path("threads", f"{tid}.sqlite")))
    desc = cc.create_descriptor(home, hostdb, tid, sid)
    registry.db.close()
    hostdb.db.close()
    lib, entry = compiled_entry(root)
    session_env = sandbox_env(root, CC_LHC_RUNTIME_DESCRIPTOR=desc["path"])
    person_env = sandbox_env(root)
    runs = ctx.runs(3)
    session_t, person_t = [], []
    for s, _ in samples[:SEARCH_TIMED]:
        times, _p = time_process(entry + ["search", "--limit", "5", "--", s], runs, session_env, root)
        session_t.append(statistics.median(times))
        times, _p = time_process(entry + ["search", "--all", "--limit", "5", "--", s], runs, person_env, root)
        person_t.append(statistics.median(times))
    imp, _p = time_process(entry[:2] + [f"import sys; sys.path.insert(0, {str(lib)!r}); import cc_lhc"],
                           runs * 3, person_env, root)
    bare, _p = time_process([sys.executable, "-c", "pass"], runs * 3, person_env, root)
    size = path.stat().st_size
    med = statistics.median(session_t)
    return {"thread": Figure(f"{info['messages']:,} msgs", "", f"{size / gen_transcript.MIB:.1f} MiB transcript, "
                                                              f"{indexed_chars / 1e6:.1f} M characters searchable"),
            "unique strings in the top 3": Figure(f"{len(samples) - len(missed)}/{len(samples)}", "",
                                                  "target: all" + (f"; missed e.g. {missed[0]!r}" if missed else "")),
            "search in session (median)": ms(med, 150, f"{len(session_t)} strings, worst "
                                                       f"{_num(max(session_t) * 1000)} ms; whole process"),
            "search --all outside a session": ms(statistics.median(person_t), 150,
                                                 f"worst {_num(max(person_t) * 1000)} ms"),
            "  python3 -c pass": ms(statistics.median(bare), note="the interpreter alone"),
            "  import cc_lhc": ms(statistics.median(imp), note="from compiled bytecode"),
            "  search beyond the interpreter": ms(med - statistics.median(bare), note="median minus python3 -c pass"),
            "  search itself, in process": ms(statistics.median(in_process),
                                              note=f"worst {_num(max(in_process) * 1000)} ms"),
            "word index build": Figure(t1 - t0, "s", "ThreadStore.index_search without trigrams"),
            "substring index build": Figure(t2 - t1, "s", f"{indexed_chars / max(t2 - t1, 1e-9) / 1e6:.1f} M chars/s"),
            "substring index size": Figure(index_bytes / gen_transcript.MIB, "MiB",
                                           f"{index_bytes / size:.2f}× the transcript, "
                                           f"{index_bytes / max(indexed_chars, 1):.2f} B per character"),
            "_seconds": med}


LCC_SPEC = "local-context-compiler[tiktoken]==1.2.0"
LCC_VERSION = "1.2.0"
LCC_VENV = CACHE / "lcc-venv"
LCC_MODES = ("lossless", "stashed")   # the rule-based modes `lcc measure-session` runs (minus `auto`)
TIKTOKEN_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"

# `lcc measure-session` has no flag to choose modes: it always runs rules:lossless,
# rules:stashed and `auto` (its ranker, minutes to hours on a large session). This driver
# runs its own measure_session() with MODES narrowed to the rule-based ones asked for.
LCC_DRIVER = r"""
import json, sys
from pathlib import Path
import lcc.session_report as sr
wanted = sys.argv[2].split(",")
sr.MODES = tuple((f"rules:{m}", "rules", m) for m in wanted)
print(json.dumps(sr.measure_session(Path(sys.argv[1]))))
"""


def lcc_python() -> Path:
    """The private venv's interpreter with lcc installed (made on first use); raises RuntimeError."""
    py = LCC_VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    probe = [str(py), "-c", "import lcc, tiktoken, importlib.metadata as m; "
                            "print(m.version('local-context-compiler'))"]

    def installed() -> bool:
        if not py.exists():
            return False
        p = subprocess.run(probe, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=ORIG_ENV)
        return p.returncode == 0 and p.stdout.decode().strip() == LCC_VERSION

    if installed():
        return py
    print(f"# installing {LCC_SPEC} into {LCC_VENV.relative_to(REPO)}", file=sys.stderr)
    steps = [[sys.executable, "-m", "venv", "--clear", str(LCC_VENV)],
             [str(py), "-m", "pip", "install", "-q", LCC_SPEC]]
    for argv in steps:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ORIG_ENV, timeout=1200)
        if p.returncode:
            err = [ln for ln in p.stderr.decode(errors="replace").splitlines() if "WARNING" not in ln][-1:] or [""]
            raise RuntimeError(f"{' '.join(argv[-2:])} failed: {err[0][:120]}")
    if not installed():
        raise RuntimeError("lcc installed but does not import")
    return py


def tiktoken_cache() -> Path | None:
    """A TIKTOKEN_CACHE_DIR holding cc-lhc's own o200k_base file, under the name tiktoken looks for.

    tiktoken's read_file_cached() opens $TIKTOKEN_CACHE_DIR/<sha1 of the blob URL> and
    checks its sha256 before any download; lcc only ever lets tiktoken read that cache
    (its counters block the network), so this is what makes lcc's counts exact offline.
    """
    src = REPO / ".cache" / "tokenizer" / "o200k_base.tiktoken"
    if not src.exists():
        return None
    folder = CACHE / "tiktoken-cache"
    dest = folder / hashlib.sha1(TIKTOKEN_O200K_URL.encode()).hexdigest()
    if not dest.exists():
        data = src.read_bytes()
        if hashlib.sha256(data).hexdigest() != O200K_SHA256:
            return None
        folder.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.replace(dest)
    return folder


def _cut(report: dict, mode: str) -> float | None:
    row = next((r for r in report["modes"] if r["mode"] == f"rules:{mode}" and "error" not in r), None)
    return None if row is None else row["reduction"] * 100


@bench("measure-1m", "`cc-lhc measure` of the 1 MiB real-CLI session, whole process: texts never counted "
                     "(the tokenizer is built) and counted before (their counts are known)")
def _measure_1m(ctx: Ctx) -> dict:
    cc = ctx.need_cc()
    path = ctx.real_transcript(1)
    root = ctx.scratch("measure-1m")
    state = root / ".cc-lhc"
    state.mkdir(parents=True, exist_ok=True)
    _counts, forget = counts_forgetter(cc, state)
    runs = ctx.runs(5)
    env = sandbox_env(root)
    _lib, entry = compiled_entry(root)
    out: dict[str, Any] = {}
    commands = {"source": entry}
    exe = _dist_bundle_exe()
    if exe:
        commands["bundle"] = [str(exe)]
    # the compiled copy has no .cache beside it: it is told where the checkout's rank file is
    tokenizer = REPO / ".cache" / "tokenizer" / cc.TOKENIZER_FILE_NAME
    envs = {"source": sandbox_env(root, CC_LHC_TOKENIZER_FILE=str(tokenizer)), "bundle": env}
    for name, cmd in commands.items():
        argv = cmd + ["measure", str(path), "--json"]
        env = envs[name]
        # someone who never used cc-lhc: no state folder (measure makes it, to keep its counts)
        fresh = root / f"never-used-{name}"
        first, _p = time_process(argv, runs, dict(env, CC_LHC_HOME=str(fresh)), root, warmup=1,
                                 before=lambda: shutil.rmtree(fresh, ignore_errors=True))
        cold, proc = time_process(argv, runs, env, root, warmup=1, before=forget)
        warm, proc = time_process(argv, runs, env, root, warmup=1)
        report = json.loads(proc.stdout)["sessions"][0]
        out[f"{name}: first use (median)"] = ms(statistics.median(first), note=f"{spread(first)}; "
                                                "no state folder: the index beside the rank file read")
        out[f"{name}: first count (median)"] = ms(statistics.median(cold), note=f"{spread(cold)}; "
                                                  "an encoder built for its texts, every text counted")
        out[f"{name}: counted before (median)"] = ms(statistics.median(warm), 150, f"{spread(warm)}; "
                                                     f"{report['counting']}, {report['tokens']:,} tokens")
    if not exe:
        out["bundle"] = Figure("not built", "", "make it with build/build.py")
    bare, _p = time_process([sys.executable, "-c", "pass"], runs, env, root)
    out["python3 -c pass"] = ms(statistics.median(bare), note="the interpreter alone")
    return out


@bench("measure", "`cc-lhc measure FILE --json` vs the peer `lcc measure-session` rule-based modes, same file")
def _measure(ctx: Ctx) -> dict:
    cc = ctx.need_cc()
    path = ctx.transcript()
    root = ctx.scratch("measure")
    runs = ctx.runs(3)
    # As for someone who has used cc-lhc before: the state folder exists, so the first
    # (warm-up) run leaves the rank file's checksum noted there for the timed ones. The
    # counts it made go before each timed run: every text is counted, as lcc counts it.
    (root / ".cc-lhc").mkdir(parents=True, exist_ok=True)
    _counts, forget = counts_forgetter(cc, root / ".cc-lhc")
    times, proc = time_process([sys.executable, str(REPO / "cc_lhc.py"), "measure", str(path), "--json"],
                               runs, sandbox_env(root), root, warmup=1, before=forget)
    ours = json.loads(proc.stdout)["sessions"][0]
    secs = statistics.median(times)
    bands = ", ".join(f"{k} {v}" for k, v in ours.get("bands", {}).items())
    out: dict[str, Any] = {
        "cc-lhc measure (median)": Figure(secs, "s", f"{spread(times, 's')}; whole process"),
        "cc-lhc tokens": Figure(ours["tokens"], "tokens", ours.get("counting", "")),
        "cc-lhc lean cut": Figure(ours["lean_cut_pct"], "%", f"{ours['lean_tokens']:,} tokens after"),
        "cc-lhc summary cut": Figure(ours["summary_cut_pct"], "%", f"{ours['summary_tokens']:,} tokens after"),
        "cc-lhc smart compact cut": Figure(ours["smart_compact_cut_pct"], "%",
                                           f"{ours['smart_compact_tokens']:,} tokens; {bands}"),
        "_seconds": secs}
    floor = ctx.result("json-floor").get("_seconds")
    if floor:
        out["vs json floor"] = Ratio("measure / json floor", secs / floor)
    try:
        py = lcc_python()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        out["lcc measure-session"] = Figure("not run", "", f"cannot install {LCC_SPEC}: {exc}"[:160])
        return out
    cache = tiktoken_cache()
    env = sandbox_env(root, **({"TIKTOKEN_CACHE_DIR": str(cache)} if cache else {}))
    driver = root / "lcc_rules.py"
    driver.write_text(LCC_DRIVER)
    try:
        lcc_times, lproc = time_process([str(py), str(driver), str(path), ",".join(LCC_MODES)], runs, env, root,
                                        warmup=0)
        _, rproc = time_process([str(py), str(driver), str(path), "recoverable"], 1, env, root, warmup=0)
    except CommandFailed as exc:
        out["lcc measure-session"] = Figure("failed", "", str(exc))
        return out
    theirs, recov = json.loads(lproc.stdout), json.loads(rproc.stdout)
    lsecs = statistics.median(lcc_times)
    inside = ", ".join(f"{r['mode']} {r.get('ms', '?')} ms" for r in theirs["modes"])
    out["lcc rules modes (median)"] = Figure(lsecs, "s", f"{spread(lcc_times, 's')}; whole process; {inside}")
    out["lcc tokens"] = Figure(theirs["tokens_before"], "tokens", f"counted {theirs['token_count_method']}"
                               + ("" if cache else " (no o200k cache: approximate)"))
    for mode, report in (("lossless", theirs), ("recoverable", recov), ("stashed", theirs)):
        cut = _cut(report, mode)
        row = next((r for r in report["modes"] if r["mode"] == f"rules:{mode}"), {})
        out[f"lcc rules:{mode} cut"] = (Figure(cut, "%", f"{row.get('tokens_after', 0):,} tokens after, "
                                                         f"{row.get('ms', '?')} ms")
                                        if cut is not None else Figure("did not run", "", row.get("error", "")))
    out["lcc rules / cc-lhc measure"] = Ratio("lcc rules time / cc-lhc measure time", lsecs / secs,
                                              target=2, op="≥")
    stashed = _cut(theirs, "stashed")
    if stashed:
        out["our lean cut vs lcc stashed cut"] = Ratio("cc-lhc lean cut / lcc stashed cut",
                                                       ours["lean_cut_pct"] / stashed, target=1, op="≥")
    return out


PROMPT = "next step please"


@bench("smart-compact-overhead", "pre-launch Smart Compact of `cc-lhc --resume <id> -p` on a thread over the trigger")
def _smart_compact_overhead(ctx: Ctx) -> dict:
    import io
    cc = ctx.need_cc()
    src = ctx.transcript(size_mb=14)   # ~470k provider-reported tokens: over the 360k trigger, whatever --size-mb
    root = ctx.scratch("smart-compact").resolve()
    proj = root / "proj"
    proj.mkdir()
    fake = REPO / "tests" / "fake_claude.py"
    if not (fake.exists() and os.access(fake, os.X_OK)):
        raise NotAvailable("tests/fake_claude.py is needed as CC_LHC_CLAUDE_BIN")
    sid = ctx.session_of(src)
    argv = ["--resume", sid, "-p", PROMPT]
    runs = ctx.runs(5)
    out: dict[str, Any] = {}
    with sandboxed(root, CC_LHC_CLAUDE_BIN=str(fake)), chdir(proj):
        cwd = os.getcwd()
        transcript = Path(cc.rollout_path(sid, cwd))
        transcript.parent.mkdir(parents=True)
        shutil.copyfile(src, transcript)
        state = root / ".cc-lhc"
        backup = root / "state-before"
        stderr = io.StringIO()

        # Views ready: an earlier launch adopted the session and captured all of it.
        with contextlib.redirect_stderr(stderr):
            spec = cc.build_launch(argv)
            home = cc.StateHome()
            home.ensure()
            policy = cc.load_policy(spec.cwd, cc.policy_flag_values(spec.flags))
            capture = cc.attach_thread(spec, home, policy)
            capture.catch_up()
            tid = capture.thread_id
            lease = capture.lease
            capture.stop()
            lease.release()
            # As for someone who has used cc-lhc before: the rank file's checksum is noted
            # in the state folder (and its vocabulary index kept there, when none lies
            # beside it); no text of this thread has been counted yet.
            counter = cc.TokenCounter()
            counter.encoding()
        counts, forget = counts_forgetter(cc, state)
        forget()
        shutil.copytree(state, backup)
        keep_counts = False

        def restore() -> None:
            kept = root / "counts-kept"
            if keep_counts and counts.exists():
                shutil.rmtree(kept, ignore_errors=True)
                kept.mkdir()
                for p in counts.parent.glob(counts.name + "*"):
                    shutil.copy(p, kept / p.name)
            shutil.rmtree(state)
            shutil.copytree(backup, state)
            if keep_counts and kept.exists():
                for p in kept.iterdir():
                    shutil.copy(p, counts.parent / p.name)
            for f in transcript.parent.iterdir():
                if f != transcript:
                    f.unlink()

        # 1. The whole pre-launch path of cmd_launch, in process, up to spawning Claude.
        stages: dict[str, list[float]] = {"total": [], "attach": [], "smart compact": [], "descriptor": []}
        rebuilt = None
        for _ in range(runs + 1):
            restore()
            stderr.seek(0)
            stderr.truncate()
            with contextlib.redirect_stderr(stderr):
                t0 = time.perf_counter()
                spec = cc.build_launch(argv)
                home = cc.StateHome()
                home.ensure()
                policy = cc.load_policy(spec.cwd, cc.policy_flag_values(spec.flags))
                cc.announce_policy(policy, home)
                capture = cc.attach_thread(spec, home, policy)
                t1 = time.perf_counter()
                hostdb = cc.HostDB(home)
                capture, pending = cc.smart_compact_before_launch(spec, home, policy, capture)
                t2 = time.perf_counter()
                cc.remove_stale_descriptors(home, hostdb)
                cc.create_descriptor(home, hostdb, capture.thread_id, spec.session_id)
                t3 = time.perf_counter()
            if capture.lease:
                capture.lease.release()
            if capture.store is not None:
                capture.store.close()
            if pending is None:
                store = cc.ThreadStore(home, tid)
                try:
                    reading = cc.governor_reading(store, sid, cc.estimate_tokens(PROMPT))
                finally:
                    store.close()
                raise RuntimeError(f"Smart Compact did not run (pressure {reading.get('pressure')}, "
                                   f"trigger {policy['upperBoundTokens']}): "
                                   + stderr.getvalue().strip()[-120:])
            rebuilt = pending
            for name, dt in (("total", t3 - t0), ("attach", t1 - t0), ("smart compact", t2 - t1),
                             ("descriptor", t3 - t2)):
                stages[name].append(dt)
        for name in stages:
            del stages[name][0]          # the first run warms caches
        med = {k: statistics.median(v) for k, v in stages.items()}
        out["pre-launch, in process (median)"] = ms(med["total"], 300, spread(stages["total"]))
        out["  build_launch + policy + attach_thread"] = ms(med["attach"])
        out["  smart_compact_before_launch"] = ms(med["smart compact"], note="catch-up, governor, rebuild, write")
        out["  stale sweep + create_descriptor"] = ms(med["descriptor"])

        # 2. The brief's components, one by one, on the same state.
        restore()
        parts: dict[str, list[float]] = {}
        reading: dict = {}
        for _ in range(runs):
            restore()
            home = cc.StateHome()
            t = [time.perf_counter()]

            def mark(name: str) -> None:
                t.append(time.perf_counter())
                parts.setdefault(name, []).append(t[-1] - t[-2])

            cap = cc.Capture(home, tid, sid, str(transcript))
            cap.catch_up(deadline=time.monotonic() + 10)
            mark("catch_up (already captured)")
            reading = cc.governor_reading(cap.store, sid, cc.estimate_tokens(PROMPT))
            mark("governor_reading")
            rb = cc.plan_rebuild(home, cap.store, tid, policy, cc.new_session_id(), cwd,
                                 envelope_from=str(transcript))
            mark("plan_rebuild (envelope_from)")
            cc.write_atomic(rb.path, rb.data)
            mark("write_atomic")
            cap.stop()
        for name, v in parts.items():
            out[f"  component {name}"] = ms(statistics.median(v))
        out["components sum"] = ms(sum(statistics.median(v) for v in parts.values()), 300)
        out["pressure"] = Figure(reading.get("pressure"), "tokens",
                                 f"{reading.get('source')}; trigger {policy['upperBoundTokens']:,}")
        out["rebuilt session"] = Figure(rebuilt.prefix / 1024, "KiB")

    # 3. Whole processes with a fake Claude (its own time excluded): cc-lhc vs the bare child.
    slug = cc.project_slug(str(proj))
    accept = [{"transcript": {"path": "{config_dir}/projects/" + slug + "/{session_id}.jsonl",
                              "record": {"type": "last-prompt", "lastPrompt": PROMPT, "sessionId": "bench"}}}]
    plain_script = [{"transcript": {"path": str(root / "plain" / "{session_id}.jsonl"),
                                    "record": accept[0]["transcript"]["record"]}}]
    # cc_lhc as installed copies run it (from compiled bytecode), told where the rank file is.
    _lib, entry = compiled_entry(root)
    tokenizer = REPO / ".cache" / "tokenizer" / cc.TOKENIZER_FILE_NAME
    wrapped_env = sandbox_env(root, CC_LHC_CLAUDE_BIN=str(fake), FAKE_CLAUDE_SCRIPT=json.dumps(accept),
                              CC_LHC_TOKENIZER_FILE=str(tokenizer))
    try:
        wrapped, wproc = time_process(entry + argv, runs, wrapped_env, proj, before=restore)
        keep_counts = True   # a later Smart Compact: the thread's older texts were counted before
        again, _ = time_process(entry + argv, runs, wrapped_env, proj, before=restore)
        # Run as cc-lhc runs it (through its #! line, which may find python3 through a shim
        # that costs more than the fake itself), so the difference is cc-lhc's own.
        plain, _ = time_process([str(fake)] + argv, runs,
                                sandbox_env(root, FAKE_CLAUDE_SCRIPT=json.dumps(plain_script)), proj)
    except CommandFailed as exc:
        out["cc-lhc --resume -p (fake claude)"] = Figure("failed", "", str(exc))
        return out
    said = wproc.stderr.decode(errors="replace")
    note = "Smart Compact ran" if "Smart Compact" in said else "no Smart Compact line on stderr"
    w, a, p = statistics.median(wrapped), statistics.median(again), statistics.median(plain)
    out["cc-lhc --resume -p, fake claude"] = ms(w, note=spread(wrapped) + f"; {note}; no text counted before")
    out["same, the thread's texts counted before"] = ms(a, note=spread(again))
    out["fake claude --resume -p alone"] = ms(p, note=spread(plain))
    out["whole-process overhead"] = ms(w - p, 300, "difference: interpreter, import, Smart Compact, capture, "
                                                   "acceptance; the thread's first count")
    out["whole-process overhead, counted before"] = ms(a - p, 300, "the same with the counts kept")
    out["_seconds"] = med["total"]
    return out


def _session_dirs(root: Path) -> dict:
    """The folders of one real-CLI session a benchmark runs under root (Claude's config marks
    the work folder trusted)."""
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import first_run_config
    dirs = {n: root / n for n in ("home", "config", "lhc", "xdg", "work", "tmp")}
    for d in dirs.values():
        d.mkdir(parents=True)
    (dirs["config"] / ".claude.json").write_text(json.dumps(first_run_config([dirs["work"], root])))
    return dirs


def _session_env(dirs: dict, api) -> dict:
    """The environment of such a session: nothing of this machine's own Claude or cc-lhc."""
    from claude_install import ensure_claude
    from conftest import FAKE_AUTH_TOKEN, QUIET_ENV
    env = {k: v for k, v in ORIG_ENV.items() if not k.startswith(("CC_LHC", "CLAUDE", "ANTHROPIC"))}
    env.update(HOME=str(dirs["home"]), CLAUDE_CONFIG_DIR=str(dirs["config"]), CC_LHC_HOME=str(dirs["lhc"]),
               XDG_CONFIG_HOME=str(dirs["xdg"]), TMPDIR=str(dirs["tmp"]), PWD=str(dirs["work"]),
               CC_LHC_SUMMARIES="off", ANTHROPIC_BASE_URL=api.url, ANTHROPIC_AUTH_TOKEN=FAKE_AUTH_TOKEN,
               CC_LHC_CLAUDE_BIN=str(ensure_claude()), **QUIET_ENV)
    return env


@contextlib.contextmanager
def _ready_session(dirs: dict, env: dict, bare: bool):
    """cc-lhc (the checkout's) in tmux on the real CLI, at Claude's prompt, the mod's handshake
    done unless ``bare``."""
    sys.path.insert(0, str(REPO / "tests"))
    from tmuxdrive import Tmux
    log = dirs["lhc"] / "wrapper.log"
    with Tmux([sys.executable, str(REPO / "cc_lhc.py"), *(["--bare"] if bare else [])],
              cols=120, rows=30, env=env, cwd=dirs["work"]) as t:
        t.wait_for("❯", timeout=30)
        if not bare:
            while '"event": "mod_active"' not in (log.read_text() if log.exists() else ""):
                time.sleep(0.02)
        yield t


def _live_compact_once(root: Path, bare: bool) -> float:
    """One interactive session (real CLI, fake API, tmux) whose answer goes over the
    trigger at a settled seam: seconds from that answer to Claude's first request on the
    compacted conversation, the next prompt typed as soon as cc-lhc says it is done."""
    sys.path.insert(0, str(REPO / "tests"))
    from fakeapi import FakeAPI, text_reply
    dirs = _session_dirs(root)
    small = {"input_tokens": 1_000, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
             "output_tokens": 5}
    over = dict(small, input_tokens=365_000)
    log = dirs["lhc"] / "wrapper.log"
    done = "handoff_switched" if bare else "in_process_compact_served"
    with FakeAPI() as api:
        env = _session_env(dirs, api)
        api.script([text_reply("first answer", usage=small), text_reply("over the trigger", usage=over)])
        api.responder = lambda body: text_reply("on the compacted conversation", usage=small)
        with _ready_session(dirs, env, bare) as t:
            for prompt, answer in (("first", "first answer"), ("second", "over the trigger")):
                t.send_text(prompt)
                t.send_keys("Enter")
                t.wait_for(answer, timeout=30)
            seam = api.message_requests[-1]["time"]
            deadline = time.monotonic() + 30
            while f'"event": "{done}"' not in log.read_text():
                if time.monotonic() > deadline:
                    raise NotAvailable(f"no {done} in wrapper.log")
                time.sleep(0.02)
            n = len(api.message_requests)
            t.send_text("third")
            t.send_keys("Enter")
            first = api.wait_for_requests(n + 1, answered=False)[n]
            t.send_text("/exit")
            t.send_keys("Enter")
            t.wait_exit(timeout=15)
    return first["time"] - seam


@bench("live-compact", "seam over the trigger -> Claude's first request on the compacted conversation: "
       "in process through the cc-lhc mod, and the swap (--bare)")
def _live_compact(ctx: Ctx) -> dict:
    if shutil.which("tmux") is None:
        raise NotAvailable("tmux is needed")
    runs = ctx.runs(3)
    times = {"in_process": [], "swap": []}
    for i in range(runs):
        for kind in times:
            times[kind].append(_live_compact_once(ctx.scratch(f"live-{kind}-{i}"), kind == "swap"))
    inproc = statistics.median(times["in_process"])
    swap = statistics.median(times["swap"])
    return {"in process (mod)": ms(inproc, 500, spread(times["in_process"])),
            "swap (--bare)": ms(swap, None, spread(times["swap"])),
            "ratio": Ratio("in process / swap", inproc / swap)}


IDLE_WINDOW_SECONDS = 30.0


def _idle_cpu_once(root: Path, bare: bool) -> tuple[float, float]:
    """One interactive session (real CLI, fake API, tmux), one prompt answered, then left at
    Claude's prompt: (cc-lhc's, Claude's) CPU-seconds a minute over IDLE_WINDOW_SECONDS,
    every thread of each process, their children left out."""
    import psutil
    sys.path.insert(0, str(REPO / "tests"))
    from fakeapi import FakeAPI, text_reply
    dirs = _session_dirs(root)
    with FakeAPI() as api:
        env = _session_env(dirs, api)
        api.responder = lambda body: text_reply("answered")
        with _ready_session(dirs, env, bare) as t:
            t.send_text("one prompt")
            t.send_keys("Enter")
            t.wait_for("answered", timeout=30)
            shell = psutil.Process(t.pane_pid)
            ours = next(p for p in shell.children() if "cc_lhc.py" in " ".join(p.cmdline()))
            claude = ours.children()[0]
            time.sleep(3)  # the answer's capture and counting done
            before = [sum(p.cpu_times()[:2]) for p in (ours, claude)]
            time.sleep(IDLE_WINDOW_SECONDS)
            after = [sum(p.cpu_times()[:2]) for p in (ours, claude)]
            t.send_text("/exit")
            t.send_keys("Enter")
            t.wait_exit(timeout=15)
    per_minute = 60 / IDLE_WINDOW_SECONDS
    return (after[0] - before[0]) * per_minute, (after[1] - before[1]) * per_minute


@bench("idle-cpu", "CPU of cc-lhc (and of its Claude) left at Claude's idle prompt after one answer: "
       "with the cc-lhc mod, and without it (--bare)")
def _idle_cpu(ctx: Ctx) -> dict:
    if shutil.which("tmux") is None:
        raise NotAvailable("tmux is needed")
    out: dict[str, Any] = {}
    for kind, bare in (("with the mod", False), ("--bare", True)):
        ours, claude = _idle_cpu_once(ctx.scratch(f"idle-{'bare' if bare else 'mod'}"), bare)
        out[f"{kind}: cc-lhc"] = Figure(ours, "CPU-s/min", f"a {IDLE_WINDOW_SECONDS:g} s window, every thread")
        out[f"{kind}: its Claude"] = Figure(claude, "CPU-s/min", "the same window, for scale")
    return out


def _dist_bundle_exe() -> Path | None:
    dist = REPO / "dist"
    if not dist.is_dir():
        return None
    for cand in sorted(dist.rglob("cc-lhc")) + sorted(dist.rglob("cc-lhc.exe")):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


@bench("startup", "wall time of `cc-lhc --lhc-version`: source file, zipapp and bundle")
def _startup(ctx: Ctx) -> dict:
    runs = ctx.runs(15)
    if not (REPO / "cc_lhc.py").exists():
        raise NotAvailable("cc_lhc.py not available yet")
    py = sys.executable
    out: dict[str, Any] = {}
    floor = _time_command([py, "-c", "pass"], runs, REPO)
    out["python3 -c pass (floor)"] = floor
    src = _time_command([py, "cc_lhc.py", "--lhc-version"], runs, REPO)
    out["python3 cc_lhc.py"] = src
    pyz = REPO / "dist" / "cc-lhc.pyz"
    out["dist/cc-lhc.pyz"] = (_time_command([py, str(pyz), "--lhc-version"], runs, REPO, target_ms=50)
                              if pyz.exists() else Figure("not built", "", "make it with the build recipe"))
    exe = _dist_bundle_exe()
    out["dist bundle cc-lhc"] = (_time_command([str(exe), "--lhc-version"], runs, REPO, target_ms=100) if exe
                                 else Figure("not built"))
    if isinstance(src.value, float) and isinstance(floor.value, float):
        out["source vs interpreter"] = Ratio("cc_lhc.py / bare python", src.value / floor.value)
    return out


# == Runner =================================================================================


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Run cc-lhc benchmarks; prints figures, never fails on them.")
    ap.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    ap.add_argument("--list", action="store_true", help="list the benchmarks")
    ap.add_argument("--json", action="store_true", help="print results as JSON")
    ap.add_argument("--runs", type=int, help="override the number of timed runs of each benchmark")
    ap.add_argument("--size-mb", type=float, default=14, help="size of the generated transcript (MiB)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the generated transcript")
    a = ap.parse_args(argv)
    if a.list:
        for b in REGISTRY.values():
            print(f"{b.name:<16} {b.doc}")
        return 0
    unknown = [n for n in a.names if n not in REGISTRY]
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; see --list", file=sys.stderr)
        return 2
    ctx = Ctx(a.runs, a.size_mb, a.seed)
    names = a.names or list(REGISTRY)
    # The whole run is sandboxed: cc_lhc code called in process reads HOME, CC_LHC_HOME,
    # CLAUDE_CONFIG_DIR and XDG_CONFIG_HOME, and none of them may lead to the real home.
    run_home = Path(tempfile.mkdtemp(prefix="cc-lhc-bench-home-"))
    try:
        with sandboxed(run_home):
            for name in names:
                ctx.result(name)
    finally:
        ctx.cleanup()
        shutil.rmtree(run_home, ignore_errors=True)
    shown = {n: ctx.results[n] for n in names}
    if a.json:
        print(json.dumps({"machine": _machine(), "results": to_json(shown)}, indent=2, ensure_ascii=False))
    else:
        m = _machine()
        print(f"# {m['python']} on {m['platform']}, {m['cpus']} CPUs")
        print_table(shown)
    return 0


def _machine() -> dict:
    return {"python": f"Python {platform.python_version()}", "platform": platform.platform(),
            "cpus": os.cpu_count()}


if __name__ == "__main__":
    sys.exit(main())
