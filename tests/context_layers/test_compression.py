"""Rule-driven compression: actions, cliff, idempotence, evaluate/decompress, plans."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, config_from_dict
from context_layers.attention import CompressTriggerDetector
from context_layers.canonical import canonical_json
from context_layers.compress_rules import apply_rule, apply_rules, extract_paths
from context_layers.compression import RuleDrivenCompressor, after_activity, decompress, evaluate
from context_layers.compression_plan import (
    CompressionPlan,
    CompressionPlanRejected,
    build_compression_prompt,
    execute_plan,
    parse_compression_plan,
)
from context_layers.config import CompressRule
from context_layers.errors import ContextKeyError, ModelError
from context_layers.summarize import ExtractiveSummarizer, build_summary_request
from context_layers.tokens import count_text

ROOT = Path(__file__).resolve().parents[2]


def put(ctx: LayeredContext, layer: Layer, items: dict[str, Any]) -> None:
    ctx.apply_changes([(layer, k, v) for k, v in items.items()], kind="test", actor="test")


def activity(ctx: LayeredContext, task: str, writes: dict[str, Any], preserve: tuple[str, ...] = ()) -> None:
    ctx.begin_activity(task)
    for k, v in writes.items():
        ctx.write(Layer.WORKING, k, v, actor=task)
    ctx.complete_activity(task, preserve_keys=preserve)


def prose(n: int, seed: str) -> str:
    return " ".join(f"{seed} observed item {i}: value {seed}-{i * 13} was checked against rule {i % 5}." for i in range(n))


def tool_result(i: int, *, status: str = "ok") -> dict[str, Any]:
    return {"kind": "tool_call_result", "tool": "credit_bureau", "status": status,
            "data": {"id": f"CB{i}", "summary": f"score {600 + i}", "raw": [prose(2, f"raw{i}")]}}


def history(ctx: LayeredContext) -> list[tuple[str, Any]]:
    view = ctx.layer(Layer.HISTORY)
    return [(k, view[k]) for k in view]


def loan_context(activities: int = 10) -> tuple[LayeredContext, ActivityExtensionConfig]:
    """A loan-like run: every activity writes notes, a tool result and a reasoning chain."""
    ctx = LayeredContext(system={"policy": "lend responsibly"})
    activity(ctx, "submit", {"amount": 50000, "applicant_id": "APP001", "purpose": "business"},
             preserve=("amount", "applicant_id"))
    activity(ctx, "risk_assessment", {"risk_level": "medium", "assessment_id": "RA001",
                                      "risk_factors": ["new customer", "cross-industry"]},
             preserve=("risk_level", "assessment_id", "risk_factors"))
    for i in range(activities):
        activity(ctx, f"review_{i}", {
            f"notes_{i}": prose(6, f"n{i}"),
            f"tool:{i}": tool_result(i),
            f"reasoning_{i}": {"kind": "reasoning_chain", "steps": [prose(3, f"r{i}")]},
        })
    config = config_from_dict({
        "preserveKeys": ["risk_level", "assessment_id", "risk_factors"],
        "compressTokenThreshold": 3000,
        "compressRules": [
            {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id", "data.summary"]},
            {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 40},
        ],
    })
    return ctx, config


# ----- the three actions -------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern, key, kind, hit", [
    ("tool_call_result", "tool_call_result", None, True),
    ("tool_call_result", "tool:1", "tool_call_result", True),  # by kind
    ("tool_call_result", "tool_call_result_1", None, True),  # a plain word: the keys it begins
    ("tool_call_result", "tool_call_result:search", None, True),
    ("tool_call_result", "tool_call_results", None, False),  # not up to a separator
    ("tool_call_result", "my_tool_call_result", None, False),
    ("tool_*", "tool_call_result_1", None, True),
    ("tool_?", "tool_call_result", None, False),  # a glob matches as a glob only
])
def test_what_a_rule_pattern_matches(pattern: str, key: str, kind: str | None, hit: bool) -> None:
    assert CompressRule(pattern=pattern, action="count_only").matches(kind, key) is hit


def test_extract_keys_keeps_paths_and_reports_missing_ones() -> None:
    items = [("tool:1", tool_result(1)), ("tool:2", {"kind": "tool_call_result", "status": "ok"}), ("x", "text")]
    rule = CompressRule(pattern="tool_call_result", action="extract_keys", extract_keys=["status", "data.id", "data.nope"])
    out = apply_rule(items, rule)
    assert dict(out.items)["tool:1"] == {"kind": "tool_call_result", "_compressed": "extract_keys", "status": "ok",
                                         "data": {"id": "CB1"}}
    assert out.missing_paths == {"tool:1": ("data.nope",), "tool:2": ("data.id", "data.nope")}
    # tool:2 only has status: the reduced value would not be smaller, so it stays as it was
    assert dict(out.items)["tool:2"] == {"kind": "tool_call_result", "status": "ok"}
    assert out.affected == ("tool:1",)
    assert apply_rule(out.items, rule).items == out.items


def test_extract_keys_list_index_default_and_unresolvable() -> None:
    value = {"kind": "k", "rows": [{"id": 7, "blob": "x" * 400}], "status": "ok", "big": {"a": "y" * 300}}
    reduced, missing = extract_paths(value, ["rows.0.id"])
    assert reduced == {"kind": "k", "_compressed": "extract_keys", "rows": [{"id": 7}]} and missing == []
    again, _ = extract_paths(reduced, ["rows.0.id"])
    assert again == reduced
    # no extractKeys: short top-level scalars
    reduced, _ = extract_paths(value, [])
    assert reduced == {"kind": "k", "_compressed": "extract_keys", "status": "ok"}
    # nothing resolves, or not an object: left unchanged
    assert extract_paths(value, ["nope"]) == (None, ["nope"])
    assert extract_paths("text", ["a"]) == (None, ["a"])


def test_summarize_fits_max_tokens_and_keeps_kind() -> None:
    long = {"kind": "reasoning_chain", "steps": [prose(20, "s")], "activity": "review"}
    items = [("reasoning", long), ("note", prose(30, "t"))]
    rule = CompressRule(pattern="*", action="summarize", max_tokens=25)
    out = apply_rule(items, rule)
    values = dict(out.items)
    for key in ("reasoning", "note"):
        assert values[key]["_compressed"] == "summarize"
        assert 0 < count_text(values[key]["summary"]) <= 25
    assert values["reasoning"]["kind"] == "reasoning_chain" and values["reasoning"]["activity"] == "review"
    assert values["note"]["kind"] == "data"
    assert apply_rule(out.items, rule).items == out.items
    # a smaller budget summarizes the summary again; a larger one leaves it
    tighter = apply_rule(out.items, CompressRule(pattern="*", action="summarize", max_tokens=10))
    assert count_text(dict(tighter.items)["note"]["summary"]) <= 10
    assert apply_rule(out.items, CompressRule(pattern="*", action="summarize", max_tokens=80)).items == out.items


def test_summarize_leaves_entries_that_would_not_shrink() -> None:
    items = [("short", "ok")]
    assert apply_rule(items, CompressRule(pattern="*", action="summarize", max_tokens=50)).items == tuple(items)


def test_count_only_keeps_the_last_entries_and_counts() -> None:
    items = [(f"retry:{i}", {"kind": "error_retry_log", "attempt": i, "error": prose(2, f"e{i}")}) for i in range(6)]
    items.insert(2, ("other", "kept"))
    rule = CompressRule(pattern="error_retry_log", action="count_only", keep_last=2)
    out = apply_rule(items, rule)
    values = dict(out.items)
    assert [k for k, _ in out.items] == ["other", "retry:4", "retry:5", "summary:count:error_retry_log"]
    assert values["summary:count:error_retry_log"] == {
        "kind": "count", "_compressed": "count_only", "pattern": "error_retry_log", "count": 6, "dropped": 4,
        "kept": ["retry:4", "retry:5"]}
    assert values["retry:5"] == dict(items)["retry:5"]
    assert apply_rule(out.items, rule).items == out.items
    # new entries later: the counter goes on
    more = [*out.items, ("retry:6", {"kind": "error_retry_log", "attempt": 6, "error": prose(2, "e6")})]
    later = dict(apply_rule(more, rule).items)
    assert later["summary:count:error_retry_log"]["count"] == 7
    assert later["summary:count:error_retry_log"]["dropped"] == 5
    zero = apply_rule(items, CompressRule(pattern="error_retry_log", action="count_only"))
    assert dict(zero.items)["summary:count:error_retry_log"]["kept"] == []


PRESERVE_RULES = [
    CompressRule(pattern="*", action="extract_keys", extract_keys=["status"]),
    CompressRule(pattern="*", action="extract_keys"),
    CompressRule(pattern="*", action="summarize", max_tokens=5),
    CompressRule(pattern="*", action="count_only", keep_last=0),
]


@pytest.mark.parametrize("rule", PRESERVE_RULES, ids=lambda r: f"{r.action}-{r.extract_keys}")
def test_preserved_and_required_keys_survive_every_action(rule: CompressRule) -> None:
    ctx = LayeredContext()
    pinned = {"risk_level": {"kind": "tool_call_result", "status": "ok", "detail": prose(8, "p")},
              "risk_factors": [prose(4, "f")]}
    activity(ctx, "risk", {**pinned, "needed": prose(5, "q"), "other": {"status": "ok", "x": prose(5, "o")}},
             preserve=("risk_level",))
    config = ActivityExtensionConfig.model_validate({
        "preserveKeys": ["risk_factors"], "compressRules": [rule.model_dump()],
        "contextStrategy": {"requiredContext": ["needed"]}})
    before = {k: canonical_json(v) for k, v in history(ctx)}
    result = RuleDrivenCompressor().compress(ctx, config, triggers=[])
    after = dict(history(ctx))
    for key in ("risk_level", "risk_factors", "needed"):
        assert canonical_json(after[key]) == before[key]
    assert result.entries_affected > 0
    assert evaluate(ctx, result.snapshot_id, config).preserved_intact


# ----- the compressor ---------------------------------------------------------------------------------------


def test_compress_is_a_cliff_to_the_target_in_one_event() -> None:
    ctx, config = loan_context()
    decision = CompressTriggerDetector().detect(ctx, config)
    assert "token_threshold" in decision.triggers
    tape_before = len(ctx.tape)
    result = RuleDrivenCompressor().compress(ctx, config)
    # a snapshot, then one event holding every change
    assert len(ctx.tape) == tape_before + 2
    snap_event, event = ctx.tape[-2], ctx.tape[-1]
    assert snap_event.kind == "snapshot" and snap_event.data["snapshot_id"] == result.snapshot_id
    assert event.kind == "changes" and event.data["note"] == "compress" and event.seq == result.event_seq
    assert len(event.changes) == result.entries_affected
    assert event.data["tokens_after"] == result.tokens_after
    assert result.tokens_after == ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    assert result.target_tokens == 1500 and result.target_met
    assert result.tokens_after <= 1500 < result.tokens_before
    assert result.ratio == pytest.approx(result.tokens_after / result.tokens_before)
    assert result.ratio < 0.5
    # the compaction record
    record = ctx.layer(Layer.HISTORY)[result.compaction_key]
    assert result.compaction_key == "compaction:1"
    assert record["kind"] == "compaction" and record["snapshot_id"] == result.snapshot_id
    assert record["tokens_before"] == result.tokens_before and record["tokens_after"] == result.tokens_after
    # covers: a whole activity by its record key, other keys one by one; folded: every key
    assert "activity:review_0" in record["covers"] and "notes_0" not in record["covers"]
    assert "notes_0" in result.folded and record["entries"] == len(result.folded)
    assert all(k not in ctx.layer(Layer.HISTORY) for k in [*record["covers"], *result.folded])
    assert record["summary"].strip()
    # the latest activity is never folded; preserved keys stay
    assert f"activity:review_{9}" in ctx.layer(Layer.HISTORY)
    for key in ("risk_level", "assessment_id", "risk_factors", "amount", "applicant_id"):
        assert key in ctx.layer(Layer.HISTORY)
    report = evaluate(ctx, result.snapshot_id, config)
    assert report.preserved_intact and report.changed_preserved == []
    assert set(report.checked_preserved) == {"risk_level", "assessment_id", "risk_factors", "amount", "applicant_id"}
    assert report.attention_after.density > report.attention_before.density and report.density_gain > 0
    assert report.tokens_before == result.tokens_before and report.tokens_after == result.tokens_after


def test_the_result_answers_to_the_seed_names() -> None:
    # the seed's CompressResult: beforeTokens, afterTokens, compressionRatio = 1 - after / before
    ctx, config = loan_context()
    result = RuleDrivenCompressor().compress(ctx, config)
    assert (result.before_tokens, result.after_tokens) == (result.tokens_before, result.tokens_after)
    assert result.compression_ratio == pytest.approx(1.0 - result.tokens_after / result.tokens_before)
    assert result.compression_ratio > 0.5


def test_target_ratio_sets_the_depth() -> None:
    ctx, config = loan_context()
    strategy = config.context_strategy.model_copy(update={"compress_target_ratio": 0.3})
    result = RuleDrivenCompressor().compress(ctx, config.model_copy(update={"context_strategy": strategy}))
    assert result.target_tokens == 900 and result.target_met
    assert result.ratio <= 0.36  # the seed walk-through: 5000 -> 1800


def test_after_a_cliff_several_activities_append_without_compressing() -> None:
    ctx, config = loan_context()
    first = after_activity(ctx, config, actor="review_9")
    assert first is not None and first.changed
    prefix_key = first.compaction_key
    record = ctx.layer(Layer.HISTORY)[prefix_key]
    quiet = 0
    for i in range(10, 30):
        activity(ctx, f"review_{i}", {f"notes_{i}": prose(6, f"n{i}")})
        if after_activity(ctx, config, actor=f"review_{i}") is not None:
            break
        quiet += 1
        assert ctx.layer(Layer.HISTORY)[prefix_key] == record  # the prefix is stable between cliffs
    assert quiet >= 3
    # the next cliff merges the previous compaction record into a new one
    history_keys = list(ctx.layer(Layer.HISTORY))
    assert prefix_key not in history_keys and "compaction:2" in history_keys
    assert prefix_key in ctx.layer(Layer.HISTORY)["compaction:2"]["covers"]


def test_compressing_again_changes_nothing() -> None:
    ctx, config = loan_context()
    first = RuleDrivenCompressor().compress(ctx, config)
    assert first.changed
    state, tape = ctx.state_json(), len(ctx.tape)
    second = RuleDrivenCompressor().compress(ctx, config)
    assert second.entries_affected == 0 and second.snapshot_id is None and second.ratio == 1.0
    assert ctx.state_json() == state and len(ctx.tape) == tape
    assert after_activity(ctx, config) is None


def test_rules_only_when_nothing_fired() -> None:
    ctx, config = loan_context(3)
    result = RuleDrivenCompressor().compress(ctx, config, triggers=[])
    assert result.compaction_key is None and result.folded == []
    assert {r["pattern"]: r["entries"] for r in result.rules} == {"tool_call_result": 3, "reasoning_chain": 3}
    assert ctx.layer(Layer.HISTORY)["tool:0"] == {"kind": "tool_call_result", "_compressed": "extract_keys",
                                                  "status": "ok", "data": {"id": "CB0", "summary": "score 600"}}
    assert result.tokens_after < result.tokens_before


def test_explicit_target_tokens() -> None:
    ctx, config = loan_context(6)
    result = RuleDrivenCompressor().compress(ctx, config, triggers=["manual"], target_tokens=900)
    assert result.target_tokens == 900 and result.tokens_after <= 900 and result.target_met


def test_message_threshold_cliff() -> None:
    ctx, _ = loan_context(8)
    config = config_from_dict({"compressMessageThreshold": 20})
    result = RuleDrivenCompressor().compress(ctx, config)
    assert "message_threshold" in result.triggers
    assert len(ctx.layer(Layer.HISTORY)) <= 10 and result.target_met


def test_decompress_restores_byte_identical_layers() -> None:
    ctx, config = loan_context()
    before = ctx.state_json()
    layers_before = canonical_json(ctx.as_dict())
    result = RuleDrivenCompressor().compress(ctx, config)
    compressed = ctx.state_json()
    assert compressed != before
    undo = decompress(ctx, result.snapshot_id, actor="tester")
    assert ctx.state_json() == before and canonical_json(ctx.as_dict()) == layers_before
    assert undo.tokens_before == result.tokens_after and undo.tokens_after == result.tokens_before
    assert ctx.tape[-1].kind == "restore" and ctx.tape[-1].actor == "tester"
    # the compressed version stays on the tape, and the tape replays to the same context
    assert LayeredContext.replay(ctx.tape, until=result.event_seq).state_json() == compressed
    assert LayeredContext.replay(ctx.tape) == ctx
    with pytest.raises(ContextKeyError, match="cannot decompress"):
        decompress(ctx, "snap:nope")


def test_decompress_after_later_activities_keeps_what_they_wrote() -> None:
    # decompress put HISTORY back to the snapshot whole: an activity that ran after the compression
    # lost its keys and its record from the live context (a preserved key written since, too)
    ctx = LayeredContext()
    for i in range(3):
        ctx.begin_activity(f"search{i}")
        ctx.write(Layer.WORKING, f"hit{i}", {"kind": "tool_call_result", "status": "ok",
                                             "data": {"id": i, "blob": "x " * 300}}, actor="s")
        ctx.complete_activity(f"search{i}")
    config = config_from_dict({"compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]}]})
    full = {k: canonical_json(v) for k, v in ctx.layer(Layer.HISTORY).items()}
    result = RuleDrivenCompressor().compress(ctx, config, triggers=["manual"])
    assert result.entries_affected == 3
    ctx.begin_activity("decide")
    ctx.write(Layer.WORKING, "risk_level", "high", actor="decide")
    ctx.write(Layer.WORKING, "hit1", {"kind": "tool_call_result", "status": "redone"}, actor="decide")
    ctx.complete_activity("decide", preserve_keys=["risk_level"])
    decompress(ctx, result.snapshot_id)
    history = ctx.layer(Layer.HISTORY)
    assert canonical_json(history["hit0"]) == full["hit0"] and canonical_json(history["hit2"]) == full["hit2"]
    assert history["hit1"] == {"kind": "tool_call_result", "status": "redone"}  # changed since: kept
    assert history["risk_level"] == "high" and history["activity:decide"]["keys"] == ["risk_level", "hit1"]
    assert list(history)[-2:] == ["risk_level", "activity:decide"]
    assert LayeredContext.replay(ctx.tape) == ctx and LayeredContext.from_dict(ctx.to_dict()) == ctx


def test_evaluate_reports_a_changed_preserved_key() -> None:
    ctx, config = loan_context(3)
    # a compression (of a compressor of the application's own) that rewrote a preserved key
    snap = ctx.snapshot(label="before compress", actor="compressor")
    ctx.apply_changes([(Layer.HISTORY, "risk_level", "high")], kind="compress", actor="compressor",
                      data={"snapshot_id": snap.id})
    report = evaluate(ctx, snap.id, config)
    assert not report.preserved_intact and report.changed_preserved == ["risk_level"]
    assert report.to_dict()["changed_preserved"] == ["risk_level"]


def test_evaluate_reports_the_compression_not_a_later_change() -> None:
    ctx, config = loan_context(3)
    result = RuleDrivenCompressor().compress(ctx, config, triggers=[])
    put(ctx, Layer.HISTORY, {"risk_level": "high", "late": "x " * 300})  # after the compression: none of its doing
    report = evaluate(ctx, result.snapshot_id, config)
    assert report.preserved_intact and report.changed_preserved == []
    assert report.tokens_after == result.tokens_after and report.after_seq == result.event_seq


def test_redundancy_remedy_folds_older_duplicates() -> None:
    ctx = LayeredContext()
    same = prose(4, "dup")
    for i in range(6):
        activity(ctx, f"a{i}", {f"copy_{i}": same, f"own_{i}": prose(1, f"o{i}")})
    result = RuleDrivenCompressor().compress(ctx, ActivityExtensionConfig(), triggers=["redundancy"])
    hist = ctx.layer(Layer.HISTORY)
    assert [k for k in hist if k.startswith("copy_")] == ["copy_5"]
    assert set(result.folded) == {f"copy_{i}" for i in range(5)}
    assert result.attention_after.redundancy < result.attention_before.redundancy


def test_tool_efficiency_remedy_folds_useless_results() -> None:
    ctx = LayeredContext()
    for i in range(4):
        activity(ctx, f"a{i}", {f"tool:{i}": tool_result(i, status="error" if i < 3 else "ok")})
    result = RuleDrivenCompressor().compress(ctx, ActivityExtensionConfig())
    assert "toolEfficiency" in result.triggers
    assert set(result.folded) == {"tool:0", "tool:1", "tool:2"}
    assert result.attention_after.tool_efficiency == 1.0


def test_conflict_has_no_compression_remedy() -> None:
    ctx = LayeredContext()
    activity(ctx, "a", {"status": "approved"})
    put(ctx, Layer.WORKING, {"status": "rejected"})
    state = ctx.state_json()
    result = RuleDrivenCompressor().compress(ctx, ActivityExtensionConfig())
    assert result.triggers == ["conflict"] and result.entries_affected == 0 and ctx.state_json() == state


def test_attention_folds_wait_until_the_context_grows_back() -> None:
    ctx = LayeredContext()
    config = config_from_dict({"preserveKeys": ["id"]})
    activity(ctx, "start", {"id": "A1"})
    for i in range(6):
        activity(ctx, f"a{i}", {f"notes_{i}": prose(4, f"n{i}")})
    first = RuleDrivenCompressor().compress(ctx, config)
    assert "density" in first.triggers and first.compaction_key == "compaction:1"
    assert first.attention_after.density < 0.15  # out of reach: an id is tiny
    activity(ctx, "b", {"notes_b": prose(2, "b")})
    again = RuleDrivenCompressor().compress(ctx, config)
    assert "density" in again.triggers and again.entries_affected == 0


def test_fake_summarizer_gets_the_prefix_and_is_cut_to_budget() -> None:
    calls: list[tuple[str, int, Any]] = []

    class Verbose:
        def summarize(self, text: str, max_tokens: int, *, prefix_messages: Any = None) -> str:
            calls.append((text, max_tokens, prefix_messages))
            return "SUMMARY " * (max_tokens * 2)

    prefix = [{"role": "system", "content": "sys"}, {"role": "user", "content": "history"}]
    ctx, config = loan_context(4)
    RuleDrivenCompressor(Verbose(), prefix=lambda c: prefix).compress(ctx, config, triggers=[])
    assert calls and all(p == prefix for _, _, p in calls)
    summary = ctx.layer(Layer.HISTORY)["reasoning_0"]["summary"]
    assert count_text(summary) <= 40
    messages = build_summary_request(prefix, "a ]]> b", 40)
    assert messages[:2] == prefix and messages[-1]["role"] == "user"
    assert "]]]]><![CDATA[>" in messages[-1]["content"] and "40" in messages[-1]["content"]


def test_extractive_summarizer_is_deterministic_and_fits() -> None:
    summarizer = ExtractiveSummarizer()
    text = "\n".join(prose(3, f"line{i}") for i in range(40))
    for budget in (1, 7, 30, 200):
        out = summarizer.summarize(text, budget)
        assert count_text(out) <= budget and out == summarizer.summarize(text, budget)
    assert summarizer.summarize("short text", 50) == "short text"
    assert summarizer.summarize("a\na\na", 50) == "a"


# ----- the decision prompt and plans ---------------------------------------------------------------------


def test_prompt_shows_state_and_asks_for_json() -> None:
    ctx, config = loan_context(3)
    config = config.model_copy(update={"context_strategy": config.context_strategy.model_copy(
        update={"required_context": ["amount"]})})
    messages = build_compression_prompt(ctx, config)
    assert [m["role"] for m in messages] == ["system", "user"]
    body = messages[1]["content"]
    assert f"HISTORY (L3): {ctx.tokens(Layer.HISTORY)} tokens, {len(ctx.layer(Layer.HISTORY))} keys" in body
    assert "WORKING (L4): 0 tokens, 0 keys" in body
    assert "density=" in body and "toolEfficiency=" in body
    assert '"risk_level"' in body and 'requires: ["amount"]' in body
    assert '"id": "review_0"' in body
    assert '"summarize"' in messages[0]["content"] and '"keep_points"' in messages[0]["content"]
    assert build_compression_prompt(ctx, config) == messages


def test_parse_plan_from_fenced_camel_case_answer() -> None:
    plan = parse_compression_plan('Here:\n```json\n{"summarize": ["a"], "keepPoints": ["x"], "drop": [], "maxTokens": 50}\n```')
    assert plan == CompressionPlan(summarize=["a"], keep_points=["x"], max_tokens=50)
    for bad in ("no json here", '{"summarize": "a"}', '{"drop": [], "extra": 1}', '{"max_tokens": 0}', "{nope}"):
        with pytest.raises(ModelError):
            parse_compression_plan(bad)


@pytest.mark.parametrize("bad", [
    '{"keep_points": ["amount \\ud800 80000"]}',   # a JSON escape of a lone surrogate: no text
    '{"summarize": ["\\udc00"]}',
    {"drop": ["a\udfff"]},
])
def test_a_plan_the_context_cannot_hold_is_a_model_error(bad) -> None:
    # the keep points went into the compaction record, whose write refused them and
    # stopped the instance (invalid_value) instead of the rules taking over
    with pytest.raises(ModelError, match="lone surrogate"):
        parse_compression_plan(bad)


def test_execute_plan_folds_named_activities_and_drops_keys() -> None:
    ctx, config = loan_context(4)
    plan = CompressionPlan(summarize=["review_0", "activity:review_1", "ghost"], keep_points=["income verified"],
                           drop=["purpose", "missing"], max_tokens=60)
    result = execute_plan(ctx, plan, config)
    hist = ctx.layer(Layer.HISTORY)
    assert result.source == "plan" and result.triggers == ["plan"]
    assert "notes_0" not in hist and "activity:review_1" not in hist and "notes_2" in hist
    assert "purpose" not in hist and result.dropped == ["purpose"]
    record = hist[result.compaction_key]
    assert record["summary"].startswith("- income verified") and record["dropped"] == ["purpose"]
    assert any("ghost" in n for n in result.notes) and any("missing" in n for n in result.notes)
    assert ctx.tape[-1].data["note"] == "compression_plan_ignored"


def test_plan_touching_a_preserved_key_is_rejected_and_recorded() -> None:
    ctx, config = loan_context(2)
    state = ctx.state_json()
    with pytest.raises(CompressionPlanRejected) as err:
        execute_plan(ctx, CompressionPlan(drop=["risk_level", "notes_0"], summarize=["assessment_id"]), config)
    assert err.value.keys == ["assessment_id", "risk_level"] and err.value.kind == "permission_denied"
    assert "risk_level" in str(err.value) and "preserved" in str(err.value)
    assert ctx.tape[-1].data["note"] == "compression_plan_rejected"
    assert ctx.state_json() == state


# ----- properties ---------------------------------------------------------------------------------------------

_word = st.sampled_from(["loan", "risk", "ok", "error", "id", "amount", "bank", "review", "score", "note"])
_text = st.lists(_word, min_size=0, max_size=30).map(" ".join)
_leaf = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), _text)
_value = st.recursive(_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(["status", "data", "id", "summary", "x"]), inner, max_size=4)),
    max_leaves=12)
_kind = st.sampled_from(["tool_call_result", "reasoning_chain", "error_retry_log", "data"])
_entry = st.tuples(_kind, _value).map(lambda kv: kv[1] if kv[0] == "data" else
                                      {"kind": kv[0], **(kv[1] if isinstance(kv[1], dict) else {"data": kv[1]})})
_rule = st.one_of(
    st.builds(lambda p, ks: CompressRule(pattern=p, action="extract_keys", extract_keys=ks),
              st.sampled_from(["tool_call_result", "*", "k*", "data"]),
              st.lists(st.sampled_from(["status", "data.id", "summary", "data.0", "x.y"]), max_size=3)),
    st.builds(lambda p, n: CompressRule(pattern=p, action="summarize", max_tokens=n),
              st.sampled_from(["reasoning_chain", "*", "k1*"]), st.integers(1, 40)),
    st.builds(lambda p, n: CompressRule(pattern=p, action="count_only", keep_last=n),
              st.sampled_from(["error_retry_log", "*", "data"]), st.integers(0, 3)),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries=st.lists(_entry, min_size=1, max_size=12), rules=st.lists(_rule, max_size=4),
       pinned=st.sets(st.integers(0, 11), max_size=4), chunk=st.integers(1, 4), target=st.integers(0, 400))
def test_property_preserved_survive_tokens_shrink_idempotent(entries: list[Any], rules: list[CompressRule],
                                                             pinned: set[int], chunk: int, target: int) -> None:
    ctx = LayeredContext()
    keys = [f"k{i}" for i in range(len(entries))]
    for start in range(0, len(entries), chunk):
        writes = {keys[i]: entries[i] for i in range(start, min(start + chunk, len(entries)))}
        activity(ctx, f"t{start}", writes)
    preserve = [keys[i] for i in pinned if i < len(keys)]
    config = ActivityExtensionConfig.model_validate({"preserveKeys": preserve,
                                                     "compressRules": [r.model_dump() for r in rules]})
    before = {k: canonical_json(v) for k, v in history(ctx)}
    tokens = ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)
    compressor = RuleDrivenCompressor()
    result = compressor.compress(ctx, config, triggers=["manual"], target_tokens=target)
    assert result.tokens_after <= tokens == result.tokens_before
    now = dict(history(ctx))
    for key in preserve:
        assert canonical_json(now[key]) == before[key]
    state, tape = ctx.state_json(), len(ctx.tape)
    again = compressor.compress(ctx, config, triggers=["manual"], target_tokens=target)
    assert again.entries_affected == 0 and ctx.state_json() == state and len(ctx.tape) == tape
    if result.snapshot_id:
        decompress(ctx, result.snapshot_id)
        assert {k: canonical_json(v) for k, v in history(ctx)} == before


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(st.tuples(st.sampled_from(["a", "b", "c", "d"]), _entry), max_size=10), rules=st.lists(_rule, max_size=3))
def test_property_rules_are_idempotent(entries: list[tuple[str, Any]], rules: list[CompressRule]) -> None:
    items = [(f"{p}{i}", v) for i, (p, v) in enumerate(entries)]
    once = apply_rules(items, rules)
    assert apply_rules(once.items, rules).items == once.items
    for rule in rules:
        one = apply_rule(items, rule)
        assert apply_rule(one.items, rule).items == one.items


# ----- the benchmark runs (CI runs it in quick mode) -------------------------------------------------------------


def test_bench_quick_runs() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_compression.py"), "--quick", "--json"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows and all(r["preserved_retention"] == 1.0 for r in rows)
    assert all(r["tokens_after"] < r["tokens_before"] for r in rows)


def test_a_compression_asked_for_directly_folds_the_latest_activity_too() -> None:
    """Called directly, the compressor may fold all of HISTORY but the protected keys; the
    engine's hook keeps the activity that just ended whole (``HOOK_KEEP_RECENT``): the next
    step reads what it wrote."""
    from context_layers.compression import HOOK_KEEP_RECENT

    def one_activity() -> LayeredContext:
        ctx = LayeredContext(system={"policy": "p"})
        ctx.begin_activity("research")
        for i in range(12):
            ctx.write(Layer.WORKING, f"note_{i}", f"finding {i}: " + "the applicant's cash flow is steady " * 6)
        ctx.complete_activity("research", preserve_keys=["note_0"])
        return ctx

    config = config_from_dict({"compressTokenThreshold": 200})
    ctx = one_activity()
    result = RuleDrivenCompressor().compress(ctx, config)
    assert result.tokens_after < 200 < result.tokens_before  # under the threshold again
    assert ctx.resolve("note_0").startswith("finding 0") and "note_5" not in ctx  # preserved; folded
    hooked = one_activity()
    kept = RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT).compress(hooked, config)
    assert kept.entries_affected == 0 and "note_5" in hooked
    assert after_activity(one_activity(), config) is None  # the hook keeps it


def test_a_message_threshold_cliff_that_costs_tokens_says_so() -> None:
    """Found by the generative test (133 -> 156 tokens): the message threshold limits HISTORY
    entries, so its cliff may fold two tiny entries into one record that costs more tokens than
    they did; it is applied (the entry count is what the designer limits), but the result says
    the tokens went up, by how much, and what to do, instead of reporting a silent growth."""
    ctx = LayeredContext(system={"policy": "p"})
    config = ActivityExtensionConfig(compressMessageThreshold=2, preserveKeys=["x"])
    results = []
    for i in range(2):
        ctx.begin_activity(f"t{i}")
        ctx.write(Layer.WORKING, f"k{i}", i, actor=f"t{i}")
        ctx.complete_activity(f"t{i}")
        results.append(after_activity(ctx, config))
    assert results[0] is None
    result = results[1]
    assert result is not None and result.triggers == ["message_threshold"]
    assert list(ctx.layer(Layer.HISTORY)) == ["k1", "activity:t1", "compaction:1"]
    assert (result.tokens_before, result.tokens_after) == (60, 77)
    assert result.target_met is False  # 3 entries stay, the target is int(0.5 * 2) = 1
    assert result.notes == [
        "target of 1 HISTORY entry not met (3 entries after, 2 over): the latest finished activity (t1) "
        "is kept whole, preserved keys, keys no activity wrote and what count_only keeps are never folded, "
        "and what is folded becomes one compaction record; raise compressMessageThreshold (or "
        "compressTargetRatio) to a count the kept entries fit in",
        "the message-threshold cliff made HISTORY 1 entry shorter (4 -> 3) but 17 tokens larger "
        "(60 -> 77): the compaction record costs more than the tiny entries it folds; raise "
        "compressMessageThreshold or use compressTokenThreshold to limit tokens"]
    assert result.to_dict()["notes"] == result.notes


def test_a_token_saving_cliff_has_no_growth_note() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    config = ActivityExtensionConfig(compressMessageThreshold=2)
    result = None
    for i in range(3):
        ctx.begin_activity(f"t{i}")
        ctx.write(Layer.WORKING, f"k{i}", "word " * 200, actor=f"t{i}")
        ctx.complete_activity(f"t{i}")
        result = after_activity(ctx, config) or result
    assert result is not None and result.tokens_after < result.tokens_before
    assert not [n for n in result.notes if "larger" in n]
