"""Shapes met in public BPMN files, round 13: SpiffWorkflow's own test processes not used before
(sartography/SpiffWorkflow, ``tests/SpiffWorkflow/bpmn/data``: ``call_activity_with_message.bpmn``,
``conditional_event.bpmn``, ``correlation_two_conversations.bpmn``, ``boundary_event_split.bpmn``,
``boundary_timer_on_task.bpmn``), the reminder-and-deadline pair of timer boundary events that
Camunda 7's docs draw on an activity (here on a call activity whose called process waits for a
person, on a sub-process and on the person's task), and a signal thrown inside a called process
for the caller. Each is redrawn small in ``tests/engine/realworld13/`` (the file says where it
comes from); where plain SpiffWorkflow 3.2 runs a shape as BPMN means it, a case runs it there too
and the path and the variables must agree; where it does not, what plain SpiffWorkflow does is
asserted too, so a SpiffWorkflow that changes shows."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition, SignalEventDefinition
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import patch_spiff_timer_clock, path_of, run_plain, variables

HERE = Path(__file__).resolve().parent / "realworld13"
HOUR = 3600.0


def problems(path: Path) -> list[tuple[str, str, str | None]]:
    return [(p.code, p.severity, p.element_id) for p in validate_process([path]).problems]


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def plain_workflow(path: Path, pid: str, data: dict[str, Any] | None = None) -> BpmnWorkflow:
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.task_tree.data.update(data or {})
    wf.do_engine_steps()
    return wf


def waiting(instance: Any, task_id: str) -> str:
    [item] = [w["id"] for w in instance.waiting_for if w["task_id"] == task_id]
    return str(item)


# -- call_activity_with_message.bpmn: a called process that asks outside and loops until yes ------

APPROVAL = HERE / "call_activity_with_message.bpmn"


def test_a_called_process_that_messages_out_and_waits_for_the_answer_runs_as_in_plain_spiffworkflow() -> None:
    """The called process sends its plan (messagePayload) and waits for the answer (messageVariable
    Approved); "No" loops back to the person, "Yes" ends the called process by its terminate end
    event, and the caller files the plan. Expected, as in plain SpiffWorkflow: two requests out
    ("v1", "v2"), the caller completes with filed == "v2 (Yes)"."""
    assert problems(APPROVAL) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([APPROVAL]), {}))
    sent = []
    for plan, answer in (("v1", "No"), ("v2", "Yes")):
        instance = engine.complete_user_task(instance, waiting(instance, "Activity_EnterPlan"), {"plan_details": plan})
        assert [w["task_id"] for w in instance.waiting_for] == ["Event_Get_Approval_Response"]
        sent = [(m["name"], m["payload"]) for m in instance.messages_out()]
        instance = engine.send_event(instance, "ApprovalResponse", answer)
    assert sent == [("ApprovalRequest", "v1"), ("ApprovalRequest", "v2")]
    assert instance.status == "completed", instance.error

    wf = plain_workflow(APPROVAL, "Caller")
    plain_sent = []
    for plan, answer in (("v1", "No"), ("v2", "Yes")):
        [task] = wf.get_tasks(state=TaskState.READY, manual=True)
        task.data["plan_details"] = plan
        task.run()
        wf.do_engine_steps()
        plain_sent += [(e.event_definition.name, e.payload) for e in wf.get_events()]
        wf.catch(BpmnEvent(MessageEventDefinition("ApprovalResponse"), answer))
        wf.do_engine_steps()
    assert wf.is_completed() and plain_sent == sent
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "plan_details": "v2", "Approved": "Yes", "filed": "v2 (Yes)"}


# -- a reminder cycle and a deadline on a call activity -------------------------------------------

TIMERS = HERE / "call_activity_timers.bpmn"


CALL = '<bpmn:callActivity id="legal_review" calledElement="Review"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:callActivity>'
REDRAWN = {  # the activity the timers are on, drawn as an embedded sub-process or as the person's task itself
    "sub-process": ('<bpmn:subProcess id="legal_review"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing>'
                    '<bpmn:startEvent id="review_start"/><bpmn:userTask id="review"/><bpmn:endEvent id="review_end"/>'
                    '<bpmn:sequenceFlow id="r1" sourceRef="review_start" targetRef="review"/>'
                    '<bpmn:sequenceFlow id="r2" sourceRef="review" targetRef="review_end"/></bpmn:subProcess>'),
    "user-task": '<bpmn:userTask id="legal_review"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:userTask>',
}
KINDS = ["call-activity", *REDRAWN]


def _timers_on(kind: str, tmp_path: Path) -> tuple[Path, str]:
    """The fixture, or its activity redrawn as ``kind``; and the id of the person's review task."""
    if kind == "call-activity":
        return TIMERS, "review"
    text = TIMERS.read_text()
    called = text[text.index('  <bpmn:process id="Review"'):]
    called = called[:called.index("</bpmn:process>") + len("</bpmn:process>")]
    path = tmp_path / f"{kind}.bpmn"
    path.write_text(text.replace(CALL, REDRAWN[kind]).replace(called, ""))
    return path, "review" if kind == "sub-process" else "legal_review"


