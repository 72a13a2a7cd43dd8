"""A ``count_only`` counter tells apart what it kept verbatim (``kept``), what it kept in place as
another rule reduced it (``summarized``, ``extracted``) and what it only counted (``dropped``);
what it lists as kept is what HISTORY holds, unchanged."""

from __future__ import annotations

from typing import Any

import pytest

from context_layers import ActivityExtensionConfig, Layer, LayeredContext
from context_layers.canonical import canonical_json
from context_layers.compress_rules import apply_rules, count_key
from context_layers.compression import RuleDrivenCompressor
from context_layers.config import CompressRule

KIND = "tool_call_result"
COUNTER = count_key(KIND)


def result(i: int) -> dict[str, Any]:
    text = " ".join(f"lookup {i} row {n}: bureau score {600 + n} checked against rule {n % 5}." for n in range(8))
    return {"kind": KIND, "tool": "credit_bureau", "status": "ok", "data": {"id": f"CB{i}", "raw": text}}


ITEMS = [(f"tool:{i}", result(i)) for i in range(5)]
COUNT = CompressRule(pattern=KIND, action="count_only", keep_last=2)
SUMMARIZE = CompressRule(pattern=KIND, action="summarize", max_tokens=10)
EXTRACT = CompressRule(pattern=KIND, action="extract_keys", extract_keys=["data.id"])


def _check_exact(items: tuple[tuple[str, Any], ...], original: dict[str, Any]) -> dict[str, Any]:
    """The counter's lists are disjoint, account for every entry it saw, and say what HISTORY holds."""
    values = dict(items)
    counter = values[COUNTER]
    kept, summarized, extracted = (counter.get(f, []) for f in ("kept", "summarized", "extracted"))
    assert counter["count"] == counter["dropped"] + len(kept) + len(summarized) + len(extracted)
    assert len({*kept, *summarized, *extracted}) == len(kept) + len(summarized) + len(extracted)
    for key in kept:  # verbatim
        assert canonical_json(values[key]) == canonical_json(original[key]), key
    for key in summarized:
        assert values[key]["_compressed"] == "summarize", key
    for key in extracted:
        assert values[key]["_compressed"] == "extract_keys", key
    dropped = [k for k in original if k not in values]
    assert len(dropped) == counter["dropped"]
    return counter


@pytest.mark.parametrize("rules, field", [
    ([SUMMARIZE, COUNT], "summarized"),  # summarised first, then counted: the last two stay, summarised
    ([EXTRACT, COUNT], "extracted"),
], ids=["summarize_then_count", "extract_then_count"])
def test_entries_a_counter_keeps_already_reduced_are_not_listed_as_kept(rules: list[CompressRule],
                                                                       field: str) -> None:
    out = apply_rules(ITEMS, rules)
    counter = _check_exact(out.items, dict(ITEMS))
    assert (counter["kept"], counter[field], counter["dropped"], counter["count"]) == ([], ["tool:3", "tool:4"], 3, 5)
    assert apply_rules(out.items, rules).items == out.items  # idempotent


@pytest.mark.parametrize("rule", [SUMMARIZE, EXTRACT], ids=["summarize", "extract_keys"])
def test_what_a_counter_keeps_verbatim_no_later_rule_reduces(rule: CompressRule) -> None:
    """Counted first: the last two are the counter's, kept verbatim as it says (a rule after it
    reduces the entries it does not keep; there are none left here)."""
    out = apply_rules(ITEMS, [COUNT, rule])
    counter = _check_exact(out.items, dict(ITEMS))
    assert counter["kept"] == ["tool:3", "tool:4"] and "summarized" not in counter and "extracted" not in counter
    assert apply_rules(out.items, [COUNT, rule]).items == out.items


def test_a_later_count_reclassifies_what_it_keeps_and_counts_on() -> None:
    """Counted, then more results arrive and a summarize rule comes before the counter: the counter
    goes on (its count grows), and what it keeps now is listed by what it is."""
    first = apply_rules(ITEMS, [COUNT])
    more = [*first.items, *((f"tool:{i}", result(i)) for i in (5, 6))]
    out = apply_rules(more, [SUMMARIZE, COUNT])
    original = {**dict(ITEMS), "tool:5": result(5), "tool:6": result(6)}
    counter = _check_exact(out.items, original)
    assert counter["count"] == 7 and counter["dropped"] == 5
    assert counter["kept"] == [] and counter["summarized"] == ["tool:5", "tool:6"]


def test_the_compressors_counter_in_history_tells_kept_summarized_and_counted_apart() -> None:
    ctx = LayeredContext()
    for i, (key, value) in enumerate(ITEMS):
        ctx.begin_activity(f"call_{i}")
        ctx.write(Layer.WORKING, key, value, actor=f"call_{i}")
        ctx.complete_activity(f"call_{i}")
    config = ActivityExtensionConfig.model_validate({"compressRules": [
        r.model_dump(by_alias=True) for r in (SUMMARIZE, COUNT)]})
    before = dict(ctx.layer(Layer.HISTORY))
    result_ = RuleDrivenCompressor().compress(ctx, config, triggers=["manual"])
    assert result_.changed
    history = tuple(ctx.layer(Layer.HISTORY).items())
    counter = _check_exact(history, {k: v for k, v in before.items() if k.startswith("tool:")})
    assert counter["summarized"] == ["tool:3", "tool:4"] and counter["kept"] == []


def test_a_join_that_takes_away_a_summarized_entry_moves_it_to_folded_and_the_count_holds() -> None:
    """What a join tells a counter (``gateways.join._counters_told``) reads all its in-place lists."""
    from gateways.conflicts import DELETED
    from gateways.join import _counters_told

    counter = {"kind": "count", "_compressed": "count_only", "pattern": KIND, "count": 5, "dropped": 3,
               "kept": ["tool:3"], "summarized": ["tool:4"]}
    history = {"tool:3": result(3), "tool:4": {"kind": KIND, "_compressed": "summarize", "summary": "x"},
               COUNTER: counter}
    told = dict(_counters_told(history, [("tool:4", DELETED)], folded=lambda key: True, held=[COUNTER]))
    assert told[COUNTER] == {**{k: v for k, v in counter.items() if k != "summarized"}, "folded": ["tool:4"]}
    assert list(told[COUNTER]) == [*(k for k in counter if k != "summarized"), "folded"]  # its fields' order kept
