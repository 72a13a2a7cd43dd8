"""BPMN files the way common modelers export them, never written for SpiffWorkflow.

Camunda Modeler 7 and 8 (``camunda:`` / ``zeebe:`` attributes and extension elements, JUEL
``${...}`` and FEEL ``=...`` expressions, incoming/outgoing children, full diagram sections),
Eclipse's ``bpmn2:`` prefix, Signavio's default namespace, files without a diagram,
collaborations with pools, lanes and message flows. Each file is checked three ways: the
Python API and ``layerflow run --json`` against plain SpiffWorkflow where plain SpiffWorkflow
runs it, and ``layerflow validate``, whose every refusal must name the file, the element, the
field and what to write instead (never a traceback)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import pytest
from click.testing import CliRunner
from lxml import etree

from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process

from engine_helpers import path_of, run_plain, variables
from test_conformance import _Clock, run_ours

BPMN = "http://www.omg.org/spec/BPMN/20100524/MODEL"
CAMUNDA = 'xmlns:camunda="http://camunda.org/schema/1.0/bpmn"'
ZEEBE = 'xmlns:zeebe="http://camunda.org/schema/zeebe/1.0"'

# The root element each modeler writes (its namespaces, exporter, execution platform).
DIALECTS = {
    "camunda7": f'{CAMUNDA} xmlns:modeler="http://camunda.org/schema/modeler/1.0" exporter="Camunda Modeler" '
                'exporterVersion="5.17.0" modeler:executionPlatform="Camunda Platform" '
                'modeler:executionPlatformVersion="7.20.0" targetNamespace="http://bpmn.io/schema/bpmn"',
    "zeebe": f'{ZEEBE} xmlns:modeler="http://camunda.org/schema/modeler/1.0" exporter="Camunda Modeler" '
             'exporterVersion="5.20.0" modeler:executionPlatform="Camunda Cloud" '
             'modeler:executionPlatformVersion="8.4.0" targetNamespace="http://bpmn.io/schema/bpmn"',
    "bpmn2": 'exporter="org.eclipse.bpmn2.modeler.core" exporterVersion="1.5.4" '
             'targetNamespace="http://org.eclipse.bpmn2/default/process"',
    "signavio": 'exporter="Signavio Process Editor, http://www.signavio.com" exporterVersion="17.8.0" '
                'expressionLanguage="http://www.w3.org/TR/XPath" targetNamespace="http://www.signavio.com"',
}
_NODE_TAGS = ("task", "Task", "Event", "Gateway", "subProcess", "transaction", "callActivity")


# ----- building an export -----------------------------------------------------------------------

def start(node_id: str = "StartEvent_1", inner: str = "") -> str:
    return f'<bpmn:startEvent id="{node_id}">{inner}</bpmn:startEvent>'


def end(node_id: str = "EndEvent_1", inner: str = "") -> str:
    return f'<bpmn:endEvent id="{node_id}">{inner}</bpmn:endEvent>'


def script(node_id: str, text: str, attrs: str = 'scriptFormat="python"', ext: str = "") -> str:
    ext = f"<bpmn:extensionElements>{ext}</bpmn:extensionElements>" if ext else ""
    return f'<bpmn:scriptTask id="{node_id}" {attrs}>{ext}<bpmn:script>{escape(text)}</bpmn:script></bpmn:scriptTask>'


def timer(node_id: str, kind: str, text: str, tag: str = "intermediateCatchEvent") -> str:
    return (f'<bpmn:{tag} id="{node_id}"><bpmn:timerEventDefinition><bpmn:{kind} xsi:type="bpmn:tFormalExpression">'
            f"{escape(text)}</bpmn:{kind}></bpmn:timerEventDefinition></bpmn:{tag}>")


def xor(node_id: str, default: str | None = None) -> str:
    return f'<bpmn:exclusiveGateway id="{node_id}"{f" default={default!r}" if default else ""} />'.replace("'", '"')


def flow(source: str, target: str, condition: str | None = None, attrs: str = "") -> str:
    fid = f"Flow_{source}_{target}"
    if condition is None:
        return f'<bpmn:sequenceFlow id="{fid}" sourceRef="{source}" targetRef="{target}" />'
    return (f'<bpmn:sequenceFlow id="{fid}" sourceRef="{source}" targetRef="{target}">'
            f'<bpmn:conditionExpression xsi:type="bpmn:tFormalExpression"{attrs}>{escape(condition)}'
            "</bpmn:conditionExpression></bpmn:sequenceFlow>")


def chain(*ids: str) -> list[str]:
    return [flow(a, b) for a, b in zip(ids, ids[1:])]


def process(pid: str, elements: list[str], executable: str | None = "true", lanes: dict[str, list[str]] | None = None
            ) -> str:
    lane_set = ""
    if lanes:
        lane_set = f'<bpmn:laneSet id="LaneSet_{pid}">' + "".join(
            f'<bpmn:lane id="{lane}" name="{lane.title()}">' + "".join(f"<bpmn:flowNodeRef>{n}</bpmn:flowNodeRef>"
                                                                        for n in nodes) + "</bpmn:lane>"
            for lane, nodes in lanes.items()) + "</bpmn:laneSet>"
    flag = f' isExecutable="{executable}"' if executable is not None else ""
    return f'<bpmn:process id="{pid}"{flag}>{lane_set}' + "".join(elements) + "</bpmn:process>"


def export(tmp_path: Path, name: str, processes: list[str], *, dialect: str = "camunda7", di: bool = True,
           extra: str = "", positions: dict[str, int] | None = None, encoding: str = "UTF-8") -> Path:
    """Write a file as the dialect's modeler does: its root, the bpmn:incoming / bpmn:outgoing
    children Camunda writes, a diagram section (shapes and edges) when ``di``; ``positions``
    gives shapes their y (SpiffWorkflow orders an XOR gateway's flows by it)."""
    xml = (f'<?xml version="1.0" encoding="{encoding}"?>\n<bpmn:definitions xmlns:bpmn="{BPMN}" '
           'xmlns:bpmndi="http://www.omg.org/spec/BPMN/20100524/DI" xmlns:dc="http://www.omg.org/spec/DD/20100524/DC" '
           'xmlns:di="http://www.omg.org/spec/DD/20100524/DI" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
           f'id="Definitions_{name}" {DIALECTS[dialect]}>' + extra + "".join(processes) + "</bpmn:definitions>")
    root = etree.fromstring(xml.encode(encoding))
    _connect(root)
    if di:
        _diagram(root, positions or {})
    text = etree.tostring(root, encoding="unicode", pretty_print=True)
    if dialect == "bpmn2":
        text = text.replace("<bpmn:", "<bpmn2:").replace("</bpmn:", "</bpmn2:").replace("xmlns:bpmn=", "xmlns:bpmn2=") \
            .replace('"bpmn:tFormal', '"bpmn2:tFormal')
    elif dialect == "signavio":
        text = text.replace("<bpmn:", "<").replace("</bpmn:", "</").replace("xmlns:bpmn=", "xmlns=") \
            .replace('"bpmn:tFormal', '"tFormal')
    path = tmp_path / f"{name}.bpmn"
    path.write_bytes(f'<?xml version="1.0" encoding="{encoding}"?>\n{text}'.encode(encoding))
    return path


def _connect(root: Any) -> None:
    """bpmn:incoming / bpmn:outgoing children, where the schema puts them (after extensionElements)."""
    for seq in root.iter(f"{{{BPMN}}}sequenceFlow"):
        scope = seq.getparent()
        for attr, tag in (("sourceRef", "outgoing"), ("targetRef", "incoming")):
            node = next((n for n in scope if n.get("id") == seq.get(attr)), None)
            if node is None:
                continue
            ref = etree.Element(f"{{{BPMN}}}{tag}")
            ref.text = seq.get("id")
            head = [c for c in node if c.tag in (f"{{{BPMN}}}documentation", f"{{{BPMN}}}extensionElements",
                                                 f"{{{BPMN}}}incoming")]
            node.insert(len(head) if tag == "outgoing" or not head else node.index(head[-1]) + 1, ref)


def _diagram(root: Any, positions: dict[str, int]) -> None:
    di, dc = "http://www.omg.org/spec/BPMN/20100524/DI", "http://www.omg.org/spec/DD/20100524/DC"
    owner = root.find(f"{{{BPMN}}}collaboration")
    owner = owner if owner is not None else root.find(f"{{{BPMN}}}process")
    plane = etree.SubElement(etree.SubElement(root, f"{{{di}}}BPMNDiagram", id="BPMNDiagram_1"),
                             f"{{{di}}}BPMNPlane", id="BPMNPlane_1", bpmnElement=owner.get("id"))
    x = 150
    for el in root.iter():
        eid = el.get("id")
        if not isinstance(el.tag, str) or not eid or not etree.QName(el).localname.endswith(_NODE_TAGS):
            continue
        shape = etree.SubElement(plane, f"{{{di}}}BPMNShape", id=f"{eid}_di", bpmnElement=eid)
        etree.SubElement(shape, f"{{{dc}}}Bounds", x=str(x), y=str(positions.get(eid, 100)), width="100", height="80")
        x += 150
    for seq in root.iter(f"{{{BPMN}}}sequenceFlow"):
        edge = etree.SubElement(plane, f"{{{di}}}BPMNEdge", id=f"{seq.get('id')}_di", bpmnElement=seq.get("id"))
        for px in ("0", "50"):
            etree.SubElement(edge, "{http://www.omg.org/spec/DD/20100524/DI}waypoint", x=px, y="140")


# ----- running it -------------------------------------------------------------------------------

def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_json(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = cli("run", str(path), "--json", "--store", "memory://", *args)
    assert "Traceback" not in result.stderr, result.stderr
    return result.exit_code, json.loads(result.stdout)


def codes(path: Path, **kw: Any) -> list[str]:
    return [p.code for p in validate_process(path, discover_config=False, **kw).problems]


# ----- files that run as under plain SpiffWorkflow ---------------------------------------------------

def _camunda7(tmp_path: Path) -> Path:
    """A Camunda 7 export: forms, assignees and properties on a user task (which waits for a
    person here too), a Python script, a Python XOR condition, a full diagram."""
    return export(tmp_path, "invoice", [process("Process_invoice", [
        start("StartEvent_1", ""), script("Activity_total", "total = 1500"),
        xor("Gateway_amount", "Flow_Gateway_amount_Activity_book"),
        '<bpmn:userTask id="Activity_approve" name="Approve" camunda:formKey="camunda-forms:deployment:approve.form" '
        'camunda:assignee="demo" camunda:candidateGroups="accounting"><bpmn:extensionElements><camunda:properties>'
        '<camunda:property name="priority" value="high" /></camunda:properties></bpmn:extensionElements></bpmn:userTask>',
        script("Activity_book", "booked = True"), end(),
        *chain("StartEvent_1", "Activity_total", "Gateway_amount"),
        flow("Gateway_amount", "Activity_approve", "total > 1000"), flow("Gateway_amount", "Activity_book"),
        *chain("Activity_approve", "Activity_book", "EndEvent_1")])])


def _zeebe(tmp_path: Path) -> Path:
    return export(tmp_path, "order", [process("order_process", [
        start(), script("check", "qty = 2\ndoubled = qty * 2"),
        '<bpmn:userTask id="ship" name="Ship"><bpmn:extensionElements><zeebe:formDefinition formKey="ship-form" />'
        '<zeebe:assignmentDefinition assignee="demo" candidateGroups="ops" /><zeebe:taskHeaders>'
        '<zeebe:header key="k" value="v" /></zeebe:taskHeaders></bpmn:extensionElements></bpmn:userTask>',
        end(), *chain("StartEvent_1", "check", "ship", "EndEvent_1")])], dialect="zeebe")


def _prefixed(dialect: str, di: bool) -> Callable[[Path], Path]:
    """A script at column 0 in CDATA, an XOR with a ``language`` on its conditions, a manual task."""
    def build(tmp_path: Path) -> Path:
        return export(tmp_path, f"review_{dialect}", [process("review", [
            start(), '<bpmn:scriptTask id="score" name="Score" scriptFormat="python" completionQuantity="1">'
            '<bpmn:script><![CDATA[score = 7\nif score > 5:\n    grade = "high"\nelse:\n    grade = "low"\n]]>'
            "</bpmn:script></bpmn:scriptTask>",
            '<bpmn:exclusiveGateway id="graded" gatewayDirection="Diverging" />',
            '<bpmn:manualTask id="check" name="Check by hand" />', end(),
            *chain("StartEvent_1", "score", "graded"),
            flow("graded", "check", 'grade == "high"', ' language="http://www.python.org"'),
            flow("graded", "EndEvent_1", 'grade != "high"', ' language="http://www.python.org"'),
            flow("check", "EndEvent_1")])], dialect=dialect, di=di)
    return build


def _pools(tmp_path: Path) -> Path:
    """Two pools with lanes and a message flow between them; each pool's process runs alone."""
    return export(tmp_path, "pools", [process("Process_customer", [
        start("Start_c"), '<bpmn:sendTask id="send_order" messageRef="Message_order" />', script("note", "sent = True"),
        end("End_c"), *chain("Start_c", "send_order", "note", "End_c")],
        lanes={"buyer": ["Start_c", "send_order", "note", "End_c"]}),
        process("Process_shop", [
            start("Start_s"), '<bpmn:intermediateCatchEvent id="receive"><bpmn:messageEventDefinition '
            'messageRef="Message_order" /></bpmn:intermediateCatchEvent>', script("pack", "packed = True"),
            end("End_s"), *chain("Start_s", "receive", "pack", "End_s")],
            lanes={"sales": ["Start_s", "receive"], "ops": ["pack", "End_s"]})],
        extra='<bpmn:collaboration id="Collaboration_1"><bpmn:participant id="Participant_customer" name="Customer" '
              'processRef="Process_customer" /><bpmn:participant id="Participant_shop" name="Shop" '
              'processRef="Process_shop" /><bpmn:messageFlow id="MessageFlow_order" sourceRef="send_order" '
              'targetRef="receive" /></bpmn:collaboration><bpmn:message id="Message_order" name="order" />')


def _artifacts(tmp_path: Path) -> Path:
    """Data objects and a data store with references, a text annotation, an association, a group."""
    return export(tmp_path, "artifacts", [process("artifacts", [
        start(), '<bpmn:scriptTask id="fill" scriptFormat="python"><bpmn:dataOutputAssociation id="out_assoc">'
        "<bpmn:targetRef>order_ref</bpmn:targetRef></bpmn:dataOutputAssociation>"
        '<bpmn:script>order = {"n": 1}</bpmn:script></bpmn:scriptTask>',
        '<bpmn:dataObjectReference id="order_ref" name="Order" dataObjectRef="order" />', '<bpmn:dataObject id="order" />',
        '<bpmn:dataStoreReference id="crm_ref" name="CRM" />',
        '<bpmn:scriptTask id="use" scriptFormat="python"><bpmn:property id="use_prop" name="__targetRef_placeholder" />'
        '<bpmn:dataInputAssociation id="in_assoc"><bpmn:sourceRef>order_ref</bpmn:sourceRef>'
        "<bpmn:targetRef>use_prop</bpmn:targetRef></bpmn:dataInputAssociation>"
        '<bpmn:script>n = order["n"] + 1</bpmn:script></bpmn:scriptTask>', end(),
        *chain("StartEvent_1", "fill", "use", "EndEvent_1"),
        '<bpmn:textAnnotation id="note"><bpmn:text>Orders &amp; more</bpmn:text></bpmn:textAnnotation>',
        '<bpmn:association id="note_assoc" sourceRef="fill" targetRef="note" />',
        '<bpmn:group id="stage" categoryValueRef="stage_value" />'])],
        extra='<bpmn:category id="stages"><bpmn:categoryValue id="stage_value" value="Stage 1" /></bpmn:category>')


def _implicit_merge(tmp_path: Path) -> Path:
    """Two XOR paths meet at a task, no merging gateway."""
    return export(tmp_path, "merge", [process("merge", [
        start(), script("prepare", "x = 5"), xor("pick", "Flow_pick_small"), script("big", "size = 'big'"),
        script("small", "size = 'small'"), script("after", "done = size + '!'"), end(),
        *chain("StartEvent_1", "prepare", "pick"), flow("pick", "big", "x > 3"), flow("pick", "small"),
        flow("big", "after"), flow("small", "after"), *chain("after", "EndEvent_1")])], di=False)


def _diagram_order(tmp_path: Path) -> Path:
    """Both conditions hold: SpiffWorkflow takes the flow whose target is higher in the diagram."""
    return export(tmp_path, "order_by_y", [process("order_by_y", [
        start(), script("prepare", "x = 5"), xor("pick", "Flow_pick_other"), script("low", "took = 'low'"),
        script("high", "took = 'high'"), script("other", "took = 'other'"), end(),
        *chain("StartEvent_1", "prepare", "pick"), flow("pick", "low", "x > 1"), flow("pick", "high", "x > 2"),
        flow("pick", "other"), flow("low", "EndEvent_1"), flow("high", "EndEvent_1"), flow("other", "EndEvent_1")])],
        positions={"low": 400, "high": 50, "other": 600})


def _start_split(tmp_path: Path) -> Path:
    """A start event with two outgoing flows (an implicit parallel split); the paths meet at a task
    (an implicit merge), which runs once for each, as in SpiffWorkflow, each with its path's data."""
    return export(tmp_path, "start_split", [process("start_split", [
        start(), script("left", "side = 'left'"), script("right", "side = 'right'"),
        script("count", "runs = globals().get('runs', 0) + 1\nseen = side"), end(),
        flow("StartEvent_1", "left"), flow("StartEvent_1", "right"), flow("left", "count"), flow("right", "count"),
        flow("count", "EndEvent_1")])])


def _bom_crlf(path: Path) -> Path:
    """A UTF-8 byte order mark and Windows line ends, as some Windows tools save."""
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes().replace(b"\n", b"\r\n"))
    return path


def _colored(path: Path) -> Path:
    """bpmn.io's colors on the diagram shapes (bioc: and the OMG color extension)."""
    text = path.read_text(encoding="utf-8").replace(
        "<bpmndi:BPMNShape ", '<bpmndi:BPMNShape bioc:stroke="#1e88e5" bioc:fill="#bbdefb" color:background-color="#bbdefb" ')
    text = text.replace("<bpmn:definitions ", '<bpmn:definitions xmlns:bioc="http://bpmn.io/schema/bpmn/biocolor/1.0" '
                        'xmlns:color="http://www.omg.org/spec/BPMN/non-normative/color/1.0" ', 1)
    path.write_text(text, encoding="utf-8")
    return path


def _called(tmp_path: Path) -> Path:
    """A Camunda 7 call activity passing every variable in and out (camunda:in / camunda:out)."""
    return export(tmp_path, "caller", [process("caller", [
        start(), script("prepare", "x = 1"), '<bpmn:callActivity id="call" calledElement="callee"><bpmn:extensionElements>'
        '<camunda:in variables="all" /><camunda:out variables="all" /></bpmn:extensionElements></bpmn:callActivity>',
        end(), *chain("StartEvent_1", "prepare", "call", "EndEvent_1")]),
        process("callee", [start("callee_start"), script("callee_work", "r = x + 1"), end("callee_end"),
                           *chain("callee_start", "callee_work", "callee_end")])])


def _ending(name: str, definition: str, extra: str = "") -> Callable[[Path], Path]:
    return lambda p: export(p, name, [process(name, [
        start(), script("work", "a = 1"), end("EndEvent_1", definition), *chain("StartEvent_1", "work", "EndEvent_1")])],
        extra=extra)


CONFORM: dict[str, tuple[Callable[[Path], Path], dict[str, Any], list[str]]] = {
    # name: (builder, person's answers by task id, validate's warning codes). A data object's value
    # stays in the context (plain SpiffWorkflow moves it out of task data, into the workflow's).
    "camunda 7 export with forms and full DI": (_camunda7, {"Activity_approve": {"ok": True}}, ["form_schema_missing"]),
    "camunda 8 (zeebe) export": (_zeebe, {"ship": {"shipped": True}}, []),
    "bpmn2: prefix, no DI": (_prefixed("bpmn2", False), {"check": {}}, []),
    "default namespace (Signavio), with DI": (_prefixed("signavio", True), {"check": {}}, []),
    "data objects, data store, annotation, association, group": (_artifacts, {}, []),
    "implicit merge after an XOR": (_implicit_merge, {}, []),
    "XOR flows ordered by the diagram": (_diagram_order, {}, []),
    "timer PT0S, quoted": (lambda p: export(p, "pause", [process("pause", [
        start(), timer("wait", "timeDuration", '"PT0S"'), script("after", "waited = True"), end(),
        *chain("StartEvent_1", "wait", "after", "EndEvent_1")])]), {}, []),
    "timer start event, a date in the past": (lambda p: export(p, "dated", [process("dated", [
        timer("StartEvent_1", "timeDate", '"2020-01-01T00:00:00Z"', "startEvent"), script("go", "went = True"), end(),
        *chain("StartEvent_1", "go", "EndEvent_1")])]), {}, []),
    "an end event with no incoming flow": (lambda p: export(p, "orphan", [process("orphan", [
        start(), script("work", "a = 1"), end(), end("EndEvent_unused"), *chain("StartEvent_1", "work", "EndEvent_1")])]),
        {}, ["unreachable"]),
    "a condition on the one flow out of a task": (lambda p: export(p, "cond_task", [process("cond_task", [
        start(), script("work", "amount = 5"), script("next", "b = 2"), end(), flow("StartEvent_1", "work"),
        flow("work", "next", "amount > 1000000"), flow("next", "EndEvent_1")])]), {}, ["condition_ignored"]),
    "a condition on a flow out of a parallel gateway": (lambda p: export(p, "cond_fork", [process("cond_fork", [
        start(), script("work", "amount = 5"), '<bpmn:parallelGateway id="fork" />', script("left", "b = 1"),
        script("right", "c = 1"), '<bpmn:parallelGateway id="join" />', end(),
        *chain("StartEvent_1", "work", "fork"), flow("fork", "left", "amount > 1000000"), flow("fork", "right"),
        flow("left", "join"), flow("right", "join"), flow("join", "EndEvent_1")])]), {}, ["condition_ignored"]),
    "a condition on the one flow out of a start event": (lambda p: export(p, "cond_start", [process("cond_start", [
        start(), script("work", "a = 1"), end(), flow("StartEvent_1", "work", "False"), flow("work", "EndEvent_1")])]),
        {}, ["condition_ignored"]),
    "a task with no outgoing flow beside the main path": (lambda p: export(p, "dead_end", [process("dead_end", [
        start(), script("main", "a = 1"), script("side", "b = 2"), end(), flow("StartEvent_1", "main"),
        flow("StartEvent_1", "side"), flow("main", "EndEvent_1")])]), {}, ["no_outgoing_flow"]),
    "a transaction and a milestone (none) throw event": (lambda p: export(p, "tx", [process("tx", [
        start(), '<bpmn:intermediateThrowEvent id="milestone" name="Reached" />',
        '<bpmn:transaction id="tx_block"><bpmn:startEvent id="tx_start" />' + script("tx_work", "t = 1")
        + '<bpmn:endEvent id="tx_end" />' + "".join(chain("tx_start", "tx_work", "tx_end")) + "</bpmn:transaction>",
        end(), *chain("StartEvent_1", "milestone", "tx_block", "EndEvent_1")])]), {}, []),
    "UTF-8 byte order mark, CRLF, non-ASCII names": (lambda p: _bom_crlf(export(p, "windows", [process("windows", [
        start(), '<bpmn:scriptTask id="check" name="Prüfen – 审核"><bpmn:documentation>Doku äöü</bpmn:documentation>'
        '<bpmn:script>name = "Jürgen"\nok = True</bpmn:script></bpmn:scriptTask>', end(),
        *chain("StartEvent_1", "check", "EndEvent_1")])])), {}, []),
    "bpmn.io colors on the diagram": (lambda p: _colored(export(p, "colors", [process("colors", [
        start(), script("work", "a = 1"), end(), *chain("StartEvent_1", "work", "EndEvent_1")])])), {}, []),
    "nested lanes (childLaneSet)": (lambda p: export(p, "lanes", [process("lanes", [
        '<bpmn:laneSet id="lanes_set"><bpmn:lane id="team" name="Team"><bpmn:flowNodeRef>StartEvent_1</bpmn:flowNodeRef>'
        '<bpmn:childLaneSet id="team_lanes"><bpmn:lane id="reviewers" name="Reviewers"><bpmn:flowNodeRef>review'
        "</bpmn:flowNodeRef><bpmn:flowNodeRef>EndEvent_1</bpmn:flowNodeRef></bpmn:lane></bpmn:childLaneSet></bpmn:lane>"
        "</bpmn:laneSet>", start(), '<bpmn:userTask id="review" name="Review" />', end(),
        *chain("StartEvent_1", "review", "EndEvent_1")])]), {"review": {"ok": True}}, []),
    "camunda 7 call activity with camunda:in / camunda:out": (_called, {}, []),
    "multi-instance by cardinality": (lambda p: export(p, "thrice", [process("thrice", [
        start(), '<bpmn:scriptTask id="each"><bpmn:multiInstanceLoopCharacteristics><bpmn:loopCardinality '
        'xsi:type="bpmn:tFormalExpression">3</bpmn:loopCardinality></bpmn:multiInstanceLoopCharacteristics>'
        "<bpmn:script>seen = 1</bpmn:script></bpmn:scriptTask>", end(), *chain("StartEvent_1", "each", "EndEvent_1")])]),
        {}, []),
    "inclusive gateway with a default flow": (lambda p: export(p, "inclusive", [process("inclusive", [
        start(), script("prepare", "amount = 5"), '<bpmn:inclusiveGateway id="split" default="Flow_split_other" />',
        script("big", "b = 1"), script("other", "c = 1"), '<bpmn:inclusiveGateway id="merge" />', end(),
        *chain("StartEvent_1", "prepare", "split"), flow("split", "big", "amount > 1"), flow("split", "other"),
        flow("big", "merge"), flow("other", "merge"), flow("merge", "EndEvent_1")])]), {}, []),
    "a non-interrupting message event sub-process beside a user task": (lambda p: export(p, "side", [process("side", [
        start(), '<bpmn:userTask id="work" />', end(), *chain("StartEvent_1", "work", "EndEvent_1"),
        '<bpmn:subProcess id="on_poke" triggeredByEvent="true"><bpmn:startEvent id="poked" isInterrupting="false">'
        '<bpmn:messageEventDefinition messageRef="Message_poke" /></bpmn:startEvent>' + script("note", "n = 1")
        + '<bpmn:endEvent id="poke_end" />' + "".join(chain("poked", "note", "poke_end")) + "</bpmn:subProcess>"])],
        extra='<bpmn:message id="Message_poke" name="poke" />'), {"work": {}}, []),
    "terminate end event": (_ending("terminate", "<bpmn:terminateEventDefinition />"), {}, []),
    "escalation end event without a ref": (_ending("escalate", "<bpmn:escalationEventDefinition />"), {}, []),
    "signal end event nobody catches": (_ending("signal", '<bpmn:signalEventDefinition signalRef="Signal_done" />',
                                                '<bpmn:signal id="Signal_done" name="done" />'), {}, []),
    "isExecutable missing": (lambda p: export(p, "unset", [process("unset", [
        start(), script("work", "a = 1"), end(), *chain("StartEvent_1", "work", "EndEvent_1")], executable=None)]),
        {}, ["process_executable_unset"]),
    "scriptFormat JavaScript, but Python text": (lambda p: export(p, "js_like", [process("js_like", [
        start(), script("work", "total = 2 * 21", 'scriptFormat="JavaScript"'), end(),
        *chain("StartEvent_1", "work", "EndEvent_1")])]), {}, ["script_language"]),
    "camunda:resultVariable on a script": (lambda p: export(p, "result_var", [process("result_var", [
        start(), script("work", "x = 2", 'scriptFormat="python" camunda:resultVariable="y"'), end(),
        *chain("StartEvent_1", "work", "EndEvent_1")])]), {}, ["foreign_extension"]),
}


@pytest.mark.parametrize("name", list(CONFORM))
def test_a_modeler_export_runs_as_under_plain_spiffworkflow(tmp_path: Path, name: str) -> None:
    build, answers, warnings = CONFORM[name]
    path = build(tmp_path)
    report = validate_process(path, discover_config=False)
    assert report.ok and sorted(p.code for p in report.problems) == sorted(warnings), report.format_report()

    plain_wf, plain_vars = run_plain(path, {}, answers)
    engine = Engine()
    instance = engine.run(engine.start(load_process(path)), answers={"user_tasks": answers})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    data_objects = {k: v for k, v in plain_wf.data_objects.items()}
    assert variables(instance.main) == {**plain_vars, **data_objects}

    code, doc = run_json(path, *(["--answers", _answers_file(tmp_path, answers)] if answers else []))
    assert (code, doc["status"], doc["error"]) == (0, "completed", None)
    assert {k: v for k, v in doc["layers"]["L3"].items() if k in plain_vars} == plain_vars


def _answers_file(tmp_path: Path, answers: dict[str, Any]) -> str:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps({"user_tasks": answers}), encoding="utf-8")
    return str(path)


