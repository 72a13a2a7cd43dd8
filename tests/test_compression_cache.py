"""The compression hook's memories give what the long way gives.

* Shingles and tool marks are remembered by the value's identity and by its repr:
  equal reprs mean equal JSON values, and values that Python finds equal but JSON does
  not (``1``, ``1.0``, ``True``, ``"1"``) never share an entry they should not share.
* Clusters are remembered per tuple of shingle sets.
* The extractive summarizer remembers per class, encoding, text and budget.
* Rule verdicts are remembered within one compression only (a summarize rule's
  verdict depends on that compression's summarizer).
* A compression with every memory warm gives what it gives with every memory cleared:
  the result, the scores and the context after it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from context_layers import ActivityExtensionConfig, Layer, LayeredContext, freeze
from context_layers import attention, compression, similarity, summarize
from context_layers.attention import AttentionScore, Scope, classify_tool_entries, segment_history
from context_layers.compress_rules import SummaryCache, apply_rules
from context_layers.compression import RuleDrivenCompressor, after_activity
from context_layers.config import CompressRule
from context_layers.similarity import entry_shingles, entry_words, near_duplicate_clusters, shingles

MEMORIES: list[dict[Any, Any]] = [similarity._SHINGLES_BY_ID, similarity._SHINGLES_BY_TEXT, similarity._CLUSTERS,
                                  attention._MARKS_BY_ID, attention._MARKS_BY_TEXT, summarize._SUMMARIES]


def _forget() -> None:
    for memory in MEMORIES:
        memory.clear()
    compression._covers_tokens.cache_clear()


@pytest.fixture
def cold() -> Iterator[None]:
    _forget()
    yield
    _forget()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.sampled_from([0.0, 1.0, -0.0, 2.5])
    | st.text(alphabet="ab 1.", max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b", "kind"]), inner, max_size=3),
    max_leaves=8)


@given(st.lists(json_values, min_size=1, max_size=6))
def test_remembered_shingles_are_the_shingles_of_the_value(values: list[Any]) -> None:
    _forget()
    frozen = [freeze(v) for v in values]
    for v in frozen:  # prime both memories with every value, under one key
        entry_shingles("k", v)
    for v, again in zip(frozen, (freeze(v) for v in values)):  # equal values, new objects
        assert entry_shingles("k", v) == shingles(entry_words("k", v))
        assert entry_shingles("k", again) == shingles(entry_words("k", again))


@pytest.mark.parametrize("a, b", [(1, True), (1, 1.0), (1, "1"), (0.0, -0.0), ({"a": 1, "b": 2}, {"b": 2, "a": 1})])
def test_values_equal_in_python_are_told_apart_where_their_words_differ(cold: None, a: Any, b: Any) -> None:
    first, second = entry_shingles("k", freeze(a)), entry_shingles("k", freeze(b))
    assert first == shingles(entry_words("k", a))
    assert second == shingles(entry_words("k", b))


@pytest.mark.parametrize(("payloads", "useless"), [
    ([{"n": 1}, {"n": 1.0}], ["tool:1"]),        # JSON-equal: the second repeats the first
    ([{"n": 1}, {"n": True}], []),               # JSON types differ
    ([{"n": 1, "m": 2}, {"m": 2, "n": 1}], ["tool:1"]),
    ([{"n": "x"}, {"n": "y"}], []),
])
def test_remembered_tool_marks_find_the_repeats_the_long_way_finds(cold: None, payloads: list[dict[str, Any]],
                                                                  useless: list[str]) -> None:
    def results(make: Callable[[Any], Any]) -> list[tuple[str, Any]]:
        return [(f"tool:{i}", make({"kind": "tool_call_result", "tool": "bureau", **p})) for i, p in enumerate(payloads)]

    plain = classify_tool_entries(results(lambda v: v))  # plain dicts: never remembered
    classify_tool_entries(results(freeze))  # primes the memories
    warm = classify_tool_entries(results(freeze))  # equal values, new objects
    assert list(plain.useless) == useless
    assert warm == plain


def test_clusters_are_remembered_per_sets(cold: None) -> None:
    long = "the applicant runs a small bakery in the old town and asks for a loan to buy a second oven"
    texts = [long, long, long + " soon", "an unrelated note about the weather today"]
    sets = [shingles(entry_words("k", t)) for t in texts]
    first = near_duplicate_clusters(sets)
    assert near_duplicate_clusters(list(sets)) is first
    assert first == similarity._clusters(tuple(sets), 0.8, similarity.EXACT_LIMIT)
    assert first.labels == (0, 0, 0, 3)
    assert near_duplicate_clusters(sets, exact_limit=0) == similarity._clusters(tuple(sets), 0.8, 0)


class _FirstLine(summarize.ExtractiveSummarizer):
    def _summarize(self, text: str, max_tokens: int) -> str:
        return text.splitlines()[0]


def test_summaries_are_remembered_per_class_and_budget(cold: None) -> None:
    text = "\n".join(f"line {i}: the applicant asked for {i * 1000} EUR" for i in range(40))
    short = summarize.ExtractiveSummarizer().summarize(text, 16)
    assert summarize.ExtractiveSummarizer().summarize(text, 16) == short
    assert summarize.ExtractiveSummarizer().summarize(text, 64) != short
    assert _FirstLine().summarize(text, 16) == "line 0: the applicant asked for 0 EUR"


class _Fixed:
    def __init__(self, answer: str) -> None:
        self.answer = answer

    def summarize(self, text: str, max_tokens: int, *, prefix_messages: Any = None) -> str:
        return self.answer


def test_rule_verdicts_do_not_outlive_their_compression(cold: None) -> None:
    rules = [CompressRule(pattern="reasoning_chain", action="summarize", max_tokens=20)]
    items = [("why", freeze({"kind": "reasoning_chain", "text": " ".join(["long reasoning"] * 60)}))]
    first = apply_rules(items, rules, summarize=SummaryCache(_Fixed("first")))
    second = apply_rules(items, rules, summarize=SummaryCache(_Fixed("second")))
    assert first.items[0][1]["summary"] == "first"
    assert second.items[0][1]["summary"] == "second"


def test_scope_parts_computed_once_are_the_parts() -> None:
    ctx = _context()
    scope = Scope.of(ctx, _config())
    assert scope.tokens == sum(e.tokens for e in scope.history) + sum(e.tokens for e in scope.working)
    assert scope.entries == scope.history + scope.working
    assert scope.segments == segment_history([(e.key, e.value) for e in scope.history])


def _config() -> ActivityExtensionConfig:
    return ActivityExtensionConfig.model_validate({
        "preserveKeys": ["applicant_id"],
        "compressTokenThreshold": 600,
        "compressRules": [
            {"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "data.id"]},
            {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 30},
            {"pattern": "activity:*", "action": "count_only", "keepLast": 1},
        ],
    })


def _context() -> LayeredContext:
    ctx = LayeredContext(name="main")
    ctx.begin_activity("intake")
    ctx.write(Layer.WORKING, "applicant_id", "APP002", actor="t")
    ctx.complete_activity("intake")
    for i in range(6):
        ctx.begin_activity(f"check_{i}")
        ctx.write(Layer.WORKING, f"bureau_{i}", {"kind": "tool_call_result", "tool": "bureau", "status": "ok",
                                                "data": {"id": "CB-1", "rows": [f"row {j} of the report" for j in range(8)]}},
                  actor="t")
        ctx.write(Layer.WORKING, f"why_{i}", {"kind": "reasoning_chain",
                                             "text": " ".join(f"step {j}: the amount is within limit {i}." for j in range(12))},
                  actor="t")
        ctx.write(Layer.WORKING, f"note_{i}", "waiting for the bureau to answer the credit report request", actor="t")
        ctx.complete_activity(f"check_{i}")
    return ctx


def _compressed() -> dict[str, Any]:
    ctx = LayeredContext.from_dict(_context().to_dict())  # equal values, new objects
    config = _config()
    result = after_activity(ctx, config, actor="t")
    assert result is not None
    tape = [{k: v for k, v in e.items() if k != "time"} for e in ctx.to_dict()["tape"]]
    again = RuleDrivenCompressor().compress(ctx, config)
    return {"result": result.to_dict(), "details": dict(result.attention_after.details), "tape": tape,
            "again": again.to_dict(), "score": AttentionScore.compute(ctx, config).to_dict()}


def test_a_compression_with_warm_memories_gives_what_it_gives_with_none(cold: None) -> None:
    first = _compressed()
    assert first["result"]["entries_affected"] > 0
    assert _compressed() == first
    _forget()
    assert _compressed() == first


def test_memo_stays_bounded_and_remember_value_tells_equal_from_identical() -> None:
    from context_layers.canonical import Memo, freeze, remember_value

    memo: Memo[int, int] = Memo(3)
    for i in range(10):
        assert memo.put(i, i * i) == i * i
        assert len(memo) <= 3
    by_id: Memo[Any, Any] = Memo(8)
    by_text: Memo[Any, Any] = Memo(8)
    calls = []

    def compute(v: Any) -> Any:
        calls.append(v)
        return len(calls)

    a, b, c = freeze({"x": [1]}), freeze({"x": [1]}), freeze({"x": [1.0]})
    assert remember_value(by_id, by_text, "k", a, lambda: compute(a)) == 1
    assert remember_value(by_id, by_text, "k", b, lambda: compute(b)) == 1  # equal value, built anew
    assert remember_value(by_id, by_text, "k", c, lambda: compute(c)) == 2  # 1.0 is not 1 for repr
    assert remember_value(by_id, by_text, "other", a, lambda: compute(a)) == 3  # another key
    assert len(calls) == 3
