"""Shapes met in public BPMN files, round 14: the test processes of two JavaScript engines and of
bpmn.io's token simulation (paed01/bpmn-elements ``test/resources``, nitram509/lib-bpmn-engine
``test-cases``, bpmn-io/bpmn-js-token-simulation ``test/spec/simulator``), all Camunda Modeler
exports: an ad-hoc sub-process, transactions with compensation throw events and cancel end events,
a multi-instance service task with nothing to count, a data store read by a task, a sub-process
that holds only an event sub-process, nested multi-instance sub-processes looped back by a
gateway, a link event into a parallel join, a reminder cycle read from a variable, an event-based
gateway between two Zeebe messages, calls of a pool that is not executable, an error rethrown by an
error event sub-process, an escalation that an event sub-process and a boundary event could both
catch, compensation after an error event sub-process recovered, a multi-instance task with both a
Camunda collection and a cardinality, and a message flow to a pool. Each is in
``tests/engine/realworld14/`` (the file says where it comes from and what was redrawn). Where
plain SpiffWorkflow 3.2 runs a shape as BPMN means it, a case runs it there too and the path and
the variables must agree; where it does not, what it does is asserted too, so a SpiffWorkflow that
changes shows; where neither can run a file, ``layerflow validate`` must say so, naming the file,
the element and what to do, and doing that must give a file that runs."""

from __future__ import annotations

import json
import re
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.parser.BpmnParser import BpmnParser
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.bpmn.specs.event_definitions.message import MessageEventDefinition
from SpiffWorkflow.spiff.specs.event_definitions import SignalEventDefinition
from SpiffWorkflow.util.task import TaskState

from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import (cli_in_a_tmp_store, flow, patch_spiff_timer_clock, path_of, run_json, run_plain, script_task,
                            variables, write_elements)
from test_realworld_4 import rewritten
from test_realworld_12 import agree, plain_workflow, problems, run
from test_realworld_13 import Clock, waiting

HERE = Path(__file__).resolve().parent / "realworld14"
HOUR = 3600.0
cli = cli_in_a_tmp_store  # the fixture "cli", here too


def errors(path: Path) -> dict[str, str]:
    """validate's errors: element id -> message (each message names the file and the line)."""
    return {str(p.element_id): str(p) for p in validate_process([path]).problems if p.severity == "error"}


def plain_bpmn_workflow(path: Path, pid: str, data: dict[str, Any]) -> BpmnWorkflow:
    """SpiffWorkflow's BPMN parser (its own parser refuses a service task without its operator): its
    service tasks stay started, for the application to complete."""
    parser = BpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(pid))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    return wf


def complete_jobs(wf: BpmnWorkflow) -> None:
    for job in wf.get_tasks(state=TaskState.STARTED):
        job.data["by"] = job.task_spec.bpmn_id
        job.complete()
    wf.do_engine_steps()


# -- files neither runs: validate says what to change ----------------------------------------------

REFUSED = [
    ("ad_hoc_subprocess.bpmn", "adhoc", ["ad-hoc sub-process 'adhoc'", "draw the choice as a loop instead"],
     "eval() arg 1 must be a string"),
    ("end_compensate_mi.bpmn", "service", ["must specify a cardinality or a loop input data reference"],
     "A Service Task must have an operator"),
    ("data_store_reference.bpmn", "Task_1tsro36", ["reads the data store 'db'", "delete the association"],
     "Cannot resolve dataInputAssociation"),
    ("escalation_start_event.bpmn", "Task_0p9g5p1", ["has no start event", "draw a bpmn:startEvent in it"],
     "Exactly one start event is required"),
    ("call_non_executable_pool.bpmn", "call-activity", ["isExecutable='false'", 'set isExecutable="true" on that process'],
     "Process called-process is not executable"),
    ("throw_compensate_in_transaction.bpmn", "listen", ["runs no compensation", "draw the undo as part of the flow"],
     "Unsupported Catch Event"),
    ("transaction_user_cancel.bpmn", "compensateBound", ["runs no compensation", "draw the undo as part of the flow"],
     "Unsupported Catch Event"),
    ("compensation_after_error_recovery.bpmn", "COMP_A_BOUNDARY", ["runs no compensation"], "Unsupported Catch Event"),
    ("misp_loopback.bpmn", "sub", ["has no start event", "a sequence flow from it to 'subsub'"],
     "Exactly one start event is required"),
    ("link_to_parallel_join.bpmn", "task2", ["has 2 outgoing flows", "draw a parallel gateway after it"],
     "Multiple outgoing flows are not supported"),
]


