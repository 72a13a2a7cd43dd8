"""Shapes met in public BPMN files, round 17: the test models of a BPMN semantics checker
(timKraeuter/BPMN-Analyzer: one signal caught at two events in turn, an event-based gateway that
starts its process, a sub-process whose steps have no start event), of a formal semantics of BPMN
collaborations (pascalpoizat/fbpmn: send and receive tasks that name no message, inclusive splits
and joins nested in a parallel one), of a .NET engine (roger-castaldo/BPMNEngine: a C# script and
conditions written only in the engine's own extension elements), of a Node.js engine
(e2ebridge/bpmn: a Yaoqiang BPMN Editor export with a message boundary event), of Kogito (a
business rule task that runs a Drools rule unit), of Imixs-Workflow (catch events with no event
definition, the actions users take between states), of Activiti (its mail task as a send task), of
BPMN-OS (an operator on a task that changes its status) and the BPMN Model Interchange Working
Group's reference model A.2.0 as Trisotech exports it. Each is in ``tests/engine/realworld17/`` (the
file says where it comes from and what was trimmed). Where plain SpiffWorkflow 3.2 runs a file, a
case runs it there too and the path and the variables must agree; where a file means something
neither can run, ``layerflow validate`` must say so, naming the file, the element and what to do."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition, SignalEventDefinition

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import patch_spiff_timer_clock, path_of, run_plain, variables
from test_realworld_4 import rewritten
from test_realworld_12 import agree, problems
from test_realworld_13 import HOUR, Clock, plain_workflow

HERE = Path(__file__).resolve().parent / "realworld17"


def said(path: Path) -> dict[str, str]:
    """validate's problems: element id (or the field) -> its messages, each with its severity."""
    found: dict[str, str] = {}
    for p in validate_process([path]).problems:
        key = str(p.element_id or p.field)
        found[key] = f"{found.get(key, '')}\n{p.severity}: {p}".strip()
    return found


