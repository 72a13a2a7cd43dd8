"""engine.diagram: BPMN -> SVG, from the diagram interchange or a layered layout, with marks."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest

from engine.cli import LOAN_SCENARIOS
from engine.diagram import (
    ConflictMark,
    Marks,
    _crosses,
    layered_layout,
    marks_of,
    parse_bpmn,
    render_svg,
)
from engine.process import load_process
from engine.runtime import Engine

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "bpmn_examples"
ALL_BPMN = sorted(EXAMPLES.glob("*.bpmn")) + sorted((ROOT / "tests" / "engine" / "fixtures" / "governance").glob("*.bpmn"))
SVG = "{http://www.w3.org/2000/svg}"

DI_BPMN = b"""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:bpmndi="http://www.omg.org/spec/BPMN/20100524/DI" xmlns:dc="http://www.omg.org/spec/DD/20100524/DC"
    xmlns:di="http://www.omg.org/spec/DD/20100524/DI" id="d" targetNamespace="t">
  <bpmn:process id="p" isExecutable="true">
    <bpmn:startEvent id="s"/>
    <bpmn:userTask id="t" name="Check &lt;script&gt; &amp; &quot;sign&quot;"/>
    <bpmn:endEvent id="e"/>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="t"/>
    <bpmn:sequenceFlow id="f2" sourceRef="t" targetRef="e" name="done"/>
  </bpmn:process>
  <bpmndi:BPMNDiagram id="dia">
    <bpmndi:BPMNPlane id="plane" bpmnElement="p">
      <bpmndi:BPMNShape id="s_di" bpmnElement="s"><dc:Bounds x="152" y="202" width="36" height="36"/></bpmndi:BPMNShape>
      <bpmndi:BPMNShape id="t_di" bpmnElement="t"><dc:Bounds x="240" y="180" width="100" height="80"/></bpmndi:BPMNShape>
      <bpmndi:BPMNShape id="e_di" bpmnElement="e"><dc:Bounds x="400" y="202" width="36" height="36"/></bpmndi:BPMNShape>
      <bpmndi:BPMNEdge id="f1_di" bpmnElement="f1"><di:waypoint x="188" y="220"/><di:waypoint x="240" y="220"/></bpmndi:BPMNEdge>
    </bpmndi:BPMNPlane>
  </bpmndi:BPMNDiagram>
