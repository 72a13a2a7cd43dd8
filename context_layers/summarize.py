"""Summaries for compression: the ``Summarizer`` protocol and its offline default.

The engine implements ``Summarizer`` with a model (through litellm); this package
never calls one. A model summary request should reuse the exact prefix of the
activity's normal request (same system text and history) with the summary
instruction appended at the end, so provider prompt caches can serve it:
``build_summary_request`` builds those messages from ``prefix_messages``.

``ExtractiveSummarizer`` is the offline default: deterministic, no model, and its
result never exceeds ``max_tokens`` as counted by tiktoken.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from .canonical import MEMO_CHARS, Memo, canonical_json
from .hooks import note_redacted
from .tokens import DEFAULT_ENCODING, count_text, truncate_to_tokens

__all__ = [
    "SUMMARY_INSTRUCTION",
    "ExtractiveSummarizer",
    "Summarizer",
    "as_summarizer",
    "build_summary_request",
    "cut_to_tokens",
    "fit_summary",
    "misstated_keys",
    "value_text",
]

Message = Mapping[str, str]

SUMMARY_INSTRUCTION = (
    "Summarize the context entries below for the next steps of this business process. "
    "Keep identifiers, amounts, decisions, statuses and open questions; drop repetition "
    "and narration. Answer with the summary text only, at most {max_tokens} tokens."
)


@runtime_checkable
class Summarizer(Protocol):
    """Summarize ``text`` in at most ``max_tokens`` tokens.

    ``prefix_messages`` are the messages of the activity's normal request, when the
    caller has them: a model-backed implementation sends
    ``build_summary_request(prefix_messages, text, max_tokens)`` so the shared prefix
    is served from the provider's cache. The compressor cuts any answer to
    ``max_tokens`` (``fit_summary``), so an implementation may overshoot slightly.
    """

    def summarize(self, text: str, max_tokens: int, *, prefix_messages: Sequence[Message] | None = None) -> str: ...


class _Adapted:
    """A summarizer written as DESIGN names it (``summarize(text, max_tokens)``, or a plain
    function of those two) behind the full protocol: ``prefix_messages`` reaches it only
    when it takes them."""

    def __init__(self, fn: Callable[..., Any], takes_prefix: bool, source: object) -> None:
        self._fn = fn
        self._takes_prefix = takes_prefix
        self.source = source

    def summarize(self, text: str, max_tokens: int, *, prefix_messages: Sequence[Message] | None = None) -> str:
        out = (self._fn(text, max_tokens, prefix_messages=prefix_messages) if self._takes_prefix
               else self._fn(text, max_tokens))
        if not isinstance(out, str):
            raise TypeError(f"summarizer {self.source!r:.60} returned {type(out).__name__}; return the summary text")
        return out


def _takes_prefix(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the protocol's call
        return True
    return any(p.name == "prefix_messages" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def as_summarizer(summarizer: object) -> Summarizer | None:
    """``summarizer`` as the compressor calls it: ``None`` (the offline default), an object with
    ``summarize(text, max_tokens[, prefix_messages=...])``, or a function ``(text, max_tokens) -> str``."""
    if summarizer is None:
        return None
    method = getattr(summarizer, "summarize", None)
    fn: Callable[..., Any] | None = method if callable(method) else summarizer if callable(summarizer) else None
    if fn is None:
        raise TypeError(f"summarizer must have a summarize(text, max_tokens) method or be a function "
                        f"(text, max_tokens) -> str, got {type(summarizer).__name__} {summarizer!r:.60}; "
                        "leave it out for the offline extractive summaries")
    if _takes_prefix(fn) and fn is method:
        return summarizer  # type: ignore[return-value]  # the protocol as it is
    return _Adapted(fn, _takes_prefix(fn), summarizer)


def build_summary_request(prefix_messages: Sequence[Message] | None, text: str, max_tokens: int, *,
                          instruction: str = SUMMARY_INSTRUCTION) -> list[dict[str, str]]:
    """The prefix unchanged, then one user message: the instruction and the text.

    Nothing in the prefix is altered or reordered (a changed byte would miss the
    cache); the text travels in the appended message, wrapped in CDATA-style tags.
    """
    messages = [dict(m) for m in (prefix_messages or ())]
    # the sentence on [REDACTED] goes with the instruction: the prefix stays as the provider cached it
    body = note_redacted(instruction.format(max_tokens=max_tokens), text,
                         *(m["content"] for m in messages if isinstance(m.get("content"), str)), sep=" ")
    safe = text.replace("]]>", "]]]]><![CDATA[>")
    messages.append({"role": "user", "content": f"{body}\n\n<entries><![CDATA[{safe}]]></entries>"})
    return messages


def cut_to_tokens(text: str, max_tokens: int, encoding: str = DEFAULT_ENCODING) -> str:
    """``truncate_to_tokens``, with a text that fits (most do) answered by ``count_text``,
    whose counts are cached: ``truncate_to_tokens`` encodes the whole text every time."""
    if count_text(text, encoding) <= max_tokens:
        return text
    return truncate_to_tokens(text, max_tokens, encoding)


_NUMBER = re.compile(r"[-+]?\d[\d,_]*(?:\.\d+)?")


def _stated_otherwise(value: Any, stated: str) -> bool:
    """Whether the text that follows ``key:`` in a summary (``stated``) gives ``key`` another value than
    ``value``. Only scalars are judged (an object or a list is written too many ways), and a number only
    when the text gives one (``$1,200`` is 1200)."""
    stated = stated.lstrip(" \t\"'`")
    if isinstance(value, bool):
        word = re.match(r"\w+", stated)
        said = word.group(0).lower() if word is not None else ""
        return said in ("true", "false") and said != str(value).lower()
    if isinstance(value, (int, float)):
        found = _NUMBER.match(stated.lstrip("$€£¥ "))
        if found is None:
            return False
        try:
            return float(found.group(0).replace(",", "").replace("_", "")) != float(value)
        except ValueError:
            return False
    if isinstance(value, str) and value.strip():
        text = value.strip()
        after = stated[len(text):len(text) + 1]
        return not stated.startswith(text) or after.isalnum() or after in ("-", "_")  # CLM-70 is not CLM-7
    return False


def misstated_keys(summary: str, facts: Mapping[str, Any]) -> list[str]:
    """What ``summary`` states of the keys in ``facts`` (preserved keys and their values) that they do not
    hold, in the ``key: value`` (or ``key = value``) form the text to summarize is written in: ``claim_ref:
    CLM-999`` where ``claim_ref`` is ``CLM-7``. Preserved keys survive a compression unchanged; a summary shown
    ahead of them that gives them other values would have the model read both. Empty when it misstates none."""
    out = []
    for key, value in facts.items():
        for found in re.finditer(rf"(?<![\w.]){re.escape(key)}\s*[:=]\s*", summary):
            stated = summary[found.end():]
            if _stated_otherwise(value, stated):
                shown = re.split(r"[.;,]\s|\n", stated, maxsplit=1)[0][:60].rstrip(" .,;")
                out.append(f"it states {key}: {shown}, but {key} is {canonical_json(value)} (a preserved key, which a "
                           "summary may name but not change)")
                break
    return out


def fit_summary(text: str, max_tokens: int, encoding: str = DEFAULT_ENCODING) -> str:
    """``text`` stripped and cut to ``max_tokens`` tokens (at a token boundary)."""
    return cut_to_tokens(text.strip(), max_tokens, encoding).rstrip()


_META = frozenset({"kind", "_compressed"})


def value_text(value: Any, *, _path: str = "") -> str:
    """A plain-text rendering of a context value for summarizing: strings as they are,
    objects as ``path: value`` lines (metadata fields left out), lists item by item."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        summary = value.get("summary")
        if value.get("_compressed") == "summarize" and isinstance(summary, str):
            return summary
        lines = []
        # in key order, as canonical JSON: a JSON object has none, and the same value must give the
        # same summary (and the same text to the model) whatever order its keys were written in
        for k in sorted(value):
            if k in _META:
                continue
            path = f"{_path}.{k}" if _path else k
            v = value[k]
            if isinstance(v, (dict, list)) and v and not _scalar_list(v):
                lines.append(value_text(v, _path=path))
            else:
                lines.append(f"{path}: {_scalar_text(v)}")
        return "\n".join(line for line in lines if line)
    if isinstance(value, list):
        if _scalar_list(value):
            return _scalar_text(value)
        return "\n".join(value_text(v, _path=f"{_path}[{i}]" if _path else "") for i, v in enumerate(value))
    return canonical_json(value)


