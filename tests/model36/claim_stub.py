"""``ClaimStub``: the stub server of tests/stub_llm.py answering each request from a queue of its kind
(``conflict``, ``summary``, or the activity the request is for), so a test scripts only the calls it is
about; a kind whose queue is empty answers its ``defaults`` reply."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

from tests.stub_llm import Reply, StubLLM


def kind_of(body: dict[str, Any]) -> str:
    messages = body.get("messages") or []
    text = [str(m.get("content") or "") for m in messages]
    if len(text) > 1 and text[1].startswith("Resolve this conflict on key"):
        return "conflict"
    if any(t.startswith("Summarize the context entries below") for t in text):  # a corrective turn may follow
        return "summary"
    found = next((re.search(r'<task activity="([^"]+)"', t) for t in text if '<task activity="' in t), None)
    return found.group(1) if found else "unknown"


class ClaimStub(StubLLM):
    def __init__(self, defaults: dict[str, Reply]) -> None:
        super().__init__()
        self.defaults = dict(defaults)
        self.queues: dict[str, deque[Reply]] = {}

    def on(self, kind: str, *replies: Reply) -> "ClaimStub":
        with self._lock:
            self.queues.setdefault(kind, deque()).extend(replies)
        return self

    def kinds(self) -> list[str]:
        return [kind_of(b) for b in self.requests]

    def _next(self, body: dict[str, Any]) -> Reply:
        kind = kind_of(body)
        with self._lock:
            self.requests.append(body)
            queue = self.queues.get(kind)
            if queue:
                return queue.popleft()
            return self.defaults.get(kind, self.default)
