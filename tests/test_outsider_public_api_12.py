"""Outsider round 12: checks written from DESIGN.md and the README against the public names only
(``from context_layers import ...``, ``from gateways import ...``). Each expectation is worked out
by hand from DESIGN.md's rules."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from context_layers import (
    ActivityExtensionConfig,
    AttentionScore,
    AttentionThresholds,
    CompressResult,
    CompressTriggerDetector,
    ContextWriteDenied,
    EventKind,
    Layer,
    LayeredContext,
    RuleDrivenCompressor,
    drop_tool_results,
    render,
)
from gateways import ConflictDetector, ContextSplitter, MergedConflict

L = Layer
HOLDERS = (L.PROCESS, L.KNOWLEDGE, L.WORKING, L.EPHEMERAL)


def _holding(layer: Layer) -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(layer, "k", 1, actor="seed")
    return ctx


# ----- write rule: auto-promotion, then the permission of the effective layer ------------------


def _expected(holder: Layer, target: Layer) -> tuple[Layer, bool]:
    """(effective layer, denied) by DESIGN: the lower of the holder and the target; SYSTEM is never
    writable; PROCESS refuses a second write of a key it holds; HISTORY is not written directly."""
    effective = min(holder, target)
    if effective == L.SYSTEM:
        return effective, True
    if effective == L.PROCESS and holder == L.PROCESS:
        return effective, True
    if effective == L.HISTORY:  # only when HISTORY is the target here (no holder is HISTORY)
        return effective, True
    return effective, False


@pytest.mark.parametrize("holder", HOLDERS, ids=lambda x: x.name)
@pytest.mark.parametrize("target", list(L), ids=lambda x: x.name)
def test_write_rule_for_every_layer_pair(holder: Layer, target: Layer) -> None:
    ctx = _holding(holder)
    before = ctx.state_json()
    tape_before = len(ctx.tape)
    effective, denied = _expected(holder, target)
    if denied:
        with pytest.raises(ContextWriteDenied) as info:
            ctx.write(target, "k", 2, actor="rogue")
        err = info.value
        assert (err.key, err.requested, err.effective, err.op) == ("k", target, effective, "write")
        assert err.target == target
        assert ctx.state_json() == before  # nothing half-written
        assert len(ctx.tape) == tape_before + 1
        event = ctx.tape[-1]
        assert event.kind == EventKind.DENIED and event.key == "k" and event.actor == "rogue"
        assert event.data["requested"] == int(target) and event.data["effective"] == int(effective)
        assert event.changes == ()
        assert ctx.resolve("k") == 1
    else:
        assert ctx.write(target, "k", 2, actor="w") == effective
        assert ctx.layer(effective)["k"] == 2
        assert ctx.resolve("k") == 2  # the lowest layer holding the key answers, and that is the written one
        assert ctx.tape[-1].kind == EventKind.WRITE
    assert LayeredContext.replay(ctx.tape) == ctx


def test_system_frozen_for_new_and_existing_keys() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    for target in L:
        with pytest.raises(ContextWriteDenied) as info:
            ctx.write(target, "policy", "changed")
        assert info.value.effective == L.SYSTEM and info.value.requested == target
    with pytest.raises(ContextWriteDenied) as info:
        ctx.write(L.SYSTEM, "brand_new", 1)
    assert info.value.effective == L.SYSTEM
    with pytest.raises(ContextWriteDenied) as info:
        ctx.delete(L.EPHEMERAL, "policy")
    assert (info.value.op, info.value.effective, info.value.requested) == ("delete", L.SYSTEM, L.EPHEMERAL)
    assert dict(ctx.layer(L.SYSTEM)) == {"policy": "p"}
    assert [e.kind for e in ctx.tape].count(EventKind.DENIED) == len(L) + 2
    assert LayeredContext.replay(ctx.tape) == ctx


def test_process_append_only_same_value_and_delete() -> None:
    ctx = LayeredContext(process={"amount": 120000})
    # the same value again is still a second write of a key PROCESS holds: append-only says no
    with pytest.raises(ContextWriteDenied) as info:
        ctx.write(L.PROCESS, "amount", 120000)
    assert info.value.effective == L.PROCESS
    with pytest.raises(ContextWriteDenied) as info:
        ctx.delete(L.PROCESS, "amount")
    assert info.value.op == "delete"
    with pytest.raises(ContextWriteDenied) as info:
        ctx.delete(L.WORKING, "amount")  # auto-promoted to PROCESS, still refused
    assert (info.value.requested, info.value.effective) == (L.WORKING, L.PROCESS)
    deny = ctx.tape[-1]
    assert deny.kind == EventKind.DENIED and deny.data["op"] == "delete" and deny.key == "amount"
    assert ctx.resolve("amount") == 120000
    # a new PROCESS key is fine, once
    ctx.write(L.PROCESS, "applicant", "A1")
    assert list(ctx.layer(L.PROCESS)) == ["amount", "applicant"]
    assert LayeredContext.replay(ctx.tape) == ctx


def test_complete_activity_moves_working_clears_ephemeral_and_records() -> None:
    ctx = LayeredContext(system={"policy": "p"}, process={"amount": 1})
    ctx.write(L.WORKING, "carried", "from before")  # WORKING the activity did not write
    ctx.begin_activity("risk")
    ctx.write(L.WORKING, "risk_level", "high")
    ctx.write(L.EPHEMERAL, "scratch", "x")
    ctx.write(L.WORKING, "gone", 1)
    ctx.delete(L.WORKING, "gone")
    record = ctx.complete_activity("risk", preserve_keys=["risk_level"])
    assert dict(ctx.layer(L.WORKING)) == {} and dict(ctx.layer(L.EPHEMERAL)) == {}
    history = ctx.layer(L.HISTORY)
    assert list(history) == ["carried", "risk_level", "activity:risk"]
    assert history["risk_level"] == "high" and "gone" not in history
    rec = history["activity:risk"]
    assert rec == record
    assert rec["kind"] == "activity" and rec["activity"] == "risk" and rec["status"] == "completed"
    assert isinstance(rec["summary"], str) and rec["summary"]
    assert "risk_level" in rec["keys"] and "carried" in rec["keys"]
    assert rec["tokens"] == ctx.key_tokens(L.HISTORY, "risk_level") + ctx.key_tokens(L.HISTORY, "carried")
    assert "risk_level" in ctx.preserved
    # SYSTEM and PROCESS untouched; the move is one tape event
    assert ctx.as_dict()["L0"] == {"policy": "p"} and ctx.as_dict()["L1"] == {"amount": 1}
    assert ctx.tape[-1].kind == EventKind.COMPLETE
    # a second run of the same task gets a record of its own, never overwriting the first
    ctx.begin_activity("risk")
    ctx.write(L.WORKING, "risk_level", "low")  # auto-promoted: HISTORY holds it
    ctx.complete_activity("risk")
    assert ctx.layer(L.HISTORY)["activity:risk"] == rec
    assert [k for k in ctx.layer(L.HISTORY) if k.startswith("activity:risk")] == ["activity:risk", "activity:risk#2"]
    assert ctx.resolve("risk_level") == "low"
    assert LayeredContext.replay(ctx.tape) == ctx


# ----- replay after every kind of event, byte-identical at any seq ---------------------------


def _busy_context() -> tuple[LayeredContext, dict[int, str]]:
    """A context taken through every kind of event; the state (canonical text) after each seq."""
    states: dict[int, str] = {}

    def mark() -> None:
        states[ctx.tape[-1].seq] = ctx.state_json()

    ctx = LayeredContext(system={"policy": "p"}, process={"app": "A1"})
    mark()
    ctx.begin_activity("t1"); mark()
    ctx.write(L.WORKING, "reasoning_chain", {"kind": "reasoning_chain", "text": "we considered it. " * 80}); mark()
    for i in range(4):
        ctx.write(L.WORKING, f"tool_call_result_{i}",
                  {"kind": "tool_call_result", "status": "ok", "data": {"id": f"S{i}", "blob": "x " * 60}}); mark()
    ctx.write(L.WORKING, "keep", {"decision": "approve", "why": "because " * 20}); mark()
    ctx.write(L.EPHEMERAL, "scratch", 1); mark()
    with pytest.raises(ContextWriteDenied):
        ctx.write(L.WORKING, "policy", "x")
    mark()
    ctx.write(L.WORKING, "tmp", 1); mark()
    ctx.delete(L.WORKING, "tmp"); mark()
    ctx.complete_activity("t1", preserve_keys=["keep"]); mark()
    snap = ctx.snapshot(label="s"); mark()
    ctx.write(L.WORKING, "after", [1, 2]); mark()
    ctx.restore(snap); mark()
    cfg = {"activityId": "t2", "compressTokenThreshold": 150, "preserveKeys": ["keep"], "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]},
        {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 12}]}
    comp = RuleDrivenCompressor()
    comp.compress(ctx, cfg, triggers=[]); mark()
    comp.decompress(ctx); mark()
    comp.compress(ctx, cfg); mark()
    return ctx, states


def test_replay_equals_after_every_event_and_rebuild_is_byte_identical() -> None:
    ctx, states = _busy_context()
    kinds = {e.kind for e in ctx.tape}
    assert {EventKind.DENIED, EventKind.DELETE, EventKind.SNAPSHOT, EventKind.RESTORE, EventKind.CHANGES,
            EventKind.COMPLETE} <= kinds
    assert LayeredContext.replay(ctx.tape) == ctx
    assert LayeredContext.replay([e.to_dict() for e in ctx.tape]) == ctx
    for event in ctx.tape:
        rebuilt = LayeredContext.replay(ctx.tape, until=event.seq)
        if event.seq in states:
            assert rebuilt.state_json() == states[event.seq], event
        # byte-identical rendering of the rebuild, too
        assert render(rebuilt, format="json") == render(LayeredContext.replay(ctx.tape, until=event.seq), format="json")
    for fmt in ("xml", "json", "plain"):
        assert render(LayeredContext.replay(ctx.tape), format=fmt) == render(ctx, format=fmt)


def test_compression_keeps_preserved_key_and_reports_fields() -> None:
    ctx, _ = _busy_context()
    assert ctx.layer(L.HISTORY)["keep"] == {"decision": "approve", "why": "because " * 20}
    comp = RuleDrivenCompressor()
    ctx2 = LayeredContext.replay(ctx.tape)
    result = comp.compress(ctx2, {"activityId": "t3", "compressTokenThreshold": 1, "preserveKeys": ["keep"]})
    assert isinstance(result, CompressResult)
    assert ctx2.layer(L.HISTORY)["keep"] == {"decision": "approve", "why": "because " * 20}
    if result.changed:
        assert result.snapshot_id in ctx2.snapshots
        assert result.tokens_after == ctx2.tokens(L.HISTORY) + ctx2.tokens(L.WORKING)
        assert result.ratio == pytest.approx(result.tokens_after / result.tokens_before)
        assert isinstance(result.attention_before, AttentionScore) and isinstance(result.attention_after, AttentionScore)
    assert LayeredContext.replay(ctx2.tape) == ctx2


def test_rule_compression_fields_and_undo() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("t1")
    for i in range(3):
        ctx.write(L.WORKING, f"tool_call_result_{i}",
                  {"kind": "tool_call_result", "status": "ok", "data": {"id": f"S{i}", "blob": "y " * 80}})
    ctx.complete_activity("t1")
    before = ctx.state_json()
    tokens_before = ctx.tokens(L.HISTORY) + ctx.tokens(L.WORKING)
    comp = RuleDrivenCompressor()
    result = comp.compress(ctx, {"activityId": "x", "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]}]}, triggers=[])
    assert result.tokens_before == tokens_before
    assert result.tokens_after == ctx.tokens(L.HISTORY) + ctx.tokens(L.WORKING) < tokens_before
    assert result.ratio == pytest.approx(result.tokens_after / result.tokens_before)
    assert result.entries_affected == 3 and result.triggers == []
    assert result.rules == [{"pattern": "tool_call_result", "action": "extract_keys", "entries": 3}]
    for i in range(3):
        value = ctx.layer(L.HISTORY)[f"tool_call_result_{i}"]
        assert value["status"] == "ok" and value["data"] == {"id": f"S{i}"}
    assert ctx.get_snapshot(result.snapshot_id).tokens(L.HISTORY) == tokens_before
    json.dumps(result.to_dict())
    comp.decompress(ctx, result)
    assert ctx.state_json() == before
    assert LayeredContext.replay(ctx.tape) == ctx


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 7])
@pytest.mark.parametrize("text", ["word " * 300, "x" * 4000, "数据" * 400, "First point. Second point. " * 50])
def test_summarize_offline_fallback_respects_max_tokens(max_tokens: int, text: str) -> None:
    from context_layers.tokens import count_text  # the counter DESIGN names (tiktoken, offline)

    ctx = LayeredContext()
    ctx.begin_activity("a")
    ctx.write(L.WORKING, "reasoning_chain", {"kind": "reasoning_chain", "text": text})
    ctx.complete_activity("a")
    RuleDrivenCompressor().compress(ctx, {"activityId": "z", "compressRules": [
        {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": max_tokens}]}, triggers=[])
    value = ctx.layer(L.HISTORY)["reasoning_chain"]
    summary = value["summary"] if isinstance(value, dict) else value
    assert isinstance(summary, str) and summary
    assert count_text(summary) <= max_tokens


# ----- attention thresholds exactly at and around the defaults ------------------------------


def test_attention_defaults_at_threshold_do_not_fire_across_do() -> None:
    t = AttentionThresholds()
    assert (t.density, t.redundancy, t.decay, t.conflict, t.tool_efficiency) == (0.15, 0.3, 0.6, 0.05, 0.5)
    at = AttentionScore(density=0.15, redundancy=0.3, decay=0.6, conflict=0.05, tool_efficiency=0.5)
    assert at.crossed(t) == []
    eps = 1e-9
    across = AttentionScore(density=0.15 - eps, redundancy=0.3 + eps, decay=0.6 - eps, conflict=0.05 + eps,
                            tool_efficiency=0.5 - eps)
    assert across.crossed(t) == ["density", "redundancy", "decay", "conflict", "toolEfficiency"]
    inside = AttentionScore(density=0.15 + eps, redundancy=0.3 - eps, decay=0.6 + eps, conflict=0.05 - eps,
                            tool_efficiency=0.5 + eps)
    assert inside.crossed(t) == []
    ctx = LayeredContext()
    ctx.begin_activity("a"); ctx.write(L.WORKING, "x", "y"); ctx.complete_activity("a")
    det = CompressTriggerDetector()
    assert not det.detect(ctx, {"activityId": "a"}, attention=at)
    decision = det.detect(ctx, {"activityId": "a"}, attention=across)
    assert list(decision) == ["density", "redundancy", "decay", "conflict", "toolEfficiency"]
    # one at a time
    for name, value in (("density", 0.1), ("redundancy", 0.31), ("decay", 0.59), ("conflict", 0.06),
                        ("tool_efficiency", 0.49)):
        one = AttentionScore(**{**{"density": 0.15, "redundancy": 0.3, "decay": 0.6, "conflict": 0.05,
                                   "tool_efficiency": 0.5}, name: value})
        assert det.detect(ctx, {"activityId": "a"}, attention=one).triggers == [
            "toolEfficiency" if name == "tool_efficiency" else name]


def test_size_triggers_exactly_at_threshold() -> None:
    ctx = LayeredContext()
    ctx.begin_activity("a"); ctx.write(L.WORKING, "x", "some words here"); ctx.complete_activity("a")
    tokens = ctx.tokens(L.HISTORY) + ctx.tokens(L.WORKING)
    entries = len(ctx.layer(L.HISTORY))
    calm = AttentionScore()
    det = CompressTriggerDetector()
    assert not det.detect(ctx, {"activityId": "a", "compressTokenThreshold": tokens,
                                "compressMessageThreshold": entries}, attention=calm)
    fired = det.detect(ctx, {"activityId": "a", "compressTokenThreshold": tokens - 1,
                             "compressMessageThreshold": entries - 1}, attention=calm)
    assert fired.triggers == ["token_threshold", "message_threshold"]
    assert fired.values["token_threshold"] == tokens and fired.values["message_threshold"] == entries


def test_computed_attention_scores_are_in_unit_interval() -> None:
    ctx, _ = _busy_context()
    score = AttentionScore.compute(ctx, ActivityExtensionConfig.model_validate({"activityId": "a"})
                                   if hasattr(ActivityExtensionConfig, "model_validate") else None)
    for value in score.to_dict().values():
        assert 0.0 <= value <= 1.0


# ----- conflict detection: canonical JSON, deletes, same values ------------------------------


@pytest.mark.parametrize("base, a, b, conflict", [
    ({"k": 1}, {"k": 1.0}, {"k": 1}, False),               # 1 and 1.0: one JSON number, no change at all
    ({"k": 1}, {"k": 1.0}, {"k": 2}, False),               # a did not change it (1.0 == base), b did
    ({"k": 0}, {"k": True}, {"k": 1}, True),               # true is not 1 in JSON
    ({"k": {}}, {"k": {"x": 1, "y": 2}}, {"k": {"y": 2, "x": 1}}, False),  # key order
    ({}, {"k": [1, {"z": 1, "a": 2}]}, {"k": [1, {"a": 2, "z": 1}]}, False),
    ({}, {"k": [1, 2]}, {"k": [2, 1]}, True),               # list order matters
    ({"k": 1}, {}, {"k": 2}, True),                         # delete vs write
    ({"k": 1}, {}, {}, False),                              # both deleted: same change
    ({"k": 1}, {}, {"k": 1}, False),                        # b wrote the base value back: no change
    ({"k": 1}, {"k": None}, {}, True),                      # null is a value, not a delete
    ({"k": {"n": 1}}, {"k": {"n": 1.0}}, {"k": {"n": 2}}, False),
])
def test_detect_conflicts_canonical(base, a, b, conflict) -> None:
    found = ConflictDetector().detect_conflicts(base, {"a": a, "b": b})
    assert bool(found) is conflict
    if conflict:
        (c,) = found
        assert isinstance(c, MergedConflict) and c.key == "k"
        assert c.sourceBranches == ["a", "b"]
        assert json.dumps(c.to_dict())  # JSON-able, a delete included


def test_delete_vs_write_conflict_shape() -> None:
    (c,) = ConflictDetector().detect_conflicts({"k": 1, "same": 0}, {"a": {"same": 5}, "b": {"k": 2, "same": 5}})
    assert c.key == "k" and c.baseValue == 1
    assert c.conflictingValues == [{"$deleted": True}, 2]
    assert c.to_dict()["conflicting_values"] == {"a": {"$deleted": True}, "b": 2}


def test_split_join_history_order_and_replay() -> None:
    ctx = LayeredContext(system={"s": 1}, process={"p": 1})
    ctx.write(L.KNOWLEDGE, "kn", {"text": "t", "source": "x", "confidence": 0.5})
    ctx.begin_activity("t0"); ctx.write(L.WORKING, "w", 1); ctx.write(L.EPHEMERAL, "e", 1); ctx.complete_activity("t0")
    ctx.write(L.EPHEMERAL, "eph", 1)
    a, b = ContextSplitter().split(ctx, "gw", ["A", "B"])
    for br in (a, b):
        assert dict(br.context.layer(L.EPHEMERAL)) == {}                  # cleared on split
        assert br.context.layer(L.WORKING)["_branch_id"] == br.branch_id
        assert br.context.as_dict()["L3"] == ctx.as_dict()["L3"]
        assert br.context.as_dict()["L2"] == ctx.as_dict()["L2"]
    a.context.begin_activity("ta"); a.context.write(L.WORKING, "x", 1); a.context.write(L.WORKING, "only_a", 1)
    a.context.complete_activity("ta")
    b.context.begin_activity("tb"); b.context.write(L.WORKING, "y", 1); b.context.write(L.WORKING, "x", 1.0)
    b.context.complete_activity("tb")
    assert ConflictDetector().detect_conflicts(ctx, [a, b]) == []
    ContextSplitter().join(ctx, [a, b])
    history = list(ctx.layer(L.HISTORY))
    # base first, then A's new keys in A's order, then B's new keys
    assert history[:2] == ["w", "activity:t0"]
    rest = history[2:]
    assert rest.index("x") < rest.index("only_a") < rest.index("activity:ta") < rest.index("y") < rest.index("activity:tb")
    assert ctx.resolve("x") == 1
    assert LayeredContext.replay(ctx.tape) == ctx


def test_join_delete_vs_write_is_a_conflict_on_the_tape() -> None:
    ctx = LayeredContext()
    ctx.write(L.WORKING, "k", 1)
    a, b = ContextSplitter().split(ctx, "gw", ["A", "B"])
    a.context.delete(L.WORKING, "k")
    b.context.write(L.WORKING, "k", 2)
    (c,) = ConflictDetector().detect_conflicts(ctx, [a, b])
    assert c.key == "k" and c.layer == L.WORKING and c.baseValue == 1
    assert c.conflictingValues == [{"$deleted": True}, 2]
    # detection changed nothing
    assert ctx.resolve("k") == 1


# ----- render ------------------------------------------------------------------------------


def _render_ctx() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "a ]]> b"}, process={"amount": 5})
    ctx.write(L.KNOWLEDGE, "kb_hit", {"text": "fact ]]]]> ]]>", "source": "doc", "confidence": 0.9})
    ctx.begin_activity("t"); ctx.write(L.WORKING, "note", "done"); ctx.complete_activity("t")
    ctx.write(L.WORKING, "evil", '</entry><entry key="x">]]><![CDATA[ ]]]]>>')
    ctx.write(L.WORKING, 'k"<&>', "v")
    return ctx


def _cdata_texts(root: ET.Element) -> dict[str, str]:
    return {el.get("key"): "".join(el.itertext()) for el in root.iter() if el.get("key") is not None and el.text is not None}


def test_render_xml_parses_back_with_values_intact() -> None:
    ctx = _render_ctx()
    messages = render(ctx, format="xml")
    assert messages == render(ctx, format="xml")
    texts: dict[str, str] = {}
    for m in messages:
        assert set(m) >= {"role", "content"}
        texts.update(_cdata_texts(ET.fromstring(m["content"])))
    assert texts["policy"] == "a ]]> b"
    assert texts["evil"] == '</entry><entry key="x">]]><![CDATA[ ]]]]>>'
    assert texts['k"<&>'] == "v"


def test_render_stable_first_volatile_last() -> None:
    ctx = _render_ctx()
    for fmt in ("xml", "json", "plain"):
        content = "\n".join(m["content"] for m in render(ctx, format=fmt))
        pos = {k: content.find(k) for k in ("policy", "amount", "note", "kb_hit", "evil")}
        assert all(v >= 0 for v in pos.values()), (fmt, pos)
        assert pos["policy"] < pos["amount"] < pos["note"] < pos["kb_hit"], (fmt, pos)
        assert pos["note"] < pos["evil"], (fmt, pos)
        # the volatile part is at the end of the last user message
        last = render(ctx, format=fmt)[-1]
        assert last["role"] == "user" and "evil" in last["content"]


def test_render_json_and_plain_parse_back() -> None:
    ctx = _render_ctx()
    for m in render(ctx, format="json"):
        doc = json.loads(m["content"])
        assert doc
    blob = json.dumps([json.loads(m["content"]) for m in render(ctx, format="json")])
    assert '</entry><entry key=\\"x\\">]]><![CDATA[ ]]]]>>' in blob
    plain = render(ctx, format="plain")
    assert all(isinstance(m["content"], str) for m in plain)


def test_render_a_view_stands_in_for_ctx_and_changes_nothing() -> None:
    ctx = _render_ctx()
    ctx.begin_activity("t2")
    ctx.write(L.WORKING, "tool_call_result_1", {"kind": "tool_call_result", "status": "ok", "data": "zzz-tool-zzz"})
    ctx.complete_activity("t2")
    tape_len = len(ctx.tape)
    state = ctx.state_json()
    for fmt in ("xml", "json", "plain"):
        assert render(ctx.view(), format=fmt) == render(ctx, format=fmt)
        hidden = render(ctx.view(hooks=[drop_tool_results]), format=fmt)
        assert "zzz-tool-zzz" not in "".join(m["content"] for m in hidden)
        assert "zzz-tool-zzz" in "".join(m["content"] for m in render(ctx, format=fmt))
    assert len(ctx.tape) == tape_len and ctx.state_json() == state


def test_decompress_keeps_what_later_activities_wrote() -> None:
    ctx = LayeredContext()
    ctx.begin_activity("t1")
    for i in range(3):
        ctx.write(L.WORKING, f"tool_call_result_{i}",
                  {"kind": "tool_call_result", "status": "ok", "data": {"id": f"S{i}", "blob": "x " * 80}})
    ctx.write(L.WORKING, "old", "o")
    ctx.complete_activity("t1")
    original = dict(ctx.layer(L.HISTORY))
    comp = RuleDrivenCompressor()
    result = comp.compress(ctx, {"activityId": "z", "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status"]}]}, triggers=[])
    assert ctx.layer(L.HISTORY)["tool_call_result_0"] != original["tool_call_result_0"]
    ctx.begin_activity("t2")
    ctx.write(L.WORKING, "tool_call_result_1", "newer")  # auto-promoted into HISTORY
    ctx.delete(L.WORKING, "old")                          # auto-promoted delete from HISTORY
    ctx.write(L.WORKING, "fresh", 1)
    ctx.complete_activity("t2")
    comp.decompress(ctx, result)
    history = ctx.layer(L.HISTORY)
    assert history["tool_call_result_0"] == original["tool_call_result_0"]
    assert history["tool_call_result_2"] == original["tool_call_result_2"]
    assert history["tool_call_result_1"] == "newer" and "old" not in history and history["fresh"] == 1
    assert list(history) == ["tool_call_result_0", "tool_call_result_1", "tool_call_result_2", "activity:t1",
                             "fresh", "activity:t2"]
    assert LayeredContext.replay(ctx.tape) == ctx


def test_three_branches_conflict_lists_only_changers() -> None:
    (c,) = ConflictDetector().detect_conflicts(
        {"k": 0, "u": 1}, {"a": {"k": 1, "u": 1}, "b": {"k": 2, "u": 1}, "c": {"k": 1, "u": 1}, "d": {"k": 0, "u": 1}})
    assert c.values == {"a": 1, "b": 2, "c": 1}   # d left it as it was
    assert c.conflictingValues == [1, 2]           # distinct, in branch order
    assert c.sourceBranches == ["a", "b", "c"]


def test_join_history_order_three_branches_shared_new_key() -> None:
    ctx = LayeredContext()
    ctx.begin_activity("t0"); ctx.write(L.WORKING, "base1", 1); ctx.complete_activity("t0")
    a, b, c = ContextSplitter().split(ctx, "g", ["A", "B", "C"])
    # B finishes first in time; order still follows the branches
    b.context.begin_activity("tb"); b.context.write(L.WORKING, "shared", 5); b.context.write(L.WORKING, "b1", 1)
    b.context.complete_activity("tb")
    a.context.begin_activity("ta"); a.context.write(L.WORKING, "a1", 1); a.context.write(L.WORKING, "shared", 5)
    a.context.complete_activity("ta")
    c.context.begin_activity("tc"); c.context.write(L.WORKING, "c1", 1); c.context.complete_activity("tc")
    ContextSplitter().join(ctx, [a, b, c])
    assert list(ctx.layer(L.HISTORY)) == ["base1", "activity:t0", "a1", "shared", "activity:ta", "b1",
                                          "activity:tb", "c1", "activity:tc"]
    assert LayeredContext.replay(ctx.tape) == ctx


# ----- config: a JSON/YAML boolean is not a number ------------------------------------------


@pytest.mark.parametrize("config, field", [
    ({"compressTokenThreshold": True}, "compressTokenThreshold"),      # YAML `yes` would be threshold 1
    ({"compressMessageThreshold": True}, "compressMessageThreshold"),
    ({"attentionThresholds": {"density": True}}, "attentionThresholds.density"),
    ({"attentionThresholds": {"toolEfficiency": False}}, "attentionThresholds.toolEfficiency"),
    ({"compressRules": [{"pattern": "x", "action": "summarize", "maxTokens": True}]}, "compressRules.0.maxTokens"),
    ({"compressRules": [{"pattern": "x", "action": "count_only", "keepLast": True}]}, "compressRules.0.keepLast"),
])
def test_boolean_for_a_number_is_a_config_error_naming_the_field(config: dict, field: str) -> None:
    from context_layers import ConfigError

    with pytest.raises(ConfigError) as info:
        CompressTriggerDetector().detect(LayeredContext(), {"activityId": "a", **config})
    assert field in str(info.value)
    assert "bool" in str(info.value) or "true" in str(info.value).lower() or "false" in str(info.value).lower()


def test_anchored_view_renders_from_the_anchor_and_keeps_stable_layers() -> None:
    ctx = LayeredContext(system={"policy": "p"}, process={"amt": 1})
    ctx.begin_activity("a"); ctx.write(L.WORKING, "early_key", "EARLY"); ctx.complete_activity("a")
    ctx.anchor("here")
    ctx.begin_activity("b"); ctx.write(L.WORKING, "late_key", "LATE"); ctx.write(L.WORKING, "early_key", "EARLY2")
    ctx.complete_activity("b")
    tape_len = len(ctx.tape)
    for fmt in ("xml", "json", "plain"):
        messages = render(ctx.view(anchor="here"), format=fmt)
        text = "".join(m["content"] for m in messages)
        assert messages == render(ctx.view(anchor="here"), format=fmt)
        assert "policy" in text and "amt" in text           # SYSTEM and PROCESS are never cut
        assert "LATE" in text and "EARLY2" in text           # written after the anchor
        assert "activity:a" not in text                      # HISTORY before the anchor is hidden
    assert len(ctx.tape) == tape_len
    assert LayeredContext.replay(ctx.tape) == ctx


def test_model_summary_longer_than_max_tokens_is_cut() -> None:
    from context_layers.tokens import count_text

    ctx = LayeredContext()
    ctx.begin_activity("a")
    ctx.write(L.WORKING, "reasoning_chain", {"kind": "reasoning_chain", "text": "long thought " * 200})
    ctx.complete_activity("a")

    def chatty(text: str, max_tokens: int) -> str:
        return "the model ignores its budget and goes on " * 20

    RuleDrivenCompressor(chatty).compress(ctx, {"activityId": "z", "compressRules": [
        {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 6}]}, triggers=[])
    value = ctx.layer(L.HISTORY)["reasoning_chain"]
    summary = value["summary"] if isinstance(value, dict) else value
    assert count_text(summary) <= 6 and summary
    assert LayeredContext.replay(ctx.tape) == ctx
