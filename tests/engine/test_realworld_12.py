"""Shapes met in public BPMN files, round 12: SpiffWorkflow's own test processes
(sartography/SpiffWorkflow, ``tests/SpiffWorkflow/bpmn/data``: ``escalation.bpmn``, ``standard_loop.bpmn``,
``transaction.bpmn``, ``io_spec.bpmn``, the terminate-end-event, link-event and event sub-process
tests, the collaborations) and the examples of Camunda's and bpmn.io's modelers: escalations thrown
inside a sub-process and caught by its boundary events or by an event sub-process around it, event
sub-processes that a signal the process throws or a message from outside starts, standard loops
tested before each pass and loops whose pass throws an error, multi-instance activities counted by
a cardinality with a completion condition (a parallel vote that one veto ends), a decision table in
each instance of a multi-instance sub-process, escalations and terminate end events inside the
instances of one, link events inside a sub-process, terminate end events at two levels, a
transaction left by a cancel or an error end event, a conditional boundary event, two pools that
answer each other through message end events and an event-based gateway, a Camunda Modeler export
drawn only to explain (no isExecutable, lanes, annotations, a group, an unconnected data store),
compensation as Camunda's trip booking draws it, a Camunda 8 export (message subscription, FEEL
script task beside its Python one), a BonitaSoft export (SpiffWorkflow's ``Approvals.bpmn``) and a
process that declares its own data inputs. Each is redrawn small in
``tests/engine/realworld12/`` (the file says where it comes from); where plain SpiffWorkflow 3.2 runs a
shape as BPMN means it, a case runs it there too and the path and the variables must agree; where
it does not, what plain SpiffWorkflow does is asserted too, so a SpiffWorkflow that changes shows."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition
from SpiffWorkflow.util.task import TaskState

from context_layers import Layer, thaw
from engine import Engine, StartDataInvalid, load_process
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, path_of, run_plain, variables
from test_realworld_4 import rewritten

HERE = Path(__file__).resolve().parent / "realworld12"
cli = cli_in_a_tmp_store  # the fixture "cli", here too


def problems(path: Path) -> list[tuple[str, str, str | None]]:
    return [(p.code, p.severity, p.element_id) for p in validate_process([path]).problems]


def run(path: Path, data: dict[str, Any], answers: dict[str, Any] | None = None) -> Any:
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process([path]), data), answers=answers)


def plain_workflow(path: Path, data: dict[str, Any], *, dmn: Path | None = None) -> BpmnWorkflow:
    """Plain SpiffWorkflow as far as its engine steps go."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    if dmn is not None:
        parser.add_dmn_file(str(dmn))
    pid = parser.get_process_ids()[0]
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    return wf


def agree(path: Path, data: dict[str, Any], answers: dict[str, Any] | None = None) -> tuple[Any, BpmnWorkflow]:
    """Run under layerflow and plain SpiffWorkflow; both complete on the same path with the same variables."""
    assert problems(path) == []
    instance = run(path, data, {"user_tasks": answers} if answers else None)
    wf, plain_data = run_plain(path, data, answers or {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == plain_data
    return instance, wf


# -- escalation.bpmn: escalations inside a sub-process, caught by its boundary events ------------

ESCALATIONS = HERE / "escalation_in_subprocess.bpmn"


@pytest.mark.parametrize("amount, expected", [
    (20, {"total": 40, "accepted": True, "shipped": True}),
    (200, {"total": 400, "accepted": True, "shipped": True, "reviewer": "finance"}),
], ids=["no-escalation", "escalation-beside"])
def test_an_escalation_thrown_inside_a_sub_process_runs_its_boundary_path_beside_it(
        amount: int, expected: dict[str, Any]) -> None:
    """The intermediate escalation throw is caught by the non-interrupting boundary event of the
    sub-process around it: its path runs beside, the sub-process goes on and ends normally."""
    instance, _ = agree(ESCALATIONS, {"amount": amount})
    assert variables(instance.main) == {"amount": amount, **expected}


def test_an_escalation_end_event_inside_a_sub_process_interrupts_it_and_keeps_what_it_wrote() -> None:
    """The escalation end event is caught by the interrupting boundary event naming its code (the
    review escalation before it by the other one): the path is plain SpiffWorkflow's. What the
    sub-process wrote before it was left stays (README: an error or escalation end event keeps
    what its path wrote); plain SpiffWorkflow drops the sub-process's data with it."""
    data = {"amount": 2000}
    assert problems(ESCALATIONS) == []
    instance = run(ESCALATIONS, data)
    wf, plain_data = run_plain(ESCALATIONS, data, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert "ship" not in path_of(wf) and "refuse" in path_of(wf)
    assert plain_data == {"amount": 2000, "refused": True, "reviewer": "finance"}
    assert variables(instance.main) == {**plain_data, "total": 4000}


# -- event sub-processes started by an escalation, a signal, a message ----------------------------

ESCALATION_EVENT_SUB = HERE / "escalation_event_subprocess.bpmn"
SIGNAL_EVENT_SUB = HERE / "signal_start_event_subprocess.bpmn"
MESSAGE_EVENT_SUB = HERE / "message_start_event_subprocess.bpmn"


@pytest.mark.parametrize("days, expected", [
    (2, {"eta": 4, "packed": True, "notified": "eta 4", "closed": True}),
    (5, {"eta": 10, "notified": "eta 10", "closed": True}),
], ids=["escalation-in-a-branch", "escalation-ends-the-sub-process"])
def test_an_escalation_end_event_in_a_sub_process_starts_the_event_sub_process_around_it(
        days: int, expected: dict[str, Any]) -> None:
    """No boundary event catches the escalation: the non-interrupting escalation event sub-process
    of the process does, reading what the sub-process wrote; the process goes on after the
    sub-process. SpiffWorkflow 3.2 starts an escalation event sub-process at once, without the
    escalation, and fails there on the variable not yet written (asserted)."""
    assert problems(ESCALATION_EVENT_SUB) == []
    instance = run(ESCALATION_EVENT_SUB, {"days": days})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"days": days, **expected}
    taken = path_of(instance.workflow)
    assert taken.count("notify") == 1 and taken[-2:] == ["close", "end"]
    assert taken.index("late_start") > taken.index("plan")
    with pytest.raises(Exception, match="name 'eta' is not defined"):
        run_plain(ESCALATION_EVENT_SUB, {"days": days}, {})


def test_a_signal_the_process_throws_starts_its_event_sub_process_with_what_the_process_holds() -> None:
    """The signal start of a non-interrupting event sub-process, thrown by the process itself: the
    audit reads what the process wrote before it threw, and the person's approval still waits.
    SpiffWorkflow 3.2 hands an event sub-process the data of the process's start (it fails on
    ``risk``, asserted); where no signal is thrown both engines agree."""
    assert problems(SIGNAL_EVENT_SUB) == []
    waiting = run(SIGNAL_EVENT_SUB, {"amount": 500})
    assert waiting.status == "waiting"
    assert [w["task_id"] for w in waiting.waiting_for if w["kind"] == "user_task"] == ["approve"]
    assert variables(waiting.main)["audit"] == "risk high for 500"
    done = run(SIGNAL_EVENT_SUB, {"amount": 500}, {"user_tasks": {"approve": {"ok": True}}})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"amount": 500, "risk": "high", "audit": "risk high for 500", "ok": True}
    assert path_of(done.workflow).count("write_audit") == 1
    with pytest.raises(Exception, match="name 'risk' is not defined"):
        run_plain(SIGNAL_EVENT_SUB, {"amount": 500}, {"approve": {"ok": True}})
    agree(SIGNAL_EVENT_SUB, {"amount": 5}, {"approve": {"ok": True}})


def test_an_interrupting_signal_event_sub_process_ends_the_process_before_the_person_is_asked(
        tmp_path: Path) -> None:
    path = rewritten(tmp_path, SIGNAL_EVENT_SUB, [('isInterrupting="false"', 'isInterrupting="true"')])
    assert problems(path) == []
    done = run(path, {"amount": 500})
    assert done.status == "completed", done.error
    assert path_of(done.workflow)[-4:] == ["audit_start", "write_audit", "audit_end", "audit_log"]
    assert variables(done.main) == {"amount": 500, "risk": "high", "audit": "risk high for 500"}


def plain_sending(path: Path, messages: list[tuple[str, Any]]) -> BpmnWorkflow:
    wf = plain_workflow(path, {})
    for name, payload in messages:
        wf.send_event(BpmnEvent(MessageEventDefinition(name), payload))
        wf.do_engine_steps()
    return wf


def test_a_message_starts_an_interrupting_event_sub_process_that_ends_the_process(tmp_path: Path) -> None:
    """The withdrawal comes while the documents are awaited: the interrupting event sub-process
    cancels the person's task and ends the process, its payload under the catch's messageVariable.
    The path is plain SpiffWorkflow's; plain SpiffWorkflow ignores isInterrupting and leaves the
    person's task waiting (asserted)."""
    assert problems(MESSAGE_EVENT_SUB) == []
    engine = Engine(store="sqlite:///" + str(tmp_path / "lf.db"))
    waiting = engine.run(engine.start(load_process([MESSAGE_EVENT_SUB]), {}))
    assert sorted((w["kind"], w["task_id"]) for w in waiting.waiting_for) == [
        ("event", "status_start"), ("event", "withdraw_start"), ("user_task", "send_documents")]
    done = engine.send_event(engine.load(waiting.id), "withdraw", {"reason": "moved"})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"registered": True, "requests": [], "withdrawal": {"reason": "moved"},
                                    "decision": "withdrawn: moved"}
    wf = plain_sending(MESSAGE_EVENT_SUB, [("withdraw", {"reason": "moved"})])
    assert path_of(done.workflow) == path_of(wf)
    assert not wf.is_completed()
    assert [t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.READY, manual=True)] == ["send_documents"]


