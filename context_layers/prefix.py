"""Prefix stability: how much of each request a provider's prompt cache could reuse.

A provider caches the longest token prefix a request shares with an earlier one (of
the same model and settings). ``prefix_stability`` measures, for each request, the
share of its tokens that is a prefix of the previous request to the same agent, and
averages it over the run:

* requests are serialised with ``request_text`` (ChatML-like role markers, as chat
  templates do) and tokenised with tiktoken; the shared prefix is counted in whole
  tokens (the longest run of equal leading tokens), which is what a KV cache reuses
  and never more than the byte-identical prefix;
* the first request of each agent has nothing to share with and is excluded from the
  average (``first="zero"`` counts it as 0 instead); a run with no comparable request
  scores 1.0 (nothing was re-sent, nothing was missed).

``sliding_window_trim`` is the baseline most frameworks use (drop the oldest messages
until the request fits the budget), kept here so the bench measures both the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .context import Entry
from .layers import Layer
from .tokens import DEFAULT_ENCODING, count_text, count_value, encoding as get_encoding

__all__ = [
    "PrefixPoint",
    "common_prefix_tokens",
    "prefix_report",
    "prefix_stability",
    "request_text",
    "sliding_window_trim",
]

Messages = Sequence[Mapping[str, Any]]
T = TypeVar("T")


def request_text(messages: Messages) -> str:
    """The text a chat template would make of ``messages`` (what caches key on)."""
    parts = []
    for m in messages:
        content = m.get("content")
        if not isinstance(content, str):
            from .canonical import canonical_json

            content = canonical_json(content)
        parts.append(f"<|im_start|>{m.get('role', '')}\n{content}<|im_end|>\n")
    return "".join(parts)


def _tokens(text: str, enc: str) -> list[int]:
    return list(get_encoding(enc).encode(text, disallowed_special=()))


def _lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_prefix_tokens(a: Messages | str, b: Messages | str, encoding: str = DEFAULT_ENCODING) -> int:
    """Leading tokens two requests share."""
    ta = _tokens(a if isinstance(a, str) else request_text(a), encoding)
    tb = _tokens(b if isinstance(b, str) else request_text(b), encoding)
    return _lcp(ta, tb)


@dataclass(frozen=True, slots=True)
class PrefixPoint:
    """One request of a run: its agent, size, and what it shares with the agent's previous one."""

    index: int
    agent: Hashable
    tokens: int
    prefix_tokens: int
    previous: int | None  # index of the previous request of the same agent

    @property
    def share(self) -> float | None:
        if self.previous is None:
            return None
        return self.prefix_tokens / self.tokens if self.tokens else 1.0


KeyArg = Callable[[Messages], Hashable] | Sequence[Hashable] | None


def _agents(requests: Sequence[Messages], key: KeyArg) -> list[Hashable]:
    if key is None:
        return ["" for _ in requests]
    if callable(key):
        return [key(r) for r in requests]
    agents = list(key)
    if len(agents) != len(requests):
        raise ValueError(f"prefix_stability got {len(agents)} agent keys for {len(requests)} requests")
    return agents


def prefix_report(requests: Sequence[Messages], key: KeyArg = None, *,
                  encoding: str = DEFAULT_ENCODING) -> list[PrefixPoint]:
    """Per-request prefix figures. ``key`` names each request's agent: a function of the
    request, or a list parallel to ``requests``; ``None`` puts every request in one stream."""
    last: dict[Hashable, tuple[int, list[int]]] = {}
    points = []
    for i, (request, agent) in enumerate(zip(requests, _agents(requests, key))):
        toks = _tokens(request_text(request), encoding)
        prev = last.get(agent)
        shared = _lcp(prev[1], toks) if prev else 0
        points.append(PrefixPoint(i, agent, len(toks), shared, prev[0] if prev else None))
        last[agent] = (i, toks)
    return points


def prefix_stability(requests: Sequence[Messages], key: KeyArg = None, *,
                     first: Literal["exclude", "zero"] = "exclude", weighted: bool = False,
                     encoding: str = DEFAULT_ENCODING) -> float:
    """Mean share of each request's tokens that prefix the agent's previous request (see module doc).

    ``weighted=True``: total shared tokens / total tokens instead (the cache hit rate by
    tokens, which is what input cost follows; large requests count more).
    """
    if first not in ("exclude", "zero"):
        raise ValueError(f"first must be 'exclude' or 'zero', got {first!r}")
    points = [p for p in prefix_report(requests, key, encoding=encoding)
              if p.share is not None or first == "zero"]
    if not points:
        return 1.0
    if weighted:
        total = sum(p.tokens for p in points)
        return sum(p.prefix_tokens for p in points if p.share is not None) / total if total else 1.0
    return sum(p.share if p.share is not None else 0.0 for p in points) / len(points)


def _is_message(x: Any) -> bool:
    return isinstance(x, Mapping) and "role" in x


def sliding_window_trim(items: Sequence[T], budget: int, *,
                        count: Callable[[Sequence[T]], int] | None = None) -> list[T]:
    """Drop the oldest items until ``count(items) <= budget`` (the usual framework trimmer).

    Messages: leading system messages and the last message are kept; the default count
    is the request's tokens. Entries: only HISTORY entries are dropped, oldest first; the
    default count is HISTORY + WORKING value tokens, the measure compression thresholds
    use. Anything else: dropped from the front, ``count`` required.
    """
    out = list(items)
    if not out:
        return out
    if all(_is_message(x) for x in out):
        measure = count or (lambda msgs: count_text(request_text(msgs)))  # type: ignore[arg-type]
        keep_head = 0
        while keep_head < len(out) and out[keep_head]["role"] == "system":  # type: ignore[index]
            keep_head += 1
        while measure(out) > budget and len(out) - keep_head > 1:
            del out[keep_head]
        return out
    if all(isinstance(x, Entry) for x in out):
        entries: list[Entry] = out  # type: ignore[assignment]
        if count is not None:
            history = sorted((e for e in entries if e.layer == Layer.HISTORY), key=lambda e: e.order)
            dropped: set[int] = set()
            while history and count([e for e in entries if id(e) not in dropped]) > budget:  # type: ignore[misc]
                dropped.add(id(history.pop(0)))
            return [e for e in entries if id(e) not in dropped]  # type: ignore[misc]
        total = sum(count_value(e.value) for e in entries if e.layer in (Layer.HISTORY, Layer.WORKING))
        history = sorted((e for e in entries if e.layer == Layer.HISTORY), key=lambda e: e.order)
        dropped = set()
        for e in history:
            if total <= budget:
                break
            dropped.add(id(e))
            total -= count_value(e.value)
        return [e for e in entries if id(e) not in dropped]  # type: ignore[misc]
    if count is None:
        raise TypeError("sliding_window_trim needs count= for items that are neither messages nor entries")
    while out and count(out) > budget:
        out.pop(0)
    return out
