"""Shapes met in public BPMN files, round 16: SpiffArena's own process models (the backend's test
data in sartography/spiff-arena): a data object that one sub-process writes and a script inside
the next one reads; a manual task with instructionsForEndUser that a gateway loops back to after
an embedded sub-process and a call activity; SpiffArena's error-notification process, started by
a message start event whose message names its variable (spiffworkflow:messageVariable), with a
correlation key; and a conditional catch event waiting on a data object that the task of the
other parallel branch sets in its postScript; SpiffArena's test of a script error (a script
reading a name nothing set, beside spiffworkflow:unitTests). Each is in ``tests/engine/realworld16/`` (the file
says where it comes from and what was trimmed). Where plain SpiffWorkflow 3.2 runs a file, a case
runs it there too and the path and the variables (a data object's value beside the task data, as
README says) must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.exceptions import WorkflowTaskException
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.spiff.specs.event_definitions import MessageEventDefinition
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, run_plain, variables
from test_realworld_4 import rewritten
from test_realworld_12 import agree, problems
from test_realworld_13 import plain_workflow

HERE = Path(__file__).resolve().parent / "realworld16"


def answer_all(engine: Engine, instance: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Complete each person's task as it comes, with no answer; the instance and what waited."""
    asked = []
    while instance.status == "waiting":
        people = [w for w in instance.waiting_for if w["kind"] == "user_task"]
        if not people:
            break
        asked.append(people[0])
        instance = engine.complete_user_task(instance, people[0]["task_id"], {})
    return instance, asked


# -- a data object written by one sub-process, read inside the next ------------------------------

DATA_OBJECT = HERE / "data_object_in_subprocess.bpmn"


def test_a_data_object_a_sub_process_writes_is_read_by_a_script_in_the_next_as_in_plain_spiffworkflow() -> None:
    """subprocess1's dataOutputAssociation takes the value its script set into the process's data
    object; the script inside subprocess2 reads it through a reference of its own. The diagram's
    plane names a process the file does not have: nothing runs from the diagram, so no word."""
    assert problems(DATA_OBJECT) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([DATA_OBJECT]), {}))
    wf, plain_data = run_plain(DATA_OBJECT, {}, {})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert wf.data_objects == {"our_data_object": "HEY"}
    assert variables(instance.main) == {**plain_data, **wf.data_objects} == {"our_data_object": "HEY", "hey": "HEY_NO"}


# -- a manual task looped back to after a sub-process and a call activity ------------------------

LOOP = [HERE / "manual_task_with_subprocesses.bpmn", HERE / "test_process_to_call.bpmn"]


def test_a_manual_task_looped_back_to_after_a_call_activity_runs_twice_as_in_plain_spiffworkflow() -> None:
    """The sub-process's try/except sees the called process's variable only on the second pass:
    the default flow brings the person's task (its instructionsForEndUser shown each time) back
    once, then the condition holds. Path and data are plain SpiffWorkflow's."""
    assert list(validate_process(LOOP).problems) == []
    engine = Engine(store="memory://")
    instance, asked = answer_all(engine, engine.run(engine.start(load_process(LOOP), {})))
    assert [(w["task_id"], w.get("instructions")) for w in asked] == [("manual_task", "## Hello")] * 2
    parser = SpiffBpmnParser()
    parser.add_bpmn_files([str(p) for p in LOOP])
    wf = BpmnWorkflow(parser.get_spec("top_level_process"), parser.get_subprocess_specs("top_level_process"))
    wf.do_engine_steps()
    while not wf.is_completed():
        [task] = wf.get_tasks(state=TaskState.READY, manual=True)
        task.run()
        wf.do_engine_steps()
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert path_of(wf).count("test_process_to_call_script") == 2
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "set_in_top_level_script": 1, "set_in_top_level_subprocess": 1, "we_move_on": True,
        "set_in_test_process_to_call_script": 1, "a": 1, "set_top_level_process_script_after_gate": 1}


# -- SpiffArena's error notification: a message start event with its messageVariable ------------

NOTIFY = HERE / "message_start_error_handler.bpmn"
ERROR = {"message_text": "disk full", "recipients": ["ops@example.com"]}


def test_a_process_started_by_its_message_puts_the_payload_in_the_message_variable_as_in_plain_spiffworkflow() -> None:
    """It waits at its message start event; the message's payload lands in system_message (the
    message's spiffworkflow:messageVariable) and the script runs: plain SpiffWorkflow's path and data.
    validate warns that the message comes from a pool nobody runs, with how to send it."""
    assert problems(NOTIFY) == [("message_flow_from_outside", "warning", "Flow_1lktxcr"),
                                ("message_extension_deprecated", "warning", "Message_SystemMessageNotification")]
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([NOTIFY]), {}))
    assert [(w["task_id"], w["event"]) for w in waiting.waiting_for] == [("StartEvent_1", "SystemErrorMessage")]
    done = engine.send_event(waiting, "SystemErrorMessage", ERROR, kind="message")
    wf = plain_workflow(NOTIFY, "Process_MessageReceiverNotification")
    wf.catch(BpmnEvent(MessageEventDefinition("SystemErrorMessage"), ERROR))
    wf.do_engine_steps()
    assert done.status == "completed", done.error
    assert wf.is_completed()
    assert path_of(done.workflow) == path_of(wf)
    assert variables(done.main) == dict(wf.last_task.data) == {"system_message": ERROR, "x": 1}


