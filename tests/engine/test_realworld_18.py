"""Shapes met in public BPMN files, round 18: the reference models of the BPMN Model Interchange
Working Group (bpmn-miwg/bpmn-miwg-test-suite), which every evaluator of a BPMN engine reaches for
first, as Trisotech's Visio add-in exports them: A.1.0 (a straight sequence of tasks), A.3.0 (a
collapsed sub-process with boundary events), A.4.0 (a pool, and a process with lanes that the
collaboration draws no pool for), B.1.0 (a collaboration of two pools that exchange messages, with
call activities, a collapsed sub-process, a data store and a terminate end event) and the process
B.2.0's call activity calls (a bare multi-instance marker, two start events, a message boundary
event). Each is in ``tests/engine/realworld18/`` (the file says where it comes from and what was
trimmed). Where plain SpiffWorkflow 3.2 runs a file, a case runs it there too and the path and the
variables must agree; where a file means something neither can run, ``layerflow validate`` must
say so, naming the file, the element and what to do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.exceptions import WorkflowDataException
from SpiffWorkflow.exceptions import WorkflowException
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import rewritten
from test_realworld_12 import agree, plain_workflow, problems
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld18"


# -- A.1.0: three tasks in a row -------------------------------------------------------------------

A10 = HERE / "miwg_a10_sequence.bpmn"
A10_TASKS = ["_ec59e164-68b4-4f94-98de-ffb1c58a84af", "_820c21c0-45f3-473b-813f-06381cc637cd",
             "_e70a6fcb-913c-4a7b-a65d-e83adc73d69c"]


def test_the_miwg_sequence_is_refused_as_not_executable_then_runs_its_tasks_as_peoples_steps(tmp_path: Path) -> None:
    """A descriptive model: isExecutable="false" is the one thing validate refuses. Made executable,
    each bpmn:task is a person's step, run in turn as in plain SpiffWorkflow."""
    refused = said(A10)
    assert list(refused) == ["WFP-6-"] and refused["WFP-6-"].startswith("error:")
    assert "isExecutable" in refused["WFP-6-"] and "miwg_a10_sequence.bpmn" in refused["WFP-6-"]
    path = rewritten(tmp_path, A10, [('isExecutable="false"', 'isExecutable="true"')])
    instance, wf = agree(path, {}, {tid: {f"task{n}": "done"} for n, tid in enumerate(A10_TASKS, 1)})
    assert path_of(wf)[1:4] == A10_TASKS
    assert variables(instance.main) == {"task1": "done", "task2": "done", "task3": "done"}


# -- B.1.0: two pools, call activities, a data store, messages ------------------------------------

B10 = HERE / "miwg_b10_collaboration.bpmn"
COLLABORATION = "C1373655174958"
STORE = "DS1373655174514"
SEND, MESSAGE_START = "_219b9ca1-d4c5-497d-a4f7-06a44a6da20e", "_a38484e2-7bdb-48b1-b62e-139d51d6a147"
MESSAGE_END, RECEIVE = "_2ee553a1-cb03-41e3-b285-345c826fc88d", "_ec919941-53ec-403d-97e1-6a163a063f21"
SERVICE_7 = "_fea1c5af-6c76-403f-809e-26d476d92741"
MESSAGES = ["Message_1373655174959", "Message_1373655174960"]


