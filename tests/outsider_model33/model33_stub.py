"""One scripted model for the grant review, served two ways: as a deterministic fake completion
(engine.llm.load_litellm patched) and through litellm's real HTTP client by ``RoutedStub``, a
``tests/stub_llm.StubLLM`` that answers each request from what it asks rather than from a queue.

The answer depends on the request only (which call it is, which turn of the conversation), so two
runs get the same answers and must send the same bytes."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from tests.stub_llm import Reply, StubLLM

Answer = dict[str, Any]  # {"content": str | None, "tool_calls": [...] | None}


def tool_call(cid: str, name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": text}}


def kind_of(body: dict[str, Any]) -> str:
    messages = body["messages"]
    last = str(messages[-1].get("content") or "")
    if "<entries><![CDATA[" in last:
        return "summary"
    if "Which branch of gateway" in str(messages[1].get("content") if len(messages) > 1 else ""):
        return "condition"
    if "Resolve this conflict on key" in str(messages[1].get("content") if len(messages) > 1 else ""):
        return "conflict"
    if body.get("tools"):
        return "tools"
    user = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
    found = re.search(r'<task activity="([^"]+)"', user)
    return found.group(1) if found else "unknown"


def tool_turn(body: dict[str, Any], script: list[list[dict[str, Any]]], final: Answer) -> Answer:
    """The model's turn number n (the count of assistant turns so far) calls ``script[n]``'s tools;
    after the script, the final answer."""
    turns = sum(1 for m in body["messages"] if m.get("role") == "assistant" and m.get("tool_calls"))
    if turns < len(script):
        return {"content": None, "tool_calls": script[turns]}
    return final


class Scripted:
    """The model's answers by request kind; ``on(kind, fn)`` replaces one."""

    def __init__(self, answers: dict[str, Callable[[dict[str, Any]], Answer]]) -> None:
        self.answers = dict(answers)
        self.requests: list[dict[str, Any]] = []

    def answer(self, body: dict[str, Any]) -> Answer:
        self.requests.append(body)
        kind = kind_of(body)
        fn = self.answers.get(kind)
        if fn is None:
            raise AssertionError(f"no scripted answer for a {kind} request: {json.dumps(body)[:600]}")
        return fn(body)

    # the fake completion: litellm.completion's keyword arguments in, an OpenAI-shaped dict out
    def completion(self, **kwargs: Any) -> dict[str, Any]:
        return completion_of(kwargs, self.answer, f"fake-{len(self.requests) + 1}",
                             {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})


def completion_of(kwargs: dict[str, Any], answer: Callable[[dict[str, Any]], Answer], cid: str,
                  usage: dict[str, int]) -> dict[str, Any]:
    """What litellm.completion returns for its keyword arguments ``kwargs`` when the model answers
    as ``answer`` does (tool calls included), as an OpenAI-shaped dict with id ``cid``."""
    body = {k: v for k, v in kwargs.items() if k in ("model", "messages", "tools", "tool_choice", "max_tokens")}
    got = answer(json.loads(json.dumps(body)))
    message = {"role": "assistant", "content": got.get("content")}
    if got.get("tool_calls"):
        message["tool_calls"] = got["tool_calls"]
    return {"id": cid, "object": "chat.completion", "created": 1700000000, "model": kwargs.get("model"),
            "choices": [{"index": 0, "message": message,
                         "finish_reason": "tool_calls" if got.get("tool_calls") else "stop"}],
            "usage": usage}


class RoutedStub(StubLLM):
    """The stub server answering each request with ``scripted.answer`` (tool calls included)."""

    def __init__(self, scripted: Scripted) -> None:
        super().__init__()
        self.scripted = scripted

    def _next(self, body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(body)
        clean = {k: v for k, v in body.items() if k != "_path"}
        got = self.scripted.answer(clean)
        message = {"role": "assistant", "content": got.get("content")}
        if got.get("tool_calls"):
            message["tool_calls"] = got["tool_calls"]
        return Reply(body=json.dumps({
            "id": f"chatcmpl-{len(self.requests)}", "object": "chat.completion", "created": 1700000000,
            "model": body.get("model"), "choices": [{"index": 0, "message": message,
            "finish_reason": "tool_calls" if got.get("tool_calls") else "stop"}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}))
