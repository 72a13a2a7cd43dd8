"""What a compress rule kept survives the compaction that folds it, verbatim.

An ``extract_keys`` rule reduces a tool result to the paths the designer named; a cliff that
then folds the activity must not summarize those lines away (it used to: a quarter of three
short lines kept ``tool_call_result_1: status:`` and lost every value). The rule's lines are
carried in the compaction record's ``kept`` list as they are; only the rest is summarized.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from context_layers import Layer, LayeredContext, config_from_dict, render
from context_layers.compression import RuleDrivenCompressor, after_activity, decompress, evaluate
from context_layers.compression_plan import CompressionPlan, execute_plan
from context_layers.summarize import ExtractiveSummarizer
from context_layers.tokens import count_text

# in key order (summarize.value_text): the same object in another key order gives the same lines
LINES = ["tool_call_result_1: data.id: SRC-1; status: ok", "tool_call_result_2: data.id: SRC-2; status: ok"]


def activity(ctx: LayeredContext, task: str, writes: dict[str, Any], preserve: tuple[str, ...] = ()) -> None:
    ctx.begin_activity(task)
    for k, v in writes.items():
        ctx.write(Layer.WORKING, k, v, actor=task)
    ctx.complete_activity(task, preserve_keys=preserve)


def source(n: int) -> dict[str, Any]:
    return {"status": "ok", "data": {"id": f"SRC-{n}", "body": "lorem ipsum dolor sit amet " * 40}}


CONFIG = {
    "preserveKeys": ["article_id", "claim_check"],
    "compressTokenThreshold": 150,
    "attentionThresholds": {"density": 0.0},
    "compressRules": [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]}],
}


def review() -> LayeredContext:
    """content_review's first two activities: two fetched sources (and a log the cliff
    summarizes), then the claim check."""
    ctx = LayeredContext(system={"policy": "Publish only what the sources support."})
    activity(ctx, "fetch_sources", {"article_id": "ART-7", "tool_call_result_1": source(1),
                                    "tool_call_result_2": source(2),
                                    "fetch_log": "the archive answered slowly and was asked again. " * 8},
             preserve=("article_id",))
    activity(ctx, "check_claims", {"claim_check": "all three claims are supported by SRC-1 and SRC-2",
                                   **{f"retry_log_{i}": f"retry {i}" for i in (1, 2, 3)}},
             preserve=("claim_check",))
    return ctx


def scope_tokens(ctx: LayeredContext) -> int:
    return ctx.tokens(Layer.HISTORY) + ctx.tokens(Layer.WORKING)


def test_a_cliff_over_extracted_tool_results_keeps_every_extracted_value() -> None:
    ctx = review()
    config = config_from_dict(CONFIG)
    result = after_activity(ctx, config)
    assert result is not None and "token_threshold" in result.triggers
    history = ctx.layer(Layer.HISTORY)
    record = history["compaction:1"]
    assert "tool_call_result_1" in result.folded and "tool_call_result_1" not in history
    assert record["kept"] == LINES
    assert "SRC-1" not in record["summary"]  # said once, in kept, not summarized again
    # the record counts what it keeps: tokens_after is the context's, and the fold saved tokens
    assert record["tokens_after"] == result.tokens_after == scope_tokens(ctx) < result.tokens_before
    assert ctx.tape[-1].data["tokens_after"] == result.tokens_after
    assert history["article_id"] == "ART-7"


def test_replay_decompress_and_evaluate_see_the_kept_lines() -> None:
    ctx = review()
    config = config_from_dict(CONFIG)
    before = ctx.state_json()
    result = after_activity(ctx, config)
    assert result is not None
    compressed = ctx.state_json()
    # the compress event carries the record: the tape alone rebuilds it, byte for byte
    replayed = LayeredContext.replay(ctx.tape)
    assert replayed == ctx and replayed.state_json() == compressed
    assert replayed.layer(Layer.HISTORY)["compaction:1"]["kept"] == LINES
    report = evaluate(ctx, result.snapshot_id, config)
    assert report.preserved_intact and report.checked_preserved == ["article_id", "claim_check"]
    decompress(ctx, result.snapshot_id)
    assert ctx.state_json() == before
    assert ctx.layer(Layer.HISTORY)["tool_call_result_2"]["data"]["body"].startswith("lorem")


def test_a_later_compaction_carries_the_earlier_kept_lines_verbatim() -> None:
    ctx = review()
    config = config_from_dict(CONFIG)
    assert after_activity(ctx, config) is not None
    activity(ctx, "fetch_more", {"tool_call_result_3": source(3), "note": "more sources " * 30})
    activity(ctx, "decide", {"verdict": "publish"})
    again = RuleDrivenCompressor().compress(ctx, config, triggers=["manual"], target_tokens=120)
    history = ctx.layer(Layer.HISTORY)
    assert again.compaction_key == "compaction:2" and "compaction:1" not in history
    record = history["compaction:2"]
    assert record["kept"][:2] == LINES
    assert "tool_call_result_3: data.id: SRC-3; status: ok" in record["kept"]
    assert record["tokens_after"] == again.tokens_after == scope_tokens(ctx)
    assert LayeredContext.replay(ctx.tape) == ctx


def test_only_the_rest_is_summarized() -> None:
    """The summarizer (a model, in the engine) is asked about the rest only, and whatever it
    answers, the kept lines are the record's."""
    seen: list[str] = []

    def summarizer(text: str, max_tokens: int) -> str:
        seen.append(text)
        return "the sources were fetched"

    ctx = review()
    result = RuleDrivenCompressor(summarizer, keep_recent=1).compress(ctx, config_from_dict(CONFIG))
    record = ctx.layer(Layer.HISTORY)[result.compaction_key]
    assert record["kept"] == LINES and record["summary"] == "the sources were fetched"
    assert seen and not any("SRC-" in text for text in seen)