# -- a conditional catch event on a data object the other branch sets ----------------------------

CONDITIONAL = HERE / "conditional_catch_event.bpmn"
#: the first script writes the data object too (as task A does), not a variable of its own
INIT_THE_OBJECT = ('<bpmn:script>task_a_done = False</bpmn:script>',
                   '<bpmn:dataOutputAssociation id="init_state"><bpmn:targetRef>task_a_state</bpmn:targetRef>'
                   '</bpmn:dataOutputAssociation>\n      <bpmn:script>task_a_done = False</bpmn:script>')


def test_a_conditional_catch_fires_when_the_other_branch_sets_the_data_object_it_waits_on(tmp_path: Path) -> None:
    """Both scripts write the data object task_a_done (their dataOutputAssociation): B's branch
    waits at the conditional event until A's postScript sets it True, then the join ends the
    process. The condition reads the data object as the process holds it, not the value the
    branch copied before the split: plain SpiffWorkflow's path, its data and data object."""
    path = rewritten(tmp_path, CONDITIONAL, [INIT_THE_OBJECT])
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance, asked = answer_all(engine, engine.run(engine.start(load_process([path]), {})))
    wf, plain_data = run_plain(path, {}, {"task_a": {}})
    assert [w["task_id"] for w in asked] == ["task_a"]
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert path_of(instance.workflow) == path_of(wf)
    assert wf.data_objects == {"task_a_done": True}
    assert variables(instance.main) == {**plain_data, **wf.data_objects} == {"a": 1, "task_a_done": True}


def test_a_conditional_catch_on_a_data_object_fires_where_plain_spiffworkflow_waits_for_ever() -> None:
    """As SpiffArena drew it, the first script sets task_a_done as a variable (no association), so
    plain SpiffWorkflow 3.2's conditional event reads that copy (False) before the data object A's
    postScript sets, and waits for ever. The data object is the process's: the condition reads it
    and the process ends as SpiffArena's own test of the file expects (a == 1, the data object
    True)."""
    assert problems(CONDITIONAL) == []
    wf = plain_workflow(CONDITIONAL, "intermediate")
    [task] = wf.get_tasks(state=TaskState.READY, manual=True)
    task.run()
    wf.do_engine_steps()
    wf.refresh_timers()  # (also re-checks waiting events)
    wf.do_engine_steps()
    assert not wf.is_completed()
    assert [t.task_spec.bpmn_id for t in wf.get_tasks(state=TaskState.WAITING)
            if t.task_spec.bpmn_id] == ["gateway_b", "event_1"]
    assert wf.data_objects == {"task_a_done": True}
    engine = Engine(store="memory://")
    instance, _ = answer_all(engine, engine.run(engine.start(load_process([CONDITIONAL]), {})))
    assert instance.status == "completed", (instance.error, instance.waiting_for)
    assert path_of(instance.workflow)[-3:] == ["event_1", "gateway_b", "end_1"]
    assert instance.workflow.data_objects == {"task_a_done": True}
    assert variables(instance.main) == {"a": 1, "task_a_done": True}


# -- SpiffArena's script error: a script that reads a name nothing set ----------------------------

SCRIPT_ERROR = HERE / "script_error_with_task_data.bpmn"


def test_a_script_reading_a_name_nothing_set_fails_at_that_task_naming_it_and_the_line_as_plain_spiffworkflow_does() -> None:
    """The spiffworkflow:unitTests of the first script are SpiffArena's (nothing runs them here, no
    word). The second script reads ``hey``, which start data could supply, so validate cannot
    refuse it; run without, it fails where plain SpiffWorkflow fails, the error naming the task,
    the line and the name, after the same steps."""
    assert problems(SCRIPT_ERROR) == []
    engine = Engine(store="memory://")
    failed = engine.run(engine.start(load_process([SCRIPT_ERROR]), {}))
    assert failed.status == "error"
    assert failed.error["task_id"] == "script_task_two" and failed.error["line"] == 1
    assert "NameError: name 'hey' is not defined" in failed.error["message"]
    with pytest.raises(WorkflowTaskException, match="hey") as raised:
        plain_workflow(SCRIPT_ERROR, "sample")
    assert raised.value.task.task_spec.bpmn_id == "script_task_two"
    assert variables(failed.main) == dict(raised.value.task.data) == {"my_var": "THE VAR"}


def test_the_script_error_file_runs_as_in_plain_spiffworkflow_when_the_start_data_gives_the_name() -> None:
    instance, wf = agree(SCRIPT_ERROR, {"hey": "there"})
    assert path_of(wf) == ["StartEvent_1", "script_task_one", "script_task_two", "Event_1qb1u6a"]
    assert variables(instance.main) == {"hey": "there", "my_var": "THE VAR"}