def test_a_timer_of_one_second_waits_on_the_engine_clock(tmp_path: Path) -> None:
    path = export(tmp_path, "second", [process("second", [
        start(), timer("wait", "timeDuration", '"PT1S"'), script("after", "waited = True"), end(),
        *chain("StartEvent_1", "wait", "after", "EndEvent_1")])])
    clock = _Clock()
    engine = Engine(clock=clock)
    instance = run_ours(path, engine=engine)
    assert instance.status == "waiting"
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("timer", "wait")]
    clock.now += 2
    instance = engine.resume(engine.load(instance.id))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"waited": True}


def test_a_start_event_with_two_flows_gives_each_path_its_own_context(tmp_path: Path) -> None:
    """BPMN's implicit parallel split. SpiffWorkflow gives each path data of its own, and the task
    where they meet (an implicit merge) runs once per path; under layerflow both paths once shared
    one context, so the second run of ``count`` saw the first's ``runs`` and the other path's key."""
    path = _start_split(tmp_path)
    plain_wf, plain_vars = run_plain(path, {}, {})
    instance = run_ours(path)

    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert path_of(plain_wf).count("count") == 2
    assert variables(instance.main) == plain_vars == {"left": True, "right": True, "runs": 1, "saw_both": False}
    assert sorted(info["branch_id"] for info in instance.branches.values()) == ["left", "right"]


