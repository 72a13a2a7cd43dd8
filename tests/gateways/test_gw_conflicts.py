"""ConflictDetector and three_way_merge: the acceptance table and a reference merge."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateways import DELETED, ConflictDetector, MergedConflict, three_way_merge

NESTED = {"p": {"q": 1, "r": [1, {"s": 2}]}, "t": "x"}

# id, base, branches, expected conflicts: (key, base_value, {branch: value})
CASES: list[tuple[str, dict[str, Any], dict[str, dict[str, Any]], list[tuple[str, Any, dict[str, Any]]]]] = [
    ("no change", {"a": 1, "b": "x"}, {"x": {"a": 1, "b": "x"}, "y": {"a": 1, "b": "x"}}, []),
    ("one branch changes", {"a": 1}, {"x": {"a": 2}, "y": {"a": 1}}, []),
    ("two branches change identically", {"a": 1}, {"x": {"a": 2}, "y": {"a": 2}}, []),
    ("identical change as int and float", {"a": 1}, {"x": {"a": 2}, "y": {"a": 2.0}}, []),
    ("two branches differ", {"a": 1}, {"x": {"a": 2}, "y": {"a": 3}}, [("a", 1, {"x": 2, "y": 3})]),
    ("delete vs modify", {"a": 1}, {"x": {}, "y": {"a": 2}}, [("a", 1, {"x": DELETED, "y": 2})]),
    ("delete vs delete", {"a": 1, "b": 2}, {"x": {"b": 2}, "y": {"b": 2}}, []),
    ("delete vs unchanged", {"a": 1}, {"x": {}, "y": {"a": 1.0}}, []),
    ("add in two branches, different values", {}, {"x": {"n": 1}, "y": {"n": 2}}, [("n", DELETED, {"x": 1, "y": 2})]),
    ("add in two branches, same value", {}, {"x": {"n": [1, 2]}, "y": {"n": [1, 2]}}, []),
    ("nested dict differing in one leaf", {"d": NESTED},
     {"x": {"d": {"t": "x", "p": {"r": [1, {"s": 3}], "q": 1}}}, "y": {"d": {"p": {"q": 1, "r": [1, {"s": 4}]}, "t": "x"}}},
     [("d", NESTED, {"x": {"t": "x", "p": {"r": [1, {"s": 3}], "q": 1}}, "y": {"p": {"q": 1, "r": [1, {"s": 4}]}, "t": "x"}})]),
    ("nested dict with keys reordered is unchanged", {"d": NESTED},
     {"x": {"d": {"t": "x", "p": {"r": [1, {"s": 2}], "q": 1.0}}}, "y": {"d": {"p": {"q": 1, "r": [1, {"s": 9}]}, "t": "x"}}}, []),
    ("list order matters", {"l": [1, 2]}, {"x": {"l": [2, 1]}, "y": {"l": [1, 2, 3]}},
     [("l", [1, 2], {"x": [2, 1], "y": [1, 2, 3]})]),
    ("None written vs deleted", {"a": 1}, {"x": {"a": None}, "y": {}}, [("a", 1, {"x": None, "y": DELETED})]),
    ("None written in both", {"a": 1}, {"x": {"a": None}, "y": {"a": None}}, []),
    ("None base, one writes None", {"a": None}, {"x": {"a": None}, "y": {"a": 0}}, []),
    ("True is not 1", {"a": 1}, {"x": {"a": True}, "y": {"a": 2}}, [("a", 1, {"x": True, "y": 2})]),
    ("True written where 1 was is a change", {"a": 1}, {"x": {"a": True}, "y": {"a": 1}}, []),
    ("three branches, two agree", {"a": 1}, {"x": {"a": 2}, "y": {"a": 3}, "z": {"a": 2}},
     [("a", 1, {"x": 2, "y": 3, "z": 2})]),
    ("three branches, one unchanged", {"a": 1}, {"x": {"a": 2}, "y": {"a": 1}, "z": {"a": 3}},
     [("a", 1, {"x": 2, "z": 3})]),
    ("sorted by key", {"b": 1, "a": 1}, {"x": {"b": 2, "a": 2}, "y": {"b": 3, "a": 3}},
     [("a", 1, {"x": 2, "y": 3}), ("b", 1, {"x": 2, "y": 3})]),
]


@pytest.mark.parametrize(("base", "branches", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_detect_conflicts(base: dict[str, Any], branches: dict[str, dict[str, Any]],
                          expected: list[tuple[str, Any, dict[str, Any]]]) -> None:
    conflicts = ConflictDetector().detect_conflicts(base, branches)
    got = [(c.key, c.base_value, c.conflicting_values) for c in conflicts]
    assert got == expected
    for c in conflicts:
        assert c.source_branches == tuple(c.conflicting_values)
        assert list(c.conflicting_values) == [b for b in branches if b in c.conflicting_values]


def test_deleted_marker_is_not_none_and_serializes() -> None:
    [c] = ConflictDetector().detect_conflicts({"a": 1}, {"x": {"a": None}, "y": {}})
    assert c.conflicting_values["y"] is DELETED and c.conflicting_values["x"] is None
    assert c.to_dict() == {"key": "a", "layer": None, "base_value": 1,
                           "conflicting_values": {"x": None, "y": {"$deleted": True}}, "source_branches": ["x", "y"]}
    assert repr(DELETED) == "DELETED"
    assert isinstance(hash(c), int)


def test_three_way_merge_order_and_changes() -> None:
    base = {"a": 1, "b": 2, "c": 3}
    branches = {"x": {"a": 1, "b": 20, "new_x1": 1, "new_both": 5, "c": 3},
                "y": {"new_y": 1, "a": 1, "new_both": 5, "b": 2}}
    out = three_way_merge(base, branches)
    assert list(out.merged) == ["a", "b", "new_x1", "new_both", "new_y"]  # c deleted by y
    assert out.merged == {"a": 1, "b": 20, "new_x1": 1, "new_both": 5, "new_y": 1}
    assert out.changes == [("b", 20), ("c", DELETED), ("new_x1", 1), ("new_both", 5), ("new_y", 1)]
    assert out.conflicts == []
    reordered = three_way_merge(base, branches, branch_order=["y", "x"])
    assert list(reordered.merged) == ["a", "b", "new_y", "new_both", "new_x1"]


def test_three_way_merge_keeps_base_value_of_conflicting_keys() -> None:
    out = three_way_merge({"a": 1}, {"x": {"a": 2, "n": 1}, "y": {"a": 3, "n": 2}})
    assert out.merged == {"a": 1}
    assert out.changes == []
    assert [c.key for c in out.conflicts] == ["a", "n"]


def test_three_way_merge_rejects_bad_branch_order() -> None:
    with pytest.raises(ValueError, match="branch_order"):
        three_way_merge({}, {"x": {}, "y": {}}, branch_order=["x"])


# ---- reference merge: written for clarity, not speed -----------------------------------

ABSENT = object()


def ref_norm(v: Any) -> Any:
    """Equality key: JSON types kept apart, numbers by value, dicts unordered."""
    if v is ABSENT:
        return ("absent",)
    if v is None:
        return ("null",)
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, (int, float)):
        return ("number", v)
    if isinstance(v, str):
        return ("string", v)
    if isinstance(v, list):
        return ("list", tuple(ref_norm(x) for x in v))
    assert isinstance(v, dict)
    return ("object", frozenset((k, ref_norm(x)) for k, x in v.items()))


def reference_merge(base: dict[str, Any], branches: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    order = list(base)
    for branch in branches.values():
        order += [k for k in branch if k not in order]
    merged: dict[str, Any] = {}
    conflicts: dict[str, dict[str, Any]] = {}
    for key in order:
        before = base.get(key, ABSENT)
        results = {b: branch.get(key, ABSENT) for b, branch in branches.items()}
        changed = {b: v for b, v in results.items() if ref_norm(v) != ref_norm(before)}
        if len({ref_norm(v) for v in changed.values()}) >= 2:
            conflicts[key] = {b: DELETED if v is ABSENT else v for b, v in changed.items()}
            after = before
        elif changed:
            after = next(iter(changed.values()))
        else:
            after = before
        if after is not ABSENT:
            merged[key] = after
    return merged, conflicts


KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])
SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from([0, 1, 1.0, 2, 2.5, -1]), st.sampled_from(["", "x", "y"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(st.sampled_from(["p", "q"]), inner, max_size=2)),
                      max_leaves=5)
EDIT = st.one_of(st.tuples(st.just("set"), KEYS, VALUES), st.tuples(st.just("delete"), KEYS, st.none()),
                 st.tuples(st.just("copy"), KEYS, st.integers(0, 3)))


@st.composite
def merges(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    base = draw(st.dictionaries(KEYS, VALUES, max_size=5))
    names = draw(st.lists(st.sampled_from(["b1", "b2", "b3", "b4"]), min_size=1, max_size=4, unique=True))
    branches: dict[str, dict[str, Any]] = {}
    for name in names:
        branch = dict(base)
        for op, key, arg in draw(st.lists(EDIT, max_size=6)):
            if op == "set":
                branch[key] = arg
            elif op == "delete":
                branch.pop(key, None)
            else:  # copy another branch's value: agreement is what makes merges interesting
                others = [b for b in branches.values() if key in b]
                if others:
                    branch[key] = others[arg % len(others)][key]
        branches[name] = branch
    return base, branches


@given(merges())
def test_merge_agrees_with_reference(case: tuple[dict[str, Any], dict[str, dict[str, Any]]]) -> None:
    base, branches = case
    expected_merged, expected_conflicts = reference_merge(base, branches)
    out = three_way_merge(base, branches)
    assert list(out.merged) == list(expected_merged)
    assert {k: ref_norm(v) for k, v in out.merged.items()} == {k: ref_norm(v) for k, v in expected_merged.items()}
    assert [c.key for c in out.conflicts] == sorted(expected_conflicts)
    for c in out.conflicts:
        assert list(c.conflicting_values) == list(expected_conflicts[c.key])
        for b, v in c.conflicting_values.items():
            want = expected_conflicts[c.key][b]
            assert (v is DELETED) == (want is DELETED)
            if v is not DELETED:
                assert ref_norm(v) == ref_norm(want)
    detected = ConflictDetector().detect_conflicts(base, branches)
    assert [(c.key, c.source_branches) for c in detected] == [(c.key, c.source_branches) for c in out.conflicts]
    # applying the changes to the base gives the merged layer
    applied = dict(base)
    for key, value in out.changes:
        if value is DELETED:
            del applied[key]
        else:
            applied[key] = value
    assert {k: ref_norm(v) for k, v in applied.items()} == {k: ref_norm(v) for k, v in out.merged.items()}


def test_merged_conflict_is_frozen() -> None:
    c = MergedConflict("a", 1, {"x": 2}, ("x",))
    with pytest.raises(AttributeError):
        c.key = "b"  # type: ignore[misc]


def test_a_list_of_branches_is_named_as_the_seed_names_them() -> None:
    base = {"approval_status": "pending", "amount": 120000}
    found = ConflictDetector().detect_conflicts(base, [{**base, "approval_status": "approved"},
                                                       {**base, "approval_status": "rejected"}, dict(base)])
    assert [(c.key, c.conflicting_values, c.source_branches) for c in found] == [
        ("approval_status", {"branch_0": "approved", "branch_1": "rejected"}, ("branch_0", "branch_1"))]
    assert three_way_merge(base, [base, {**base, "note": 1}]).changes == [("note", 1)]
    for bad, named in (("ab", "str"), ([{"a": 1}, 2], "branch 1 must be a mapping")):
        with pytest.raises(TypeError, match=named):
            ConflictDetector().detect_conflicts(base, bad)  # type: ignore[arg-type]
