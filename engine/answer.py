"""A model's JSON answer: parse it, check it against the activity's contract.

The contract is either a JSON Schema (``outputSchema``) or a list of required keys
(``outputKeys``). The validator covers the part of JSON Schema an activity answer
needs (``type``, ``required``, ``properties``, ``additionalProperties``, ``items``,
``enum``, ``const``, ``minimum``/``maximum``, ``minLength``/``maxLength``,
``minItems``/``maxItems``, ``anyOf``); unknown keywords are ignored, as the spec says.
Every problem is reported with its JSON pointer so the corrective message sent back
to the model can say exactly what to fix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from context_layers.canonical import freeze

__all__ = ["AnswerError", "answer_contract", "answer_problems", "parse_answer", "validate_schema"]


class AnswerError(ValueError):
    """The model's reply is not an acceptable answer; ``problems`` say why (retryable)."""

    def __init__(self, problems: Sequence[str], text: str) -> None:
        self.problems = list(problems)
        self.text = text
        super().__init__("; ".join(self.problems))


_FENCE = re.compile(r"^```[A-Za-z]*\s*\n?(.*?)\n?\s*```$", re.DOTALL)

_TYPES: dict[str, Any] = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def _same(a: Any, b: Any) -> bool:
    from context_layers.canonical import json_equal

    return json_equal(a, b)


def validate_schema(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """Problems of ``value`` against ``schema`` (empty when valid)."""
    where = path or "/"
    problems: list[str] = []
    if not isinstance(schema, Mapping):
        return problems
    types = schema.get("type")
    if types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if not any(_TYPES.get(t, lambda v: True)(value) for t in names):
            return [f"{where}: expected {' or '.join(names)}, got {_json_type(value)}"]
    if "enum" in schema and not any(_same(value, option) for option in schema["enum"]):
        problems.append(f"{where}: {json.dumps(value)} is not one of {json.dumps(schema['enum'])}")
    if "const" in schema and not _same(value, schema["const"]):
        problems.append(f"{where}: must be {json.dumps(schema['const'])}")
    if "anyOf" in schema and not any(not validate_schema(value, s, path) for s in schema["anyOf"]):
        problems.append(f"{where}: matches none of the allowed forms")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            problems.append(f"{where}: {value} is below the minimum {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            problems.append(f"{where}: {value} is above the maximum {schema['maximum']}")
    if isinstance(value, str):
        if "minLength" in schema and len(value) < schema["minLength"]:
            problems.append(f"{where}: shorter than {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{where}: longer than {schema['maxLength']} characters")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{where}: fewer than {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{where}: more than {schema['maxItems']} items")
        if isinstance(schema.get("items"), Mapping):
            for i, item in enumerate(value):
                problems += validate_schema(item, schema["items"], f"{path}/{i}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                problems.append(f"{where}: missing required key {key!r}")
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            sub = f"{path}/{_pointer(key)}"
            if key in props:
                problems += validate_schema(item, props[key], sub)
            elif extra is False:
                problems.append(f"{where}: unexpected key {key!r} (allowed: {', '.join(props) or 'none'})")
            elif isinstance(extra, Mapping):
                problems += validate_schema(item, extra, sub)
    return problems


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_answer(text: Any, *, schema: Mapping[str, Any] | None = None,
                 keys: Sequence[str] = ()) -> dict[str, Any]:
    """The answer object in ``text``, checked against ``schema`` or ``keys``; else ``AnswerError``.

    A Markdown code fence around the object is tolerated (models add them).
    """
    if not isinstance(text, str) or not text.strip():
        raise AnswerError(["the reply is empty; answer with one JSON object"], text=str(text or ""))
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    if fenced:
        stripped = fenced.group(1).strip()
    try:
        data = json.loads(stripped, parse_constant=_reject_constant)
        freeze(data)  # what the context will accept: no NaN/Infinity (1e999 parses as inf)
    except (ValueError, TypeError) as err:
        if not isinstance(err, json.JSONDecodeError):
            raise AnswerError([f"the reply is not plain JSON ({err})"], text=text) from None
        raise AnswerError([f"the reply is not valid JSON ({err.msg} at line {err.lineno} column {err.colno})"],
                          text=text) from None
    if not isinstance(data, dict):
        raise AnswerError([f"the reply is a JSON {_json_type(data)}, not an object"], text=text)
    problems = answer_problems(data, schema=schema, keys=keys)
    if problems:
        raise AnswerError(problems, text=text)
    return _integers(data, schema) if schema else data


def answer_problems(data: Mapping[str, Any], *, schema: Mapping[str, Any] | None = None,
                    keys: Sequence[str] = ()) -> list[str]:
    """What keeps the answer object ``data`` from meeting the contract (``schema`` or ``keys``); empty
    when it does. Also the check of an offline handler's answer, which stands in for the model's."""
    problems = validate_schema(data, schema) if schema else []
    problems += [f"/: missing required key {k!r}" for k in keys if k not in data
                 and f"/: missing required key {k!r}" not in problems]
    empty = [k for k in data if not isinstance(k, str) or not k]
    if empty:
        problems.append("/: keys must be non-empty strings")
    return problems


def _integers(value: Any, schema: Any) -> Any:
    """``value`` with the whole floats written where ``schema`` says ``integer`` as the integers they
    are (JSON Schema takes ``1200.0`` as one): the context holds what the contract asked for, a later
    ``range(payout)`` works, and ``1200.0`` and ``1200`` send the same bytes on. Only after validation."""
    if not isinstance(schema, Mapping):
        return value
    types = schema.get("type")
    if isinstance(value, float) and types is not None:
        names = [types] if isinstance(types, str) else list(types)
        if "integer" in names and "number" not in names and value.is_integer():
            return int(value)
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [_integers(item, schema["items"]) for item in value]
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        return {k: _integers(v, props[k] if k in props else extra) for k, v in value.items()}
    return value


def answer_contract(schema: Mapping[str, Any] | None, keys: Sequence[str]) -> str:
    """The instruction that tells the model the shape of its answer."""
    if schema:
        body = json.dumps(schema, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        return ("Answer with exactly one JSON object and nothing else; it must match this JSON Schema: "
                f"{body}. Each top-level key of your answer is written to the process context.")
    if keys:
        return ("Answer with exactly one JSON object and nothing else, with the keys "
                f"{', '.join(json.dumps(k) for k in keys)}. "
                "Each top-level key of your answer is written to the process context.")
    return ("Answer with exactly one JSON object and nothing else. "
            "Each top-level key of your answer is written to the process context.")