@pytest.mark.parametrize("name, element, said, plain_error", REFUSED, ids=[r[0].removesuffix(".bpmn") for r in REFUSED])
def test_a_file_neither_engine_runs_is_refused_naming_the_file_the_element_and_what_to_do(
        name: str, element: str, said: list[str], plain_error: str) -> None:
    path = HERE / name
    found = errors(path)
    assert element in found, found
    assert name in found[element] and f"'{element}'" in found[element]
    for text in said:
        assert text in found[element]
    with pytest.raises(ProcessError, match=element):
        load_process([path])
    with pytest.raises(Exception, match=re.escape(plain_error)):
        run_plain(path, {}, {})


def test_validate_on_the_command_line_names_the_file_and_the_element(cli: Any) -> None:
    result = cli("validate", str(HERE / "data_store_reference.bpmn"))
    assert result.exit_code == 2, result.output
    assert "data_store_reference.bpmn" in result.output and "Task_1tsro36" in result.output


def test_the_called_pool_made_executable_is_refused_next_for_its_missing_start_event(tmp_path: Path) -> None:
    """Done as validate said (isExecutable="true"), the called pool, a lone manual task, is the next
    thing both engines refuse: validate names it and says to draw a start event."""
    path = rewritten(tmp_path, HERE / "call_non_executable_pool.bpmn", [('isExecutable="false"', 'isExecutable="true"')])
    found = errors(path)
    assert list(found) == ["called-process"]
    assert "has no start event" in found["called-process"] and "to 'task'" in found["called-process"]
    with pytest.raises(Exception, match="No start event found"):
        run_plain(path, {}, {})


# -- done as validate says, the files run as in plain SpiffWorkflow --------------------------------

SUB_START = ('      <bpmn:subProcess id="subsub">',
             '      <bpmn:startEvent id="sub_start"><bpmn:outgoing>to-subsub</bpmn:outgoing></bpmn:startEvent>\n'
             '      <bpmn:sequenceFlow id="to-subsub" sourceRef="sub_start" targetRef="subsub" />\n'
             '      <bpmn:sequenceFlow id="from-subsub" sourceRef="subsub" targetRef="sub_end" />\n'
             '      <bpmn:endEvent id="sub_end"><bpmn:incoming>from-subsub</bpmn:incoming></bpmn:endEvent>\n'
             '      <bpmn:subProcess id="subsub"><bpmn:incoming>to-subsub</bpmn:incoming>'
             '<bpmn:outgoing>from-subsub</bpmn:outgoing>')


@pytest.mark.parametrize("again, cardinality, runs", [(True, 2, 20), (False, 3, 15), (False, 0, 0)],
                         ids=["looped-back", "once", "no-instance"])
