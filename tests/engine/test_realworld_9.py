"""Shapes met in public BPMN files, round 9: Signavio's exports (branch probabilities written as an
exclusive gateway's conditions for its simulation, call activities that name their process only in
Signavio's "Subprocess reference"), Bizagi Modeler's exports and mixed gateways, Camunda 8's call
activities whose process is a FEEL expression and its timers written with FEEL's ``cycle()`` and
``duration()``, jBPM's short timer durations and cron cycles, data objects whose generated id is not
the name the scripts write, and the inclusive gateways, groups and annotations of bpmn.io drawings.
Each is redrawn small in ``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run a shape,
a case runs it there too and the outcome must agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import plain, rewritten

REALWORLD = Path(__file__).resolve().parent / "realworld"


def errors(path: Path, process_id: str | None = None) -> list[Any]:
    return [p for p in validate_process([path], process_id=process_id).problems if p.severity == "error"]


def run(path: Path, data: dict[str, Any], process_id: str | None = None, answers: dict[str, Any] | None = None) -> Any:
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process([path], process_id=process_id), data), answers=answers)


def line_of(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


# -- Signavio's simulation probabilities as conditions ----------------------------------------------

PROBABILITIES = REALWORLD / "signavio_simulation_probabilities.bpmn"


@pytest.mark.parametrize("score", [500, 900])
def test_plain_spiffworkflow_takes_the_first_branch_whatever_the_data(score: int) -> None:
    """A number is true in Python, so the exclusive gateway takes its first flow (the 20% one) for
    every instance: the granted branch never runs."""
    wf = plain(PROBABILITIES, "credit_application", {"score": score})
    assert wf.is_completed()
    assert wf.last_task.data["letter"] == "rejection"


def test_branch_probabilities_as_conditions_are_refused_naming_each_flow() -> None:
    """Signavio exports the probabilities its simulation gives an exclusive gateway's branches as the
    flows' conditions (0.2, 0.8). validate said nothing, and every instance took the first flow, as
    in plain SpiffWorkflow. Each flow is named now, at its condition's line, with what the number
    is and what to write."""
    found = [p for p in errors(PROBABILITIES) if p.code == "condition_probability"]
    assert [(p.element_id, p.field, p.line, p.file) for p in found] == [
        ("sid-denied", "conditionExpression", line_of(PROBABILITIES, ">0.2<"), str(PROBABILITIES)),
        ("sid-granted", "conditionExpression", line_of(PROBABILITIES, ">0.8<"), str(PROBABILITIES))]
    assert [p.code for p in errors(PROBABILITIES)] == ["condition_probability"] * 2
    message = found[0].message
    for said in ("'0.2'", "'sid-decide'", "probability", "every instance", "expression over the context"):
        assert said in message, message


def test_the_probabilities_rewritten_as_conditions_run_as_in_plain_spiffworkflow(tmp_path: Path) -> None:
    changed = rewritten(tmp_path, PROBABILITIES, [(">0.2<", ">not granted<"), (">0.8<", ">granted<")])
    assert errors(changed) == []
    for score, letter in [(500, "rejection"), (900, "offer")]:
        instance = run(changed, {"score": score})
        assert instance.status == "completed", instance.error
        wf = plain(changed, "credit_application", {"score": score})
        assert variables(instance.main) == dict(wf.last_task.data) == {
            "score": score, "granted": score >= 600, "letter": letter}
        assert path_of(instance.workflow) == path_of(wf)


def test_a_number_condition_of_an_inclusive_gateway_is_refused_too(tmp_path: Path) -> None:
    changed = rewritten(tmp_path, PROBABILITIES, [
        ('<exclusiveGateway gatewayDirection="Diverging" id="sid-decide" name="">',
         '<inclusiveGateway gatewayDirection="Diverging" id="sid-decide" name="">'),
        ("</exclusiveGateway>", "</inclusiveGateway>"), (">0.8<", ">granted<")])
    assert [(p.code, p.element_id) for p in errors(changed)] == [("condition_probability", "sid-denied")]


def test_layerflow_run_refuses_the_probabilities_before_it_starts() -> None:
    result = CliRunner().invoke(main, ["run", "--json", "--store", "memory://", "--data", '{"score": 900}',
                                       str(PROBABILITIES)])
    assert result.exit_code != 0
    assert "sid-denied" in result.output and "sid-granted" in result.output and "probability" in result.output


# -- call activities that name their process elsewhere than calledElement ---------------------------

SIGNAVIO_CALL = REALWORLD / "signavio_subprocess_reference.bpmn"
ZEEBE_CALL = REALWORLD / "zeebe_called_element_expression.bpmn"


def test_a_signavio_subprocess_reference_is_named_with_the_called_element_to_write(tmp_path: Path) -> None:
    """Signavio names the process a call activity calls in its "Subprocess reference"; SpiffWorkflow
    3.2 reads calledElement only. validate said to write calledElement="PROCESS_ID"; it names the
    reference now and the process it names, and the call so written runs."""
    [problem] = [p for p in errors(SIGNAVIO_CALL, "onboarding") if p.code == "call_activity_unknown_process"]
    assert (problem.element_id, problem.field) == ("sid-check", "calledElement")
    assert 'metaKey="entry"' in problem.message and 'calledElement="identity_check"' in problem.message
    changed = rewritten(tmp_path, SIGNAVIO_CALL, [('name="Check identity">', 'name="Check identity" '
                                                                             'calledElement="identity_check">')])
    assert errors(changed) == []
    instance = run(changed, {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"verified": True}


@pytest.mark.parametrize("meta_value, said", [
    ("Identity check", 'calledElement="identity_check"'),  # Signavio's reference by the process's name
    ("/model/4f2a9c", 'the id of the process it calls'),
])
def test_a_signavio_reference_by_name_or_to_a_model_elsewhere(tmp_path: Path, meta_value: str, said: str) -> None:
    changed = rewritten(tmp_path, SIGNAVIO_CALL, [('metaValue="identity_check"', f'metaValue="{meta_value}"')])
    [problem] = [p for p in errors(changed, "onboarding") if p.code == "call_activity_unknown_process"]
    assert said in problem.message and meta_value in problem.message, problem.message


def test_a_camunda8_called_process_chosen_by_an_expression_is_not_told_to_write_the_expression() -> None:
    """zeebe:calledElement's processId is a FEEL expression when it starts with '='. validate told
    to write calledElement="=claimKind + "_claim"", which names no process; for an expression it
    says now that the process is chosen as the instance runs and what to draw instead, and for a
    FEEL string literal it gives the process id inside it."""
    found = {p.element_id: p for p in errors(ZEEBE_CALL, "claim_router") if p.code == "call_activity_unknown_process"}
    assert set(found) == {"handle", "archive"}
    handle = found["handle"].message
    assert 'calledElement="=' not in handle, handle
    for said in ("FEEL expression", "exclusive gateway", "call activity per process"):
        assert said in handle, handle
    assert 'calledElement="archive_claim"' in found["archive"].message, found["archive"].message


# -- jBPM's timers ---------------------------------------------------------------------------------

JBPM_TIMERS = REALWORLD / "jbpm_timer_durations.bpmn2"


def test_jbpm_short_durations_and_cron_cycles_are_refused_with_what_to_write(tmp_path: Path) -> None:
    """jBPM writes a timer's duration in its own short form (``1m``, ``1h30m``, ``2d500ms``) and a
    cycle in cron (``language="cron"``). SpiffWorkflow evaluates a timer's text as Python, and these
    are not; validate refused them as not Python and offered "PT1H" as an example. Each is named now
    with the ISO 8601 text it means, and the cron cycle as cron, which SpiffWorkflow has no reading
    of; the rewritten durations run as in plain SpiffWorkflow."""
    found = {p.element_id: p for p in errors(JBPM_TIMERS) if p.code == "timer_expression"}
    assert set(found) == {"_wait", "_remind", "_late", "_pause"}
    for eid, iso in [("_wait", '"PT1M"'), ("_late", '"PT1H30M"'), ("_pause", '"P2DT0.5S"')]:
        assert "jBPM" in found[eid].message and f"write {iso}" in found[eid].message, found[eid].message
        assert found[eid].field == "timeDuration"
    cron = found["_remind"].message
    # the cycle it is, named since round 24 (the rewrite below writes it)
    assert "cron" in cron and 'every 30 minutes: write "R/PT30M"' in cron and "ISO 8601" in cron, cron
    assert (found["_remind"].field, found["_remind"].line) == ("timeCycle", line_of(JBPM_TIMERS, "0 0/30"))
    changed = rewritten(tmp_path, JBPM_TIMERS, [(">1m<", '>"PT0S"<'), (">1h30m<", '>"PT1H30M"<'),
                                                 (">2d500ms<", '>"PT0S"<'), (">0 0/30 * * * ?<", '>"R/PT30M"<')])
    assert errors(changed) == []
    instance = run(changed, {}, answers={"user_tasks": {"_review": {"ok": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["_review", "_pause", "_end"]


# -- shapes that run as in plain SpiffWorkflow -------------------------------------------------------


@pytest.mark.parametrize("name, process_id, data, expected", [
    ("mixed_gateway_direction.bpmn", "Id_order_checks", {"items": 4},
     {"in_stock": True, "credit_ok": True, "invoice": "sent", "shipment": "now"}),
    ("mixed_gateway_direction.bpmn", "Id_order_checks", {"items": 30},
     {"in_stock": False, "credit_ok": False, "invoice": "prepaid", "shipment": "later"}),
    ("inclusive_default_flow.bpmn", "notify_parties", {"delay": 5}, {"customer_told": True, "carrier_told": True}),
    ("inclusive_default_flow.bpmn", "notify_parties", {"delay": 2}, {"customer_told": True}),
    ("inclusive_default_flow.bpmn", "notify_parties", {"delay": 0}, {"logged": True}),
    ("groups_and_milestones.bpmn", "checked_delivery", {"address": "1 Main Street"},
     {"address_ok": True, "delivered": True}),
], ids=["mixed-gateway", "mixed-gateway-other-branches", "inclusive-both", "inclusive-one", "inclusive-default",
        "group-annotation-milestone"])
def test_shapes_that_run_as_in_plain_spiffworkflow(name: str, process_id: str, data: dict[str, Any],
                                                   expected: dict[str, Any]) -> None:
    """A parallel gateway that joins and splits at once (Bizagi's and Signavio's
    gatewayDirection="Mixed"), an inclusive gateway's default flow (taken only when no condition holds), groups,
    annotations and a none intermediate event of bpmn.io drawings: validate refuses nothing, and
    layerflow ends with the variables and the steps plain SpiffWorkflow ends with."""
    path = REALWORLD / name
    assert errors(path) == []
    wf = plain(path, process_id, data)
    assert wf.is_completed()
    instance = run(path, data)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {**data, **expected} == dict(wf.last_task.data)
    assert path_of(instance.workflow) == path_of(wf)


# -- a data object whose id is generated and whose name is the variable ------------------------------

NAMED_APART = REALWORLD / "data_object_named_apart.bpmn"


def test_a_data_object_written_by_its_name_is_refused_with_the_id_to_give_it(tmp_path: Path) -> None:
    """Camunda Modeler gives a data object a generated id and puts the variable's name in name; the
    script sets ``invoice``. SpiffWorkflow keys a data object by its id, so the task's end stopped
    with "A data object could not be set; 'DataObject_0x7k2p1' not exist in the task", naming no
    element, and validate said nothing. validate refuses it now at the script task, naming the data
    object's id and name and the id to give it; with that id it runs as in plain SpiffWorkflow."""
    with pytest.raises(Exception, match="'DataObject_0x7k2p1' not exist"):
        plain(NAMED_APART, "invoicing", {"hours": 3, "rate": 100})
    [problem] = errors(NAMED_APART)
    assert (problem.code, problem.element_id, problem.field, problem.file) == (
        "data_object_named_apart", "Activity_draft", "dataOutputAssociation", str(NAMED_APART))
    assert problem.line == line_of(NAMED_APART, '<bpmn:dataOutputAssociation id="DataOutputAssociation_1">')
    for said in ("'DataObject_0x7k2p1'", "'invoice'", 'id="invoice"'):
        assert said in problem.message, problem.message
    changed = rewritten(tmp_path, NAMED_APART, [('"DataObject_0x7k2p1"', '"invoice"')])
    assert errors(changed) == []
    instance = run(changed, {"hours": 3, "rate": 100})
    assert instance.status == "completed", instance.error
    wf = plain(changed, "invoicing", {"hours": 3, "rate": 100})
    assert variables(instance.main) == {"hours": 3, "rate": 100, "invoice": {"total": 300}, "sent": 300}
    assert dict(wf.last_task.data) == {"hours": 3, "rate": 100, "sent": 300}  # the object is the workflow's
    assert wf.data_objects == {"invoice": {"total": 300}}