</bpmn:definitions>"""


def svg_tree(svg: str) -> ET.Element:
    return ET.fromstring(svg)


def node_classes(root: ET.Element, node_id: str) -> set[str]:
    for g in root.iter(f"{SVG}g"):
        if g.get("id") == f"node-{node_id}":
            return set((g.get("class") or "").split())
    raise AssertionError(f"no node {node_id}")


# ----------------------------------------------------------------------------- parsing and layout

def test_the_loan_process_is_laid_out_in_ranks():
    d = parse_bpmn(EXAMPLES / "loan_approval.bpmn")
    assert d.process_id == "loan_approval" and not d.from_interchange
    assert len(d.nodes) == 13 and len(d.edges) == 14
    n = d.nodes
    # left to right along the flow; the parallel branches one above the other in one rank
    assert n["start"].cx < n["submit_application"].cx < n["risk_assessment"].cx < n["approval_split"].cx
    assert n["finance_review"].cx == n["risk_review"].cx and n["finance_review"].cy != n["risk_review"].cy
    assert n["review_join"].cx > n["finance_review"].cx
    # the main line stays on one row
    assert n["start"].cy == n["submit_application"].cy == n["risk_assessment"].cy == n["approval_split"].cy


@pytest.mark.parametrize("path", ALL_BPMN, ids=lambda p: p.name)
def test_every_example_is_drawn_without_overlaps(path):
    d = parse_bpmn(path)
    boxes = list(d.nodes.values())
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            apart = a.x + a.w <= b.x or b.x + b.w <= a.x or a.y + a.h <= b.y or b.y + b.h <= a.y
            assert apart, f"{a.id} overlaps {b.id}"
    for e in d.edges:
        assert len(e.points) >= 2
        for node in boxes:
            if node.id not in (e.source, e.target):
                assert not _crosses(e.points, node), f"edge {e.id} runs through {node.id}"
    root = svg_tree(render_svg(d))
    assert root.get("data-layout") == "layered"


def test_a_loop_is_drawn_under_everything():
    d = parse_bpmn(EXAMPLES / "xor_loop.bpmn")
    bottom = max(n.y + n.h for n in d.nodes.values())
    back = [e for e in d.edges if d.nodes[e.target].cx < d.nodes[e.source].cx]
    assert back, "xor_loop has a back edge"
    for e in back:
        assert max(y for _, y in e.points) > bottom


def test_the_diagram_interchange_is_used_when_every_node_has_a_shape():
    d = parse_bpmn(DI_BPMN)
    assert d.from_interchange
    t = d.nodes["t"]
    assert (t.w, t.h) == (100, 80)
    # moved to the margin, relative positions kept
    assert d.nodes["s"].x == 24 and t.x - d.nodes["s"].x == 240 - 152
    f1 = next(e for e in d.edges if e.id == "f1")
    assert f1.points == ((24 + 36, t.cy), (t.x, t.cy))
    f2 = next(e for e in d.edges if e.id == "f2")  # no waypoints: a straight edge between the shapes
    assert f2.points[0][0] == t.x + t.w and f2.points[-1][0] == d.nodes["e"].x
    assert svg_tree(render_svg(d)).get("data-layout") == "interchange"


def test_partial_interchange_falls_back_to_the_layout():
    partial = DI_BPMN.replace(b'<bpmndi:BPMNShape id="e_di" bpmnElement="e">'
                              b'<dc:Bounds x="400" y="202" width="36" height="36"/></bpmndi:BPMNShape>', b"")
    assert not parse_bpmn(partial).from_interchange


@pytest.mark.parametrize("source, process_id, message", [
    (b'<definitions xmlns="http://www.omg.org/spec/BPMN/20100524/MODEL"/>', None, "no bpmn:process"),
    (DI_BPMN, "other", "no process 'other'"),
])
def test_bad_input_is_named(source, process_id, message):
    with pytest.raises(ValueError, match=message):
        parse_bpmn(source, process_id)


def test_layout_is_deterministic():
    a = render_svg(parse_bpmn(EXAMPLES / "nested_parallel.bpmn"))
    b = render_svg(layered_layout(parse_bpmn(EXAMPLES / "nested_parallel.bpmn")))
    assert a == b


# ----------------------------------------------------------------------------- rendering

def test_names_and_values_are_escaped():
    marks = Marks(conflicts=(ConflictMark("t", "k", "</text><script>x</script>", {"b1": "<b>", "b2": "&"}),))
    svg = render_svg(parse_bpmn(DI_BPMN), marks)
    assert "<script" not in svg
    root = svg_tree(svg)  # well-formed
    assert 'Check <script> & "sign"' in "".join(root.itertext())


def test_marks_are_drawn_as_classes_badges_and_a_callout():
    d = parse_bpmn(EXAMPLES / "loan_approval.bpmn")
    marks = Marks(done=frozenset({"start", "submit_application", "finance_review", "risk_review"}),
                  current=frozenset({"review_join"}), waiting=frozenset({"finance_review", "risk_review"}),
                  conflicts=(ConflictMark("review_join", "approval_status", "pending",
                                          {"finance_review": "approved", "risk_review": "rejected"}),))
    root = svg_tree(render_svg(d, marks))
    assert {"state-done", "waiting"} <= node_classes(root, "risk_review")
    assert {"state-current", "conflict"} <= node_classes(root, "review_join")
    assert "state-idle" in node_classes(root, "disbursement_decision")
    edges = {g.get("data-id"): g.get("class") for g in root.iter(f"{SVG}g") if g.get("data-id", "").startswith("f_")}
    assert "edge-waiting" in edges["f_risk_done"] and "edge-taken" in edges["f_start"]
    callout = next(g for g in root.iter(f"{SVG}g") if "callout" in (g.get("class") or "").split())
    text = " ".join(callout.itertext())
    assert 'finance_review: "approved"' in text and 'risk_review: "rejected"' in text and "open" in callout.get("class")
    desc = root.find(f"{SVG}desc")
    assert desc is not None and "conflict on approval_status at review_join (open)" in (desc.text or "")
    assert root.get("role") == "img" and root.find(f"{SVG}title") is not None


def test_a_resolved_conflict_shows_the_value_that_won():
    d = parse_bpmn(EXAMPLES / "loan_approval.bpmn")
    mark = ConflictMark("review_join", "approval_status", "pending", {"finance_review": "approved"},
                        {"value": "pending_dual_approval", "resolver": "human", "reason": "dual"})
    root = svg_tree(render_svg(d, Marks(done=frozenset({"review_join"}), conflicts=(mark,))))
    assert "conflict" not in node_classes(root, "review_join")
    assert '"pending_dual_approval" (human)' in "".join(root.itertext())


def test_a_cancelled_conflict_is_drawn_as_cancelled_not_open():
    """A conflict whose question closed with its join's scope (a boundary event, a cancelled line) is
    settled by nobody: the join is not marked as having a conflict to resolve, and its callout and the
    description say cancelled."""
    d = parse_bpmn(EXAMPLES / "loan_approval.bpmn")
    mark = ConflictMark("review_join", "approval_status", "pending", {"finance_review": "approved"},
                        cancelled=True)
    root = svg_tree(render_svg(d, Marks(done=frozenset({"review_join"}), conflicts=(mark,))))
    assert "conflict" not in node_classes(root, "review_join")
    callout = next(g for g in root.iter(f"{SVG}g") if "callout" in (g.get("class") or "").split())
    assert "cancelled" in callout.get("class").split() and "open" not in callout.get("class").split()
    assert "Cancelled: approval_status" in " ".join(callout.itertext())
    desc = root.find(f"{SVG}desc")
    assert desc is not None and "conflict on approval_status at review_join (cancelled)" in (desc.text or "")


# ----------------------------------------------------------------------------- marks of a real instance

@pytest.fixture
def loan_instance():
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_SCENARIOS["conflict"]))
    assert instance.status == "waiting"
    return engine, instance


def test_marks_of_an_instance_carry_a_conflicts_cancelled_flag(loan_instance):
    _, instance = loan_instance
    instance.conflicts[0]["cancelled"] = True  # as scope_steps.close_cancelled leaves it
    [conflict] = marks_of(instance).conflicts
    assert conflict.cancelled and not marks_of(instance).open_conflict_at("review_join")


def test_marks_of_an_instance_waiting_at_the_join(loan_instance):
    _, instance = loan_instance
    marks = marks_of(instance)
    assert {"submit_application", "risk_assessment", "full_review", "finance_review", "risk_review"} <= marks.done
    assert marks.current == {"review_join"}
    assert marks.waiting == {"finance_review", "risk_review"}
    assert "fast_track" not in marks.done | marks.current
    [conflict] = marks.conflicts
    assert (conflict.gateway_id, conflict.key, dict(conflict.values), conflict.resolution) == (
        "review_join", "approval_status", {"finance_review": "approved", "risk_review": "rejected"}, None)


def test_marks_of_a_completed_instance(loan_instance):
    engine, instance = loan_instance
    done = engine.answer_confirmation(instance, "review_join/approval_status", "pending_dual_approval")
    assert done.status == "completed"
    marks = marks_of(done)
    assert not marks.current and not marks.waiting
    assert {"review_join", "disbursement_decision", "end"} <= marks.done
    assert marks.conflicts[0].resolution is not None