def test_nested_sequential_multi_instance_sub_processes_looped_back_count_as_in_plain_spiffworkflow(
        tmp_path: Path, again: bool, cardinality: int, runs: int) -> None:
    """The outer sub-process given the start event validate asked for: its instances (a variable
    cardinality) each run the inner one's five, and the gateway sends the whole back once: the path
    and the count are plain SpiffWorkflow's. The sub-process's Camunda 7 output parameter, a map
    with the key "tag" given twice, is run too (the later entry wins, as in Camunda's map), where
    SpiffWorkflow's parser ignores it."""
    path = rewritten(tmp_path, HERE / "misp_loopback.bpmn", [SUB_START])
    assert problems(path) == []
    data = {"cardinality": cardinality, "again": again}
    instance = run(path, data)
    wf, plain_data = run_plain(path, data, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    found = variables(instance.main)
    assert found.pop("process", None) == ({"tag": "purge:0:Completed"} if cardinality else None)
    assert found == plain_data == {**data, "runs": runs, "loopback": False}


WITHOUT_COMPENSATION = [
    ('''      <bpmn:boundaryEvent id="compensateBound" attachedToRef="mainTask">
        <bpmn:compensateEventDefinition />
      </bpmn:boundaryEvent>''', ""),
    ('''      <bpmn:scriptTask id="compensateTask" name="Compensate main" isForCompensation="true">
        <bpmn:script>reserved = False
released = True</bpmn:script>
      </bpmn:scriptTask>''', ""),
    ('<bpmn:association id="fwdMainEvents" sourceRef="compensateBound" targetRef="compensateTask" />', ""),
]


@pytest.mark.parametrize("answer, end", [("Yes", "end"), ("No", "endCancelled"), ("abort", "endErrored")])
def test_a_person_in_a_transaction_ends_it_by_a_cancel_or_an_error_end_event_on_plain_spiffworkflows_path(
        tmp_path: Path, answer: str, end: str) -> None:
    """The compensation left out, as validate says: the person's answer completes the transaction,
    cancels it (the default flow to the cancel end event, caught by the cancel boundary event) or
    aborts it (the error end event, caught by the error boundary event). The path is plain
    SpiffWorkflow's; after a cancel or an error layerflow keeps what the transaction wrote (README:
    the boundary event's path reads what the branch that reached the end event wrote), where plain
    SpiffWorkflow ends with no data at all."""
    path = rewritten(tmp_path, HERE / "transaction_user_cancel.bpmn", WITHOUT_COMPENSATION)
    assert problems(path) == []
    answers = {"areUSure": {"answer": answer}}
    instance = run(path, {}, {"user_tasks": answers})
    wf, plain_data = run_plain(path, {}, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf) and path_of(wf)[-1] == end
    assert variables(instance.main) == {"reserved": True, "answer": answer}
    assert plain_data == ({"reserved": True, "answer": answer} if answer == "Yes" else {})


def test_an_error_event_sub_process_recovers_a_sub_process_and_the_process_goes_on(tmp_path: Path) -> None:
    """compensation_after_error_recovery without its compensation (validate's advice): the
    sub-process ends in an error end event that its own error event sub-process catches; the
    sub-process ends there and the process goes on to its end. SpiffWorkflow 3.2 starts the catch-all
    error event sub-process at once, before the sub-process's first task (asserted); the data agree."""
    path = rewritten(tmp_path, HERE / "compensation_after_error_recovery.bpmn", [
        ('''<boundaryEvent id="COMP_A_BOUNDARY" name="COMP_A_BOUNDARY" attachedToRef="A">
        <compensateEventDefinition id="CompensateEventDefinition_1s71pfg" />
      </boundaryEvent>''', ""),
        ('<scriptTask id="COMP_A" name="COMP_A" isForCompensation="true"><script>reserved = 0</script></scriptTask>', ""),
        ('<association id="Association_1ool2cv" associationDirection="One" sourceRef="COMP_A_BOUNDARY" targetRef="COMP_A" />', ""),
        ('<compensateEventDefinition id="CompensateEventDefinition_0bcsv2i" activityRef="SUB" />', ""),
    ])
    assert problems(path) == []
    instance = run(path, {})
    wf, plain_data = run_plain(path, {}, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["START", "SUB_START", "A", "SUB_END", "EVENT_SUB_START", "RECOVER",
                                          "EVENT_SUB_END", "EVENT_SUB", "SUB", "COMPENSATION_END"]
    assert path_of(wf)[:4] == ["START", "EVENT_SUB_START", "RECOVER", "EVENT_SUB_END"]
    assert Counter(path_of(wf)) == Counter(path_of(instance.workflow))
    assert variables(instance.main) == plain_data == {"reserved": 1, "recovered": True}


# -- a link event into a parallel join ------------------------------------------------------------

FORK = [
    ('<bpmn:outgoing>Flow_06pnthd</bpmn:outgoing><bpmn:outgoing>Flow_1docann</bpmn:outgoing>',
     '<bpmn:outgoing>to-fork</bpmn:outgoing>'),
    ('sourceRef="task2" targetRef="tsk3"', 'sourceRef="fork" targetRef="tsk3"'),
    ('sourceRef="task2" targetRef="task4"', 'sourceRef="fork" targetRef="task4"'),
    ('    <bpmn:parallelGateway id="join">',
     '    <bpmn:sequenceFlow id="to-fork" sourceRef="task2" targetRef="fork" />\n'
     '    <bpmn:parallelGateway id="fork"><bpmn:incoming>to-fork</bpmn:incoming>'
     '<bpmn:outgoing>Flow_06pnthd</bpmn:outgoing><bpmn:outgoing>Flow_1docann</bpmn:outgoing></bpmn:parallelGateway>\n'
     '    <bpmn:parallelGateway id="join">'),
]


def test_a_link_from_one_path_of_an_exclusive_gateway_into_a_parallel_join_is_a_warning(tmp_path: Path) -> None:
    """With the parallel gateway validate asked for after task2, the join has three incoming flows:
    two from the fork on the gateway's default path, one from the link the other path jumps by. Only
    one of the gateway's paths runs, so the join waits for ever: validate warns, naming the join and
    the gateway (it said nothing: the walk back from the join stopped at the fork)."""
    path = rewritten(tmp_path, HERE / "link_to_parallel_join.bpmn", FORK)
    [found] = [p for p in validate_process([path]).problems if p.code == "join_never_complete"]
    assert (found.severity, found.element_id) == ("warning", "join")
    assert "different paths of 'gw'" in found.message and "merge them in an exclusive gateway" in found.message


@pytest.mark.parametrize("condition, plain_path_end", [(False, ["join", "complete-task", "end"]), (True, ["throw-link"])],
                         ids=["default-path", "link"])
def test_the_run_stops_at_the_join_naming_it_where_plain_spiffworkflow_goes_past_or_stops_silently(
        tmp_path: Path, condition: bool, plain_path_end: list[str]) -> None:
    """Either way the join misses a flow: layerflow stops there with an error naming it and what
    to change (README: a parallel join waits for every incoming flow). Plain SpiffWorkflow 3.2 fires
    the join without the link's flow on the default path, and on the link's path reports the
    workflow completed at the throw event, with the join and the task after it never run."""
    path = rewritten(tmp_path, HERE / "link_to_parallel_join.bpmn", FORK)
    instance = run(path, {"condition": condition})
    assert instance.status == "error" and instance.error["task_id"] == "join"
    assert "parallel gateway 'join' waits for 3 incoming flows" in instance.error["message"]
    wf, _ = run_plain(path, {"condition": condition}, {})
    assert path_of(wf)[-len(plain_path_end):] == plain_path_end


def test_the_command_line_reports_the_join_that_waits_for_ever(tmp_path: Path, cli: Any) -> None:
    path = rewritten(tmp_path, HERE / "link_to_parallel_join.bpmn", FORK)
    validated = cli("validate", str(path))
    assert validated.exit_code == 0 and "warning" in validated.output and "parallel gateway 'join'" in validated.output
    out = run_json(cli, "run", str(path), "--data", json.dumps({"condition": False}), code=1)
    assert (out["status"], out["error"]["task_id"]) == ("error", "join")


# -- errors and escalations: the nearest catch ------------------------------------------------------

RETHROW = HERE / "error_rethrow.bpmn"
CONFLICT = HERE / "escalation_boundary_and_event_sub.bpmn"


def test_an_error_event_sub_process_that_ends_in_an_error_hands_it_to_the_boundary_event_outside() -> None:
    """The sub-process's error end event starts its catch-all error event sub-process, whose own
    error end event throws on, out of the sub-process, to its catch-all error boundary event. Plain
    SpiffWorkflow 3.2 starts the error event sub-process at once, before the sub-process's first
    task, and ends with only the boundary path's write (asserted)."""
    assert problems(RETHROW) == []
    instance = run(RETHROW, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["START", "S_START", "S_WORK", "S_ERROR_END", "S_EVT_START", "S_EVT_NOTE",
                                          "S_EVT_END", "S_EVT", "S", "S_ERROR_BOUNDARY", "RECOVER", "CANCEL_END"]
    assert variables(instance.main) == {"worked": True, "handled_inside": True, "handled_outside": True}
    wf, plain_data = run_plain(RETHROW, {}, {})
    assert path_of(wf)[:2] == ["START", "S_EVT_START"] and Counter(path_of(wf)) == Counter(path_of(instance.workflow))
    assert plain_data == {"handled_outside": True}


def test_an_escalation_is_caught_by_the_event_sub_process_inside_not_the_boundary_event_outside() -> None:
    """Both catches are catch-alls and interrupting: BPMN gives the escalation to the innermost scope,
    the sub-process's event sub-process, which ends the sub-process (the step after the throw does not
    run); the process leaves it by its normal flow. Plain SpiffWorkflow 3.2 runs the event
    sub-process at once, without the escalation, and then lets the boundary event catch it too."""
    assert problems(CONFLICT) == []
    instance = run(CONFLICT, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["START", "START_SUB", "TRIGGER_E", "START_EVT_E", "IN_EVT_E", "END_EVT_E",
                                          "EVT_E", "SUB", "END"]
    assert variables(instance.main) == {"caught_by": "event sub-process"}
    wf, plain_data = run_plain(CONFLICT, {}, {})
    assert {"START_EVT_E", "AFTER_E", "BOUNDARY_E", "END_E"} <= set(path_of(wf)) and "END" not in path_of(wf)
    assert plain_data == {"caught_by": "boundary event"}


# -- a reminder cycle read from a variable ---------------------------------------------------------

REMINDER = HERE / "user_task_reminder_cycle.bpmn"


def test_each_reminder_of_a_cycle_read_from_a_variable_counts_on_from_the_last(monkeypatch: pytest.MonkeyPatch) -> None:
    """R3/PT1H, read from the variable as the timer starts, fires three times while the person's task
    waits; each reminder's path counts one more and sets a new cycle, which the running timer does
    not read again. Expected: three reminders, the last count 3. The paths are plain
    SpiffWorkflow's; plain SpiffWorkflow ends with reminders == 0, every path's count dropped with
    its path (README: a non-interrupting boundary event's path merges where it ends)."""
    assert problems(REMINDER) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([REMINDER]), {"cycle": "R3/PT1H"}))
    now = patch_spiff_timer_clock(monkeypatch, datetime.now(timezone.utc))
    wf = plain_workflow(REMINDER, {"cycle": "R3/PT1H"})
    for _ in range(4):
        clock.now += 1.5 * HOUR
        instance = engine.run(instance)
        now[0] += timedelta(hours=1.5)
        wf.refresh_timers()
        wf.do_engine_steps()
    instance = engine.complete_user_task(instance, waiting(instance, "user-task"), {"done": True})
    [person] = wf.get_tasks(state=TaskState.READY, manual=True)
    person.data["done"] = True
    person.run()
    wf.do_engine_steps()
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert Counter(path_of(instance.workflow)) == Counter(path_of(wf))
    assert path_of(wf).count("notify") == 3
    assert variables(instance.main) == {"cycle": "R3/PT1H", "reminderCycle": "R1/PT2H", "reminders": 3, "done": True}
    assert wf.last_task.data["reminders"] == 0


# -- an event-based gateway between two Zeebe messages ---------------------------------------------

MESSAGES = HERE / "two_tasks_shared_message_event.bpmn"


@pytest.mark.parametrize("message, task", [("msg-a", "task-a"), ("msg-b", "task-b")])
def test_the_message_that_comes_first_takes_its_path_and_its_job_worker_runs_as_a_handler(message: str, task: str) -> None:
    """Zeebe's job workers are other engines' settings (warnings naming them, and saying to give a
    handler); with a handler per task, the gateway waits for either message and takes the path of
    the one sent. SpiffWorkflow's own parser refuses a service task without its operator; its BPMN
    parser runs the same path, leaving each service task started for the application to complete
    (done here as the handler does)."""
    assert {(code, element) for code, _, element in problems(MESSAGES)} == {
        ("no_implementation", "task-a"), ("foreign_extension", "task-a"),
        ("no_implementation", "task-b"), ("foreign_extension", "task-b")}
    with pytest.raises(Exception, match="A Service Task must have an operator"):
        run_plain(MESSAGES, {}, {})
    handlers = {t: (lambda actx, t=t: {"by": t}) for t in ("task-a", "task-b")}
    engine = Engine(store="memory://", handlers=handlers)
    instance = engine.run(engine.start(load_process([MESSAGES]), {"key": "k-1"}))
    assert sorted(w["event"] for w in instance.waiting_for) == ["msg-a", "msg-b"]
    instance = engine.send_event(instance, message, {"amount": 3})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"key": "k-1", "amount": 3, "by": task}
    wf = plain_bpmn_workflow(MESSAGES, "two-tasks-shared-message-event", {"key": "k-1"})
    wf.catch(BpmnEvent(MessageEventDefinition(message), {"amount": 3}))
    wf.do_engine_steps()
    complete_jobs(wf)
    assert wf.is_completed() and path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == wf.last_task.data


# -- a multi-instance task with a Camunda collection and a cardinality -----------------------------

MI = HERE / "mi_collection_and_cardinality.bpmn"


def test_a_parallel_multi_instance_task_whose_first_instance_meets_the_completion_condition_runs_once() -> None:
    """camunda:collection is Camunda's (a warning saying to give a loopDataInputRef), so the
    cardinality, 10, counts the instances; the first instance sets what the completionCondition
    reads, so the activity completes there and the other nine are cancelled, as BPMN says. Plain
    SpiffWorkflow 3.2 cancels them too, but its engine step has already listed them as ready and
    runs all ten (asserted); the data agree."""
    [(code, severity, element)] = problems(MI)
    assert (code, severity, element) == ("foreign_extension", "warning", "recurring")
    instance = run(MI, {"list": ["a", "b", "c"]})
    wf, plain_data = run_plain(MI, {"list": ["a", "b", "c"]}, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("recurring") == 2  # the activity and its one instance
    assert path_of(wf).count("recurring") == 11
    assert variables(instance.main) == plain_data == {"list": ["a", "b", "c"], "done": True}


# -- a message flow to a pool ----------------------------------------------------------------------

POOLS = HERE / "message_flow_to_pool.bpmn"


def test_a_none_throw_event_with_a_message_flow_to_a_pool_runs_as_in_plain_spiffworkflow(cli: Any) -> None:
    """The message flow goes to the other pool itself, which is not executable: a drawing of who is
    told. The throw event has no event definition, so it is a plain step in both engines."""
    agree(POOLS, {})
    out = run_json(cli, "run", str(POOLS))
    assert (out["status"], out["process_id"]) == ("completed", "Process_1")


# -- two signal start events, one naming no signal --------------------------------------------------

SIGNAL_STARTS = HERE / "multiple_signal_start_events.bpmn"


@pytest.mark.parametrize("signal, end", [("Signal_1b3rdmo", "named-end"), ("Start 1", "end")])
def test_either_signal_start_event_starts_the_process_as_in_plain_spiffworkflow(signal: str, end: str) -> None:
    """Both start events wait; the signal sent starts its path into the one task and the gateway. The
    start event that names no bpmn:signal waits, in both engines, for a signal named like the event
    itself ("Start 1"): validate's warning says so, and to name a bpmn:signal (it said that nothing
    could send it and that it never fires)."""
    [warning] = validate_process([SIGNAL_STARTS]).problems
    assert (warning.code, warning.severity, warning.element_id) == ("event_without_ref", "warning", "start1")
    assert "'Start 1'" in warning.message and 'signalRef="ID"' in warning.message, warning.message
    assert "never" not in warning.message, warning.message
    data = {"named": signal == "Signal_1b3rdmo"}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([SIGNAL_STARTS]), data))
    assert sorted((w["task_id"], w["event"]) for w in instance.waiting_for) == [
        ("start1", "Start 1"), ("start2", "Signal_1b3rdmo")]
    instance = engine.send_event(instance, signal, kind="signal")
    wf = plain_workflow(SIGNAL_STARTS, data)
    wf.catch(BpmnEvent(SignalEventDefinition(signal)))
    wf.do_engine_steps()
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf) and path_of(wf)[-1] == end
    assert variables(instance.main) == wf.last_task.data == {**data, "seen": True}