def _scalar_list(v: Any) -> bool:
    return isinstance(v, list) and all(not isinstance(x, (dict, list)) for x in v)


def _scalar_text(v: Any) -> str:
    if isinstance(v, str):
        return v
    if isinstance(v, list) and _scalar_list(v):
        return ", ".join(_scalar_text(x) for x in v)
    return canonical_json(v)


_SENTENCE = re.compile(r"(?<=[.!?;\u3002\uff01\uff1f\uff1b])\s+")
_WORD = re.compile(r"\w+")
_DIGIT = re.compile(r"\d")
_SUMMARIES: Memo[tuple[type, str, str, int], str] = Memo(1 << 10, chars=MEMO_CHARS)


class ExtractiveSummarizer:
    """Deterministic extractive summary within ``max_tokens`` (no model).

    The text is cut into units (lines; a line longer than a quarter of the budget into
    sentences), repeated units are dropped, and when everything fits it is returned
    as is. Otherwise each unit is scored by the summed inverse document frequency of
    its distinct words over the units, divided by the square root of its length, plus
    a bonus for units holding digits (ids, amounts) and for the first unit; units are
    taken best first (earlier first on ties), each cut to at most half the budget,
    while they fit, and given back in their original order, one per line.
    """

    def __init__(self, *, encoding: str = DEFAULT_ENCODING) -> None:
        self.encoding = encoding

    def summarize(self, text: str, max_tokens: int, *, prefix_messages: Sequence[Message] | None = None) -> str:
        # a pure function of its arguments: every instance of a process summarizes the
        # same reasoning, the same folded records, again
        slot = (type(self), self.encoding, text, max_tokens)
        summary = _SUMMARIES.get(slot)
        if summary is None:
            summary = _SUMMARIES.put(slot, self._summarize(text, max_tokens), chars=len(text))
        return summary

    def _summarize(self, text: str, max_tokens: int) -> str:
        if max_tokens <= 0:
            return ""
        units = self._units(text, max_tokens)
        if not units:
            return ""
        whole = "\n".join(units)
        if count_text(whole, self.encoding) <= max_tokens:
            return whole
        words = [set(_WORD.findall(u.lower())) for u in units]
        df: dict[str, int] = {}
        for ws in words:
            for w in ws:
                df[w] = df.get(w, 0) + 1
        n = len(units)
        idf = {w: math.log(1 + n / count) for w, count in df.items()}

        def score(i: int) -> float:
            # fsum is exact, so the order of the set (which varies with the hash seed, from
            # one process to the next) cannot move the last bits that break ties
            weight = math.fsum(idf[w] for w in words[i])
            s = weight / math.sqrt(1 + len(words[i]))
            if _DIGIT.search(units[i]):
                s *= 1.25
            if i == 0:
                s *= 1.5
            return s

        ranked = sorted(range(n), key=lambda i: (-score(i), i))
        cap = max(8, max_tokens // 2)
        chosen: dict[int, str] = {}
        used = 0
        for i in ranked:
            unit = units[i]
            cost = count_text(unit, self.encoding)
            if cost > cap:
                unit = truncate_to_tokens(unit, cap, self.encoding).rstrip()
                cost = count_text(unit, self.encoding)
            if not unit:
                continue
            if used + cost + (1 if chosen else 0) <= max_tokens:
                chosen[i] = unit
                used += cost + (1 if len(chosen) > 1 else 0)
            if used >= max_tokens:
                break
        if not chosen:
            return fit_summary(units[ranked[0]], max_tokens, self.encoding)
        return fit_summary("\n".join(chosen[i] for i in sorted(chosen)), max_tokens, self.encoding)

    def _units(self, text: str, max_tokens: int) -> list[str]:
        out: list[str] = []
        seen: set[str] = set()
        long_line = max(16, max_tokens // 4)
        for line in text.splitlines():
            line = " ".join(line.split())
            if not line:
                continue
            parts = _SENTENCE.split(line) if count_text(line, self.encoding) > long_line else [line]
            for part in parts:
                part = part.strip()
                if part and part not in seen:
                    seen.add(part)
                    out.append(part)
        return out