def b10_runnable(tmp_path: Path, *, names: bool = True) -> Path:
    """B.1.0 with what validate asks for: every process executable, the data store left out (the
    service task reads its data object only), the timer given a duration, the global-task call
    given the process it calls, the collapsed sub-process a start and an end, each split a default
    and a condition, the message flows' ends drawn as a send task and a receive task, Service Task 7
    a person's step (plain SpiffWorkflow loads no service task without a spiffworkflow operator)
    and, unless ``names`` is False, a name for each message."""
    text = B10.read_text()

    def cut(start: str, end: str) -> str:
        at = text.index(start)
        return text[text.rindex("\n", 0, at) + 1:text.index(end, at) + len(end) + 1]

    edits = [
        ('isExecutable="false"', 'isExecutable="true"'),
        (cut('<semantic:dataStore capacity', "/>"), ""),
        (cut("<semantic:dataStoreReference", "/>"), ""),
        (cut("<semantic:dataOutputAssociation", "</semantic:dataOutputAssociation>"), ""),
        ("<semantic:timeDate/>", '<semantic:timeDuration>"PT0S"</semantic:timeDuration>'),
        ('name="Call Activity Calling a Global Task"', 'calledElement="WFP-0-" name="Call Activity Calling a Global Task"'),
        ('name="Exclusive Gateway Divergence 1"',
         'name="Exclusive Gateway Divergence 1" default="_eeb6812d-d182-489f-aea2-493ab8732cfd"'),
        ('name="Exclusive Gateway Divergence 2"',
         'name="Exclusive Gateway Divergence 2" default="_6a248585-952e-40ff-82ec-b6d8f410b73a"'),
        *[(f'name="" id="{flow}"/>', f'name="" id="{flow}"><semantic:conditionExpression>collapsed'
           "</semantic:conditionExpression></semantic:sequenceFlow>")
          for flow in ("_6ee42e88-3d90-4259-83c0-9abd4574a15a", "_9d489bd9-9435-4692-bc98-4cdda4a61569")],
        ("<semantic:outgoing>_d234800f-72d3-46cb-b603-30f1da7b1205</semantic:outgoing>\n",
         "<semantic:outgoing>_d234800f-72d3-46cb-b603-30f1da7b1205</semantic:outgoing>\n"
         '<semantic:startEvent id="collapsed_start"/><semantic:endEvent id="collapsed_end"/>'
         '<semantic:sequenceFlow sourceRef="collapsed_start" targetRef="collapsed_end" id="collapsed_flow"/>\n'),
        (f'name="Abstract Task 1" id="{SEND}">', f'name="Abstract Task 1" id="{SEND}" messageRef="{MESSAGES[0]}">'),
        ("<semantic:task completionQuantity=\"1\" isForCompensation=\"false\" startQuantity=\"1\" name=\"Abstract Task 1\"",
         "<semantic:sendTask completionQuantity=\"1\" isForCompensation=\"false\" startQuantity=\"1\" name=\"Abstract Task 1\""),
        ("_a1505d79-bbc0-42cf-866a-401a2f94b675</semantic:outgoing>\n        </semantic:task>",
         "_a1505d79-bbc0-42cf-866a-401a2f94b675</semantic:outgoing>\n        </semantic:sendTask>"),
        ('<semantic:serviceTask implementation="##WebService" completionQuantity="1" isForCompensation="false" '
         'startQuantity="1" name="Service Task 3"', f'<semantic:receiveTask messageRef="{MESSAGES[1]}" name="Service Task 3"'),
        ("_bbb25218-69a3-4401-823f-22f468cbd80d</semantic:outgoing>\n        </semantic:serviceTask>",
         "_bbb25218-69a3-4401-823f-22f468cbd80d</semantic:outgoing>\n        </semantic:receiveTask>"),
        ('<semantic:serviceTask implementation="##WebService" completionQuantity="1" isForCompensation="false" '
         'startQuantity="1" name="Service Task 7"', '<semantic:task name="Service Task 7"'),
        ("</semantic:dataInputAssociation>\n        </semantic:serviceTask>",
         "</semantic:dataInputAssociation>\n        </semantic:task>"),
    ]
    if names:
        edits += [(f'<semantic:message id="{m}"/>', f'<semantic:message id="{m}" name="Message Flow {n}"/>')
                  for n, m in enumerate(MESSAGES, 1)]
    return rewritten(tmp_path, B10, edits)


def test_the_miwg_collaboration_is_refused_naming_each_element_and_the_data_store_by_its_id() -> None:
    """Nothing executable, a timer start with an empty timeDate, a call activity that calls nothing
    and two that call processes not executable, a collapsed sub-process with no start event, splits
    with bare flows, a data store: each is named with what to do, no traceback. The store's name
    is written over two lines ("Data&#10;Store Reference"): validate repeated SpiffWorkflow's "Data
    Store with name Data / Store Reference has no implementation; fix the BPMN element named here",
    naming no element, on two lines; it names the store by its id and line."""
    refused = said(B10)
    assert STORE in refused and refused[STORE].startswith("error:")
    assert "bpmn:dataStore 'DS1373655174514'" in refused[STORE] and "has no implementation" in refused[STORE]
    assert not any("named here" in text for text in refused.values())
    for process in ("Process_ba16239e-181e-4b9f-bc5b-0bb2ee973450", "WFP-6-1", "WFP-6-2", "WFP-0-"):
        assert "isExecutable" in refused[process]
    assert "neither when nor how long" in refused["_e314751e-5c3a-41f2-a1ae-4cb99efa0916"]
    assert "has no calledElement" in refused["_fa3a8e53-5be0-4f0b-8680-d2498e255209"]
    assert "has no start event" in refused["_1eb62392-1f21-4a63-bbcb-c78880c3165e"]
    assert len([t for t in refused.values() if "has no condition and is not the default flow" in t]) == 4


