"""A task's input and output mappings as Camunda 7 and Operaton write them
(``<camunda:inputOutput>`` with ``<camunda:inputParameter name="amount">${order.total}</...>`` and
``camunda:outputParameter``) and as Camunda 8 does (``<zeebe:ioMapping>`` with ``<zeebe:input
source="=order.total" target="amount"/>`` and ``zeebe:output``).

A mapping whose value only names a variable (``${total}``, ``=total``, Camunda 7's
``${execution.getVariable('total')}``), follows a path into an
object (``${order.total}``, ``=order.total``: ``order['total']`` here, context values being JSON) or
is a literal (a number, a quoted string, true, false, null; Camunda 7's text without an expression
is a string, Camunda 8's input source without ``=`` too) is run as Python (Camunda 8's target into
an object's keys, ``authentication.type``, too): the inputs as the task's
preScript, before its work, the outputs as its postScript, after it
(``engine.spiff._ExtensionsParserMixin``). A mapping that computes something else is another
engine's expression, which nothing here evaluates: ``Mapping.python`` is None, and
``engine.validate`` says what to write instead.

What the other engines do that is kept: Camunda 7 stops on a variable that does not exist
(``${total}``) and gives null for a key an object lacks (``${order.total}``); Camunda 8's FEEL
gives null for both. What is not: in Camunda an input is a local variable of the task, gone when it
ends; layerflow has no task-local scope, so an input lands in WORKING and moves into HISTORY with
the task's other writes.

Pure: lxml only, read by ``engine.validate`` too."""

from __future__ import annotations

import ast
import json
import keyword
import re
from dataclasses import dataclass
from typing import Any

from lxml import etree

#: namespace -> prefix of the engines whose input/output mappings are read here
NAMESPACES = {"http://camunda.org/schema/1.0/bpmn": "camunda", "http://operaton.org/schema/1.0/bpmn": "operaton",
              "http://camunda.org/schema/zeebe/1.0": "zeebe"}
_EXTENSIONS = "{http://www.omg.org/spec/BPMN/20100524/MODEL}extensionElements"
_NUMBER = re.compile(r"^-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?$")
_PATH = re.compile(r"^[A-Za-z_]\w*(?:\s*\.\s*[A-Za-z_]\w*)*$")
_GET_VARIABLE = re.compile(r"^execution\s*\.\s*getVariable\(\s*(['\"])([A-Za-z_]\w*)\1\s*\)$")
_JUEL_WORDS = {"true", "false", "null", "empty", "not", "and", "or", "div", "mod", "eq", "ne", "lt", "gt", "le", "ge",
               "instanceof"}
_FEEL_WORDS = {"true", "false", "null", "not", "and", "or", "if", "then", "else", "for", "in", "return", "some", "every",
               "satisfies", "between", "instance", "of", "function"}


@dataclass(frozen=True)
class Mapping:
    """One input or output mapping of a task.

    ``direction``: "input" or "output"; ``field``: the element as written (``camunda:inputParameter``,
    ``zeebe:output``); ``target``: the variable it sets, as written; ``source``: the value as written
    (an expression, a text, ``""`` for none); ``dialect``: "JUEL" (Camunda 7) or "FEEL" (Camunda 8);
    ``python``: the statements that set the target, None when the mapping is not run; ``why``: what
    keeps it from running (empty when it runs)."""

    direction: str
    field: str
    target: str
    source: str
    dialect: str
    python: str | None
    why: str
    element: Any


def mappings(node: Any) -> list[Mapping]:
    """The input and output mappings of the BPMN element ``node``, in document order."""
    found: list[Mapping] = []
    for ext in node.iterfind(_EXTENSIONS):
        for holder in ext:
            if not isinstance(holder.tag, str):
                continue
            qn = etree.QName(holder.tag)
            prefix = NAMESPACES.get(qn.namespace or "")
            if prefix is None or qn.localname not in ("inputOutput", "ioMapping"):
                continue
            for child in holder:
                if not isinstance(child.tag, str) or etree.QName(child.tag).namespace != qn.namespace:
                    continue
                local = etree.QName(child.tag).localname
                if local in ("inputParameter", "outputParameter"):
                    found.append(_camunda7(child, f"{prefix}:{local}", "input" if local.startswith("in") else "output",
                                           node.get("id") or "(no id)"))
                elif local in ("input", "output"):
                    found.append(_camunda8(child, f"{prefix}:{local}", local))
    return found


