"""Whether the conditions of an exclusive gateway without a default flow cover every case.

``coverage_gap(conditions)`` is what ``layerflow validate`` reports as
``gateway_coverage_gap`` (an error when the gap is certain) or ``gateway_not_exhaustive``
(a warning). Pure: it reads the conditions' Python syntax trees, runs nothing.

The exclusive-gateway check is deliberately narrow and honest. It only judges a gateway
without a default flow whose every outgoing condition is built from comparisons of
*one* variable (a name, ``a.b`` or ``a['k']``) with constants, combined with
``and``/``or``/``not``:

* numbers (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``, ``in``, chained ``0 <= x < 5``):
  the union of the conditions is computed as a set of intervals on the real line; any
  gap is reported (``x < 5`` and ``x > 5`` leave ``x == 5``). Integer-only variables are
  not assumed: ``x <= 4`` / ``x >= 5`` leave ``4 < x < 5``, and neither are non-negative
  ones: ``x > 0`` / ``x == 0`` leave ``x < 0``; such a gap, which misses no natural number,
  is not ``certain``.
* strings, booleans, ``None`` (``==``, ``!=``, ``in``, ``is``): the variable's set of
  possible values is unknown, so conditions that only accept a finite set are
  reported as not exhaustive; ``!=`` / ``not in`` conditions are complemented exactly.
* a bare variable and its negation (``approved`` / ``not approved``) cover everything.

Anything else (two variables, arithmetic, function calls, string ordering, mixed
constant types, natural-language branch conditions in the config) cannot be judged
without running the process, and is not reported.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["CoverageGap", "coverage_gap"]


@dataclass(frozen=True)
class CoverageGap:
    """What the conditions miss: ``code`` is ``gateway_coverage_gap`` (values no condition
    accepts) or ``gateway_not_exhaustive`` (only a finite set of values is handled); ``text``
    completes "its conditions ..." (``do not cover x == 5``). ``certain``: the missed values
    surely exist. Equality tests against a set of values (the variable may never take another)
    and gaps holding no natural number (``x <= 4`` / ``x >= 5`` over counts, ``x > 0`` / ``x == 0``
    over amounts) cannot be judged without the data."""

    code: str
    text: str
    certain: bool


def coverage_gap(conditions: Sequence[ast.expr]) -> CoverageGap | None:
    """The gap the union of ``conditions`` leaves, or None when they cover every value or
    when any of them is outside the fragment judged here (see the module docstring)."""
    union = _fold("or", [_analyse(c) for c in conditions])
    if union is None:
        return None
    gap = _describe_gap(union)
    if gap is None:
        return None
    code, text = gap
    return CoverageGap(code, text, certain=code == "gateway_coverage_gap" and not _only_fractional_gaps(union))

_Interval = tuple[float, bool, float, bool]  # (low, low included, high, high included)
_ALL: _Interval = (-math.inf, False, math.inf, False)


def _normalize(parts: Iterable[_Interval]) -> tuple[_Interval, ...]:
    """Sorted, disjoint, merged; empty intervals dropped."""
    live = [p for p in parts if p[0] < p[2] or (p[0] == p[2] and p[1] and p[3])]
    live.sort(key=lambda p: (p[0], not p[1]))
    out: list[_Interval] = []
    for lo, lo_in, hi, hi_in in live:
        if out:
            plo, plo_in, phi, phi_in = out[-1]
            if lo < phi or (lo == phi and (phi_in or lo_in)):
                if hi > phi:
                    out[-1] = (plo, plo_in, hi, hi_in)
                elif hi == phi:
                    out[-1] = (plo, plo_in, phi, phi_in or hi_in)
                continue
        out.append((lo, lo_in, hi, hi_in))
    return tuple(out)


@dataclass(frozen=True)
class _Reals:
    """A union of intervals of the real line."""

    parts: tuple[_Interval, ...]

    def union(self, other: _Reals) -> _Reals:
        return _Reals(_normalize(self.parts + other.parts))

    def complement(self) -> _Reals:
        gaps: list[_Interval] = []
        lo, lo_in = -math.inf, False
        for plo, plo_in, phi, phi_in in self.parts:
            gaps.append((lo, lo_in, plo, not plo_in))
            lo, lo_in = phi, not phi_in
        gaps.append((lo, lo_in, math.inf, False))
        return _Reals(_normalize(gaps))

    @property
    def universal(self) -> bool:
        return self.parts == (_ALL,)


@dataclass(frozen=True)
class _Values:
    """A finite set of values, or (``cofinite``) everything except a finite set."""

    cofinite: bool
    values: frozenset[tuple[str, Any]]  # (type name, value): 1 and True stay apart

    def union(self, other: _Values) -> _Values:
        a, b = self, other
        if not a.cofinite and not b.cofinite:
            return _Values(False, a.values | b.values)
        if a.cofinite and b.cofinite:
            return _Values(True, a.values & b.values)
        fin, cof = (a, b) if not a.cofinite else (b, a)
        return _Values(True, cof.values - fin.values)

    def complement(self) -> _Values:
        return _Values(not self.cofinite, self.values)

    @property
    def universal(self) -> bool:
        return self.cofinite and not self.values


@dataclass(frozen=True)
class _Truth:
    """Which truth values of a bare variable (``approved`` / ``not approved``) pass."""

    values: frozenset[bool]

    def union(self, other: _Truth) -> _Truth:
        return _Truth(self.values | other.values)

    def complement(self) -> _Truth:
        return _Truth(frozenset({True, False}) - self.values)

    @property
    def universal(self) -> bool:
        return len(self.values) == 2


_Set = _Reals | _Values | _Truth
_EMPTY: dict[type, _Set] = {_Reals: _Reals(()), _Values: _Values(False, frozenset()), _Truth: _Truth(frozenset())}


@dataclass(frozen=True)
class _Term:
    """The set of values of ``var`` for which a condition holds; ``var`` None: a constant (``value`` bool)."""

    var: str | None
    value: _Set | bool


def _lift(term: _Term, like: _Set) -> _Set:
    empty = _EMPTY[type(like)]
    return empty.complement() if term.value else empty


def _combine(op: str, a: _Term | None, b: _Term | None) -> _Term | None:
    if a is None or b is None:
        return None
    if a.var is None and b.var is None:
        return _Term(None, (a.value or b.value) if op == "or" else (a.value and b.value))
    if a.var is None:
        a = _Term(b.var, _lift(a, b.value))  # type: ignore[arg-type]
    if b.var is None:
        b = _Term(a.var, _lift(b, a.value))  # type: ignore[arg-type]
    if a.var != b.var or type(a.value) is not type(b.value):
        return None
    x, y = a.value, b.value
    if op == "or":
        return _Term(a.var, x.union(y))  # type: ignore[union-attr,arg-type]
    return _Term(a.var, x.complement().union(y.complement()).complement())  # type: ignore[union-attr,arg-type]


def _fold(op: str, terms: Sequence[_Term | None]) -> _Term | None:
    result = terms[0] if terms else None
    for t in terms[1:]:
        result = _combine(op, result, t)
    return result


def _negate(term: _Term | None) -> _Term | None:
    if term is None:
        return None
    if term.var is None:
        return _Term(None, not term.value)
    return _Term(term.var, term.value.complement())  # type: ignore[union-attr]


def _analyse(node: ast.expr) -> _Term | None:
    """The set a condition accepts, or None when it is out of the analysable fragment."""
    if isinstance(node, ast.BoolOp):
        return _fold("and" if isinstance(node.op, ast.And) else "or", [_analyse(v) for v in node.values])
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _negate(_analyse(node.operand))
    if isinstance(node, ast.Constant):
        return _Term(None, bool(node.value))
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        return _fold("and", [_comparison(l, op, r) for l, op, r in zip(operands, node.ops, operands[1:])])
    var = _variable(node)
    return _Term(var, _Truth(frozenset({True}))) if var else None


def _variable(node: ast.expr) -> str | None:
    """``x``, ``x.y`` or ``x['k']``: something that reads one value and calls nothing."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and _variable(node.value):
        return ast.unparse(node)
    if isinstance(node, ast.Subscript) and _variable(node.value) and isinstance(node.slice, ast.Constant):
        return ast.unparse(node)
    return None


