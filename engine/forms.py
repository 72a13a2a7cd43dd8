"""The form a modeler declared on a user task: what a person is asked for, and the check of an answer.

These ways of declaring one are read from the BPMN, as the modelers save them:

* Camunda 7: ``<camunda:formData>`` with ``<camunda:formField id label type defaultValue>``
  (types ``string``, ``long``, ``boolean``, ``date``, ``enum`` with ``<camunda:value id name>``)
  and ``<camunda:validation><camunda:constraint name config>`` (``required``, ``min``, ``max``,
  ``minlength``, ``maxlength``, ``readonly``); a field of another type (a form plugin's
  ``textarea``) is asked for with its type unchecked, and validate warns;
* SpiffArena: ``<spiffworkflow:property name="formJsonSchemaFilename" value="x-schema.json">``,
  a JSON Schema file beside the BPMN (``formUiSchemaFilename`` only lays the form out), whose
  ``"anyOf" | "oneOf" | "enum": ["options_from_task_data_var:NAME"]`` take their options from the
  context key NAME as the task waits (``with_options``);
* Activiti, Flowable and Camunda 7's older form properties: ``<flowable:formProperty id name type
  required writable variable default datePattern>`` (types ``string``, ``long``, ``double``,
  ``boolean``, ``date``, ``enum`` with ``<flowable:value id name>``); a property with a
  ``variable`` is asked for and kept under that variable, as those engines keep it; one neither
  readable nor writable is not asked for; ``writable="false"`` is read-only;
* Camunda 8: form-js JSON forms, embedded (``<zeebe:userTaskForm id="X">`` in the process's
  extensionElements, ``<zeebe:formDefinition formKey="camunda-forms:bpmn:X">`` on the task) or
  linked (``<zeebe:formDefinition formId="X">``: the ``*.form`` file with ``"id": "X"`` beside the
  BPMN); keyed components become fields (``textfield``/``textarea`` string, ``number`` double,
  ``checkbox`` boolean, ``select``/``radio`` enum, ``checklist``/``taglist`` list, ``datetime``
  date with a ``format``), groups are flattened, display components skipped; a linked form not
  found, a form that is not JSON or a component of an unknown type is a warning, left unchecked;
* another ``zeebe:formDefinition formKey`` and a ``formKey`` attribute (Camunda 7, Activiti,
  Flowable): a form file of another tool, reported by its key, nothing checked.

A form is a plain JSON value (``parse_form``), kept in the task spec's extensions under
``"form"``, so it travels with the workflow: an instance resumed elsewhere checks its answers
without the files. ``check_answer`` fills omitted fields with their defaults (as the submitted
form would carry them) and lists every problem; fields the form does not declare pass, unless one
reads like a field the answer leaves out (a typo, refused: the default would stand in for it). A
read-only field (Camunda ``readonly``, JSON Schema ``readOnly``) keeps the value the form shows.
``form_problems`` is what ``layerflow validate`` reports of a declaration.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import re
from collections.abc import Iterable, Mapping
from datetime import datetime, time
from pathlib import Path
from typing import Any

__all__ = ["CAMUNDA_NS", "ZEEBE_NS", "SPIFF_NS", "CAMUNDA_TYPES", "check_answer", "form_problems", "option_keys",
           "parse_form", "public_form", "with_options"]

CAMUNDA_NS = "http://camunda.org/schema/1.0/bpmn"
OPERATON_NS = "http://operaton.org/schema/1.0/bpmn"  # Operaton, Camunda 7's fork: the same forms
ZEEBE_NS = "http://camunda.org/schema/zeebe/1.0"
SPIFF_NS = "http://spiffworkflow.org/bpmn/schema/1.0/core"
BPMN_NS = "http://www.omg.org/spec/BPMN/20100524/MODEL"
CAMUNDA_TYPES = ("string", "long", "boolean", "date", "enum")
PROPERTY_TYPES = ("string", "long", "double", "boolean", "date", "enum")
# the engines whose modelers write <PREFIX:formProperty> and a PREFIX:formKey attribute
PROPERTY_NAMESPACES = {"camunda": CAMUNDA_NS, "operaton": OPERATON_NS, "activiti": "http://activiti.org/bpmn",
                       "flowable": "http://flowable.org/bpmn"}
# where a <camunda:formData> is found: Camunda Modeler before 3.0 bound the camunda: prefix to
# Activiti's namespace (as the BPMN MIWG files and Camunda 7's older examples still do)
FORM_DATA_NAMESPACES = (CAMUNDA_NS, OPERATON_NS, "http://activiti.org/bpmn")
# Camunda 7's form-js forms (Camunda Forms), deployed beside the BPMN: camunda:formKey="camunda-forms:app:x.form"
_FORMJS_KEYS = ("camunda-forms:app:", "camunda-forms:deployment:")
_DYNAMIC = "options_from_task_data_var:"  # SpiffArena's options filled from task data at render time
_OPTION_KEYWORDS = ("enum", "oneOf", "anyOf")


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
    if kind == "date" and text.strip() and "${" not in text and not _is_camunda_date(text.strip()):
        return text, f"defaultValue {text!r} is not a date ({_CAMUNDA_DATES})"
    quoted = _quoted_literal(text)
    if quoted is not None:
        # written as a Python (or JUEL) string literal, as SpiffWorkflow's tutorial does; a form
        # takes the text as it is, so the quotes would become part of the value and a condition
        # comparing with the unquoted text would be false without a word
        return text, (f"defaultValue {json.dumps(text)} is wrapped in quotes, and a form's default is "
                      f"the text as written, quotes included, not the string {quoted!r}: write "
                      f"defaultValue={json.dumps(quoted)}")
    return text, None


def _quoted_literal(text: str) -> str | None:
    """The string inside ``'N'`` or ``"N"`` (one literal, with no quote of its kind inside)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" and text[0] not in text[1:-1]:
        return text[1:-1]
    return None