def _contract(clock: Clock, by_phone: bool = False, path: Path = TIMERS, store: str = "memory://") -> tuple[Engine, Any]:
    engine = Engine(store=store, clock=clock)
    return engine, engine.run(engine.start(load_process([path]), {"by_phone": by_phone}))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("hours, reminders", [(0.5, []), (1.5, ["mail"]), (2.5, ["mail", "mail"])],
                         ids=["no-reminder", "one-reminder", "both-reminders"])
def test_each_reminder_a_cycle_sent_while_the_review_ran_stays_once_the_review_is_done(
        tmp_path: Path, kind: str, hours: float, reminders: list[str]) -> None:
    """R2/PT1H fires an hour after the call started and an hour after that; each repetition's
    path (a script that appends "mail") runs to its end event beside the called review. Expected:
    once the review is done and the contract signed, every reminder sent is in ``reminders``; the
    second reads what the first wrote (it starts an hour after the first one ended).

    It was lost when the review ended before the cycle's last repetition (one reminder: ``[]``):
    SpiffWorkflow cancels the waiting cycle event with its activity, and the cancel dropped the end
    its path waited at, so the process's end never merged the path. With both repetitions fired
    the event had completed, and each path, forked from the flow, brought back ``["mail"]``."""
    path, review = _timers_on(kind, tmp_path)
    assert problems(path) == []
    clock = Clock()
    engine, instance = _contract(clock, path=path)
    for _ in range(int(hours)):
        clock.now += HOUR
        instance = engine.run(instance)
    clock.now += (hours - int(hours)) * HOUR
    instance = engine.run(instance)
    instance = engine.complete_user_task(instance, waiting(instance, review), {"verdict": "ok"})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("send_reminder") == len(reminders)
    assert variables(instance.main) == {"by_phone": False, "reminders": reminders, "verdict": "ok",
                                        "outcome": "signed"}