def agree_with_warnings(path: Path) -> tuple[Any, Any]:
    """Run under layerflow and plain SpiffWorkflow (a file validate only warns about): both
    complete on the same path with the same variables."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    wf, plain_data = run_plain(path, {}, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == plain_data
    return instance, wf


# -- fbpmn: send and receive tasks that name no message -------------------------------------------

NO_MESSAGES = HERE / "receive_tasks_without_messages.bpmn"


def test_receive_tasks_that_name_no_message_are_named_by_validate_for_they_wait_for_nothing() -> None:
    """P's receive tasks name no bpmn:message (the file has none; only the message flows carry a
    name): SpiffWorkflow gives them no event to wait for, so they pass at once and P runs to its
    end without a message, in plain SpiffWorkflow as under layerflow. validate warns at each,
    saying the path does not wait and what to write."""
    assert [c for c, _, e in problems(NO_MESSAGES)] == ["waits_for_nothing"] * 2
    warned = said(NO_MESSAGES)
    assert set(warned) == {"Task_1yxycrc", "Task_0rim1ab"}
    for text in warned.values():
        assert text.startswith("warning:") and "receive_tasks_without_messages.bpmn" in text
        assert "names no message" in text and "does not wait" in text and 'messageRef="ID"' in text
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([NO_MESSAGES]), {}))
    wf = plain_workflow(NO_MESSAGES, "Pid")
    assert instance.status == "completed" and wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf) == [
        "StartEvent_1", "Task_1640yub", "Task_1yxycrc", "Task_125lbbu", "Task_0rim1ab", "EndEvent_15dkjc7"]


def test_receive_tasks_given_a_message_wait_for_it_in_turn(tmp_path: Path) -> None:
    """Doing what validate says (a bpmn:message named Info, messageRef on each receive task) gives
    a P that waits at each receive task until `send` delivers Info, as plain SpiffWorkflow does."""
    path = rewritten(tmp_path, NO_MESSAGES, [
        ('<bpmn:collaboration id="e043SameMessage">',
         '<bpmn:message id="Info" name="Info" />\n  <bpmn:collaboration id="e043SameMessage">'),
        ('<bpmn:receiveTask id="Task_1yxycrc">', '<bpmn:receiveTask id="Task_1yxycrc" messageRef="Info">'),
        ('<bpmn:receiveTask id="Task_0rim1ab">', '<bpmn:receiveTask id="Task_0rim1ab" messageRef="Info">')])
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    wf = plain_workflow(path, "Pid")
    for receiver, reply in (("Task_1yxycrc", {"first": 1}), ("Task_0rim1ab", {"second": 2})):
        assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [(receiver, "Info")]
        instance = engine.send_event(instance, "Info", reply, kind="message")
        wf.catch(BpmnEvent(MessageEventDefinition("Info"), reply))
        wf.do_engine_steps()
    assert instance.status == "completed" and wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf)
    # plain SpiffWorkflow drops a payload whose message names no variable; layerflow keeps its keys
    # (README: into WORKING, then HISTORY)
    assert dict(wf.last_task.data) == {}
    assert variables(instance.main) == {"first": 1, "second": 2}


# -- Imixs-Workflow: catch events with no event definition ----------------------------------------

IMIXS = HERE / "imixs_events.bpmn"


def test_an_imixs_model_is_refused_until_executable_and_its_bare_catch_events_are_named(tmp_path: Path) -> None:
    """Imixs runs such a model as a state machine: a user's action ("submit") moves a document
    from one task to the next. BPMN gives a catch event with no definition nothing to wait for:
    SpiffWorkflow passes it at once. validate refuses the model (isExecutable="false"), warns at
    the bare catch event that does not wait and at the one nothing reaches; made executable, it
    runs as in plain SpiffWorkflow, straight through "submit"."""
    warned = said(IMIXS)
    assert "isExecutable" in warned["simple"] and warned["simple"].startswith("error:")
    assert warned["IntermediateCatchEvent_2"].startswith("warning:")
    assert "no event definition" in warned["IntermediateCatchEvent_2"]
    assert "does not wait" in warned["IntermediateCatchEvent_2"]
    assert "never runs" in warned["IntermediateCatchEvent_1"]
    path = rewritten(tmp_path, IMIXS, [('isExecutable="false"', 'isExecutable="true"')])
    assert [(c, s) for c, s, _ in problems(path) if s == "error"] == []
    engine = Engine(store="memory://")
    answers = {"Task_2": {"state": 1000}, "Task_1": {"state": 1100}}
    instance = engine.run(engine.start(load_process([path]), {}), answers={"user_tasks": answers})
    wf, plain_data = run_plain(path, {}, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf) == [
        "StartEvent_1", "Task_2", "IntermediateCatchEvent_2", "Task_1", "EndEvent_1"]
    assert variables(instance.main) == plain_data == {"state": 1100}


# -- BPMN-Analyzer: one signal caught at two events in turn ---------------------------------------

SIGNALS = HERE / "signal_caught_twice.bpmn"


def test_a_signal_caught_at_two_events_in_turn_moves_one_at_a_time_as_in_plain_spiffworkflow() -> None:
    """Pool p1 throws S1 (no one of its own catches it; pool p2 is not executable), then waits for
    S2 at S2_Catch_1 and next at S2_Catch_2: each S2 moves the one catch event then waiting, not
    the next, and the end event throws S3. Plain SpiffWorkflow's path. validate warns that the
    signals go to and come from pool p3 only, which this instance does not run (round 21)."""
    assert problems(SIGNALS) == [("signal_to_other_process", "warning", "Event_17hujxw"),
                                 ("signal_to_other_process", "warning", "Event_0mh8q9a"),
                                 ("signal_from_other_process", "warning", "Event_0a9nmst"),
                                 ("signal_from_other_process", "warning", "Event_0konap5")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([SIGNALS]), {}))
    wf = plain_workflow(SIGNALS, "Process_87b80329-3b43-4405-95a3-c1c0d00bfecb")
    for catch in ("Event_0konap5", "Event_0a9nmst"):
        assert [(w["task_id"], w["event"], w["event_kind"]) for w in instance.waiting_for] == [(catch, "S2", "signal")]
        instance = engine.send_event(instance, "S2", {}, kind="signal")
        wf.catch(BpmnEvent(SignalEventDefinition("S2"), {}))
        wf.do_engine_steps()
    assert instance.status == "completed" and wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf) == [
        "StartEvent_1", "Event_17hujxw", "Event_0konap5", "Event_0a9nmst", "Event_0mh8q9a"]
    assert variables(instance.main) == dict(wf.last_task.data) == {}


# -- BPMN-Analyzer: an event-based gateway that starts its process --------------------------------

EVENT_START = HERE / "event_gateway_instantiates.bpmn"
START_AT_GATEWAY = ('<bpmn:eventBasedGateway id="Gateway_0xg98fy" name="eventG">',
                    '<bpmn:startEvent id="start" />\n    <bpmn:sequenceFlow id="to_gateway" sourceRef="start" '
                    'targetRef="Gateway_0xg98fy" />\n    <bpmn:eventBasedGateway id="Gateway_0xg98fy" name="eventG">')


def test_an_event_based_gateway_that_starts_its_process_is_refused_then_runs_with_a_start_event(tmp_path: Path) -> None:
    """BPMN lets an event-based gateway with instantiate start a process (here a camunda:property,
    the modeler having no symbol for it); SpiffWorkflow begins at a start event. validate refuses
    it, naming the process and the gateway to draw a start event before. Drawn so, it waits at
    the gateway for r_msg1, the catch event named like its message; the receive task names no
    message and is said not to wait (SpiffWorkflow never offers it); r_msg1 ends the process as
    in plain SpiffWorkflow."""
    refused = said(EVENT_START)
    process = "Process_bd3d8840-e590-42ab-ba0c-6026a65a39c5"
    assert refused[process].startswith("error:") and "has no start event" in refused[process]
    assert "event_gateway_instantiates.bpmn" in refused[process] and "'Gateway_0xg98fy'" in refused[process]
    path = rewritten(tmp_path, EVENT_START, [START_AT_GATEWAY])
    assert problems(path) == [("event_without_ref", "warning", "Event_03mv4n4"),
                              ("waits_for_nothing", "warning", "Activity_1up3t2i")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert [(w["task_id"], w["event"], w.get("event_id")) for w in instance.waiting_for] == [
        ("Gateway_0xg98fy", "r_msg1", "Event_03mv4n4")]
    done = engine.send_event(instance, "r_msg1", {"order": 7}, kind="message")
    wf = plain_workflow(path, process)
    wf.catch(BpmnEvent(MessageEventDefinition("r_msg1"), {"order": 7}))
    wf.do_engine_steps()
    assert done.status == "completed" and wf.is_completed()
    assert path_of(done.workflow) == path_of(wf) == ["start", "Gateway_0xg98fy", "Event_03mv4n4", "Event_1udsije"]


# -- BPMN-Analyzer: a sub-process whose steps have no start event ---------------------------------

NO_START = HERE / "sub_process_without_start_event.bpmn"
ONE_START = ('<bpmn:task id="Activity_0palugd" name="A">',
             '<bpmn:startEvent id="start_sub" />\n'
             '      <bpmn:sequenceFlow id="to_a" sourceRef="start_sub" targetRef="Activity_0palugd" />\n'
             '      <bpmn:sequenceFlow id="to_e1" sourceRef="start_sub" targetRef="Gateway_1icv858" />\n'
             '      <bpmn:sequenceFlow id="to_p1" sourceRef="start_sub" targetRef="Gateway_1dk047s" />\n'
             '      <bpmn:task id="Activity_0palugd" name="A">')


def test_a_sub_process_whose_steps_have_no_start_event_is_refused_naming_each_then_runs(tmp_path: Path) -> None:
    """A task, an exclusive and a parallel gateway with no incoming flow: BPMN starts each as the
    sub-process starts, SpiffWorkflow needs a start event. validate names the sub-process and all
    three; a start event with a flow to each (as it says) runs as plain SpiffWorkflow does, the
    task waiting for its person while the gateways' paths end."""
    refused = said(NO_START)
    assert list(refused) == ["Activity_1xp155m"] and refused["Activity_1xp155m"].startswith("error:")
    for step in ("'Activity_0palugd'", "'Gateway_1icv858'", "'Gateway_1dk047s'"):
        assert step in refused["Activity_1xp155m"]
    path = rewritten(tmp_path, NO_START, [ONE_START])
    instance, wf = agree(path, {}, {"Activity_0palugd": {"done": True}})
    assert path_of(wf)[-4:] == ["Activity_0palugd", "Event_17dw7l3", "Activity_1xp155m", "Event_0catini"]
    assert variables(instance.main) == {"done": True}


