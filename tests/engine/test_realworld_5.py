"""Shapes met in public BPMN and DMN files, round 5: SpiffArena's process models (data objects
written by a sub-process), Camunda 7's examples. Each is redrawn small in
``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run a shape, a case runs it there
too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.exceptions import WorkflowDataException
from SpiffWorkflow.bpmn.parser.BpmnParser import BpmnParser
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow

from engine import Engine, FormAnswerInvalid, load_process
from engine.validate import validate_process

from engine_helpers import variables

REALWORLD = Path(__file__).resolve().parent / "realworld"


def plain(path: Path, process_id: str, data: dict[str, Any]) -> BpmnWorkflow:
    """Plain SpiffWorkflow 3.2 run of ``path`` with ``data`` (its engine steps only)."""
    parser = BpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(process_id), parser.get_subprocess_specs(process_id))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    return wf


def errors(*paths: Path) -> list[Any]:
    return [p for p in validate_process(list(paths)).problems if p.severity == "error"]


# -- data objects --------------------------------------------------------------------------------


def test_a_sub_process_that_writes_a_data_object_hands_it_to_the_next_one() -> None:
    """A sub-process with a dataOutputAssociation (SpiffArena's data-object-in-subprocess model):
    its steps write the object, the next sub-process's task reads it through a reference drawn
    inside that sub-process. Validate passed and the run stopped as the first sub-process ended,
    "WorkflowDataException: A data object could not be set; 'draft' not exist in the task" (exit 1,
    no task named): SpiffWorkflow takes the value from the sub-process task's data, and under
    layerflow the value is in the context. It now runs as in plain SpiffWorkflow."""
    path = REALWORLD / "subprocess_data_object.bpmn"
    assert errors(path) == []
    expected = plain(path, "subprocess_data_object", {"claim_id": "C-7"}).last_task.data
    assert expected["verdict"] == "C-7: small"
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"claim_id": "C-7"}))
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert found["verdict"] == expected["verdict"]
    # the data object stays in the context, as every data object does under layerflow
    assert found["draft"] == {"claim": "C-7", "amount": 120}
    assert {k: v for k, v in found.items() if k != "draft"} == dict(expected)


def test_a_sub_process_whose_steps_never_set_its_data_object_names_it(tmp_path: Path) -> None:
    """The same sub-process whose steps set something else: plain SpiffWorkflow stops with a
    WorkflowDataException naming no element; layerflow's error names the sub-process and the object
    and says what to do."""
    source = (REALWORLD / "subprocess_data_object.bpmn").read_text()
    script = 'draft = {"claim": claim_id, "amount": 120}'
    assert script in source
    path = tmp_path / "subprocess_data_object.bpmn"
    path.write_text(source.replace(script, "notes = claim_id"))
    with pytest.raises(WorkflowDataException, match="'draft' not exist"):
        plain(path, "subprocess_data_object", {"claim_id": "C-7"})
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"claim_id": "C-7"}))
    assert instance.status == "error"
    assert instance.error == {
        "kind": "activity_failed", "task_id": "drafting",
        "message": "sub-process 'drafting' writes the data object(s) 'draft' (its dataOutputAssociation), and "
                   "nothing in it set them; set them in a step before it ends, or remove the association"}


# -- Operaton (Camunda 7's fork) --------------------------------------------------------------------


def test_operaton_forms_and_decisions_are_read_as_camunda_7s() -> None:
    """Operaton's examples (leave-request, dmn-decision's loan-application) write Camunda 7's
    settings in Operaton's namespace: operaton:formData on a user task, operaton:decisionRef,
    resultVariable and mapDecisionResult on a business rule task. Validate refused the task as naming
    no decision ("name it ... or camunda:decisionRef"), and the form was not read, so any answer
    passed. They are read as Camunda 7's."""
    bpmn, table = REALWORLD / "operaton_expense.bpmn", REALWORLD / "operaton_expense.dmn"
    assert errors(bpmn, table) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([bpmn, table])))
    assert instance.status == "waiting"
    [item] = instance.waiting_for
    assert item["form"]["source"] == "operaton:formData"
    assert [(f["id"], f["type"], f["required"], f["default"]) for f in item["form"]["fields"]] == [
        ("amount", "long", True, None), ("category", "enum", False, "travel")]
    with pytest.raises(FormAnswerInvalid) as refused:
        engine.complete_user_task(instance, item["id"], {"amount": 25, "category": "fuel"})
    assert refused.value.problems == [("category", '"fuel" is not one of travel, meals')]
    for amount, route in ((25, "auto"), (250, "manager")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, table])))
        instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"amount": amount})
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == {"amount": amount, "category": "travel", "route": route}


def test_operaton_loop_collection_and_bean_are_named_as_camunda_7s() -> None:
    """Operaton's document-review example loops over operaton:collection="${reviewers}": validate
    passed on SpiffWorkflow's 'A multiinstance task must specify a cardinality or a loop input data
    reference ... fix the BPMN element named here', and said nothing of operaton:delegateExpression.
    It now says what to write, with the loop's own names, as for camunda:collection."""
    found = validate_process([REALWORLD / "operaton_reviews.bpmn"]).problems
    assert [(p.code, p.element_id, p.severity) for p in found if p.code in (
        "multi_instance_foreign_collection", "foreign_extension")] == [
        ("multi_instance_foreign_collection", "review", "error"), ("foreign_extension", "archive", "warning")]
    loop = next(p for p in found if p.code == "multi_instance_foreign_collection")
    assert "operaton:collection='${reviewers}'" in loop.message
    assert loop.message.endswith('write <bpmn:loopDataInputRef>reviewers</bpmn:loopDataInputRef> and '
                                 '<bpmn:inputDataItem id="reviewer" name="reviewer"/> in its '
                                 'bpmn:multiInstanceLoopCharacteristics')
    bean = next(p for p in found if p.code == "foreign_extension")
    assert "has operaton:delegateExpression, another engine's settings" in bean.message
    assert "cannot load the process" not in " ".join(p.message for p in found)