def test_a_task_that_does_not_set_its_data_object_stops_naming_the_task_and_the_object() -> None:
    """Unvalidated, the run stopped with SpiffWorkflow's WorkflowDataException and no task; it
    stops now at the task, naming the data object, the name it set and what to do."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([NAMED_APART], validate=False), {"hours": 3, "rate": 100}))
    assert instance.status == "error"
    assert instance.error["task_id"] == "Activity_draft", instance.error
    for said in ("'DataObject_0x7k2p1'", "dataOutputAssociation", "'invoice'"):
        assert said in instance.error["message"], instance.error


# -- Camunda 8's timers in FEEL --------------------------------------------------------------------

FEEL_TIMERS = REALWORLD / "zeebe_feel_timers.bpmn"


def test_feel_timer_functions_are_refused_with_python_that_runs(tmp_path: Path) -> None:
    """Camunda 8 writes a cycle as ``=cycle(duration("PT10M"))`` and a computed duration as
    ``=duration("P" + string(days) + "D")``. validate told to write ``cycle("PT10M")`` and
    ``duration(...)``, calls of functions the context has not (the run would stop on a NameError);
    it says now the ISO 8601 text, or the Python that computes it, and that runs."""
    found = {p.element_id: p.message for p in errors(FEEL_TIMERS) if p.code == "timer_expression"}
    assert set(found) == {"remind", "deadline"}
    assert "write '\"R/PT10M\"'" in found["remind"], found["remind"]
    told = found["deadline"].split("write ", 1)[1].split("'")[1]
    assert "duration(" not in told and "string(" not in told, found["deadline"]
    assert eval(told, {}, {"days": 2}) == "P2D"  # noqa: S307 - the Python validate told to write
    changed = rewritten(tmp_path, FEEL_TIMERS, [('=cycle(duration("PT10M"))', '"R/PT10M"'),
                                                ('=duration("P" + string(days) + "D")', told)])
    assert errors(changed) == []
    instance = run(changed, {"days": 2}, answers={"user_tasks": {"review": {"ok": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-2:] == ["review", "done"]


# -- Bizagi Modeler's export -----------------------------------------------------------------------

BIZAGI = REALWORLD / "bizagi_export.bpmn"


def test_a_bizagi_export_loads_and_its_none_task_waits_as_in_plain_spiffworkflow(tmp_path: Path) -> None:
    """Bizagi exports with no prefix and no isExecutable, an empty laneSet, empty documentation,
    its colours in every element's extensionElements and a diagram shape for a lane the process
    does not hold: validate only warns of the missing isExecutable, and the instance waits at the
    none task, as plain SpiffWorkflow's does, until a person completes it."""
    pid = "Id_a77e9019-520a-40b3-84aa-9140b31260d7"
    task = "Id_5d0dc591-4400-42f5-a16d-c056ff5da1e3"
    assert [(p.code, p.severity) for p in validate_process([BIZAGI]).problems] == [
        ("process_executable_unset", "warning")]
    wf = plain(BIZAGI, pid, {})
    assert [t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.READY, manual=True)] == [task]
    result = CliRunner().invoke(main, ["run", "--json", "--store", f"sqlite:///{tmp_path / 'runs.db'}", str(BIZAGI)])
    assert result.exit_code == 3, result.output  # waiting
    out = json.loads(result.stdout)
    assert (out["status"], [w["task_id"] for w in out["waiting_for"]]) == ("waiting", [task])
    done = run(BIZAGI, {}, answers={"user_tasks": {task: {"done": True}}})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"done": True}


@pytest.mark.parametrize("text, cron", [("0 0 9 * * MON-FRI", True), ("*/5 * * * *", True),
                                        ("in five minutes from now", False), ("1m 30s", False)])
def test_only_a_cron_expression_is_called_one(tmp_path: Path, text: str, cron: bool) -> None:
    changed = rewritten(tmp_path, JBPM_TIMERS, [(">0 0/30 * * * ?<", f">{text}<")])
    [problem] = [p for p in errors(changed) if p.element_id == "_remind"]
    assert ("is a cron expression" in problem.message) is cron, problem.message