def test_two_messages_without_a_name_are_refused_for_spiffworkflow_routes_them_as_one(tmp_path: Path) -> None:
    """The two bpmn:messages have ids only. SpiffWorkflow routes a message by its name: both are
    named None to it, so the message end event meant for the other pool's receive task restarted
    its own pool's message start event (layerflow ran the pool over and over, then waited).
    validate passed the file; it refuses each message, naming the other and the events using it."""
    path = b10_runnable(tmp_path, names=False)
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    spec, subprocesses = parser.get_collaboration(COLLABORATION)
    events = {t.bpmn_id: t.event_definition.name for s in [spec, *subprocesses.values()]
              for t in s.task_specs.values() if type(getattr(t, "event_definition", None)).__name__ == "MessageEventDefinition"}
    assert events == {SEND: None, MESSAGE_START: None, MESSAGE_END: None, RECEIVE: None}
    assert problems(path) == [("message_without_name", "error", MESSAGES[0]),
                              ("message_without_name", "error", MESSAGES[1])]
    refused = said(path)
    assert repr(MESSAGES[1]) in refused[MESSAGES[0]] and repr(MESSAGE_START) in refused[MESSAGES[0]]
    assert "routes a message by its name" in refused[MESSAGES[0]] and 'name="..."' in refused[MESSAGES[0]]


