"""DMN decision files beside BPMN: which of the given files are DMN, which decisions they
define, and which DMN files beside the process a run needs.

A business rule task runs a DMN decision (SpiffWorkflow's DMN engine, over the task's
context). It names the decision by ``spiffworkflow:calledDecisionId`` (SpiffArena), by
the ``camunda:decisionRef`` attribute (Camunda 7 Modeler) or by ``zeebe:calledDecision
decisionId`` (Camunda 8 Modeler). Each output of the matched rule becomes a key of its own,
unless the task names a result variable (``camunda:resultVariable``, ``zeebe:calledDecision
resultVariable``): then that one key holds the decision's result, shaped as Camunda shapes
it (``decision_result``). The DMN files are given with the
BPMN files (``layerflow run process.bpmn decisions.dmn``, ``load_process([bpmn, dmn])``);
a decision that no given file defines is looked for in the ``*.dmn`` files beside the
first BPMN file, as SpiffArena keeps a process model's decision tables beside it.

SpiffWorkflow 3.2 reads one decision (with one decision table) per DMN file: the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lxml import etree

__all__ = ["CAMUNDA_7_NAMESPACES", "CAMUNDA_NS", "OPERATON_NS", "DMN_NAMESPACES", "RESULT_MAPPINGS", "ZEEBE_NS", "DecisionResultError", "DmnFile",
           "decision_outputs", "decision_ref", "decision_result", "is_dmn", "read_dmn", "required_decisions",
           "result_variable", "with_dmn_beside"]

#: The DMN versions SpiffWorkflow 3.2 reads (1.1, 1.2, 1.3).
DMN_NAMESPACES = frozenset({
    "http://www.omg.org/spec/DMN/20151101/dmn.xsd",
    "http://www.omg.org/spec/DMN/20180521/MODEL/",
    "https://www.omg.org/spec/DMN/20191111/MODEL/",
})
_BPMN = "http://www.omg.org/spec/BPMN/20100524/MODEL"
_SPIFF = "http://spiffworkflow.org/bpmn/schema/1.0/core"
CAMUNDA_NS = "http://camunda.org/schema/1.0/bpmn"
# Operaton (Camunda 7's open-source fork) writes the same attributes in a namespace of its own
OPERATON_NS = "http://operaton.org/schema/1.0/bpmn"
CAMUNDA_7_NAMESPACES = (CAMUNDA_NS, OPERATON_NS)
ZEEBE_NS = "http://camunda.org/schema/zeebe/1.0"

#: ``camunda:mapDecisionResult`` values (Camunda 7; ``resultList`` is its default) and what each
#: makes of the matched rules (each a dict of output name -> value)
RESULT_MAPPINGS = {
    "resultList": "the list of the matched rules, each a dict of its outputs",
    "singleResult": "the one matched rule's dict of outputs (null when none matched)",
    "singleEntry": "the one output of the one matched rule (null when none matched)",
    "collectEntries": "the list of the one output's values, one per matched rule",
}
#: the mapping of Camunda 8 (zeebe:calledDecision resultVariable): the decision's own output
DECISION_OUTPUT = "decision"


def _parser() -> Any:
    return etree.XMLParser(resolve_entities=False, no_network=True)


def _root_tag(path: Path) -> str | None:
    """The root element's tag, read from the start of the file only; None when unreadable."""
    try:
        for _, el in etree.iterparse(str(path), events=("start",), resolve_entities=False, no_network=True):
            return str(el.tag)
    except (OSError, etree.XMLSyntaxError):
        return None
    return None


def is_dmn(path: Path) -> bool:
    """A DMN file: its root is a DMN ``definitions`` (any namespace with ``/DMN/`` in it), or,
    unreadable, its name ends in ``.dmn``."""
    tag = _root_tag(path)
    if tag is None:
        return path.suffix.lower() == ".dmn"
    namespace = etree.QName(tag).namespace or ""
    return "/DMN/" in namespace.upper() or (path.suffix.lower() == ".dmn" and not namespace.startswith(_BPMN))