# -- an event-based gateway with two flows to one signal event -------------------------------------

SAME_TARGET = HERE / "event_gateway_same_target.bpmn"


@pytest.mark.parametrize("fire", ["signal", "timer"])
def test_an_event_gateway_with_two_flows_to_one_event_waits_for_it_once(monkeypatch: pytest.MonkeyPatch, fire: str) -> None:
    """The two flows to the signal event make it one event the gateway waits for, beside the timer:
    the first to come takes its path into the task (which runs once) and the other is withdrawn,
    as in plain SpiffWorkflow."""
    assert problems(SAME_TARGET) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([SAME_TARGET]), {}))
    assert sorted(w["task_id"] for w in instance.waiting_for) == ["gateway", "timerEvent"]
    now = patch_spiff_timer_clock(monkeypatch, datetime.now(timezone.utc))
    wf = plain_workflow(SAME_TARGET, {})
    if fire == "signal":
        instance = engine.send_event(instance, "signalEvent", kind="signal")
        wf.catch(BpmnEvent(SignalEventDefinition("signalEvent")))
    else:
        clock.now += 1.5 * HOUR
        instance = engine.run(instance)
        now[0] += timedelta(hours=1.5)
        wf.refresh_timers()
    wf.do_engine_steps()
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf) and path_of(wf).count("task1") == 1
    assert f"{fire}Event" in path_of(wf)
    assert variables(instance.main) == wf.last_task.data == {"handled": 1}


