"""A scriptable OpenAI-compatible chat server on 127.0.0.1 for tests of the real client path.

::

    with StubLLM() as stub:
        stub.push(Reply.json({"risk": "low"}), Reply.error(500), Reply.sleep(2.0, Reply.text("late")))
        litellm.completion(model="openai/stub", api_base=stub.url, api_key="test", messages=[...])
        stub.requests  # the JSON bodies received, in order

Replies are consumed in order; when the script is empty ``default`` answers (an HTTP
500 naming the exhausted script, unless set). Every request is recorded, including
the ones answered late or with an error.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["Reply", "StubLLM"]


@dataclass(frozen=True)
class Reply:
    """One scripted answer: a chat completion with ``content``, or an HTTP error."""

    content: str | None = None
    status: int = 200
    delay: float = 0.0
    body: str | None = None  # raw body, overrides everything else
    finish_reason: str = "stop"  # "length": the reply was cut at max_tokens
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (Retry-After, ...)
    usage: dict[str, int] | None = field(default_factory=lambda: {"prompt_tokens": 11, "completion_tokens": 7,
                                                                  "total_tokens": 18})  # None: no usage sent
    tool_calls: tuple[dict[str, Any], ...] = ()  # OpenAI tool calls (``Reply.calls``)

    @classmethod
    def json(cls, value: Any, **kw: Any) -> "Reply":
        return cls(content=json.dumps(value), **kw)

    @classmethod
    def text(cls, content: str, **kw: Any) -> "Reply":
        return cls(content=content, **kw)

    @classmethod
    def calls(cls, *calls: tuple[str, Any], **kw: Any) -> "Reply":
        """A turn of tool calls: ``(name, arguments)`` pairs, arguments a JSON value or the raw text sent."""
        made = tuple({"id": f"call_{n}", "type": "function",
                      "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args)}}
                     for n, (name, args) in enumerate(calls))
        return cls(content=None, tool_calls=made, finish_reason="tool_calls", **kw)

    @classmethod
    def error(cls, status: int = 500, message: str = "stub failure", **kw: Any) -> "Reply":
        return cls(status=status, body=json.dumps({"error": {"message": message, "type": "server_error",
                                                             "code": status}}), **kw)

    @classmethod
    def sleep(cls, seconds: float, then: "Reply | None" = None) -> "Reply":
        then = then or cls.text("{}")
        return replace(then, delay=seconds)


class StubLLM:
    def __init__(self, default: Reply | None = None, model: str = "stub-model") -> None:
        self.script: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default = default or Reply.error(500, "stub script exhausted")
        self.model = model
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def push(self, *replies: Reply) -> "StubLLM":
        with self._lock:
            self.script.extend(replies)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start the stub first (use it as a context manager)"
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
            return self.script.popleft() if self.script else self.default

    def start(self) -> "StubLLM":
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {"_raw": raw.decode("utf-8", "replace")}
                body["_path"] = self.path
                reply = stub._next(body)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.body is not None:
                    payload = reply.body.encode()
                else:
                    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
                    if reply.tool_calls:
                        message["tool_calls"] = list(reply.tool_calls)
                    completion = {
                        "id": f"chatcmpl-stub-{len(stub.requests)}",
                        "object": "chat.completion",
                        "created": 1700000000,
                        "model": body.get("model", stub.model),
                        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
                    }
                    if reply.usage is not None:
                        completion["usage"] = reply.usage
                    payload = json.dumps(completion).encode()
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers:
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="stub-llm", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "StubLLM":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