def test_a_message_starts_a_non_interrupting_event_sub_process_each_time_it_comes(tmp_path: Path) -> None:
    """Two status requests while the person works: each runs the event sub-process once and reads
    the list the run before it wrote (plain SpiffWorkflow hands the event sub-process the data of
    the process's start and fails on ``requests``, asserted); the person's answer ends the process."""
    engine = Engine(store="sqlite:///" + str(tmp_path / "lf.db"))
    instance = engine.run(engine.start(load_process([MESSAGE_EVENT_SUB]), {}))
    for who in ("ann", "bob"):
        instance = engine.send_event(engine.load(instance.id), "status_request", {"who": who})
        assert instance.status == "waiting", instance.error
    assert variables(instance.main)["requests"] == ["ann", "bob"]
    done = engine.complete_user_task(instance, "send_documents", {"documents": True})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"registered": True, "requests": ["ann", "bob"], "asked": {"who": "bob"},
                                    "documents": True, "decision": "accepted"}
    assert Counter(path_of(done.workflow))["reply"] == 2
    with pytest.raises(Exception, match="name 'requests' is not defined"):
        plain_sending(MESSAGE_EVENT_SUB, [("status_request", {"who": "ann"})])


# -- standard_loop.bpmn: testBefore, loopMaximum; a pass that throws an error ---------------------

STANDARD_LOOP = HERE / "standard_loop_test_before.bpmn"
LOOP_ERROR = HERE / "standard_loop_error.bpmn"


@pytest.mark.parametrize("data, expected", [
    ({"deposit": 0, "rate": 100, "target": 350}, {"balance": 484, "months": 4, "reviews": 2}),
    ({"deposit": 500, "rate": 100, "target": 350}, {"balance": 605, "months": 0, "reviews": 2}),
    ({"deposit": 0, "rate": 10, "target": 1000}, {"balance": 145, "months": 12, "reviews": 2}),
    ({"deposit": 0, "rate": 1000, "target": 300}, {"balance": 1100, "months": 1, "reviews": 1}),
], ids=["loops-until-the-target", "test-before-never-runs", "loop-maximum", "do-while-runs-once"])
def test_standard_loops_tested_before_or_after_each_pass_run_as_in_plain_spiffworkflow(
        data: dict[str, Any], expected: dict[str, Any]) -> None:
    """The loopCondition keeps the loop going while it holds (BPMN; SpiffWorkflow reads it so):
    tested before each pass, a condition false at once runs no pass; tested after (the default),
    one pass at least; loopMaximum caps both."""
    instance, wf = agree(STANDARD_LOOP, data)
    assert variables(instance.main) == {**data, **expected}
    assert path_of(wf).count("save_monthly") == expected["months"] + 1  # the passes and the loop task


@pytest.mark.parametrize("data, reviews", [
    ({"deposit": 0, "rate": 1000, "target": 300}, 0), ({"deposit": 0, "rate": 100, "target": 350}, 2),
], ids=["never-runs", "runs-twice"])
def test_a_sub_process_looped_with_test_before_may_run_no_pass(tmp_path: Path, data: dict[str, Any],
                                                                reviews: int) -> None:
    path = rewritten(tmp_path, STANDARD_LOOP, [('<bpmn:standardLoopCharacteristics loopMaximum="3">',
                                                '<bpmn:standardLoopCharacteristics testBefore="true" loopMaximum="3">')])
    instance, wf = agree(path, data)
    assert variables(instance.main)["reviews"] == reviews == path_of(wf).count("add_interest")


