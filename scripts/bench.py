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
        secs = ctx.median_time(lambda: work(path))
        return {"time (median)": Figure(secs, "s"),
                "vs json floor": Ratio("my-thing / json floor", secs / ctx.result("json-floor")["_seconds"],
                                       target=3)}

A benchmark returns a dict of figure name -> Figure | Ratio | number | (value, unit).
Keys starting with "_" are kept for other benchmarks (``ctx.result(name)``) but not printed.
Raise NotAvailable("why") when what it measures does not exist yet: the runner prints
"not available yet" and goes on. The exit status is 0 whatever the figures are; 2 only for
an unknown benchmark name.

Benchmarks that time cc_lhc itself call hooks it may or may not have yet, found with
``getattr(cc_lhc, "bench_<name>", None)``; each hook takes (transcript_path, home) and
returns a dict of its own figures. ``home`` is a fresh temp folder that the hook should use
as HOME, CC_LHC_HOME and CLAUDE_CONFIG_DIR parent (the runner also sets those variables
while the hook runs, and restores them after).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "scripts"
CACHE = REPO / ".cache" / "bench"
sys.path.insert(0, str(SCRIPTS))

import gen_transcript  # noqa: E402

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

    def hook(self, name: str) -> Callable:
        mod = self.cc_lhc
        fn = getattr(mod, name, None) if mod is not None else None
        if fn is None:
            raise NotAvailable(f"cc_lhc.{name} not available yet")
        return fn

    @contextlib.contextmanager
    def temp_home(self):
        """A fresh folder set as HOME, CC_LHC_HOME and CLAUDE_CONFIG_DIR while inside."""
        tmp = Path(tempfile.mkdtemp(prefix="cc-lhc-bench-"))
        env = {"HOME": str(tmp), "CC_LHC_HOME": str(tmp / ".cc-lhc"),
               "CLAUDE_CONFIG_DIR": str(tmp / ".claude")}
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            yield tmp
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            shutil.rmtree(tmp, ignore_errors=True)

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

    def call_hook(self, hook_name: str, runs: int) -> dict:
        """Time cc_lhc.<hook_name>(transcript, home) over runs, each in a fresh home."""
        fn = self.hook(hook_name)
        path = self.transcript()
        times, figures = [], []
        for _ in range(runs):
            with self.temp_home() as home:
                t0 = time.perf_counter()
                out = fn(str(path), str(home))
                times.append(time.perf_counter() - t0)
                figures.append(out if isinstance(out, dict) else {})
        result: dict[str, Any] = {"wall time (median)": Figure(statistics.median(times), "s",
                                                               f"{runs} runs, min {_num(min(times))} s"),
                                  "_seconds": statistics.median(times)}
        for key in figures[-1]:
            values = [f.get(key) for f in figures]
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                result[key] = statistics.median(values)
            else:
                result[key] = values[-1]
        return result


def run_one(ctx: Ctx, b: Bench) -> dict:
    try:
        out = b.fn(ctx)
    except NotAvailable as exc:
        return {"_status": "not available yet", "_why": str(exc)}
    except Exception as exc:  # report and go on: a benchmark run is not a test run
        return {"_status": "error", "_why": f"{type(exc).__name__}: {exc}"}
    out.setdefault("_status", "ok")
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


@bench("intake", "cc_lhc.bench_intake(transcript, home): a whole transcript into the thread store")
def _intake(ctx: Ctx) -> dict:
    ctx.hook("bench_intake")
    out = ctx.call_hook("bench_intake", ctx.runs(3))
    floor = ctx.result("json-floor").get("_seconds")
    if floor:
        out["vs json floor"] = Ratio("intake / json floor", out["_seconds"] / floor, target=3)
    return out


def _time_command(argv: list[str], runs: int, cwd: Path) -> Figure:
    env = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="cc-lhc-bench-") as tmp:
        env.update({"HOME": tmp, "CC_LHC_HOME": f"{tmp}/.cc-lhc", "CLAUDE_CONFIG_DIR": f"{tmp}/.claude"})
        times = []
        for i in range(runs + 1):          # the first run warms caches and is not counted
            t0 = time.perf_counter()
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  stdin=subprocess.DEVNULL)
            dt = time.perf_counter() - t0
            if proc.returncode != 0:
                err = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [""]
                return Figure(f"failed (exit {proc.returncode})", "", err[0][:80])
            if i:
                times.append(dt)
    return Figure(statistics.median(times) * 1000, "ms", f"median of {runs}, min {_num(min(times) * 1000)} ms")


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
    out["dist/cc-lhc.pyz"] = (_time_command([py, str(pyz), "--lhc-version"], runs, REPO) if pyz.exists()
                              else Figure("not built", "", "make it with the build recipe"))
    exe = _dist_bundle_exe()
    out["dist bundle cc-lhc"] = (_time_command([str(exe), "--lhc-version"], runs, REPO) if exe
                                 else Figure("not built"))
    if isinstance(src.value, float) and isinstance(floor.value, float):
        out["source vs interpreter"] = Ratio("cc_lhc.py / bare python", src.value / floor.value)
    return out


@bench("capture-latency", "cc_lhc.bench_capture_latency: a line appended to the live transcript until it is stored")
def _capture_latency(ctx: Ctx) -> dict:
    ctx.hook("bench_capture_latency")
    return ctx.call_hook("bench_capture_latency", ctx.runs(3))


@bench("measure", "cc_lhc.bench_measure: `cc-lhc measure` over the generated transcript")
def _measure(ctx: Ctx) -> dict:
    ctx.hook("bench_measure")
    out = ctx.call_hook("bench_measure", ctx.runs(3))
    floor = ctx.result("json-floor").get("_seconds")
    if floor:
        out["vs json floor"] = Ratio("measure / json floor", out["_seconds"] / floor)
    return out


@bench("view-build", "cc_lhc.bench_view_build: building the served view of a captured thread")
def _view_build(ctx: Ctx) -> dict:
    ctx.hook("bench_view_build")
    return ctx.call_hook("bench_view_build", ctx.runs(5))


@bench("get-turns", "cc_lhc.bench_get_turns: retrieving turns back from the store")
def _get_turns(ctx: Ctx) -> dict:
    ctx.hook("bench_get_turns")
    return ctx.call_hook("bench_get_turns", ctx.runs(5))


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
    for name in names:
        ctx.result(name)
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
