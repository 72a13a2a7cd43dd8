"""A call activity's ``in`` / ``out`` mappings as Camunda 7 (Operaton, Activiti, Flowable) write
them: ``<camunda:in source="claimId" target="ref"/>`` passes the caller's ``claimId`` to the called
process as ``ref``; ``<camunda:out source="ok" target="claimOk"/>`` gives its ``ok`` back as
``claimOk``. The mappings are Python run as the call activity's preScript (``in``) and postScript
(``out``) (``engine.spiff._LayerflowCallActivityParser``). A call with ``out`` mappings and no
``out variables="all"`` runs in a scope of its own, as Camunda gives each call its variables, and
only what its ``out`` mappings set comes back (``scoped``, ``ScopeSteps.leave_subworkflow``); any
other runs in its caller's context, where every variable crosses under its own name. Pure: lxml
only, read by ``engine.validate`` too."""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

#: namespaces whose ``in`` / ``out`` elements on a call activity pass variables under other names
NAMESPACES = {"http://camunda.org/schema/1.0/bpmn": "camunda", "http://operaton.org/schema/1.0/bpmn": "operaton",
              "http://activiti.org/bpmn": "activiti", "http://flowable.org/bpmn": "flowable"}
_EXTENSIONS = "{http://www.omg.org/spec/BPMN/20100524/MODEL}extensionElements"
_SIMPLE_EXPRESSION = re.compile(r"^\s*[$#]\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\s*$")


def renames(node: Any) -> list[tuple[str, str, str, Any]]:
    """The call activity element ``node``'s mappings that pass a variable under another name:
    (``"in"`` or ``"out"``, source variable, target variable, the mapping element), in document
    order. A ``sourceExpression`` that only names a variable (``${claimId}``) counts as that source;
    one that computes something is not run (``engine.validate`` says so)."""
    out = []
    for ext in node.iterfind(_EXTENSIONS):
        for child in ext:
            if not isinstance(child.tag, str):
                continue
            qn = etree.QName(child.tag)
            if qn.namespace not in NAMESPACES or qn.localname not in ("in", "out"):
                continue
            source = (child.get("source") or "").strip()
            if not source:
                simple = _SIMPLE_EXPRESSION.match(child.get("sourceExpression") or "")
                source = simple.group(1) if simple else ""
            target = (child.get("target") or "").strip()
            if source and target and source != target and source.isidentifier() and target.isidentifier():
                out.append((qn.localname, source, target, child))
    return out


#: the first line of the script of a call activity's in (out) mappings: an instance of a
#: multi-instance call activity runs it in its own scope, which the called process runs in
IN_MARK = "# in mappings of the call activity"
OUT_MARK = "# out mappings of the call activity"
#: the last line of the out mappings' script when the call activity also has
#: ``<camunda:out variables="all"/>``: everything the called process set comes back
ALL_OUT_MARK = "# out variables=all"


def all_out(node: Any) -> bool:
    """Whether the call activity element ``node`` has an ``out`` mapping with ``variables="all"``."""
    for ext in node.iterfind(_EXTENSIONS):
        for child in ext:
            if isinstance(child.tag, str) and etree.QName(child.tag).namespace in NAMESPACES \
                    and etree.QName(child.tag).localname == "out" and (child.get("variables") or "").strip() == "all":
                return True
    return False


def scoped(spec: Any) -> bool:
    """Whether a call activity runs its called process in a scope of its own, as Camunda does: it
    has ``out`` mappings and no ``out variables="all"``, so only what they name comes back to the
    caller (parallel calls of one process then never meet on its variables). Read from its
    postScript, which is saved with the workflow."""
    postscript = getattr(spec, "postscript", None)
    return isinstance(postscript, str) and OUT_MARK in postscript and ALL_OUT_MARK not in postscript


def script(pairs: list[tuple[str, str]], *, out: bool = False) -> str:
    """Python that sets each target from its source, and to None when the source is not set (Camunda
    passes a variable that does not exist as null); it begins with ``IN_MARK`` or ``OUT_MARK``."""
    lines = [OUT_MARK if out else IN_MARK]
    for source, target in pairs:
        lines += ["try:", f"    {target} = {source}", "except NameError:", f"    {target} = None"]
    return "\n".join(lines)