# -- fbpmn: inclusive splits and joins nested in a parallel one -----------------------------------

NESTED_OR = HERE / "nested_inclusive_in_parallel.bpmn"
TASKS_DONE = {"Task_1b973ma": {"a1": 1}, "Task_1bno414": {"a2": 1}, "Task_1xwy18n": {"b1": 1}, "Task_1jvjnjm": {"b2": 1}}


@pytest.mark.parametrize("conditions, done", [
    ({"conditionA2": True, "conditionB2": False}, {"a2": 1, "b1": 1}),
    ({"conditionA2": False, "conditionB2": True}, {"a1": 1, "b2": 1}),
], ids=["A2-and-B1", "A1-and-B2"])
def test_inclusive_gateways_nested_in_a_parallel_split_join_as_in_plain_spiffworkflow(
        conditions: dict[str, bool], done: dict[str, int]) -> None:
    """Each inclusive gateway takes its conditional flow when its bare-name condition holds, else
    its default; each inclusive join waits for what its split took, the parallel join for both,
    and "condition" False leaves the loop: plain SpiffWorkflow's path and data."""
    data = {"condition": False, **conditions}
    instance, _ = agree(NESTED_OR, data, TASKS_DONE)
    assert variables(instance.main) == {**data, **done}


# -- e2ebridge/bpmn: a Yaoqiang export with a message boundary event ------------------------------