# What a Camunda ``date`` field takes: what Camunda 7's form posts (its default dateFormat), and the
# JSON Schema ``date`` and ``date-time`` formats, checked by the same checker as a SpiffArena form's,
# so one answer file fits either kind of form.
_CAMUNDA_DATES = "dd/MM/yyyy as Camunda's forms post it, YYYY-MM-DD, or a date-time such as 2026-01-31T09:30:00Z"


def _is_camunda_date(text: str) -> bool:
    for fmt in ("%d/%m/%Y", "%d/%m/%Y %H:%M:%S"):
        try:
            datetime.strptime(text, fmt)
            return True
        except ValueError:
            pass
    checker = _format_checker()
    return bool(checker.conforms(text, "date") or checker.conforms(text, "date-time"))


# jsonschema checks these formats with nothing but itself installed; the others it knows
# (hostname, uri, iri, duration, json-pointer, uri-template, color, ...) need extra packages, so
# which of them were checked would depend on what else happens to be installed: they pass unchecked.
_JSONSCHEMA_FORMATS = ("date", "email", "idn-email", "ipv4", "ipv6", "regex", "uuid")
# jsonschema needs rfc3339-validator for these two; forms ask for them often, so they are checked here
_RFC3339_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_RFC3339_TIME = re.compile(r"\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")
_FORMAT_TEXT = {
    "date": "a date (YYYY-MM-DD, e.g. 2026-01-31)",
    "date-time": "a date-time (RFC 3339, e.g. 2026-01-31T09:30:00Z)",
    "time": "a time (RFC 3339, e.g. 09:30:00Z)",
    "email": "an email address (name@example.org)",
    "idn-email": "an email address (name@example.org)",
    "ipv4": "an IPv4 address (e.g. 192.0.2.1)",
    "ipv6": "an IPv6 address (e.g. 2001:db8::1)",
    "regex": "a regular expression",
    "uuid": "a UUID (e.g. 123e4567-e89b-12d3-a456-426614174000)",
}


def _is_date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True  # a format speaks of text only; "type" is checked apart
    if not _RFC3339_DATE_TIME.fullmatch(value):
        return False
    datetime.fromisoformat(value.upper())  # raises ValueError on 2026-02-30T...
    return True


def _is_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    if not _RFC3339_TIME.fullmatch(value):
        return False
    time.fromisoformat(value.upper())
    return True


@functools.cache
def _format_checker() -> Any:
    import jsonschema

    checker = jsonschema.FormatChecker(formats=_JSONSCHEMA_FORMATS)
    checker.checks("date-time", raises=ValueError)(_is_date_time)
    checker.checks("time", raises=ValueError)(_is_time)
    return checker


def _number(text: str | None) -> float | int | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else value


def _camunda_form(form_data: Any, ns: str = CAMUNDA_NS) -> tuple[dict[str, Any], _Problems, _Problems]:
    fields: list[dict[str, Any]] = []
    problems: list[tuple[str | None, str]] = []
    warnings: list[tuple[str | None, str]] = []
    for el in form_data.findall(_q(ns, "formField")):
        fid = el.get("id") or ""
        kind = el.get("type") or "string"
        if not fid:
            problems.append((None, "a camunda:formField has no id; give every field the id its value is kept under"))
            continue
        if kind not in CAMUNDA_TYPES:
            # a custom type (textarea, file, ...: form plugins and SpiffWorkflow-based tools use them)
            # stops neither SpiffWorkflow nor the run: the field is asked for, its type unchecked
            warnings.append((fid, f"type {kind!r} is not a Camunda form field type, so answers to it are not "
                                  f"checked for a type; use one of {', '.join(CAMUNDA_TYPES)} to have them checked"))
        default, problem = _camunda_default(kind, el.get("defaultValue"))
        if problem:
            problems.append((fid, problem))
        field: dict[str, Any] = {"id": fid, "label": el.get("label") or fid, "type": kind, "required": False,
                                 "default": default}
        if kind == "enum":
            values = [{"id": v.get("id"), "name": v.get("name") or v.get("id")}
                      for v in el.findall(_q(ns, "value"))]
            if not values:
                problems.append((fid, "an enum field offers no <camunda:value>; add the values a person may choose"))
            field["options"] = values
            if default is not None and values and not problem and default not in [v["id"] for v in values]:
                problems.append((fid, f"defaultValue {default!r} is not one of its values "
                                      f"({', '.join(str(v['id']) for v in values)})"))
        for constraint in el.iter(_q(ns, "constraint")):
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
    source = "operaton:formData" if ns == OPERATON_NS else "camunda:formData"
    return {"source": source, "fields": fields}, problems, warnings


# Java date patterns (SimpleDateFormat) as strptime formats: the letters form properties use
_JAVA_DATE = {"yyyy": "%Y", "yy": "%y", "MM": "%m", "dd": "%d", "HH": "%H", "mm": "%M", "ss": "%S"}