def plain_in_order(path: Path, data: dict[str, Any], answers: dict[str, dict[str, Any]], order: list[str]) -> BpmnWorkflow:
    """The collaboration in plain SpiffWorkflow, its people's steps answered in ``order`` (the order
    layerflow took them: which pool reaches its terminate end event first depends on it)."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(*parser.get_collaboration(COLLABORATION))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    while ready := wf.get_tasks(state=TaskState.READY, manual=True):
        task = min(ready, key=lambda t: order.index(t.task_spec.bpmn_id))
        task.data.update(answers[task.task_spec.bpmn_id])
        task.run()
        wf.do_engine_steps()
    return wf


B10_ANSWERS = {"_f7eade87-bb98-47d3-85c7-66033a62b124": {"user2": 1}, "_7706e700-2aed-4b94-8070-961f118aab8f": {"user5": 1},
               "_c57a5344-213f-4834-a6c3-94ce878b413c": {"task4": 1}, "_47207d3b-8dc2-4679-bf33-c1e7e677765b": {"task8": 1},
               "_6936f794-7bbb-4aa1-ae48-3a35bab4e2f4": {"task6": 1}, SERVICE_7: {"service7": 1}}


def test_the_miwg_collaboration_runs_both_pools_and_their_messages_as_in_plain_spiffworkflow(tmp_path: Path) -> None:
    """With names, no process named: layerflow runs the collaboration (both pools, one instance).
    The send task starts the other pool at its message start event; that pool's calls end at its
    message end event while the first pool's person is still at User Task 2; the other branch
    reaches the terminate end event. Plain SpiffWorkflow, its people's steps answered in the same
    order, takes the same path up to the receive task, but the message came before the receive
    task waited and is lost: it waits for ever. layerflow keeps the message for the pool that
    catches it (README, "a message a pool throws waits for the pool that catches it") and completes.
    The terminate end event cuts off the branch of the calls (task4, task8) in both."""
    path = b10_runnable(tmp_path)
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"collapsed": True}), answers={"user_tasks": B10_ANSWERS})
    assert instance.status == "completed", instance.error
    assert instance.to_document()["process_id"] == COLLABORATION
    done = path_of(instance.workflow)
    assert done.index(SEND) < done.index(MESSAGE_START) < done.index(MESSAGE_END) < done.index(RECEIVE)
    assert done.index(MESSAGE_END) < done.index("_f7eade87-bb98-47d3-85c7-66033a62b124") < done.index(RECEIVE)
    wf = plain_in_order(path, {"collapsed": True}, B10_ANSWERS, done)
    assert not wf.is_completed()
    assert [t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.WAITING)] == [RECEIVE]
    assert path_of(wf) == [t for t in done if t not in (RECEIVE, "_94efa7e0-2322-4fc3-a5bf-6c6296488927", "WFP-6-1")]
    # the pool ends with its terminate branch's data, in both: the branch of the calls is cut off
    [pool] = [t for t in wf.get_tasks(state=TaskState.COMPLETED) if t.task_spec.name == "WFP-6-2"]
    assert dict(pool.data) == {"collapsed": True, "user5": 1, "task6": 1}
    assert variables(instance.main) == {**pool.data, "user2": 1}


def test_a_task_reading_a_data_object_never_written_stops_named_where_plain_spiffworkflow_raises(tmp_path: Path) -> None:
    """Service Task 7 reads "Data Object", which no step writes. Plain SpiffWorkflow raises
    WorkflowDataException out of do_engine_steps; layerflow's instance stops in error at the task,
    naming the data input and what to do."""
    path = b10_runnable(tmp_path)
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"collapsed": False}), answers={"user_tasks": B10_ANSWERS})
    assert instance.status == "error" and instance.error["task_id"] == SERVICE_7
    assert "Din1373655174951" in instance.error["message"] and "Set them before the task" in instance.error["message"]
    with pytest.raises(WorkflowDataException):
        plain_in_order(path, {"collapsed": False}, B10_ANSWERS, path_of(instance.workflow) + list(B10_ANSWERS))


# -- A.3.0: a collapsed sub-process with a message and an escalation boundary event ---------------

A30 = HERE / "miwg_a30_boundary_events.bpmn"
A30_MESSAGE = "Boundary Intermediate Event Non-Interrupting Message"
A30_SUB, A30_BOUNDARY = "_1ae31d1b-2559-4f78-a3ec-47986a49db48", "_428dcbf5-8e5e-48e0-9c0c-d93003fa8c82"
A30_TASK = {"Task 1": "_65f5459f-44ae-436d-a089-a91d6d78075b", "Task 2": "_2d2d0d29-896f-49f9-8109-77a7304309c5",
            "Task 3": "_72204cd7-709c-4656-9554-3ae29b3844ce"}
A30_INNER = ("<semantic:outgoing>_250377d0-628d-463f-95f6-1f4ceed9bd8a</semantic:outgoing>\n        </semantic:subProcess>",
             "<semantic:outgoing>_250377d0-628d-463f-95f6-1f4ceed9bd8a</semantic:outgoing>\n"
             '<semantic:startEvent id="inner_start"/><semantic:task id="inner_task"/><semantic:endEvent id="inner_end"/>'
             '<semantic:sequenceFlow id="to_inner" sourceRef="inner_start" targetRef="inner_task"/>'
             '<semantic:sequenceFlow id="from_inner" sourceRef="inner_task" targetRef="inner_end"/>\n        </semantic:subProcess>')


def test_a_non_interrupting_message_on_the_collapsed_sub_process_runs_task_3_beside_it(tmp_path: Path) -> None:
    """The collapsed sub-process has no start event (refused, as is isExecutable="false"); the
    message boundary event names no message (warned: it waits for one named like the event). Given
    a step inside, the message while it waits starts Task 3 beside it; both paths end at End Event
    1, as in plain SpiffWorkflow. Plain SpiffWorkflow drops the payload of a message that names no
    variable; layerflow keeps its keys."""
    refused = said(A30)
    assert "isExecutable" in refused["WFP-6-"] and "has no start event" in refused[A30_SUB]
    assert refused[A30_BOUNDARY].startswith("warning:") and repr(A30_MESSAGE) in refused[A30_BOUNDARY]
    path = rewritten(tmp_path, A30, [('isExecutable="false"', 'isExecutable="true"'), A30_INNER])
    assert problems(path) == [("event_without_ref", "warning", A30_BOUNDARY)]
    answers = {A30_TASK["Task 1"]: {"task1": 1}, "inner_task": {"inner": 1}, A30_TASK["Task 2"]: {"task2": 1},
               A30_TASK["Task 3"]: {"task3": 1}}
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([path]), {}), answers={"user_tasks": {A30_TASK["Task 1"]: {"task1": 1}}})
    assert [(w["task_id"], w.get("event")) for w in waiting.waiting_for] == [("inner_task", None), (A30_BOUNDARY, A30_MESSAGE)]
    beside = engine.send_event(waiting, A30_MESSAGE, {"note": "hurry"}, kind="message")
    assert {w["task_id"] for w in beside.waiting_for} == {"inner_task", A30_TASK["Task 3"], A30_BOUNDARY}
    done = engine.run(beside, answers={"user_tasks": answers})
    assert done.status == "completed", done.error

    wf = plain_workflow(path, {})
    order = [t for t in path_of(done.workflow) if t in answers]
    for step, tid in enumerate(order):
        if step == 1:
            wf.catch(BpmnEvent(MessageEventDefinition(A30_MESSAGE), {"note": "hurry"}))
            wf.do_engine_steps()
        [task] = [t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.task_spec.bpmn_id == tid]
        task.data.update(answers[tid])
        task.run()
        wf.do_engine_steps()
    assert wf.is_completed() and path_of(wf) == path_of(done.workflow)
    assert path_of(wf).count("_ce253897-4300-4b24-b71f-4c9535698c70") == 2
    assert dict(wf.last_task.data) == {"task1": 1, "inner": 1, "task2": 1, "task3": 1}
    assert variables(done.main) == {**wf.last_task.data, "note": "hurry"}


# -- A.4.0: a pool, and a process with lanes the collaboration draws no pool for -------------------

A40 = HERE / "miwg_a40_pool_and_lanes.bpmn"
A40_COLLABORATION, TASK_3 = "C1372429787502", "_6fed62c8-8241-4a1d-ae67-266fda7dcead"
A40_FLOWS = ("_b467921a-ef7b-44c5-bf78-fd624c400d17", "_c311cc87-677e-47a4-bdb1-8744c4ec3147")
A40_SPLIT = ('''<semantic:outgoing>_1873ed55-ba18-433f-8d1a-eb84d18da049</semantic:outgoing>
            <semantic:outgoing>_08d345a0-2bc3-4988-bfb2-7c2576839505</semantic:outgoing>
        </semantic:task>''', '''<semantic:outgoing>after_task_3</semantic:outgoing>
        </semantic:task>
        <semantic:parallelGateway id="split"/>
        <semantic:sequenceFlow sourceRef="_6fed62c8-8241-4a1d-ae67-266fda7dcead" targetRef="split" id="after_task_3"/>''')


def a40_runnable(tmp_path: Path) -> Path:
    return rewritten(tmp_path, A40, [('isExecutable="false"', 'isExecutable="true"'), A40_SPLIT,
                                     ('sourceRef="_6fed62c8-8241-4a1d-ae67-266fda7dcead" targetRef="_ee35fa2c',
                                      'sourceRef="split" targetRef="_ee35fa2c'),
                                     ('sourceRef="_6fed62c8-8241-4a1d-ae67-266fda7dcead" targetRef="_f52b6ad0',
                                      'sourceRef="split" targetRef="_f52b6ad0')])


def test_message_flows_to_a_process_the_collaboration_draws_no_pool_for_are_told_as_such(tmp_path: Path) -> None:
    """The collaboration draws a pool for WFP-6-1 only; its message flows go between plain tasks
    of WFP-6-1 and WFP-6-2. Asked to run the collaboration, validate said WFP-6-2 was "not
    executable" (it is) and that the instance would wait at Task 2 for the message from outside
    (a plain task waits for no message). It says no participant names WFP-6-2, and that Task 2
    waits for no message. Task 3's two outgoing flows (BPMN's implicit split) are refused."""
    assert "has 2 outgoing flows" in said(A40)[TASK_3]
    path = rewritten(tmp_path, A40, [('isExecutable="false"', 'isExecutable="true"')])
    found = {p.element_id: p for p in validate_process([path], process_id=A40_COLLABORATION).problems}
    to_other, from_other = (found[f] for f in A40_FLOWS)
    assert to_other.code == "message_flow_not_run" and from_other.code == "message_flow_from_outside"
    for problem in (to_other, from_other):
        assert problem.severity == "warning" and "not executable" not in problem.message
        assert f"no bpmn:participant of collaboration {A40_COLLABORATION!r} has processRef='WFP-6-2'" in problem.message
    assert "task '_80d1f02b-f39c-45c2-b731-43df75d81779' waits for no message" in from_other.message
    assert "waits at" not in from_other.message


@pytest.mark.parametrize("pid", ["WFP-6-1", "WFP-6-2"])
def test_each_process_of_the_miwg_pool_model_runs_alone_as_in_plain_spiffworkflow(tmp_path: Path, pid: str) -> None:
    """Given a parallel gateway after Task 3 (and isExecutable), each process, chosen by id, runs
    its people's steps (both expanded sub-processes side by side in WFP-6-2) as in plain SpiffWorkflow."""
    path = a40_runnable(tmp_path)
    assert [p for p in validate_process([path], process_id=pid).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    instance = engine.start(load_process([path], process_id=pid), {})
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(pid), parser.get_subprocess_specs(pid))
    wf.do_engine_steps()
    steps = 0
    while ready := wf.get_tasks(state=TaskState.READY, manual=True):
        task = ready[0]
        task.data[f"step{steps}"] = task.task_spec.bpmn_id
        instance = engine.run(instance, answers={"user_tasks": {task.task_spec.bpmn_id: {f"step{steps}": task.task_spec.bpmn_id}}})
        task.run()
        wf.do_engine_steps()
        steps += 1
    instance = engine.run(instance)
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert wf.is_completed() and steps == {"WFP-6-1": 2, "WFP-6-2": 4}[pid]
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data)