YAOQIANG = HERE / "yaoqiang_message_boundary.bpmn"


def test_a_yaoqiang_export_with_a_message_boundary_event_runs_either_way_as_in_plain_spiffworkflow() -> None:
    """The task has no outgoing flow and the boundary event names no message: validate warns at
    both (naming the message it waits for, the event's name). The message interrupts the task and
    ends at MyEnd; without it, the person's answer ends the task's path. Both as plain SpiffWorkflow."""
    assert problems(YAOQIANG) == [("no_outgoing_flow", "warning", "_3"),
                                  ("event_without_ref", "warning", "_6")]
    name = "My Message Boundary Event"
    engine = Engine(store="memory://")
    started = engine.run(engine.start(load_process([YAOQIANG]), {}))
    assert [(w["task_id"], w.get("event")) for w in started.waiting_for] == [("_3", None), ("_6", name)]
    interrupted = engine.send_event(started, name, {"reason": "cancelled"}, kind="message")
    wf = plain_workflow(YAOQIANG, "PROCESS_1")
    wf.catch(BpmnEvent(MessageEventDefinition(name), {"reason": "cancelled"}))
    wf.do_engine_steps()
    assert interrupted.status == "completed" and wf.is_completed()
    assert path_of(interrupted.workflow) == path_of(wf) == ["_2", "_6", "_5"]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([YAOQIANG]), {}), answers={"user_tasks": {"_3": {"ok": 1}}})
    wf, plain_data = run_plain(YAOQIANG, {}, {"_3": {"ok": 1}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf) == ["_2", "_3"]
    assert variables(instance.main) == plain_data == {"ok": 1}


# -- BPMNEngine: a C# script and conditions in the engine's own extension elements ----------------

CSHARP = HERE / "csharp_script.bpmn"
EXT_CONDITIONS = HERE / "extension_conditions.bpmn"


def test_a_script_written_in_another_engines_extension_element_is_named_with_what_to_do(tmp_path: Path) -> None:
    """The script is C# in exts:cSharpScript, no bpmn:script: validate refuses the process as not
    executable and, at the task, says where its script is written and that it is not read. Made
    executable, the run stops at the task saying it has no script (plain SpiffWorkflow fails there
    with a TypeError of exec())."""
    warned = said(CSHARP)
    assert "isExecutable" in warned["Process_1"] and warned["Process_1"].startswith("error:")
    assert "its script is written in exts:cSharpScript, another engine's extension element" in \
        warned["ScriptTask_0x2hx7v"]
    assert "write it in Python here" in warned["ScriptTask_0x2hx7v"]
    path = rewritten(tmp_path, CSHARP, [('isExecutable="false"', 'isExecutable="true"')])
    engine = Engine(store="memory://")
    failed = engine.run(engine.start(load_process([path]), {"a": 1}))
    assert failed.status == "error" and failed.error["task_id"] == "ScriptTask_0x2hx7v"
    assert "has no script" in failed.error["message"]


def test_conditions_written_in_another_engines_extension_elements_are_refused_naming_each_flow() -> None:
    """No flow out of the exclusive gateway has a bpmn:conditionExpression: each is refused,
    naming the flow, the exts:ConditionSet where its condition is and what to write."""
    refused = said(EXT_CONDITIONS)
    flows = ["SequenceFlow_0r78igv", "SequenceFlow_1mbqakg", "SequenceFlow_0dxvrs0", "SequenceFlow_0ep2blb"]
    assert set(refused) == {"Process_1", *flows}
    for flow in flows:
        assert refused[flow].startswith("error:") and "has no condition" in refused[flow]
        assert "its condition is written in exts:ConditionSet" in refused[flow]


# -- Kogito: a business rule task that runs a Drools rule unit ------------------------------------

KOGITO = HERE / "kogito_rule_unit.bpmn"


def test_a_kogito_rule_unit_task_is_refused_with_java_conditions_and_jbpm_task_inputs() -> None:
    """A Drools rule unit is no DMN decision: the business rule task is refused, saying what to
    give (a decision, a handler or an llm: block); the Java conditions on person.isAdult() are
    refused as not Python, naming the test to write; the process variable person passed by data
    associations is named with what to do instead. No traceback."""
    refused = said(KOGITO)
    rule_task = refused["_7B8CC121-6F99-464A-93F8-9EAC4BE4601A"]
    assert "business rule task" in rule_task and "names no DMN decision" in rule_task and "handler" in rule_task
    for flow in ("_22717A42-3E59-431B-8AF8-C5061A69B295", "_FA444C47-2749-42FF-ACE3-7CF52A2AB11A"):
        assert refused[flow].startswith("error:") and "not valid Python" in refused[flow]
        assert "person.isAdult()" in refused[flow]
    assert "bpmn:property of the process" in refused["_D9CFCEE9-BCDF-48D0-8CB4-A55584DF0D9D"]


# -- Activiti: its mail task written as a send task -----------------------------------------------

MAIL = HERE / "activiti_mail_send_task.bpmn20.xml"
FLOW_IDS = [('<sequenceFlow sourceRef="theStart"', '<sequenceFlow id="theStart_to_sendMail" sourceRef="theStart"'),
            ('<sequenceFlow sourceRef="sendMail"', '<sequenceFlow id="sendMail_to_theEnd" sourceRef="sendMail"')]


def test_activitis_mail_send_task_is_refused_for_its_flows_and_warned_for_the_mail_then_runs(tmp_path: Path) -> None:
    """Activiti's test writes its sequence flows without ids, which SpiffWorkflow does not follow:
    each is refused with the id to give. The mail (activiti:type="mail" and its fields) is another
    engine's: validate says no one sends it and where its work would go. With the ids, the send
    task sends nothing and the process ends, as in plain SpiffWorkflow."""
    found = problems(MAIL)
    assert [(c, s) for c, s, _ in found if s == "error"] == [("flow_id_missing", "error")] * 2
    warned = said(MAIL)
    assert "activiti:type" in warned["sendMail"] and "bpmn:serviceTask" in warned["sendMail"]
    path = rewritten(tmp_path, MAIL, FLOW_IDS)
    assert [c for c, s, _ in problems(path) if s == "error"] == []
    _, wf = agree_with_warnings(path)
    assert path_of(wf) == ["theStart", "sendMail", "theEnd"]


# -- BPMN-OS: an operator on a task that changes the status as the task runs -----------------------

BPMNOS = HERE / "bpmnos_operators.bpmn"


def test_a_bpmnos_operator_on_a_task_is_warned_with_its_expression_then_runs_as_plain_spiffworkflow() -> None:
    """BPMN-OS applies "timestamp += duration" as the task runs; neither SpiffWorkflow nor layerflow
    reads bpmnos: elements, so the plain bpmn:task is a person's step and timestamp is not moved.
    validate says so at the task, quoting the operator and where to write it; the run is plain
    SpiffWorkflow's."""
    warned = said(BPMNOS)
    assert list(warned) == ["Activity_1"] and warned["Activity_1"].startswith("warning:")
    assert "bpmnos:status" in warned["Activity_1"] and "'timestamp += duration'" in warned["Activity_1"]
    assert "script task" in warned["Activity_1"]
    data = {"timestamp": 0, "duration": 5, "deadline": 10}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([BPMNOS]), data), answers={"user_tasks": {"Activity_1": {}}})
    wf, plain_data = run_plain(BPMNOS, data, {"Activity_1": {}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf) == ["StartEvent_1", "Activity_1", "EndEvent_1"]
    assert variables(instance.main) == plain_data == data


# -- BPMNEngine: timers written only in the engine's own extension element -------------------------

TIMERS = HERE / "foreign_timer_strings.bpmn"
ISO_TIMES = [('isExecutable="false"', 'isExecutable="true"'),
             ("<exts:DateString>+45 seconds</exts:DateString>", '<bpmn:timeDuration>"PT45S"</bpmn:timeDuration>'),
             ("<exts:DateString>+30 seconds</exts:DateString>", '<bpmn:timeDuration>"PT30S"</bpmn:timeDuration>'),
             ("<exts:DateString>+1 minute</exts:DateString>", '<bpmn:timeDuration>"PT1M"</bpmn:timeDuration>')]


def test_timers_written_in_another_engines_element_are_refused_each_with_the_iso_text_to_give(tmp_path: Path) -> None:
    """"+45 seconds" in exts:DateString is no BPMN time: each of the three timers is refused as
    saying neither when nor how long, with the ISO 8601 text to give, and the exts:DateString is
    named as not BPMN; given timeDurations (and isExecutable), the file passes clean."""
    refused = said(TIMERS)
    for timer in ("BoundaryEvent_14c0tw1", "BoundaryEvent_1s99zkc", "IntermediateCatchEvent_1tm2fi4"):
        assert refused[timer].startswith("error:") and "neither when nor how long" in refused[timer]
        assert "<bpmn:timeDuration>" in refused[timer]
    assert any("DateString" in text and "not expected" in text for text in refused.values())
    assert problems(rewritten(tmp_path, TIMERS, ISO_TIMES)) == []


# -- the BPMN MIWG's reference model A.2.0, as Trisotech's Visio add-in exports it ----------------

MIWG = HERE / "miwg_a20_trisotech.bpmn"
SPLIT = "_35fe57a7-1302-44e2-bf58-032f11af7ecb"
ROUTES = [('isExecutable="false"', 'isExecutable="true"'),
          ('name="Gateway  (Split Flow)"', 'name="Gateway  (Split Flow)" default="_f1478fb7-98c4-4c01-8c15-68bd04c91535"'),
          ('id="_a1570a53-28d2-41b1-a3a2-3e50c00d747e"/>', 'id="_a1570a53-28d2-41b1-a3a2-3e50c00d747e"><semantic:'
           'conditionExpression>route == 3</semantic:conditionExpression></semantic:sequenceFlow>'),
          ('id="_20ebb3c1-5178-4c7c-a91d-23e58f2aa73b"/>', 'id="_20ebb3c1-5178-4c7c-a91d-23e58f2aa73b"><semantic:'
           'conditionExpression>route == 4</semantic:conditionExpression></semantic:sequenceFlow>')]
TASK = {"Task 1": "_5a972b87-735d-454a-b31c-f52fb3afc5c7", "Task 2": "_4f7d62d7-f0e6-46bc-be00-69e02da38f65",
        "Task 3": "_e6eb725a-34bc-45c7-aed0-9f9596cd7bee", "Task 4": "_7d399717-1aba-47ac-8d7d-8aaa033255e0"}


def test_the_miwg_reference_model_is_refused_for_its_bare_split_then_runs_each_route(tmp_path: Path) -> None:
    """A descriptive model: not executable, and its exclusive split has three flows with no
    condition and no default, each refused with what to write. Given a default (Task 2) and
    conditions on a route number (the ISO-8859-1, "semantic:"-prefixed file otherwise as
    exported), every route runs as in plain SpiffWorkflow, through the merge or straight to the end."""
    refused = said(MIWG)
    assert refused["WFP-6-"].startswith("error:") and "isExecutable" in refused["WFP-6-"]
    bare = [k for k, v in refused.items() if "has no condition" in v]
    assert len(bare) == 3 and all(SPLIT in refused[k] and "default=" in refused[k] for k in bare)
    path = rewritten(tmp_path, MIWG, ROUTES)
    answers = {tid: {"done": name} for name, tid in TASK.items()}
    for route, via in ((2, "Task 2"), (3, "Task 3"), (4, "Task 4")):
        instance, wf = agree(path, {"route": route}, answers)
        assert TASK[via] in path_of(wf)
        assert variables(instance.main) == {"route": route, "done": via}


# -- Imixs-Workflow: conditions that read the document through its Java API -----------------------

WORKITEM = HERE / "imixs_workitem_conditions.bpmn"
BUDGET = [('isExecutable="false"', 'isExecutable="true"'),
          ("(workitem.getItemValueDouble('_budget')>100)", "(_budget>100)"),
          ("(workitem.getItemValueDouble('_budget')<=100)", "(_budget<=100)")]


def test_conditions_calling_imixs_workitem_api_are_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """workitem.getItemValueDouble('_budget') > 100 reads as Python, but no context value has
    Imixs's document API: the run would stop at the gateway. validate refuses each condition,
    naming the call and writing the Python read of the item ('(_budget>100)'); written so (and
    executable), each budget takes its branch as in plain SpiffWorkflow, the empty default=""
    and the bare catch event between (warned) notwithstanding."""
    refused = said(WORKITEM)
    for flow, python in (("SequenceFlow_7", "(_budget>100)"), ("SequenceFlow_10", "(_budget<=100)")):
        assert refused[flow].startswith("error:") and "workitem.getItemValueDouble" in refused[flow]
        assert "Imixs" in refused[flow] and repr(python) in refused[flow]
    path = rewritten(tmp_path, WORKITEM, BUDGET)
    assert [c for c, s, _ in problems(path) if s == "error"] == []
    answers = {"Task_3": {}, "Task_4": {"approved": "board"}, "Task_5": {"approved": "team"}}
    for budget, task in ((150, "Task_4"), (100, "Task_5")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path]), {"_budget": budget}), answers={"user_tasks": answers})
        wf, plain_data = run_plain(path, {"_budget": budget}, answers)
        assert instance.status == "completed", instance.error
        assert path_of(instance.workflow) == path_of(wf)
        assert task in path_of(wf) and "IntermediateCatchEvent_3" in path_of(wf)
        assert variables(instance.main) == {k: v for k, v in plain_data.items() if not k.startswith("_")}