def _strptime_pattern(pattern: str) -> str | None:
    """``dd-MM-yyyy`` as ``%d-%m-%Y``; None when the pattern has letters this does not know."""
    out, rest = "", pattern
    while rest:
        token = next((t for t in _JAVA_DATE if rest.startswith(t)), None)
        if token:
            out, rest = out + _JAVA_DATE[token], rest[len(token):]
        elif rest[0].isalpha():
            return None
        else:
            out, rest = out + rest[0].replace("%", "%%"), rest[1:]
    return out


def _in_pattern(text: str, pattern: str) -> bool:
    try:
        datetime.strptime(text, _strptime_pattern(pattern) or "")
    except ValueError:
        return False
    return True


def _property_default(kind: str, text: str | None, pattern: str | None) -> tuple[Any, str | None]:
    if text is not None and kind == "double":
        number = _number(text.strip())
        return (number, None) if number is not None else (None, f"default {text!r} is not a number (type double)")
    if text is not None and kind == "date" and pattern and _strptime_pattern(pattern) and "${" not in text:
        if not _in_pattern(text.strip(), pattern):
            return text, f"default {text!r} is not a date in the pattern {pattern}"
        return text, None
    value, problem = _camunda_default(kind, text)
    return value, problem and problem.replace("defaultValue", "default")


def _property_form(prefix: str, props: list[Any]) -> tuple[dict[str, Any], _Problems, _Problems]:
    """``<PREFIX:formProperty>`` elements (Activiti, Flowable, Camunda 7) as a form."""
    ns = PROPERTY_NAMESPACES[prefix]
    fields: list[dict[str, Any]] = []
    problems: list[tuple[str | None, str]] = []
    warnings: list[tuple[str | None, str]] = []
    for el in props:
        pid = el.get("id") or ""
        if not pid:
            problems.append((None, f"a {prefix}:formProperty has no id; give every property the id its value "
                                   "is kept under"))
            continue
        if el.get("readable") == "false" and el.get("writable") == "false":
            continue  # neither shown nor asked for
        kind = el.get("type") or "string"
        fid = el.get("variable") or pid
        if kind not in PROPERTY_TYPES:
            warnings.append((fid, f"type {kind!r} is not a {prefix} form property type, so answers to it are not "
                                  f"checked for a type; use one of {', '.join(PROPERTY_TYPES)} to have them checked"))
        pattern = el.get("datePattern") if kind == "date" else None
        default, problem = _property_default(kind, el.get("default"), pattern)
        if problem:
            problems.append((fid, problem))
        field: dict[str, Any] = {"id": fid, "label": el.get("name") or pid, "type": kind,
                                 "required": el.get("required") == "true", "default": default}
        if el.get("writable") == "false":
            field["readonly"] = True
        if pattern:
            if _strptime_pattern(pattern):
                field["pattern"] = pattern
            else:
                warnings.append((fid, f"datePattern {pattern!r} has letters other than {', '.join(_JAVA_DATE)}; "
                                      "answers are checked as dates in the usual forms instead"))
        if kind == "enum":
            values = [{"id": v.get("id"), "name": v.get("name") or v.get("id")} for v in el.findall(_q(ns, "value"))]
            if not values:
                problems.append((fid, f"an enum property offers no <{prefix}:value>; add the values a person "
                                      "may choose"))
            field["options"] = values
            if default is not None and values and not problem and default not in [v["id"] for v in values]:
                problems.append((fid, f"default {default!r} is not one of its values "
                                      f"({', '.join(str(v['id']) for v in values)})"))
        fields.append(field)
    return {"source": f"{prefix}:formProperty", "fields": fields}, problems, warnings


def _schema_fields(schema: Mapping[str, Any], slots: list[dict[str, Any]]) -> list[dict[str, Any]]:
    required = set(schema.get("required") or [])
    fields = []
    for fid, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        field: dict[str, Any] = {"id": fid, "label": prop.get("title") or fid, "type": prop.get("type") or "any",
                                 "required": fid in required, "default": prop.get("default")}
        if prop.get("readOnly") is True:
            field["readonly"] = True
        if isinstance(prop.get("format"), str):
            field["format"] = prop["format"]
        # a multiple choice (checkboxes) keeps its options in "items"
        from_context = [slot["var"] for slot in slots if slot["at"] in (["properties", fid], ["properties", fid, "items"])]
        if from_context:
            field["options_from"] = from_context[0]
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


def _strip_dynamic(schema: Any, at: list[str | int], slots: list[dict[str, Any]]) -> Any:
    """The schema without SpiffArena's ``"options_from_task_data_var:X"`` placeholders (not JSON
    Schema: SpiffArena fills them from task data as it renders the form), each placeholder of an
    ``enum``/``oneOf``/``anyOf`` added to ``slots`` as ``{"at": path, "key": keyword, "var": X}`` for
    ``with_options`` to fill; one in another keyword (SpiffArena's ``"items": [placeholder]``, field
    schemas taken from task data) is left open: anything passes there."""
    if isinstance(schema, Mapping):
        out = {}
        for key, value in schema.items():
            if isinstance(value, list):
                found = [v for v in value if isinstance(v, str) and v.startswith(_DYNAMIC)]
                if found:
                    if key in _OPTION_KEYWORDS:
                        slots.append({"at": list(at), "key": key, "var": found[0][len(_DYNAMIC):]})
                    continue
            out[key] = _strip_dynamic(value, [*at, key], slots)
        return out
    if isinstance(schema, list):
        return [_strip_dynamic(v, [*at, n], slots) for n, v in enumerate(schema)]
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
    slots: list[dict[str, Any]] = []
    schema = _strip_dynamic(schema, [], slots)
    import jsonschema

    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as err:
        at = "/".join(str(p) for p in err.absolute_path) or "the top"
        return None, [(None, f"{where}: {path} is not a valid JSON Schema at {at}: {err.message}")], []
    form = {"source": name, "fields": _schema_fields(schema, slots), "schema": schema}
    if slots:
        form["option_slots"] = slots
    return form, [], []