def test_a_looped_sub_process_whose_pass_throws_an_error_stops_at_its_boundary_event() -> None:
    """The second pass ends in an error end event: the error boundary event on the looped
    sub-process interrupts the loop, and its path reads what the passes wrote. Plain SpiffWorkflow
    3.2 fails on its own task tree (``TaskNotFoundException``, asserted); without the error both
    engines loop four times."""
    assert problems(LOOP_ERROR) == []
    instance = run(LOOP_ERROR, {"fail_at": 2})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"fail_at": 2, "done": [0, 1], "failed_after": 2}
    assert path_of(instance.workflow)[-4:] == ["batch", "on_bad", "handle", "end2"]
    assert path_of(instance.workflow).count("do_one") == 2
    with pytest.raises(Exception, match="was not found"):
        run_plain(LOOP_ERROR, {"fail_at": 2}, {})
    instance, _ = agree(LOOP_ERROR, {"fail_at": 9})
    assert variables(instance.main)["done"] == [0, 1, 2, 3]


# -- multi-instance activities: cardinality and completion conditions -----------------------------

CARDINALITY = HERE / "mi_cardinality_completion.bpmn"
VETO = HERE / "mi_parallel_veto.bpmn"


@pytest.mark.parametrize("data, quotes", [
    ({"suppliers": 4, "step": 100, "budget": 750}, [1000, 900, 800, 700]),
    ({"suppliers": 2, "step": 10, "budget": 750}, [1000, 990, 980]),
    ({"suppliers": -1, "step": 10, "budget": 750}, []),
], ids=["completes-early", "runs-every-instance", "no-instance"])
def test_instances_counted_by_a_cardinality_stop_at_the_completion_condition(
        data: dict[str, Any], quotes: list[int]) -> None:
    instance, _ = agree(CARDINALITY, data)
    assert variables(instance.main)["quotes"] == quotes
    assert [c["n"] for c in variables(instance.main)["checks"]] == list(range(len(quotes)))


def plain_votes(ballots: dict[str, str], order: list[str]) -> BpmnWorkflow:
    wf = plain_workflow(VETO, {"reviewers": list(ballots)})
    for who in order:
        ready = [t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.data.get("reviewer") == who]
        if not ready:
            break
        ready[0].data["ballot"] = ballots[who]
        ready[0].run()
        wf.do_engine_steps()
    return wf


@pytest.mark.parametrize("order, votes, outcome", [
    (["bob", "cy", "ann"], ["yes", "veto"], "vetoed"),
    (["ann", "bob", "cy"], ["yes", "yes", "veto"], "vetoed"),
], ids=["veto-second", "veto-last"])
def test_a_veto_ends_a_parallel_vote_and_withdraws_the_ballots_not_cast(
        order: list[str], votes: list[str], outcome: str) -> None:
    """A parallel multi-instance user task with a completion condition: each reviewer is asked at
    once; the veto completes the activity, the reviewers who have not voted are no longer asked,
    and the votes cast are collected in the order they came, as in plain SpiffWorkflow."""
    ballots = {"ann": "yes", "bob": "yes", "cy": "veto"}
    assert problems(VETO) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([VETO]), {"reviewers": list(ballots)}))
    assert [w["input"] for w in instance.waiting_for] == [{"reviewer": r} for r in ballots]
    for who in order:
        if instance.status != "waiting":
            break
        [mine] = [w for w in instance.waiting_for if w["input"] == {"reviewer": who}]
        instance = engine.complete_user_task(instance, mine["id"], {"ballot": ballots[who]})
    wf = plain_votes(ballots, order)
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "reviewers": ["ann", "bob", "cy"], "votes": votes, "outcome": outcome, "answered": len(votes)}


# -- a decision table in each instance of a multi-instance sub-process ---------------------------

PARCELS = HERE / "dmn_per_instance.bpmn"
RATES = HERE / "dmn_per_instance.dmn"


@pytest.mark.parametrize("parcels, charges", [
    ([{"kg": 2, "zone": "EU", "count": 3}, {"kg": 7, "zone": "EU", "count": 1}, {"kg": 1, "zone": "WORLD", "count": 2}],
     [15, 9, 50]),
    ([], []),
], ids=["three-parcels", "none"])
def test_each_instance_evaluates_the_decision_over_its_own_item(parcels: list[Any], charges: list[int]) -> None:
    """The decision table's rate stays in each instance's scope; only the output item comes back."""
    assert problems(PARCELS) == []
    data = {"parcels": parcels}
    instance = run(PARCELS, data)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"parcels": parcels, "charges": charges, "total": sum(charges)}
    assert "rate" not in instance.main.layer(Layer.HISTORY)
    if parcels:  # plain SpiffWorkflow parses the DMN file given to it only
        wf = plain_workflow(PARCELS, data, dmn=RATES)
        assert wf.is_completed() and path_of(instance.workflow) == path_of(wf)
        assert variables(instance.main) == dict(wf.last_task.data)


# -- escalations and terminate end events inside the instances of a multi-instance sub-process ----

MI_ESCALATION = HERE / "mi_escalation_terminate.bpmn"


@pytest.mark.parametrize("items, labels", [
    ([{"name": "a", "kg": 3}, {"name": "b", "kg": 30}], ["a:3 sealed", "b:30 sealed"]),
    ([{"name": "a", "kg": 3}, {"name": "b", "kg": 0}, {"name": "c", "kg": 25}], ["a:3 sealed", "b:0", "c:25 sealed"]),
    ([], []),
], ids=["one-escalation", "one-escalation-one-terminate", "no-items"])
def test_a_terminate_end_event_ends_its_instance_only_and_an_escalation_runs_the_boundary_path(
        items: list[Any], labels: list[str]) -> None:
    """A terminate end event in one instance ends that instance (its output item is what it wrote),
    the others run on; the escalation of an instance runs the non-interrupting boundary path."""
    instance, wf = agree(MI_ESCALATION, {"items": items})
    assert variables(instance.main)["labels"] == labels
    assert path_of(wf).count("order_forklift") == (1 if items else 0)


