"""The safe condition evaluator."""

from __future__ import annotations

from typing import Any

import pytest

from gateways import ExpressionError, UnknownNameError, UnsafeExpressionError, evaluate, evaluate_condition
from gateways.expressions import check_expression, expression_names

VARS: dict[str, Any] = {
    "risk_level": "high", "amount": 150000, "score": 0.72, "tags": ["vip", "new"], "flag": True, "none": None,
    "applicant": {"name": "Ada", "history": [3, 5, 8]}, "Status": "Approved",
}

VALID = [
    ("risk_level == 'high' and amount > 100000", True),
    ("risk_level == 'low' or amount < 50000", False),
    ("not flag", False),
    ("amount * 2 - 1", 299999),
    ("amount / 1000", 150.0),
    ("amount // 7 % 5", 150000 // 7 % 5),
    ("-score + 1 > 0.2", True),
    ("2 ** 10", 1024),
    ("'vip' in tags", True),
    ("'old' not in tags", True),
    ("'Ada' == applicant['name']", True),
    ("applicant['history'][-1]", 8),
    ("applicant['history'][1:]", [5, 8]),
    ("len(tags) == 2 and max(applicant['history']) == 8", True),
    ("min(1, 2, 3) + abs(-4) + round(2.6)", 8),
    ("lower(Status) == 'approved'", True),
    ("upper('x')", "X"),
    ("[amount, 'x']", [150000, "x"]),
    ("{'a': amount}['a']", 150000),
    ("'fast' if amount < 50000 else 'full'", "full"),
    ("none is None", True),
    ("risk_level is not None", True),
    ("1 == 1.0", True),
    ("True == 1", False),  # canonical equality: bool is not a number
    ("1 in [True]", False),
    ("1.0 in [1, 2]", True),
    ("10000 < amount <= 150000", True),
    ("0 < amount < 10", False),
    ("sum(applicant['history'])", 16),
    ("any([none, flag]) and all([1, 'x'])", True),
    ("int('42') + float('0.5')", 42.5),
    ("str(3) + 'x'", "3x"),
    ("'y' in {'y': 1}", True),
    # written over several lines (a YAML block scalar, a wrapped text box): continued as in parentheses
    ("risk_level == 'high'\n  and amount > 100000\n", True),
    ("\nrisk_level == 'low'\nor amount < 50000", False),
]


@pytest.mark.parametrize(("expression", "expected"), VALID)
def test_valid_expressions(expression: str, expected: Any) -> None:
    assert evaluate(expression, VARS) == expected
    assert evaluate_condition(expression, VARS) == bool(expected)


UNSAFE = [
    "__import__('os')",
    "__import__('os').system('true')",
    "open('/etc/passwd')",
    "eval('1')",
    "tags.append(1)",
    "risk_level.upper()",
    "().__class__.__bases__[0].__subclasses__()",
    "applicant.__class__",
    "lambda: 1",
    "(lambda x: x)(1)",
    "[t for t in tags]",
    "{t: 1 for t in tags}",
    "(x := 1)",
    "f'{amount}'",
    "len(*tags)",
    "max(tags, key=len)",
    "{**applicant}",
    "amount is 1",
    "b'bytes'",
    "x" * 3000,
]


@pytest.mark.parametrize("expression", UNSAFE)
def test_unsafe_expressions_are_refused_before_evaluation(expression: str) -> None:
    with pytest.raises(UnsafeExpressionError):
        check_expression(expression)
    with pytest.raises(UnsafeExpressionError):
        evaluate(expression, VARS)


BAD = [
    ("import os", "syntax error"),
    ("amount >", "syntax error"),
    ("amount >\n", "syntax error"),
    ("amount) or (score", "syntax error"),
    ("", "empty condition"),
    ("'a' > 1", "evaluation failed \\(TypeError"),
    ("amount / 0", "ZeroDivisionError"),
    ("tags[5]", "IndexError"),
    ("applicant['age']", "KeyError"),
    ("'x' * 100000", "longer than"),
    ("[1] * 5000 * 3", "longer than"),
    ("2 ** 1000", "exponent"),
    ("2 ** 10 ** 10", "exponent"),
    ("lower(3)", "lower\\(\\) needs a string"),
]


@pytest.mark.parametrize(("expression", "message"), BAD)
def test_bad_expressions_raise_expression_error(expression: str, message: str) -> None:
    with pytest.raises(ExpressionError, match=message) as info:
        evaluate(expression, VARS)
    assert not isinstance(info.value, UnknownNameError)


def test_unknown_name_is_named() -> None:
    with pytest.raises(UnknownNameError, match="unknown name 'risk_levl'") as info:
        evaluate("risk_levl == 'high'", VARS)
    assert info.value.name == "risk_levl"
    assert "risk_levl == 'high'" in str(info.value)


def test_short_circuit_skips_unknown_names() -> None:
    assert evaluate("amount < 0 and missing > 1", VARS) is False
    assert evaluate("flag or missing", VARS) is True


def test_function_names_are_not_variables() -> None:
    assert evaluate("len(tags)", {**VARS, "len": 99}) == 2
    with pytest.raises(UnsafeExpressionError):
        evaluate("amount(1)", VARS)


def test_expression_names() -> None:
    assert expression_names("risk_level == 'high' and len(tags) > amount and risk_level") == ["risk_level", "tags", "amount"]