# Camunda 8 forms: form-js JSON, embedded in the process (<zeebe:userTaskForm id>, referenced by
# formKey="camunda-forms:bpmn:ID") or linked (formId="ID": a *.form file with that "id" deployed with
# the BPMN, looked for beside it). What each keyed component is asked as:
_FORMJS_EMBEDDED = "camunda-forms:bpmn:"
_FORMJS_TYPES = {"textfield": "string", "textarea": "string", "number": "double", "checkbox": "boolean",
                 "select": "enum", "radio": "enum", "checklist": "list", "taglist": "list", "datetime": "date",
                 "filepicker": "any"}
# shown, not asked for (no key), or computed by the form itself (expression, script)
_FORMJS_SHOWN = {"text", "html", "image", "button", "spacer", "separator", "iframe", "documentPreview",
                 "table", "expression", "script", "default"}
_FORMJS_CONTAINERS = {"group", "dynamiclist"}
_FORMJS_DATETIME = {"date": "date", "time": "time", "datetime": "date-time"}
_FORMJS_VALUES = {
    "date": "a date (YYYY-MM-DD, e.g. 2026-01-31)",
    "time": "a time (HH:mm, optionally with Z or an offset, e.g. 09:30)",
    "date-time": "a date-time (YYYY-MM-DDTHH:mm, optionally with Z or an offset, e.g. 2026-01-31T09:30)",
}
_FORMJS_TIME = r"\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:\d{2})?"


def _is_formjs_value(text: str, fmt: str) -> bool:
    """A value as form-js's datetime component posts it: ``date`` YYYY-MM-DD, ``time`` HH:mm,
    ``date-time`` both joined by ``T``; the time with Z, an offset or neither."""
    date_part: str | None = text
    time_part: str | None = None
    if fmt == "time":
        date_part, time_part = None, text
    elif fmt == "date-time":
        if "T" not in text:
            return False
        date_part, time_part = text.split("T", 1)
    try:
        if date_part is not None:
            if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date_part):
                return False
            datetime.strptime(date_part, "%Y-%m-%d")
        if time_part is not None:
            if not re.fullmatch(_FORMJS_TIME, time_part):
                return False
            time.fromisoformat(time_part[:5])
    except ValueError:
        return False
    return True


def _formjs_field(comp: Mapping[str, Any], kind: str, where: str, warnings: _Problems) -> dict[str, Any]:
    key = str(comp["key"])
    given = comp.get("validate")
    validate: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    label = comp.get("label") or (comp.get("dateLabel") or comp.get("timeLabel") if kind == "date" else None) or key
    field: dict[str, Any] = {"id": key, "label": str(label), "type": kind, "required": validate.get("required") is True,
                             "default": comp.get("defaultValue")}
    if comp.get("readonly") is True or comp.get("disabled") is True:
        field["readonly"] = True
    conditional = comp.get("conditional")
    hide = conditional.get("hide") if isinstance(conditional, Mapping) else None
    if field["required"] and isinstance(hide, str) and hide.strip():
        # form-js drops a hidden field from what it submits; its FEEL condition is not evaluated here
        field["required"] = False
        field["warning"] = (f"required only while shown (hidden when {hide.strip()}); that condition is FEEL, "
                            "not evaluated here, so it may be left out")
    if kind == "date":
        subtype = comp.get("subtype") or "date"
        if subtype not in _FORMJS_DATETIME:
            warnings.append((key, f"{where}: datetime component {key!r} has the subtype {subtype!r}, not one of "
                                  f"{', '.join(_FORMJS_DATETIME)}, so answers to it are not checked as dates"))
            field["type"] = "string"
        else:
            field["format"] = _FORMJS_DATETIME[subtype]
    if kind in ("enum", "list"):
        values = comp.get("values")
        if isinstance(values, list) and values:
            field["options"] = [{"id": v.get("value"), "name": v.get("label", v.get("value"))}
                                for v in values if isinstance(v, Mapping)]
            default = field["default"]
            offered = [o["id"] for o in field["options"]]
            misfits = (default if isinstance(default, list) else [default]) if default is not None else []
            if any(d not in offered for d in misfits):
                warnings.append((key, f"{where}: the defaultValue {json.dumps(default, ensure_ascii=False)} of "
                                      f"{key!r} is not among its values ({', '.join(map(str, offered))})"))
        else:  # options from a variable (valuesKey) or an expression: known only as the form renders
            source = comp.get("valuesKey") or comp.get("valuesExpression")
            if source:
                field["options_from"] = str(source)
            if kind == "enum":
                field["type"] = "any"
    for name, out in (("min", "min"), ("max", "max"), ("minLength", "minlength"), ("maxLength", "maxlength")):
        bound = validate.get(name)
        if isinstance(bound, (int, float)) and not isinstance(bound, bool):
            field[out] = bound
    pattern = validate.get("pattern")
    if isinstance(pattern, str) and pattern and kind == "string":
        try:
            re.compile(pattern)
            field["pattern"] = pattern
        except re.error as err:
            warnings.append((key, f"{where}: the pattern {pattern!r} of {key!r} is no regular expression this "
                                  f"engine reads ({err}), so answers to it are not checked against it"))
    return field


