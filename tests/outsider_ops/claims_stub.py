"""A model for the ops-claims process: tests/stub_llm.py's server, answering by what it is asked.

``python tests/outsider_ops/claims_stub.py PORTFILE [fail]`` serves it on 127.0.0.1 (a free port,
written to PORTFILE) until killed; ``fail`` answers every request with HTTP 500.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stub_llm import Reply, StubLLM  # noqa: E402


def answer(body: dict[str, Any]) -> Reply:
    """What the claims team's model says: route to the checks, a fraud payout of 4200, a
    conflict it is unsure about (escalated), summaries kept short."""
    text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
    if "You route a business process" in text:
        return Reply.json({"branch": "checks_split", "rationale": "large water claim"})
    if "You resolve a conflict" in text:
        return Reply.json({"final_value": 4200, "rationale": "the fraud review is stricter", "escalate": True})
    if "Decide how urgent" in text:
        # a claim numbered SLOW-... keeps the model busy: time to kill the worker waiting for it
        return Reply.json({"priority": "urgent"}, delay=4.0 if "SLOW-" in text else 0.0)
    if "Review the claim for fraud" in text:
        return Reply.json({"payout": 4200, "fraud_note": "model: no indicators"})
    if "Classify the claim" in text and "ASK-" in text and '"role": "tool"' not in json.dumps(body):
        return ask_a_person("Is the water damage from a burst pipe?", ["yes", "no"])
    if "Classify the claim" in text:
        return Reply.json({"category": "water", "severity": "high"})
    return Reply.text("summary")


def ask_a_person(message: str, options: list[str]) -> Reply:
    """A reply that calls the ``human_confirm`` tool (a claim numbered ASK-... asks first)."""
    call = {"id": "call_ask", "type": "function", "function": {"name": "human_confirm", "arguments": json.dumps(
        {"message": message, "options": [{"label": o, "value": o} for o in options]})}}
    return Reply(body=json.dumps({
        "id": "chatcmpl-ask", "object": "chat.completion", "created": 1700000000, "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                     "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}))


class ClaimsStub(StubLLM):
    def __init__(self, fail: bool = False, fail_on: tuple[str, ...] = ()) -> None:
        super().__init__()
        self.fail = fail
        self.fail_on = fail_on  # fail the requests whose messages hold one of these texts

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
        text = json.dumps(body)
        if self.fail or any(marker in text for marker in self.fail_on):
            return Reply.error(500, "stub is down")
        return answer(body)


if __name__ == "__main__":
    import time

    stub = ClaimsStub(fail=len(sys.argv) > 2 and sys.argv[2] == "fail").start()
    Path(sys.argv[1]).write_text(stub.url)
    while True:
        time.sleep(3600)