@pytest.mark.parametrize("sequential", [False, True], ids=["parallel", "sequential"])
def test_the_escalation_of_each_instance_runs_the_boundary_path_once(tmp_path: Path, sequential: bool) -> None:
    """Two instances escalate: the non-interrupting boundary event catches each (README; plain
    SpiffWorkflow caught the first only, asserted), and the variables are plain SpiffWorkflow's."""
    path = rewritten(tmp_path, MI_ESCALATION, [] if not sequential else [
        ("<bpmn:multiInstanceLoopCharacteristics>", '<bpmn:multiInstanceLoopCharacteristics isSequential="true">')])
    data = {"items": [{"name": "a", "kg": 33}, {"name": "b", "kg": 0}, {"name": "c", "kg": 25}]}
    instance = run(path, data)
    wf, plain_data = run_plain(path, data, {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == plain_data
    assert Counter(path_of(instance.workflow))["order_forklift"] == 2
    assert Counter(path_of(wf))["order_forklift"] == 1


# -- link events inside a sub-process ------------------------------------------------------------

LINKS = HERE / "link_in_subprocess.bpmn"


def test_link_events_of_one_name_jump_within_their_own_level() -> None:
    """The top-level throw goes on at the top-level catch, the sub-process's throw at the
    sub-process's catch (closing its retry loop). Plain SpiffWorkflow 3.2 ends the path at the
    first throw and completes with nothing done (asserted)."""
    assert problems(LINKS) == []
    instance = run(LINKS, {"needed": 3})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"needed": 3, "tries": 3, "log": ["try 1", "try 2", "try 3"],
                                        "summary": "try 1, try 2, try 3"}
    assert Counter(path_of(instance.workflow))["again"] == 2
    wf, plain_data = run_plain(LINKS, {"needed": 3}, {})
    assert path_of(wf) == ["start", "init", "to_page_2"] and plain_data["tries"] == 0


def test_a_link_catch_event_that_a_flow_also_enters_is_refused_naming_it(tmp_path: Path) -> None:
    """Drawn as modelers let people draw it, the sub-process's start flows into the link catch
    event too: validate names the catch, the flow and what to do, and nothing runs."""
    path = rewritten(tmp_path, LINKS, [('<bpmn:sequenceFlow id="a1" sourceRef="a_start" targetRef="attempt" />',
                                        '<bpmn:sequenceFlow id="a1" sourceRef="a_start" targetRef="again" />')])
    [problem] = validate_process([path]).problems
    assert (problem.code, problem.severity, problem.element_id) == ("link_flow", "error", "again")
    for said in ("'a1'", "delete the flow", "point it at the element after 'again'"):
        assert said in problem.message, problem.message


# -- terminate end events at two levels ----------------------------------------------------------

TERMINATE = HERE / "terminate_beside_subprocess.bpmn"


@pytest.mark.parametrize("limit_hit, expected", [
    (False, {"quick": "ok", "signed": True, "watched": False, "closed": True}),
    (True, {"watched": True}),
], ids=["sub-process-terminates", "process-terminates"])
def test_a_terminate_end_event_ends_its_own_level(limit_hit: bool, expected: dict[str, Any]) -> None:
    """Inside the sub-process it ends the sub-process (its person's task cancelled) and the branch
    goes on; at the top level it ends the process and the branch that waits for a person. What the
    terminated branch wrote is dropped with it, as in plain SpiffWorkflow."""
    instance, _ = agree(TERMINATE, {"limit_hit": limit_hit}, {"sign_off": {"signed": True}})
    assert variables(instance.main) == {"limit_hit": limit_hit, **expected}


# -- transaction.bpmn: a transaction left three ways ---------------------------------------------

TRANSACTION = HERE / "transaction_error_and_cancel.bpmn"


@pytest.mark.parametrize("data, outcome", [
    ({"stock": 5, "qty": 2, "card": "visa"}, "booked"),
    ({"stock": 1, "qty": 2, "card": "visa"}, "cancelled"),
    ({"stock": 5, "qty": 2, "card": "declined"}, "unpaid"),
], ids=["done", "cancel-end-event", "error-end-event"])
def test_a_transaction_left_by_a_cancel_or_an_error_end_event_takes_its_boundary_path(
        data: dict[str, Any], outcome: str) -> None:
    """The person's task in the transaction's other branch is cancelled with it; the path is plain
    SpiffWorkflow's. The check's writes stay when the transaction is left (the branch that threw
    keeps what it wrote, README), which plain SpiffWorkflow drops."""
    assert problems(TRANSACTION) == []
    answers = {"inform": {"informed": True}}
    instance = run(TRANSACTION, data, {"user_tasks": answers})
    wf, plain_data = run_plain(TRANSACTION, data, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert plain_data["outcome"] == variables(instance.main)["outcome"] == outcome
    if outcome == "booked":
        assert variables(instance.main) == plain_data
    else:
        assert "inform" not in path_of(wf)
        checked = {"in_stock": data["stock"] >= data["qty"], "paid": data["card"] != "declined"}
        assert variables(instance.main) == {**plain_data, **checked}


# -- compensation, as Camunda's trip booking draws it -----------------------------------------------

COMPENSATION = HERE / "compensation_trip.bpmn"


def test_compensation_is_refused_naming_each_event_and_the_undo_to_draw_as_flow(tmp_path: Path) -> None:
    """SpiffWorkflow 3.2 cannot load the compensation boundary event and reads the throw as a plain
    event: validate names both, the undo task, and what to draw; drawn so, the undo runs on the
    failure path, as in plain SpiffWorkflow."""
    found = {p.element_id: p for p in validate_process([COMPENSATION]).problems}
    assert sorted((p.code, p.severity, e) for e, p in found.items()) == [
        ("compensation_unsupported", "error", "undo"), ("compensation_unsupported", "error", "undo_hotel_b")]
    for problem in found.values():
        for said in ("'cancel_hotel'", 'isForCompensation="false"', "draw the undo as part of the flow"):
            assert said in problem.message, problem.message
    drawn = rewritten(tmp_path, COMPENSATION, [
        ('    <bpmn:boundaryEvent id="undo_hotel_b" attachedToRef="book_hotel">\n'
         '      <bpmn:compensateEventDefinition />\n    </bpmn:boundaryEvent>\n', ""),
        ('isForCompensation="true"', 'isForCompensation="false"'),
        ('<bpmn:sequenceFlow id="f_bad" sourceRef="ok" targetRef="undo">',
         '<bpmn:sequenceFlow id="f_bad" sourceRef="ok" targetRef="cancel_hotel">'),
        ('<bpmn:sequenceFlow id="f4" sourceRef="undo" targetRef="end_undone" />',
         '<bpmn:sequenceFlow id="f4" sourceRef="cancel_hotel" targetRef="end_undone" />'),
        ('    <bpmn:intermediateThrowEvent id="undo" name="Undo the booking">\n'
         '      <bpmn:compensateEventDefinition />\n    </bpmn:intermediateThrowEvent>\n', ""),
        ('    <bpmn:association id="a1" associationDirection="One" sourceRef="undo_hotel_b" targetRef="cancel_hotel" />\n',
         "")])
    for card_ok, hotel in ((False, "cancelled"), (True, "booked")):
        instance, _ = agree(drawn, {"card_ok": card_ok})
        assert variables(instance.main) == {"card_ok": card_ok, "hotel": hotel, "paid": card_ok}


# -- a conditional boundary event on a sub-process ------------------------------------------------

CONDITIONAL = HERE / "conditional_boundary_subprocess.bpmn"


def test_a_conditional_boundary_event_interrupts_the_sub_process_whose_step_made_it_true() -> None:
    """BPMN fires a conditional event as its condition comes to hold: the sub-process's own step
    spends over the budget, and the boundary event interrupts it before its person is asked.
    Plain SpiffWorkflow 3.2 checks the condition once, as the sub-process starts, and runs on
    (asserted); under the budget both engines agree."""
    assert problems(CONDITIONAL) == []
    instance = run(CONDITIONAL, {"cost": 500})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["over_budget", "stop", "end2"]
    assert variables(instance.main) == {"cost": 500, "budget_used": 500, "stopped": True}
    wf, _ = run_plain(CONDITIONAL, {"cost": 500}, {"review": {"ok": True}})
    assert "over_budget" not in path_of(wf) and path_of(wf)[-1] == "end"
    agree(CONDITIONAL, {"cost": 50}, {"review": {"ok": True}})


# -- two pools that answer each other ------------------------------------------------------------

POOLS = HERE / "pools_event_gateway_reply.bpmn"


def plain_collaboration(data: dict[str, Any]) -> BpmnWorkflow:
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(POOLS))
    spec, subprocesses = parser.get_collaboration("ordering")
    wf = BpmnWorkflow(spec, subprocesses)
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    return wf


@pytest.mark.parametrize("qty, customer, supplier", [
    (3, {"confirmation": {"delivery": "monday"}, "customer_result": "expect monday"},
     {"available": True, "delivery": "monday"}),
    (9, {"customer_result": "look elsewhere"}, {"available": False, "delivery": None}),
], ids=["confirmed", "declined"])
def test_a_message_end_event_of_one_pool_takes_the_other_pools_event_gateway_path(
        qty: int, customer: dict[str, Any], supplier: dict[str, Any]) -> None:
    """The customer's send task starts the supplier's process; the supplier answers with one of two
    message end events, and the customer's event-based gateway goes on with the one that came.
    Each pool's context holds what plain SpiffWorkflow's pool holds; the instance's, both."""
    data = {"item": "gear", "qty": qty, "stock": 5}
    assert problems(POOLS) == []
    instance = run(POOLS, data)
    wf = plain_collaboration(data)
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf)
    pools = {sp.spec.name: dict(sp.last_task.data) for sp in wf.subprocesses.values()}
    order = {"order": {"item": "gear", "qty": qty}}
    assert pools == {"customer": {**data, **customer}, "supplier": {**data, **order, **supplier}}
    by_pool = {name.split("/")[1].split("@")[0]: variables(ctx) for name, ctx in instance.contexts.items() if "/" in name}
    assert by_pool == pools
    assert variables(instance.main) == {**data, **customer, **order, **supplier}