def _formjs_fields(components: Any, where: str, fields: list[dict[str, Any]], warnings: _Problems) -> None:
    """The keyed components of a form-js form, a group's flattened in, in the order shown."""
    if not isinstance(components, list):
        warnings.append((None, f"{where}: \"components\" is not a list; answers to this task are not checked"))
        return
    for n, comp in enumerate(components):
        if not isinstance(comp, Mapping):
            warnings.append((None, f"{where}: component {n + 1} is not an object; it is not asked for"))
            continue
        ctype, key = comp.get("type"), comp.get("key")
        if ctype in _FORMJS_CONTAINERS:
            path = comp.get("path")
            if ctype == "dynamiclist" and path:
                fields.append({"id": str(path), "label": str(comp.get("label") or path), "type": "list",
                               "required": False, "default": comp.get("defaultValue")})
            elif path:
                warnings.append((str(path), f"{where}: the fields of group {path!r} are kept under {path!r}, "
                                            "so answers to them are not checked"))
            else:
                _formjs_fields(comp.get("components") or [], where, fields, warnings)
        elif ctype in _FORMJS_SHOWN:
            continue
        elif ctype in _FORMJS_TYPES:
            if not isinstance(key, str) or not key:
                warnings.append((None, f"{where}: a {ctype} component has no key, so it is not asked for; give "
                                       "it the key its value is kept under"))
            elif any(f["id"] == key for f in fields):
                warnings.append((key, f"{where}: the key {key!r} is used twice; the first component is checked"))
            else:
                fields.append(_formjs_field(comp, _FORMJS_TYPES[ctype], where, warnings))
        else:
            name = f"component {key!r}" if key else f"component {n + 1}"
            warnings.append((str(key) if key else None,
                             f"{where}: {name} has the type {ctype!r}, which is no form-js component type this "
                             f"engine knows ({', '.join(sorted(_FORMJS_TYPES))}, groups and display components), "
                             "so answers to it are not checked"))


def _formjs_form(doc: Any, source: str, where: str) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    if not isinstance(doc, dict):
        return None, [], [(None, f"{where} holds a JSON {_json_type(doc)}, not a form-js form "
                                 "({\"components\": [...]}), so answers to this task are not checked")]
    warnings: _Problems = []
    fields: list[dict[str, Any]] = []
    _formjs_fields(doc.get("components", []), where, fields, warnings)
    return {"source": source, "fields": fields}, [], warnings


def _zeebe_embedded(node: Any, form_key: str) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """``formKey="camunda-forms:bpmn:ID"``: the ``<zeebe:userTaskForm id="ID">`` of the process."""
    wanted = form_key[len(_FORMJS_EMBEDDED):]
    found = next((el for el in node.getroottree().iter(_q(ZEEBE_NS, "userTaskForm")) if el.get("id") == wanted), None)
    if found is None:
        return None, [(None, f"zeebe:formDefinition formKey {form_key!r}: the file has no <zeebe:userTaskForm "
                             f"id=\"{wanted}\"> (Camunda Modeler keeps it in the process's extensionElements); "
                             "add it, or link a form with formId")], []
    where = f"zeebe:userTaskForm {wanted!r}"
    try:
        doc = json.loads(found.text or "")
    except ValueError as err:
        return None, [], [(None, f"{where} is not valid JSON ({err}), so answers to this task are not checked; "
                                 "save the form again from the form editor")]
    return _formjs_form(doc, "zeebe:userTaskForm", where)