@pytest.mark.parametrize("kind", KINDS)
def test_a_reminder_call_a_person_still_makes_waits_after_the_review_is_done(tmp_path: Path, kind: str) -> None:
    """The reminder goes by phone: a person's task on the repetition's path. The review is done
    while that call waits. BPMN: a non-interrupting boundary event's path is a token of its own;
    the activity's end stops the cycle's later repetitions, not a path already running. Expected:
    the instance waits for call_reviewer, then completes with the call's writes.

    Under layerflow (and plain SpiffWorkflow 3.2) the call was cancelled with the cycle event and
    the instance completed without it: a person's task dropped without a word."""
    path, review = _timers_on(kind, tmp_path)
    clock = Clock()
    store = "sqlite:///" + str(tmp_path / "lf.db")  # saved and loaded between the steps
    engine, instance = _contract(clock, by_phone=True, path=path, store=store)
    clock.now += 1.5 * HOUR
    instance = engine.run(instance)
    assert sorted(w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task") == sorted(["call_reviewer", review])
    engine = Engine(store=store, clock=clock)
    instance = engine.complete_user_task(engine.load(instance.id), waiting(instance, review), {"verdict": "ok"})
    instance = Engine(store=store, clock=clock).load(instance.id)
    assert instance.status == "waiting", instance.error
    assert [w["task_id"] for w in instance.waiting_for] == ["call_reviewer"]
    instance = engine.complete_user_task(instance, waiting(instance, "call_reviewer"), {"reached": "yes"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"by_phone": True, "reminders": [], "verdict": "ok", "outcome": "signed",
                                        "reached": "yes"}


def test_plain_spiffworkflow_drops_the_reminder_call_with_the_cycle(monkeypatch: pytest.MonkeyPatch) -> None:
    """What plain SpiffWorkflow 3.2 does with the shape above (on a patched clock): the review done,
    the workflow completes and call_reviewer is gone from its tree."""
    now = patch_spiff_timer_clock(monkeypatch, datetime.now(timezone.utc))
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(TIMERS))
    wf = BpmnWorkflow(parser.get_spec("Contract"), parser.get_subprocess_specs("Contract"))
    wf.task_tree.data["by_phone"] = True
    wf.do_engine_steps()
    now[0] += timedelta(hours=1.5)
    wf.refresh_timers()
    wf.do_engine_steps()
    assert sorted(t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.READY, manual=True)) == ["call_reviewer", "review"]
    [review] = wf.get_tasks(state=TaskState.READY, manual=True, spec_name="review")
    review.data["verdict"] = "ok"
    review.run()
    wf.do_engine_steps()
    assert wf.is_completed() and wf.get_tasks(spec_name="call_reviewer") == []


@pytest.mark.parametrize("kind", KINDS)
def test_the_deadline_cancels_the_called_review_after_the_reminders_due_before_it(tmp_path: Path, kind: str) -> None:
    """Reached only after 3.5 hours: the reminders due at 1 h and 2 h fire, then the deadline at
    3 h cancels the call (its person's task with it) and escalates. layerflow (as SpiffWorkflow
    after ``refresh_timers()``) fired one reminder and the deadline in that run: the 2 h one, due
    before the deadline, was missed (README: a run after several periods fires every missed
    repetition). The reminder paths that started run to their end: the deadline cancels the
    activity, not a path that left it."""
    path, review = _timers_on(kind, tmp_path)
    clock = Clock()
    engine, instance = _contract(clock, path=path)
    clock.now += 3.5 * HOUR
    instance = engine.run(instance)
    assert instance.status == "completed", instance.error
    taken = path_of(instance.workflow)
    assert review not in taken and {"escalate", "timed_out"} <= set(taken)
    assert taken.count("send_reminder") == 2, taken
    assert taken.index("give_up") > [i for i, t in enumerate(taken) if t == "how"][1], taken
    assert variables(instance.main)["outcome"] == "no review"


def test_a_second_message_on_a_non_interrupting_boundary_event_reads_what_the_first_path_wrote(
        tmp_path: Path) -> None:
    """The same reminder drawn as a message boundary event (a nudge from outside, twice while the
    review runs). Expected: reminders == ["mail", "mail"]: the second path starts after the first
    ended and reads its write. Each path forked from the flow's context and waited, unmerged, for
    the process's end, so both brought back ["mail"] and one reminder was lost."""
    text = TIMERS.read_text().replace(
        '<bpmn:timerEventDefinition><bpmn:timeCycle>"R2/PT1H"</bpmn:timeCycle></bpmn:timerEventDefinition>',
        '<bpmn:messageEventDefinition messageRef="nudge"/>').replace(
        "</bpmn:definitions>", '<bpmn:message id="nudge" name="nudge"/></bpmn:definitions>')
    path = tmp_path / "nudged.bpmn"
    path.write_text(text)
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"by_phone": False}))
    for _ in range(2):
        instance = engine.send_event(instance, "nudge", {})
    instance = engine.complete_user_task(instance, waiting(instance, "review"), {"verdict": "ok"})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("send_reminder") == 2
    assert variables(instance.main)["reminders"] == ["mail", "mail"]