def test_a_payload_and_variable_on_the_bpmn_message_are_refused_naming_each_catch(tmp_path: Path) -> None:
    """As the examples often draw it, the payload sits on the bpmn:message beside the catch's
    messageVariable: SpiffWorkflow reads the message's settings only and the variable would never
    be set. validate names each catch and what to move where; nothing runs."""
    path = rewritten(tmp_path, POOLS, [
        ('<bpmn:message id="msg_order" name="order" />',
         '<bpmn:message id="msg_order" name="order"><bpmn:extensionElements><spiffworkflow:messagePayload>'
         '{"item": item, "qty": qty}</spiffworkflow:messagePayload></bpmn:extensionElements></bpmn:message>')])
    found = validate_process([path]).problems
    [problem] = [p for p in found if p.severity == "error"]
    assert [(p.code, p.element_id) for p in found if p.severity == "warning"] == [("message_extension_deprecated",
                                                                                   "msg_order")]
    assert (problem.code, problem.element_id, problem.field) == ("message_extension_shadowed", "order_in",
                                                                 "messageVariable")
    assert "'msg_order'" in problem.message and "move the bpmn:message's" in problem.message
    with pytest.raises(Exception, match="message_extension_shadowed|never read"):
        load_process([path])


def test_a_pool_run_alone_sends_to_the_outside_and_waits_for_the_answer_from_there(tmp_path: Path) -> None:
    """The supplier's process not executable, the customer's runs alone (a collaboration runs only
    its executable pools): the order leaves the instance (``messages_out``), the answer is sent from
    outside; validate has nothing to say of a pool run alone, as of a black-box pool."""
    path = rewritten(tmp_path, POOLS, [('<bpmn:process id="supplier" isExecutable="true">',
                                        '<bpmn:process id="supplier" isExecutable="false">')])
    report = validate_process([path])
    assert report.ok and report.process_id == "customer" and not report.problems
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([path]), {"item": "gear", "qty": 3}))
    assert sorted(w["event"] for w in waiting.waiting_for) == ["confirmed", "declined"]
    [sent] = waiting.messages_out()
    assert (sent["name"], sent["element_id"], sent["payload"]) == ("order", "send_order", {"item": "gear", "qty": 3})
    done = engine.send_event(waiting, "confirmed", {"delivery": "friday"})
    assert done.status == "completed", done.error
    assert variables(done.main)["customer_result"] == "expect friday"


# -- a Camunda Modeler export drawn to explain the process ---------------------------------------

EXPORT = HERE / "camunda_export_diagram_only.bpmn"


