"""The form a modeler declared on a user task: what a person is asked for, and the check of an answer.

Three ways of declaring one are read from the BPMN, as the modelers save them:

* Camunda 7: ``<camunda:formData>`` with ``<camunda:formField id label type defaultValue>``
  (types ``string``, ``long``, ``boolean``, ``date``, ``enum`` with ``<camunda:value id name>``)
  and ``<camunda:validation><camunda:constraint name config>`` (``required``, ``min``, ``max``,
  ``minlength``, ``maxlength``, ``readonly``);
* SpiffArena: ``<spiffworkflow:property name="formJsonSchemaFilename" value="x-schema.json">``,
  a JSON Schema file beside the BPMN (``formUiSchemaFilename`` only lays the form out);
* Camunda 8: ``<zeebe:formDefinition formKey | formId>``: a form file of another tool, reported by
  its key, nothing checked.

A form is a plain JSON value (``parse_form``), kept in the task spec's extensions under
``"form"``, so it travels with the workflow: an instance resumed elsewhere checks its answers
without the files. ``check_answer`` fills omitted fields with their defaults (as the submitted
form would carry them) and lists every problem; fields the form does not declare pass.
``form_problems`` is what ``layerflow validate`` reports of a declaration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["CAMUNDA_NS", "ZEEBE_NS", "SPIFF_NS", "CAMUNDA_TYPES", "check_answer", "form_problems", "parse_form",
           "public_form"]

CAMUNDA_NS = "http://camunda.org/schema/1.0/bpmn"
ZEEBE_NS = "http://camunda.org/schema/zeebe/1.0"
SPIFF_NS = "http://spiffworkflow.org/bpmn/schema/1.0/core"
BPMN_NS = "http://www.omg.org/spec/BPMN/20100524/MODEL"
CAMUNDA_TYPES = ("string", "long", "boolean", "date", "enum")
_DYNAMIC = "options_from_task_data_var:"  # SpiffArena's options filled from task data at render time


def _q(ns: str, local: str) -> str:
    return f"{{{ns}}}{local}"


def _extension_elements(node: Any) -> Any:
    return node.find(_q(BPMN_NS, "extensionElements"))


# ----------------------------------------------------------------------------- parsing

def _camunda_default(kind: str, text: str | None) -> tuple[Any, str | None]:
    """A ``defaultValue`` as the submitted form would carry it; a problem when it does not fit."""
    if text is None:
        return None, None
    if kind == "long":
        try:
            return int(text.strip()), None
        except ValueError:
            return None, f"defaultValue {text!r} is not a whole number (type long)"
    if kind == "boolean":
        if text.strip().lower() in ("true", "false"):
            return text.strip().lower() == "true", None
        return None, f"defaultValue {text!r} is not true or false (type boolean)"
    if kind == "date" and text.strip() and "${" not in text and _parse_date(text) is None:
        return text, f"defaultValue {text!r} is not a date (dd/MM/yyyy, as Camunda's forms write it, or ISO 8601)"
    return text, None


def _parse_date(text: str) -> datetime | None:
    for fmt in ("%d/%m/%Y", "%d/%m/%Y %H:%M:%S"):
        try:
            return datetime.strptime(text.strip(), fmt)
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(text.strip())
    except ValueError:
        return None


def _number(text: str | None) -> float | int | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def _camunda_form(form_data: Any) -> tuple[dict[str, Any], list[tuple[str | None, str]]]:
    fields: list[dict[str, Any]] = []
    problems: list[tuple[str | None, str]] = []
    for el in form_data.findall(_q(CAMUNDA_NS, "formField")):
        fid = el.get("id") or ""
        kind = el.get("type") or "string"
        if not fid:
            problems.append((None, "a camunda:formField has no id; give every field the id its value is kept under"))
            continue
        if kind not in CAMUNDA_TYPES:
            problems.append((fid, f"type {kind!r} is not a Camunda form field type; use one of "
                                  f"{', '.join(CAMUNDA_TYPES)}"))
        default, problem = _camunda_default(kind, el.get("defaultValue"))
        if problem:
            problems.append((fid, problem))
        field: dict[str, Any] = {"id": fid, "label": el.get("label") or fid, "type": kind, "required": False,
                                 "default": default}
        if kind == "enum":
            values = [{"id": v.get("id"), "name": v.get("name") or v.get("id")}
                      for v in el.findall(_q(CAMUNDA_NS, "value"))]
            if not values:
                problems.append((fid, "an enum field offers no <camunda:value>; add the values a person may choose"))
            field["options"] = values
            if default is not None and values and default not in [v["id"] for v in values]:
                problems.append((fid, f"defaultValue {default!r} is not one of its values "
                                      f"({', '.join(str(v['id']) for v in values)})"))
        for constraint in el.iter(_q(CAMUNDA_NS, "constraint")):
            name, config = constraint.get("name"), constraint.get("config")
            if name in ("required", "readonly"):
                field[name] = True
            elif name in ("min", "max", "minlength", "maxlength"):
                bound = _number(config)
                if bound is None:
                    problems.append((fid, f"constraint {name!r} needs a number as its config, got {config!r}"))
                else:
                    field[name] = bound
        fields.append(field)
    return {"source": "camunda:formData", "fields": fields}, problems


def _schema_fields(schema: Mapping[str, Any]) -> list[dict[str, Any]]:
    required = set(schema.get("required") or [])
    fields = []
    for fid, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        field: dict[str, Any] = {"id": fid, "label": prop.get("title") or fid, "type": prop.get("type") or "any",
                                 "required": fid in required, "default": prop.get("default")}
        options = None
        if isinstance(prop.get("enum"), list):
            options = [{"id": v, "name": v} for v in prop["enum"]]
        for key in ("oneOf", "anyOf"):
            alts = prop.get(key)
            if isinstance(alts, list) and alts and all(isinstance(a, Mapping) and "const" in a for a in alts):
                options = [{"id": a["const"], "name": a.get("title") or a["const"]} for a in alts]
        if options is not None:
            field["options"] = options
        for key, name in (("minimum", "min"), ("maximum", "max"), ("minLength", "minlength"), ("maxLength", "maxlength")):
            if isinstance(prop.get(key), (int, float)) and not isinstance(prop.get(key), bool):
                field[name] = prop[key]
        fields.append(field)
    return fields


def _strip_dynamic(schema: Any) -> Any:
    """The schema with SpiffArena's ``"options_from_task_data_var:X"`` placeholders (filled from task
    data when SpiffArena renders the form; not JSON Schema) left open: anything passes there."""
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if isinstance(value, list) and any(isinstance(v, str) and v.startswith(_DYNAMIC) for v in value):
                continue
            out[key] = _strip_dynamic(value)
        return out
    if isinstance(schema, list):
        return [_strip_dynamic(v) for v in schema]
    return schema


_Problems = list[tuple[str | None, str]]


def _spiff_form(name: str, base: Path | None) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """The form of a SpiffArena JSON Schema file beside the BPMN, its problems, and its warnings:
    a file that is not there leaves the task without a form (answers unchecked, as before forms
    were read: a process exported without its schema files still runs), and says so."""
    if base is None:
        return None, [], []
    path = base / name
    where = f"formJsonSchemaFilename {name!r}"
    if not path.is_file():
        return None, [], [(None, f"{where}: no file {path}, so answers to this task are not checked against "
                                 "a form; SpiffArena keeps the form's JSON Schema beside the BPMN: put it there")]
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        return None, [(None, f"{where}: {path} is not valid JSON ({err})")], []
    if not isinstance(schema, dict):
        return None, [(None, f"{where}: {path} holds a JSON {type(schema).__name__}, not a JSON Schema object")], []
    schema = _strip_dynamic(schema)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        at = "/".join(str(p) for p in err.absolute_path) or "the top"
        return None, [(None, f"{where}: {path} is not a valid JSON Schema at {at}: {err.message}")], []
    return {"source": name, "fields": _schema_fields(schema), "schema": schema}, [], []


def _read(node: Any, base: Path | None) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """A user task's form, the problems of its declaration, and warnings."""
    ext = _extension_elements(node)
    if ext is None:
        return None, [], []
    form_data = ext.find(_q(CAMUNDA_NS, "formData"))
    if form_data is not None:
        return (*_camunda_form(form_data), [])
    for prop in ext.iter(_q(SPIFF_NS, "property")):
        if prop.get("name") == "formJsonSchemaFilename" and (prop.get("value") or "").strip():
            return _spiff_form(prop.get("value").strip(), base)
    for tag in ("formDefinition", "userTask"):
        for el in ext.iter(_q(ZEEBE_NS, tag)):
            key = el.get("formKey") or el.get("formId") or el.get("externalReference")
            if key:
                return {"source": "zeebe:formDefinition", "form_key": key, "fields": []}, [], []
    return None, [], []