# -- B.2.0: the called process, a bare multi-instance marker and a message that terminates ---------

B20 = HERE / "miwg_b20_called_process.bpmn"
B20_PID = "Process_ba16239e-181e-4b9f-bc5b-0bb2ee973450"
MI_TASK, TASK_13, B20_BOUNDARY = ("_c57a5344-213f-4834-a6c3-94ce878b413c", "_7f4fe4ea-901f-4c74-bcd4-e933495712fd",
                                  "_86b052b4-225c-424e-b900-bb94bdd77cec")
B20_MESSAGE = "Boundary Intermediate Event Interrupting Message"
B20_EDITS = [('isExecutable="false"', 'isExecutable="true"'),
             ('<semantic:multiInstanceLoopCharacteristics isSequential="true"/>',
              '<semantic:multiInstanceLoopCharacteristics isSequential="true"><semantic:loopCardinality>2'
              '</semantic:loopCardinality></semantic:multiInstanceLoopCharacteristics>'),
             # the conditional start event never runs (validate warns) and breaks SpiffWorkflow's start
             # (see the test below): left out
             ("""        <semantic:startEvent name="Start Event 4 Conditional" id="_cba8fbed-2bb6-40a9-8ac5-83e827ce9d9f">
            <semantic:outgoing>_c72ddf62-21b8-4895-a7bf-7a765f5981eb</semantic:outgoing>
            <semantic:conditionalEventDefinition>
                <semantic:condition/>
            </semantic:conditionalEventDefinition>
        </semantic:startEvent>
""", ""),
             ("<semantic:incoming>_c72ddf62-21b8-4895-a7bf-7a765f5981eb</semantic:incoming>", ""),
             ('<semantic:sequenceFlow sourceRef="_cba8fbed-2bb6-40a9-8ac5-83e827ce9d9f" targetRef="_c57a5344-213f-4834-'
              'a6c3-94ce878b413c" name="" id="_c72ddf62-21b8-4895-a7bf-7a765f5981eb"/>', ""),
             ('<semantic:serviceTask implementation="##WebService" completionQuantity="1" isForCompensation="false" '
              'startQuantity="1" name="Service Task 14"', '<semantic:task name="Service Task 14"'),
             ("</semantic:serviceTask>", "</semantic:task>")]


