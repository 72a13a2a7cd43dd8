"""Reducers and the whole-join merge strategies."""

from __future__ import annotations

from typing import Any

import pytest

from context_layers.config import ActivityExtensionConfig
from context_layers.errors import MergeConflictError
from gateways import DELETED, MergedConflict, ReducerError, reduce_values, resolve_by_strategy
from gateways.conflicts import merge_keys
from gateways.strategies import apply_reducer

# reducer, base (DELETED = absent), changed branch results, branches that left it alone, expected
REDUCED = [
    ("sum", 10, {"a": 13, "b": 15}, 0, 18),
    ("sum", 10, {"a": 13}, 1, 13),
    ("sum", DELETED, {"a": 2, "b": 3}, 0, 5),
    ("sum", 1, {"a": 1.5, "b": 2}, 0, 2.5),
    ("sum", 10, {"a": 7, "b": 12}, 0, 9),
    ("append", [1], {"a": [1, 2], "b": [1, 3, 4]}, 0, [1, 2, 3, 4]),
    ("append", DELETED, {"a": ["x"], "b": ["x"]}, 0, ["x", "x"]),
    ("append", [], {"a": [{"k": 1}]}, 2, [{"k": 1}]),
    ("union", ["x"], {"a": ["x", "y"], "b": ["y", "z"]}, 0, ["x", "y", "z"]),
    ("union", ["x", "w"], {"a": ["y"]}, 0, ["x", "w", "y"]),  # a union never removes
    ("union", DELETED, {"a": [1, 1.0, {"p": 1}], "b": [{"p": 1.0}, 2]}, 0, [1, {"p": 1}, 2]),
    ("max", 5, {"a": 3, "b": 4}, 0, 4),
    ("max", 5, {"a": 3, "b": 4}, 1, 5),
    ("max", 5, {"a": 9}, 1, 9),
    ("min", 5, {"a": 3, "b": 4}, 1, 3),
    ("min", DELETED, {"a": 3.5, "b": 4}, 1, 3.5),
    ("max", "b", {"a": "c", "b": "a"}, 0, "c"),
    ("sum", 3, {"a": DELETED, "b": DELETED}, 0, DELETED),
    ("append", [1], {}, 2, [1]),
    # merge: each branch sets its own entry of one object
    ("merge", {"finance": None, "risk": None}, {"a": {"finance": True, "risk": None},
                                                "b": {"finance": None, "risk": False}}, 0,
     {"finance": True, "risk": False}),
    ("merge", DELETED, {"a": {"x": 1}, "b": {"y": 2}}, 0, {"x": 1, "y": 2}),
    ("merge", {"x": 1, "y": 2}, {"a": {"x": 1}, "b": {"x": 1, "y": 2, "z": 3}}, 1, {"x": 1, "z": 3}),  # a removed y
    ("merge", {"n": {"p": 1}}, {"a": {"n": {"p": 1, "q": 2}}, "b": {"n": {"p": 1, "r": 3}}}, 0,
     {"n": {"p": 1, "q": 2, "r": 3}}),  # nested objects merge entry by entry too
    ("merge", {"x": 1}, {"a": {"x": 5}, "b": {"x": 5}}, 0, {"x": 5}),  # the same change twice
]


@pytest.mark.parametrize(("name", "base", "changed", "unchanged", "expected"), REDUCED)
def test_reducers(name: str, base: Any, changed: dict[str, Any], unchanged: int, expected: Any) -> None:
    assert reduce_values(name, "k", base, changed, unchanged=unchanged) == expected


REDUCER_ERRORS = [
    ("sum", 1, {"a": "2"}, "branch 'a' holds '2' \\(string\\), not a number"),
    ("sum", 1, {"a": True}, "not a number"),
    ("sum", "x", {"a": 2}, "the base holds 'x'"),
    ("append", [1, 2], {"a": [2, 1, 3]}, "branch 'a' removed or reordered"),
    ("append", [1], {"a": "s"}, "not a list"),
    ("union", 3, {"a": [1]}, "not a list"),
    ("max", 1, {"a": "x", "b": 2}, "not a number"),
    ("min", 1, {"a": DELETED, "b": 2}, "deleted the key while \\['b'\\] wrote values"),
    ("median", 1, {"a": 2}, "unknown reducer 'median'"),
    ("merge", [1], {"a": {"x": 1}}, "the base holds \\[1\\] \\(array\\), not an object"),
    ("merge", {"x": 1}, {"a": {"x": 2}, "b": {"x": 3}}, "changed the entry x differently \\('a': 2, 'b': 3\\)"),
    ("merge", {"n": {"p": 1}}, {"a": {"n": {"p": 2}}, "b": {"n": {}}}, "the entry n.p differently"),
]