def parse_form(node: Any, bpmn_file: str | None) -> dict[str, Any] | None:
    """The form a user task element (lxml) declares, or None; an unreadable one is None too
    (``form_problems`` reports it, and ``load_process`` validates first)."""
    base = Path(bpmn_file).resolve().parent if bpmn_file else None
    return _read(node, base)[0]


def form_problems(node: Any, bpmn_file: str) -> tuple[_Problems, _Problems]:
    """(field id or None, message) of every problem of a user task's form declaration, and of
    every warning (a SpiffArena schema file that is not there)."""
    _, problems, warnings = _read(node, Path(bpmn_file).resolve().parent)
    return problems, warnings


def public_form(form: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``waiting_for`` item shows of a form: its fields and where it comes from."""
    out = {"fields": [dict(f) for f in form.get("fields") or []], "source": form.get("source")}
    if form.get("form_key"):
        out["form_key"] = form["form_key"]
    return out


def describe_field(field: Mapping[str, Any]) -> str:
    """One field, compactly: ``approved* boolean=false``, ``decision enum(a|b)``, ``amount long 1..1000``."""
    text = str(field["id"]) + ("*" if field.get("required") else "") + " " + str(field.get("type"))
    if field.get("options") is not None:
        text += "(" + "|".join(str(o["id"]) for o in field["options"]) + ")"
    low, high = field.get("min", field.get("minlength")), field.get("max", field.get("maxlength"))
    if low is not None or high is not None:
        text += f" {'' if low is None else low}..{'' if high is None else high}"
    if field.get("default") is not None:
        text += "=" + json.dumps(field["default"], ensure_ascii=False)
    return text


# ----------------------------------------------------------------------------- answers

def _is_int(value: Any) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())


def _field_problem(field: Mapping[str, Any], value: Any) -> str | None:
    kind = field.get("type")
    if value is None:
        return None  # an emptied field; "required" is checked apart
    if kind == "long":
        if isinstance(value, str) and re.fullmatch(r"[+-]?\d+", value.strip()):
            value = int(value)  # a form posts text
        if not _is_int(value):
            return f"{json.dumps(value, ensure_ascii=False)} is not a whole number (type long)"
        if field.get("min") is not None and value < field["min"]:
            return f"{value} is below the minimum {field['min']}"
        if field.get("max") is not None and value > field["max"]:
            return f"{value} is above the maximum {field['max']}"
    elif kind == "boolean":
        if not isinstance(value, bool):
            return f"{json.dumps(value, ensure_ascii=False)} is not true or false (type boolean)"
    elif kind == "enum":
        allowed = [o["id"] for o in field.get("options") or []]
        if value not in allowed:
            if not isinstance(value, str):  # 1 is not the value "1": show the values as the text they are
                shown = ", ".join(json.dumps(a, ensure_ascii=False) for a in allowed)
                return f"{json.dumps(value, ensure_ascii=False)} is not one of {shown} (its values are text)"
            return f"{json.dumps(value, ensure_ascii=False)} is not one of {', '.join(map(str, allowed))}"
    elif kind in ("string", "date"):
        if not isinstance(value, str):
            return f"{json.dumps(value, ensure_ascii=False)} is not text (type {kind})"
        if kind == "date" and _parse_date(value) is None:
            return f"{value!r} is not a date (dd/MM/yyyy or ISO 8601, e.g. 2026-01-31)"
        if field.get("minlength") is not None and len(value) < field["minlength"]:
            return f"shorter than {field['minlength']} characters"
        if field.get("maxlength") is not None and len(value) > field["maxlength"]:
            return f"longer than {field['maxlength']} characters"
    return None


def check_answer(form: Mapping[str, Any] | None, given: Mapping[str, Any],
                 prefilled: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The answer with the defaults of the fields it omits, and its problems as (field, message).

    ``prefilled``: what the form starts from instead of its defaults (the values the context
    already holds under the fields' ids: what the task's preScript or an earlier step set, a
    SYSTEM key); a required field it holds counts as answered, and its default is not put in the
    answer, as Camunda's form shows the variable, not the defaultValue, when there is one.
    """
    answer = dict(given)
    if not form or not form.get("fields") and not form.get("schema"):
        return answer, []
    fields = form.get("fields") or []
    for field in fields:
        if field["id"] not in answer and field["id"] not in (prefilled or {}) and field.get("default") is not None:
            answer[field["id"]] = field["default"]
    seen = {**(prefilled or {}), **answer}
    problems: list[tuple[str, str]] = []
    schema = form.get("schema")
    if schema is not None:
        import jsonschema

        declared = schema.get("properties")
        if isinstance(declared, Mapping):  # fields the form does not declare pass, as without a form
            seen = {k: v for k, v in seen.items() if k in declared}
        validator = jsonschema.validators.validator_for(schema)(schema)
        for err in sorted(validator.iter_errors(seen), key=lambda e: list(map(str, e.absolute_path))):
            path = list(err.absolute_path)
            if err.validator == "required" and not path:
                missing = next((f for f in err.validator_value if f not in seen), None)
                problems.append((str(missing), "is required and missing"))
            else:
                name = str(path[0]) if path else "/"
                field = next((f for f in fields if f["id"] == name), None)
                if field is not None and field.get("options") is not None and len(path) == 1 \
                        and err.validator in ("enum", "oneOf", "anyOf"):
                    offered = ", ".join(json.dumps(o["id"], ensure_ascii=False) for o in field["options"])
                    problems.append((name, f"{json.dumps(err.instance, ensure_ascii=False)} is not one of {offered}"))
                else:
                    problems.append((name, err.message))
        return answer, problems
    for field in fields:
        fid = field["id"]
        if field.get("required") and seen.get(fid) in (None, ""):
            problems.append((fid, "is required and missing"))
            continue
        if fid in answer:
            problem = _field_problem(field, answer[fid])
            if problem:
                problems.append((fid, problem))
            elif field.get("type") == "long" and isinstance(answer[fid], str):
                answer[fid] = int(answer[fid])
    return answer, problems