def test_an_explanatory_camunda_export_warns_of_is_executable_and_runs_its_people_s_steps() -> None:
    """No isExecutable (a warning saying what to add), lanes, an annotation and its association, a
    group, a data store and a data object that nothing reads or writes: diagram only, no problem.
    The manual tasks and the plain task wait for people; answered, the process runs as in plain
    SpiffWorkflow."""
    [warned] = validate_process([EXPORT]).problems
    assert (warned.code, warned.severity, warned.element_id) == (
        "process_executable_unset", "warning", "Process_goods_in")
    assert 'isExecutable="true"' in warned.message
    waiting = run(EXPORT, {})
    assert [w["task_id"] for w in waiting.waiting_for] == ["Activity_unload"]
    answers = {"Activity_unload": {}, "Activity_sign": {"signed": True}, "Activity_count": {"pallets": 12}}
    instance = run(EXPORT, {}, {"user_tasks": answers})
    wf, plain_data = run_plain(EXPORT, {}, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == plain_data == {"signed": True, "pallets": 12, "booked": 12}


def test_a_task_that_reads_the_drawn_data_store_is_refused_naming_the_task_and_the_store(tmp_path: Path) -> None:
    """Drawn with the data association Camunda Modeler adds when the store is connected to a task:
    SpiffWorkflow needs a class registered for the store, and layerflow registers none. validate
    names the task, the store and what to do; the same data store left unconnected (above) is no
    problem."""
    path = rewritten(tmp_path, EXPORT, [("""      <bpmn:outgoing>Flow_8</bpmn:outgoing>
      <bpmn:script>""", """      <bpmn:outgoing>Flow_8</bpmn:outgoing>
      <bpmn:property id="Property_0stock" name="__targetRef_placeholder" />
      <bpmn:dataInputAssociation id="DataInputAssociation_0stock">
        <bpmn:sourceRef>DataStoreReference_stock</bpmn:sourceRef>
        <bpmn:targetRef>Property_0stock</bpmn:targetRef>
      </bpmn:dataInputAssociation>
      <bpmn:script>""")])
    [refused] = [p for p in validate_process([path]).problems if p.severity == "error"]
    assert (refused.code, refused.element_id, refused.field) == (
        "data_store_unsupported", "Activity_book", "dataInputAssociation")
    for said in ("'Stock system'", "'DataStoreReference_stock'", "delete the association", "bpmn:dataObject"):
        assert said in refused.message, refused.message


# -- Approvals.bpmn: a BonitaSoft export whose called processes end at terminate or shared end events

BONITA = HERE / "bonita_first_approval_wins.bpmn"
BONITA_ANSWERS = [("First_Approval_Wins.Manager_Approval", {"manager": "yes"}), ("Approvals.First_Approval_Wins_Done", {}),
                  ("Parallel_Approvals_SP.Manager_Approval", {"manager_p": True}),
                  ("Parallel_Approvals_SP.Step1", {"operator": True}),
                  ("Parallel_Approvals_SP.Supervisor_Approval", {"supervisor_p": True})]


def test_a_bonita_export_runs_its_called_approvals_as_in_plain_spiffworkflow() -> None:
    """The first approval's terminate end event ends the called process (the supervisor is no longer
    asked), the parallel approvals meet at one end event; the ids with dots, the lanes that name
    other ids and the black-box participant are no problem, the missing isExecutable a warning."""
    assert problems(BONITA) == [("process_executable_unset", "warning", "Approvals")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([BONITA], process_id="Approvals"), {}))
    assert [w["task_id"] for w in instance.waiting_for] == [
        "First_Approval_Wins.Supervisor_Approval", "First_Approval_Wins.Manager_Approval"]
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(BONITA))
    wf = BpmnWorkflow(parser.get_spec("Approvals"), parser.get_subprocess_specs("Approvals"))
    wf.do_engine_steps()
    for task_id, answer in BONITA_ANSWERS:
        instance = engine.complete_user_task(instance, task_id, answer)
        [ready] = [t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.task_spec.bpmn_id == task_id]
        ready.data.update(answer)
        ready.run()
        wf.do_engine_steps()
        assert sorted(w["task_id"] for w in instance.waiting_for) == sorted(
            t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.READY, manual=True))
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert "First_Approval_Wins.Supervisor_Approved" not in path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "manager": "yes", "manager_p": True, "operator": True, "supervisor_p": True}


# -- Camunda 8's message subscription, user task schedule and FEEL script task ---------------------

CAMUNDA8 = HERE / "camunda8_message_subscription.bpmn"
FEEL_LINE = '<bpmn:script>orderKey = "order-" + str(orderNumber)</bpmn:script>'


def test_a_zeebe_script_beside_its_python_script_is_told_as_not_run_and_the_python_runs() -> None:
    """The export carries the FEEL script (zeebe:script) and the Python one (bpmn:script): the warning
    says the bpmn:script runs in its place; it told to write the FEEL line, rewritten, as a bpmn:script
    the task already had. Camunda 8's other settings (subscription, schedule, priority, properties,
    versionTag) change nothing here: the message is sent to the instance that waits for it."""
    [warned] = validate_process([CAMUNDA8]).problems
    assert (warned.code, warned.severity, warned.element_id) == ("foreign_extension", "warning", "Activity_key")
    assert "zeebe:script" in warned.message and "its bpmn:script runs" in warned.message, warned.message
    assert "write '" not in warned.message, warned.message
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([CAMUNDA8]), {"orderNumber": 7}))
    assert [(w["task_id"], w.get("event")) for w in waiting.waiting_for] == [("Event_paid", "payment_received")]
    paid = engine.send_event(waiting, "payment_received", {"amount": 12})
    done = engine.complete_user_task(paid, "Activity_check", {"checked": True})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"orderNumber": 7, "orderKey": "order-7", "amount": 12, "checked": True}
    wf = plain_workflow(CAMUNDA8, {"orderNumber": 7})
    wf.send_event(BpmnEvent(MessageEventDefinition("payment_received"), {"amount": 12}))
    wf.do_engine_steps()
    [check] = wf.get_tasks(state=TaskState.READY, manual=True)
    check.data["checked"] = True
    check.run()
    wf.do_engine_steps()
    assert wf.is_completed() and path_of(done.workflow) == path_of(wf)


def test_the_python_told_for_a_zeebe_script_alone_is_python_that_runs(tmp_path: Path) -> None:
    """Without the bpmn:script the warning writes the FEEL expression as the Python line to write:
    FEEL's string() was left in it (NameError: name 'string' is not defined); it is str() now, and
    the line written as told runs."""
    alone = rewritten(tmp_path, CAMUNDA8, [("      " + FEEL_LINE + "\n", "")])
    [empty, warned] = sorted(validate_process([alone]).problems, key=lambda p: p.code, reverse=True)
    assert (empty.code, empty.element_id, warned.code) == ("no_implementation", "Activity_key", "foreign_extension")
    told = 'write \'orderKey = "order-" + str(orderNumber)\' as its bpmn:script'
    assert told in warned.message, warned.message
    (tmp_path / "fixed").mkdir()
    fixed = rewritten(tmp_path / "fixed", alone, [("      </bpmn:extensionElements>\n    </bpmn:scriptTask>",
                                                   "      </bpmn:extensionElements>\n      " + FEEL_LINE
                                                   + "\n    </bpmn:scriptTask>")])
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([fixed]), {"orderNumber": 7}))
    assert waiting.status == "waiting" and variables(waiting.main)["orderKey"] == "order-7"


