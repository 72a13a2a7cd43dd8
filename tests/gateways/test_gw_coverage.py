"""The static coverage of exclusive-gateway conditions (``gateways.coverage``): the
interval and value-set algebra against brute force, and ``coverage_gap``'s verdicts."""

from __future__ import annotations

import ast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateways.coverage import _analyse, _describe_gap, _fold, coverage_gap


def _parsed(*conditions: str) -> list[ast.expr]:
    return [ast.parse(c, mode="eval").body for c in conditions]


@pytest.mark.parametrize(("conditions", "code", "text", "certain"), [
    (["x < 5", "x > 5"], "gateway_coverage_gap", "do not cover x == 5", True),
    (["x <= 4", "x >= 5"], "gateway_coverage_gap", "do not cover 4 < x < 5", False),  # no integer is missed
    # only negative numbers are missed: amounts and counts (what is compared with 0) never are
    (["amount > 0", "amount == 0"], "gateway_coverage_gap", "do not cover amount < 0", False),
    (["x >= 1", "x == 0"], "gateway_coverage_gap", "do not cover x < 0 or 0 < x < 1", False),
    (["x > 0"], "gateway_coverage_gap", "do not cover x <= 0", True),  # 0 is missed
    (["x > 0", "x < -5"], "gateway_coverage_gap", "do not cover -5 <= x <= 0", True),  # so is 0 here
    (["s == 'a'", "s == 'b'"], "gateway_not_exhaustive", "only handle s == 'a', s == 'b': not exhaustive", False),
    (["approved"], "gateway_coverage_gap", "do not cover approved being false", True),
    (["False"], "gateway_coverage_gap", "can never be true", True),
])
def test_coverage_gap_names_what_the_conditions_miss(conditions: list[str], code: str, text: str,
                                                     certain: bool) -> None:
    gap = coverage_gap(_parsed(*conditions))
    assert gap is not None
    assert (gap.code, gap.text, gap.certain) == (code, text, certain)


@pytest.mark.parametrize("conditions", [
    ["x < 5", "x >= 5"],
    ["approved", "not approved"],
    ["s != 'a'", "s == 'a'"],
    ["0 <= x < 5", "x < 0", "x >= 5"],
])
def test_conditions_that_cover_every_value_have_no_gap(conditions: list[str]) -> None:
    assert coverage_gap(_parsed(*conditions)) is None


@pytest.mark.parametrize("conditions", [
    ["x < y", "x >= 5"],  # two variables
    ["len(items) > 0"],  # a call
    ["x < 5", "s == 'a'"],  # two different variables
    [],
])
def test_conditions_outside_the_judged_fragment_are_not_judged(conditions: list[str]) -> None:
    assert coverage_gap(_parsed(*conditions)) is None


# The interval algebra against brute force: every interval endpoint is one of CONSTANTS, so
# the constants, the midpoints between them and one point beyond each end decide coverage.
CONSTANTS = (0, 1, 2.5, 5)
SAMPLES = sorted({*CONSTANTS, -1, 6, *((a + b) / 2 for a, b in zip(CONSTANTS, CONSTANTS[1:]))})


def _conditions() -> st.SearchStrategy[str]:
    atom = st.builds(lambda op, c, flip: f"{c} {FLIPPED[op]} x" if flip else f"x {op} {c}",
                     st.sampled_from(["<", "<=", ">", ">=", "==", "!="]), st.sampled_from(CONSTANTS), st.booleans())
    return st.recursive(atom, lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) or ({b})", inner, inner),
        st.builds(lambda a: f"not ({a})", inner),
    ), max_leaves=4)


FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}


@given(st.lists(_conditions(), min_size=1, max_size=3))
def test_numeric_coverage_agrees_with_brute_force(conditions: list[str]) -> None:
    term = _fold("or", [_analyse(ast.parse(c, mode="eval").body) for c in conditions])
    assert term is not None
    uncovered = {x for x in SAMPLES if not any(eval(c, {"x": x}) for c in conditions)}  # noqa: S307 - generated numbers only
    gap = _describe_gap(term)
    assert (gap is None) is (not uncovered), (conditions, gap)
    if term.var is not None:  # the exact uncovered set, not only whether there is one
        holes = term.value.complement().parts  # type: ignore[union-attr]
        inside = {x for x in SAMPLES for lo, lo_in, hi, hi_in in holes
                  if (lo < x or (lo_in and lo == x)) and (x < hi or (hi_in and x == hi))}
        assert inside == uncovered, (conditions, holes)


def _string_conditions() -> st.SearchStrategy[str]:
    word = st.sampled_from(["'a'", "'b'", "'c'"])
    atom = st.one_of(
        st.builds(lambda op, w: f"s {op} {w}", st.sampled_from(["==", "!="]), word),
        st.builds(lambda op, ws: f"s {op} ({', '.join(ws)},)", st.sampled_from(["in", "not in"]),
                  st.lists(word, min_size=1, max_size=2)),
    )
    return st.recursive(atom, lambda inner: st.one_of(
        st.builds(lambda a, b: f"({a}) and ({b})", inner, inner),
        st.builds(lambda a, b: f"({a}) or ({b})", inner, inner),
        st.builds(lambda a: f"not ({a})", inner),
    ), max_leaves=4)


@given(st.lists(_string_conditions(), min_size=1, max_size=3))
def test_value_set_coverage_agrees_with_brute_force(conditions: list[str]) -> None:
    term = _fold("or", [_analyse(ast.parse(c, mode="eval").body) for c in conditions])
    assert term is not None
    # "other" stands for every value no condition names.
    uncovered = {s for s in ("a", "b", "c", "other") if not any(eval(c, {"s": s}) for c in conditions)}  # noqa: S307
    gap = _describe_gap(term)
    assert (gap is None) is (not uncovered), (conditions, gap)
    if gap is not None:
        code, text = gap
        assert code == ("gateway_not_exhaustive" if "other" in uncovered else "gateway_coverage_gap")
        if "other" not in uncovered:
            assert all(f"s == {s!r}" in text for s in uncovered), text