# -- inclusive gateways in a row, every path to an end of its own ----------------------------------

ICICLE = HERE / "inclusive_gateway_icicle.bpmn"
ALWAYS = '<bpmn:conditionExpression xsi:type="bpmn:tFormalExpression">True</bpmn:conditionExpression>'


@pytest.mark.parametrize("take2, take4, written", [
    (True, True, {"one": 1, "two": 2, "three": 3, "four": 4}),
    (False, False, {"one": 1, "three": 3}),
], ids=["every-flow", "unconditional-flows-only"])
def test_inclusive_splits_whose_paths_never_join_run_every_chosen_path_as_in_plain_spiffworkflow(
        tmp_path: Path, take2: bool, take4: bool, written: dict[str, int]) -> None:
    """The flows without a condition given the "True" validate asked for (BPMN takes them always):
    each split runs the flows whose condition holds, each path to its own end event; what every path
    wrote is in the end (the paths end at end events, which merge), as in plain SpiffWorkflow."""
    found = errors(ICICLE)
    assert sorted(found) == ["Flow_0596vdo", "Flow_1To2", "Flow_1ToTask1", "Flow_2To3", "Flow_3ToTask3"]
    assert "write <bpmn:conditionExpression>True</bpmn:conditionExpression> in it" in found["Flow_1To2"]
    pairs = [(f'<bpmn:sequenceFlow id="{f}" sourceRef="{s}" targetRef="{t}" />',
              f'<bpmn:sequenceFlow id="{f}" sourceRef="{s}" targetRef="{t}">{ALWAYS}</bpmn:sequenceFlow>')
             for f, s, t in [("Flow_1ToTask1", "Gateway_1", "Activity_1"), ("Flow_1To2", "Gateway_1", "Gateway_2"),
                             ("Flow_2To3", "Gateway_2", "Gateway_3"), ("Flow_3ToTask3", "Gateway_3", "Activity_3"),
                             ("Flow_0596vdo", "Gateway_3", "end")]]
    path = rewritten(tmp_path, ICICLE, pairs)
    data = {"take2": take2, "take4": take4}
    instance, wf = agree(path, data)
    assert variables(instance.main) == {**data, **written}