# -- io_spec.bpmn: a process that declares its own data inputs ------------------------------------

PROCESS_IO = HERE / "process_io_specification.bpmn"


def test_a_process_with_its_data_inputs_given_runs_as_in_plain_spiffworkflow() -> None:
    instance, _ = agree(PROCESS_IO, {"in_1": 2, "in_2": 3})
    assert variables(instance.main) == {"in_1": 2, "in_2": 3, "out_1": 5, "out_2": 6, "scratch": 7}


def test_start_data_without_a_declared_data_input_is_refused_naming_it_before_anything_runs() -> None:
    """The process's ioSpecification declares in_1 and in_2; started with in_1 only, the instance ran
    until its script failed on ``in_2`` (plain SpiffWorkflow does the same, asserted), a NameError
    that says nothing of the declaration. It is refused at the start, as start data that does not
    fit a start form is: naming the process, the input missing and what to give; no instance exists."""
    with pytest.raises(Exception, match="name 'in_2' is not defined"):
        run_plain(PROCESS_IO, {"in_1": 2}, {})
    engine = Engine(store="memory://")
    with pytest.raises(StartDataInvalid) as refused:
        engine.start(load_process([PROCESS_IO]), {"in_1": 2})
    message = str(refused.value)
    for said in ("process 'rate_inputs'", "lacks the data input 'in_2' that its bpmn:ioSpecification in",
                 "process_io_specification.bpmn", "give it in the start data", "no instance was created"):
        assert said in message, message
    assert refused.value.to_dict()["problems"] == [{"field": "in_2", "problem": "is missing"}]
    assert engine.store.list() == []