_NO_CONSTANT = object()


def _constant(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and (node.value is None or isinstance(node.value, (bool, int, float, str))):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        inner = _constant(node.operand)
        if _is_number(inner):
            return -inner if isinstance(node.op, ast.USub) else inner
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = tuple(_constant(e) for e in node.elts)
        return _NO_CONSTANT if any(i is _NO_CONSTANT or isinstance(i, tuple) for i in items) else items
    return _NO_CONSTANT


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


_FLIP: dict[type[ast.cmpop], type[ast.cmpop]] = {ast.Lt: ast.Gt, ast.Gt: ast.Lt, ast.LtE: ast.GtE, ast.GtE: ast.LtE,
                           ast.Eq: ast.Eq, ast.NotEq: ast.NotEq, ast.Is: ast.Is, ast.IsNot: ast.IsNot}


def _comparison(left: ast.expr, op: ast.cmpop, right: ast.expr) -> _Term | None:
    var, const, kind = _variable(left), _constant(right), type(op)
    if var is None or const is _NO_CONSTANT:
        var, const = _variable(right), _constant(left)
        if var is None or const is _NO_CONSTANT or kind not in _FLIP:
            return None
        kind = _FLIP[kind]
    members = const if isinstance(const, tuple) else (const,)
    if kind in (ast.In, ast.NotIn) and not isinstance(const, tuple):
        return None  # ``x in "abc"`` is a substring test
    if isinstance(const, tuple) and kind not in (ast.In, ast.NotIn):
        return None
    if members and all(_is_number(m) for m in members):
        if kind in (ast.Is, ast.IsNot):
            return None
        value: _Set = _reals(kind, members)
    elif all(m is None or isinstance(m, (str, bool)) for m in members):
        if kind not in (ast.Eq, ast.NotEq, ast.In, ast.NotIn, ast.Is, ast.IsNot):
            return None
        if kind in (ast.Is, ast.IsNot) and any(isinstance(m, str) for m in members):
            return None  # identity of strings is an implementation detail
        value = _Values(False, frozenset((type(m).__name__, m) for m in members))
        if kind in (ast.NotEq, ast.NotIn, ast.IsNot):
            value = value.complement()
    else:
        return None
    return _Term(var, value)


def _reals(kind: type[ast.cmpop], members: tuple[Any, ...]) -> _Reals:
    inf = math.inf
    if kind in (ast.Eq, ast.In, ast.NotEq, ast.NotIn):
        points = _Reals(_normalize((float(m), True, float(m), True) for m in members))
        return points.complement() if kind in (ast.NotEq, ast.NotIn) else points
    (c,) = members
    c = float(c)
    return _Reals({
        ast.Lt: ((-inf, False, c, False),), ast.LtE: ((-inf, False, c, True),),
        ast.Gt: ((c, False, inf, False),), ast.GtE: ((c, True, inf, False),),
    }[kind])


def _number(x: float) -> str:
    return str(int(x)) if x.is_integer() else repr(x)


def _only_fractional_gaps(term: _Term) -> bool:
    """Whether the numeric conditions miss no natural number: every value they miss is negative
    or lies strictly between two integers. Counts and amounts, which is what conditions compare
    with 0 (``remaining > 0`` / ``remaining == 0``), are never negative nor, for counts, fractions."""
    if term.var is None or not isinstance(term.value, _Reals):
        return False
    for lo, lo_in, hi, hi_in in term.value.complement().parts:
        if math.isinf(hi):
            return False
        if lo < 0:
            first: float = 0.0
        else:
            first = lo if lo_in and float(lo).is_integer() else math.floor(lo) + 1
        if first < hi or (first == hi and hi_in):
            return False
    return True


def _describe_gap(term: _Term) -> tuple[str, str] | None:
    """(code, text) when the union of the conditions misses some value; None when it covers all."""
    if term.var is None:
        return None if term.value else ("gateway_coverage_gap", "can never be true")
    var, value = term.var, term.value
    if isinstance(value, _Reals):
        if value.universal:
            return None
        if all(lo == hi for lo, _, hi, _ in value.parts):
            handled = ", ".join(f"{var} == {_number(lo)}" for lo, _, _, _ in value.parts)
            return "gateway_not_exhaustive", f"only handle {handled}: not exhaustive"
        gaps = [_interval_text(var, p) for p in value.complement().parts]
        return "gateway_coverage_gap", f"do not cover {' or '.join(gaps)}"
    if isinstance(value, _Values):
        if value.universal:
            return None
        shown = ", ".join(f"{var} == {v!r}" for _, v in sorted(value.values, key=repr))
        if not value.cofinite:
            return "gateway_not_exhaustive", f"only handle {shown or 'no value'}: not exhaustive"
        return "gateway_coverage_gap", f"do not cover {shown}"
    if isinstance(value, _Truth):
        if value.universal:
            return None
        missing = "false" if True in value.values else "true"
        return "gateway_coverage_gap", f"do not cover {var} being {missing}"
    return None


def _interval_text(var: str, part: _Interval) -> str:
    lo, lo_in, hi, hi_in = part
    if lo == hi:
        return f"{var} == {_number(lo)}"
    if lo == -math.inf:
        return f"{var} {'<=' if hi_in else '<'} {_number(hi)}"
    if hi == math.inf:
        return f"{var} {'>=' if lo_in else '>'} {_number(lo)}"
    return f"{_number(lo)} {'<=' if lo_in else '<'} {var} {'<=' if hi_in else '<'} {_number(hi)}"
