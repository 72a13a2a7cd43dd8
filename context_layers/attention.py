"""Attention scores and compression triggers.

Five scores, each in [0, 1], computed on the *scope*: the entries of HISTORY then
WORKING. Each has one function below whose docstring gives its exact formula;
``AttentionScore`` holds the five, ``CompressTriggerDetector`` compares them (and
the token and entry counts) with an activity's thresholds and says which fired.

On an empty context every score sits on its quiet side (density 1, redundancy 0,
decay 1, conflict 0, toolEfficiency 1), so nothing fires on nothing.

Words used throughout:

* *preserved keys* P: ``ctx.preserved`` plus the config's ``preserveKeys``;
* *records*: HISTORY keys starting with ``activity:``, ``tool:``, ``summary:`` or
  ``compaction:``; *activity records* are ``activity:*`` entries of kind
  ``activity``; *compressor records* are ``compaction:*`` entries and the
  ``count_only`` counters the compressor writes (their value has
  ``"_compressed": "count_only"``);
* the *owner* of a HISTORY entry (``segment_history``): itself for an activity
  record; otherwise the latest activity record whose ``keys`` list it; otherwise the
  first activity record after it in HISTORY order (``complete_activity`` appends an
  activity's new keys just before its record); otherwise none: the *open tail*,
  written since the last activity finished. Compressor records are owned by no
  activity (``COMPACTED``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Generic, NamedTuple, TypeVar, overload

from .canonical import MEMO_CHARS, FrozenDict, Memo, canonical_key, remember_value
from .context import (MERGED_CONFLICTS_KEY, TOOL_RESULT_KINDS, LayeredContext, Snapshot, entry_kind, is_record_key,
                      layer_items, names_tool_result)
from .layers import Layer
from .similarity import near_duplicate_clusters, word_sets
from .tokens import count_value

from .config import ActivityExtensionConfig, as_config

if TYPE_CHECKING:
    from .config import AttentionThresholds


def _as_config(config: "ActivityExtensionConfig | Mapping[str, Any] | None") -> ActivityExtensionConfig:
    """The config as given, or its JSON form validated (as the seed writes it)."""
    return config if type(config) is ActivityExtensionConfig else as_config(config)


__all__ = [
    "COMPACTED",
    "FIRE_BELOW",
    "RECENT_ACTIVITIES",
    "TRIGGERS",
    "AttentionScore",
    "CompressTriggerDetector",
    "Scope",
    "ScopeEntry",
    "Segments",
    "ToolReport",
    "TriggerDecision",
    "classify_tool_entries",
    "conflict",
    "decay",
    "density",
    "is_compressed",
    "is_compressor_record",
    "is_tool_entry",
    "redundancy",
    "segment_history",
    "tool_efficiency",
    "tool_result_useful",
]

RECENT_ACTIVITIES = 3
COMPACTED = "<compacted>"
TRIGGERS = ("token_threshold", "message_threshold", "density", "redundancy", "decay", "conflict", "toolEfficiency")
# Scores that fire below their threshold; the others fire above it.
FIRE_BELOW = frozenset({"density", "decay", "toolEfficiency"})


# ----- the scope ------------------------------------------------------------------------


class ScopeEntry(NamedTuple):
    """One scope entry: its layer, key, (frozen) value and token count. A named tuple: a scope is
    built after every activity, and a frozen dataclass took longer to build than the rest of it."""

    layer: Layer
    key: str
    value: Any
    tokens: int

    @property
    def kind(self) -> str:
        return entry_kind(self.key, self.value)


_T = TypeVar("_T")


class _computed_once(Generic[_T]):  # noqa: N801 - used as a decorator, like functools.cached_property
    """``functools.cached_property`` without its lock (Python 3.11 takes one on every first read,
    which cost more than the property itself): a scope is read by one thread, and a value computed
    twice by two threads would be the same value (the properties are pure functions of the scope)."""

    def __init__(self, fn: Callable[[Any], _T]) -> None:
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> "_computed_once[_T]": ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> _T: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> "_T | _computed_once[_T]":
        if obj is None:
            return self
        value = self.fn(obj)
        obj.__dict__[self.name] = value  # found before this (non-data) descriptor from now on
        return value


@dataclass(frozen=True)
class Scope:
    """HISTORY then WORKING entries with their token counts, and the preserved keys."""

    history: tuple[ScopeEntry, ...]
    working: tuple[ScopeEntry, ...] = ()
    preserved: frozenset[str] = frozenset()
    merged_conflicts: Any = None

    # computed once: the scores and the compressor read them again and again

    @_computed_once
    def entries(self) -> tuple[ScopeEntry, ...]:
        return self.history + self.working

    @_computed_once
    def tokens(self) -> int:
        return sum(e.tokens for e in self.history) + sum(e.tokens for e in self.working)

    @_computed_once
    def segments(self) -> Segments:
        """``segment_history`` of HISTORY."""
        return segment_history([(e.key, e.value) for e in self.history])

    @classmethod
    def of(cls, source: LayeredContext | Snapshot,
           config: ActivityExtensionConfig | Mapping[str, Any] | None = None) -> Scope:
        """The scope of a context, or of a snapshot (for before/after comparisons)."""
        if not isinstance(source, (LayeredContext, Snapshot)):
            raise TypeError(f"attention and compression work on a LayeredContext (or a Snapshot of one), "
                            f"got {type(source).__name__}; pass the context itself, not its layers or a view")
        preserved = set(source.preserved)
        if config is not None:
            preserved.update(_as_config(config).effective_preserve_keys)
        return cls(history=_layer_entries(source, Layer.HISTORY), working=_layer_entries(source, Layer.WORKING),
                   preserved=frozenset(preserved), merged_conflicts=_resolve(source, MERGED_CONFLICTS_KEY))

    @classmethod
    def build(cls, history: Iterable[tuple[str, Any]], working: Iterable[tuple[str, Any]] = (), *,
              preserved: Iterable[str] = (), merged_conflicts: Any = None, encoding: str | None = None) -> Scope:
        """A scope from plain ``(key, value)`` pairs (token counts computed here)."""
        def entries(layer: Layer, items: Iterable[tuple[str, Any]]) -> tuple[ScopeEntry, ...]:
            return tuple(ScopeEntry(layer, k, v, count_value(v, encoding) if encoding else count_value(v))
                         for k, v in items)
        return cls(history=entries(Layer.HISTORY, history), working=entries(Layer.WORKING, working),
                   preserved=frozenset(preserved), merged_conflicts=merged_conflicts)


_TUPLE_NEW = tuple.__new__


def _layer_entries(source: LayeredContext | Snapshot, layer: Layer) -> tuple[ScopeEntry, ...]:
    if isinstance(source, LayeredContext):
        # ScopeEntry(layer, k, v, n), without the named tuple's own __new__ (a call more per entry)
        return tuple([_TUPLE_NEW(ScopeEntry, (layer, k, v, n)) for k, v, n in layer_items(source, layer)])
    view = source.layer(layer)
    # Snapshots keep their token counts in their state; recount if a future state lacks them.
    counts = getattr(getattr(source, "state", None), "tokens", None)
    table = counts[layer] if counts is not None else {}
    return tuple(ScopeEntry(layer, k, view[k], table[k] if k in table else count_value(view[k])) for k in view)


def _resolve(source: LayeredContext | Snapshot, key: str) -> Any:
    """The value a read of ``key`` gives, ``None`` when no layer holds it."""
    return source.get(key)


# ----- HISTORY segmentation ---------------------------------------------------------------


def is_compressor_record(key: str, value: Any) -> bool:
    return key.startswith("compaction:") or (isinstance(value, dict) and value.get("_compressed") == "count_only")


def is_compressed(key: str, value: Any) -> bool:
    """A compressor record, or an entry a rule rewrote in place (``extract_keys``, ``summarize``).
    What a rule left restates what it replaced: judging it again as a fresh tool result or note
    (``status: ok`` looks empty, two cut-down results look alike) would let a compression fire
    the next one by itself."""
    return is_compressor_record(key, value) or (isinstance(value, dict) and "_compressed" in value)


def is_activity_record(key: str, value: Any) -> bool:
    return key.startswith("activity:") and entry_kind(key, value) == "activity"


@dataclass(frozen=True)
class Segments:
    """Activity records oldest first, and the owner of every HISTORY key (see the module doc)."""

    records: tuple[str, ...]
    owner: Mapping[str, str | None]

    def recent(self, n: int) -> frozenset[str]:
        return frozenset(self.records[-n:]) if n > 0 else frozenset()


_PLAIN, _RECORD, _COMPRESSOR = 0, 1, 2


def segment_history(history: Sequence[tuple[str, Any]]) -> Segments:
    # scored after every activity: classify each entry once, in one test per entry
    # (``is_compressor_record`` first, then ``is_activity_record``, as the owner rule reads)
    marked: list[tuple[str, int]] = []
    records: list[str] = []
    listed: dict[str, str] = {}
    for k, v in history:
        if isinstance(v, dict):
            if k.startswith("compaction:") or v.get("_compressed") == "count_only":
                marked.append((k, _COMPRESSOR))
                is_record = k.startswith("activity:") and v.get("kind") == "activity"
            elif k.startswith("activity:") and v.get("kind") == "activity":
                marked.append((k, _RECORD))
                is_record = True
            else:
                marked.append((k, _PLAIN))
                continue
            if is_record:  # a compressor record may be an activity record too: it still lists its keys
                records.append(k)
                keys = v.get("keys")
                if isinstance(keys, list):
                    for written in keys:
                        if isinstance(written, str):
                            listed[written] = k
        else:
            marked.append((k, _COMPRESSOR if k.startswith("compaction:") else _PLAIN))
    owner: dict[str, str | None] = {}
    following: str | None = None
    for k, mark in reversed(marked):
        if mark == _COMPRESSOR:
            owner[k] = COMPACTED
        elif mark == _RECORD:
            owner[k] = k
            following = k
        else:
            owner[k] = listed.get(k, following)
    return Segments(records=tuple(records), owner=owner)


# ----- the five dimensions ------------------------------------------------------------------


def _density(scope: Scope) -> tuple[float, dict[str, Any]]:
    total = scope.tokens
    present = [e for e in scope.entries if e.key in scope.preserved]
    kept = sum(e.tokens for e in present)
    if total == 0 or not present:
        return 1.0, {"preserved_tokens": kept, "tokens": total}
    return kept / total, {"preserved_tokens": kept, "tokens": total}


def density(scope: Scope) -> float:
    """density = T(P) / T.

    T is the token count of every scope entry (HISTORY and WORKING); T(P) of the
    entries whose key is preserved. 1.0 when T = 0 or no preserved key is in scope:
    with nothing preserved present there is nothing to dilute.
    """
    return _density(scope)[0]


def _redundancy(scope: Scope) -> tuple[float, dict[str, Any]]:
    entries = [e for e in scope.entries  # is_compressed, inlined
               if not (e.key.startswith("compaction:") or (isinstance(e.value, dict) and "_compressed" in e.value))]
    clusters = near_duplicate_clusters(word_sets((e.key, e.value) for e in entries))
    counted = clusters.counted
    value = clusters.redundant / counted if counted > 1 else 0.0
    return value, {"entries": counted, "redundant_entries": clusters.redundant,
                   "duplicate_pairs": clusters.pairs, "redundancy_exact": clusters.exact,
                   "_labels": clusters.labels, "_keys": [(e.layer, e.key) for e in entries]}


def redundancy(scope: Scope) -> float:
    """redundancy = (n - c) / n.

    n is the number of scope entries that have words (compressor records and entries a
    rule rewrote left out: they restate what they replaced), c the number of clusters of near-duplicates
    among them (connected components of "Jaccard of word 3-shingles >= 0.8", see
    ``context_layers.similarity``). It is the share of entries that repeat an earlier
    one: a cluster of k entries contributes k - 1. 0.0 when n <= 1. Exact up to 200
    distinct entries; above, MinHash/LSH may miss a near-duplicate pair (about 2e-4
    per pair at Jaccard 0.8) and never reports a false one.

    DESIGN.md words it as "share of entry pairs that are near-duplicates"; counted over
    all n(n-1)/2 pairs that share grows with the square of a cluster's size and needs
    more than half the entries to be copies of one another before it reaches the
    default threshold 0.3, so the score counts redundant entries instead (the number of
    near-duplicate pairs is in ``AttentionScore.details``).
    """
    return _redundancy(scope)[0]


def _decay(scope: Scope, recent_activities: int) -> tuple[float, dict[str, Any]]:
    seg = scope.segments
    recent = seg.recent(recent_activities)
    new = old = 0
    for e in scope.history:
        if e.key in scope.preserved:
            continue
        owner = seg.owner[e.key]
        if owner == COMPACTED:
            continue
        if owner is None or owner in recent:
            new += e.tokens
        else:
            old += e.tokens
    new += sum(e.tokens for e in scope.working if e.key not in scope.preserved)
    value = new / (new + old) if new + old else 1.0
    return value, {"recent_tokens": new, "old_tokens": old, "activities": len(seg.records)}


def decay(scope: Scope, recent_activities: int = RECENT_ACTIVITIES) -> float:
    """decay = T(recent) / (T(recent) + T(old)).

    Over the scope entries that are neither preserved nor compressor records (pinned
    keys and earlier summaries are timeless: neither recent nor stale): T(recent) is
    the tokens of WORKING entries and of HISTORY entries owned by one of the
    ``recent_activities`` latest activity records or by none (the open tail); T(old)
    the tokens of HISTORY entries owned by an older activity record. 1.0 when both are
    0, and whenever there are no more than ``recent_activities`` activity records.
    """
    return _decay(scope, recent_activities)[0]


def _unresolved(merged: Any) -> set[str]:
    """Keys of ``_mergedConflicts`` entries without a resolution.

    Accepts a list of ``{"key": ..., "resolution": null | {...}}`` (the shape of the
    CLI's ``conflicts``) or a mapping ``{key: {"resolution": ...}}``; an entry also
    counts as resolved when it has ``"resolved": true``.
    """
    out: set[str] = set()
    if isinstance(merged, dict):
        items = [({"key": k, **v} if isinstance(v, dict) and "key" not in v else v) for k, v in merged.items()]
    elif isinstance(merged, list):
        items = list(merged)
    else:
        return out
    for item in items:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            if item.get("resolution") is None and item.get("resolved") is not True:
                out.add(item["key"])
    return out


def _data_key(key: str) -> bool:
    return not is_record_key(key) and not key.startswith("_")


def _conflict(scope: Scope) -> tuple[float, dict[str, Any]]:
    history = {e.key: e.value for e in scope.history if _data_key(e.key)}
    working = {e.key: e.value for e in scope.working if _data_key(e.key)}
    shadowed = {k for k in history.keys() & working.keys() if canonical_key(history[k]) != canonical_key(working[k])}
    unresolved = _unresolved(scope.merged_conflicts)
    keys = history.keys() | working.keys() | unresolved
    bad = sorted(shadowed | unresolved)
    value = len(bad) / len(keys) if keys else 0.0
    return value, {"conflicting_keys": bad, "data_keys": len(keys)}


def conflict(scope: Scope) -> float:
    """conflict = |C| / |K|.

    K is the set of data keys in scope (keys that are not records and do not start
    with ``_``, the engine's bookkeeping) plus the keys of unresolved
    ``_mergedConflicts`` entries. C holds the keys that have contradictory values: a
    key held by both HISTORY and WORKING with values that are not JSON-equal
    (``canonical_key``), and every key of an unresolved ``_mergedConflicts`` entry
    (one whose ``resolution`` is null). 0.0 when K is empty.
    """
    return _conflict(scope)[0]


_TOOL_KINDS = TOOL_RESULT_KINDS | {"tool_call"}
_ERROR_STATUS = frozenset({"error", "failed", "failure", "timeout", "timed_out", "cancelled", "canceled"})
_TOOL_META = frozenset({"kind", "_compressed", "call_id", "tool_call_id", "tool", "name", "args", "arguments",
                        "status", "ok", "is_error", "error", "duration_ms"})


def is_tool_entry(key: str, value: Any) -> bool:
    """A tool call or result: of kind ``tool_call``, ``tool_call_result`` or ``tool_result``, or
    without a kind of its own and keyed as a result (``tool:search``, ``tool_call_result_1``)."""
    kind = entry_kind(key, value)
    return key.startswith("tool:") or kind in _TOOL_KINDS or (kind == "data" and names_tool_result(key))


def _empty(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, (list, dict)):
        items = value.values() if isinstance(value, dict) else value
        return all(_empty(v) for v in items)
    return False


def _is_error(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    status = value.get("status")
    return bool(value.get("error")) or value.get("is_error") is True or value.get("ok") is False or (
        isinstance(status, str) and status.strip().lower() in _ERROR_STATUS)


def _payload(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if k not in _TOOL_META}
    return value


def tool_result_useful(value: Any, seen: set[str] | None = None) -> bool:
    """A tool result is useful when it is not an error, its payload is not empty and
    (when ``seen`` is given) it is not the same tool's payload seen before; ``seen``
    gains it."""
    if _is_error(value) or _empty(_payload(value)):
        return False
    if seen is None:
        return True
    mark = _tool_mark(value)
    if mark in seen:
        return False
    seen.add(mark)
    return True


# Two memories of _tool_mark for frozen values (context values: validated JSON), both
# bounded by entries and by the characters of the values' canonical texts (cleared when full):
# * id(value) -> (value, mark): a tool result is scored after every activity while it
#   stays in HISTORY; frozen values never change, and holding the value keeps its id
#   unique;
# * canonical text -> mark: every instance of a process gets the same results from the
#   same tools, as new objects. The text tells equal values from unequal ones (the mark
#   does not depend on key order either), and was made when the value's tokens were
#   counted (``canonical_text``).
_MARKS_BY_ID: Memo[tuple[Any, int], tuple[Any, str]] = Memo(1 << 14, chars=MEMO_CHARS)
_MARKS_BY_TEXT: Memo[tuple[Any, str], str] = Memo(1 << 12, chars=MEMO_CHARS)


def _tool_mark(value: Any) -> str:
    """What makes two results of one tool the same: the tool's name and the payload."""
    if type(value) is not FrozenDict:
        return _mark(value)
    return remember_value(_MARKS_BY_ID, _MARKS_BY_TEXT, None, value, lambda: _mark(value))


def _mark(value: Any) -> str:
    tool = value.get("tool", value.get("name")) if isinstance(value, dict) else None
    return canonical_key([tool, _payload(value)])


_CALL_ID_FIELDS = ("call_id", "tool_call_id")


def _call_ids(value: Any) -> set[str]:
    if not isinstance(value, dict):
        return set()
    return {value[f] for f in _CALL_ID_FIELDS if isinstance(value.get(f), str)}


@dataclass(frozen=True)
class ToolReport:
    """Tool calls among some entries: ``useless`` result keys, ``pending`` call keys
    (a ``tool_call`` no result answers), and the counts the score is made of."""

    calls: int
    useful: int
    useless: tuple[str, ...]
    pending: tuple[str, ...]


def classify_tool_entries(entries: Iterable[tuple[str, Any]]) -> ToolReport:
    """Classify tool entries (in order; "same payload seen before" depends on it)."""
    results: list[tuple[str, Any]] = []
    calls: list[tuple[str, Any]] = []
    for k, v in entries:
        # is_tool_entry and not is_compressed, with the entry's kind read once
        if isinstance(v, dict):
            kind = v.get("kind")
            if not isinstance(kind, str):
                kind = "data"
            if not (k.startswith("tool:") or kind in _TOOL_KINDS or (kind == "data" and names_tool_result(k))):
                continue
            if "_compressed" in v or k.startswith("compaction:"):
                continue
            (calls if kind == "tool_call" else results).append((k, v))
        elif names_tool_result(k) and not k.startswith("compaction:"):
            results.append((k, v))
    answered: set[str] = set()
    for _, v in results:
        answered |= _call_ids(v)
    pending = tuple(k for k, v in calls if not (_call_ids(v) & answered))
    seen: set[str] = set()
    useless = tuple(k for k, v in results if not tool_result_useful(v, seen))
    return ToolReport(calls=len(results) + len(pending), useful=len(results) - len(useless),
                      useless=useless, pending=pending)


def _tool_efficiency(scope: Scope) -> tuple[float, dict[str, Any]]:
    report = classify_tool_entries((e.key, e.value) for e in scope.entries)
    value = report.useful / report.calls if report.calls else 1.0
    return value, {"tool_calls": report.calls, "useful_tool_results": report.useful,
                   "useless_tool_results": list(report.useless), "pending_tool_calls": list(report.pending)}


def tool_efficiency(scope: Scope) -> float:
    """toolEfficiency = useful results / tool calls.

    Tool entries are scope entries of kind ``tool_call``, ``tool_call_result`` or
    ``tool_result``, or without a kind and keyed as a result (``is_tool_entry``), that no
    rule has rewritten (``is_compressed``: the rule judged them already). Each entry of another kind than ``tool_call`` is one call
    with its result; a ``tool_call`` entry is one more call unless a result carries
    its ``call_id`` (or ``tool_call_id``). A result is useful when it is not an error
    (no truthy ``error``, ``is_error`` not true, ``ok`` not false, ``status`` not one
    of error/failed/failure/timeout/cancelled), its payload (the value without
    ``kind``, ``tool``/``name``, ``args``, ``status`` and such metadata) is not empty,
    and no earlier result of the same tool had the same payload. Whether a model
    *used* a result cannot be seen from the context, so it does not count. 1.0 when
    there are no tool calls.
    """
    return _tool_efficiency(scope)[0]


# ----- the score and the triggers -------------------------------------------------------------


@dataclass(frozen=True)
class AttentionScore:
    """The five attention scores of a context (see each function for its formula)."""

    density: float = 1.0
    redundancy: float = 0.0
    decay: float = 1.0
    conflict: float = 0.0
    tool_efficiency: float = 1.0
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def compute(cls, ctx: LayeredContext | Snapshot, config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
                recent_activities: int = RECENT_ACTIVITIES) -> AttentionScore:
        """Score a context (or a snapshot) on HISTORY + WORKING."""
        return cls.of_scope(Scope.of(ctx, config), recent_activities=recent_activities)

    @classmethod
    def of_scope(cls, scope: Scope, *, recent_activities: int = RECENT_ACTIVITIES) -> AttentionScore:
        d, d_info = _density(scope)
        r, r_info = _redundancy(scope)
        y, y_info = _decay(scope, recent_activities)
        c, c_info = _conflict(scope)
        t, t_info = _tool_efficiency(scope)
        details = {**d_info, **r_info, **y_info, **c_info, **t_info, "recent_activities": recent_activities}
        return cls(density=d, redundancy=r, decay=y, conflict=c, tool_efficiency=t, details=details)

    @property
    def toolEfficiency(self) -> float:  # noqa: N802 - the seed's name (AttentionScore.getToolEfficiency)
        return self.tool_efficiency

    def to_dict(self) -> dict[str, float]:
        return {"density": self.density, "redundancy": self.redundancy, "decay": self.decay,
                "conflict": self.conflict, "toolEfficiency": self.tool_efficiency}

    def public_details(self) -> dict[str, Any]:
        """The counts behind the scores (JSON-able)."""
        return {k: v for k, v in self.details.items() if not k.startswith("_")}

    def crossed(self, thresholds: AttentionThresholds) -> list[str]:
        """Names (as in ``to_dict``) of the scores across their threshold."""
        limits = _threshold_dict(thresholds)
        out = []
        for name, value in self.to_dict().items():
            if (value < limits[name]) if name in FIRE_BELOW else (value > limits[name]):
                out.append(name)
        return out


def _threshold_dict(t: AttentionThresholds) -> dict[str, float]:
    return {"density": t.density, "redundancy": t.redundancy, "decay": t.decay, "conflict": t.conflict,
            "toolEfficiency": t.tool_efficiency}


@dataclass(frozen=True)
class TriggerDecision:
    """Which triggers fired, with every measured value and its threshold, so a user
    can see why compression ran (or did not)."""

    fired: bool
    triggers: list[str]
    values: dict[str, float | int]
    thresholds: dict[str, float | int | None]
    attention: AttentionScore
    # attention scores across their threshold that did not fire: the scope was
    # smaller than min_attention_tokens
    suppressed: list[str] = field(default_factory=list)
    min_attention_tokens: int = 0

    def __bool__(self) -> bool:
        """Whether compression should run: ``if detector.detect(ctx, config):`` reads as the
        seed's ``boolean detect(...)`` (a dataclass is otherwise always true)."""
        return self.fired

    def __eq__(self, other: object) -> bool:
        if isinstance(other, bool):  # ``detect(...) == True``, as the seed's boolean reads
            return self.fired == other
        if not isinstance(other, TriggerDecision):
            return NotImplemented
        return (self.fired, self.triggers, self.values, self.thresholds, self.attention, self.suppressed,
                self.min_attention_tokens) == (other.fired, other.triggers, other.values, other.thresholds,
                                               other.attention, other.suppressed, other.min_attention_tokens)

    __hash__ = None  # type: ignore[assignment]  # holds lists and dicts

    def __iter__(self) -> Iterator[str]:
        """The triggers that fired (none when it did not fire): ``for t in detect(...)``, ``list(...)``."""
        return iter(self.triggers if self.fired else ())

    def __contains__(self, trigger: object) -> bool:
        """``"token_threshold" in detect(...)``: whether that trigger fired."""
        return self.fired and trigger in self.triggers

    def to_dict(self) -> dict[str, Any]:
        return {"fired": self.fired, "triggers": list(self.triggers), "values": dict(self.values),
                "thresholds": dict(self.thresholds), "attention": self.attention.to_dict(),
                "suppressed": list(self.suppressed), "min_attention_tokens": self.min_attention_tokens}

    def explain(self) -> str:
        if not self.fired:
            return "no trigger fired"
        parts = []
        for name in self.triggers:
            op = "<" if name in FIRE_BELOW else ">"
            value = self.values[name]
            shown = f"{value:.3f}" if isinstance(value, float) else str(value)
            parts.append(f"{name}: {shown} {op} {self.thresholds[name]}")
        return "; ".join(parts)


class CompressTriggerDetector:
    """Decide whether a context needs compression under an activity's config.

    Triggers, in this order: ``token_threshold`` (HISTORY + WORKING tokens >
    ``compressTokenThreshold``), ``message_threshold`` (HISTORY entries >
    ``compressMessageThreshold``), then each attention score across its threshold
    (``attentionThresholds``; DESIGN.md's defaults when unset).

    Attention triggers on DESIGN.md's default thresholds need at least
    ``min_attention_tokens`` tokens in scope. By default that is the cliff target,
    ``compressTargetRatio`` x ``compressTokenThreshold`` (0 without a threshold): a
    context already smaller than what a cliff would leave is not worth compressing
    because two entries look alike or a short id is a small share of it. A threshold
    the activity's ``attentionThresholds`` writes out fires as written, at any size
    (unless the detector is given ``min_attention_tokens``).
    """

    def __init__(self, *, recent_activities: int = RECENT_ACTIVITIES, min_attention_tokens: int | None = None) -> None:
        self.recent_activities = recent_activities
        self.min_attention_tokens = min_attention_tokens

    def floor(self, config: ActivityExtensionConfig) -> int:
        """Tokens the scope needs before an attention trigger may fire (see the class doc)."""
        if self.min_attention_tokens is None and config.explicit_attention_scores:
            return 0  # a written threshold may fire at any size (``decide`` keeps the floor for the defaults)
        return self._default_floor(config)

    def _default_floor(self, config: ActivityExtensionConfig) -> int:
        """The floor of the scores on default thresholds."""
        if self.min_attention_tokens is not None:
            return self.min_attention_tokens
        token_limit = config.effective_token_threshold
        return int(config.context_strategy.compress_target_ratio * token_limit) if token_limit else 0

    def size_triggers(self, ctx: LayeredContext, config: ActivityExtensionConfig) -> tuple[list[str], int]:
        """The token and message triggers that fire, and the scope's tokens: O(1), from the
        layer totals, with no attention score. ``detect`` gives the same two triggers."""
        tokens = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
        fired: list[str] = []
        token_limit = config.effective_token_threshold
        if token_limit is not None and tokens > token_limit:
            fired.append("token_threshold")
        message_limit = config.effective_message_threshold
        if message_limit is not None and len(ctx.layer(Layer.HISTORY)) > message_limit:
            fired.append("message_threshold")
        return fired, tokens

    def detect(self, ctx: LayeredContext, config: ActivityExtensionConfig | Mapping[str, Any] | None = None, *,
               attention: AttentionScore | None = None) -> TriggerDecision:
        """Which triggers fire; ``config`` the model or its JSON (the seed's example)."""
        config = _as_config(config)
        return self.decide(Scope.of(ctx, config), config, attention=attention)

    def calculate_attention_score(self, ctx: LayeredContext,
                                  config: ActivityExtensionConfig | Mapping[str, Any] | None = None) -> AttentionScore:
        """The five scores ``detect`` compares (the seed's name for ``AttentionScore.compute``)."""
        return AttentionScore.of_scope(Scope.of(ctx, _as_config(config)), recent_activities=self.recent_activities)

    def decide(self, scope: Scope, config: ActivityExtensionConfig, *,
               attention: AttentionScore | None = None) -> TriggerDecision:
        """``detect`` on a scope already built (``Scope.of(ctx, config)``)."""
        score = attention or AttentionScore.of_scope(scope, recent_activities=self.recent_activities)
        tokens = scope.tokens
        entries = len(scope.history)
        token_limit = config.effective_token_threshold
        message_limit = config.effective_message_threshold
        attention_limits = config.effective_attention_thresholds
        limits = _threshold_dict(attention_limits)
        values: dict[str, float | int] = {"token_threshold": tokens, "message_threshold": entries, **score.to_dict()}
        thresholds: dict[str, float | int | None] = {"token_threshold": token_limit,
                                                     "message_threshold": message_limit, **limits}
        fired: list[str] = []
        if token_limit is not None and tokens > token_limit:
            fired.append("token_threshold")
        if message_limit is not None and entries > message_limit:
            fired.append("message_threshold")
        floor = self._default_floor(config)
        written = config.explicit_attention_scores if self.min_attention_tokens is None else frozenset()
        crossed = score.crossed(attention_limits)
        suppressed: list[str] = [] if tokens >= floor else [name for name in crossed if name not in written]
        fired.extend(name for name in crossed if name not in suppressed)
        return TriggerDecision(fired=bool(fired), triggers=fired, values=values, thresholds=thresholds,
                               attention=score, suppressed=suppressed, min_attention_tokens=floor)
