#!/usr/bin/env python3
"""A fake Anthropic Messages API for driving the real Claude Code CLI in tests (stdlib only).

    with FakeAPI() as api:                       # listens on 127.0.0.1, a free port
        env["ANTHROPIC_BASE_URL"] = api.url
        api.script([tool_use_reply("Bash", {"command": "echo hi"}), "All done."])
        ...run claude...
        api.requests[-1]["body"]["messages"]    # what the CLI sent
        api.requests[-1]["session_id"]          # its x-claude-code-session-id header

Replies are taken from a queue (``script`` replaces it, ``push`` appends). When the queue
is empty, ``api.responder(body)`` is asked if set (returning None means "no opinion"), and
otherwise the default reply is sent ("Hello from the fake API.").

A reply is one of:
- a string: one text block;
- a dict: ``content`` (list of blocks: ``{"type": "text", "text"}``,
  ``{"type": "thinking", "thinking", "signature"}``, ``{"type": "tool_use", "name",
  "input", "id"?}``), or the shorthand ``text``; optional ``usage`` (input_tokens,
  cache_creation_input_tokens, cache_read_input_tokens, output_tokens), ``stop_reason``
  (default ``tool_use`` when a tool_use block is present, else ``end_turn``), ``model``
  (default: the requested model), ``hold`` (a threading.Event the handler waits on before
  answering, so a test can keep a request in flight);
- an error: ``{"error": {"status": 400, "type": "invalid_request_error", "message": ...}}``,
  answered with that HTTP status and an Anthropic-shaped error body (see ``error_reply``);
- a callable ``responder(body) -> reply`` queued like any reply, to react to the request.

The CLI always asks for ``stream: true``, so the usual answer is server-sent events in the
order the real API uses; a request without ``stream`` gets the whole message as JSON.
Only POST under ``/v1/messages`` is served (``/v1/messages/count_tokens`` answers a token
count); other POSTs get 404, and GET/HEAD probes get a small 200.

Standalone: ``python3 tests/fakeapi.py --port 8765 [--reply TEXT]`` serves until ctrl-c and
logs each request to stderr.
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import sys
import threading
import time
import uuid
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import urlsplit

DEFAULT_TEXT = "Hello from the fake API."
DEFAULT_USAGE = {
    "input_tokens": 100,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 10,
}
DEFAULT_MODEL = "claude-fake-model"

Reply = Any  # str | dict | Callable[[dict], "Reply"]


# -- reply builders ---------------------------------------------------------------------

def text_reply(text: str, usage: dict | None = None, **extra: Any) -> dict:
    """A reply with one text block."""
    return {"content": [{"type": "text", "text": text}], **_usage(usage), **extra}


def tool_use_reply(name: str, input: dict, id: str | None = None, text: str | None = None,
                   usage: dict | None = None, **extra: Any) -> dict:
    """A reply that calls one tool, optionally after a text block."""
    blocks: list[dict] = [{"type": "text", "text": text}] if text else []
    blocks.append({"type": "tool_use", "name": name, "input": input,
                   **({"id": id} if id else {})})
    return {"content": blocks, **_usage(usage), **extra}


def thinking_reply(thinking: str, text: str, signature: str = "fake-signature",
                   usage: dict | None = None, **extra: Any) -> dict:
    """A reply with a signed thinking block followed by text."""
    return {"content": [{"type": "thinking", "thinking": thinking, "signature": signature},
                        {"type": "text", "text": text}], **_usage(usage), **extra}


def error_reply(status: int = 400, message: str = "prompt is too long: 250000 tokens > 200000 maximum",
                type: str = "invalid_request_error") -> dict:
    """An HTTP error answer with an Anthropic-shaped body."""
    return {"error": {"status": status, "type": type, "message": message}}


def _usage(usage: dict | None) -> dict:
    return {"usage": usage} if usage is not None else {}


# -- request helpers --------------------------------------------------------------------

def tool_results(body: dict) -> list[dict]:
    """The tool_result blocks of the last user message of a request body."""
    for message in reversed(body.get("messages", [])):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            return []
    return []


def block_text(block: dict) -> str:
    """Plain text of a content block (tool_result content may be a string or a block list)."""
    content = block.get("content", block.get("text", ""))
    if isinstance(content, str):
        return content
    return "".join(b.get("text", "") for b in content if isinstance(b, dict))


def user_texts(body: dict) -> list[str]:
    """Every text the user role carries in a request body, in order."""
    out = []
    for message in body.get("messages", []):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            out.append(content)
        elif isinstance(content, list):
            out.extend(b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text")
    return out


# -- the server -------------------------------------------------------------------------

class FakeAPI:
    """A threaded HTTP server answering like the Messages API; see the module docstring."""

    def __init__(self, default_reply: Reply = DEFAULT_TEXT, host: str = "127.0.0.1", port: int = 0,
                 log: bool = False):
        self.default_reply = default_reply
        self.responder: Callable[[dict], Reply] | None = None
        self.log = log
        self._queue: deque = deque()
        self._requests: list[dict] = []
        self._cond = threading.Condition()
        self._ids = itertools.count(1)
        self._server = ThreadingHTTPServer((host, port), _Handler)
        self._server.daemon_threads = True
        self._server.fake = self  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None

    # lifecycle
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> "FakeAPI":
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> "FakeAPI":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # scripting
    def script(self, replies: list[Reply]) -> None:
        """Replace the queue of replies."""
        with self._cond:
            self._queue = deque(replies)

    def push(self, reply: Reply) -> None:
        """Append one reply to the queue."""
        with self._cond:
            self._queue.append(reply)

    @property
    def pending(self) -> int:
        """Scripted replies not used yet."""
        with self._cond:
            return len(self._queue)

    # observation
    @property
    def requests(self) -> list[dict]:
        """A snapshot of every recorded POST: method, path, query, headers, body, session_id."""
        with self._cond:
            return list(self._requests)

    @property
    def message_requests(self) -> list[dict]:
        """Recorded requests that asked for a message (not token counting)."""
        return [r for r in self.requests if r["kind"] == "messages"]

    def wait_for_requests(self, n: int, timeout: float = 30, answered: bool = True) -> list[dict]:
        """Block until at least n message requests arrived (and were answered, unless
        answered=False, e.g. while a ``hold`` keeps one in flight); else TimeoutError."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while sum(r["kind"] == "messages" and (r["answered"] or not answered)
                      for r in self._requests) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"fake API saw {len(self._requests)} requests, wanted {n}")
                self._cond.wait(left)
            return [r for r in self._requests if r["kind"] == "messages"]

    # internals used by the handler
    def _record(self, entry: dict) -> None:
        with self._cond:
            self._requests.append(entry)
            self._cond.notify_all()

    def _answered(self, entry: dict) -> None:
        with self._cond:
            entry["answered"] = True
            self._cond.notify_all()

    def _next_reply(self, body: dict) -> dict:
        with self._cond:
            reply = self._queue.popleft() if self._queue else None
        if reply is None and self.responder is not None:
            reply = self.responder(body)
        while callable(reply):
            reply = reply(body)
        if reply is None:
            reply = self.default_reply
            while callable(reply):
                reply = reply(body)
        return normalize_reply(reply)

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}_fake{next(self._ids):04d}{uuid.uuid4().hex[:12]}"