def _start_split(tmp_path: Path, left: str = "left = True", right: str = "right = True") -> Path:
    return export(tmp_path, "start_split", [process("start_split", [
        start(), script("left", left), script("right", right),
        script("count", "runs = globals().get('runs', 0) + 1\nsaw_both = 'left' in globals() and 'right' in globals()"),
        end(), flow("StartEvent_1", "left"), flow("StartEvent_1", "right"), flow("left", "count"),
        flow("right", "count"), flow("count", "EndEvent_1")])])


def test_paths_of_an_implicit_split_that_write_one_key_differently_are_a_listed_conflict(tmp_path: Path) -> None:
    """Where plain SpiffWorkflow keeps the last path's value silently, layerflow's join (here the
    process end) lists the conflict and asks, as at any parallel join (README, "Gateways")."""
    path = _start_split(tmp_path, "side = 'left'\nleft = True", "side = 'right'\nright = True")
    plain_wf, plain_vars = run_plain(path, {}, {})
    engine = Engine()
    instance = run_ours(path, engine=engine)

    assert plain_vars["side"] == "right"
    assert instance.status == "waiting"
    assert [(c["key"], c["values"]) for c in instance.conflicts] == [("side", {"left": "left", "right": "right"})]
    instance = engine.answer_confirmation(instance, instance.waiting_for[0]["id"], "left")
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain_wf)
    assert variables(instance.main) == {**plain_vars, "side": "left"}