def test_a_plan_keeps_the_lines_too() -> None:
    ctx = review()
    result = execute_plan(ctx, CompressionPlan(summarize=["fetch_sources"], keep_points=["both sources fetched"]),
                          config_from_dict(CONFIG))
    record = ctx.layer(Layer.HISTORY)[result.compaction_key]
    assert record["kept"] == LINES and record["summary"].startswith("- both sources fetched")
    assert record["tokens_after"] == result.tokens_after == scope_tokens(ctx)


def test_a_fold_without_rule_output_has_no_kept_field() -> None:
    ctx = LayeredContext()
    for i in range(3):
        activity(ctx, f"research_{i}", {f"note_{i}": f"finding {i}: " + "the cash flow is steady " * 20})
    result = RuleDrivenCompressor().compress(ctx, config_from_dict({"compressTokenThreshold": 200}))
    record = ctx.layer(Layer.HISTORY)[result.compaction_key]
    assert "kept" not in record and record["summary"]


def test_count_only_counts_survive_a_cliff() -> None:
    """A count_only counter is the compressor's own record: a cliff never folds it."""
    ctx = LayeredContext()
    activity(ctx, "poll", {**{f"retry_log_{i}": f"retry {i} of the bureau call failed with a timeout" for i in range(6)},
                           "notes": "polling " * 200})
    activity(ctx, "decide", {"verdict": "ok"})
    config = config_from_dict({"compressTokenThreshold": 100, "compressRules": [
        {"pattern": "retry_log", "action": "count_only", "keepLast": 1}]})
    result = RuleDrivenCompressor().compress(ctx, config)
    history = ctx.layer(Layer.HISTORY)
    assert "activity:poll" in result.folded and "compaction:1" in history
    counter = history["summary:count:retry_log"]
    assert (counter["count"], counter["dropped"]) == (6, 5)


@pytest.mark.parametrize("fmt", ["xml", "json", "plain"])
def test_the_model_is_shown_the_kept_lines(fmt: str) -> None:
    ctx = review()
    assert after_activity(ctx, config_from_dict(CONFIG)) is not None
    text = "\n".join(m["content"] for m in render(ctx, format=fmt))
    for line in LINES:
        assert (json.dumps(line) if fmt != "xml" else line) in text, (fmt, text)
    assert render(ctx, format=fmt) == render(LayeredContext.replay(ctx.tape), format=fmt)



