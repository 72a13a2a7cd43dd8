"""The context model called the way an outsider would from DESIGN.md and the seed: the
activity config as its JSON (the seed's ActivityExtensionConfig example) wherever a config is
taken, the denial's layers under the names its message and ``to_dict`` use, a view built
positionally, the seed's ``toolEfficiency``."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from context_layers import (ActivityExtensionConfig, AttentionScore, CompressTriggerDetector, ContextWriteDenied,
                            Layer, LayeredContext, RuleDrivenCompressor, View, drop_tool_results, evaluate, render)

SEED_CONFIG: dict[str, Any] = {
    "activityId": "risk_assessment",
    "contextStrategy": {
        "preserveKeys": ["risk_level", "assessment_id"],
        "compressRules": [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]},
                          {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 20}],
        "compressTokenThreshold": 400,
        "attentionThresholds": {"density": 0.15, "redundancy": 0.3},
    },
    "mergeStrategy": "MERGE_WITH_CONFLICT_DETECT",
    "knowledgeConfig": {"ragCollections": ["risk_kb", "policy_kb"], "confidenceThreshold": 0.7},
}


def _context() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "dual approval above 100000"})
    ctx.write(Layer.PROCESS, "amount", 120000)
    for i in range(4):
        ctx.begin_activity(f"step_{i}")
        ctx.write(Layer.WORKING, f"tool_call_result_{i}",
                  {"status": "ok", "data": {"id": i, "rows": ["a long row of data"] * 20}})
        ctx.write(Layer.WORKING, f"reasoning_chain_{i}", "The applicant earns a steady income. " * 15)
        if i == 0:
            ctx.write(Layer.WORKING, "risk_level", "medium")
        ctx.complete_activity(f"step_{i}")
    return ctx


CALLS: list[tuple[str, Callable[[LayeredContext, Any], Any]]] = [
    ("detect", lambda ctx, cfg: CompressTriggerDetector().detect(ctx, cfg).triggers),
    ("calculate_attention_score", lambda ctx, cfg: CompressTriggerDetector().calculate_attention_score(ctx, cfg)),
    ("AttentionScore.compute", lambda ctx, cfg: AttentionScore.compute(ctx, cfg)),
    ("compress", lambda ctx, cfg: RuleDrivenCompressor().compress(ctx, cfg).to_dict()["tokens_after"]),
    ("compress then evaluate", lambda ctx, cfg: RuleDrivenCompressor().evaluate(
        ctx, RuleDrivenCompressor().compress(ctx, cfg).snapshot_id, cfg).preserved_intact),
    ("evaluate()", lambda ctx, cfg: evaluate(ctx, RuleDrivenCompressor().compress(ctx, cfg).snapshot_id, cfg).ratio),
]


@pytest.mark.parametrize("call", [c for _, c in CALLS], ids=[n for n, _ in CALLS])
def test_a_config_may_be_given_as_the_seeds_json(call: Callable[[LayeredContext, Any], Any]) -> None:
    as_model = call(_context(), ActivityExtensionConfig.model_validate(SEED_CONFIG))
    as_json = call(_context(), SEED_CONFIG)
    assert as_json == as_model


def test_a_bad_json_config_names_the_field() -> None:
    with pytest.raises(ValueError, match="compressTokenThreshold"):
        CompressTriggerDetector().detect(_context(), {"compressTokenThreshold": "many"})


def test_the_denial_names_its_layers_as_its_message_does() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    with pytest.raises(ContextWriteDenied) as denied:
        ctx.write(Layer.WORKING, "policy", "x", actor="rogue")
    err = denied.value
    assert (err.key, err.target, err.effective) == ("policy", Layer.WORKING, Layer.SYSTEM)
    assert (err.target_layer, err.requested_layer, err.effective_layer) == (Layer.WORKING, Layer.WORKING, Layer.SYSTEM)
    assert err.layer == Layer.SYSTEM  # the layer whose rule refused it


def test_a_view_takes_its_anchor_and_hooks_positionally() -> None:
    ctx = _context()
    ctx.anchor("handoff")
    ctx.begin_activity("late")
    ctx.write(Layer.WORKING, "tool:search", {"kind": "tool_result", "result": "x"})
    ctx.complete_activity("late")
    positional = View(ctx, "handoff", [drop_tool_results])
    keywords = View(ctx, anchor="handoff", hooks=(drop_tool_results,))
    assert render(positional) == render(keywords) == render(ctx.view("handoff", [drop_tool_results]))


def test_the_seeds_score_names() -> None:
    score = CompressTriggerDetector().calculate_attention_score(_context())
    assert score.toolEfficiency == score.tool_efficiency == score.to_dict()["toolEfficiency"]


def test_the_seeds_read_names() -> None:
    """The seed's ``resolveKey`` (null when absent) and ``findExistingLayer``, in Python spelling."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.WORKING, "draft", 1)
    assert ctx.resolve_key("policy") == "p" and ctx.resolve_key("draft") == 1
    assert ctx.resolve_key("absent") is None
    assert ctx.find_existing_layer("policy") is Layer.SYSTEM and ctx.find_existing_layer("absent") is None


@pytest.mark.parametrize("fmt", ["xml", "json", "plain"])
def test_render_takes_the_format_positionally_and_in_any_case(fmt: str) -> None:
    ctx = _context()
    expected = render(ctx, format=fmt)
    assert render(ctx, fmt) == render(ctx, format=fmt.upper()) == render(ctx.view(), fmt.upper()) == expected


