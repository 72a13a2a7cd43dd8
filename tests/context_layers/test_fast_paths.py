"""The hot paths of attention scoring, compression and the tape, written for speed, give exactly
what the plain definitions give.

Each fast path is compared with the straightforward code it replaced (kept here as the
reference): HISTORY segmentation, tool-entry classification, the redundancy score's entries,
the scope's entries and token counts, events and snapshots built slot by slot, and the token
counts a compression hands its context instead of letting it count them again.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, RuleDrivenCompressor
from context_layers.attention import (COMPACTED, AttentionScore, Scope, ScopeEntry, Segments, classify_tool_entries,
                                      is_activity_record, is_compressed, is_compressor_record, is_tool_entry,
                                      _mark, _tool_mark, segment_history)
from context_layers.canonical import canonical_json, canonical_text, freeze
from context_layers.context import Snapshot, _new_snapshot, entry_kind, key_begins, names_tool_result
from context_layers.similarity import entry_shingles, entry_words, shingles
from context_layers.tape import Event, EventKind, new_event
from context_layers.tokens import count_value

# ----- the reference definitions (the code before it was made fast) ----------------------------------


def names_tool_result_ref(key: str) -> bool:
    if key.startswith("tool:"):
        return True
    return any(key == name or key_begins(key, name) for name in ("tool_call_result", "tool_result"))


def is_tool_entry_ref(key: str, value: Any) -> bool:
    kind = entry_kind(key, value)
    return key.startswith("tool:") or kind in {"tool_call_result", "tool_result", "tool_call"} or (
        kind == "data" and names_tool_result_ref(key))


def segment_history_ref(history: list[tuple[str, Any]]) -> Segments:
    marked = [(k, v, is_activity_record(k, v)) for k, v in history]
    records = [k for k, _, is_record in marked if is_record]
    listed: dict[str, str] = {}
    for k, v, is_record in marked:
        if is_record:
            keys = v.get("keys") if isinstance(v, dict) else None
            if isinstance(keys, list):
                for written in keys:
                    if isinstance(written, str):
                        listed[written] = k
    owner: dict[str, str | None] = {}
    following: str | None = None
    for k, v, is_record in reversed(marked):
        if is_compressor_record(k, v):
            owner[k] = COMPACTED
        elif is_record:
            owner[k] = k
            following = k
        else:
            owner[k] = listed.get(k, following)
    return Segments(records=tuple(records), owner=owner)


def tool_entries_ref(entries: list[tuple[str, Any]]) -> tuple[list[str], list[str]]:
    """(calls, results) as ``classify_tool_entries`` first sorts them."""
    calls, results = [], []
    for k, v in entries:
        if is_tool_entry_ref(k, v) and not is_compressed(k, v):
            (calls if entry_kind(k, v) == "tool_call" else results).append(k)
    return calls, results


# ----- entries: the keys and values the classifications tell apart -------------------------------------

KEYS = st.sampled_from([
    "amount", "notes", "_branch_id", "tool:search", "tool:", "tool_call_result", "tool_call_result_1",
    "tool_call_results", "tool_result:x", "tools", "toolbox", "activity:a", "activity:b", "activity:b#2",
    "compaction:1", "compaction:x", "summary:count:activity:*", "event:e", "kb:hit",
])
SCALARS = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "ok", "a b c d", "amount"])
KINDS = st.sampled_from(["activity", "tool_call", "tool_call_result", "tool_result", "reasoning_chain", "count",
                         "compaction", "data", 7, None])


@st.composite
def values(draw: Any) -> Any:
    if draw(st.booleans()):
        return draw(SCALARS | st.lists(SCALARS, max_size=3))
    value: dict[str, Any] = {}
    kind = draw(KINDS)
    if kind is not None:
        value["kind"] = kind
    if draw(st.booleans()):
        value["_compressed"] = draw(st.sampled_from(["count_only", "extract_keys", "summarize", None]))
    if draw(st.booleans()):
        value["keys"] = draw(st.lists(KEYS | st.integers(0, 2), max_size=3) | SCALARS)
    for name in draw(st.lists(st.sampled_from(["status", "error", "ok", "call_id", "tool", "data", "text"]),
                              max_size=3, unique=True)):
        value[name] = draw(SCALARS)
    return value


HISTORY = st.lists(st.tuples(KEYS, values()), max_size=12, unique_by=lambda kv: kv[0])


@settings(max_examples=120, deadline=None)
@given(HISTORY)
def test_classifications_are_the_plain_definitions(history: list[tuple[str, Any]]) -> None:
    frozen = [(k, freeze(v)) for k, v in history]
    for pairs in (history, frozen):
        fast, ref = segment_history(pairs), segment_history_ref(pairs)
        assert fast.records == ref.records
        assert fast.owner == ref.owner
        calls, results = tool_entries_ref(pairs)
        report = classify_tool_entries(pairs)
        assert report.calls == len(results) + len(report.pending)
        assert set(report.pending) <= set(calls) and set(report.useless) <= set(results)
        for k, v in pairs:
            assert names_tool_result(k) == names_tool_result_ref(k)
            assert is_tool_entry(k, v) == is_tool_entry_ref(k, v)


@settings(max_examples=60, deadline=None)
@given(HISTORY, st.lists(st.tuples(KEYS, values()), max_size=4, unique_by=lambda kv: kv[0]))
def test_scope_and_scores_are_the_plain_definitions(history: list[tuple[str, Any]],
                                                    working: list[tuple[str, Any]]) -> None:
    ctx = _context(history, working)
    scope = Scope.of(ctx)
    for layer, entries in ((Layer.HISTORY, scope.history), (Layer.WORKING, scope.working)):
        view = ctx.layer(layer)
        assert entries == tuple(ScopeEntry(layer, k, view[k], ctx.key_tokens(layer, k)) for k in view)
        assert [type(e) for e in entries] == [ScopeEntry] * len(entries)
        assert all(e.tokens == count_value(e.value) for e in entries)
    score = AttentionScore.of_scope(scope)
    # the redundancy score counts the entries no rule or compressor rewrote
    assert score.details["_keys"] == [(e.layer, e.key) for e in scope.entries if not is_compressed(e.key, e.value)]
    # a snapshot's scope (read through its layers) is the context's
    assert Scope.of(ctx.snapshot()) == scope


def _context(history: list[tuple[str, Any]], working: list[tuple[str, Any]] = ()) -> LayeredContext:
    """A context whose HISTORY holds ``history`` (in order) and WORKING ``working``."""
    ctx = LayeredContext()
    ctx.apply_changes([(Layer.HISTORY, k, v) for k, v in history], kind="test", actor="t")
    ctx.apply_changes([(Layer.WORKING, k, v) for k, v in working], kind="test", actor="t")
    return ctx


def test_events_and_snapshots_built_by_slots_are_the_dataclasses() -> None:
    fields = dict(seq=3, kind=EventKind.WRITE, time=1.5, actor="a", activity="t", branch="b",
                  changes=((Layer.WORKING, "k", 1),), data=freeze({"x": [1]}), snapshot=None)
    fast = new_event(**fields)
    plain = Event(**fields)
    assert type(fast) is Event and fast == plain and repr(fast) == repr(plain)
    assert fast.to_dict() == plain.to_dict()
    ctx = LayeredContext(system={"p": 1})
    snap = ctx.snapshot(label="here")
    state = snap.state
    built = _new_snapshot("snap:x:1", "x", 1, state, "l")
    assert type(built) is Snapshot and built == Snapshot(id="snap:x:1", context="x", seq=1, state=state, label="l")
    assert built.state is state and built.label == "l"


CONFIG = ActivityExtensionConfig.model_validate({
    "preserveKeys": ["risk_level"], "compressTokenThreshold": 60,
    "compressRules": [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]},
                      {"pattern": "activity:*", "action": "count_only", "keepLast": 1}]})


def test_a_compression_hands_its_context_the_counts_a_recount_gives() -> None:
    ctx = LayeredContext()
    for i in range(4):
        ctx.begin_activity(f"step{i}")
        ctx.write(Layer.WORKING, f"result_{i}", {"kind": "tool_call_result", "status": "ok",
                                                 "data": {"id": f"R{i}", "rows": list(range(12))}})
        ctx.write(Layer.WORKING, f"note_{i}", f"step {i} looked at the application and found it complete " * 3)
        if i == 0:
            ctx.write(Layer.WORKING, "risk_level", "medium")
        ctx.complete_activity(f"step{i}", preserve_keys=["risk_level"])
    result = RuleDrivenCompressor(keep_recent=1).compress(ctx, CONFIG, actor="t")
    assert result.changed and result.compaction_key is not None
    for layer in Layer:
        view = ctx.layer(layer)
        assert {k: ctx.key_tokens(layer, k) for k in view} == {k: count_value(view[k]) for k in view}
        assert ctx.tokens(layer) == sum(count_value(view[k]) for k in view)
    # what the tape rebuilds (counting every value anew) is the context, token counts included
    replayed = LayeredContext.replay(ctx.tape)
    assert replayed == ctx and replayed.token_report() == ctx.token_report()


def test_complete_activity_gives_a_mutable_copy_of_its_record() -> None:
    ctx = LayeredContext()
    ctx.begin_activity("t")
    ctx.write(Layer.WORKING, "a", {"x": [1, 2]})
    record = ctx.complete_activity("t", details={"extra": {"nested": [1]}})
    assert record == dict(ctx.layer(Layer.HISTORY)["activity:t"])
    assert type(record) is dict and type(record["keys"]) is list and type(record["extra"]) is dict
    assert type(record["extra"]["nested"]) is list
    record["keys"].append("changed")  # a copy: the record in HISTORY stays as it was
    assert ctx.layer(Layer.HISTORY)["activity:t"]["keys"] == ["a"]


JSON = st.recursive(st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=6), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8)


@settings(max_examples=120, deadline=None)
@given(JSON, st.sampled_from(["notes", "tool:search", "a"]))
def test_a_frozen_values_remembered_text_and_what_it_keys_are_the_plain_ones(value: Any, key: str) -> None:
    frozen = freeze(value)
    assert canonical_text(frozen) == canonical_json(frozen) == canonical_json(value)
    assert canonical_text(frozen) == canonical_text(frozen)  # remembered: the same again
    # an equal value built anew (another key order) is remembered under the same text, and what the
    # memories give for it is what the plain functions give
    again = freeze(json.loads(json.dumps(value, sort_keys=True)))
    for v in (frozen, again):
        assert entry_shingles(key, v) == shingles(entry_words(key, v))
    if isinstance(frozen, dict):
        tool = freeze({"kind": "tool_call_result", "tool": "t", **value})
        assert _tool_mark(tool) == _mark(tool)
