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
    a literal, a text constant and an empty parameter (null) before the task's work, the outputs
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
            "approvedBy": "ann", "approvalOk": approved}
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