def test_nested_splits_without_joins_inside_a_sub_process_merge_at_its_end_while_a_person_waits(tmp_path: Path) -> None:
    """The same shape inside a sub-process, one path a person's task, saved and loaded between the
    steps: the sub-process ends once the person is done, and the step after it reads what every
    path wrote, as in plain SpiffWorkflow."""
    inner = [
        '<bpmn:startEvent id="s_start"/>', '<bpmn:parallelGateway id="outer"/>', '<bpmn:parallelGateway id="nested"/>',
        script_task("a", "a = 1"), script_task("b", "b = 2"), '<bpmn:userTask id="c"/>',
        '<bpmn:endEvent id="end_a"/>', '<bpmn:endEvent id="end_b"/>', '<bpmn:endEvent id="end_c"/>',
        flow("s_start", "outer"), flow("outer", "a"), flow("a", "end_a"), flow("outer", "nested"),
        flow("nested", "b"), flow("b", "end_b"), flow("nested", "c"), flow("c", "end_c")]
    path = write_elements(tmp_path, "nested_ends", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:subProcess id="sub">{"".join(inner)}</bpmn:subProcess>',
        script_task("after", "total = a + b + c"), '<bpmn:endEvent id="end"/>',
        flow("start", "sub"), flow("sub", "after"), flow("after", "end")])
    assert problems(path) == []
    store = "sqlite:///" + str(tmp_path / "lf.db")
    instance = Engine(store=store).run(Engine(store=store).start(load_process([path]), {}))
    assert [w["task_id"] for w in instance.waiting_for] == ["c"]
    engine = Engine(store=store)
    instance = engine.complete_user_task(engine.load(instance.id), waiting(instance, "c"), {"c": 3})
    assert instance.status == "completed", instance.error
    wf, plain_data = run_plain(path, {}, {"c": {"c": 3}})
    assert Counter(path_of(instance.workflow)) == Counter(path_of(wf))
    assert variables(instance.main) == plain_data == {"a": 1, "b": 2, "c": 3, "total": 6}