def _zeebe_linked(form_id: str, base: Path | None) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """``formId="ID"``: the ``*.form`` file beside the BPMN whose ``"id"`` is ID."""
    if base is None:
        return {"source": "zeebe:formDefinition", "form_key": form_id, "fields": []}, [], []
    unread: list[str] = []
    for path in sorted(base.glob("*.form")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            unread.append(f"{path.name} is not valid JSON ({err})")
            continue
        if not isinstance(doc, dict):
            unread.append(f"{path.name} holds a JSON {_json_type(doc)}, not a form-js form")
            continue
        if doc.get("id") == form_id:
            return _formjs_form(doc, path.name, f"form file {path}")
    also = f" ({'; '.join(unread)})" if unread else ""
    return ({"source": "zeebe:formDefinition", "form_key": form_id, "fields": []}, [],
            [(None, f"zeebe:formDefinition formId {form_id!r}: no .form file with \"id\": \"{form_id}\" in "
                    f"{base}{also}, so answers to this task are not checked against a form; Camunda deploys "
                    "the form with the BPMN: put its .form file beside the BPMN")])


def _read(node: Any, base: Path | None) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """A user task's form, the problems of its declaration, and warnings."""
    ext = _extension_elements(node)
    if ext is None:
        return _form_key(node, base)
    for ns in FORM_DATA_NAMESPACES:
        form_data = ext.find(_q(ns, "formData"))
        if form_data is not None:
            return _camunda_form(form_data, ns)
    for prefix, ns in PROPERTY_NAMESPACES.items():
        props = ext.findall(_q(ns, "formProperty"))
        if props:
            return _property_form(prefix, props)
    for prop in ext.iter(_q(SPIFF_NS, "property")):
        if prop.get("name") == "formJsonSchemaFilename" and (prop.get("value") or "").strip():
            return _spiff_form(prop.get("value").strip(), base)
    for el in ext.iter(_q(ZEEBE_NS, "formDefinition")):
        if (el.get("formKey") or "").strip().startswith(_FORMJS_EMBEDDED):
            return _zeebe_embedded(node, el.get("formKey").strip())
        if (el.get("formId") or "").strip():
            return _zeebe_linked(el.get("formId").strip(), base)
    for tag in ("formDefinition", "userTask"):
        for el in ext.iter(_q(ZEEBE_NS, tag)):
            key = el.get("formKey") or el.get("formId") or el.get("externalReference")
            if key:
                return {"source": "zeebe:formDefinition", "form_key": key, "fields": []}, [], []
    return _form_key(node, base)


def _form_key(node: Any, base: Path | None) -> tuple[dict[str, Any] | None, _Problems, _Problems]:
    """A ``formKey`` attribute (Camunda 7, Activiti, Flowable): a form of the modeler's tool. Camunda 7's
    ``camunda-forms:app:FILE.form`` (or ``camunda-forms:deployment:``) is a form-js form deployed with the
    BPMN: the file beside it is read as Camunda 8's linked forms are."""
    for prefix, ns in PROPERTY_NAMESPACES.items():
        key = (node.get(_q(ns, "formKey")) or "").strip()
        if not key:
            continue
        keyed: dict[str, Any] = {"source": f"{prefix}:formKey", "form_key": key, "fields": []}
        name = next((key[len(p):] for p in _FORMJS_KEYS if key.startswith(p)), None)
        if name is None or base is None:
            return keyed, [], []
        path = base / name
        if not path.is_file() and (base / Path(name).name).is_file():
            path = base / Path(name).name  # the project's resource folder, flattened beside the BPMN
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, UnicodeDecodeError) as err:
            why = "no such file" if isinstance(err, FileNotFoundError) else f"not valid JSON ({err})"
            return keyed, [], [(None, f"{prefix}:formKey {key!r}: {path} is {why}, so answers to this task are "
                                      "not checked against a form; Camunda deploys the form with the BPMN: put "
                                      f"its {Path(name).name} beside the BPMN")]
        if not isinstance(doc, dict):
            return keyed, [], [(None, f"{prefix}:formKey {key!r}: {path.name} holds a JSON {_json_type(doc)}, not a "
                                      "form-js form, so answers to this task are not checked against a form")]
        return _formjs_form(doc, path.name, f"form file {path}")
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


def option_keys(form: Mapping[str, Any]) -> list[str]:
    """The context keys a form's options come from (SpiffArena's ``options_from_task_data_var:``)."""
    return sorted({str(slot["var"]) for slot in form.get("option_slots") or []})


def _options(key: str, data: Mapping[str, Any]) -> tuple[list[dict[str, Any]] | None, str]:
    """The options the context key ``key`` offers, as SpiffArena reads them (a list of
    ``{"value", "label"}`` or of plain values), or None and why not."""
    usable = (f"so any value is accepted; set {key!r} before the task waits, to a list of "
              '{"value": ..., "label": ...} or of plain values')
    if key not in data:
        return None, f"its options come from the context key {key!r}, which the context does not hold, {usable}"
    listed = data[key]
    if not isinstance(listed, list) or not listed:
        held = "an empty list" if listed == [] else f"a JSON {_json_type(listed)}"
        return None, f"its options come from the context key {key!r}, which holds {held}, {usable}"
    options: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in listed:
        if isinstance(entry, Mapping):
            if "value" not in entry:
                return None, (f"its options come from the context key {key!r}, whose entry "
                              f"{json.dumps(entry, ensure_ascii=False)} has no \"value\", {usable}")
            option = {"id": entry["value"], "name": entry.get("label", entry["value"])}
        elif isinstance(entry, list):
            return None, f"its options come from the context key {key!r}, which holds a list in a list, {usable}"
        else:
            option = {"id": entry, "name": entry}
        canonical = json.dumps(option["id"], sort_keys=True)
        if canonical not in seen:  # a value listed twice would match two branches of a oneOf, and none
            seen.add(canonical)
            options.append(option)
    return options, ""