@pytest.mark.parametrize(("name", "base", "changed", "message"), REDUCER_ERRORS)
def test_reducer_errors_name_the_key(name: str, base: Any, changed: dict[str, Any], message: str) -> None:
    with pytest.raises(ReducerError, match=message) as info:
        reduce_values(name, "score", base, changed)
    assert "'score'" in str(info.value)
    assert isinstance(info.value, MergeConflictError)


def test_reducer_key_never_conflicts() -> None:
    base = {"count": 1}
    branches = {"x": {"count": 3}, "y": {"count": 4}}
    [outcome] = merge_keys(base, branches, ["count"])
    assert outcome.conflict is not None
    reduced = apply_reducer("sum", outcome, branch_count=2)
    assert reduced.conflict is None and reduced.value == 6


def test_a_merge_that_meets_one_entry_changed_twice_stays_a_conflict() -> None:
    """The join then resolves it as any conflict (strategy, policy, model, person), with the
    branches' whole objects as its values."""
    base = {"approvals": {"finance": None, "risk": None}}
    clash = {"x": {"approvals": {"finance": "yes", "risk": None}}, "y": {"approvals": {"finance": "no", "risk": None}}}
    [outcome] = merge_keys(base, clash, ["approvals"])
    kept = apply_reducer("merge", outcome, branch_count=2)
    assert kept.conflict is not None and kept.conflict.values == {"x": clash["x"]["approvals"],
                                                                  "y": clash["y"]["approvals"]}
    apart = {"x": {"approvals": {"finance": "yes", "risk": None}}, "y": {"approvals": {"finance": None, "risk": "no"}}}
    [outcome] = merge_keys(base, apart, ["approvals"])
    assert outcome.conflict is not None  # without the reducer: a conflict on the whole key
    merged = apply_reducer("merge", outcome, branch_count=2)
    assert merged.conflict is None and merged.value == {"finance": "yes", "risk": "no"}


CONFLICTS = [
    MergedConflict("status", "new", {"finance": "approved", "risk": "rejected"}, ("finance", "risk")),
    MergedConflict("limit", 10, {"finance": 20, "legal": DELETED, "risk": 30}, ("finance", "legal", "risk")),
]


@pytest.mark.parametrize(("arrival", "expected"), [
    (["finance", "risk", "legal"], {"status": "rejected", "limit": DELETED}),
    (["legal", "risk", "finance"], {"status": "approved", "limit": 20}),
])
def test_last_writer_wins(arrival: list[str], expected: dict[str, Any]) -> None:
    config = ActivityExtensionConfig(merge_strategy="LAST_WRITER_WINS")
    out = resolve_by_strategy(CONFLICTS, config, arrival_order=arrival)
    assert {c.key: r.value for c, r in out} == expected
    assert all(r.resolver == "strategy" and "arrived" not in r.reason for _, r in out)
    assert all("reached the join last" in r.reason for _, r in out)


def test_last_writer_wins_needs_every_branch_in_arrival_order() -> None:
    config = ActivityExtensionConfig(merge_strategy="LAST_WRITER_WINS")
    with pytest.raises(ValueError, match="missing from arrival_order"):
        resolve_by_strategy(CONFLICTS, config, arrival_order=["finance"])


@pytest.mark.parametrize(("priority", "expected"), [
    (["risk", "finance"], {"status": "rejected", "limit": 30}),
    (["audit", "legal", "finance", "risk"], {"status": "approved", "limit": DELETED}),
])
def test_branch_priority(priority: list[str], expected: dict[str, Any]) -> None:
    config = ActivityExtensionConfig(merge_strategy="BRANCH_PRIORITY", branch_priority=priority)
    out = resolve_by_strategy(CONFLICTS, config)
    assert {c.key: r.value for c, r in out} == expected


def test_branch_priority_without_a_listed_branch_fails_loudly() -> None:
    config = ActivityExtensionConfig(merge_strategy="BRANCH_PRIORITY", branch_priority=["legal"])
    with pytest.raises(MergeConflictError, match="'status'") as info:
        resolve_by_strategy(CONFLICTS, config, gateway_id="join1")
    assert 'finance="approved"' in str(info.value) and "'limit'" not in str(info.value)


def test_fail_on_conflict_names_every_conflict() -> None:
    config = ActivityExtensionConfig(merge_strategy="FAIL_ON_CONFLICT")
    with pytest.raises(MergeConflictError) as info:
        resolve_by_strategy(CONFLICTS, config, gateway_id="join1")
    message = str(info.value)
    for part in ("join 'join1'", "'status'", 'finance="approved"', 'risk="rejected"', "'limit'", "legal=(deleted)",
                 "risk=30", "FAIL_ON_CONFLICT"):
        assert part in message
    assert info.value.gateway_id == "join1"
    assert [c["key"] for c in info.value.conflicts] == ["status", "limit"]
    assert resolve_by_strategy([], config) == []


def test_default_strategy_is_not_handled_here() -> None:
    with pytest.raises(ValueError, match="resolution chain"):
        resolve_by_strategy(CONFLICTS, ActivityExtensionConfig())