def test_a_bare_multi_instance_marker_is_refused_at_once_naming_what_to_write() -> None:
    """Trisotech exports the marker alone: no loopCardinality, no loopDataInputRef. validate said so
    only once isExecutable was set, in SpiffWorkflow's words ("fix the BPMN element named here"); it
    says it at once, at the task, with the BPMN to write. The empty condition of the conditional
    start event is refused, and the start event warned as never running beside the plain one."""
    refused = said(B20)
    assert refused[MI_TASK].startswith("error:") and "multi-instance activity" in refused[MI_TASK]
    assert "<bpmn:loopCardinality>3</bpmn:loopCardinality>" in refused[MI_TASK]
    assert "miwg_b20_called_process.bpmn" in refused[MI_TASK]
    conditional = refused["_cba8fbed-2bb6-40a9-8ac5-83e827ce9d9f"]
    assert "never runs" in conditional and "has no condition" in conditional
    assert not any("fix the BPMN element named here" in text for text in refused.values())


@pytest.mark.parametrize("message", [False, True], ids=["answered", "interrupted"])
def test_the_miwg_called_process_runs_its_instances_then_ends_or_terminates_on_the_message(
        tmp_path: Path, message: bool) -> None:
    """Given a cardinality of 2 (and isExecutable, Service Task 14 a person's step, the conditional
    start event that never runs left out),
    the sequential user task runs twice, then User Task 13 waits: answered, the process ends at End
    Event 4; the message named like the boundary event ends it at the terminate end event. Both as
    in plain SpiffWorkflow."""
    path = rewritten(tmp_path, B20, B20_EDITS)
    assert [c for c, s, _ in problems(path) if s == "error"] == []
    answers = {MI_TASK: {"seen": True}, TASK_13: {"checked": True}, "_3bfec246-ab94-4807-a79a-3df91ac13800": {"done": True}}
    engine = Engine(store="memory://")
    data: dict[str, Any] = {}
    instance = engine.run(engine.start(load_process([path]), data), answers={"user_tasks": {MI_TASK: answers[MI_TASK]}})
    assert [(w["task_id"], w.get("event")) for w in instance.waiting_for] == [(TASK_13, None), (B20_BOUNDARY, B20_MESSAGE)]
    wf = plain_workflow(path, data)
    for _ in range(2):
        [task] = wf.get_tasks(state=TaskState.READY, manual=True)
        task.data.update(answers[MI_TASK])
        task.run()
        wf.do_engine_steps()
    if message:
        instance = engine.send_event(instance, B20_MESSAGE, {}, kind="message")
        wf.catch(BpmnEvent(MessageEventDefinition(B20_MESSAGE), {}))
        wf.do_engine_steps()
    else:
        instance = engine.run(instance, answers={"user_tasks": answers})
        while ready := wf.get_tasks(state=TaskState.READY, manual=True):
            ready[0].data.update(answers[ready[0].task_spec.bpmn_id])
            ready[0].run()
            wf.do_engine_steps()
    assert instance.status == "completed", instance.error
    assert wf.is_completed() and path_of(instance.workflow) == path_of(wf)
    assert path_of(wf).count(MI_TASK) == 3  # each instance, then the task around them
    assert path_of(wf)[-1] == ("_778ff738-a5af-4373-a8da-0fbbfae9e00a" if message else "_ed405919-9fd6-47d0-bb00-9be7d5467efb")
    assert variables(instance.main) == dict(wf.last_task.data)