#: Camunda 7's (Operaton's) and Flowable's attributes of a catching error or escalation event
#: definition that name the variable the engine sets to what it caught: (kind of event, what of it)
CAUGHT_VARIABLES = {("camunda", "errorCodeVariable"): ("error", "code"),
                    ("camunda", "errorMessageVariable"): ("error", "message"),
                    ("camunda", "escalationCodeVariable"): ("escalation", "code"),
                    ("flowable", "errorVariableName"): ("error", "code")}
_CATCHING_ENGINES = {"http://camunda.org/schema/1.0/bpmn": "camunda", "http://operaton.org/schema/1.0/bpmn": "operaton",
                     "http://flowable.org/bpmn": "flowable"}
_BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


def caught(node: Any) -> list[Mapping]:
    """The variables Camunda 7 (and Flowable) set as the catching event ``node`` catches an error or
    escalation (``camunda:errorCodeVariable="code"``, Flowable's ``flowable:errorVariableName="code"``
    on its bpmn:errorEventDefinition), as output mappings:
    the code of the bpmn:error (bpmn:escalation) the definition names, the error's message its
    ``camunda:errorMessage`` (None when it has none, as in Camunda). A definition that names none
    catches every error, and which one it caught is known only then: not run (``why`` says so)."""
    found: list[Mapping] = []
    root = node.getroottree().getroot()
    for kind in ("error", "escalation"):
        for definition in node.iterchildren(f"{_BPMN}{kind}EventDefinition"):
            for name, target in definition.attrib.items():
                qn = etree.QName(name)
                prefix = _CATCHING_ENGINES.get(qn.namespace or "")
                what = CAUGHT_VARIABLES.get(("camunda" if prefix == "operaton" else prefix or "", qn.localname))
                if what is None or what[0] != kind or not target.strip():
                    continue
                field, target = f"{prefix}:{qn.localname}", target.strip()
                ref = definition.get(f"{kind}Ref")
                named = next((el for el in root.iter(f"{_BPMN}{kind}") if ref and el.get("id") == ref), None)
                code = named.get(f"{kind}Code") if named is not None else None
                python: str | None = None
                if not code:
                    why = (f"it catches every {kind}" if not ref else
                           f"the bpmn:{kind} {ref!r} it names has no {kind}Code, so it catches every {kind}")
                elif not target.isidentifier() or keyword.iskeyword(target):
                    why = f"{target!r} is no variable name"
                else:
                    value: str | None = code
                    if what[1] == "message" and named is not None:
                        value = next((v for k, v in named.attrib.items() if etree.QName(k).localname == "errorMessage"
                                      and NAMESPACES.get(etree.QName(k).namespace or "") in ("camunda", "operaton")),
                                     None)
                    if value is not None and ("${" in value or "#{" in value):
                        why = f"the message of bpmn:error {ref!r} is an expression ({value!r}), which nothing evaluates"
                    else:
                        python, why = f"{target} = {value!r}", ""
                found.append(Mapping("output", field, target, code or "", "JUEL", python, why, definition))
    return found


def script(found: list[Mapping]) -> str:
    """The Python of the mappings that run, one after another (a later mapping reads an earlier one's
    target, as in Camunda)."""
    return "\n".join(m.python for m in found if m.python is not None)


def identity(found: Mapping) -> bool:
    """Whether the mapping passes a variable under its own name (``=total`` to total): a local copy
    in Camunda, the variable itself here, which it leaves as it is."""
    source = found.source.strip()
    inner = source[1:] if found.dialect == "FEEL" and source.startswith("=") else \
        source[2:-1] if found.dialect == "JUEL" and source[:2] in ("${", "#{") and source.endswith("}") else None
    return inner is not None and inner.strip() == found.target


def assignment(found: Mapping) -> str | None:
    """The mapping's Python as one assignment, to show (``order = {'city': 'Berlin'}``): its
    statement without the handling of a variable or key that is not set; None when it is not run."""
    if found.python is None:
        return None
    head = found.target.split(".")[0].strip()
    lines = [line.strip() for line in found.python.splitlines()]
    return next((line for line in lines if line.startswith(head) and " = " in line and "dict(" not in line
                 and not line.endswith("= None") and not line.endswith("= {}")), lines[0])


