"""The benchmark transcript generator (scripts/gen_transcript.py) writes what Claude Code writes.

Small files (0.5 MiB) keep these fast; the properties checked are the ones the benchmarks
and the capture code rely on: same seed gives the same bytes, every line is JSON, the uuid
chain is whole, tool calls and results pair up, and one API response is one message.id.
"""

from __future__ import annotations

import json
import sys
import tempfile
import unittest
from collections import Counter
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

import gen_transcript  # noqa: E402

SIZE_MB = 0.5


def _load(path: Path) -> tuple[bytes, list[dict]]:
    data = path.read_bytes()
    return data, [json.loads(line) for line in data.decode("utf-8").splitlines()]


class GeneratedTranscript(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory()
        tmp = Path(cls._tmp.name)
        cls.path = tmp / "plain.jsonl"
        cls.stats = gen_transcript.generate(str(cls.path), SIZE_MB, seed=3)
        cls.raw, cls.records = _load(cls.path)
        cls.rich_path = tmp / "rich.jsonl"
        cls.rich_stats = gen_transcript.generate(str(cls.rich_path), SIZE_MB, seed=11, thinking=True,
                                                 compact_every=2)
        cls.rich_raw, cls.rich_records = _load(cls.rich_path)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def each(self):
        yield "plain", self.raw, self.records
        yield "thinking+compact", self.rich_raw, self.rich_records

    def test_same_seed_same_bytes(self):
        again = Path(self._tmp.name) / "again.jsonl"
        gen_transcript.generate(str(again), SIZE_MB, seed=3)
        self.assertEqual(again.read_bytes(), self.raw)
        other = Path(self._tmp.name) / "other.jsonl"
        gen_transcript.generate(str(other), SIZE_MB, seed=4)
        self.assertNotEqual(other.read_bytes(), self.raw)

    def test_command_line_matches_function(self):
        out = Path(self._tmp.name) / "cli.jsonl"
        rc = gen_transcript.main(["--out", str(out), "--size-mb", str(SIZE_MB), "--seed", "3", "--quiet"])
        self.assertEqual(rc, 0)
        self.assertEqual(out.read_bytes(), self.raw)

    def test_every_line_is_json_object(self):
        for label, raw, records in self.each():
            with self.subTest(label):
                self.assertTrue(raw.endswith(b"\n"))
                lines = raw.decode("utf-8").split("\n")[:-1]
                self.assertEqual(len(lines), len(records))
                for line in lines:
                    self.assertIsInstance(json.loads(line), dict)
                    self.assertIn("type", json.loads(line))

    def test_size_within_ten_percent(self):
        for label, raw in (("plain", self.raw), ("thinking+compact", self.rich_raw)):
            with self.subTest(label):
                want = SIZE_MB * gen_transcript.MIB
                self.assertLess(abs(len(raw) - want) / want, 0.10, len(raw))
        self.assertEqual(self.stats["bytes"], len(self.raw))

    def test_chain_intact(self):
        for label, _, records in self.each():
            with self.subTest(label):
                seen: set[str] = set()
                roots = 0
                for rec in records:
                    if "uuid" not in rec:
                        self.assertNotIn("parentUuid", rec)
                        continue
                    self.assertNotIn(rec["uuid"], seen)
                    parent = rec["parentUuid"]
                    if parent is None:
                        roots += 1
                        if roots > 1:   # only a compaction starts a new root
                            self.assertEqual(rec.get("subtype"), "compact_boundary")
                            self.assertIn(rec["logicalParentUuid"], seen)
                    else:
                        self.assertIn(parent, seen)
                    seen.add(rec["uuid"])

    def test_timestamps_parse_and_increase(self):
        for label, _, records in self.each():
            with self.subTest(label):
                last = None
                for rec in records:
                    if "timestamp" not in rec:
                        continue
                    ts = datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00"))
                    if last is not None:
                        self.assertGreater(ts, last)
                    last = ts

    def test_tool_calls_and_results_pair_once(self):
        for label, _, records in self.each():
            with self.subTest(label):
                calls: dict[str, int] = {}
                results: Counter = Counter()
                for i, rec in enumerate(records):
                    content = rec.get("message", {}).get("content")
                    if not isinstance(content, list):
                        continue
                    for block in content:
                        if block.get("type") == "tool_use":
                            self.assertNotIn(block["id"], calls)
                            calls[block["id"]] = i
                        elif block.get("type") == "tool_result":
                            tid = block["tool_use_id"]
                            self.assertIn(tid, calls, "result before its call")
                            self.assertLess(calls[tid], i)
                            results[tid] += 1
                            self.assertIn("toolUseResult", rec)
                self.assertEqual(set(calls), set(results))
                self.assertEqual(set(results.values()), {1})
                self.assertGreater(len(calls), 10)

    def test_records_of_one_response_share_id_and_usage(self):
        for label, _, records in self.each():
            with self.subTest(label):
                groups: dict[str, list[int]] = {}
                for i, rec in enumerate(records):
                    if rec.get("type") == "assistant":
                        groups.setdefault(rec["message"]["id"], []).append(i)
                self.assertTrue(any(len(g) > 1 for g in groups.values()))
                for ids in groups.values():
                    first = records[ids[0]]
                    for i in ids:
                        rec = records[i]
                        self.assertEqual(rec["message"]["usage"], first["message"]["usage"])
                        self.assertEqual(rec["requestId"], first["requestId"])
                        self.assertEqual(len(rec["message"]["content"]), 1)
                        self.assertEqual(rec["message"]["model"], first["message"]["model"])
                    # Consecutive on the chain: nothing but bookkeeping between them.
                    between = [records[j] for j in range(ids[0], ids[-1] + 1) if "uuid" in records[j]]
                    self.assertTrue(all(r.get("type") == "assistant" for r in between))
                    self.assertEqual([records[i]["apiBlockIndex"] for i in ids], list(range(len(ids))))

    def test_usage_grows_until_compaction(self):
        usage_totals = []
        for rec in self.records:
            if rec.get("type") == "assistant":
                u = rec["message"]["usage"]
                usage_totals.append(u["input_tokens"] + u["cache_creation_input_tokens"]
                                    + u["cache_read_input_tokens"])
        self.assertEqual(usage_totals, sorted(usage_totals))
        self.assertGreater(usage_totals[-1], usage_totals[0] * 2)
        stops = {r["message"]["stop_reason"] for r in self.records if r.get("type") == "assistant"}
        self.assertEqual(stops, {"tool_use", "end_turn"})

    def test_content_looks_like_a_real_session(self):
        types = Counter(r["type"] for r in self.records)
        for t in ("queue-operation", "attachment", "api-request-shape", "api-request-blob", "api-request",
                  "last-prompt", "cost-state", "file-history-snapshot", "user", "assistant"):
            self.assertIn(t, types)
        tools = Counter(b["name"] for r in self.records if r.get("type") == "assistant"
                        for b in r["message"]["content"] if b["type"] == "tool_use")
        self.assertGreaterEqual(len(tools), 4, tools)
        text = self.raw.decode("utf-8")
        self.assertTrue(any(ord(ch) > 127 for ch in text))
        # Varied text: many distinct assistant text blocks, not one repeated string.
        texts = [b["text"] for r in self.records if r.get("type") == "assistant"
                 for b in r["message"]["content"] if b["type"] == "text"]
        self.assertGreater(len(set(texts)), 0.9 * len(texts))
        for rec in self.records:
            if "uuid" in rec:
                self.assertEqual(rec["version"], "2.1.328")
                self.assertEqual(rec["sessionId"], self.stats["session_id"])

    def test_thinking_and_compaction(self):
        recs = self.rich_records
        thinking = [b for r in recs if r.get("type") == "assistant" for b in r["message"]["content"]
                    if b["type"] == "thinking"]
        self.assertTrue(thinking)
        self.assertTrue(all(b["signature"] for b in thinking))
        boundaries = [i for i, r in enumerate(recs) if r.get("subtype") == "compact_boundary"]
        self.assertTrue(boundaries)
        self.assertEqual(len(boundaries), self.rich_stats["compactions"])
        for i in boundaries:
            chained_after = next(r for r in recs[i + 1:] if "uuid" in r)
            self.assertTrue(chained_after.get("isCompactSummary"))
            self.assertEqual(chained_after["parentUuid"], recs[i]["uuid"])
        self.assertFalse(any(b["type"] == "thinking" for r in self.records if r.get("type") == "assistant"
                             for b in r["message"]["content"]))


if __name__ == "__main__":
    unittest.main()