def test_layerflow_run_refuses_start_data_without_a_declared_data_input_with_exit_2(cli: Any) -> None:
    result = cli("run", str(PROCESS_IO), "--data", json.dumps({"in_2": 3}), "--json")
    assert result.exit_code == 2, result.output
    document = json.loads(result.stdout)
    assert document["status"] == "error" and document["error"]["kind"] == "invalid_answer"
    assert document["instance_id"] is None and "'in_1'" in document["error"]["message"], document["error"]
    assert json.loads(cli("list", "--json").stdout) == []
    done = cli("run", str(PROCESS_IO), "--data", json.dumps({"in_1": 1, "in_2": 3}), "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["status"] == "completed"


def test_a_data_input_the_config_fixes_in_system_needs_no_start_data(tmp_path: Path) -> None:
    """A declared input the process's config holds in SYSTEM (L0) is there from the start."""
    config = tmp_path / "rate_inputs.layerflow.yaml"
    config.write_text("system:\n  in_2: 10\n", encoding="utf-8")
    engine = Engine(store="memory://")
    done = engine.run(engine.start(load_process([PROCESS_IO], config=config), {"in_1": 2}))
    assert done.status == "completed", done.error
    assert thaw(done.main.resolve("out_2")) == 20


RETHROW = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="defs_rethrow" targetNamespace="http://bpmn.io/schema/bpmn">
  <bpmn:error id="err_a" errorCode="A" />
  <bpmn:error id="err_b" errorCode="B" />
  <bpmn:process id="rethrow" isExecutable="true">
    <bpmn:startEvent id="start" />
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="s" />
    <bpmn:subProcess id="s">
      <bpmn:startEvent id="s_start" />
      <bpmn:sequenceFlow id="s1" sourceRef="s_start" targetRef="work" />
      <bpmn:scriptTask id="work"><bpmn:script>tried = True</bpmn:script></bpmn:scriptTask>
      <bpmn:sequenceFlow id="s2" sourceRef="work" targetRef="fail_a" />
      <bpmn:endEvent id="fail_a"><bpmn:errorEventDefinition errorRef="err_a" /></bpmn:endEvent>
      <bpmn:subProcess id="handler" triggeredByEvent="true">
        <bpmn:startEvent id="h_start"><bpmn:errorEventDefinition errorRef="err_a" /></bpmn:startEvent>
        <bpmn:sequenceFlow id="h1" sourceRef="h_start" targetRef="log_a" />
        <bpmn:scriptTask id="log_a"><bpmn:script>logged_a = True</bpmn:script></bpmn:scriptTask>
        <bpmn:sequenceFlow id="h2" sourceRef="log_a" targetRef="fail_b" />
        <bpmn:endEvent id="fail_b"><bpmn:errorEventDefinition errorRef="err_b" /></bpmn:endEvent>
      </bpmn:subProcess>
    </bpmn:subProcess>
    <bpmn:boundaryEvent id="on_b" attachedToRef="s"><bpmn:errorEventDefinition errorRef="err_b" /></bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f2" sourceRef="on_b" targetRef="recover" />
    <bpmn:scriptTask id="recover"><bpmn:script>recovered = True</bpmn:script></bpmn:scriptTask>
    <bpmn:sequenceFlow id="f3" sourceRef="recover" targetRef="end_b" />
    <bpmn:endEvent id="end_b" />
    <bpmn:sequenceFlow id="f4" sourceRef="s" targetRef="end" />
    <bpmn:endEvent id="end" />
  </bpmn:process>
</bpmn:definitions>
"""


def test_an_error_event_sub_process_that_ends_in_another_error_hands_it_to_the_boundary_event_around(
        tmp_path: Path) -> None:
    """The sub-process's error A starts its error event sub-process, which ends in error B, caught by
    the boundary event on the sub-process: the handler ran after the work, and the process recovers.
    Plain SpiffWorkflow 3.2 starts the error event sub-process at once, before the work (asserted)."""
    path = tmp_path / "rethrow.bpmn"
    path.write_text(RETHROW, encoding="utf-8")
    assert problems(path) == []
    instance = run(path, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "s_start", "work", "fail_a", "h_start", "log_a", "fail_b",
                                          "handler", "s", "on_b", "recover", "end_b"]
    assert variables(instance.main) == {"tried": True, "logged_a": True, "recovered": True}
    wf, plain_data = run_plain(path, {}, {})
    assert path_of(wf)[:2] == ["start", "h_start"] and plain_data == {"recovered": True}


# -- one escalation or error, one catch: the nearest, and its own code before a catch-all ----------

BOUNDARY_BESIDE_EVENT_SUB = [("    <bpmn:sequenceFlow id=\"f2\" sourceRef=\"deliver\" targetRef=\"close\" />", """\
    <bpmn:sequenceFlow id="f2" sourceRef="deliver" targetRef="close" />
    <bpmn:boundaryEvent id="on_late_boundary" attachedToRef="deliver" cancelActivity="false">
      <bpmn:escalationEventDefinition escalationRef="esc_late" />
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="fb" sourceRef="on_late_boundary" targetRef="boundary_note" />
    <bpmn:scriptTask id="boundary_note"><bpmn:script>boundary_seen = True</bpmn:script></bpmn:scriptTask>
    <bpmn:sequenceFlow id="fb2" sourceRef="boundary_note" targetRef="boundary_end" />
    <bpmn:endEvent id="boundary_end" />""")]
AS_ERRORS = [('<bpmn:escalation id="esc_late" name="late" escalationCode="late" />',
              '<bpmn:error id="err_late" name="late" errorCode="late" />'),
             ('escalationEventDefinition escalationRef="esc_late"', 'errorEventDefinition errorRef="err_late"'),
             (' cancelActivity="false"', ''), (' isInterrupting="false"', '')]


@pytest.mark.parametrize("days", [2, 5], ids=["thrown-in-a-branch", "ends-the-sub-process"])
def test_an_escalation_caught_by_the_sub_process_s_boundary_event_starts_no_event_sub_process_around(
        tmp_path: Path, days: int) -> None:
    """An escalation is caught once, by the nearest catch (BPMN; Camunda: "caught by one catch event
    at most, ... in the nearest parent flow scope"): the boundary event on the sub-process the
    escalation is thrown in, before the event sub-process of the process around it. layerflow ran
    both paths."""
    path = rewritten(tmp_path, ESCALATION_EVENT_SUB, BOUNDARY_BESIDE_EVENT_SUB)
    assert problems(path) == []
    instance = run(path, {"days": days})
    assert instance.status == "completed", instance.error
    taken = path_of(instance.workflow)
    assert "boundary_note" in taken and "notify" not in taken and "late_start" not in taken
    assert variables(instance.main) == {"days": days, "eta": 2 * days, "boundary_seen": True, "closed": True,
                                        **({"packed": True} if days == 2 else {})}


@pytest.mark.parametrize("days", [2, 5], ids=["thrown-in-a-branch", "ends-the-sub-process"])
def test_an_error_caught_by_the_sub_process_s_boundary_event_does_not_interrupt_the_process(
        tmp_path: Path, days: int) -> None:
    """The same with an error end event, an interrupting error boundary event on the sub-process and
    an error event sub-process in the process: the boundary event catches it and the process goes
    on along its path. layerflow started the event sub-process, which interrupted the whole process
    (the boundary path never ran)."""
    path = rewritten(tmp_path, ESCALATION_EVENT_SUB, BOUNDARY_BESIDE_EVENT_SUB + AS_ERRORS)
    assert problems(path) == []
    instance = run(path, {"days": days})
    assert instance.status == "completed", instance.error
    taken = path_of(instance.workflow)
    assert taken[-2:] == ["boundary_note", "boundary_end"] and "notify" not in taken and "close" not in taken
    assert variables(instance.main) == {"days": days, "eta": 2 * days, "boundary_seen": True}


CATCH_ALL_BESIDE = [('    <bpmn:boundaryEvent id="on_limit" attachedToRef="check_order">', """\
    <bpmn:boundaryEvent id="on_any" attachedToRef="check_order" cancelActivity="false">
      <bpmn:escalationEventDefinition />
    </bpmn:boundaryEvent>
    <bpmn:sequenceFlow id="f_any" sourceRef="on_any" targetRef="note_any" />
    <bpmn:scriptTask id="note_any" name="Note any escalation">
      <bpmn:script>any_seen = True</bpmn:script>
    </bpmn:scriptTask>
    <bpmn:sequenceFlow id="f_any_end" sourceRef="note_any" targetRef="any_end" />
    <bpmn:endEvent id="any_end" />
    <bpmn:boundaryEvent id="on_limit" attachedToRef="check_order">""")]


@pytest.mark.parametrize("amount, any_seen, refused", [(20, 0, False), (200, 0, False), (2000, 0, True)],
                         ids=["none", "review", "review-and-limit"])
def test_a_catch_all_escalation_boundary_event_catches_only_what_no_event_of_its_code_catches(
        tmp_path: Path, amount: int, any_seen: int, refused: bool) -> None:
    """Beside the boundary events of the escalations' codes, one with no escalation catches any
    other: each escalation runs one path, the one of its code (Camunda: a catch event of the code
    wins over a catch-all in one scope; layerflow's rule for errors). layerflow (and plain
    SpiffWorkflow, asserted) ran the catch-all's path too for every escalation."""
    path = rewritten(tmp_path, ESCALATIONS, CATCH_ALL_BESIDE)
    assert problems(path) == []
    instance = run(path, {"amount": amount})
    assert instance.status == "completed", instance.error
    taken = Counter(path_of(instance.workflow))
    assert taken["note_any"] == any_seen and taken["note_review"] == (amount > 50)
    assert taken["refuse"] == refused and taken["ship"] == (not refused)
    wf, _ = run_plain(path, {"amount": amount}, {})
    assert Counter(path_of(wf))["note_any"] == (1 if amount > 50 else 0)
    (tmp_path / "only").mkdir()
    on_review = ('<bpmn:boundaryEvent id="on_review" attachedToRef="check_order" cancelActivity="false">\n'
                 '      <bpmn:escalationEventDefinition escalationRef="esc_review" />')
    # on_review catches a code no one throws (not 'limit': two boundary events of one code are refused)
    path_any_only = rewritten(tmp_path / "only", path, [
        (on_review, on_review.replace("esc_review", "esc_other")),
        ('<bpmn:escalation id="esc_limit"', '<bpmn:escalation id="esc_other" name="other" escalationCode="other" />\n'
                                            '  <bpmn:escalation id="esc_limit"')])
    only = run(path_any_only, {"amount": 200})  # no boundary event of the review's code: the catch-all
    assert Counter(path_of(only.workflow))["note_any"] == 1 and "note_review" not in path_of(only.workflow)
