"""A small, safe evaluator for policy ``when`` conditions and XOR branch conditions.

An expression is Python syntax, parsed with ``ast`` and interpreted node by node
here (never ``eval``/``compile``). Allowed:

* names, resolved in the ``variables`` mapping (the context);
* constants, list / tuple / dict literals, subscripts (``applicant["score"]``,
  ``items[0]``, slices);
* ``and`` / ``or`` / ``not``, ``x if c else y``, comparisons (``== != < <= > >=``,
  ``in``, ``not in``, ``is None`` / ``is not None``), arithmetic
  (``+ - * / // %`` and ``**`` with a small exponent), unary ``-`` / ``+``;
* calls of a few functions by name: ``len min max abs round sum any all lower upper
  int float str bool`` (``lower(x)`` instead of ``x.lower()``).

Everything else is refused before evaluation with ``UnsafeExpressionError``:
attribute access (``x.__class__``), any other call (``__import__('os')``), lambda,
comprehensions, assignment expressions, f-strings, starred arguments.

Decisions:

* An unknown name raises ``UnknownNameError`` naming it (never ``None``: a typo in a
  condition must not quietly pick a branch). A policy rule whose condition names a
  key that is absent from the context does not apply (the caller records why).
* ``==``/``!=`` and ``in`` on lists use the merge's canonical JSON equality
  (``1 == 1.0``, ``True != 1``), so a condition and the join agree on what is equal.
* Results of ``*`` and ``**`` are bounded (no ``"x" * 10**9``); an expression is at
  most 2,000 characters.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Iterator, Mapping
from typing import Any

from context_layers.context import LayeredContext
from context_layers.errors import ConfigError

from .conflicts import same_value

__all__ = ["ExpressionError", "UnknownNameError", "UnsafeExpressionError", "check_expression", "evaluate",
           "evaluate_condition", "expression_names"]

MAX_LENGTH = 2000
MAX_SEQUENCE = 10_000
MAX_EXPONENT = 64


class ExpressionError(ConfigError):
    """A condition that cannot be evaluated: bad syntax, a type error, an unknown name."""

    def __init__(self, message: str, *, expression: str) -> None:
        self.expression = expression
        super().__init__(f"{message} in expression {expression!r}")


class UnsafeExpressionError(ExpressionError):
    """The expression uses syntax outside the allowed subset."""


class UnknownNameError(ExpressionError):
    def __init__(self, name: str, *, expression: str) -> None:
        self.name = name
        super().__init__(f"unknown name {name!r} (no such context key)", expression=expression)


def _lower(s: Any) -> str:
    if not isinstance(s, str):
        raise TypeError(f"lower() needs a string, got {type(s).__name__}")
    return s.lower()


def _upper(s: Any) -> str:
    if not isinstance(s, str):
        raise TypeError(f"upper() needs a string, got {type(s).__name__}")
    return s.upper()


FUNCTIONS: dict[str, Any] = {
    "len": len, "min": min, "max": max, "abs": abs, "round": round, "sum": sum, "any": any, "all": all,
    "lower": _lower, "upper": _upper, "int": int, "float": float, "str": str, "bool": bool,
}

_BINOPS: dict[type, Any] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_ORDER: dict[type, Any] = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}
_ALLOWED = (
    ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd, ast.BinOp,
    *_BINOPS, ast.Compare, ast.Eq, ast.NotEq, *_ORDER, ast.In, ast.NotIn, ast.Is, ast.IsNot, ast.IfExp,
    ast.Name, ast.Load, ast.Constant, ast.List, ast.Tuple, ast.Dict, ast.Subscript, ast.Slice, ast.Call,
)


def _parse_multiline(source: str) -> ast.Expression | None:
    try:
        return ast.parse(f"({source}\n)", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None


def _parse(expression: str) -> ast.Expression:
    if not isinstance(expression, str) or not expression.strip():
        raise ExpressionError("empty condition", expression=str(expression))
    if len(expression) > MAX_LENGTH:
        raise UnsafeExpressionError(f"condition longer than {MAX_LENGTH} characters", expression=expression[:80] + "...")
    source = expression.strip()
    try:
        tree = ast.parse(source, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        # a condition written over several lines (a YAML block, a modeler's wrapped text box)
        # continues the way Python continues a line: inside parentheses
        retry = _parse_multiline(source) if "\n" in source else None
        if retry is None:
            raise ExpressionError(f"syntax error ({getattr(err, 'msg', err)})", expression=expression) from None
        tree = retry
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise UnsafeExpressionError(f"{type(node).__name__} is not allowed (see gateways.expressions)",
                                        expression=expression)
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
                raise UnsafeExpressionError(
                    f"call of {ast.unparse(node.func)!r} is not allowed; only {', '.join(FUNCTIONS)}",
                    expression=expression)
            if node.keywords:
                raise UnsafeExpressionError("keyword arguments are not allowed", expression=expression)
        if isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators):
                if isinstance(op, (ast.Is, ast.IsNot)) and not (isinstance(right, ast.Constant) and right.value is None):
                    raise UnsafeExpressionError("'is' compares with None only; use ==", expression=expression)
        if isinstance(node, ast.Dict) and any(k is None for k in node.keys):
            raise UnsafeExpressionError("'**' in a dict literal is not allowed", expression=expression)
        if isinstance(node, ast.Constant) and not isinstance(node.value, (str, int, float, bool, type(None))):
            raise UnsafeExpressionError(f"constant {node.value!r} is not allowed", expression=expression)
    return tree


def check_expression(expression: str) -> None:
    """Raise ``ExpressionError`` if ``expression`` would be refused (for config validation)."""
    _parse(expression)


def expression_names(expression: str) -> list[str]:
    """The context keys an expression reads, in order of appearance (function names excluded)."""
    tree = _parse(expression)
    calls = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    found = [n for n in ast.walk(tree) if isinstance(n, ast.Name) and id(n) not in calls]
    found.sort(key=lambda n: (n.lineno, n.col_offset))
    return list(dict.fromkeys(n.id for n in found))


def _contains(container: Any, item: Any) -> bool:
    if isinstance(container, (list, tuple)):
        return any(same_value(item, x) for x in container)
    return bool(operator.contains(container, item))


def _compare(op: ast.cmpop, left: Any, right: Any) -> bool:
    if isinstance(op, ast.Eq):
        return same_value(left, right)
    if isinstance(op, ast.NotEq):
        return not same_value(left, right)
    if isinstance(op, ast.In):
        return _contains(right, left)
    if isinstance(op, ast.NotIn):
        return not _contains(right, left)
    if isinstance(op, ast.Is):
        return left is None
    if isinstance(op, ast.IsNot):
        return left is not None
    return bool(_ORDER[type(op)](left, right))


def _binop(op: ast.operator, left: Any, right: Any) -> Any:
    if isinstance(op, ast.Mult):
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_SEQUENCE:
                raise ValueError(f"result longer than {MAX_SEQUENCE}")
    if isinstance(op, ast.Pow) and (not isinstance(right, (int, float)) or abs(right) > MAX_EXPONENT):
        raise ValueError(f"exponent above {MAX_EXPONENT}")
    return _BINOPS[type(op)](left, right)


class _Interpreter:
    def __init__(self, expression: str, variables: Mapping[str, Any]) -> None:
        self.expression = expression
        self.variables = variables

    def run(self, node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return self.run(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id in self.variables:
                return self.variables[node.id]
            raise UnknownNameError(node.id, expression=self.expression)
        if isinstance(node, ast.BoolOp):
            is_and = isinstance(node.op, ast.And)
            value: Any = None
            for operand in node.values:
                value = self.run(operand)
                if bool(value) != is_and:
                    return value
            return value
        if isinstance(node, ast.UnaryOp):
            operand = self.run(node.operand)
            if isinstance(node.op, ast.Not):
                return not operand
            return -operand if isinstance(node.op, ast.USub) else +operand
        if isinstance(node, ast.BinOp):
            return _binop(node.op, self.run(node.left), self.run(node.right))
        if isinstance(node, ast.Compare):
            left = self.run(node.left)
            for op, comparator in zip(node.ops, node.comparators):
                right = self.run(comparator)
                if not _compare(op, left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.IfExp):
            return self.run(node.body) if self.run(node.test) else self.run(node.orelse)
        if isinstance(node, (ast.List, ast.Tuple)):
            return [self.run(e) for e in node.elts]
        if isinstance(node, ast.Dict):
            return {self.run(k): self.run(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
        if isinstance(node, ast.Subscript):
            return self.run(node.value)[self.run(node.slice)]
        if isinstance(node, ast.Slice):
            parts = (node.lower, node.upper, node.step)
            return slice(*(None if p is None else self.run(p) for p in parts))
        if isinstance(node, ast.Call):
            func = FUNCTIONS[node.func.id]  # type: ignore[attr-defined]
            args = []
            for a in node.args:
                if isinstance(a, ast.Starred):
                    raise UnsafeExpressionError("'*' arguments are not allowed", expression=self.expression)
                args.append(self.run(a))
            return func(*args)
        raise UnsafeExpressionError(f"{type(node).__name__} is not allowed", expression=self.expression)


class _ContextVariables(Mapping[str, Any]):
    """A context's keys as a read resolves them (L0 first)."""

    def __init__(self, ctx: LayeredContext) -> None:
        self._ctx = ctx

    def __getitem__(self, key: str) -> Any:
        return self._ctx.resolve(key)

    def __contains__(self, key: object) -> bool:
        return key in self._ctx

    def __iter__(self) -> Iterator[str]:
        return iter(self._ctx.keys())

    def __len__(self) -> int:
        return len(self._ctx.keys())


def evaluate(expression: str, variables: Mapping[str, Any] | LayeredContext) -> Any:
    """The value of ``expression`` with names looked up in ``variables`` (see module doc), a
    mapping or a context (its keys as a read resolves them)."""
    if isinstance(variables, LayeredContext):
        variables = _ContextVariables(variables)
    tree = _parse(expression)
    try:
        result = _Interpreter(expression, variables).run(tree)
    except ExpressionError:
        raise
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError, RecursionError) as err:
        detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise ExpressionError(f"evaluation failed ({detail})", expression=expression) from None
    if isinstance(result, float) and not math.isfinite(result):
        raise ExpressionError(f"result {result!r} is not a finite number", expression=expression)
    return result


def evaluate_condition(expression: str, variables: Mapping[str, Any] | LayeredContext) -> bool:
    """``bool(evaluate(...))``: whether a condition holds."""
    return bool(evaluate(expression, variables))