def _json_type(value: Any) -> str:
    return {dict: "object", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def with_options(form: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, Any]:
    """The form with its options from the context filled in: ``data`` holds what the context holds
    of ``option_keys(form)`` as the task waits. Its schema then checks answers against them, and
    each such field shows them as ``options``; a field whose key is missing or holds no list of
    options is left open (any value passes, as SpiffArena's form would not render at all) and
    carries a ``warning`` that says why. A form without such placeholders comes back as it is."""
    slots = form.get("option_slots") or []
    if not slots:
        return dict(form)
    schema = copy.deepcopy(form["schema"])
    fields = [dict(f) for f in form.get("fields") or []]
    by_id = {f["id"]: f for f in fields}
    warnings: list[str] = []
    for slot in slots:
        at = slot["at"]
        field = by_id.get(at[1]) if len(at) >= 2 and at[0] == "properties" else None
        options, why = _options(str(slot["var"]), data)
        if options is None:
            if field is not None:
                field["warning"] = why
            else:
                warnings.append(f"at {'/'.join(map(str, at)) or 'the top'}: {why}")
            continue
        node = schema
        for step in at:
            node = node[step]
        node[slot["key"]] = ([o["id"] for o in options] if slot["key"] == "enum"
                             else [{"const": o["id"], "title": str(o["name"])} for o in options])
        if field is not None and at[2:] in ([], ["items"]):
            field["options"] = options
    out = {**form, "schema": schema, "fields": fields}
    if warnings:
        out["warnings"] = warnings
    return out


def public_form(form: Mapping[str, Any]) -> dict[str, Any]:
    """What a ``waiting_for`` item shows of a form: its fields and where it comes from."""
    out = {"fields": [dict(f) for f in form.get("fields") or []], "source": form.get("source")}
    if form.get("form_key"):
        out["form_key"] = form["form_key"]
    if form.get("warnings"):
        out["warnings"] = list(form["warnings"])
    return out


def describe_field(field: Mapping[str, Any]) -> str:
    """One field, compactly: ``approved* boolean=false``, ``decision enum(a|b)``, ``amount long 1..1000``."""
    text = str(field["id"]) + ("*" if field.get("required") else "") + " " + str(field.get("type"))
    if field.get("options") is not None:
        text += "(" + "|".join(str(o["id"]) for o in field["options"]) + ")"
    elif field.get("options_from"):
        text += f"(any value: no options in {field['options_from']!r})"
    if field.get("format") or field.get("pattern"):
        text += " " + str(field.get("format") or field["pattern"])
    low, high = field.get("min", field.get("minlength")), field.get("max", field.get("maxlength"))
    ranged = low is not None or high is not None
    if ranged:
        text += f" {'' if low is None else low}..{'' if high is None else high}"
    if field.get("default") is not None:
        # after a range the default stands apart: `1..=1` would read as the range 1 to 1
        text += (" =" if ranged else "=") + json.dumps(field["default"], ensure_ascii=False)
    if field.get("readonly"):
        text += " read-only"
    return text


def describe_fields(fields: Iterable[Mapping[str, Any]]) -> str:
    """The fields a form asks for, as ``describe_field`` shows each; the ``*`` legend only when a
    field carries the mark."""
    shown = list(fields)
    legend = " (* required)" if any(f.get("required") for f in shown) else ""
    return ", ".join(describe_field(f) for f in shown) + legend


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
    elif kind == "double":
        if isinstance(value, str):
            value = _number(value.strip()) if value.strip() else value  # a form posts text
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{json.dumps(value, ensure_ascii=False)} is not a number (type double)"
        if field.get("min") is not None and value < field["min"]:
            return f"{value} is below the minimum {field['min']}"
        if field.get("max") is not None and value > field["max"]:
            return f"{value} is above the maximum {field['max']}"
    elif kind == "list":  # a form-js checklist or taglist: the values ticked
        if not isinstance(value, list):
            return f"{json.dumps(value, ensure_ascii=False)} is not a list (a checklist or taglist gives a list)"
        if field.get("options") is not None:
            allowed = [o["id"] for o in field["options"]]
            for item in value:
                if item not in allowed:
                    return f"{json.dumps(item, ensure_ascii=False)} is not one of {', '.join(map(str, allowed))}"
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
        if kind == "date" and field.get("format") in _FORMJS_VALUES:
            if not _is_formjs_value(value.strip(), field["format"]):
                return f"{json.dumps(value, ensure_ascii=False)} is not {_FORMJS_VALUES[field['format']]}"
        elif kind == "string" and field.get("pattern"):
            if not re.search(field["pattern"], value):  # as form-js tests it: found anywhere, unless anchored
                return f"{json.dumps(value, ensure_ascii=False)} does not match the pattern {field['pattern']}"
        elif kind == "date" and field.get("pattern"):
            if not _in_pattern(value.strip(), field["pattern"]):
                return f"{json.dumps(value, ensure_ascii=False)} is not a date in the pattern {field['pattern']}"
        elif kind == "date" and not _is_camunda_date(value.strip()):
            return f"{json.dumps(value, ensure_ascii=False)} is not a date ({_CAMUNDA_DATES})"
        if field.get("minlength") is not None and len(value) < field["minlength"]:
            return f"shorter than {field['minlength']} characters"
        if field.get("maxlength") is not None and len(value) > field["maxlength"]:
            return f"longer than {field['maxlength']} characters"
    return None


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values: 250 is 250.0, but true is not 1."""
    number = (int, float)
    if isinstance(a, number) and isinstance(b, number) and not isinstance(a, bool) and not isinstance(b, bool):
        return a == b
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _readonly_problem(field: Mapping[str, Any], given: Any, shown: Any) -> str | None:
    """A read-only field given another value than the form shows: what a person cannot do in the
    modeler's form, so not through an answer file or the API either."""
    value = given
    if field.get("type") == "long" and isinstance(given, str) and re.fullmatch(r"[+-]?\d+", given.strip()):
        value = int(given)  # a form posts text
    if _same(value, shown):
        return None
    return (f"is read-only: the form shows {json.dumps(shown, ensure_ascii=False)}, the answer gives "
            f"{json.dumps(given, ensure_ascii=False)}; leave it out or give the value shown")


def _misspelt_fields(fields: list[dict[str, Any]], given: Mapping[str, Any],
                     prefilled: Mapping[str, Any]) -> list[tuple[str, str]]:
    """A key of the answer that is no field of the form but reads like a field the answer leaves out
    (``injry`` beside an omitted ``injury``): a typo the form would otherwise fill with the field's
    default, so the person's value is lost without a word and the process takes the other path.
    Fields the form does not declare still pass when they read like none of its open fields."""
    ids = [str(f["id"]) for f in fields]
    open_ = [f["id"] for f in fields if f["id"] not in given and not f.get("readonly")]
    problems = []
    for key in given:
        if key in ids:
            continue
        close = difflib.get_close_matches(str(key), open_, n=1, cutoff=0.8)
        if close:
            field = close[0]
            default = next(f.get("default") for f in fields if f["id"] == field)
            what = (" (the form would keep the value the context holds)" if field in prefilled else
                    f" (the form would take its default {json.dumps(default, ensure_ascii=False)})"
                    if default is not None else "")
            problems.append((str(key), f"is not a field of the form and reads like {field!r}, which the answer leaves "
                                       f"out{what}: send the value as {field!r}, or give {field!r} too if {key!r} "
                                       "is a key of its own"))
    return problems


def check_answer(form: Mapping[str, Any] | None, given: Mapping[str, Any],
                 prefilled: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The answer with the defaults of the fields it omits, and its problems as (field, message).

    ``prefilled``: what the form starts from instead of its defaults (the values the context
    already holds under the fields' ids: what the task's preScript or an earlier step set, a
    SYSTEM key); a required field it holds counts as answered, and its default is not put in the
    answer, as Camunda's form shows the variable, not the defaultValue, when there is one. A
    read-only field may be left out or given the value the form shows (``prefilled``, else its
    default), nothing else. Fill a form's options from the context (``with_options``) before.
    """
    answer = dict(given)
    if not form or not form.get("fields") and not form.get("schema"):
        return answer, []
    prefilled = prefilled or {}
    fields = form.get("fields") or []
    problems = _misspelt_fields(fields, given, prefilled)
    for field in fields:
        fid = field["id"]
        if field.get("readonly") and fid in given:
            problem = _readonly_problem(field, given[fid], prefilled[fid] if fid in prefilled else field.get("default"))
            if problem:
                problems.append((fid, problem))
    refused = {fid for fid, _ in problems}
    for field in fields:
        if field["id"] not in answer and field["id"] not in prefilled and field.get("default") is not None:
            answer[field["id"]] = field["default"]
    seen = {**prefilled, **answer}
    schema = form.get("schema")
    if schema is not None:
        import jsonschema

        declared = schema.get("properties")
        if isinstance(declared, Mapping):  # fields the form does not declare pass, as without a form
            seen = {k: v for k, v in seen.items() if k in declared}
        validator = jsonschema.validators.validator_for(schema)(schema, format_checker=_format_checker())
        for err in sorted(validator.iter_errors(seen), key=lambda e: list(map(str, e.absolute_path))):
            path = list(err.absolute_path)
            if err.validator == "required" and not path:
                missing = next((f for f in err.validator_value if f not in seen), None)
                problems.append((str(missing), "is required and missing"))
                continue
            name = str(path[0]) if path else "/"
            field = next((f for f in fields if f["id"] == name), None)
            if name in refused:
                continue  # its value is refused as read-only already; its checks would say less
            if field is not None and field.get("options") is not None and len(path) == 1 \
                    and err.validator in ("enum", "oneOf", "anyOf"):
                offered = ", ".join(json.dumps(o["id"], ensure_ascii=False) for o in field["options"])
                problems.append((name, f"{json.dumps(err.instance, ensure_ascii=False)} is not one of {offered}"))
            elif err.validator == "format":
                wanted = _FORMAT_TEXT.get(str(err.validator_value), f"of the format {err.validator_value!r}")
                problems.append((name, f"{json.dumps(err.instance, ensure_ascii=False)} is not {wanted}"))
            else:
                problems.append((name, err.message))
        return answer, problems
    for field in fields:
        fid = field["id"]
        if fid in refused:
            continue
        if field.get("required") and seen.get(fid) in (None, "", []):
            problems.append((fid, "is required and missing"))
            continue
        if fid in answer:
            problem = _field_problem(field, answer[fid])
            if problem:
                problems.append((fid, problem))
            elif field.get("type") == "long" and isinstance(answer[fid], (str, float)):
                answer[fid] = int(answer[fid])  # posted as text, or as a JSON number 30.0: the whole number
            elif field.get("type") == "double" and isinstance(answer[fid], str) and answer[fid].strip():
                answer[fid] = _number(answer[fid].strip())
        elif fid in prefilled and not field.get("readonly"):
            # the form starts from the context's value, which the submitted form would carry: a value the
            # field does not take (an earlier step's "open" for an enum of approve / deny) is refused as
            # Camunda refuses it, not kept as if the person had chosen it (the schema path checks it too)
            problem = _field_problem(field, prefilled[fid])
            if problem:
                problems.append((fid, f"is left out, and the value the form starts from (the context's) does not "
                                      f"fit: {problem}; answer the field"))
    return answer, problems