# ----- a collaboration: which pool to run ------------------------------------------------------------

def test_two_pools_that_exchange_a_message_run_together_as_their_collaboration(tmp_path: Path) -> None:
    """No process named: the pools a message flow joins run as one instance (engine.collaboration),
    the customer's send task delivering its message to the shop's catch event."""
    path = _pools(tmp_path)
    result = cli("validate", str(path))
    assert result.exit_code == 0 and "'Collaboration_1'" in result.stdout, result.stdout
    code, doc = run_json(path)
    assert (code, doc["status"], doc["process_id"]) == (0, "completed", "Collaboration_1"), doc["error"]
    assert {k: v for k, v in doc["layers"]["L3"].items() if ":" not in k} == {"sent": True, "packed": True}
    assert load_process(path).id == "Collaboration_1"


def test_pools_that_exchange_no_message_need_a_process_id_naming_both_and_the_collaboration(tmp_path: Path) -> None:
    path = _pools(tmp_path)
    text = path.read_text()
    path.write_text(text[:text.index('<bpmn:messageFlow')] + text[text.index('</bpmn:collaboration>'):])
    result = cli("validate", str(path))
    assert result.exit_code == 2
    assert all(w in result.stdout for w in (str(path), "'Process_customer' (pool 'Customer')",
                                              "'Process_shop' (pool 'Shop')", "--process ID",
                                              "'Collaboration_1' to run its pools together")), result.stdout
    code, doc = run_json(path)
    assert (code, doc["status"], doc["error"]["kind"]) == (2, "error", "invalid_process")
    assert "--process ID" in doc["error"]["message"]
    with pytest.raises(ProcessError, match="process_id="):
        load_process(path)