def test_the_actor_may_be_passed_positionally() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.WORKING, "draft", 1, "submit")
    ctx.delete(Layer.WORKING, "draft", "cleanup")
    assert [e.actor for e in ctx.tape][-2:] == ["submit", "cleanup"]


def test_a_detection_compares_equal_to_the_seeds_boolean() -> None:
    """The seed's ``boolean detect(...)``: ``detect(...) == True`` reads as it does there."""
    detector = CompressTriggerDetector()
    fired = detector.detect(_context(), {"compressTokenThreshold": 10})
    quiet = detector.detect(LayeredContext(system={"policy": "p"}), {"compressTokenThreshold": 10_000})
    assert fired == True and fired != False  # noqa: E712 - the comparison is the point
    assert quiet == False and quiet != True  # noqa: E712
    assert fired == detector.detect(_context(), {"compressTokenThreshold": 10})


@pytest.mark.parametrize(("key", "value", "dropped"), [
    ("search_1", {"kind": "tool_result", "rows": [1]}, True),
    ("search_2", {"kind": "tool_call_result", "rows": [1]}, True),
    ("tool:search", {"rows": [1]}, True),  # DESIGN's HISTORY records: tool results under tool:
    ("tool_call_result", {"status": "ok"}, True),  # named as the seed's compressRules name them
    ("tool_call_result_1", {"status": "ok"}, True),
    ("tool_result:search", "3 rows", True),
    ("tool:search_call", {"kind": "tool_call", "args": {}}, False),  # a call is kept
    ("tool_call_results_summary", "kept", False),  # another word
    ("risk_level", "medium", False),
])
def test_drop_tool_results_knows_a_result_by_its_kind_or_its_key(key: str, value: Any, dropped: bool) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("search")
    ctx.write(Layer.WORKING, key, value)
    ctx.complete_activity("search")
    shown = ctx.view(hooks=[drop_tool_results]).layer(Layer.HISTORY)
    assert (key not in shown) is dropped
    assert "activity:search" in shown and key in ctx.layer(Layer.HISTORY)  # the context keeps it


@pytest.mark.parametrize(("results", "expected"), [
    ({"tool_call_result_1": {"status": "ok", "data": {"id": 1}}, "tool_call_result_2": {"status": "error"},
      "tool_call_result_3": {"status": "ok", "data": {}}}, 1 / 3),
    ({"search_1": {"kind": "tool_result", "rows": [1]}, "search_2": {"kind": "tool_result", "error": "boom"}}, 1 / 2),
    ({"tool:search": {"rows": [1]}, "tool:lookup": {"rows": []}}, 1 / 2),
    ({"risk_level": "medium"}, 1.0),
])
def test_tool_efficiency_counts_the_seeds_tool_call_results(results: dict[str, Any], expected: float) -> None:
    """toolEfficiency = useful tool results / tool calls, on entries named as the seed names them."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("search")
    for key, value in results.items():
        ctx.write(Layer.WORKING, key, value)
    ctx.complete_activity("search")
    assert CompressTriggerDetector().calculate_attention_score(ctx).tool_efficiency == pytest.approx(expected)


def test_history_is_not_written_directly_even_a_key_it_holds() -> None:
    """HISTORY is filled at activity end (and rewritten by the compressor), never written
    directly; a WORKING write of a key HISTORY holds is auto-promoted there, as before."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("assess")
    ctx.write(Layer.WORKING, "risk_level", "medium")
    ctx.complete_activity("assess")
    with pytest.raises(ContextWriteDenied) as denied:
        ctx.write(Layer.HISTORY, "risk_level", "high", actor="rogue")
    assert (denied.value.target, denied.value.effective) == (Layer.HISTORY, Layer.HISTORY)
    assert ctx.tape[-1].kind == "denied" and ctx.resolve("risk_level") == "medium"
    assert ctx.write(Layer.WORKING, "risk_level", "high", actor="review") is Layer.HISTORY
    assert ctx.resolve("risk_level") == "high"


def test_rollback_is_a_restore_and_a_snapshot_has_its_id_by_the_seeds_name() -> None:
    ctx = _context()
    snap = ctx.snapshot("before")
    assert snap.snapshot_id == snap.id
    ctx.begin_activity("later")
    ctx.write(Layer.WORKING, "late", 1)
    ctx.complete_activity("later")
    event = ctx.rollback(snap.snapshot_id, layers=["L3"])
    assert event.kind == "restore" and dict(ctx.layer(Layer.HISTORY)) == dict(snap.layer(Layer.HISTORY))
    ctx.rollback(snap)
    assert ctx.as_dict() == snap.as_dict()


def test_a_replayed_tape_equals_the_tape_it_was_replayed_from() -> None:
    ctx = _context()
    replayed = LayeredContext.replay(ctx.tape)
    assert replayed.tape == ctx.tape and replayed.tape == list(ctx.tape)
    assert LayeredContext.replay(ctx.tape, until=3).tape == ctx.tape[:3]
    assert LayeredContext.replay(ctx.tape, until=3).tape != ctx.tape


@pytest.mark.parametrize("name", ["L4", "WORKING", "working", 4])
def test_layer_by_its_names(name: Any) -> None:
    assert Layer(name) is Layer.WORKING is Layer.parse(name)


def test_an_unknown_layer_is_refused() -> None:
    with pytest.raises(ValueError):
        Layer("L9")
