"""The support escalation's model: each answer depends on the request only (which step asks, which turn
of its conversation), so a run in a worker, a run taken over after a kill and a memory:// run in this
process get the same answers and must record the same tapes. Served through litellm's real HTTP client
by ``tests/outsider_model33/model33_stub.RoutedStub`` (the stub server of tests/stub_llm.py answering
from the request rather than from a queue)."""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

from tests.outsider_model33.model33_stub import RoutedStub, Scripted, completion_of, tool_call, tool_turn
from tests.stub_llm import Reply

# long enough that classify's HISTORY crosses its compressTokenThreshold by the second round
TRIAGE = ("The customer reports that the invoice export fails with a timeout on large accounts; "
          "the logs show retries against the billing API, a stale cache and two earlier tickets "
          "about the same export. ") * 2

AGENT_TURNS = [
    [tool_call("i1", "context_inspect", {"layers": ["L3"], "metrics": ["token_count", "top_keys"]})],
    [tool_call("c1", "context_compress", {"action": "compress", "preserve_keys": ["severity"]})],
]


def round_of(body: dict[str, Any]) -> int:
    """The round the request is made in: the ``reopen_count`` its context shows (0 before any reopen)."""
    found = re.findall(r"reopen_count\D{0,40}?(\d+)", json.dumps(body["messages"]))
    return int(found[-1]) if found else 0


def answers() -> dict[str, Any]:
    def reply(value: Any) -> Any:
        return lambda body: {"content": value if isinstance(value, str) else json.dumps(value)}
    return {
        "classify": reply({"severity": "high", "sla_hours": 8, "draft_reply": "We are on it.", "triage_notes": TRIAGE}),
        "tools": lambda body: tool_turn(body, AGENT_TURNS, {"content": json.dumps(
            {"resolution": f"refund-r{round_of(body)}", "agent_notes": "refund the failed export fee"})}),
        # the model is unsure: a person decides, offered the model's suggestion
        "conflict": reply({"final_value": "refund", "rationale": "the agent's proposal", "escalate": True}),
        "summary": reply("Export timeouts on large accounts."),
    }


class SupportStub(RoutedStub):
    """The stub server; ``hold(kind)`` makes the next request of that kind wait until ``release()``
    (a worker killed while it waits for the model)."""

    def __init__(self) -> None:
        super().__init__(Scripted(answers()))
        self._hold_kind: str | None = None
        self.held = threading.Event()
        self._release = threading.Event()

    def hold(self, kind: str) -> None:
        self._hold_kind, self._release = kind, threading.Event()
        self.held.clear()

    def release(self) -> None:
        self._release.set()

    def _next(self, body: dict[str, Any]) -> Reply:
        from tests.outsider_model33.model33_stub import kind_of
        if self._hold_kind is not None and kind_of(body) == self._hold_kind:
            self._hold_kind = None
            self.held.set()
            self._release.wait(30)
            time.sleep(0)
        return super()._next(body)


def fake_completion(scripted: Scripted) -> Any:
    """litellm's ``completion`` answered in this process, as the stub server answers it (the same ids and
    usage): for a test process that drives the CLI beside real workers, without importing litellm (seconds)
    a third time; the workers reach the stub server through litellm's real client."""
    served = [0]

    def completion(**kwargs: Any) -> dict[str, Any]:
        served[0] += 1
        return completion_of(kwargs, scripted.answer, f"chatcmpl-{served[0]}",
                             {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18})
    return completion