def _camunda7(el: Any, field: str, direction: str, eid: str) -> Mapping:
    target = (el.get("name") or "").strip()
    children = [c for c in el if isinstance(c.tag, str)]
    text = el.text or ""
    source = text if not children else etree.QName(children[0].tag).localname
    python, why = None, ""
    if children:
        value = _structure(children[0]) if len(children) == 1 else None
        if value is None:
            what = etree.QName(children[0].tag).localname
            why = ("a script, which layerflow does not run" if what == "script" else
                   f"a {what} holding something other than texts, literals and variable names")
        else:
            python = f"{target} = {value}"
    elif not text.strip():
        python = f"{target} = None"  # Camunda 7: an empty parameter is null
    else:
        python, why = _statement(target, text, "JUEL")
    if python is not None and target.isidentifier() and _reads_a_name(python):
        python = _stops_when_unset(python, field, target, eid, direction)
    return _checked(Mapping(direction, field, target, source, "JUEL", python, why, el))


def _camunda8(el: Any, field: str, direction: str) -> Mapping:
    target = (el.get("target") or "").strip()
    source = (el.get("source") or "").strip()
    python, why = None, ""
    parts = [p.strip() for p in target.split(".")]
    keyed = len(parts) > 1 and all(p.isidentifier() and not keyword.iskeyword(p) for p in parts)
    # a target into an object's keys (authentication.type): Camunda 8 makes the object, or
    # adds the key to the one there is
    into = parts[0] + "".join(f"[{k!r}]" for k in parts[1:]) if keyed else target
    if not source:
        if direction == "input":
            python = f"{into} = None"  # Camunda 8: an input with no source is null
        else:
            why = "no source"
    elif not source.startswith("="):
        if direction == "input":
            python = f"{into} = {source!r}"  # Camunda 8: a static input is its text
        else:
            why = "a static text, which Camunda 8 does not take as an output's source (it needs an = expression)"
    else:
        python, why = _statement(into, source, "FEEL")
    if keyed and python is not None:
        return Mapping(direction, field, target, source, "FEEL", _objects_for(parts) + "\n" + python, why, el)
    return _checked(Mapping(direction, field, target, source, "FEEL", python, why, el))


def _objects_for(parts: list[str]) -> str:
    """Python that makes each object on the path ``parts[:-1]`` a dict of its own (a copy of the one
    there is, a new one when there is none or it is no object), as Camunda 8 does for a target
    into an object's keys."""
    lines = []
    for depth in range(1, len(parts)):
        holder = parts[0] + "".join(f"[{k!r}]" for k in parts[1:depth])
        missing = "(NameError, TypeError, ValueError)" if depth == 1 else "(KeyError, TypeError, ValueError)"
        lines += ["try:", f"    {holder} = dict({holder})", f"except {missing}:", f"    {holder} = {{}}"]
    return "\n".join(lines)


def _checked(found: Mapping) -> Mapping:
    """The mapping, not run when its target is no variable name."""
    target = found.target
    if target.isidentifier() and not keyword.iskeyword(target):
        return found
    why = ("no target" if not target else
           f"its target {target!r} is a path into an object" if _PATH.match(target) else
           f"its target {target!r} is no variable name")
    return Mapping(found.direction, found.field, target, found.source, found.dialect, None, why, found.element)


def _statement(target: str, text: str, dialect: str) -> tuple[str | None, str]:
    """The Python that sets ``target`` from one value (``${...}`` or ``=...``), and why not."""
    if dialect == "JUEL":
        stripped = text.strip()
        if "${" not in text and "#{" not in text:
            return f"{target} = {text!r}", ""  # a text constant
        if not (stripped[:2] in ("${", "#{") and stripped.endswith("}") and "}" not in stripped[2:-1]):
            return None, "text around an expression, which layerflow does not evaluate"
        inner = stripped[2:-1].strip()
        api = _GET_VARIABLE.match(inner)
        if api is not None:
            # Camunda's process API reading one variable: that variable, null when it is not set
            name = api.group(2)
            return f"try:\n    {target} = {name}\nexcept NameError:\n    {target} = None", ""
    else:
        inner = text.strip()[1:].strip()
    literal = _literal(inner, dialect)
    if literal is not None:
        return f"{target} = {literal}", ""
    words = _JUEL_WORDS if dialect == "JUEL" else _FEEL_WORDS
    if not _PATH.match(inner) or any(keyword.iskeyword(p.strip()) or p.strip() in words for p in inner.split(".")):
        return None, "an expression that computes a value, which layerflow does not evaluate"
    head, *keys = [p.strip() for p in inner.split(".")]
    value = head + "".join(f"[{k!r}]" for k in keys)
    # what gives null: FEEL's variable that does not exist; both dialects' key that an object lacks
    # (or a path through null); Camunda 7 stops on a variable that does not exist
    missing = (["NameError"] if dialect == "FEEL" else []) + (["KeyError", "TypeError"] if keys else [])
    if not missing:
        return f"{target} = {value}", ""
    caught = missing[0] if len(missing) == 1 else f"({', '.join(missing)})"
    return f"try:\n    {target} = {value}\nexcept {caught}:\n    {target} = None", ""