# -- conditional_event.bpmn: a conditional event on a data object another branch writes -----------

CONDITIONAL_CATCH = HERE / "conditional_across_branches.bpmn"
CONDITIONAL_BOUNDARY = HERE / "conditional_boundary_across_branches.bpmn"


def _plain_in_order(path: Path, pid: str, steps: list[tuple[str, dict[str, Any]]]) -> BpmnWorkflow:
    """Plain SpiffWorkflow, a person completing the given tasks in the given order."""
    wf = plain_workflow(path, pid)
    for task_id, data in steps:
        [task] = [t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.task_spec.bpmn_id == task_id]
        task.data.update(data)
        task.run()
        wf.refresh_timers()
        wf.do_engine_steps()
    return wf


@pytest.mark.parametrize("path, pid, steps", [
    (CONDITIONAL_CATCH, "intermediate", [("task_b", {}), ("task_a", {"task_a_done": True})]),
    (CONDITIONAL_CATCH, "intermediate", [("task_a", {"task_a_done": True}), ("task_b", {})]),
    (CONDITIONAL_BOUNDARY, "boundary", [("task_c", {"task_c_done": True})]),
    (CONDITIONAL_BOUNDARY, "boundary", [("task_d", {}), ("task_c", {"task_c_done": True})]),
], ids=["catch-waits-for-the-other-branch", "catch-finds-it-written", "boundary-interrupts-d", "d-done-first"])
def test_a_conditional_event_fires_on_the_data_object_the_other_branch_writes(
        path: Path, pid: str, steps: list[tuple[str, dict[str, Any]]]) -> None:
    """The data object is the process's, whichever branch writes it (BPMN): the catch event (the
    boundary event on D) in one branch fires once task A (C) in the other has written it, and the
    path is plain SpiffWorkflow's. Expected: completed; when C comes first, its boundary event
    cancels D; the data object holds True (plain SpiffWorkflow keeps it in ``data_objects``)."""
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    for task_id, data in steps:
        instance = engine.complete_user_task(instance, waiting(instance, task_id), data)
    assert instance.status == "completed", instance.error
    wf = _plain_in_order(path, pid, steps)
    assert wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf)
    [(name, value)] = wf.data["data_objects"].items()
    assert variables(instance.main) == {name: value} == {name: True}


# -- a signal thrown in a called process, caught in a parallel branch of the caller ----------------

SIGNAL_FROM_CALL = HERE / "signal_from_called_process.bpmn"


def test_a_signal_a_called_process_throws_reaches_the_caller_s_waiting_branch_with_its_payload() -> None:
    """Expected, as in plain SpiffWorkflow: the throw inside the called process (after its person
    set parcels = 3) reaches the catch in the caller's other branch with the payload under
    ``ready``; that branch books the truck with it, the called process labels, the join merges
    both, the caller completes."""
    assert problems(SIGNAL_FROM_CALL) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([SIGNAL_FROM_CALL]), {}),
                          answers={"user_tasks": {"pack": {"parcels": 3}}})
    assert instance.status == "completed", instance.error
    wf, plain_data = run_plain(SIGNAL_FROM_CALL, {}, {"pack": {"parcels": 3}})
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == plain_data == {
        "parcels": 3, "labels": 6, "ready": {"parcels": 3}, "truck": "for 3 parcels"}


# -- correlation_two_conversations.bpmn: each instance of a sub-process in its own conversation ----

CORRELATED = HERE / "correlated_instances.bpmn"


