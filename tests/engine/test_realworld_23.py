"""Public models, round 23, each in ``tests/engine/realworld23/`` (the file's header comment says what it
follows and what was trimmed; ``realworld23/SOURCES.md`` lists repositories, commits and licences):
bpmn-server's (a Node.js engine's) bpmn-js drawings of an event-based gateway, a message flow between
two pools, a data object and a multi-instance task written for its JavaScript, and bpmn-moddle's test
models (a C# engine's multi-instance over its own ioSpecification, ...). Each is validated as given
(validate says what is wrong, naming the element and what to write), then, edited as validate says,
run to its end, and its path and data are checked against what BPMN says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from context_layers import Layer
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import run_plain, variables
from test_realworld_4 import rewritten
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld23"


def codes(path: Path) -> list[tuple[str, str, str | None]]:
    return [(p.code, p.severity, p.element_id) for p in validate_process([path]).problems]


def engine_with(handlers: dict[str, Any]) -> Engine:
    engine = Engine(store="memory://")
    for task_id, handler in handlers.items():
        engine.handlers.register(task_id, handler)
    return engine


# -- bpmn-moddle: a multi-instance task over a dataInput of its own ioSpecification ----------------

TRAVEL = HERE / "bpmn_moddle_multi_instance_io.bpmn"
ASSOCIATIONS = TRAVEL.read_text()[TRAVEL.read_text().index('      <bpmn:dataInputAssociation id="gasg9hsaga">'):
                                  TRAVEL.read_text().index("      <bpmn:humanPerformer")]


def test_the_travel_orders_are_refused_for_the_process_property_they_read_and_write() -> None:
    refused = said(TRAVEL)
    assert "isExecutable='false'" in refused["Process"]
    assert "sourceRef 'Process_TravelOrders', a bpmn:property of the process" in refused["CheckDataTask"]
    assert "targetRef 'Process_TravelOrders', a bpmn:property of the process" in refused["CheckDataTask"]
    assert "names the operation 'Get travel orders' of interface 'Test service'" in refused["GetDataTask"]


def test_a_loop_input_naming_a_data_input_of_the_task_runs_each_instance_on_an_item(tmp_path: Path) -> None:
    """BPMN's loopDataInputRef names an ItemAwareElement by id: here the dataInput of the task's own
    ioSpecification. SpiffWorkflow 3.2 looks it up by a ``name`` its data specs do not have, so it
    refused every such task ("The loop input data reference is missing from the IO specification")
    and validate passed that on with "fix the BPMN element named here"."""
    fixed = rewritten(tmp_path, TRAVEL, [('isExecutable="false"', 'isExecutable="true"'), (ASSOCIATIONS, "")])
    assert [c for c in codes(fixed) if c[1] == "error"] == []
    process = load_process([fixed])
    orders = [{"id": 1, "km": 120}, {"id": 2, "km": 40}]

    def get_data(ctx: Any) -> dict[str, Any]:
        return {"CheckDataTaskInput": orders}

    engine = engine_with({"GetDataTask": get_data, "SaveDataTask": lambda ctx: {"saved": True}})
    instance = engine.run(engine.start(process, {}), answers={"user_tasks": {
        "CheckDataTask": {"LoopInstanceOutput": "checked"}, "InfoTask": {"told": True}}})
    assert instance.status == "completed", instance.error
    data = variables(instance.contexts["main"])
    assert data["CheckDataTaskOutput"] == ["checked", "checked"]
    assert data["saved"] is True and data["told"] is True


# -- bpmn-server: an event-based gateway before a receive task that names no message --------------

GATEWAY = HERE / "bpmn_server_event_based_gateway.bpmn"


def test_the_event_based_gateway_is_refused_for_its_executable_flag_and_its_timer() -> None:
    refused = said(GATEWAY)
    assert "isExecutable='false'" in refused["Process_0e44dxg"]
    assert 'write it as a string: "PT2S"' in refused["timerEvent"]
    assert "names none: SpiffWorkflow then waits for a signal named like the event, 'False Alarm'" \
        in refused["event_signal"]
    assert "nothing can send it, so it never fires" in refused["messageEvent"]


def test_a_receive_task_after_an_event_based_gateway_that_names_no_message_is_never_taken(tmp_path: Path) -> None:
    """validate said the receive task "goes straight on", as it does after a sequence flow; after an
    event-based gateway it is one of the gateway's events, a none event nothing throws, so the
    gateway never takes its path. The run waits for the timer, the signal and the message only."""
    warning = said(GATEWAY)["Task_receive"]
    assert "goes straight on" not in warning
    assert "after event-based gateway 'event_based_gatway'" in warning
    assert "the gateway never takes its path" in warning and 'add messageRef="ID"' in warning
    fixed = rewritten(tmp_path, GATEWAY, [('isExecutable="false"', 'isExecutable="true"'), (">PT2S<", '>"PT2S"<')])
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "waiting"
    assert sorted(w.get("event_id") or w["task_id"] for w in instance.waiting_for) == \
        ["event_signal", "messageEvent", "timerEvent"]
    instance = engine.send_event(instance, "False Alarm", kind="signal")
    assert instance.status == "completed", instance.error


# -- bpmn-server: a user task writes a data object named on its reference only --------------------

DATA_OBJECT = HERE / "bpmn_server_data_object.bpmn"


def test_a_data_object_named_on_its_reference_only_is_named_by_id_before_it_runs(tmp_path: Path) -> None:
    """bpmn-js 6 put the name ("UserInput") on the dataObjectReference and left the bpmn:dataObject
    unnamed. SpiffWorkflow keys a data object by its id, so the user task's answer must set
    'DataObject_0omawkh': validate said nothing (it looked at script tasks only), and the run of a task
    answered with "UserInput" stopped at the task's end."""
    fixed = rewritten(tmp_path, DATA_OBJECT, [('isExecutable="false"', 'isExecutable="true"')])
    [warning] = [p for p in validate_process([fixed]).problems if p.code == "data_object_named_apart"]
    assert (warning.severity, warning.element_id, warning.field) == ("warning", "Activity_04ihtpv",
                                                                      "dataOutputAssociation")
    text = str(warning)
    assert "writes the data object 'UserInput'" in text and "keys a data object by its id, 'DataObject_0omawkh'" in text
    assert 'give the bpmn:dataObject id="UserInput"' in text
    engine = Engine(store="memory://")
    stopped = engine.run(engine.start(load_process([fixed]), {}),
                         answers={"user_tasks": {"Activity_04ihtpv": {"UserInput": "hello"}}})
    assert stopped.status == "error" and "'DataObject_0omawkh'" in stopped.error["message"]

    renamed = rewritten(tmp_path / "renamed" if (tmp_path / "renamed").mkdir() is None else tmp_path, fixed, [
        ('dataObjectRef="DataObject_0omawkh"', 'dataObjectRef="UserInput"'),
        ('<bpmn:dataObject id="DataObject_0omawkh" />', '<bpmn:dataObject id="UserInput" />')])
    assert [p for p in validate_process([renamed]).problems if p.code == "data_object_named_apart"] == []
    instance = engine.run(engine.start(load_process([renamed]), {}),
                          answers={"user_tasks": {"Activity_04ihtpv": {"UserInput": "hello"}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.contexts["main"])["UserInput"] == "hello"


# -- bpmn-server: an attribute whose prefix the file binds nowhere ---------------------------------

UNBOUND = HERE / "bpmn_server_unbound_prefix.bpmn"


def test_a_prefix_bound_nowhere_names_the_element_and_the_declaration_to_add(tmp_path: Path) -> None:
    """The XML is not namespace-well-formed: validate named the line and column only ("fix the XML at
    this position"). It names the element the attribute sits in (and the id of the activity around it)
    and the two ways out."""
    [problem] = validate_process([UNBOUND]).problems
    assert (problem.code, problem.element_id, problem.line) == ("xml_malformed", "Activity_178f3tm", 19)
    text = str(problem)
    assert "Namespace prefix js for collection on multiInstanceLoopCharacteristics is not defined" in text
    assert "the bpmn:multiInstanceLoopCharacteristics of 'Activity_178f3tm'" in text
    assert 'declare the prefix on bpmn:definitions (xmlns:js="URI"' in text and "or remove js:collection" in text
    bound = rewritten(tmp_path, UNBOUND, [("xmlns:bpmn=", 'xmlns:js="http://bpmn-server/js" xmlns:bpmn=')])
    [missing] = [p for p in validate_process([bound]).problems if p.severity == "error"]
    assert missing.element_id == "Activity_178f3tm"
    assert "says neither how many instances run nor over what" in str(missing)
    over = rewritten(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, bound, [
        ('js:collection="this.records" />', 'js:collection="this.records"><bpmn:loopDataInputRef>records'
         '</bpmn:loopDataInputRef><bpmn:inputDataItem id="record" name="record"/>'
         '</bpmn:multiInstanceLoopCharacteristics>')])
    assert [p for p in validate_process([over]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([over]), {"records": [1, 2, 3]}),
                          answers={"user_tasks": {"Activity_178f3tm": {"seen": True}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.contexts["main"])["seen"] is True


# -- bpmn-moddle: a user task's inputs given by bpmn:assignment -----------------------------------

ASSIGNMENT = HERE / "bpmn_moddle_assignment.bpmn"


def test_inputs_given_by_assignment_that_no_input_set_lists_are_a_warning_and_the_task_runs(tmp_path: Path) -> None:
    """The task's bpmn:inputSet lists no dataInputRefs (only an outputSetRefs), so BPMN and SpiffWorkflow
    start it without its inputs, and plain SpiffWorkflow runs the file to its end. validate refused it,
    saying the instance "would stop" there ('Missing data input'): a wrong refusal. It is a warning now,
    naming the inputs whose assignments are not run."""
    [problem] = [p for p in validate_process([ASSIGNMENT]).problems if p.code == "data_input_assignment"]
    assert (problem.severity, problem.element_id) == ("warning", "UserTask_1bvywyp")
    text = str(problem)
    assert "gives its data input(s) 'TaskName', 'GroupId' their values by bpmn:assignment" in text
    assert "no bpmn:inputSet of its ioSpecification lists them, so the task runs without them" in text
    assert "would stop" not in text
    assert validate_process([ASSIGNMENT]).ok
    assert "so the task must set 'DataOutput_1', not 'approved': give it id='approved'" in said(ASSIGNMENT)[
        "UserTask_1bvywyp"]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([ASSIGNMENT]), {}),
                          answers={"user_tasks": {"UserTask_1bvywyp": {"DataOutput_1": True}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.contexts["main"])["DataOutput_1"] is True


def test_inputs_given_by_assignment_that_the_input_set_lists_are_still_refused(tmp_path: Path) -> None:
    required = rewritten(tmp_path, ASSIGNMENT, [("<bpmn:outputSetRefs>OutputSet_1</bpmn:outputSetRefs>",
                                                 "<bpmn:dataInputRefs>UserTask_1bvywyp_GroupId</bpmn:dataInputRefs>")])
    problem, unlisted = sorted((p for p in validate_process([required]).problems if p.code == "data_input_assignment"),
                               key=lambda p: p.severity)
    assert problem.severity == "error" and "the instance would stop at 'UserTask_1bvywyp'" in str(problem)
    assert "data input(s) 'GroupId' their values" in str(problem)
    assert unlisted.severity == "warning" and "data input(s) 'TaskName' their values" in str(unlisted)
    with pytest.raises(Exception, match="Missing data input"):
        run_plain(required, {}, {"UserTask_1bvywyp": {}})  # as validate says, plain SpiffWorkflow stops there
    assert run_plain(ASSIGNMENT, {}, {"UserTask_1bvywyp": {"DataOutput_1": True}})[0].is_completed()


# -- bpmn-server: message flows between two pools, drawn from service tasks -----------------------

MESSAGE_FLOW = HERE / "bpmn_server_message_flow.bpmn"


def test_message_flows_from_service_tasks_are_refused_then_run_across_the_pools(tmp_path: Path) -> None:
    """Each message flow leaves a service task, which sends nothing in SpiffWorkflow; drawn as send
    tasks with a bpmn:message (as validate says), the receivers are named next (a none start event, a
    receive task with no messageRef); drawn as validate says, the two pools run together: the primary
    starts the secondary, whose reply the primary's receive task waits for."""
    refused = said(MESSAGE_FLOW)
    for flow_id, sender in (("MessageFlow_1", "Task_1"), ("MessageFlow_2", "Task_3")):
        assert f"starts at serviceTask {sender!r}, which sends no message" in refused[flow_id]
    assert "has no isExecutable attribute" in refused["Process_secondary"]
    senders = rewritten(tmp_path, MESSAGE_FLOW, [
        ('<bpmn:collaboration id="Collaboration_1nz8zfi">', '<bpmn:message id="Msg_1" name="start_secondary" />'
         '<bpmn:message id="Msg_2" name="reply" /><bpmn:collaboration id="Collaboration_1nz8zfi">'),
        ('<bpmn:serviceTask id="Task_3" name="Task 3">', '<bpmn:sendTask id="Task_3" name="Task 3" messageRef="Msg_2">'),
        ('<bpmn:serviceTask id="Task_1" name="Task 1">', '<bpmn:sendTask id="Task_1" name="Task 1" messageRef="Msg_1">'),
        ("</bpmn:serviceTask>", "</bpmn:sendTask>")])
    refused = said(senders)
    assert "ends at startEvent 'StartEvent_2', which waits for no message" in refused["MessageFlow_1"]
    assert "draw it as one waiting for 'start_secondary'" in refused["MessageFlow_1"]
    assert "ends at receiveTask 'Task_2', which waits for no message" in refused["MessageFlow_2"]
    receivers = rewritten(tmp_path / "r" if (tmp_path / "r").mkdir() is None else tmp_path, senders, [
        ("<bpmn:outgoing>SequenceFlow_1gtrqla</bpmn:outgoing>\n    </bpmn:startEvent>",
         '<bpmn:outgoing>SequenceFlow_1gtrqla</bpmn:outgoing><bpmn:messageEventDefinition id="Def_1" '
         'messageRef="Msg_1" /></bpmn:startEvent>'),
        ('<bpmn:receiveTask id="Task_2" name="Task 2">', '<bpmn:receiveTask id="Task_2" name="Task 2" messageRef="Msg_2">'),
        ('<bpmn:process id="Process_secondary">', '<bpmn:process id="Process_secondary" isExecutable="true">')])
    assert codes(receivers) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([receivers]), {}))
    assert instance.status == "completed", instance.error
    assert {"event:StartEvent_2", "event:Task_2"} <= set(instance.contexts["main"].layer(Layer.HISTORY))


# -- bpmn-moddle: a Bizagi export, namespaces declared where they are used --------------------------

BIZAGI = HERE / "bizagi_nested_namespaces.bpmn"


def test_the_bizagi_export_runs_its_one_process_with_a_start_event() -> None:
    """Two participants: the main one's process is empty (no start event), the other's a start, a
    plain task (a person's step in SpiffWorkflow) and an end. validate warns of the missing
    isExecutable only; the run picks the process that can start and waits for the task."""
    assert codes(BIZAGI) == [("process_executable_unset", "warning", "Id_1f46c2af-002d-4b63-b1d1-7f181acc6065")]
    engine = Engine(store="memory://")
    process = load_process([BIZAGI])
    assert process.id == "Id_1f46c2af-002d-4b63-b1d1-7f181acc6065"
    waiting = engine.run(engine.start(process, {}))
    assert [w["task_id"] for w in waiting.waiting_for] == ["Id_b9ff4ef1-7f18-4c42-8667-122fc9c12929"]
    done = engine.run(waiting, answers={"user_tasks": {"Id_b9ff4ef1-7f18-4c42-8667-122fc9c12929": {"done": True}}})
    assert done.status == "completed", done.error
    assert variables(done.contexts["main"]) == {"done": True}


# -- bpmn-moddle: a Yaoqiang model for a .NET engine (NCalc conditions, a C# script) ----------------

YAOQIANG = HERE / "yaoqiang_event_definitions.bpmn"


def test_an_ncalc_comparison_written_with_one_equals_sign_is_given_its_python_at_once() -> None:
    """'ErrorThrown = true' is NCalc's comparison. validate said to write 'ErrorThrown == true', whose
    'true' it then warned of (no Python name): the Python to write is 'ErrorThrown == True'."""
    refused = said(YAOQIANG)
    assert "'=' assigns, '==' compares: write 'ErrorThrown == True'" in refused["ID_Flow_EsclusiveGateway_ErrorEnd"]
    assert "write 'ErrorThrown == False'" in refused["ID_Flow_EsclusiveGateway_ServiceTask"]
    assert "has scriptFormat='c#'" in refused["ID_ExecuteScript"]
    assert "start event 'ID_SignalStart' never runs" in refused["ID_SignalStart"]


def test_a_property_of_the_start_event_that_data_associations_name_is_said_to_be_one() -> None:
    """Yaoqiang's model keeps its process variables as bpmn:property of the start event (its comment
    says: a workaround for a bug of its engine). validate said of each association naming one that it
    "is no dataObjectReference or dataStoreReference of this file; point it at one", as of a typo; it
    says what it is, as it does of a property of the process."""
    refused = said(YAOQIANG)
    for owner, attr in (("ID_StartEvent", "targetRef"), ("ID_SignalStart", "targetRef"), ("ID_UserTask", "sourceRef")):
        assert f"has {attr} 'ID_ProcessProperty1', a bpmn:property of 'ID_StartEvent' (a process variable" \
            in refused[owner], refused[owner]
        assert "is no dataObjectReference" not in refused[owner]


def test_a_timer_date_written_in_csharp_is_refused_before_it_runs(tmp_path: Path) -> None:
    """The non-interrupting timer on the user task fires at 'DateTime.AddDays(Execution.Created, 1)', C#
    over the .NET engine's objects. It parses as Python, so validate let it pass; the run stopped as
    the user task began ("NameError: name 'DateTime' is not defined"). No context value (JSON) has an
    AddDays method: validate refuses it, naming the call and the Python to write."""
    [timer] = [p for p in validate_process([YAOQIANG]).problems if p.element_id == "ID_UserTimeoutEvent"]
    assert (timer.code, timer.severity, timer.field) == ("timer_expression", "error", "timeDate")
    text = str(timer)
    assert "calls DateTime.AddDays()" in text and "another language's date API" in text
    assert "no context value has such a method" in text
    text = YAOQIANG.read_text()
    edits = [("<![CDATA[ErrorThrown = true]]>", "ErrorThrown == True"),
             ("<![CDATA[ErrorThrown = false]]>", "ErrorThrown == False"),
             ('scriptFormat="c#"', 'scriptFormat="python"'),
             ("<![CDATA[This should be a c# script]]>", "ErrorThrown = False"),
             ("<![CDATA[DateTime.AddDays(Execution.Created, 1)]]>", '"2030-01-01T00:00:00Z"')]
    for first, last in (("ID_StartEventDataOutputAssociation1", "ID_StartEventOutputSet"),
                        ("ID_SignalStartDataOutputAssociation1", "ID_SignalStartOutputSet"),
                        ("ID_UserTaskInputAssociation", "ID_UserTaskPerformer1")):
        start = text.rindex("\n", 0, text.index(f'id="{first}"')) + 1
        end = text.rindex("\n", 0, text.index(f'id="{last}"')) + 1
        edits.append((text[start:end], ""))
    fixed = rewritten(tmp_path, YAOQIANG, edits)
    assert [c for c in codes(fixed) if c[1] == "error"] == []
    engine = engine_with({"ID_ServiceTask": lambda ctx: {"worked": True}})
    waiting = engine.run(engine.start(load_process([fixed]), {"ID_UserTaskInput": "ales"}))
    assert [w["task_id"] for w in waiting.waiting_for if w["kind"] == "user_task"] == ["ID_UserTask"]
    done = engine.run(waiting, answers={"user_tasks": {"ID_UserTask": {"ID_UserTaskOutput": "done"}}})
    assert done.status == "completed", done.error
    data = variables(done.contexts["main"])
    # the parallel branches joined, the script set ErrorThrown to False: the service task's path ran
    assert (data["ErrorThrown"], data["worked"], data["ID_UserTaskOutput"]) == (False, True, "done")


# -- bpmn-server: a transaction with compensation, conditional flows out of a script task ----------

TRANSACTION = HERE / "bpmn_server_transaction.bpmn"


def test_conditional_flows_out_of_a_task_are_redrawn_as_an_inclusive_gateway() -> None:
    """BPMN takes every conditional flow out of an activity whose condition holds, and every flow
    without one: an inclusive choice. validate told to draw an exclusive gateway "to choose one path",
    which would run the error end event or the next task, never both; it names the inclusive gateway,
    and the condition True for the flow that had none."""
    refused = said(TRANSACTION)
    split = refused["Activity_1r00y1z"]
    assert "has 3 outgoing flows" in split
    assert "draw an inclusive gateway after it with the flows' conditions" in split
    assert "'Flow_17axcuw', which has none, the condition True" in split
    assert "to choose one path" not in split
    assert "SpiffWorkflow 3.2 runs no compensation" in refused["Event_cancel_booking"]
    assert "cannot load a compensation boundary event" in refused["Event_comp_flight"]
    assert "has camunda:executionListener" in refused["Event_start_trans"]
