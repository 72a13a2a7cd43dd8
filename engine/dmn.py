"""DMN decision files beside BPMN: which of the given files are DMN, which decisions they
define, and which DMN files beside the process a run needs.

A business rule task runs a DMN decision (SpiffWorkflow's DMN engine, over the task's
context). It names the decision by ``spiffworkflow:calledDecisionId`` (SpiffArena) or by
the ``camunda:decisionRef`` attribute (Camunda Modeler). The DMN files are given with the
BPMN files (``layerflow run process.bpmn decisions.dmn``, ``load_process([bpmn, dmn])``);
a decision that no given file defines is looked for in the ``*.dmn`` files beside the
first BPMN file, as SpiffArena keeps a process model's decision tables beside it.

SpiffWorkflow 3.2 reads one decision (with one decision table) per DMN file: the first.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lxml import etree

__all__ = ["CAMUNDA_NS", "DMN_NAMESPACES", "DmnFile", "decision_ref", "is_dmn", "read_dmn", "with_dmn_beside"]

#: The DMN versions SpiffWorkflow 3.2 reads (1.1, 1.2, 1.3).
DMN_NAMESPACES = frozenset({
    "http://www.omg.org/spec/DMN/20151101/dmn.xsd",
    "http://www.omg.org/spec/DMN/20180521/MODEL/",
    "https://www.omg.org/spec/DMN/20191111/MODEL/",
})
_BPMN = "http://www.omg.org/spec/BPMN/20100524/MODEL"
_SPIFF = "http://spiffworkflow.org/bpmn/schema/1.0/core"
CAMUNDA_NS = "http://camunda.org/schema/1.0/bpmn"


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


def read_dmn(path: Path) -> DmnFile:
    """Parse a DMN file (raises OSError, etree.XMLSyntaxError)."""
    root = etree.fromstring(path.read_bytes(), _parser())
    namespace = etree.QName(root).namespace
    decisions = tuple((str(el.get("id")), el.sourceline) for el in root
                      if isinstance(el.tag, str) and etree.QName(el).localname == "decision" and el.get("id"))
    return DmnFile(path, namespace, decisions, root)


def decision_ref(task: Any) -> str | None:
    """The decision business rule task element ``task`` names: ``spiffworkflow:calledDecisionId``,
    else ``camunda:decisionRef``; None when it names none. (The engine's parser reads it so too.)"""
    ref = task.get(f"{{{CAMUNDA_NS}}}decisionRef")
    for called in task.iter(f"{{{_SPIFF}}}calledDecisionId"):
        ref = called.text
        break
    return (ref or "").strip() or None


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