@dataclass(frozen=True)
class DmnFile:
    path: Path
    namespace: str | None
    #: (decision id, line) of every decision, in file order; SpiffWorkflow runs the first only
    decisions: tuple[tuple[str, int | None], ...]
    root: Any

    @property
    def decision(self) -> str | None:
        """The decision SpiffWorkflow registers for this file."""
        return self.decisions[0][0] if self.decisions else None


def _decision_element(root: Any, decision: str) -> Any:
    return next((el for el in root if isinstance(el.tag, str) and etree.QName(el).localname == "decision"
                 and el.get("id") == decision), None)


def required_decisions(root: Any, decision: str) -> list[str]:
    """The decisions that ``decision`` of DMN ``root`` requires (its ``informationRequirement``'s
    ``requiredDecision href="#id"``: a decision requirements graph), in file order."""
    el = _decision_element(root, decision)
    if el is None:
        return []
    return [(req.get("href") or "").lstrip("#") for req in el.iter()
            if isinstance(req.tag, str) and etree.QName(req).localname == "requiredDecision"
            and (req.get("href") or "").lstrip("#")]


def decision_outputs(root: Any, decision: str) -> list[str]:
    """The output names of ``decision``'s decision table (what it gives the decisions that require it)."""
    el = _decision_element(root, decision)
    if el is None:
        return []
    return [str(out.get("name")) for out in el.iter()
            if isinstance(out.tag, str) and etree.QName(out).localname == "output" and out.get("name")]


def read_dmn(path: Path) -> DmnFile:
    """Parse a DMN file (raises OSError, etree.XMLSyntaxError)."""
    root = etree.fromstring(path.read_bytes(), _parser())
    # comments say nothing to evaluate: an entry's text is then read whole (as the engine's parser reads it)
    etree.strip_elements(root, etree.Comment, etree.ProcessingInstruction, with_tail=False)
    namespace = etree.QName(root).namespace
    decisions = tuple((str(el.get("id")), el.sourceline) for el in root
                      if isinstance(el.tag, str) and etree.QName(el).localname == "decision" and el.get("id"))
    return DmnFile(path, namespace, decisions, root)


def _camunda_7(task: Any, name: str) -> str | None:
    """The attribute ``camunda:NAME`` of element ``task``, or Operaton's ``operaton:NAME``."""
    return next((value for ns in CAMUNDA_7_NAMESPACES if (value := task.get(f"{{{ns}}}{name}"))), None)


def _zeebe_called_decision(task: Any) -> Any:
    return next(task.iterfind(f"{{{_BPMN}}}extensionElements/{{{ZEEBE_NS}}}calledDecision"), None)


def decision_ref(task: Any) -> str | None:
    """The decision business rule task element ``task`` names: ``spiffworkflow:calledDecisionId``,
    else ``camunda:decisionRef``, else ``zeebe:calledDecision decisionId``; None when it names none.
    (The engine's parser reads it so too.)"""
    zeebe = _zeebe_called_decision(task)
    ref = _camunda_7(task, "decisionRef") or (zeebe.get("decisionId") if zeebe is not None else None)
    for called in task.iter(f"{{{_SPIFF}}}calledDecisionId"):
        ref = called.text
        break
    return (ref or "").strip() or None


def result_variable(task: Any) -> tuple[str, str] | None:
    """``(variable, mapping)`` when business rule task element ``task`` puts its decision's result
    in one variable: ``camunda:resultVariable`` with its ``camunda:mapDecisionResult`` (default
    ``resultList``, as in Camunda 7; the value as written, checked by ``validate``), or
    ``zeebe:calledDecision resultVariable`` (mapping ``"decision"``, Camunda 8's)."""
    name = (_camunda_7(task, "resultVariable") or "").strip()
    if name:
        return name, (_camunda_7(task, "mapDecisionResult") or "resultList").strip()
    zeebe = _zeebe_called_decision(task)
    name = (zeebe.get("resultVariable") or "").strip() if zeebe is not None else ""
    return (name, DECISION_OUTPUT) if name else None