@pytest.mark.parametrize(("wrong", "says"), [
    ("Participant_shop", "'Participant_shop' is the pool (participant) of process 'Process_shop'"),
])
def test_a_pool_id_given_as_the_process_says_which_process_it_is(
        tmp_path: Path, wrong: str, says: str) -> None:
    result = cli("validate", str(_pools(tmp_path)), "--process", wrong)
    assert result.exit_code == 2 and says in result.stdout, result.stdout


def test_each_pool_of_a_collaboration_runs_alone(tmp_path: Path) -> None:
    """The message flow joins nothing inside one instance: the customer's send task completes
    (as in plain SpiffWorkflow), the shop's catch waits until the message is sent to it."""
    path = _pools(tmp_path)
    plain_wf, plain_vars = run_plain(path, {}, {})  # the first executable process: the customer's
    engine = Engine()
    customer = engine.run(engine.start(load_process(path, "Process_customer")))
    assert customer.status == "completed", customer.error
    assert path_of(customer.workflow) == path_of(plain_wf)
    assert variables(customer.main) == plain_vars == {"sent": True}

    code, doc = run_json(path, "--process", "Process_shop")
    assert (code, doc["status"], doc["process_id"]) == (3, "waiting", "Process_shop")
    assert [(w["kind"], w["task_id"], w["event"]) for w in doc["waiting_for"]] == [("event", "receive", "order")]
    shop = engine.run(engine.start(load_process(path, "Process_shop")))
    shop = engine.send_event(shop, "order", {"item": "book"})
    assert shop.status == "completed", shop.error
    assert variables(shop.main) == {"item": "book", "packed": True}