# -- BPMN-OS: an event-based gateway between two timers it times by its own parameters -------------

RACE = HERE / "bpmnos_timer_race.bpmn"
DURATIONS = [('<bpmn2:timerEventDefinition id="TimerEventDefinition_14236ba" />',
              '<bpmn2:timerEventDefinition id="TimerEventDefinition_14236ba"><bpmn2:timeDuration>"PT1H"'
              '</bpmn2:timeDuration></bpmn2:timerEventDefinition>'),
             ('<bpmn2:timerEventDefinition id="TimerEventDefinition_1dx6ucx" />',
              '<bpmn2:timerEventDefinition id="TimerEventDefinition_1dx6ucx"><bpmn2:timeDuration>"PT2H"'
              '</bpmn2:timeDuration></bpmn2:timerEventDefinition>')]


def test_timers_timed_by_bpmnos_parameters_are_refused_then_the_first_due_wins_the_race(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two timers' definitions are empty (BPMN-OS times them by its trigger parameters) and the
    data store has no name: each is refused, as plain SpiffWorkflow refuses the store. Given an
    hour and two (the store left out), the hour's timer wins the gateway's race just after the hour
    and the other is withdrawn, as in plain SpiffWorkflow on the same clock."""
    refused = said(RACE)
    assert set(refused) == {"TimerEvent_1", "TimerEvent_2", "DataStore_1"}
    assert all(text.startswith("error:") for text in refused.values())
    assert "neither when nor how long" in refused["TimerEvent_1"] and "has no implementation" in refused["DataStore_1"]
    text = RACE.read_text()
    store = text[text.index("  <bpmn2:dataStore"):text.index("</bpmn2:dataStore>") + len("</bpmn2:dataStore>\n")]
    path = rewritten(tmp_path, RACE, [*DURATIONS, (store, "")])
    assert problems(path) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "waiting"
    clock.now += HOUR + 60
    instance = engine.run(instance)
    now = patch_spiff_timer_clock(monkeypatch, datetime.now(timezone.utc))
    wf = plain_workflow(path, "Process_1")
    now[0] += timedelta(hours=1, minutes=1)
    wf.refresh_timers()
    wf.do_engine_steps()
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf) == ["StartEvent_1", "Gateway_1", "TimerEvent_1", "EndEvent_1"]