def _reads_a_name(python: str) -> bool:
    return any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id != "None"
               for n in ast.walk(ast.parse(python)))


def _stops_when_unset(python: str, field: str, target: str, eid: str, direction: str) -> str:
    """Camunda 7's mapping ``python`` that stops, as Camunda does, on a variable that is not set,
    with an error naming the mapping, the task and what to do (not Python's bare NameError)."""
    where = f"in a step before {eid!r}" if direction == "input" else f"in {eid!r}"
    said = (f"{field} {target!r} of {eid!r} reads a variable that is not set, and Camunda 7 stops there too "
            f"(layerflow runs the {direction} mappings as the task's {'preScript' if direction == 'input' else 'postScript'}):"
            f" give it in the start data or set it {where}")
    body = "\n".join("    " + line for line in python.splitlines())
    return f"try:\n{body}\nexcept NameError as unset:\n    raise NameError({said!r} + f' ({{unset}})') from None"


def _literal(inner: str, dialect: str) -> str | None:
    """The Python of a literal (number, quoted string without escapes, true, false, null); None for
    anything else."""
    if _NUMBER.match(inner):
        return inner
    if inner in ("true", "false", "null"):
        return {"true": "True", "false": "False", "null": "None"}[inner]
    if dialect == "FEEL" and inner[:1] in ("{", "["):
        try:  # a FEEL context or list written as JSON
            return repr(json.loads(inner))
        except ValueError:
            return None
    quotes = ('"', "'") if dialect == "JUEL" else ('"',)
    if len(inner) >= 2 and inner[0] in quotes and inner[-1] == inner[0] and inner[0] not in inner[1:-1] \
            and "\\" not in inner:
        return json.dumps(inner[1:-1], ensure_ascii=False)
    return None


def _structure(el: Any) -> str | None:
    """The Python of Camunda 7's ``camunda:list`` / ``camunda:map`` of texts, literals and variable
    names (nested ones too); None for a script or anything computed."""
    local = etree.QName(el.tag).localname
    if local not in ("list", "map"):
        return None
    parts = []
    for child in el:
        if not isinstance(child.tag, str):
            continue
        inner = [c for c in child if isinstance(c.tag, str)]
        if inner:
            value = _structure(inner[0]) if len(inner) == 1 else None
        else:
            value = _plain_value(child.text or "")
        if value is None:
            return None
        parts.append(f"{child.get('key', '')!r}: {value}" if local == "map" else value)
    return "{" + ", ".join(parts) + "}" if local == "map" else "[" + ", ".join(parts) + "]"


def _plain_value(text: str) -> str | None:
    """A Camunda 7 value as a Python expression: a text, a literal or a variable by its name."""
    if not text.strip():
        return "None"
    if "${" not in text and "#{" not in text:
        return repr(text)
    stripped = text.strip()
    if not (stripped[:2] in ("${", "#{") and stripped.endswith("}")):
        return None
    inner = stripped[2:-1].strip()
    literal = _literal(inner, "JUEL")
    if literal is not None:
        return literal
    if inner.isidentifier() and not keyword.iskeyword(inner) and inner not in _JUEL_WORDS:
        return inner
    return None


def template_python(text: str) -> str | None:
    """Camunda 7's text around expressions (``Invoice ${invoice.id} of ${customer}``) as a Python
    f-string, when each expression names a variable or a path; None otherwise."""
    parts = re.split(r"[$#]\{([^{}]*)\}", text)
    out = []
    for i, part in enumerate(parts):
        if i % 2 == 0:
            out.append(part.replace("{", "{{").replace("}", "}}").replace('"', '\\"'))
            continue
        inner = part.strip()
        if not _PATH.match(inner) or any(keyword.iskeyword(p.strip()) or p.strip() in _JUEL_WORDS
                                         for p in inner.split(".")):
            return None
        head, *keys = [p.strip() for p in inner.split(".")]
        out.append("{" + head + "".join(f"[{k!r}]" for k in keys) + "}")
    return 'f"' + "".join(out) + '"'