class DecisionResultError(ValueError):
    """The matched rules do not fit the result mapping (``singleEntry`` of two outputs ...)."""


def decision_result(mapping: str, rows: Sequence[Mapping[str, Any]], *, outputs: Sequence[str],
                    multiple_hits: bool) -> Any:
    """What a result variable holds, from the matched rules' outputs (``rows``, in rule order).

    Camunda 7 (``camunda:mapDecisionResult``, see ``RESULT_MAPPINGS``); Camunda 8
    (``"decision"``): a single-hit table (UNIQUE, FIRST, ANY) gives its one output's value, or a dict of its
    outputs when it has several, null when no rule matched; a multiple-hit table (COLLECT) the
    list of those, one per matched rule. Raises DecisionResultError when the rules do not fit
    (Camunda fails the task so too)."""
    rows = [dict(row) for row in rows]
    if mapping == DECISION_OUTPUT:
        shaped = [next(iter(row.values()), None) if len(outputs) == 1 else row for row in rows]
        return shaped if multiple_hits else (shaped[0] if shaped else None)
    if mapping == "resultList":
        return rows
    if mapping == "collectEntries":
        several = next((row for row in rows if len(row) > 1), None)
        if several is not None:
            raise DecisionResultError(f"mapDecisionResult 'collectEntries' takes the values of one output, but the "
                                      f"decision has the outputs {', '.join(map(repr, several))}: map with "
                                      "'resultList', or give the table one output")
        return [next(iter(row.values())) for row in rows if row]
    if mapping not in ("singleResult", "singleEntry"):
        raise DecisionResultError(f"mapDecisionResult {mapping!r} is none of {', '.join(RESULT_MAPPINGS)}")
    if len(rows) > 1:
        raise DecisionResultError(f"mapDecisionResult {mapping!r} takes one matched rule, but {len(rows)} matched: "
                                  "map with 'resultList' (or 'collectEntries'), or make the rules exclusive")
    if not rows:
        return None
    if mapping == "singleResult":
        return rows[0]
    if len(rows[0]) > 1:
        raise DecisionResultError(f"mapDecisionResult 'singleEntry' takes one output, but the matched rule has the "
                                  f"outputs {', '.join(map(repr, rows[0]))}: map with 'singleResult' (a dict of "
                                  "them), or give the table one output")
    return next(iter(rows[0].values()), None)


def _refs_of(paths: Iterable[Path]) -> set[str]:
    refs: set[str] = set()
    for path in paths:
        try:
            data = path.read_bytes()
            if b"businessRuleTask" not in data:
                continue  # most processes: no need to parse the file again
            root = etree.fromstring(data, _parser())
        except (OSError, etree.XMLSyntaxError):
            continue
        refs.update(ref for ref in map(decision_ref, root.iter(f"{{{_BPMN}}}businessRuleTask")) if ref)
    return refs


def with_dmn_beside(paths: Sequence[Path]) -> list[Path]:
    """``paths`` and, where a business rule task names a decision no given DMN file defines,
    the ``*.dmn`` files beside the first BPMN file that define one (sorted by name)."""
    bpmn = [p for p in paths if not is_dmn(p)]
    given = [p for p in paths if is_dmn(p)]
    if not bpmn:
        return list(paths)
    defined: set[str] = set()
    for p in given:
        try:
            defined.update(d for d, _ in read_dmn(p).decisions[:1])
        except (OSError, etree.XMLSyntaxError):
            continue
    missing = _refs_of(bpmn) - defined
    if not missing:
        return list(paths)
    found: list[Path] = []
    taken = {p.resolve() for p in paths}
    for candidate in sorted(bpmn[0].parent.glob("*.dmn")):
        if candidate.resolve() in taken or not candidate.is_file():
            continue
        try:
            decision = read_dmn(candidate).decision
        except (OSError, etree.XMLSyntaxError):
            continue
        if decision in missing:
            found.append(candidate)
            missing.discard(decision)
    return [*paths, *found]
