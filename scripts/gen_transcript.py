#!/usr/bin/env python3
"""Generate large, realistic Claude Code 2.1.328 transcripts, deterministically from a seed.

    python3 scripts/gen_transcript.py --out FILE [--size-mb 14] [--seed 1]
        [--session-id UUID] [--cwd /home/user/proj] [--git-branch main]
        [--thinking] [--compact-every N] [--quiet]

    from gen_transcript import generate
    stats = generate("big.jsonl", size_mb=14, seed=1, thinking=True)

The output imitates what the real CLI writes to ``projects/<slug>/<session>.jsonl``:

- prompts as ``user`` records; every assistant response split into one record per content
  block (thinking with a signature, text, tool_use), the records sharing ``message.id``,
  ``requestId`` and the same final ``usage``; usage grows with the context (cache read of
  the old prefix + cache creation of what is new + a few uncached input tokens);
- tool results as ``user`` records holding ``tool_result`` blocks plus a tool-specific
  ``toolUseResult`` (a plain ``"Error: ..."`` string for failures), for Bash, Read, Edit,
  Write, Grep and Glob, with some errors and a few very large outputs (20-200 KB);
- the bookkeeping that makes up most of the bytes of a real file: ``queue-operation``,
  the attachment envelope (environment, model, deferred tools, agents, skills, session
  context, date, attribution, prompt snapshots), ``api-request-shape``,
  ``api-request-blob``, ``api-request``, ``tools-used``, ``last-prompt``, ``atis-latch``,
  ``mode``, ``cost-state`` and ``file-history-snapshot``. Where the real CLI stores its own
  system prompt and tool descriptions, the generator writes synthetic stand-in prose of
  the real length, so sizes are realistic without carrying Claude Code's text;
- one linear ``uuid``/``parentUuid`` chain, increasing ISO timestamps, and optionally
  Claude's native compaction (``system/compact_boundary`` + ``isCompactSummary`` user)
  every N prompts.

The session is modelled as a series of CLI processes (a ``claude --resume`` each), one to
seven prompts per process, because the real CLI re-writes its envelope, request shape
and prompt snapshots once per process: that is where the bookkeeping bytes come from.

"MB" here is MiB (1,048,576 bytes). The output is byte-identical for the same seed and
options: all randomness comes from one ``random.Random(seed)``, ids and hashes included.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
import time
from datetime import datetime, timezone

CLAUDE_VERSION = "2.1.328"
GENERATOR_VERSION = 1          # bump when the output for a given seed changes
MIB = 1 << 20
MODEL = "claude-opus-5-5"
DEFAULT_CWD = "/home/user/proj"
BASE_EPOCH_MS = 1_793_520_000_000   # 2026-11-01T08:00:00Z; the seed shifts it by days

# == 1. Word lists ==========================================================================

NOUNS = """cache parser tokenizer migration socket lease descriptor thread alias view band
index cursor buffer queue worker scheduler request response header payload schema column
table row record segment checkpoint snapshot manifest config option flag timeout retry
handler callback fixture test assertion benchmark profile budget transcript session prompt
summary label counter offset window chunk batch stream pipe process signal terminal panel
layout widget template route endpoint token digest hash archive backup lock mutex watcher
hook plugin module package dependency build release artifact bundle binary wrapper launcher
runner logger metric histogram percentile encoder decoder serializer field struct enum
iterator generator closure decorator registry loader resolver adapter driver connection
pool transaction cursor query filter predicate comparator allocator arena frame stack heap
pointer reference lifetime borrow trait interface type generic constraint variant
""".split()

ADJS = """stale empty partial nested duplicate missing invalid optional deprecated async
blocking lazy eager recursive atomic cached redundant noisy flaky slow fast brittle
implicit explicit stable unstable legacy internal public private global local temporary
persistent incremental truncated malformed unicode binary sparse dense bounded unbounded
ordered unordered concurrent sequential idempotent deterministic verbose quiet strict
""".split()

ADVS = """quickly quietly twice again already still silently eventually correctly
incorrectly early late immediately lazily eagerly rarely often always never intermittently
""".split()

CONNECTORS = ["However", "Also", "So", "Then", "Meanwhile", "In practice", "Oddly",
              "As expected", "Interestingly", "On the other hand", "For now", "Next",
              "First", "Finally", "In short", "To be safe", "Unfortunately", "Luckily"]

VERBS = """add check parse load store flush rename split merge cache retry skip wrap log
patch rebuild read write run fix move drop keep return raise handle call open close send
receive count sort filter map reduce emit render format print test mock stub build deploy
refactor inline extract validate serialize encode decode compress reuse reset clear update
append insert delete replace compare match scan walk""".split()

DOUBLED = {"run", "drop", "skip", "wrap", "log", "map", "stub", "split", "emit", "format", "scan"}
IRREGULAR = {"rebuild": "rebuilt", "read": "read", "write": "wrote", "run": "ran",
             "keep": "kept", "send": "sent", "build": "built", "split": "split",
             "drop": "dropped", "skip": "skipped", "wrap": "wrapped", "log": "logged",
             "map": "mapped", "stub": "stubbed", "emit": "emitted", "format": "formatted",
             "scan": "scanned"}

NON_ASCII = ["naïve", "café", "façade", "über", "Straße", "résumé", "coöperate", "déjà vu",
             "→", "✓", "✗", "—", "…", "µs", "°C", "€", "±", "≤", "≥", "λ", "Ω", "π≈3.14159",
             "🚀", "✅", "⚠️", "🔥", "ñandú", "Zürich", "São Paulo", "Kraków", "Ørsted",
             "日本語", "テスト", "設定ファイル", "数据库", "性能", "Привет", "ошибка",
             "ελληνικά", "עברית", "العربية", "한국어", "ąčęėįšųūž", "“quoted”", "‘single’"]

FOREIGN_PROMPTS = [
    "Pouvez-vous vérifier pourquoi le test échoue après la dernière modification ?",
    "Bitte prüfe die Änderungen in der Datei noch einmal und erkläre, was sich geändert hat.",
    "このテストが失敗する理由を調べて、修正案を出してください。",
    "Проверь, пожалуйста, логи сборки — там какая-то ошибка с кодировкой.",
    "请检查一下这个函数的性能问题，特别是在大文件上的表现。",
    "¿Puedes revisar la migración de la base de datos? Creo que falta un índice.",
    "Μπορείς να ελέγξεις τη διαμόρφωση; Κάτι δεν πάει καλά με το cache.",
    "이 함수가 왜 느린지 분석해 주세요. 프로파일 결과도 보여 주세요.",
    "Czy możesz sprawdzić, dlaczego ten skrypt zawiesza się przy dużych plikach?",
    "Kannst du bitte die README auf Deutsch übersetzen, aber die Codebeispiele unverändert lassen?",
]

PROJECT_NAMES = ["ledger", "quill", "harbor", "atlas", "sprocket", "tessera", "marlin",
                 "kestrel", "lattice", "corvid", "meridian", "plover"]
MODULES = ["store", "views", "parser", "governor", "capture", "relay", "config", "cli",
           "tokens", "labels", "queue", "derive", "rollout", "search", "doctor", "lease",
           "panel", "hosts", "recovery", "measure", "paths", "errors", "util", "schema"]
EXC_NAMES = ["ValueError", "KeyError", "RuntimeError", "TypeError", "OSError",
             "LookupError", "TimeoutError", "PermissionError"]
PY_TYPES = ["int", "str", "bool", "bytes", "float", "dict[str, int]", "list[str]",
            "Path", "Iterator[dict]", "tuple[int, int]", "None", "Optional[str]"]
TS_TYPES = ["string", "number", "boolean", "void", "Promise<void>", "string[]",
            "Record<string, number>", "Map<string, Turn>", "Uint8Array", "unknown"]
RS_TYPES = ["usize", "u64", "i32", "bool", "String", "Vec<u8>", "Option<&str>",
            "HashMap<String, u32>", "PathBuf", "()"]
PY_FALLBACKS = ["None", "0", 'b""', "()"]
LOG_LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]
SQL_TABLES = ["turns", "messages", "segments", "views", "receipts", "aliases", "threads",
              "derivations", "leases", "impressions"]

# == 2. Text engine =========================================================================


def _conjugate(verb: str) -> tuple[str, str, str, str]:
    """(base, third person, past, gerund) with the handful of rules the word list needs."""
    if verb.endswith(("s", "sh", "ch", "x", "z")):
        third = verb + "es"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        third = verb[:-1] + "ies"
    else:
        third = verb + "s"
    if verb in IRREGULAR:
        past = IRREGULAR[verb]
    elif verb.endswith("e"):
        past = verb + "d"
    elif verb.endswith("y") and verb[-2] not in "aeiou":
        past = verb[:-1] + "ied"
    else:
        past = verb + "ed"
    if verb.endswith("e") and not verb.endswith("ee"):
        ger = verb[:-1] + "ing"
    elif verb in DOUBLED:
        ger = verb + verb[-1] + "ing"
    else:
        ger = verb + "ing"
    return verb, third, past, ger


CONJ = [_conjugate(v) for v in VERBS]


def _plural(noun: str) -> str:
    if noun.endswith(("s", "sh", "ch", "x", "z")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"

SENTENCE_TEMPLATES = [
    "The {n} in `{p}` {v3} the {n2} before {vg} the {n3}.",
    "I {vd} `{i}` and it now returns {num} {ns} instead of {num2}.",
    "Next, {v} the {a} {n} so that `{i}()` no longer {v3} on a {a2} {n2}.",
    "That explains the {a} failure: `{i}` is called with {num} arguments but expects {num2}.",
    "{c}, the {n} {v3} {adv} when the {n2} is {a}.",
    "Looking at `{p}`, line {num3} {v3} the {n} without {vg} the {n2} first.",
    "We should {v} the {n} in one place rather than {vg} it in every {n2}.",
    "The {a} {n} comes from `{i}`, which {v3} a {n2} per {n3}.",
    "{c}, {num} of the {num4} {ns} were {a}, so the {n2} {vd} {adv}.",
    "If the {n} is {a}, `{i}` should {v} it and {v2} the {n2} instead.",
    "The benchmark shows {f1} ms per {n} ({f2}× the {n2} floor), which is {a} but acceptable.",
    "`{i}` takes {f1} ms on a {num} KB {n}; most of that is spent {vg} the {n2}.",
    "This is a {a} {n}: {vg} the {n2} twice means the {n3} sees {num} {n4s}.",
    "I'll {v} `{i}` first, then {v2} the {n} and run the {n2} again.",
    "The test `{t}` {vd} because the {n} was {a} ({num} vs {num2}).",
    "There is no {n} for the {a} case, so `{i}` {v3} a {a2} {n2}.",
    "According to `{p}`, the {n} is only {vd} when `{i2}` is set.",
    "{c}, the {a} {n} is harmless, but the {n2} it {v3} is not.",
    "`{i}` and `{i2}` both {v} the {n}; one of them should {v2} it instead.",
    "The {n} limit is {num} {ns}, and we hit it after {num2} {n4s}.",
    "Renaming `{i}` to `{i2}` touches {num} files, mostly under `{d}`.",
    "The commit {h} {vd} the {n}, which is why `{t}` started failing.",
    "{c}, I could not reproduce the {a} {n} on a {num} MB {n2}.",
    "The {n} should stay {a}; {vg} it here would break the {n2} contract.",
    "Both {ns} agree except for the {a} {n2} at offset {num5}.",
    "The {a} path in `{i}` {v3} {num} times per {n}, which adds {f1} ms.",
    "It prints `{i}: {num} {ns}, {f1} ms` and exits with status {code}.",
    "A {a} {n} is fine here because the {n2} is {vd} right after.",
    "Once the {n} is {vd}, the {n2} can {v} the {n3} without a {n4}.",
    "The {n} is {a} — {vg} it earlier would avoid the {a2} {n2} entirely.",
    "{c}, the {n} in `{d}` is {vd} by `{i}` on every {n2}.",
    "Why does the {n} {v} the {n2} when the {n3} is {a}?",
]

PROMPT_TEMPLATES = [
    "Can you {v} the {n} in {p}? {s}",
    "{s} Please {v} it and keep the public API the same.",
    "The {n} {v3} twice when the {n2} is {a}. Can you find out why and fix it?",
    "run the tests",
    "commit this",
    "yes, go ahead",
    "looks good, now also update the docs for `{i}`",
    "no — revert that and try the other approach: {v} the {n} instead of the {n2}.",
    "Add a test for the {a} {n} case in {p}.",
    "Why is `{i}` so slow on large {ns}? {s}",
    "Refactor {p} so that `{i}` and `{i2}` share the {n} logic.",
    "What does `{i}` do exactly? Explain it briefly.",
    "{s} {s2}",
    "ok. next: {v} the {a} {ns} in {d}",
    "Let's benchmark `{i}` with a {num} MB {n} and compare with the {n2} floor.",
    "Please read {p} and tell me whether the {n} handling is correct.",
    "Write a small script under scripts/ that {v3} every {n} and prints a summary.",
    "continue",
    "Fix the failing test `{t}`.",
    "Can you check {p} for {a} {ns}? {s}",
]

COMMIT_VERBS = ["Add", "Fix", "Refactor", "Remove", "Rename", "Speed up", "Document",
                "Test", "Simplify", "Handle", "Guard", "Split", "Inline", "Cache"]


class Text:
    """Pools of sentences, code lines and names built once per seed; cheap to sample."""

    def __init__(self, rng: random.Random, cwd: str):
        self.rng = rng
        self.cwd = cwd.rstrip("/") or "/"
        r = rng
        self.project = r.choice(PROJECT_NAMES)
        self.idents = self._make_idents(900)
        self.camels = [self._camel(i) for i in self.idents[:400]]
        self.test_names = ["test_" + i for i in self.idents[400:700]]
        self.files = self._make_tree()
        self.dirs = sorted({f.rsplit("/", 1)[0] for f in self.files if "/" in f})
        self.sentences = [self._sentence() for _ in range(5000)]
        self.commit_msgs = [self._commit_msg() for _ in range(600)]
        self.py_blocks = [self._py_block() for _ in range(500)]
        self.ts_blocks = [self._ts_block() for _ in range(300)]
        self.rs_blocks = [self._rs_block() for _ in range(300)]
        self.prose_corpus = self._prose(140_000)

    # -- names -------------------------------------------------------------------------

    def _make_idents(self, n: int) -> list[str]:
        r = self.rng
        out, seen = [], set()
        pool = NOUNS + VERBS + ADJS
        while len(out) < n:
            k = r.choice((1, 2, 2, 2, 3, 3))
            name = "_".join(r.choice(pool) for _ in range(k))
            if r.random() < 0.08:
                name = "_" + name
            if name not in seen:
                seen.add(name)
                out.append(name)
        return out

    @staticmethod
    def _camel(ident: str) -> str:
        parts = [p for p in ident.split("_") if p]
        return parts[0] + "".join(p.title() for p in parts[1:])

    def _make_tree(self) -> list[str]:
        r, pkg = self.rng, self.project
        mods = r.sample(MODULES, 16)
        files = [f"src/{pkg}/{m}.py" for m in mods]
        files += [f"src/{pkg}/__init__.py", f"src/{pkg}/__main__.py"]
        files += [f"tests/test_{m}.py" for m in mods[:12]]
        files += [f"web/src/components/{self._camel(m).title()}Panel.tsx" for m in mods[:6]]
        files += [f"web/src/lib/{self._camel(m)}.ts" for m in mods[6:11]]
        files += [f"crates/{pkg}-core/src/{m}.rs" for m in mods[:7]]
        files += [f"docs/{m}.md" for m in mods[10:15]]
        files += ["README.md", "pyproject.toml", "package.json", "Cargo.toml",
                  "scripts/release.sh", "scripts/bench.sh", ".github/workflows/ci.yml",
                  "tests/conftest.py"]
        return files

    def abs(self, rel: str) -> str:
        return f"{self.cwd}/{rel}"

    # -- prose ---------------------------------------------------------------------------

    def _slots(self) -> dict:
        r = self.rng
        v, v2 = r.choice(CONJ), r.choice(CONJ)
        n, n4 = r.choice(NOUNS), r.choice(NOUNS)
        return {
            "n": n, "ns": _plural(n), "n4s": _plural(n4), "n2": r.choice(NOUNS), "n3": r.choice(NOUNS),
            "n4": n4, "a": r.choice(ADJS), "a2": r.choice(ADJS),
            "adv": r.choice(ADVS), "c": r.choice(CONNECTORS),
            "v": v[0], "v3": v[1], "vd": v[2], "vg": v[3], "v2": v2[0],
            "i": r.choice(self.idents), "i2": r.choice(self.idents),
            "t": r.choice(self.test_names), "p": r.choice(self.files),
            "d": r.choice(self.dirs) + "/",
            "num": r.randint(2, 64), "num2": r.randint(1, 999), "num3": r.randint(1, 1400),
            "num4": r.randint(65, 5000), "num5": r.randint(4096, 9_999_999),
            "f1": f"{r.uniform(0.05, 950):.2f}", "f2": f"{r.uniform(1.1, 6):.1f}",
            "h": "%07x" % r.getrandbits(28), "code": r.choice((0, 0, 1, 2)),
        }

    def _sentence(self) -> str:
        r = self.rng
        s = r.choice(SENTENCE_TEMPLATES).format(**self._slots())
        if r.random() < 0.09:
            word = r.choice(NON_ASCII)
            s = s[:-1] + f" ({word})" + s[-1] if r.random() < 0.5 else f"{word} {s}"
        return s

    def _commit_msg(self) -> str:
        r = self.rng
        return f"{r.choice(COMMIT_VERBS)} {r.choice(ADJS)} {r.choice(NOUNS)} in {r.choice(MODULES)}"

    def _prose(self, n: int) -> str:
        parts, size = [], 0
        while size < n:
            s = self.rng.choice(self.sentences)
            parts.append(s)
            size += len(s) + 1
        return " ".join(parts)

    def sentence(self) -> str:
        # Conversation text is made fresh (the pool serves code comments and fillers),
        # so a long transcript does not repeat itself sentence by sentence.
        return self._sentence()

    def paragraph(self, lo: int = 2, hi: int = 6) -> str:
        r = self.rng
        return " ".join(self._sentence() for _ in range(r.randint(lo, hi)))

    def prose(self, nchars: int) -> str:
        """Prose of roughly nchars characters (whole sentences, varied)."""
        r = self.rng
        out, size = [], 0
        while size < nchars:
            if out and r.random() < 0.15:
                out.append("\n\n")
            s = self._sentence()
            out.append(s)
            size += len(s) + 1
        return " ".join(out).replace(" \n\n ", "\n\n")

    def filler(self, slot: str, nchars: int) -> str:
        """Stand-in for a payload of Claude Code's own prompt text, exactly nchars long.

        The same slot gives the same text in every process, as the CLI's system prompt
        does, so the generated file compresses and deduplicates like a real one."""
        head = f"[synthetic stand-in for {nchars} characters of Claude Code's own prompt text] "
        if nchars <= len(head):
            return head[:nchars]
        body_len = nchars - len(head)
        corpus = self.prose_corpus
        start = sum(map(ord, slot)) * 7919 % (len(corpus) // 2)
        body = corpus[start:start + body_len]
        while len(body) < body_len:
            body += " " + corpus[: body_len - len(body) - 1]
        return head + body[:body_len]

    # -- code ----------------------------------------------------------------------------

    def _py_line(self, ind: str) -> str:
        r = self.rng
        i, i2, i3 = r.choice(self.idents), r.choice(self.idents), r.choice(self.idents)
        k = r.randrange(16)
        if k == 0:
            return f"{ind}{i} = {i2}({i3}, limit={r.randint(1, 4096)})"
        if k == 1:
            return f"{ind}if {i} is None:\n{ind}    return {r.choice(('None', '0', '[]', 'False', repr(i2)))}"
        if k == 2:
            return f"{ind}for {i.strip('_')[:12] or 'x'} in {i2}:\n{ind}    {i3}.append({i.strip('_')[:12] or 'x'})"
        if k == 3:
            return f"{ind}raise {r.choice(EXC_NAMES)}(f\"{r.choice(ADJS)} {r.choice(NOUNS)}: {{{i}!r}}\")"
        if k == 4:
            return f"{ind}# {self.sentence()}"
        if k == 5:
            return f"{ind}with open({i}, \"rb\") as fh:\n{ind}    {i2} = fh.read({r.choice((4096, 65536, 1 << 20))})"
        if k == 6:
            return f"{ind}{i} += {r.randint(1, 512)}"
        if k == 7:
            return f"{ind}logger.debug(\"%s took %.2f ms\", {i}, ({i2} - {i3}) * 1000)"
        if k == 8:
            t = r.choice(SQL_TABLES)
            return (f"{ind}rows = conn.execute(\n{ind}    \"SELECT id, label, created_at FROM {t} "
                    f"WHERE {r.choice(NOUNS)}_id = ? ORDER BY id\", ({i},)\n{ind}).fetchall()")
        if k == 9:
            return f"{ind}{i} = {{k: v for k, v in {i2}.items() if v is not None}}"
        if k == 10:
            return f"{ind}assert {i} == {r.randint(0, 99)}, {i2}"
        if k == 11:
            return f"{ind}{i} = \"{r.choice(NON_ASCII) if r.random() < 0.2 else r.choice(NOUNS)}\""
        if k == 12:
            return f"{ind}try:\n{ind}    {i} = {i2}[{repr(r.choice(NOUNS))}]\n{ind}except KeyError:\n{ind}    {i} = {r.randint(0, 9)}"
        if k == 13:
            return f"{ind}return {i}"
        if k == 14:
            return f"{ind}{i}.{i2}({i3}, timeout={r.uniform(0.1, 30):.1f})"
        return f"{ind}{i} = {i2} if {i3} else {r.choice(PY_FALLBACKS)}"

    def _py_block(self) -> str:
        r = self.rng
        name = r.choice(self.idents)
        args = ", ".join(r.sample(self.idents, r.randint(0, 3)))
        lines = []
        if r.random() < 0.25:
            lines.append(f"@{r.choice(('functools.cache', 'staticmethod', 'contextlib.contextmanager', 'pytest.fixture'))}")
        lines.append(f"def {name}({args}) -> {r.choice(PY_TYPES)}:")
        lines.append(f"    \"\"\"{self.sentence()}\"\"\"")
        for _ in range(r.randint(2, 14)):
            lines.append(self._py_line("    "))
        lines.append(f"    return {r.choice(self.idents)}")
        return "\n".join(lines)

    def _ts_block(self) -> str:
        r = self.rng
        c = r.choice(self.camels)
        lines = [f"export function {c}({r.choice(self.camels)}: {r.choice(TS_TYPES)}): {r.choice(TS_TYPES)} {{"]
        for _ in range(r.randint(2, 12)):
            a, b = r.choice(self.camels), r.choice(self.camels)
            k = r.randrange(7)
            if k == 0:
                lines.append(f"  const {a} = {b}.get({r.randint(0, 99)}) ?? {r.choice(('null', '0', '[]', 'undefined'))};")
            elif k == 1:
                lines.append(f"  if (!{a}) return {r.choice(('null', 'false', '0', 'undefined'))};")
            elif k == 2:
                lines.append(f"  for (const item of {a}) {{\n    {b}.push(item.{r.choice(self.camels)});\n  }}")
            elif k == 3:
                lines.append(f"  // {self.sentence()}")
            elif k == 4:
                lines.append(f"  await {a}({b}, {{ timeoutMs: {r.randint(100, 30000)} }});")
            elif k == 5:
                lines.append(f"  console.warn(`{r.choice(ADJS)} {r.choice(NOUNS)}: ${{{a}}}`);")
            else:
                lines.append(f"  {a} = {b}.map((x) => x.{r.choice(self.camels)}).filter(Boolean);")
        lines.append("}")
        return "\n".join(lines)

    def _rs_block(self) -> str:
        r = self.rng
        name = r.choice(self.idents).strip("_") or "run"
        lines = [f"pub fn {name}(&self, {r.choice(self.idents).strip('_') or 'x'}: &str) -> Result<{r.choice(RS_TYPES)}, Error> {{"]
        for _ in range(r.randint(2, 10)):
            a = r.choice(self.idents).strip("_") or "v"
            b = r.choice(self.idents).strip("_") or "w"
            k = r.randrange(6)
            if k == 0:
                lines.append(f"    let {a} = self.{b}({r.randint(0, 255)})?;")
            elif k == 1:
                lines.append(f"    if {a}.is_empty() {{\n        return Err(Error::{r.choice(NOUNS).title()}({a}.len()));\n    }}")
            elif k == 2:
                lines.append(f"    // {self.sentence()}")
            elif k == 3:
                lines.append(f"    for {a} in self.{b}.iter() {{\n        total += {a}.len() as u64;\n    }}")
            elif k == 4:
                lines.append(f"    let {a}: Vec<_> = {b}.split('\\n').map(str::trim).collect();")
            else:
                lines.append(f"    tracing::debug!(\"{r.choice(NOUNS)} {{}} took {{:?}}\", {a}, {b});")
        lines.append("    Ok(Default::default())\n}")
        return "\n".join(lines)

    def file_content(self, path: str, target_lines: int) -> str:
        """Plausible content for a project file, about target_lines long."""
        r = self.rng
        ext = path.rsplit(".", 1)[-1]
        out: list[str] = []
        if ext == "py":
            out += ["from __future__ import annotations", "", "import json", "import logging",
                    "from pathlib import Path", "", "logger = logging.getLogger(__name__)", ""]
            pool = self.py_blocks
        elif ext in ("ts", "tsx"):
            out += [f"import {{ {r.choice(self.camels)} }} from \"./{r.choice(self.camels)}\";", ""]
            pool = self.ts_blocks
        elif ext == "rs":
            out += ["use std::collections::HashMap;", "use crate::error::Error;", ""]
            pool = self.rs_blocks
        elif ext == "md":
            out.append(f"# {r.choice(NOUNS).title()} {r.choice(NOUNS)}")
            while len(out) < target_lines:
                out += ["", self.paragraph(2, 5)]
                if r.random() < 0.3:
                    out += ["", "```python"] + r.choice(self.py_blocks).split("\n")[:8] + ["```"]
                if r.random() < 0.3:
                    out += ["", f"## {r.choice(ADJS).title()} {r.choice(NOUNS)}s"]
            return "\n".join(out) + "\n"
        else:
            while len(out) < target_lines:
                k, v = r.choice(self.idents), r.choice((r.randint(0, 9999), f'"{r.choice(NOUNS)}"', "true", "false"))
                out.append(f"{k} = {v}" if ext == "toml" else f"export {k.upper().strip('_')}={v}"
                           if ext in ("sh", "yml") else f"  \"{k}\": {v},")
            return "\n".join(out) + "\n"
        while len(out) < target_lines:
            out += r.choice(pool).split("\n") + [""]
        return "\n".join(out) + "\n"

    def code_block(self, lang: str = "") -> str:
        r = self.rng
        lang = lang or r.choice(("python", "python", "ts", "rust", "bash"))
        if lang == "python":
            body = r.choice(self.py_blocks)
        elif lang == "ts":
            body = r.choice(self.ts_blocks)
        elif lang == "rust":
            body = r.choice(self.rs_blocks)
        else:
            body = "\n".join(f"{r.choice(('python3', 'rg -n', 'git', 'ls -la', 'sqlite3'))} {r.choice(self.files)}"
                             for _ in range(r.randint(1, 4)))
        return f"```{lang}\n{body}\n```"

    def log_line(self, t_ms: int) -> str:
        r = self.rng
        return (f"{iso(t_ms)} {r.choice(LOG_LEVELS):5} {r.choice(MODULES)}[{r.randint(100, 99999)}] "
                f"{self.sentence()}")

    def prompt(self) -> str:
        r = self.rng
        x = r.random()
        if x < 0.07:
            return r.choice(FOREIGN_PROMPTS)
        slots = self._slots()
        slots["s"], slots["s2"] = self.sentence(), self.sentence()
        slots["p"] = self.abs(slots["p"]) if r.random() < 0.4 else slots["p"]
        text = r.choice(PROMPT_TEMPLATES).format(**slots)
        if x > 0.88:
            # A pasted traceback, log excerpt or code, as users do.
            paste = r.choice((
                lambda: self.traceback(),
                lambda: "\n".join(self.log_line(BASE_EPOCH_MS + r.randint(0, 10**9)) for _ in range(r.randint(5, 40))),
                lambda: self.code_block(),
            ))()
            text += "\n\n" + paste
        return text

    def traceback(self) -> str:
        r = self.rng
        lines = ["Traceback (most recent call last):"]
        for _ in range(r.randint(2, 7)):
            lines.append(f"  File \"{self.abs(r.choice(self.files))}\", line {r.randint(1, 900)}, in {r.choice(self.idents)}")
            lines.append(f"    {r.choice(self.idents)} = {r.choice(self.idents)}({r.choice(self.idents)})")
        lines.append(f"{r.choice(EXC_NAMES)}: {r.choice(ADJS)} {r.choice(NOUNS)} {r.randint(0, 9999)!r}")
        return "\n".join(lines)


# == 3. Small helpers =======================================================================

_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def iso(ms: int) -> str:
    """ISO 8601 UTC with milliseconds, as the CLI writes timestamps."""
    dt = datetime.fromtimestamp(ms / 1000, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def dumps(obj) -> str:
    # Compact separators and raw UTF-8, the way the CLI serializes records.
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def tokens_of(s: str) -> int:
    return len(s) // 4 + 1


def numbered(lines: list[str], start: int) -> str:
    """Read-tool style listing: right-aligned line numbers and an arrow."""
    return "\n".join(f"{n:6}→{line}" for n, line in enumerate(lines, start))


# == 4. The session writer ==================================================================

TOOL_WEIGHTS = [("Bash", 40), ("Read", 26), ("Edit", 16), ("Grep", 8), ("Write", 5), ("Glob", 5)]

SHAPE_TOOLS = [  # name, description length in the real CLI, input properties
    ("Agent", 3225, ["description", "prompt", "subagent_type", "model", "run_in_background"]),
    ("Bash", 2110, ["command", "timeout", "description", "run_in_background"]),
    ("Edit", 360, ["file_path", "old_string", "new_string", "replace_all"]),
    ("Glob", 640, ["pattern", "path"]),
    ("Grep", 1530, ["pattern", "path", "glob", "output_mode", "-n", "-i", "head_limit"]),
    ("ListAgents", 1433, ["channel", "q", "cursor"]),
    ("Read", 790, ["file_path", "offset", "limit", "pages"]),
    ("ReportFindings", 1210, ["findings", "summary"]),
    ("ScheduleWakeup", 980, ["delay_seconds", "reason"]),
    ("Skill", 1405, ["skill", "args"]),
    ("ToolSearch", 1120, ["query", "max_results"]),
    ("Workflow", 2300, ["name", "inputs"]),
    ("Write", 420, ["file_path", "content"]),
]
SYSTEM_PROMPT_PARTS = [2025, 357, 520, 424, 160, 2068, 620, 280, 277, 265]
DEFERRED_TOOLS = ["CronCreate", "CronDelete", "CronList", "EnterWorktree", "ExitWorktree",
                  "Monitor", "NotebookEdit", "SendMessage", "TaskStop", "WebFetch", "WebSearch"]
AGENT_TYPES = ["claude", "Explore", "general-purpose", "Plan", "statusline-setup"]
SKILLS = ["dataviz", "update-config", "keybindings-help", "code-review", "simplify",
          "fewer-permission-prompts", "loop", "claude-api", "workflow-authoring", "run",
          "plugin-authoring", "init", "security-review"]
BETAS = ["claude-code-20250219", "interleaved-thinking-2025-05-14",
         "context-management-2025-06-27", "per-turn-control-2026-07-01",
         "mid-conversation-tool-changes-2026-07-01", "thinking-token-count-2026-05-13",
         "advanced-tool-use-2025-11-20", "effort-2025-11-24"]
PRICE = {"input": 4e-6, "output": 2e-5, "cache_read": 4e-7, "cache_write": 5e-6}
SYSTEM_TOKENS = 17_500   # system prompt + tool schemas, as the usage of a fresh session shows


class Session:
    """Writes one transcript; all state of the simulated session lives here."""

    def __init__(self, seed: int, target_bytes: int, session_id: str | None, cwd: str,
                 git_branch: str, thinking: bool, compact_every: int | None,
                 entrypoint: str, model: str):
        self.rng = rng = random.Random(seed)
        self.target = target_bytes
        self.cwd = cwd
        self.text = Text(rng, cwd)
        self.sid = session_id or self.uuid()
        self.branch = git_branch
        self.thinking = thinking
        self.compact_every = compact_every
        self.entrypoint = entrypoint
        self.model = model
        self.now = BASE_EPOCH_MS + (seed % 97) * 86_400_000 + rng.randint(0, 36_000_000)
        self.lines: list[bytes] = []
        self.nbytes = 0
        self.bookkeeping_bytes = 0
        self.last_uuid: str | None = None
        self.slug: str | None = None
        self.files: dict[str, str] = {}            # path -> current content
        self.backups: dict[str, dict] = {}         # file-history tracked backups
        self.context = 0                           # tokens the next request carries
        self.cached = 0                            # tokens of that already in the cache
        self.msgs_in_ctx = 0
        self.dropped = 0
        self.stats = {"turns": 0, "records": 0, "messages": 0, "assistant_messages": 0,
                      "tool_calls": 0, "tool_errors": 0, "large_outputs": 0,
                      "api_requests": 0, "processes": 0, "compactions": 0}
        self.tool_counts: dict[str, int] = {}
        self.shape_hash = self.hexid(64)
        self.proc: dict | None = None
        self.room = target_bytes                   # bytes the current turn may still use
        self.summarized_prompts: list[str] = []

    # -- ids, time, output -------------------------------------------------------------

    def uuid(self) -> str:
        h = "%032x" % self.rng.getrandbits(128)
        return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:32]}"

    def hexid(self, n: int) -> str:
        return "%0*x" % (n, self.rng.getrandbits(4 * n))

    def b62(self, n: int) -> str:
        r = self.rng
        return "".join(r.choice(_B62) for _ in range(n))

    def tick(self, lo: int, hi: int) -> str:
        self.now += self.rng.randint(max(1, lo), max(1, hi))
        return iso(self.now)

    def emit(self, rec: dict, bookkeeping: bool = False) -> None:
        line = dumps(rec).encode("utf-8") + b"\n"
        self.lines.append(line)
        self.nbytes += len(line)
        self.stats["records"] += 1
        if bookkeeping:
            self.bookkeeping_bytes += len(line)

    def common(self) -> dict:
        c = {"userType": "external", "entrypoint": self.entrypoint, "cwd": self.cwd,
             "sessionId": self.sid, "version": CLAUDE_VERSION, "gitBranch": self.branch}
        if self.slug:
            c["slug"] = self.slug
        return c

    def chained(self, body: dict, ts_lo: int = 1, ts_hi: int = 40) -> str:
        """Emit a record on the uuid chain; body holds the fields between isSidechain and uuid."""
        uid = self.uuid()
        rec = {"parentUuid": self.last_uuid, "isSidechain": False}
        rec.update(body)
        rec["uuid"] = uid
        rec["timestamp"] = self.tick(ts_lo, ts_hi)
        after = rec.pop("_after", None)
        if after:
            rec.update(after)
        rec.update(self.common())
        self.emit(rec, bookkeeping=rec.get("type") == "attachment")
        self.last_uuid = uid
        return uid

    def book(self, rec: dict) -> None:
        self.emit(rec, bookkeeping=True)

    # -- process (one CLI run) ---------------------------------------------------------

    def start_process(self) -> None:
        r = self.rng
        self.proc = {"start": self.now, "requests": 0, "prev_request": None, "shape_written": False,
                     "snapshot_full": False, "envelope": False, "prompt_index": 0,
                     "usage": {"input": 0, "output": 0, "cache_read": 0, "cache_write": 0},
                     "api_ms": 0, "tool_ms": 0, "added": 0, "removed": 0}
        self.stats["processes"] += 1
        # A process that starts long after the last one finds the prompt cache cold.
        if r.random() < 0.5:
            self.cached = 0

    def end_process(self) -> None:
        p = self.proc
        u = p["usage"]
        cost = (u["input"] * PRICE["input"] + u["output"] * PRICE["output"]
                + u["cache_read"] * PRICE["cache_read"] + u["cache_write"] * PRICE["cache_write"])
        self.book({"type": "cost-state", "sessionId": self.sid, "totalCostUSD": round(cost, 6),
                   "totalAPIDuration": p["api_ms"], "totalAPIDurationWithoutRetries": int(p["api_ms"] * 0.96),
                   "totalToolDuration": p["tool_ms"], "totalLinesAdded": p["added"],
                   "totalLinesRemoved": p["removed"], "totalDuration": self.now - p["start"] + 400,
                   "startTime": p["start"],
                   "modelUsage": {self.model: {
                       "inputTokens": u["input"], "outputTokens": u["output"], "thinkingTokens": 0,
                       "cacheReadInputTokens": u["cache_read"], "cacheCreationInputTokens": u["cache_write"],
                       "cacheCreationEphemeral5mInputTokens": 0, "cacheCreationEphemeral1hInputTokens": 0,
                       "webSearchRequests": 0, "costUSD": round(cost, 6)}},
                   "hasUnknownModelCost": False})
        self.proc = None

    def rendered(self, text: str, role: str = "system") -> dict:
        return {"rendered": [{"content": f"<system-reminder>\n{text}\n</system-reminder>"}],
                "renderedRole": role}

    def envelope(self) -> None:
        """The attachments the CLI writes after the first prompt of each process."""
        t, cwd = self.text, self.cwd
        env_text = (f"# Environment\n - Primary working directory: {cwd}\n - Is a git repository: true\n"
                    f" - Platform: linux\n - Shell: bash\n - OS Version: Linux 6.18.44-fc-v657\n"
                    f" - {t.filler('env-note', 640)}")
        self.chained({"attachment": {"type": "environment", "snapshot": {
            "workingDirectory": cwd, "isWorktree": False, "isGitRepo": True,
            "additionalWorkingDirectories": [], "platform": "linux", "shell": "bash",
            "osVersion": "Linux 6.18.44-fc-v657"}}, "type": "attachment",
            "_after": self.rendered(env_text)}, 0, 2)
        ident = f"You are powered by the model {self.model}. Knowledge cutoff: June 2026."
        self.chained({"attachment": {"type": "model", "identity": {
            "modelId": self.model, "marketingName": "Opus 5.5", "knowledgeCutoff": "June 2026"},
            "text": ident}, "type": "attachment", "_after": self.rendered(ident)}, 0, 2)
        self.chained({"attachment": {"type": "deferred_tools_delta", "addedNames": DEFERRED_TOOLS,
                                     "addedLines": DEFERRED_TOOLS, "removedNames": [],
                                     "wireHiddenNames": [], "readdedNames": [], "pendingMcpServers": [],
                                     "needsAuthMcpServers": [], "failedMcpServers": []},
                      "type": "attachment",
                      "_after": self.rendered(t.filler("deferred", 330) + "\n" + "\n".join(DEFERRED_TOOLS))}, 0, 2)
        lines = [f"- {a}: {t.filler('agent-' + a, 120 + 90 * i)}" for i, a in enumerate(AGENT_TYPES)]
        self.chained({"attachment": {"type": "agent_listing_delta", "addedTypes": AGENT_TYPES,
                                     "addedLines": lines, "builtInTypes": AGENT_TYPES,
                                     "builtInPluginTypes": [], "removedTypes": [], "isInitial": True,
                                     "showConcurrencyNote": True},
                      "type": "attachment",
                      "_after": self.rendered("Agent types for the Agent tool:\n" + "\n".join(lines))}, 0, 2)
        skills = t.filler("skills", 6210)
        self.chained({"attachment": {"type": "skill_listing", "content": skills, "skillCount": len(SKILLS),
                                     "isInitial": True, "names": SKILLS,
                                     "digests": [self.hexid(16) for _ in SKILLS]},
                      "type": "attachment", "_after": self.rendered(skills)}, 0, 2)
        self.book({"type": "atis-latch", "atis": "", "sessionId": self.sid})
        self.chained({"attachment": {"type": "session_context", "context": {}}, "type": "attachment"}, 5, 30)
        self.date_attachment()
        attribution = ("Attribution for commits and pull requests made from here on:\n"
                       "- End git commit messages with:\nCo-Authored-By: Claude Opus 5.5 <noreply@anthropic.com>")
        after = self.rendered(attribution, "user")
        after["renderedBesideToolResult"] = True
        self.chained({"attachment": {"type": "remote_session_change", "url": None,
                                     "commit": "Co-Authored-By: Claude Opus 5.5 <noreply@anthropic.com>",
                                     "pr": "🤖 Generated with [Claude Code](https://claude.com/claude-code)",
                                     "sendUserFileHint": False, "managedCommit": False, "managedPr": False},
                      "type": "attachment", "_after": after}, 0, 2)
        self.prompt_snapshot(full=False)
        self.proc["envelope"] = True

    def date_attachment(self) -> None:
        day = iso(self.now)[:10]
        self.proc["day"] = day
        self.chained({"attachment": {"type": "date", "date": day}, "type": "attachment",
                      "_after": self.rendered(f"Today's date is {day}.")}, 0, 2)

    def system_prompt_parts(self) -> list[str]:
        t = self.text
        return [t.filler(f"sys-{i}", n) for i, n in enumerate(SYSTEM_PROMPT_PARTS)]

    def tool_schema(self, name: str, desc_len: int, props: list[str]) -> dict:
        t = self.text
        properties = {}
        for p in props:
            kind = ("boolean" if p in ("run_in_background", "replace_all", "-n", "-i") else
                    "number" if p in ("timeout", "offset", "limit", "head_limit", "delay_seconds",
                                      "max_results") else "string")
            properties[p] = {"description": t.filler(f"{name}.{p}", 60 + (len(p) * 37) % 300), "type": kind}
        return {"name": name, "description": t.filler(f"tool-{name}", desc_len),
                "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                                 "properties": properties, "required": props[:1],
                                 "additionalProperties": False}}

    def prompt_snapshot(self, full: bool) -> None:
        att = {"type": "prompt_snapshot", "systemPrompt": self.system_prompt_parts()}
        if full:
            tools = []
            for name, n, props in SHAPE_TOOLS:
                schema = self.tool_schema(name, n, props)
                tools.append({"name": name, "description": schema["description"], "schema": schema})
            att.update({"tools": tools, "cliPrefix": "You are a Claude agent, built on Anthropic's Claude Agent SDK.",
                        "reminderFold": False, "systemTurns": True, "toolChangeHeader": True,
                        "inlineTools": False, "keptReminders": False})
        else:
            att["reminderFold"] = False
        att.update({"echoWireToolInputs": False, "contextRendering": "announced"})
        self.chained({"attachment": att, "type": "attachment"}, 1, 9)
        if full:
            self.proc["snapshot_full"] = True

    def api_request(self, prompt_text: str | None) -> str:
        """Shape (once per process), blobs for messages the CLI wraps, and the request line."""
        t, p = self.text, self.proc
        if not p["shape_written"]:
            shape = {"system": [{"type": "text", "text": "You are a Claude agent, built on Anthropic's Claude Agent SDK."},
                                {"type": "text", "text": t.filler("system-main", 7017)}],
                     "tools": [self.tool_schema(n, d, props) for n, d, props in SHAPE_TOOLS]}
            self.book({"type": "api-request-shape", "sessionId": self.sid, "shapeHash": self.shape_hash,
                       "timestamp": self.tick(5, 60), "version": CLAUDE_VERSION, "shape": shape})
            p["shape_written"] = True
        tail = []
        if prompt_text is not None:
            h = self.hexid(64)
            tail.append(h)
            self.book({"type": "api-request-blob", "sessionId": self.sid, "hash": h,
                       "message": {"role": "user", "content": [
                           {"type": "text", "text": t.filler("prompt-wrap", 580)},
                           {"type": "text", "text": prompt_text}]}})
            if p["requests"] == 0:
                h = self.hexid(64)
                tail.append(h)
                self.book({"type": "api-request-blob", "sessionId": self.sid, "hash": h,
                           "message": {"role": "system", "content": [{"type": "text", "text": t.filler("system-turn", 9196)}],
                                       "output_config": {"effort": "medium"}}})
        else:
            tail += [self.hexid(64) for _ in range(2)]
        rid = self.uuid()
        req = {"type": "api-request", "sessionId": self.sid, "id": rid, "timestamp": self.tick(1, 30),
               "version": CLAUDE_VERSION, "querySource": "sdk", "shapeHash": self.shape_hash,
               "params": {"model": self.model, "betas": BETAS + (["thinking-display-updates-2026-08-18"] if self.thinking else []),
                          "max_tokens": 128000,
                          "thinking": {"type": "adaptive", "display": "updates" if self.thinking else "omitted"},
                          "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
                          "output_config": {"effort": "medium"}}}
        if p["prev_request"]:
            req["base"] = p["prev_request"]
        req.update({"keep": max(0, self.msgs_in_ctx - len(tail)) if p["prev_request"] else 0, "tail": tail,
                    "cacheControl": [{"path": ["system", 0], "value": {"type": "ephemeral"}},
                                     {"path": ["system", 1], "value": {"type": "ephemeral"}},
                                     {"path": ["messages", max(1, self.msgs_in_ctx), "content", 0],
                                      "value": {"type": "ephemeral"}}],
                    "requestDigest": self.hexid(64)})
        self.book(req)
        p["prev_request"] = rid
        p["requests"] += 1
        self.stats["api_requests"] += 1
        return rid

    # -- conversation pieces -----------------------------------------------------------

    def usage_for(self, new_tokens: int, out_tokens: int) -> dict:
        r = self.rng
        if self.context == 0:
            self.context = SYSTEM_TOKENS
            self.cached = 0
        self.context += new_tokens
        fresh = r.randint(1, 12)
        cache_read = min(self.cached, self.context - fresh)
        cache_write = max(0, self.context - cache_read - fresh)
        usage = {"input_tokens": fresh, "cache_creation_input_tokens": cache_write,
                 "cache_read_input_tokens": cache_read, "output_tokens": out_tokens,
                 "output_tokens_details": {"thinking_tokens": 0},
                 "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
                 "service_tier": "standard",
                 "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": cache_write},
                 "inference_geo": "", "iterations": [], "speed": "standard", "fallback_credit": None}
        self.cached = self.context
        self.context += out_tokens        # the reply is part of the next request's prefix
        u = self.proc["usage"]
        u["input"] += fresh
        u["output"] += out_tokens
        u["cache_read"] += cache_read
        u["cache_write"] += cache_write
        return usage

    def thinking_block(self) -> dict:
        r = self.rng
        sig = base64.b64encode(r.getrandbits(8 * (n := r.randint(180, 700))).to_bytes(n, "big")).decode()
        return {"type": "thinking", "thinking": self.text.prose(r.randint(150, 2600)), "signature": sig}

    def assistant(self, blocks: list[dict], stop_reason: str, new_tokens: int, req_id: str) -> list[str]:
        """One API response, written as one record per content block."""
        r = self.rng
        out_tokens = sum(tokens_of(dumps(b)) for b in blocks) + r.randint(0, 30)
        usage = self.usage_for(new_tokens, out_tokens)
        msg_id = "msg_01" + self.b62(22)
        request_id = "req_011" + self.b62(21)
        api_ms = r.randint(900, 45_000)
        self.proc["api_ms"] += api_ms
        self.now += api_ms
        uuids = []
        for i, block in enumerate(blocks):
            body = {"message": {"id": msg_id, "type": "message", "role": "assistant", "model": self.model,
                                "content": [block], "stop_reason": stop_reason, "stop_sequence": None,
                                "usage": usage, "stop_details": None}}
            if block["type"] == "thinking":
                body["thinkingDurationMs"] = r.randint(200, 20_000)
                body["thinkingDisplay"] = "updates"
            elif block["type"] == "tool_use":
                body["toolInputStreamMs"] = r.randint(1, 4_000)
            body.update({"apiBlockIndex": i, "requestId": request_id, "requestRef": req_id,
                         "requestedModel": self.model, "promptCacheRequested": "5m", "type": "assistant"})
            body["_after"] = {"effort": "medium", "perTurnEffort": "medium", "madeBy": "model"}
            uuids.append(self.chained(body, 1, 900))
        self.stats["messages"] += 1
        self.stats["assistant_messages"] += 1
        self.msgs_in_ctx += 1
        return uuids

    def last_prompt(self, prompt_text: str) -> None:
        self.book({"type": "last-prompt", "lastPrompt": prompt_text[:300], "leafUuid": self.last_uuid,
                   "sessionId": self.sid})
        if self.rng.random() < 0.3:
            self.book({"type": "mode", "mode": "normal", "sessionId": self.sid})
        self.book({"type": "atis-latch", "atis": "", "sessionId": self.sid})

    def file_history(self, prompt_uuid: str, update: bool) -> None:
        self.book({"type": "file-history-snapshot", "messageId": prompt_uuid,
                   "snapshot": {"messageId": prompt_uuid, "trackedFileBackups": dict(self.backups),
                                "timestamp": iso(self.now)},
                   "isSnapshotUpdate": update})

    def track_backup(self, rel: str) -> None:
        prev = self.backups.get(rel)
        version = prev["version"] + 1 if prev else 1
        self.backups[rel] = {"backupFileName": f"{self.hexid(16)}@v{version}", "version": version,
                             "backupTime": iso(self.now)}

    # -- tools -------------------------------------------------------------------------

    def test_files(self) -> list[str]:
        return [f for f in self.text.files if f.startswith("tests/test_")]

    def get_file(self, rel: str) -> str:
        if rel not in self.files:
            r = self.rng
            n = int(r.lognormvariate(4.6, 0.8))            # median ~100 lines, long tail
            self.files[rel] = self.text.file_content(rel, max(12, min(n, 1600)))
        return self.files[rel]

    def make_tool(self, name: str, big: int) -> tuple[dict, dict]:
        """Returns (tool input, result) where result = content, is_error, toolUseResult, ms."""
        return getattr(self, "tool_" + name.lower())(big)

    def tool_bash(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        stderr, code, no_output = "", 0, False
        if big:
            cmd, desc = r.choice((
                (f"python -m pytest -v {r.choice(('tests/', 'tests/ -x', 'tests/ -k slow'))} 2>&1", "Run the full test suite verbosely"),
                (f"tail -n {big // 90} ~/.cache/{t.project}/worker.log", "Show the recent worker log"),
                (f"find . -type f -name '*.{r.choice(('py', 'ts', 'rs', 'json'))}' | xargs wc -l", "Count lines per file"),
            ))
            lines, size = [], 0
            while size < big:
                if cmd.startswith("python -m pytest"):
                    ln = f"{r.choice(self.test_files())}::{r.choice(t.test_names)} {r.choice(('PASSED', 'PASSED', 'PASSED', 'SKIPPED', 'FAILED'))} [{r.randint(1, 99):3}%]"
                elif cmd.startswith("tail"):
                    ln = t.log_line(self.now - r.randint(0, 86_400_000))
                else:
                    ln = f"{r.randint(1, 4000):8} ./{r.choice(t.dirs)}/{r.choice(t.idents)}.{r.choice(('py', 'ts', 'json'))}"
                lines.append(ln)
                size += len(ln) + 1
            stdout = "\n".join(lines)
        else:
            k = r.randrange(12)
            if k == 0:
                test = r.choice(self.test_files())
                cmd, desc = f"python -m pytest -q {test}", "Run the tests for this module"
                n_pass, n_fail = r.randint(3, 80), r.choice((0, 0, 0, 1, 2))
                dots = "".join(r.choice("....................s") for _ in range(n_pass)) + "F" * n_fail
                out = [f"{dots:<{len(dots)}} [100%]"]
                if n_fail:
                    code = 1
                    for _ in range(n_fail):
                        tn = r.choice(t.test_names)
                        out += ["", f"{'_' * 20} {tn} {'_' * 20}", ""]
                        body = self.get_file(test).split("\n")
                        k0 = r.randrange(max(1, len(body) - 14))
                        out += ["    " + ln for ln in body[k0:k0 + r.randint(4, 14)]]
                        out += [f">       assert {r.choice(t.idents)} == {r.randint(0, 99)}",
                                f"E       AssertionError: assert {r.randint(0, 99)} == {r.randint(0, 99)}", "",
                                f"{test}:{r.randint(10, 600)}: AssertionError"]
                    out += ["=" * 20 + " short test summary info " + "=" * 20]
                    out += [f"FAILED {test}::{r.choice(t.test_names)} - AssertionError" for _ in range(n_fail)]
                out.append(f"{n_fail and f'{n_fail} failed, ' or ''}{n_pass} passed in {r.uniform(0.2, 40):.2f}s")
                stdout = "\n".join(out)
            elif k == 1:
                cmd, desc = "git status --short && git diff --stat", "Show working tree changes"
                files = r.sample(t.files, r.randint(1, 9))
                stdout = "\n".join(f" {r.choice('MMMAD?')} {f}" for f in files) + "\n" + "\n".join(
                    f" {f:<50} | {r.randint(1, 120):3} {'+' * r.randint(0, 20)}{'-' * r.randint(0, 12)}" for f in files)
                stdout += f"\n {len(files)} files changed, {r.randint(1, 400)} insertions(+), {r.randint(0, 200)} deletions(-)"
            elif k == 2:
                cmd, desc = f"git log --oneline -n {(n := r.randint(5, 30))}", "Show recent commits"
                stdout = "\n".join(f"{self.hexid(7)} {r.choice(t.commit_msgs)}" for _ in range(n))
            elif k == 3:
                d = r.choice(t.dirs)
                cmd, desc = f"ls -la {d}", "List the directory"
                rows = [f"total {r.randint(8, 400)}", "drwxr-xr-x  5 user user  4096 Nov 30 09:12 .",
                        "drwxr-xr-x 12 user user  4096 Nov 30 08:55 .."]
                rows += [f"-rw-r--r--  1 user user {r.randint(90, 90000):5} Nov {r.randint(1, 30):2} {r.randint(0, 23):02}:{r.randint(0, 59):02} {f.rsplit('/', 1)[-1]}"
                         for f in t.files if f.startswith(d + "/")]
                stdout = "\n".join(rows)
            elif k == 4:
                ident = r.choice(t.idents)
                cmd, desc = f"rg -n '{ident}' src tests", f"Find uses of {ident}"
                stdout = "\n".join(f"{r.choice(t.files)}:{r.randint(1, 900)}:    {r.choice(t.idents)} = {ident}({r.choice(t.idents)})"
                                   for _ in range(r.randint(1, 25)))
            elif k == 5:
                cmd, desc = r.choice((("python -m mypy src", "Type-check"), ("npm run build", "Build the web UI"),
                                      ("cargo check", "Check the Rust crate")))
                diags = [f"{r.choice(t.files)}:{r.randint(1, 900)}: {r.choice(('error', 'warning', 'note'))}: {t.sentence()}"
                         for _ in range(r.randint(0, 14))]
                code = 1 if any(": error:" in d for d in diags) else 0
                stdout = "\n".join(diags + [f"Found {len(diags)} issues in {r.randint(1, 9)} files" if diags else "Success: no issues found"])
            elif k == 6:
                db = f"~/.{t.project}/store.sqlite"
                tbl = r.choice(SQL_TABLES)
                cmd, desc = f"sqlite3 -header -column {db} 'SELECT * FROM {tbl} ORDER BY id DESC LIMIT 20'", f"Inspect {tbl}"
                stdout = "id    label  created_at               bytes\n----  -----  -----------------------  ------\n" + "\n".join(
                    f"{i:<5} {r.choice('tm')}{r.randint(1, 999):<5} {iso(self.now - r.randint(0, 10**8))}  {r.randint(10, 99999)}"
                    for i in range(r.randint(2, 20)))
            elif k == 7:
                cmd, desc = f"tail -n 40 ~/.cache/{t.project}/worker.log", "Show the end of the log"
                stdout = "\n".join(t.log_line(self.now - r.randint(0, 3_600_000)) for _ in range(r.randint(8, 40)))
            elif k == 8:
                cmd, desc = f"mkdir -p build/tmp && cp {r.choice(t.files)} build/tmp/", "Copy the file aside"
                stdout, no_output = "", True
            elif k == 9:
                tool = r.choice(("jq", "hyperfine", "uvx", "delta"))
                cmd, desc = f"{tool} --version", f"Check whether {tool} is installed"
                stderr, code = f"/bin/bash: line 1: {tool}: command not found", 127
                stdout = ""
            elif k == 10:
                cmd, desc = f"python3 -m {t.project} {r.choice(MODULES)} --json", "Run the command"
                if r.random() < 0.4:
                    stderr, code, stdout = t.traceback(), 1, ""
                else:
                    stdout = json.dumps({r.choice(t.idents): r.randint(0, 10**6) for _ in range(r.randint(3, 30))},
                                        indent=2, ensure_ascii=False)
            else:
                cmd, desc = f"wc -l {' '.join(r.sample(t.files, 4))}", "Count lines"
                rows = [f"{r.randint(10, 3000):6} {f}" for f in r.sample(t.files, 4)]
                stdout = "\n".join(rows) + f"\n{r.randint(1000, 9000):6} total"
        inp = {"command": cmd, "description": desc}
        if r.random() < 0.1:
            inp["timeout"] = r.choice((120000, 300000, 600000))
        combined = "\n".join(x for x in (stdout, stderr) if x)
        if code:
            content = f"Exit code {code}\n{combined}"
            return inp, {"content": content, "is_error": True, "tur": "Error: " + content,
                         "ms": r.randint(30, 90_000)}
        tur = {"stdout": stdout, "stderr": stderr, "interrupted": False, "isImage": False,
               "noOutputExpected": no_output}
        return inp, {"content": combined or "(Bash completed with no output)", "is_error": False,
                     "tur": tur, "ms": r.randint(20, 120_000)}

    def tool_read(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        if big:
            rel = r.choice(("tests/fixtures/large_session.jsonl", "data/export.json", f"logs/{t.project}-worker.log"))
            if rel not in self.files or len(self.files[rel]) < big:
                lines, size = [], 0
                while size < big:
                    ln = (t.log_line(self.now - r.randint(0, 10**9)) if rel.endswith(".log") else
                          dumps({"id": r.randint(1, 10**6), "label": f"t{r.randint(1, 999)}",
                                 "text": t.sentence(), "tokens": r.randint(1, 9000)}))
                    lines.append(ln)
                    size += len(ln) + 7
                self.files[rel] = "\n".join(lines) + "\n"
            if rel not in t.files:
                t.files.append(rel)
        else:
            rel = r.choice(t.files)
        if not big and r.random() < 0.04:
            missing = f"src/{t.project}/{r.choice(t.idents)}.py"
            return {"file_path": t.abs(missing)}, {
                "content": "<tool_use_error>File does not exist.</tool_use_error>", "is_error": True,
                "tur": "Error: File does not exist.", "ms": r.randint(1, 20)}
        content = self.get_file(rel)
        all_lines = content.split("\n")[:-1] if content.endswith("\n") else content.split("\n")
        inp = {"file_path": t.abs(rel)}
        start, lines = 1, all_lines
        # Long files are often read in windows; always when the size budget is tight.
        tight = not big and len(content) * 2 > self.room // 3 and len(all_lines) > 40
        if big and len(content) > big * 1.2:
            # Only the window that makes up the requested size.
            avg = len(content) / len(all_lines)
            lim = max(1, int(big / (avg + 7)))
            start = r.randint(1, max(1, len(all_lines) - lim))
            lines = all_lines[start - 1:start - 1 + lim]
            inp.update({"offset": start, "limit": lim})
        elif tight or (not big and len(all_lines) > 300 and r.random() < 0.5):
            start = r.randint(1, max(1, len(all_lines) - 40))
            lim = r.randint(30, 80) if tight else r.randint(60, 250)
            lines = all_lines[start - 1:start - 1 + lim]
            inp.update({"offset": start, "limit": lim})
        tur = {"type": "text", "file": {"filePath": t.abs(rel), "content": "\n".join(lines),
                                        "numLines": len(lines), "startLine": start, "totalLines": len(all_lines)}}
        return inp, {"content": numbered(lines, start), "is_error": False, "tur": tur, "ms": r.randint(2, 200)}

    def tool_edit(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        rel = r.choice([f for f in t.files if f.rsplit(".", 1)[-1] in ("py", "ts", "tsx", "rs", "md")])
        content = self.get_file(rel)
        if len(content) * 2 > self.room // 2:
            # toolUseResult carries the whole original file: pick a short one when tight.
            short = [f for f in t.files if f in self.files and f.rsplit(".", 1)[-1] in ("py", "ts", "rs", "md")
                     and len(self.files[f]) * 2 <= self.room // 2]
            if short:
                rel = r.choice(short)
                content = self.files[rel]
        lines = content.split("\n")
        i = r.randrange(max(1, len(lines) - 8))
        n = r.randint(1, 6)
        old = "\n".join(lines[i:i + n])
        if r.random() < 0.07 or not old.strip():
            bogus = old + "\n" + t.sentence() if old.strip() else t.sentence()
            inp = {"file_path": t.abs(rel), "old_string": bogus, "new_string": bogus.replace(" ", "  ", 1)}
            msg = f"String to replace not found in file.\nString: {bogus}"
            return inp, {"content": f"<tool_use_error>{msg}</tool_use_error>", "is_error": True,
                         "tur": "Error: " + msg, "ms": r.randint(1, 30)}
        new_lines = [ln.replace(r.choice(t.idents), r.choice(t.idents)) for ln in lines[i:i + n]]
        ind = (len(lines[i]) - len(lines[i].lstrip())) * " "
        for _ in range(r.randint(0, 5)):
            new_lines.insert(r.randint(0, len(new_lines)), ind + (r.choice(t.py_blocks).split("\n")[r.randint(1, 3)].strip()))
        new = "\n".join(new_lines)
        if new == old:
            new = old + "\n" + ind + "# " + t.sentence()
        replace_all = r.random() < 0.05
        inp = {"file_path": t.abs(rel), "old_string": old, "new_string": new}
        if replace_all:
            inp["replace_all"] = True
        updated = "\n".join(lines[:i]) + ("\n" if i else "") + new + "\n" + "\n".join(lines[i + n:])
        self.files[rel] = updated
        ctx0 = max(0, i - 3)
        old_seg, new_seg = lines[i:i + n], new.split("\n")
        hunk = ([" " + x for x in lines[ctx0:i]] + ["-" + x for x in old_seg] + ["+" + x for x in new_seg]
                + [" " + x for x in lines[i + n:i + n + 3]])
        tur = {"filePath": t.abs(rel), "oldString": old, "newString": new, "originalFile": content,
               "structuredPatch": [{"oldStart": ctx0 + 1, "oldLines": len(hunk) - len(new_seg),
                                    "newStart": ctx0 + 1, "newLines": len(hunk) - len(old_seg), "lines": hunk}],
               "userModified": False, "replaceAll": replace_all}
        upd_lines = updated.split("\n")
        s0 = max(0, i - 4)
        snippet = numbered(upd_lines[s0:i + len(new_seg) + 4], s0 + 1)
        self.proc["added"] += len(new_seg)
        self.proc["removed"] += len(old_seg)
        self.track_backup(rel)
        return inp, {"content": f"The file {t.abs(rel)} has been updated. Here's the result of running `cat -n` "
                                f"on a snippet of the edited file:\n{snippet}",
                     "is_error": False, "tur": tur, "ms": r.randint(5, 400), "edited": rel}

    def tool_write(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        kind = r.choice(("py", "py", "md", "ts"))
        base = r.choice(t.idents).strip("_")
        rel = {"py": f"tests/test_{base}.py", "md": f"docs/{base.replace('_', '-')}.md",
               "ts": f"web/src/lib/{t._camel(base)}.ts"}[kind]
        content = t.file_content(rel, r.randint(15, max(16, min(220, self.room // 200))))
        self.files[rel] = content
        if rel not in t.files:
            t.files.append(rel)
        self.proc["added"] += content.count("\n")
        self.track_backup(rel)
        tur = {"type": "create", "filePath": t.abs(rel), "content": content, "structuredPatch": [],
               "originalFile": None}
        return {"file_path": t.abs(rel), "content": content}, {
            "content": f"File created successfully at: {t.abs(rel)}", "is_error": False, "tur": tur,
            "ms": r.randint(3, 200), "edited": rel}

    def tool_grep(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        pattern = r.choice((r.choice(t.idents), f"def {r.choice(t.idents)}", f"{r.choice(NOUNS)}.*{r.choice(NOUNS)}",
                            "TODO|FIXME", f"class \\w+{r.choice(NOUNS).title()}"))
        inp = {"pattern": pattern, "path": t.abs(r.choice(("src", "tests", "web/src", "")).rstrip("/"))}
        mode = "content" if big else r.choice(("content", "content", "files_with_matches", "count"))
        if mode != "files_with_matches":
            inp["output_mode"] = mode
        if r.random() < 0.3:
            inp["glob"] = r.choice(("*.py", "*.ts", "*.{ts,tsx}", "*.rs"))
        if mode == "content":
            inp["-n"] = True
            rows, size = [], 0
            goal = big or r.randint(100, 4000)
            while size < goal:
                f = r.choice(t.files)
                body = self.get_file(f).split("\n")
                k = r.randrange(len(body))
                if not body[k].strip():
                    continue
                row = f"{t.abs(f)}:{k + 1}:{body[k]}"
                rows.append(row)
                size += len(row) + 1
            text = "\n".join(rows)
            tur = {"mode": "content", "numFiles": 0, "filenames": [], "content": text, "numLines": len(rows)}
            return inp, {"content": text, "is_error": False, "tur": tur, "ms": r.randint(5, 900)}
        files = [t.abs(f) for f in r.sample(t.files, r.randint(0, 12))]
        if mode == "count":
            counts = [f"{f}:{r.randint(1, 40)}" for f in files]
            text = "\n".join(counts) if counts else "No matches found"
            tur = {"mode": "count", "numFiles": len(files), "filenames": [], "content": "\n".join(counts),
                   "numMatches": len(files) * 3}
        else:
            text = f"Found {len(files)} file{'s' if len(files) != 1 else ''}\n" + "\n".join(files) if files else "No files found"
            tur = {"mode": "files_with_matches", "filenames": files, "numFiles": len(files)}
        return inp, {"content": text, "is_error": False, "tur": tur, "ms": r.randint(5, 900)}

    def tool_glob(self, big: int) -> tuple[dict, dict]:
        r, t = self.rng, self.text
        ext = r.choice(("py", "ts", "tsx", "rs", "md", "toml"))
        inp = {"pattern": f"**/*.{ext}"}
        if r.random() < 0.3:
            inp["path"] = t.abs(r.choice(t.dirs))
        files = [t.abs(f) for f in t.files if f.endswith("." + ext)]
        text = "\n".join(files) if files else "No files found"
        return inp, {"content": text, "is_error": False,
                     "tur": {"filenames": files, "durationMs": r.randint(2, 90), "numFiles": len(files),
                             "truncated": False}, "ms": r.randint(2, 90)}

    # -- turns -------------------------------------------------------------------------

    def user_prompt(self, text: str, first_in_process: bool) -> str:
        p = self.proc
        self.book({"type": "queue-operation", "operation": "enqueue", "timestamp": self.tick(5_000, 600_000),
                   "sessionId": self.sid, "content": text})
        self.book({"type": "queue-operation", "operation": "dequeue", "timestamp": self.tick(1, 5),
                   "sessionId": self.sid})
        prompt_id = self.uuid()
        p["prompt_id"] = prompt_id
        body = {"promptId": prompt_id, "type": "user", "message": {"role": "user", "content": text}}
        after = {"permissionMode": "default", "promptSource": "sdk", "turnOrigin": "sdk",
                 "turnPosition": {"promptIndex": p["prompt_index"], "turnIndex": p["prompt_index"] + 1}}
        # The record's own uuid is chosen before the file-history snapshot that names it.
        uid = self.uuid()
        self.file_history(uid, update=False)
        rec = {"parentUuid": self.last_uuid, "isSidechain": False, **body, "uuid": uid,
               "timestamp": self.tick(10, 60), **after, **self.common()}
        self.emit(rec)
        self.last_uuid = uid
        p["prompt_index"] += 1
        self.stats["messages"] += 1
        self.stats["turns"] += 1
        self.msgs_in_ctx += 1
        if first_in_process:
            self.envelope()
        elif iso(self.now)[:10] != p.get("day"):
            self.date_attachment()
        return uid

    def compact(self) -> None:
        """Claude's own compaction: a boundary off the chain, then a summary user record."""
        r, t = self.rng, self.text
        pre = self.context
        summary_body = "\n\n".join(
            f"{k}. {head}:\n" + "\n".join(f"   - {t.sentence()}" for _ in range(r.randint(2, 7)))
            for k, head in enumerate(("Primary request and intent", "Key technical concepts", "Files and code sections",
                                      "Errors and fixes", "Problem solving", "All user messages", "Pending tasks",
                                      "Current work", "Optional next step"), 1))
        summary = ("This session is being continued from a previous conversation that ran out of context. "
                   "The summary below covers the earlier portion of the conversation.\n\nSummary:\n"
                   + summary_body)
        post = SYSTEM_TOKENS + tokens_of(summary)
        self.dropped += max(0, pre - post)
        if self.slug is None:
            self.slug = "-".join((r.choice(ADJS), r.choice(VERBS) + "ing", r.choice(NOUNS)))
        boundary = self.uuid()
        rec = {"parentUuid": None, "logicalParentUuid": self.last_uuid, "isSidechain": False, "type": "system",
               "subtype": "compact_boundary", "content": "Conversation compacted", "level": "info",
               "compactMetadata": {"trigger": "auto", "preTokens": pre, "postTokens": post,
                                   "cumulativeDroppedTokens": self.dropped, "durationMs": r.randint(9_000, 90_000)},
               "uuid": boundary, "timestamp": self.tick(20_000, 90_000), **self.common()}
        self.emit(rec)
        self.last_uuid = boundary
        uid = self.uuid()
        rec = {"parentUuid": boundary, "isSidechain": False, "promptId": self.uuid(), "type": "user",
               "message": {"role": "user", "content": summary}, "isVisibleInTranscriptOnly": True,
               "isCompactSummary": True, "uuid": uid, "timestamp": self.tick(1, 20), "turnOrigin": "sdk",
               "summarizedTurnPromptUuids": list(self.summarized_prompts), **self.common()}
        self.emit(rec)
        self.last_uuid = uid
        self.summarized_prompts = []
        self.context = post
        self.cached = 0
        self.msgs_in_ctx = 1
        self.proc["shape_written"] = False
        self.stats["compactions"] += 1
        self.stats["messages"] += 1

    def turn(self, budget: int, last: bool) -> None:
        """One prompt and everything up to the assistant's final end_turn line."""
        r, t = self.rng, self.text
        start_bytes = self.nbytes
        first = self.proc["prompt_index"] == 0
        prompt = t.prompt()
        prompt_uuid = self.user_prompt(prompt, first)
        self.summarized_prompts.append(prompt_uuid)
        new_tokens = tokens_of(prompt) + 40
        pending_prompt: str | None = prompt
        steps = 1 if last else min(int(r.expovariate(1 / 4.5)) + 1, 25)
        for step in range(steps):
            used = self.nbytes - start_bytes
            final = step == steps - 1 or used > budget * 0.9
            req = self.api_request(pending_prompt)
            pending_prompt = None
            blocks: list[dict] = []
            if self.thinking and r.random() < (0.9 if step == 0 else 0.55):
                blocks.append(self.thinking_block())
            if final:
                blocks.append({"type": "text", "text": self.final_text(budget - used - 1_500 if last else 0)})
            else:
                if r.random() < 0.55:
                    blocks.append({"type": "text", "text": t.paragraph(1, 3)})
                ntools = r.choices((1, 2, 3, 4), (70, 18, 8, 4))[0]
                names = r.choices([n for n, _ in TOOL_WEIGHTS], [w for _, w in TOOL_WEIGHTS], k=ntools)
                calls = []
                # The first full prompt snapshot of a process (~57 KB) follows these results.
                step_bytes = 0 if self.proc["snapshot_full"] else 57_000
                for name in names:
                    remaining = budget - used - step_bytes
                    if calls and remaining < 8_000:
                        break
                    self.room = max(remaining, 4_000)
                    big = 0
                    # Outputs are stored twice (tool_result and toolUseResult): keep a large
                    # one within a sixth of what the turn may still use.
                    if name in ("Bash", "Read", "Grep") and r.random() < 0.035 and not calls:
                        big = min(int(r.uniform(20_000, 200_000)), remaining // 6)
                        if big < 20_000:
                            big = 0
                    inp, res = self.make_tool(name, big)
                    tid = "toolu_01" + self.b62(22)
                    blocks.append({"type": "tool_use", "id": tid, "name": name, "input": inp})
                    calls.append((tid, name, res, big))
                    step_bytes += 2 * len(res["content"]) + 2 * len(dumps(inp))
                self.book({"type": "tools-used", "tools": sorted({c[1] for c in calls}), "sessionId": self.sid})
            uuids = self.assistant(blocks, "end_turn" if final else "tool_use", new_tokens, req)
            self.last_prompt(prompt)
            if final:
                break
            new_tokens = 0
            tool_uuids = uuids[-len(calls):]
            for (tid, name, res, big), src in zip(calls, tool_uuids):
                self.now += res["ms"]
                self.proc["tool_ms"] += res["ms"]
                block = {"tool_use_id": tid, "type": "tool_result", "content": res["content"]}
                if res["is_error"]:
                    block["is_error"] = True
                    self.stats["tool_errors"] += 1
                else:
                    block["is_error"] = False
                self.chained({"promptId": self.proc["prompt_id"], "type": "user",
                              "message": {"role": "user", "content": [block]},
                              "_after": {"toolUseResult": res["tur"], "sandboxed": False,
                                         "sourceToolAssistantUUID": src,
                                         "permissionDecision": {"decision": "accept", "source": "config",
                                                                "reasonType": "rule", "ruleSource": "cliArg"}}},
                             5, 200)
                self.stats["messages"] += 1
                self.stats["tool_calls"] += 1
                self.tool_counts[name] = self.tool_counts.get(name, 0) + 1
                self.msgs_in_ctx += 1
                if big:
                    self.stats["large_outputs"] += 1
                if res.get("edited"):
                    self.file_history(prompt_uuid, update=True)
                new_tokens += tokens_of(res["content"]) + 20
            if not self.proc["snapshot_full"]:
                self.prompt_snapshot(full=True)
        if not self.proc["snapshot_full"]:
            self.prompt_snapshot(full=True)
            self.last_prompt(prompt)

    def final_text(self, fill: int) -> str:
        r, t = self.rng, self.text
        if fill > 0:
            return t.prose(max(80, min(fill, 36_000)))
        parts = [r.choice(("Done.", "Fixed.", "Here's what I found.", "Summary of the changes:",
                           "The tests pass now.", "Short answer: yes.", "I couldn't reproduce it, but:"))]
        k = r.random()
        if k < 0.5:
            parts.append("\n".join(f"- `{r.choice(t.files)}`: {t.sentence()}" for _ in range(r.randint(1, 6))))
        if k > 0.3:
            parts.append(t.paragraph(1, 5))
        if r.random() < 0.25:
            parts.append(t.code_block())
        if r.random() < 0.1:
            parts.append("| figure | before | after |\n|---|---|---|\n" + "\n".join(
                f"| {r.choice(NOUNS)} | {r.uniform(1, 900):.1f} ms | {r.uniform(1, 900):.1f} ms |" for _ in range(r.randint(2, 6))))
        return "\n\n".join(parts)

    # -- the whole session -------------------------------------------------------------

    def run(self) -> None:
        r = self.rng
        target = self.target
        prompts_left = 0
        turns_since_compact = 0
        while True:
            remaining = target - self.nbytes
            if self.proc is None or prompts_left == 0:
                # A new process re-writes ~150 KB of envelope; only start one when it fits,
                # otherwise the current process takes the remaining prompts.
                if self.proc is None or remaining > 400_000:
                    if self.proc is not None:
                        self.end_process()
                    self.now += r.randint(60_000, 8 * 3_600_000)
                    self.start_process()
                    prompts_left = r.choice((1, 1, 2, 2, 3, 3, 4, 5, 6, 7))
                else:
                    prompts_left = 10 ** 9
            if (self.compact_every and turns_since_compact >= self.compact_every
                    and remaining > 60_000):
                self.compact()
                turns_since_compact = 0
            remaining = target - self.nbytes
            last = remaining < 40_000 and self.stats["turns"] > 0
            # Leave room for a closing turn, which fills what is left with one answer.
            self.turn(budget=max(2_000, min(remaining - 20_000, int(r.uniform(15_000, 260_000)))) if not last
                      else remaining - 3_000, last=last)
            prompts_left -= 1
            turns_since_compact += 1
            if last or self.nbytes >= target:
                break
        self.end_process()


# == 5. Entry points ========================================================================

def generate(path: str, size_mb: float = 14, seed: int = 1, *, session_id: str | None = None,
             cwd: str = DEFAULT_CWD, git_branch: str = "main", thinking: bool = False,
             compact_every: int | None = None, entrypoint: str = "sdk-cli", model: str = MODEL) -> dict:
    """Write a transcript of about size_mb MiB to path; return figures about it.

    The figures: turns (human prompts), records (lines), messages (prompts, assistant
    responses counted once per message.id, tool results and compact summaries),
    assistant_messages, tool_calls, tool_errors, large_outputs, api_requests, processes,
    compactions, bytes, bookkeeping_bytes, final_context_tokens, tool_counts, seconds."""
    t0 = time.perf_counter()
    s = Session(seed, int(size_mb * MIB), session_id, cwd, git_branch, thinking, compact_every,
                entrypoint, model)
    s.run()
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.writelines(s.lines)
    os.replace(tmp, path)
    stats = dict(s.stats)
    stats.update({"bytes": s.nbytes, "bookkeeping_bytes": s.bookkeeping_bytes,
                  "final_context_tokens": s.context, "session_id": s.sid, "cwd": cwd,
                  "tool_counts": dict(sorted(s.tool_counts.items())), "seed": seed,
                  "generator_version": GENERATOR_VERSION,
                  "seconds": round(time.perf_counter() - t0, 3)})
    return stats


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Generate a realistic Claude Code 2.1.328 transcript (JSONL).")
    ap.add_argument("--out", required=True, help="output file")
    ap.add_argument("--size-mb", type=float, default=14, help="target size in MiB (default 14)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--session-id", help="session uuid (default: derived from the seed)")
    ap.add_argument("--cwd", default=DEFAULT_CWD, help="project directory recorded in the transcript")
    ap.add_argument("--git-branch", default="main")
    ap.add_argument("--thinking", action="store_true", help="include signed thinking blocks")
    ap.add_argument("--compact-every", type=int, metavar="N", help="native compaction every N prompts")
    ap.add_argument("--entrypoint", default="sdk-cli")
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    stats = generate(a.out, a.size_mb, a.seed, session_id=a.session_id, cwd=a.cwd, git_branch=a.git_branch,
                     thinking=a.thinking, compact_every=a.compact_every, entrypoint=a.entrypoint, model=a.model)
    if not a.quiet:
        print(json.dumps(stats, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