def test_a_second_start_event_into_the_multi_instance_task_is_refused_for_spiffworkflow_cannot_start(
        tmp_path: Path) -> None:
    """Kept (with a condition), the conditional start event never runs, which validate warned of:
    but its flow and the plain start event's both enter the multi-instance task, and SpiffWorkflow
    then cannot start the process at all ("Attempt to add non-predicted child to predicted task",
    plain SpiffWorkflow's exception; layerflow's run stopped with it as an engine error). validate
    refuses the start event, naming the task and what to remove."""
    path = rewritten(tmp_path, B20, [B20_EDITS[0], B20_EDITS[1], *B20_EDITS[-2:],
                                     ("<semantic:condition/>", "<semantic:condition>ready</semantic:condition>")])
    with pytest.raises(WorkflowException, match="non-predicted child"):
        plain_workflow(path, {"ready": False})
    start = "_cba8fbed-2bb6-40a9-8ac5-83e827ce9d9f"
    assert problems(path) == [("start_event_never_runs", "error", start),
                              ("event_without_ref", "warning", B20_BOUNDARY)]
    refused = said(path)[start]
    assert f"multi-instance activity {MI_TASK!r}" in refused and "cannot even start the process" in refused
    assert f"remove {start!r} or its flow to {MI_TASK!r}" in refused