# ----- refused, with what to write instead --------------------------------------------------------------

def _one(name: str, elements: list[str], **kw: Any) -> Callable[[Path], Path]:
    return lambda tmp_path: export(tmp_path, name, [process(name, elements)], **kw)


def _xor_on(condition: str) -> Callable[[Path], Path]:
    return _one("juel", [start(), script("prepare", "amount = 5000\napproved = True"), xor("Gateway_1", "Flow_Gateway_1_small"),
                         script("big", "size = 'big'"), script("small", "size = 'small'"), end(),
                         *chain("StartEvent_1", "prepare", "Gateway_1"), flow("Gateway_1", "big", condition),
                         flow("Gateway_1", "small"), flow("big", "EndEvent_1"), flow("small", "EndEvent_1")])


def _around(node: str, node_id: str = "wait") -> Callable[[Path], Path]:
    return _one("around", [start(), script("prepare", "ready = True\ni = 0"), node, end(),
                           *chain("StartEvent_1", "prepare", node_id, "EndEvent_1")])


REFUSED: dict[str, tuple[Callable[[Path], Path], str, str | None, str, list[str]]] = {
    # name: (builder, code, element id, field, words of the message); plain SpiffWorkflow fails
    # on each of these too (or, for "End", silently skips the task)
    "JUEL condition": (_xor_on("${amount > 1000}"), "condition_syntax", "Flow_Gateway_1_big",
                       "conditionExpression", ["JUEL", "write 'amount > 1000'"]),
    "JUEL condition with && (once taken for a sentence)": (
        _xor_on('${amount > 1000 && approved == true}'), "condition_syntax", "Flow_Gateway_1_big", "conditionExpression",
        ["JUEL", "write 'amount > 1000 and approved == True'"]),
    "FEEL condition with words (once taken for a sentence)": (
        _xor_on("=amount > 1000 and approved"), "condition_syntax", "Flow_Gateway_1_big", "conditionExpression",
        ["FEEL", "write 'amount > 1000 and approved'"]),
    "javascript script": (_one("js", [start(), script("calc", "var total = a + b;", 'scriptFormat="javascript"'), end(),
                                      *chain("StartEvent_1", "calc", "EndEvent_1")]),
                          "script_language", "calc", "scriptFormat", ["scriptFormat='javascript'", "Python"]),
    "groovy script": (_one("groovy", [start(), script("calc", "def total = 1500", 'scriptFormat="groovy"'), end(),
                                      *chain("StartEvent_1", "calc", "EndEvent_1")]),
                      "script_language", "calc", "scriptFormat", ["scriptFormat='groovy'", 'scriptFormat="python"']),
    "script indented in CDATA": (_one("indented", [
        start(), '<bpmn:scriptTask id="calc" scriptFormat="python"><bpmn:script><![CDATA[\n        total = 1\n'
        "        ok = True\n      ]]></bpmn:script></bpmn:scriptTask>", end(), *chain("StartEvent_1", "calc", "EndEvent_1")]),
        "script_syntax", "calc", "script", ["unexpected indent", "column 0"]),
    "timer PT1S unquoted": (_around(timer("wait", "timeDuration", "PT1S")), "timer_expression", "wait", "timeDuration",
                            ['"PT1S"']),
    "timer start date unquoted": (_one("dated", [timer("StartEvent_1", "timeDate", "2020-01-01T00:00:00Z", "startEvent"),
                                                 script("go", "went = True"), end(),
                                                 *chain("StartEvent_1", "go", "EndEvent_1")]),
                                  "timer_expression", "StartEvent_1", "timeDate", ['"2020-01-01T00:00:00Z"']),
    "timer start cycle unquoted": (_one("cycle", [timer("StartEvent_1", "timeCycle", "R/PT1H", "startEvent"),
                                                  script("go", "went = True"), end(),
                                                  *chain("StartEvent_1", "go", "EndEvent_1")]),
                                   "timer_expression", "StartEvent_1", "timeCycle", ['"R/PT1H"']),
    "conditional event in JUEL": (_around('<bpmn:intermediateCatchEvent id="wait"><bpmn:conditionalEventDefinition>'
                                          '<bpmn:condition xsi:type="bpmn:tFormalExpression">${ready}</bpmn:condition>'
                                          "</bpmn:conditionalEventDefinition></bpmn:intermediateCatchEvent>"),
                                  "condition_syntax", "wait", "condition", ["write 'ready'"]),
    "loop condition in JUEL": (_around('<bpmn:scriptTask id="wait"><bpmn:standardLoopCharacteristics><bpmn:loopCondition '
                                       'xsi:type="bpmn:tFormalExpression">${i &gt;= 3}</bpmn:loopCondition>'
                                       "</bpmn:standardLoopCharacteristics><bpmn:script>i += 1</bpmn:script></bpmn:scriptTask>"),
                               "condition_syntax", "wait", "loopCondition", ["write 'i >= 3'"]),
    "loop cardinality in JUEL": (_around('<bpmn:scriptTask id="wait"><bpmn:multiInstanceLoopCharacteristics>'
                                         '<bpmn:loopCardinality xsi:type="bpmn:tFormalExpression">${3}</bpmn:loopCardinality>'
                                         "</bpmn:multiInstanceLoopCharacteristics><bpmn:script>seen = 1</bpmn:script>"
                                         "</bpmn:scriptTask>"),
                                 "condition_syntax", "wait", "loopCardinality", ["write '3'"]),
    'a start event with id="Start"': (_one("start_id", [start("Start"), script("work", "a = 1"), end(),
                                                        *chain("Start", "work", "EndEvent_1")]),
                                      "reserved_id", "Start", "id", ["rename it", "StartEvent_1"]),
    'an end event with id="End"': (_one("end_id", [start(), script("work", "a = 1"), end("End"),
                                                    *chain("StartEvent_1", "work", "End")]),
                                    "reserved_id", "End", "id", ["rename it"]),
    "a task with the id <process>.EndJoin": (_one("ej", [start(), script("ej.EndJoin", "a = 1"), end(),
                                                         *chain("StartEvent_1", "ej.EndJoin", "EndEvent_1")]),
                                             "reserved_id", "ej.EndJoin", "id", ["rename it"]),
    "implicit parallel split out of a task": (_one("fork", [
        start(), script("work", "a = 1"), script("left", "b = 1"), script("right", "c = 1"), end("End_l"), end("End_r"),
        *chain("StartEvent_1", "work", "left", "End_l"), *chain("work", "right", "End_r")]),
        "implicit_split", "work", None, ["'Flow_work_left' to 'left'", "parallel gateway"]),
    "conditional and default flows out of a task": (lambda p: export(p, "choice", [process("choice", [
        start(), script("work", "a = 5").replace('id="work"', 'id="work" default="Flow_work_right"'),
        script("left", "b = 1"), script("right", "c = 1"), end("End_l"), end("End_r"), flow("StartEvent_1", "work"),
        flow("work", "left", "a > 3"), flow("work", "right"), *chain("left", "End_l"), *chain("right", "End_r")])]),
        "implicit_split", "work", None, ["conditional or default flows", "exclusive gateway"]),
    "business rule task (Camunda decisionRef, no DMN)": (_one("decide", [
        start(), '<bpmn:businessRuleTask id="dish" camunda:decisionRef="dish" camunda:resultVariable="dish" />', end(),
        *chain("StartEvent_1", "dish", "EndEvent_1")]),
        "business_rule_without_dmn", "dish", "calledDecisionId", ["decision 'dish'", "no DMN file given or beside",
                                                                   "DECISION.dmn"]),
    "ad-hoc sub-process (SpiffWorkflow 3.2 cannot run one to its end)": (_one("adhoc", [
        start(), '<bpmn:adHocSubProcess id="pick"><bpmn:task id="one" /></bpmn:adHocSubProcess>', end(),
        *chain("StartEvent_1", "pick", "EndEvent_1")]),
        "unsupported_element", "pick", None, ["ad-hoc", "exclusive gateway"]),
    "zeebe call activity (no calledElement)": (lambda p: export(p, "caller", [process("caller", [
        start(), '<bpmn:callActivity id="call"><bpmn:extensionElements><zeebe:calledElement processId="callee" '
        'propagateAllChildVariables="false" /></bpmn:extensionElements></bpmn:callActivity>', end(),
        *chain("StartEvent_1", "call", "EndEvent_1")]), process("callee", [
            start("callee_start"), script("callee_work", "r = 1"), end("callee_end"),
            *chain("callee_start", "callee_work", "callee_end")], executable="false")], dialect="zeebe"),
        "call_activity_unknown_process", "call", "calledElement", ["processId='callee'", 'calledElement="callee"']),
    "complex gateway": (_one("complex", [
        start(), '<bpmn:complexGateway id="choose" />', script("work", "a = 1"), end(),
        *chain("StartEvent_1", "choose", "work", "EndEvent_1")]),
        "unsupported_element", "choose", None, ["no complex gateway", "inclusive gateway"]),
    'isExecutable="false"': (lambda p: export(p, "draft", [process("draft", [
        start(), script("work", "a = 1"), end(), *chain("StartEvent_1", "work", "EndEvent_1")], executable="false")]),
        "no_executable_process", "draft", "isExecutable", ["process 'draft'", 'set isExecutable="true"']),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_a_modeler_export_that_cannot_run_is_refused_naming_element_field_and_fix(tmp_path: Path, name: str) -> None:
    build, code, element_id, field, words = REFUSED[name]
    path = build(tmp_path)
    problems = [p for p in validate_process(path, discover_config=False).errors]
    assert [(p.code, p.element_id, p.field) for p in problems] == [(code, element_id, field)], \
        [str(p) for p in problems]
    message = str(problems[0])
    assert message.startswith(f"{path}:") and all(w in message for w in words), message

    result = cli("validate", str(path))
    assert result.exit_code == 2 and message in result.stdout
    exit_code, doc = run_json(path)
    assert (exit_code, doc["status"], doc["error"]["kind"]) == (2, "error", "invalid_process")
    assert message in doc["error"]["message"]
    with pytest.raises(ProcessError):
        load_process(path)


@pytest.mark.parametrize("name", ['an end event with id="End"', "a task with the id <process>.EndJoin"])
def test_plain_spiffworkflow_skips_what_a_reserved_id_names(tmp_path: Path, name: str) -> None:
    """Why a reserved id is an error and not a warning: the process "completes" without it."""
    build, _, element_id, _, _ = REFUSED[name]
    plain_wf, _ = run_plain(build(tmp_path), {}, {})
    assert plain_wf.is_completed() and element_id not in path_of(plain_wf)


def test_a_link_plain_spiffworkflow_stops_at_runs_on_to_its_catch(tmp_path: Path) -> None:
    path = export(tmp_path, "linked", [process("linked", [
        start(), script("before", "a = 1"), '<bpmn:intermediateThrowEvent id="to_b"><bpmn:linkEventDefinition '
        'id="link_out" name="jump" /></bpmn:intermediateThrowEvent>', '<bpmn:intermediateCatchEvent id="from_a">'
        '<bpmn:linkEventDefinition id="link_in" name="jump" /></bpmn:intermediateCatchEvent>',
        script("after", "b = 1"), end(), *chain("StartEvent_1", "before", "to_b"), *chain("from_a", "after", "EndEvent_1")])])
    plain_wf, plain_vars = run_plain(path, {}, {})
    assert plain_wf.is_completed() and "after" not in path_of(plain_wf) and plain_vars == {"a": 1}

    assert validate_process(path, discover_config=False).ok
    engine = Engine()
    instance = engine.run(engine.start(load_process(path), {}))
    assert instance.status == "completed"
    assert path_of(instance.workflow) == ["StartEvent_1", "before", "to_b", "from_a", "after", "EndEvent_1"]
    assert variables(instance.main) == {"a": 1, "b": 1}


# ----- runs, fails where nothing runs a step: the error names the task ----------------------------------

UNRUN = {
    # name: (builder, the task, validate's warnings)
    "zeebe service task": (_one("zeebe_job", [
        start(), '<bpmn:serviceTask id="notify"><bpmn:extensionElements><zeebe:taskDefinition type="notify" retries="3" />'
        "</bpmn:extensionElements></bpmn:serviceTask>", end(), *chain("StartEvent_1", "notify", "EndEvent_1")],
        dialect="zeebe"), "notify", ["foreign_extension", "no_implementation"]),
    "camunda external task": (_one("external", [
        start(), '<bpmn:serviceTask id="charge" camunda:type="external" camunda:topic="charge" />', end(),
        *chain("StartEvent_1", "charge", "EndEvent_1")]), "charge", ["foreign_extension", "no_implementation"]),
    "zeebe script task (FEEL, no bpmn:script)": (_one("zeebe_script", [
        start(), '<bpmn:scriptTask id="double"><bpmn:extensionElements><zeebe:script expression="=qty * 2" '
        'resultVariable="doubled" /></bpmn:extensionElements></bpmn:scriptTask>', end(),
        *chain("StartEvent_1", "double", "EndEvent_1")], dialect="zeebe"),
        "double", ["foreign_extension", "no_implementation"]),
}


@pytest.mark.parametrize("name", list(UNRUN))
def test_a_step_only_another_engine_runs_warns_and_fails_naming_the_task(tmp_path: Path, name: str) -> None:
    """Plain SpiffWorkflow refuses a service task without an operator and fails on a script task
    without a script; layerflow runs service tasks by handlers, so validate can only warn (a
    handler may be registered in Python). The script task once completed silently, doing nothing."""
    build, task_id, warnings = UNRUN[name]
    path = build(tmp_path)
    report = validate_process(path, discover_config=False)
    assert report.ok and sorted(p.code for p in report.problems) == warnings, report.format_report()
    assert all(p.element_id == task_id for p in report.problems)
    with pytest.raises(Exception):
        run_plain(path, {}, {})

    exit_code, doc = run_json(path)
    assert (exit_code, doc["status"], doc["error"]["task_id"]) == (1, "error", task_id)
    assert f"{task_id!r}" in doc["error"]["message"] and "handler" in doc["error"]["message"]


def test_an_iso_8859_1_export_loads_as_it_validates(tmp_path: Path) -> None:
    """lxml reads the encoding from the XML declaration; SpiffWorkflow's add_bpmn_files decodes
    every file as UTF-8 (plain SpiffWorkflow cannot open this file), and layerflow, which used
    it, refused to load a file that validate had passed."""
    path = export(tmp_path, "latin", [process("latin", [
        start(), '<bpmn:scriptTask id="greet" name="Grüßen"><bpmn:script>name = "Jürgen"</bpmn:script></bpmn:scriptTask>',
        end(), *chain("StartEvent_1", "greet", "EndEvent_1")])], encoding="ISO-8859-1")
    assert "Grüßen".encode("latin-1") in path.read_bytes()
    assert validate_process(path, discover_config=False).ok
    with pytest.raises(UnicodeDecodeError):
        run_plain(path, {}, {})
    instance = run_ours(path)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"name": "Jürgen"}