def test_the_summary_of_the_rest_makes_room_for_the_kept_lines() -> None:
    """Six tool results' kept lines carry the folded record past the cliff's target; the summary
    of the rest (the reasoning, the activity records) is made shorter, and the target is met
    with every kept value still there."""
    reasoning = "The applicant has a stable income and the account shows regular deposits. " * 12
    preserved = ("risk_level", "assessment_id", "risk_factors")
    asked: list[tuple[str, int]] = []
    offline = ExtractiveSummarizer()

    def summarizer(text: str, max_tokens: int) -> str:
        asked.append((text, max_tokens))
        return offline.summarize(text, max_tokens)

    ctx = LayeredContext(system={"policy": "High risk loans need dual approval."})
    for i in range(6):
        activity(ctx, f"act{i}", {
            f"tool_call_result_{i}": {"kind": "tool_call_result", "status": "ok",
                                      "data": {"id": f"T{i}", "summary": f"hit {i}", "blob": "x " * 150}},
            f"reasoning_{i}": {"kind": "reasoning_chain", "text": f"Step {i}. " + reasoning},
            f"err_{i}": {"kind": "error_retry_log", "msg": f"retry {i} timed out calling the scoring service " * 3},
        })
    activity(ctx, "risk_assessment", {"risk_level": "medium", "assessment_id": "RA001",
                                      "risk_factors": ["new customer", "cross-industry"]}, preserve=preserved)
    # the target (320 tokens) leaves room for the last error_retry_log, which its count_only rule
    # keeps verbatim outside every fold (at 600, 300 tokens were out of reach)
    config = config_from_dict({"preserveKeys": list(preserved), "compressTokenThreshold": 640, "compressRules": [
        {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id", "data.summary"]},
        {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 100},
        {"pattern": "error_retry_log", "action": "count_only", "keepLast": 1}]})
    result = RuleDrivenCompressor(summarizer).compress(ctx, config)
    record = ctx.layer(Layer.HISTORY)[result.compaction_key]
    assert record["kept"] == [f"tool_call_result_{i}: data.id: T{i}; data.summary: hit {i}; status: ok"
                              for i in range(6)]
    assert result.target_tokens == 320 and result.target_met and result.tokens_after <= 320
    assert "err_5" in ctx.layer(Layer.HISTORY) and "err_4" not in ctx.layer(Layer.HISTORY)
    # the compaction's rest was summarized twice, the second time shorter
    rest = [n for text, n in asked if text == asked[-1][0]]
    assert len(rest) == 2 and rest[1] < rest[0] and count_text(record["summary"]) <= rest[1]


def test_a_cliff_over_a_list_of_rows_an_extract_keys_rule_reduced_keeps_every_row() -> None:
    """A multi-instance task's output collection (a list of rows) reduced by `extractKeys: [site,
    accepted]` carries no `_compressed` marker (a list has no field for it): a later cliff summarized
    it like any text, and the sites' verdicts were cut away. It is carried in `kept` as a reduced
    object is."""
    ctx = LayeredContext()
    rows = [{"site": s, "accepted": s != "MAD", "note": f"Site {s} checked staffing and pharmacy stock. " * 6}
            for s in ("BER", "PAR", "MAD")]
    activity(ctx, "site_review", {"site_results": rows, "review_log": "every site answered on time. " * 20})
    activity(ctx, "compile", {"accepted_sites": ["BER", "PAR"]}, preserve=("accepted_sites",))
    config = config_from_dict({"compressTokenThreshold": 60, "attentionThresholds": {"density": 0.0},
                               "compressRules": [{"pattern": "site_results", "action": "extract_keys",
                                                  "extractKeys": ["site", "accepted"]}]})
    result = after_activity(ctx, config)
    assert result is not None and "site_results" in result.folded
    record = ctx.layer(Layer.HISTORY)["compaction:1"]
    # each row's fields in key order (summarize.value_text), as canonical JSON shows them
    assert record["kept"] == ["site_results: accepted: true; site: BER; accepted: true; site: PAR; accepted: false; "
                              "site: MAD"]
    assert record["tokens_after"] == result.tokens_after == scope_tokens(ctx) < result.tokens_before
    assert LayeredContext.replay(ctx.tape) == ctx


def test_what_count_only_keeps_survives_the_cliff() -> None:
    """count_only keeps the last keepLast entries verbatim: a cliff folding every activity to meet
    its target (a direct compress folds any activity) leaves them where they are, as the counter
    names them; before, the fold summarized them and the counter named keys HISTORY no longer had."""
    ctx = LayeredContext(system={"policy": "p"})
    for i in range(8):
        activity(ctx, f"a{i}", {f"tool_result_{i}": {"rows": list(range(30)), "note": "lorem ipsum dolor " * 10}})
    results = {k: v for k, v in ctx.layer(Layer.HISTORY).items() if k.startswith("tool_result_")}
    config = config_from_dict({"compressTokenThreshold": 200,
                               "compressRules": [{"pattern": "tool_result_*", "action": "count_only", "keepLast": 2}]})
    result = RuleDrivenCompressor().compress(ctx, config)
    history = ctx.layer(Layer.HISTORY)
    counter = history["summary:count:tool_result_*"]
    assert counter["kept"] == ["tool_result_6", "tool_result_7"] and counter["count"] == 8
    assert {k: history[k] for k in counter["kept"]} == {k: results[k] for k in counter["kept"]}
    assert result.compaction_key in history and not any(f"tool_result_{i}" in history for i in range(6))
    assert "tool_result_6" not in history[result.compaction_key]["covers"]
