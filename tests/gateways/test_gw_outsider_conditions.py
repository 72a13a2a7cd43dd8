"""A condition evaluated over a context as an outsider passes it: the LayeredContext itself,
its names resolved as a read resolves them (L0 first)."""

from __future__ import annotations

import pytest

from context_layers import Layer, LayeredContext
from gateways import UnknownNameError, evaluate, evaluate_condition


def _ctx() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p", "limit": 50000})
    ctx.write(Layer.PROCESS, "amount", 20000)
    ctx.write(Layer.WORKING, "risk_level", "low")
    ctx.write(Layer.WORKING, "applicant", {"score": 700, "tags": ["new"]})
    return ctx


@pytest.mark.parametrize(("expression", "expected"), [
    ('risk_level == "low" and amount < 50000', True),
    ("amount < limit", True),
    ('applicant["score"] > 650 and "new" in applicant["tags"]', True),
    ('risk_level == "high" or amount > limit', False),
])
def test_a_condition_over_the_context_itself(expression: str, expected: bool) -> None:
    ctx = _ctx()
    assert evaluate_condition(expression, ctx) is expected
    assert evaluate_condition(expression, ctx.resolved()) is expected


def test_an_unknown_name_in_a_context_is_named() -> None:
    with pytest.raises(UnknownNameError, match="missing"):
        evaluate("missing == 1", _ctx())


def test_a_strategy_is_applied_to_detected_conflicts_with_the_config_as_json() -> None:
    """resolve_by_strategy on what the detector found: the config as JSON, and with no arrival
    order the branches' order stands for it (the last branch wrote last)."""
    from gateways import ConflictDetector, resolve_by_strategy

    conflicts = ConflictDetector().detect_conflicts({"s": "pending"}, {"finance": {"s": "approved"},
                                                                      "risk": {"s": "rejected"}})
    [(conflict, resolution)] = resolve_by_strategy(conflicts, {"mergeStrategy": "LAST_WRITER_WINS"})
    assert conflict.key == "s" and resolution.value == "rejected" and resolution.resolver == "strategy"
    [(_, first)] = resolve_by_strategy(conflicts, {"mergeStrategy": "BRANCH_PRIORITY", "branchPriority": ["finance"]})
    assert first.value == "approved"