def test_each_instance_gets_the_answer_its_correlation_key_names_and_the_prices_keep_the_orders_order() -> None:
    """Both instances send a request (order A, order B) and wait. The answer for B comes first.
    Expected: it goes to B's instance (its correlation key), A's still waits; then A's answer; the
    output collection lists the prices in the order of the orders (BPMN: an instance's output item
    takes its instance's place), [10, 20]. Plain SpiffWorkflow routes the answers the same way but
    lists the prices in the order the instances finished, [20, 10]."""
    assert problems(CORRELATED) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([CORRELATED]), {"orders": ["A", "B"]}))
    assert [(m["name"], m["payload"]) for m in instance.messages_out()] == [
        ("quote_request", {"order_id": "A"}), ("quote_request", {"order_id": "B"})]
    assert [w["task_id"] for w in instance.waiting_for] == ["response", "response"]
    instance = engine.send_event(instance, "quote_response", {"order_id": "B", "price": 20})
    assert [w["task_id"] for w in instance.waiting_for] == ["response"]
    instance = engine.send_event(instance, "quote_response", {"order_id": "A", "price": 10})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"orders": ["A", "B"], "prices": [10, 20], "sum_of_prices": 30}

    wf = plain_workflow(CORRELATED, "quotes", {"orders": ["A", "B"]})
    definition = next(t.task_spec.event_definition for t in wf.get_tasks() if t.task_spec.bpmn_id == "response")
    for payload in ({"order_id": "B", "price": 20}, {"order_id": "A", "price": 10}):
        correlations = definition.calculate_correlations(wf.script_engine, definition.correlation_properties, payload)
        wf.catch(BpmnEvent(definition, payload, correlations))
        wf.do_engine_steps()
    assert wf.is_completed() and path_of(wf) == path_of(instance.workflow)
    assert sorted((t.data["order"], t.data["price"]) for t in wf.get_tasks(spec_name="take_price")) == [("A", 10), ("B", 20)]
    assert wf.last_task.data["prices"] == [20, 10]


# -- boundary_event_split.bpmn: boundary events with no outgoing flow ------------------------------

NO_FLOW = HERE / "boundary_event_without_flow.bpmn"


def test_boundary_events_naming_no_signal_are_warned_of_and_the_default_way_runs_as_in_plain_spiffworkflow() -> None:
    """The first gateway's default flow leads to task_2 (its other flow is "False"). Expected: a
    warning for each boundary event (no signal named: nothing can fire it), and the person's
    task_2 then the end, as in plain SpiffWorkflow."""
    assert problems(NO_FLOW) == [("event_without_ref", "warning", "Event_0sh7wyp"),
                                 ("event_without_ref", "warning", "Event_00eeq9m")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([NO_FLOW]), {}), answers={"user_tasks": {"task_2": {"done": 1}}})
    assert instance.status == "completed", instance.error
    wf, plain_data = run_plain(NO_FLOW, {}, {"task_2": {"done": 1}})
    assert path_of(instance.workflow) == path_of(wf) == ["StartEvent_1", "gw_1", "task_2", "Event_0wmymez"]
    assert variables(instance.main) == plain_data == {"done": 1}


def test_an_interrupting_boundary_event_with_no_outgoing_flow_ends_the_path_it_interrupts(tmp_path: Path) -> None:
    """Its signal named: the signal cancels task_2 and the path ends at the boundary event (BPMN: a
    flow node with no outgoing flow ends its token), the process completes, as in plain
    SpiffWorkflow; the signal's payload keys are in the context (README), plain SpiffWorkflow drops
    a payload no variable names."""
    path = tmp_path / "stop.bpmn"
    path.write_text(NO_FLOW.read_text().replace(
        '<bpmn:signalEventDefinition id="SignalEventDefinition_0aridnp" />',
        '<bpmn:signalEventDefinition id="SignalEventDefinition_0aridnp" signalRef="stop" />').replace(
        "</bpmn:process>", '</bpmn:process><bpmn:signal id="stop" name="stop"/>'))
    assert problems(path) == [("event_without_ref", "warning", "Event_00eeq9m")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    instance = engine.send_event(instance, "stop", {"why": "withdrawn"}, kind="signal")
    assert instance.status == "completed", instance.error
    wf = plain_workflow(path, "Process_0ymnx41")
    wf.catch(BpmnEvent(SignalEventDefinition("stop"), {"why": "withdrawn"}))
    wf.do_engine_steps()
    assert wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf) == ["StartEvent_1", "gw_1", "Event_0sh7wyp"]
    assert variables(instance.main) == {"why": "withdrawn"} and dict(wf.last_task.data) == {}
