"""BPMN link events: which catch event a link throw event jumps to.

A pair of link events is an off-page connector: the path that reaches an intermediate throw
event with a ``linkEventDefinition`` goes on at the intermediate catch event of the same link
in the same process level (the same process or sub-process; BPMN forbids links across levels).
SpiffWorkflow 3.2 reads neither (``engine.spiff`` connects the pair as it parses the throw);
``engine.validate`` refuses a pair it cannot match; ``engine.diagram`` draws the jump. They all find
the catch here, on the XML (lxml's elements, or ElementTree's given the throw's scope).

A throw names its catch, in the order modelers write it: ``<bpmn:target>`` (the id of the
catch's linkEventDefinition), a catch whose ``<bpmn:source>`` lists the throw's definition,
and otherwise the definitions' ``name``, which is how BPMN pairs them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["link_definition", "link_name", "link_catches", "catch_of", "is_link_throw", "is_link_catch"]

_BPMN = "{http://www.omg.org/spec/BPMN/20100524/MODEL}"


def link_definition(node: Any) -> Any:
    """The ``linkEventDefinition`` child of an element, or None."""
    return node.find(f"{_BPMN}linkEventDefinition")


def is_link_throw(node: Any) -> bool:
    return bool(node.tag == f"{_BPMN}intermediateThrowEvent" and link_definition(node) is not None)


def is_link_catch(node: Any) -> bool:
    return bool(node.tag == f"{_BPMN}intermediateCatchEvent" and link_definition(node) is not None)


def link_name(node: Any) -> str:
    """The link's name: the definition's ``name`` ("" when it has none). The event's own name is
    its label in the diagram, which BPMN does not pair by."""
    definition = link_definition(node)
    return (definition.get("name") or "").strip() if definition is not None else ""


def link_catches(scope: Any) -> list[Any]:
    """The link catch events directly in a process or sub-process, in document order."""
    return [el for el in scope.findall(f"{_BPMN}intermediateCatchEvent") if link_definition(el) is not None]


def _refs(definition: Any, tag: str) -> list[str]:
    return [(ref.text or "").strip() for ref in definition.findall(f"{_BPMN}{tag}") if (ref.text or "").strip()]


def catch_of(throw: Any, scope: Any = None) -> list[Any]:
    """The catch events of the throw's process level that it jumps to (one, when the model is
    sound; none or several are the model's error, which ``engine.validate`` reports). ``scope``:
    the throw's process or sub-process, which an ElementTree element cannot tell."""
    scope = throw.getparent() if scope is None else scope
    definition = link_definition(throw)
    if scope is None or definition is None:
        return []
    catches = link_catches(scope)
    targets = _refs(definition, "target")
    if targets:
        return [c for c in catches if link_definition(c).get("id") in targets]
    own = definition.get("id")
    by_source = [c for c in catches if own is not None and own in _refs(link_definition(c), "source")]
    if by_source:
        return by_source
    name = link_name(throw)
    return [c for c in catches if name and link_name(c) == name]