# -- a Zeebe timer whose duration is a FEEL variable -----------------------------------------------

FEEL_TIMER = HERE / "feel_timer_from_variable.bpmn"


@pytest.mark.parametrize("first, task", [("timer", "task-for-timer"), ("message", "task-for-message")])
def test_a_feel_timer_duration_is_refused_with_the_python_to_write_and_then_runs_as_in_plain_spiffworkflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: str, task: str) -> None:
    """validate names the timer and its timeDuration and says to write the variable's name; done so,
    the gateway waits for the message or the duration the variable holds, and the first to come takes
    its path to its job worker (a handler here), on plain SpiffWorkflow's path."""
    found = errors(FEEL_TIMER)
    assert list(found) == ["timer1"] and "timeDuration '=timeoutValue'" in found["timer1"]
    assert "write 'timeoutValue'" in found["timer1"]
    path = rewritten(tmp_path, FEEL_TIMER, [(">=timeoutValue<", ">timeoutValue<")])
    assert not errors(path)
    data = {"timeoutValue": "PT1M"}
    clock = Clock()
    engine = Engine(store="memory://", clock=clock, handlers={t: (lambda actx, t=t: {"by": t})
                                                               for t in ("task-for-timer", "task-for-message")})
    instance = engine.run(engine.start(load_process([path]), data))
    now = patch_spiff_timer_clock(monkeypatch, datetime.now(timezone.utc))
    wf = plain_bpmn_workflow(path, "message-intermediate-timer-event", data)
    if first == "timer":
        clock.now += 120
        instance = engine.run(instance)
        now[0] += timedelta(minutes=2)
        wf.refresh_timers()
        wf.do_engine_steps()
    else:
        instance = engine.send_event(instance, "message", {"reply": "yes"})
        wf.catch(BpmnEvent(MessageEventDefinition("message"), {"reply": "yes"}))
        wf.do_engine_steps()
    complete_jobs(wf)
    assert instance.status == "completed" and wf.is_completed(), instance.error
    assert path_of(instance.workflow) == path_of(wf) and task in path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data)
