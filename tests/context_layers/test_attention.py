"""Attention scores (one formula each) and the trigger detector."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, config_from_dict
from context_layers.attention import (
    AttentionScore,
    CompressTriggerDetector,
    Scope,
    conflict,
    decay,
    density,
    redundancy,
    segment_history,
    tool_efficiency,
)
from context_layers.similarity import entry_words, jaccard, near_duplicate_clusters, shingles, word_sets

LOREM = ("The applicant runs a bakery in the old town with four employees and steady revenue; "
         "the bank statements show regular deposits, a small overdraft in March and no missed payments. ")


def put(ctx: LayeredContext, layer: Layer, items: dict[str, Any]) -> None:
    ctx.apply_changes([(layer, k, v) for k, v in items.items()], kind="test", actor="test")


def activity(ctx: LayeredContext, task: str, writes: dict[str, Any], preserve: tuple[str, ...] = ()) -> None:
    ctx.begin_activity(task)
    for k, v in writes.items():
        ctx.write(Layer.WORKING, k, v, actor=task)
    ctx.complete_activity(task, preserve_keys=preserve)


def text(n: int, seed: str) -> str:
    """Distinct prose: every sentence carries the seed, so two seeds never look alike."""
    return " ".join(f"{seed} sentence {i} about {seed}-{i * 7} and more words {seed}{i}." for i in range(n))


# ----- edge cases ------------------------------------------------------------------------------


def test_empty_context_is_quiet() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    score = AttentionScore.compute(ctx)
    assert score == AttentionScore()
    assert score.to_dict() == {"density": 1.0, "redundancy": 0.0, "decay": 1.0, "conflict": 0.0, "toolEfficiency": 1.0}
    decision = CompressTriggerDetector().detect(ctx, ActivityExtensionConfig(compress_token_threshold=1,
                                                                             compress_message_threshold=1))
    assert not decision.fired and decision.triggers == []
    assert decision.explain() == "no trigger fired"


def test_scores_are_in_unit_interval_and_to_dict_uses_camel_case() -> None:
    ctx = LayeredContext()
    for i in range(6):
        activity(ctx, f"a{i}", {f"k{i}": text(3, f"s{i}"), f"tool:{i}": {"kind": "tool_call_result", "status": "error"}})
    score = AttentionScore.compute(ctx, config_from_dict({"preserveKeys": ["k1"]}))
    for name, value in score.to_dict().items():
        assert 0.0 <= value <= 1.0, name
    assert set(score.to_dict()) == {"density", "redundancy", "decay", "conflict", "toolEfficiency"}
    assert score.tool_efficiency == 0.0
    assert "tokens" in score.public_details() and "_labels" not in score.public_details()


# ----- one formula each ---------------------------------------------------------------------------


def test_density_formula() -> None:
    ctx = LayeredContext()
    put(ctx, Layer.HISTORY, {"risk_level": "medium", "notes": text(5, "n")})
    put(ctx, Layer.WORKING, {"draft": text(2, "d")})
    pinned = ctx.key_tokens(Layer.HISTORY, "risk_level")
    total = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    config = config_from_dict({"preserveKeys": ["risk_level"]})
    assert density(Scope.of(ctx, config)) == pytest.approx(pinned / total)
    # no preserved key present: nothing to dilute
    assert density(Scope.of(ctx)) == 1.0
    # ctx.preserved counts as well as the config's keys
    activity(ctx, "t", {"assessment_id": "RA001"}, preserve=("assessment_id",))
    scope = Scope.of(ctx)
    assert density(scope) == pytest.approx(ctx.key_tokens(Layer.HISTORY, "assessment_id") / scope.tokens)


def test_redundancy_counts_entries_that_repeat_an_earlier_one() -> None:
    dup = text(4, "same")
    scope = Scope.build([("a", dup), ("b", dup), ("c", dup), ("d", text(4, "other"))])
    assert redundancy(scope) == pytest.approx(2 / 4)
    # one word changed in a long text is still a near-duplicate
    near = dup.replace("same sentence 3", "same phrase 3")
    assert jaccard(shingles(entry_words("x", dup)), shingles(entry_words("x", near))) >= 0.8
    assert redundancy(Scope.build([("a", dup), ("b", near)])) == pytest.approx(1 / 2)
    assert redundancy(Scope.build([("a", text(4, "one")), ("b", text(4, "two"))])) == 0.0
    assert redundancy(Scope.build([("a", dup)])) == 0.0


def test_redundancy_ignores_field_names_and_compressor_records() -> None:
    one = {"kind": "tool_call_result", "applicant": "Ada", "amount": 50000, "city": "Lyon"}
    two = {"kind": "tool_call_result", "applicant": "Bob", "amount": 72000, "city": "Oslo"}
    assert redundancy(Scope.build([("tool:1", one), ("tool:2", two)])) == 0.0
    record = {"kind": "compaction", "summary": text(3, "z"), "covers": ["x"]}
    assert redundancy(Scope.build([("z", text(3, "z")), ("compaction:1", record)])) == 0.0


def test_redundancy_uses_lsh_beyond_the_exact_limit_and_agrees_with_exact() -> None:
    items = []
    for c in range(60):
        base = text(6, f"c{c}")
        for m in range(5):
            items.append((f"e{c}_{m}", base.replace(f"c{c} sentence 2 ", f"c{c} variant {m} ")))
    sets = word_sets(items)
    approx = near_duplicate_clusters(sets)
    exact = near_duplicate_clusters(sets, exact_limit=10**9)
    assert not approx.exact and exact.exact
    assert exact.redundant == 60 * 4
    assert approx.redundant == exact.redundant
    score = AttentionScore.of_scope(Scope.build(items))
    assert score.redundancy == pytest.approx(240 / 300)
    assert score.details["redundancy_exact"] is False


def test_mass_repetition_is_linear() -> None:
    items = [(f"k{i}", "the same log line repeated over and over") for i in range(5000)]
    clusters = near_duplicate_clusters(word_sets(items))
    assert clusters.redundant == 4999 and clusters.clusters == 1


def test_decay_formula_uses_activity_ownership() -> None:
    ctx = LayeredContext()
    for i in range(5):
        activity(ctx, f"a{i}", {f"k{i}": text(1 + (4 - i) * 3, f"s{i}")})
    put(ctx, Layer.WORKING, {"draft": "working now"})
    history = ctx.layer(Layer.HISTORY)
    seg = segment_history([(k, history[k]) for k in history])
    assert seg.records == tuple(f"activity:a{i}" for i in range(5))
    assert seg.owner["k0"] == "activity:a0" and seg.owner["activity:a3"] == "activity:a3"
    tok = lambda k: ctx.key_tokens(Layer.HISTORY, k)  # noqa: E731
    old = sum(tok(k) for k in ("k0", "activity:a0", "k1", "activity:a1"))
    new = sum(tok(k) for k in ("k2", "activity:a2", "k3", "activity:a3", "k4", "activity:a4"))
    new += ctx.key_tokens(Layer.WORKING, "draft")
    assert decay(Scope.of(ctx), 3) == pytest.approx(new / (new + old))
    assert decay(Scope.of(ctx), 5) == 1.0
    # preserved keys are timeless
    config = config_from_dict({"preserveKeys": ["k0"]})
    old -= tok("k0")
    assert decay(Scope.of(ctx, config), 3) == pytest.approx(new / (new + old))


def test_decay_open_tail_and_unlisted_keys() -> None:
    ctx = LayeredContext()
    activity(ctx, "a0", {"k0": "x"})
    # a key written into HISTORY by the engine (a join result, say) belongs to the next record
    put(ctx, Layer.HISTORY, {"merged": "joined value"})
    activity(ctx, "a1", {"k1": "y"})
    put(ctx, Layer.HISTORY, {"late": "after the last activity"})
    history = ctx.layer(Layer.HISTORY)
    seg = segment_history([(k, history[k]) for k in history])
    assert seg.owner["merged"] == "activity:a1"
    assert seg.owner["late"] is None


def test_conflict_formula() -> None:
    ctx = LayeredContext()
    put(ctx, Layer.HISTORY, {"amount": 50000, "status": "open", "_branch_id": "x", "activity:a": {"kind": "activity"}})
    put(ctx, Layer.WORKING, {"amount": 60000, "status": "open", "note": "n", "_branch_id": "y"})
    # K = {amount, status, note}; amount differs between HISTORY and WORKING
    assert conflict(Scope.of(ctx)) == pytest.approx(1 / 3)
    put(ctx, Layer.WORKING, {"amount": 50000.0})  # JSON-equal: not a conflict
    assert conflict(Scope.of(ctx)) == 0.0
    merged = [{"key": "approval_status", "values": {"a": "approved", "b": "rejected"}, "resolution": None},
              {"key": "status", "resolution": {"value": "open", "resolver": "policy", "reason": "r"}}]
    put(ctx, Layer.PROCESS, {"_mergedConflicts": merged})
    # approval_status joins K as an unresolved conflict: 1 of 4
    score = AttentionScore.compute(ctx)
    assert score.conflict == pytest.approx(1 / 4)
    assert score.details["conflicting_keys"] == ["approval_status"]


def test_tool_efficiency_formula() -> None:
    entries = [
        ("tool:1", {"kind": "tool_call_result", "tool": "search", "status": "ok", "data": {"id": 1}}),
        ("tool:2", {"kind": "tool_call_result", "tool": "search", "status": "error", "data": {"id": 2}}),
        ("tool:3", {"kind": "tool_call_result", "tool": "search", "status": "ok", "data": {}}),
        ("tool:4", {"kind": "tool_call_result", "tool": "search", "status": "ok", "data": {"id": 1}}),  # duplicate
        ("tool:5", {"kind": "tool_call_result", "tool": "fetch", "ok": False, "result": "x"}),
        ("tool:6", {"kind": "tool_call", "tool": "fetch", "call_id": "c6"}),  # answered below
        ("tool:6r", {"kind": "tool_call_result", "tool": "fetch", "call_id": "c6", "result": "page"}),
        ("tool:7", {"kind": "tool_call", "tool": "fetch", "call_id": "c7"}),  # never answered
        ("other", {"kind": "tool_call_result", "tool": "calc", "result": 42}),  # kind alone makes a tool entry
    ]
    scope = Scope.build(entries)
    # calls: 7 results (tool:6 is answered by tool:6r) + 1 pending (tool:7) = 8;
    # useful: tool:1, tool:6r, other = 3
    assert tool_efficiency(scope) == pytest.approx(3 / 8)
    details = AttentionScore.of_scope(scope).public_details()
    assert details["useless_tool_results"] == ["tool:2", "tool:3", "tool:4", "tool:5"]
    assert details["pending_tool_calls"] == ["tool:7"]
    assert tool_efficiency(Scope.build([("a", 1)])) == 1.0


# ----- each trigger alone ----------------------------------------------------------------------------


def _token(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {"notes": text(6, "t")})
    return config_from_dict({"compressTokenThreshold": 60})


def _message(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {f"k{i}": f"value {i} {'x' * i}" for i in range(5)})
    return config_from_dict({"compressMessageThreshold": 3})


def _density(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {"risk_level": "medium", "notes": text(8, "d")})
    return config_from_dict({"preserveKeys": ["risk_level"]})


def _redundancy(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {"a": text(3, "r"), "b": text(3, "r"), "c": text(3, "r"), "d": text(3, "q")})
    return ActivityExtensionConfig()


def _decay(ctx: LayeredContext) -> ActivityExtensionConfig:
    for i in range(5):
        activity(ctx, f"a{i}", {f"k{i}": text(12 if i < 2 else 1, f"s{i}")})
    return ActivityExtensionConfig()


def _conflict(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {"approval_status": "approved"})
    put(ctx, Layer.WORKING, {"approval_status": "rejected"})
    return ActivityExtensionConfig()


def _tools(ctx: LayeredContext) -> ActivityExtensionConfig:
    put(ctx, Layer.HISTORY, {"tool:1": {"kind": "tool_call_result", "tool": "search", "error": "timeout after 30 s"},
                             "tool:2": {"kind": "tool_call_result", "tool": "crm", "status": "ok", "rows": []}})
    return ActivityExtensionConfig()


TRIGGER_CASES: list[tuple[str, Callable[[LayeredContext], ActivityExtensionConfig]]] = [
    ("token_threshold", _token),
    ("message_threshold", _message),
    ("density", _density),
    ("redundancy", _redundancy),
    ("decay", _decay),
    ("conflict", _conflict),
    ("toolEfficiency", _tools),
]


@pytest.mark.parametrize(("trigger", "build"), TRIGGER_CASES, ids=[t for t, _ in TRIGGER_CASES])
def test_each_trigger_fires_alone(trigger: str, build: Callable[[LayeredContext], ActivityExtensionConfig]) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    config = build(ctx)
    decision = CompressTriggerDetector().detect(ctx, config)
    assert decision.fired
    assert decision.triggers == [trigger], decision.explain()
    assert trigger in decision.explain()
    assert set(decision.values) == set(decision.thresholds) == {
        "token_threshold", "message_threshold", "density", "redundancy", "decay", "conflict", "toolEfficiency"}
    assert decision.to_dict()["triggers"] == [trigger]


def test_attention_thresholds_come_from_config() -> None:
    ctx = LayeredContext()
    _density(ctx)
    strict = config_from_dict({"preserveKeys": ["risk_level"], "attentionThresholds": {"density": 0.0001}})
    assert CompressTriggerDetector().detect(ctx, strict).triggers == []
    nested = config_from_dict({"contextStrategy": {"preserveKeys": ["risk_level"],
                                                   "attentionThresholds": {"density": 0.9}}})
    assert CompressTriggerDetector().detect(ctx, nested).triggers == ["density"]


def test_attention_triggers_wait_for_the_cliff_target() -> None:
    ctx = LayeredContext()
    _redundancy(ctx)
    tokens = ctx.tokens(Layer.HISTORY)
    # a token threshold puts the floor at ratio x threshold: this context is below it
    config = config_from_dict({"compressTokenThreshold": tokens * 4})
    decision = CompressTriggerDetector().detect(ctx, config)
    assert decision.triggers == [] and decision.suppressed == ["redundancy"]
    assert decision.min_attention_tokens == tokens * 2
    assert CompressTriggerDetector(min_attention_tokens=0).detect(ctx, config).triggers == ["redundancy"]


def test_a_decision_is_true_exactly_when_a_trigger_fired() -> None:
    # the seed's detector returns a boolean; the decision was always true (a plain dataclass), so
    # ``if detector.detect(ctx, config):`` compressed a context nothing fired on
    ctx = LayeredContext()
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "note", "a few words", actor="a")
    ctx.complete_activity("a")
    quiet = CompressTriggerDetector().detect(ctx, ActivityExtensionConfig(compress_token_threshold=10_000))
    assert not quiet.fired and not quiet and bool(quiet) is False
    loud = CompressTriggerDetector().detect(ctx, ActivityExtensionConfig(compress_token_threshold=1))
    assert loud.fired and loud and loud.triggers == ["token_threshold"]