def normalize_reply(reply: Reply) -> dict:
    """Turn the shorthand forms into {content, usage, stop_reason, ...} (or an error dict)."""
    if reply is None:
        reply = DEFAULT_TEXT
    if isinstance(reply, str):
        reply = {"text": reply}
    reply = dict(reply)
    if "error" in reply:
        return reply
    if "content" not in reply:
        reply["content"] = [{"type": "text", "text": reply.pop("text", DEFAULT_TEXT)}]
    reply["usage"] = {**DEFAULT_USAGE, **(reply.get("usage") or {})}
    if not reply.get("stop_reason"):
        has_tool = any(b.get("type") == "tool_use" for b in reply["content"])
        reply["stop_reason"] = "tool_use" if has_tool else "end_turn"
    return reply


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "FakeAnthropic/1.0"

    @property
    def fake(self) -> FakeAPI:
        return self.server.fake  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        if self.fake.log:
            sys.stderr.write("fakeapi: " + (format % args) + "\n")

    # probes
    def do_GET(self) -> None:
        self._send_json(200, {"ok": True, "fake": "anthropic"})

    def do_HEAD(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_POST(self) -> None:
        parts = urlsplit(self.path)
        raw = self._read_body()
        try:
            body = json.loads(raw) if raw.strip() else {}
        except ValueError:
            body = {"_unparsed": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in self.headers.items()}
        path = parts.path.rstrip("/")
        kind = ("count_tokens" if path == "/v1/messages/count_tokens"
                else "messages" if path == "/v1/messages" or path.startswith("/v1/messages/")
                else "other")
        entry = {"method": "POST", "path": parts.path, "query": parts.query, "headers": headers,
                 "body": body, "session_id": headers.get("x-claude-code-session-id"),
                 "kind": kind, "answered": False, "time": time.time()}
        self.fake._record(entry)
        try:
            if kind == "other":
                self._send_error(404, "not_found_error", f"Not found: {parts.path}")
            elif kind == "count_tokens":
                self._send_json(200, {"input_tokens": max(1, len(raw) // 4)})
            else:
                self._answer_message(body if isinstance(body, dict) else {})
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client gave up (e.g. the user pressed Esc)
        finally:
            self.fake._answered(entry)

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            raw = b"".join(chunks)
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            raw = gzip.decompress(raw)
        return raw

    def _answer_message(self, body: dict) -> None:
        reply = self.fake._next_reply(body)
        hold = reply.get("hold")
        if hold is not None:
            hold.wait(reply.get("hold_timeout", 60))
        if "error" in reply:
            err = reply["error"]
            self._send_error(int(err.get("status", 400)), err.get("type", "invalid_request_error"),
                             err.get("message", "error"))
            return
        message = {
            "id": reply.get("id") or self.fake._new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": reply.get("model") or body.get("model") or DEFAULT_MODEL,
            "content": [self._complete_block(b) for b in reply["content"]],
            "stop_reason": reply["stop_reason"],
            "stop_sequence": None,
            "usage": reply["usage"],
        }
        if body.get("stream"):
            self._stream(message)
        else:
            self._send_json(200, message)

    def _complete_block(self, block: dict) -> dict:
        block = dict(block)
        if block.get("type") == "tool_use":
            block.setdefault("id", self.fake._new_id("toolu"))
            block.setdefault("input", {})
        elif block.get("type") == "thinking":
            block.setdefault("signature", "fake-signature")
        return block

    def _stream(self, message: dict) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("request-id", self.fake._new_id("req"))
        self.end_headers()
        start = dict(message, content=[], stop_reason=None)
        self._event("message_start", {"type": "message_start", "message": start})
        for index, block in enumerate(message["content"]):
            for name, data in _block_events(index, block):
                self._event(name, data)
        self._event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": message["usage"]})
        self._event("message_stop", {"type": "message_stop"})
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    def _event(self, name: str, data: dict) -> None:
        payload = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
        self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
        self.wfile.flush()

    def _send_json(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("request-id", self.fake._new_id("req"))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_error(self, status: int, type: str, message: str) -> None:
        self._send_json(status, {"type": "error", "error": {"type": type, "message": message}})


def _block_events(index: int, block: dict):
    """content_block_start / delta(s) / stop for one block, as the real API splits them."""
    kind = block.get("type")
    if kind == "text":
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "text", "text": ""}}
        for piece in _pieces(block.get("text", "")):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "text_delta", "text": piece}}
    elif kind == "thinking":
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "thinking", "thinking": "",
                                                        "signature": ""}}
        for piece in _pieces(block.get("thinking", "")):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "thinking_delta", "thinking": piece}}
        yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                      "delta": {"type": "signature_delta",
                                                "signature": block["signature"]}}
    elif kind == "tool_use":
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": {"type": "tool_use", "id": block["id"],
                                                        "name": block["name"], "input": {}}}
        for piece in _pieces(json.dumps(block.get("input", {}))):
            yield "content_block_delta", {"type": "content_block_delta", "index": index,
                                          "delta": {"type": "input_json_delta",
                                                    "partial_json": piece}}
    else:  # anything else (e.g. redacted_thinking) is sent whole in the start event
        yield "content_block_start", {"type": "content_block_start", "index": index,
                                      "content_block": block}
    yield "content_block_stop", {"type": "content_block_stop", "index": index}


def _pieces(text: str, size: int = 40) -> list[str]:
    """Split text into delta-sized pieces (at least one, so empty blocks still get a delta)."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve a fake Anthropic Messages API.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--reply", default=DEFAULT_TEXT, help="text of every reply")
    args = parser.parse_args(argv)
    api = FakeAPI(default_reply=args.reply, host=args.host, port=args.port, log=True)
    print(f"fake Anthropic API on {api.url}  (ANTHROPIC_BASE_URL={api.url})", flush=True)
    try:
        api._server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        api._server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
