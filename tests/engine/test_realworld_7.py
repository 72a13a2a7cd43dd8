"""Shapes met in public BPMN and DMN files, round 7: other engines' input and output mappings on
tasks (Camunda 7's and Operaton's ``camunda:inputOutput``, Camunda 8's ``zeebe:ioMapping``), and
processes of repositories not read before. Each is redrawn small in ``tests/engine/realworld/``;
where plain SpiffWorkflow 3.2 can run a shape, a case runs it there too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import plain, rewritten

REALWORLD = Path(__file__).resolve().parent / "realworld"


def found_for(path: Path, *codes: str, process_id: str | None = None) -> list[Any]:
    return [p for p in validate_process([path], process_id=process_id).problems if p.code in codes]


# -- input and output mappings on tasks -----------------------------------------------------------


def test_camunda7_input_and_output_parameters_run_around_the_task() -> None:
    """Camunda 7's input/output parameters on a script task and a user task: plain SpiffWorkflow runs
    none, and stops at the script on the input it never set ("name 'net' is not defined"); validate
    only warned that they are not run. They run now: a variable by its name, a path into an object,
    a literal, a text constant, an empty parameter (null), a list and a map before the task's work, the outputs
    after it, so the gateway reads what they set; nothing is reported."""
    path = REALWORLD / "io_mapping_camunda7.bpmn"
    with pytest.raises(Exception, match="name 'net' is not defined"):
        plain(path, "invoice_tax", {"invoice": {"net": 400}, "requester": "ann"})
    assert found_for(path, "foreign_extension", "io_mapping_expression") == []
    for net, approved, end in ((400, True, "paid"), (600, True, "held"), (400, False, "held")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path]), {"invoice": {"net": net}, "requester": "ann"}),
                              answers={"user_tasks": {"approve": {"approved": approved}}})
        assert instance.status == "completed", instance.error
        tax = round(net * 0.2, 2)
        assert variables(instance.main) == {
            "invoice": {"net": net}, "requester": "ann", "net": net, "rate": 0.2, "currency": "EUR", "note": None,
            "tax": tax, "label": f"{tax} EUR", "taxDue": tax, "reviewer": "ann", "approved": approved,
            "approvedBy": "ann", "approvalOk": approved, "copies": ["ann", "audit"],
            "form": {"title": "Invoice approval", "urgent": False}}
        assert path_of(instance.workflow)[-2:] == ["decide", end]
        # no task-local scope here: an input is a write of the task, kept in HISTORY as the task ends
        assert instance.main.layer(Layer.HISTORY)["net"] == net
        assert "net" not in instance.main.layer(Layer.WORKING)


def test_camunda8_io_mappings_run_on_sub_process_script_task_and_call_activity() -> None:
    """Camunda 8's zeebe:ioMapping on a sub-process, a script task inside it and a call activity:
    FEEL paths into the order (a key it lacks gives null, as FEEL does), a literal, a static input
    text; the outputs give the gateway parcelCount and shippingFee. Plain SpiffWorkflow stops in the
    sub-process ("name 'items' is not defined")."""
    path = REALWORLD / "io_mapping_zeebe.bpmn"
    order = {"items": ["a", "b", "c", "d"], "address": {"country": "DE"}}
    with pytest.raises(Exception, match="name 'items' is not defined"):
        plain(path, "shipping", {"order": order})
    assert found_for(path, "foreign_extension", "io_mapping_expression", process_id="shipping") == []
    small = {"items": ["a", "b"], "address": {"country": "FR"}, "coupon": "C10"}
    for given, parcels, fee, coupon, end in ((order, 2, 29, None, "by_freight"), (small, 1, 35, "C10", "by_post")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path], process_id="shipping"), {"order": given}))
        assert instance.status == "completed", instance.error
        found = variables(instance.main)
        assert {k: found[k] for k in ("items", "perParcel", "parcels", "parcelCount", "country", "insured", "tier",
                                      "coupon", "fee", "shippingFee")} == {
            "items": given["items"], "perParcel": 3, "parcels": parcels, "parcelCount": parcels,
            "country": given["address"]["country"], "insured": True, "tier": "standard", "coupon": coupon,
            "fee": fee, "shippingFee": fee}
        assert path_of(instance.workflow)[-2:] == ["route", end]


def test_a_camunda7_mapping_of_a_variable_not_set_stops_the_run_naming_the_mapping() -> None:
    """Camunda 7 stops on ``${requester}`` when no requester is set; so does layerflow, and its error
    names the mapping, the task and what to do, not a preScript the file does not have. (Camunda 8's
    FEEL gives null instead: the coupon above.)"""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([REALWORLD / "io_mapping_camunda7.bpmn"]),
                                       {"invoice": {"net": 400}}), answers={"user_tasks": {"approve": {"approved": True}}})
    assert instance.status == "error"
    assert instance.error is not None and instance.error["task_id"] == "approve"
    message = instance.error["message"]
    assert "camunda:inputParameter 'reviewer' of 'approve' reads a variable that is not set" in message
    assert "give it in the start data or set it in a step before 'approve'" in message
    assert "name 'requester' is not defined" in message


_STEP = '<bpmn:scriptTask id="step" name="Book the amount">'
_SCRIPT = "      <bpmn:script>seen = net</bpmn:script>\n    </bpmn:scriptTask>"
_INNER = ('      <bpmn:startEvent id="inner_start"><bpmn:outgoing>i1</bpmn:outgoing></bpmn:startEvent>\n'
          '      <bpmn:sequenceFlow id="i1" sourceRef="inner_start" targetRef="inner" />\n'
          '      <bpmn:scriptTask id="inner"><bpmn:incoming>i1</bpmn:incoming><bpmn:outgoing>i2</bpmn:outgoing>'
          '<bpmn:script>seen = net</bpmn:script></bpmn:scriptTask>\n'
          '      <bpmn:sequenceFlow id="i2" sourceRef="inner" targetRef="inner_end" />\n'
          '      <bpmn:endEvent id="inner_end"><bpmn:incoming>i2</bpmn:incoming></bpmn:endEvent>\n')


@pytest.mark.parametrize("opening, closing, person", [
    (_STEP, _SCRIPT, False),
    ('<bpmn:userTask id="step">', "    </bpmn:userTask>", True),
    ('<bpmn:manualTask id="step">', "    </bpmn:manualTask>", True),
    ('<bpmn:task id="step">', "    </bpmn:task>", True),
    ('<bpmn:sendTask id="step">', "    </bpmn:sendTask>", False),
    ('<bpmn:subProcess id="step">', _INNER + "    </bpmn:subProcess>", False),
    ('<bpmn:transaction id="step">', _INNER + "    </bpmn:transaction>", False),
    ('<bpmn:callActivity id="step" calledElement="ledger">', "    </bpmn:callActivity>", False),
], ids=["scriptTask", "userTask", "manualTask", "task", "sendTask", "subProcess", "transaction", "callActivity"])
def test_input_and_output_mappings_run_on_every_kind_of_activity(tmp_path: Path, opening: str, closing: str,
                                                                 person: bool) -> None:
    """Every activity SpiffWorkflow gives a pre- and postScript maps its inputs before its work (the
    person's form, the sub-process's steps, the called process see ``net``) and its outputs after it
    (``booked``)."""
    path = rewritten(tmp_path, REALWORLD / "io_mapping_task_kinds.bpmn", [(_STEP, opening), (_SCRIPT, closing)])
    assert found_for(path, "foreign_extension", "io_mapping_expression", process_id="booking") == []
    engine = Engine(store="memory://")
    answers = {"user_tasks": {"step": {"checked": True}}} if person else None
    instance = engine.run(engine.start(load_process([path], process_id="booking"), {"amount": 120}), answers=answers)
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert (found["net"], found["booked"]) == (120, 120)
    if "scriptTask" in closing or "subProcess" in closing or "transaction" in closing or "callActivity" in closing:
        assert found["seen"] == 120
