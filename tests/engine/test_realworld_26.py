"""Public models, round 26, each in ``tests/engine/realworld26/`` (the file's header comment names its
source; ``realworld26/SOURCES.md`` lists repositories, paths, commits and licences): Camunda 7's example
processes (an invoice whose task form throws a BPMN error or escalation, loan granting by external
tasks over a multi-instance sub-process started by a cron timer, an XSLT script task, a call activity
of a tenant, a tweet review, a pizza order, task listeners, retry profiles, a conditional boundary
event, start and task forms, the model API's test process, Spin's JSON API in a condition and a
JavaScript script), SpiffArena's multi-instance tests (a
sequential user task with a boundary timer, a connector's error in one instance) and the BPMN MIWG's
C.9.0 customer onboarding (Trisotech). Each is validated as given (validate says what is wrong, naming the
element and what to write), then, edited as validate says, run, and its path and data are checked
against plain SpiffWorkflow's where plain SpiffWorkflow runs it, and against what BPMN says."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import InstanceStateError
from engine.validate import validate_process

from engine_helpers import path_of, run_plain_files, variables
from test_realworld_4 import rewritten
from test_realworld_17 import said
from test_realworld_24 import Clock

HERE = Path(__file__).resolve().parent / "realworld26"


def errors(*paths: Path) -> list[tuple[str, str | None]]:
    return sorted((p.code, p.element_id) for p in validate_process(list(paths)).problems if p.severity == "error")


def engine_with(handlers: dict[str, Any] | None = None, clock: Clock | None = None) -> Engine:
    engine = Engine(store="memory://", clock=clock) if clock else Engine(store="memory://")
    for task_id, handler in (handlers or {}).items():
        engine.handlers.register(task_id, handler)
    return engine


def waits(instance: Any) -> list[str]:
    return sorted(w["task_id"] for w in instance.waiting_for)


# -- Camunda 7: a task form that throws a BPMN error or an escalation -----------------------------

INVOICE = HERE / "camunda7_invoice_payment_bpmn_events.bpmn"
ERROR_POST_SCRIPT = (
    'camunda:formKey="embedded:app:task-form.html">',
    'camunda:formKey="embedded:app:task-form.html">\n      <bpmn:extensionElements><spiffworkflow:postScript>'
    'if unspecified_amount:\n    raise BpmnError("invoice-error")</spiffworkflow:postScript></bpmn:extensionElements>')
SPIFF_NS = ('xmlns:camunda=', 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" xmlns:camunda=')


def test_error_and_escalation_boundaries_on_a_user_task_that_nothing_throws_are_named_with_the_way() -> None:
    """Camunda's embedded form throws them (the task form's BPMN error / escalation, REST
    /task/{id}/bpmnError). validate said the file was valid, and the instance could never take the
    'Archive Invoice' or 'Inform Supervisor' path: a person's answer throws nothing."""
    found = {p.element_id: p for p in validate_process([INVOICE]).problems}
    error, escalation = found["BoundaryEvent_18unjdv"], found["BoundaryEvent_1uy9o9h"]
    assert (error.code, error.severity, error.field) == ("boundary_never_thrown", "warning", "errorRef")
    assert (escalation.code, escalation.severity, escalation.field) == ("boundary_never_thrown", "warning",
                                                                       "escalationRef")
    text = str(error)
    assert "error boundary event 'BoundaryEvent_18unjdv' on user task 'Task_16y91ka' catches error " \
           "'invoice-error'" in text
    assert "a person's answer throws no BPMN error here (Camunda's task forms do)" in text
    assert "'Task_1a2twqz' never runs" in text
    assert 'raise BpmnError("invoice-error") in a spiffworkflow:postScript of \'Task_16y91ka\'' in text
    text = str(escalation)
    assert "escalation boundary event 'BoundaryEvent_1uy9o9h' on user task 'Task_16y91ka' catches escalation " \
           "'invoice-escalate'" in text
    assert "no script throws an escalation" in text
    assert "draw an exclusive gateway after 'Task_16y91ka' with a flow to 'Task_0q869n2'" in text


def test_a_user_task_whose_post_script_raises_the_error_is_not_warned_and_takes_the_boundary_path(
        tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, INVOICE, [SPIFF_NS, ERROR_POST_SCRIPT])
    found = {p.element_id: p.code for p in validate_process([fixed]).problems}
    assert "BoundaryEvent_18unjdv" not in found
    assert found["BoundaryEvent_1uy9o9h"] == "boundary_never_thrown"
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}),
                          answers={"user_tasks": {"Task_16y91ka": {"unspecified_amount": True}}})
    assert waits(instance) == ["Task_1a2twqz"]
    instance = engine.run(instance, answers={"user_tasks": {"Task_1a2twqz": {"archived": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["StartEvent_1", "BoundaryEvent_18unjdv", "Task_1a2twqz", "EndEvent_1ga7c7t"]
    # the throwing task's writes are dropped, as README says; the catch brings the code
    assert variables(instance.contexts["main"]) == {"error_code": "invoice-error", "error_message": None,
                                                    "archived": True}
    # answered otherwise, the invoice is paid
    instance = engine.run(engine.start(load_process([fixed]), {}),
                          answers={"user_tasks": {"Task_16y91ka": {"unspecified_amount": False}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["StartEvent_1", "Task_16y91ka", "EndEvent_1ug8ljt"]


def test_sending_the_error_code_as_a_message_says_an_error_is_thrown_by_the_task() -> None:
    """`layerflow send ID invoice-error` said only "does not wait for message 'invoice-error'; it waits
    for: user task Task_16y91ka", as if the name were a typo."""
    engine = engine_with()
    instance = engine.run(engine.start(load_process([INVOICE]), {}))
    for name in ("invoice-error", "Unspecified Amount"):
        with pytest.raises(InstanceStateError) as refused:
            engine.send_event(instance, name, {})
        text = str(refused.value)
        assert "'invoice-error' is the code of the error that error boundary event 'BoundaryEvent_18unjdv' on " \
               "'Task_16y91ka' catches" in text
        assert "an error is thrown by the task, never sent" in text
        assert 'raise BpmnError("invoice-error") in a spiffworkflow:postScript of \'Task_16y91ka\'' in text
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(instance, "invoice-escalate", {}, kind="signal")
    assert "'invoice-escalate' is the code of the escalation that escalation boundary event " \
           "'BoundaryEvent_1uy9o9h' on 'Task_16y91ka' catches" in str(refused.value)
    assert "no script throws one: draw an exclusive gateway after 'Task_16y91ka'" in str(refused.value)
    assert engine.load(instance.id).status == "waiting"


# -- Camunda 7: loan granting by external tasks ---------------------------------------------------

LOAN = HERE / "camunda7_loan_granting.bpmn"
LOAN_EDITS = [("${score &gt; 5}", "score &gt; 5"), ("${score &lt;= 5}", "score &lt;= 5"),
              ('<bpmn:multiInstanceLoopCharacteristics camunda:collection="${creditScores}" '
               'camunda:elementVariable="score" />',
               "<bpmn:multiInstanceLoopCharacteristics><bpmn:loopDataInputRef>creditScores</bpmn:loopDataInputRef>"
               '<bpmn:inputDataItem id="score" name="score"/></bpmn:multiInstanceLoopCharacteristics>'),
              ("0/5 0/1 * 1/1 * ? *", '"R/PT5S"')]


def test_an_input_parameters_javascript_that_sets_a_variable_gets_the_python_of_what_it_sets() -> None:
    """The camunda:script of input parameter 'Input_2rvtuu9' sets 'defaultScore'
    (execution.setVariable); validate said "nothing sets 'Input_2rvtuu9'; set it in a preScript
    (Input_2rvtuu9 = ...; write what the script computes in Python)", the variable nobody reads."""
    text = said(LOAN)["Task_1lvjtd4"]
    assert "Input_2rvtuu9 = ..." not in text
    assert "its camunda:script sets 'defaultScore' (execution.setVariable, Camunda's process API)" in text
    assert "write 'defaultScore = 5' in a spiffworkflow:preScript of 'Task_1lvjtd4'" in text


def test_loan_granting_edited_as_said_grants_and_rejects_each_score_when_the_timer_fires(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, LOAN, LOAN_EDITS)
    assert errors(fixed) == []
    decided: list[int] = []
    clock = Clock()
    engine = engine_with({"Task_1lvjtd4": lambda ctx: {"creditScores": [9, 3, 7]},
                          "Task_0v4gadf": lambda ctx: decided.append(ctx.get("score")) or {"granted": True},
                          "Task_0j0sjlk": lambda ctx: decided.append(-ctx.get("score")) or {"rejected": True}},
                         clock)
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["StartEvent_1"] and decided == []
    clock.now += 5
    instance = engine.resume(instance)
    assert decided == [9, -3, 7]
    assert variables(instance.contexts["main"]) == {"creditScores": [9, 3, 7], "granted": True, "rejected": True}


# -- Camunda 7: an XSLT script task ---------------------------------------------------------------

XSLT = HERE / "camunda7_xslt_script.bpmn"


def test_an_xslt_script_resource_is_not_said_to_be_python_to_copy() -> None:
    """validate said "copy the Python of the file it names into the task's bpmn:script": the file is
    an XSLT stylesheet (scriptFormat="xslt"), which no copy makes Python."""
    text = said(XSLT)["ScriptTask_1"]
    assert "copy the Python" not in text
    assert "camunda:resource='org/camunda/bpm/example/xsltexample/example.xsl' names a file of the other " \
           "engine's deployment holding the script in scriptFormat 'xslt' (an XSLT stylesheet)" in text
    assert "layerflow runs Python scripts only: write what it computes in Python as the task's bpmn:script" in text


# -- the MIWG's C.9.0: a pool that is not executable beside a leftover process --------------------

C90 = HERE / "miwg_c90_customer_onboarding.bpmn"
MAIN = "Process_1_bf52e43f-cfee-4be6-aa8d-7157a06b2bf9"
LEFTOVER = "BPMNDiagram_1_3f6b2ab9-3ea6-4265-8528-3af68e5fbea3_process"


def test_the_pools_process_is_checked_not_the_leftover_process_beside_it() -> None:
    """Trisotech writes a process holding one end event, no start event and no isExecutable beside the
    pool's process (isExecutable="false"). validate took the leftover as the process to run (the only
    one not marked false), said to draw a start event in it, and said nothing of the model."""
    problems = validate_process([C90]).problems
    assert not [p for p in problems if p.element_id in (LEFTOVER, "_3f282ce2-7d90-4143-9d8a-d7cc46cf4e37")]
    [refused] = [p for p in problems if p.code == "no_executable_process"]
    assert refused.element_id == MAIN
    assert f"process {LEFTOVER!r}, the only one not marked isExecutable=\"false\", has no start event" in str(refused)
    codes = {(p.code, p.element_id) for p in problems if p.severity == "error"}
    assert ("call_no_called_element", "callActivity_6i39rqqim") in codes or any(
        e == "callActivity_6i39rqqim" for _, e in codes)
    assert any(e == "Gateway_15hrqs9_to_callActivity_6i39rqqim" for _, e in codes)


def test_made_executable_the_pools_process_is_the_one_to_run_not_ambiguous(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, C90, [('isExecutable="false"', 'isExecutable="true"')])
    problems = validate_process([fixed]).problems
    assert "process_ambiguous" not in {p.code for p in problems}
    assert validate_process([fixed]).process_id == MAIN


def test_message_end_events_without_a_message_are_not_said_to_start_an_event_sub_process() -> None:
    """Three end events throw a message with no messageRef; validate warned that each "throws the
    message None that would start event sub-process ...", one of them the very sub-process it is in.
    SpiffWorkflow names such a message after its event: none of them is 'Cancelation requested'."""
    assert not [p for p in validate_process([C90]).problems if p.code == "event_subprocess_after_interrupt"]


def c90_edited(tmp_path: Path) -> list[Path]:
    fixed = rewritten(tmp_path, C90, [
        ('isExecutable="false"', 'isExecutable="true"'),
        ('trisobpmn:calledElementType="process">', 'calledElement="manual_check">'),
        ('name="Yellow&#10;(Moderate risk)" triso:readOnly="false" sourceRef="Gateway_15hrqs9" '
         'targetRef="callActivity_6i39rqqim" isImmediate="false"/>',
         'name="Yellow&#10;(Moderate risk)" sourceRef="Gateway_15hrqs9" targetRef="callActivity_6i39rqqim">'
         '<semantic:conditionExpression>risk == "yellow"</semantic:conditionExpression></semantic:sequenceFlow>'),
        ('name="Red (severe risk)" triso:readOnly="false" sourceRef="Gateway_15hrqs9" '
         'targetRef="_5cac59a8-dca6-4d66-b600-e1548b35b907"/>',
         'name="Red (severe risk)" sourceRef="Gateway_15hrqs9" targetRef="_5cac59a8-dca6-4d66-b600-e1548b35b907">'
         '<semantic:conditionExpression>risk == "red"</semantic:conditionExpression></semantic:sequenceFlow>'),
        ('gatewayDirection="Diverging">\n            <semantic:incoming>callActivity_6i39rqqim_to_exclusiveGateway',
         'gatewayDirection="Diverging" default="exclusiveGateway_g6mfrr6v5_to_Activity_1t4pfid">\n'
         '            <semantic:incoming>callActivity_6i39rqqim_to_exclusiveGateway'),
        ('sourceRef="exclusiveGateway_g6mfrr6v5" targetRef="_5cac59a8-dca6-4d66-b600-e1548b35b907"/>',
         'sourceRef="exclusiveGateway_g6mfrr6v5" targetRef="_5cac59a8-dca6-4d66-b600-e1548b35b907">'
         '<semantic:conditionExpression>not approved</semantic:conditionExpression></semantic:sequenceFlow>')])
    called = tmp_path / "manual_check.bpmn"
    called.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/'
        '20100524/MODEL" id="d" targetNamespace="t"><bpmn:process id="manual_check" isExecutable="true">'
        '<bpmn:startEvent id="check_start"/><bpmn:userTask id="check"/><bpmn:endEvent id="check_end"/>'
        '<bpmn:sequenceFlow id="c1" sourceRef="check_start" targetRef="check"/>'
        '<bpmn:sequenceFlow id="c2" sourceRef="check" targetRef="check_end"/></bpmn:process></bpmn:definitions>\n')
    # the business rule task names no decision: given a handler in the config, as validate says
    (tmp_path / "c90_handlers.py").write_text("def check(ctx):\n    return {'risk': ctx.get('risk_given')}\n")
    (tmp_path / "miwg_c90_customer_onboarding.layerflow.yaml").write_text(
        "Activity_1ow7lqx:\n  handler: c90_handlers.py:check\n")
    return [fixed, called]


@pytest.mark.parametrize(("risk", "answer", "path"), [
    ("green", None, ["Activity_1ewde7d", "Activity_1ow7lqx", "Gateway_15hrqs9", "Activity_1t4pfid", "Activity_0hr66t1",
                     "Event_03do636"]),
    ("red", None, ["Activity_1ewde7d", "Activity_1ow7lqx", "Gateway_15hrqs9", "_5cac59a8-dca6-4d66-b600-e1548b35b907",
                   "_020c40e2-fb18-4ac2-9a62-1940d2ba5447", "_a1a3da62-1f10-44fc-ac1f-670511606ed6"]),
    ("yellow", {"approved": False}, ["Activity_1ewde7d", "Activity_1ow7lqx", "Gateway_15hrqs9", "check_start", "check",
                                     "check_end", "callActivity_6i39rqqim", "exclusiveGateway_g6mfrr6v5",
                                     "_5cac59a8-dca6-4d66-b600-e1548b35b907",
                                     "_020c40e2-fb18-4ac2-9a62-1940d2ba5447",
                                     "_a1a3da62-1f10-44fc-ac1f-670511606ed6"]),
])
def test_c90_edited_as_said_runs_each_risk_path(tmp_path: Path, risk: str, answer: Any, path: list[str]) -> None:
    files = c90_edited(tmp_path)
    assert errors(*files) == []
    done = {"Activity_1ewde7d": lambda ctx: {"score": 700}}
    for task in ("Activity_1t4pfid", "Activity_0hr66t1", "_5cac59a8-dca6-4d66-b600-e1548b35b907",
                 "_020c40e2-fb18-4ac2-9a62-1940d2ba5447", "ID-fa065652-450f-11ef-4f49-ac74b1298ff1"):
        done[task] = lambda ctx, task=task: {f"done_{len(ctx.get('steps', []))}": task}
    engine = engine_with(done)
    instance = engine.run(engine.start(load_process(files, process_id=MAIN), {"risk_given": risk}))
    if answer is not None:
        assert waits(instance) == ["ID-fa06564f-450f-11ef-4f49-ac74b1298ff1", "check"]
        instance = engine.run(instance, answers={"user_tasks": {"check": answer}})
    # (the cancellation's event sub-process listens only while the process runs: it ends with it)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[1:] == path


# -- Camunda 7: a tweet review, a pizza order ------------------------------------------------------

TWITTER = HERE / "camunda7_twitter_demo.bpmn"
PIZZA = HERE / "camunda7_pizza_order.bpmn"


@pytest.mark.parametrize(("approved", "step"), [(True, "service_task_publish_on_twitter"),
                                                (False, "service_task_send_rejection_notification")])
def test_the_tweet_review_edited_as_said_publishes_or_notifies(tmp_path: Path, approved: bool, step: str) -> None:
    assert errors(TWITTER) == [("condition_juel", "no"), ("condition_juel", "yes")] or \
        [e for _, e in errors(TWITTER)] == ["no", "yes"]
    fixed = rewritten(tmp_path, TWITTER, [("#{!approved}", "not approved"), ("#{approved}", "approved")])
    assert errors(fixed) == []
    engine = engine_with({"service_task_publish_on_twitter": lambda ctx: {"tweet_id": 1},
                          "service_task_send_rejection_notification": lambda ctx: {"notified": ctx.get("initiator")}})
    instance = engine.run(engine.start(load_process([fixed]), {"initiator": "demo"}),
                          answers={"user_tasks": {"user_task_review_tweet": {"approved": approved}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start_event_new_tweet", "user_task_review_tweet", "gateway_approved", step,
                                          "gateway_join", "end_event_tweet_handled"]
    assert variables(instance.contexts["main"]) == (
        {"initiator": "demo", "approved": True, "tweet_id": 1} if approved
        else {"initiator": "demo", "approved": False, "notified": "demo"})


def test_the_pizza_orders_bean_condition_says_to_compute_the_value_in_a_handler() -> None:
    text = said(PIZZA)["SequenceFlow_10r7cva"]
    assert text.startswith("error:")
    assert "orderBusinessLogic.getOrder() calls a Java bean of the Camunda application" in text


# -- Camunda 7: a call activity of a tenant, task listeners, retry profiles -----------------------

TENANT_MAIN = HERE / "camunda7_tenant_main_process.bpmn"
TENANT_SUB = HERE / "camunda7_tenant_sub_process.bpmn"


def test_the_tenants_call_activity_runs_its_called_process_as_plain_spiffworkflow() -> None:
    assert "subProcess" in said(TENANT_MAIN)["CallActivity_0ahffuc"]
    assert errors(TENANT_MAIN, TENANT_SUB) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([TENANT_MAIN, TENANT_SUB]), {"order": 7}),
                          answers={"user_tasks": {"UserTask_0zlyiaz": {"handled": True}}})
    assert instance.status == "completed", instance.error
    plain = run_plain_files([TENANT_MAIN, TENANT_SUB], "mainProcess")
    plain.task_tree.data.update({"order": 7})
    [task] = [t for t in plain.get_tasks() if t.task_spec.name == "UserTask_0zlyiaz" and t.state == 16]
    task.data.update({"handled": True})
    task.run()
    plain.do_engine_steps()
    assert plain.is_completed()
    assert path_of(instance.workflow) == path_of(plain) == ["StartEvent_1", "StartEvent_1", "UserTask_0zlyiaz",
                                                            "EndEvent_09z3uwr", "CallActivity_0ahffuc",
                                                            "EndEvent_0pf67o7"]
    assert variables(instance.contexts["main"]) == {"handled": True} or \
        variables(instance.contexts["main"]) == {"order": 7, "handled": True}


@pytest.mark.parametrize(("name", "element", "said_text"), [
    ("camunda7_task_assignment_email.bpmn", "UserTask_1", "has camunda:taskListener"),
    ("camunda7_retry_profile.bpmn", "service-send-data", "has camunda:class"),
])
def test_settings_of_camunda_that_do_not_run_here_are_warnings_naming_them(name: str, element: str,
                                                                            said_text: str) -> None:
    text = said(HERE / name)[element]
    assert said_text in text and "error:" not in text
    assert errors(HERE / name) == []


# -- SpiffArena: a sequential multi-instance user task with a boundary timer; a multi-instance
#    sub-process whose connector's error boundary event catches one instance's error ----------------

MI_TIMER = HERE / "spiff_arena_multi_instance_user_task_timer.bpmn"
MI_ERROR = HERE / "spiff_arena_multi_instance_inner_error_boundary.bpmn"


def test_the_boundary_timer_ends_the_sequential_user_tasks_as_in_plain_spiffworkflow(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import datetime, timedelta, timezone

    from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
    from SpiffWorkflow.util.task import TaskState

    from engine_helpers import patch_spiff_timer_clock

    assert list(validate_process([MI_TIMER]).problems) == []
    clock = Clock()
    engine = engine_with(clock=clock)
    instance = engine.run(engine.start(load_process([MI_TIMER]), {}))
    assert [(w["task_id"], w.get("instance")) for w in instance.waiting_for] == [("HumanTask", 1),
                                                                                 ("TimerBoundary", None)]
    instance = engine.complete_user_task(instance, "HumanTask", {"result": "A"})
    assert [(w["task_id"], w.get("instance")) for w in instance.waiting_for] == [("HumanTask", 2),
                                                                                 ("TimerBoundary", None)]
    clock.now += 4 * 3600
    instance = engine.resume(instance)
    assert instance.status == "completed", instance.error

    now = patch_spiff_timer_clock(monkeypatch, datetime.fromtimestamp(clock.now - 4 * 3600, timezone.utc))
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(MI_TIMER))
    plain = BpmnWorkflow(parser.get_spec("Process_MultiInstanceUserTimer"))
    plain.do_engine_steps()
    [first] = plain.get_tasks(state=TaskState.READY, manual=True)
    first.data["result"] = "A"
    first.run()
    plain.do_engine_steps()
    now[0] += timedelta(hours=4, seconds=1)
    plain.refresh_timers()
    plain.do_engine_steps()
    assert plain.is_completed()
    assert path_of(instance.workflow) == path_of(plain) == ["StartEvent_1", "SetInput", "HumanTask", "TimerBoundary",
                                                            "TimerEnd"]
    # the timer interrupted the loop: no output collection, as in plain SpiffWorkflow
    assert variables(instance.contexts["main"]) == {"items": ["a", "b", "c"]}
    assert "results" not in plain.last_task.data


def test_each_answer_of_the_sequential_user_task_is_collected_in_order() -> None:
    engine = engine_with()
    instance = engine.run(engine.start(load_process([MI_TIMER]), {}))
    for answer in ("A", "B", "C"):
        instance = engine.complete_user_task(instance, "HumanTask", {"result": answer})
    assert instance.status == "completed", instance.error
    assert variables(instance.contexts["main"]) == {"items": ["a", "b", "c"], "results": ["A", "B", "C"]}


def test_the_connectors_error_in_one_instance_takes_its_boundary_path_and_the_others_go_on() -> None:
    from engine import BpmnError

    def get(ctx: Any) -> dict[str, Any]:
        if ctx.params["url"] == "DNE":
            raise BpmnError("MissingSchema", "Invalid URL 'DNE'", {"status": 0})
        return {"status": 200}

    assert errors(MI_ERROR) == []
    engine = engine_with({"http/GetRequestV2": get})
    instance = engine.run(engine.start(load_process([MI_ERROR]), {}))
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path.count("subprocess_service_task") == 3 and path.count("error_script_task") == 1
    # the error's payload under its spiffworkflow:variableName, returned by the error path's script
    assert variables(instance.contexts["main"])["all_output"] == [{"status": 200}, {"status": 200}, {"status": 0},
                                                                  {"status": 200}]


# -- Camunda 7: a conditional boundary event on a sub-process; forms on the start and a task -------

ORDER = HERE / "camunda7_order_conditional_boundary.bpmn"
DATAFORMAT = HERE / "camunda7_dataformat_demo.bpmn"


def test_the_conditional_boundary_event_takes_over_once_the_invoice_has_an_id(tmp_path: Path) -> None:
    """As Camunda: the condition turns true as 'Create Invoice' sets invoiceId, which interrupts the
    sub-process before its end event; 'Archive invoice' runs, the plain end does not."""
    assert "write 'invoiceId != None'" in said(ORDER)["BoundaryEvent_1y1bvad"]
    fixed = rewritten(tmp_path, ORDER, [("${invoiceId != null}", "invoiceId != None"),
                                        ("0/5 0/1 * 1/1 * ? *", '"R/PT5S"')])
    assert errors(fixed) == []
    clock = Clock()
    engine = engine_with({"Task_06z99p1": lambda ctx: {"invoiceId": "INV-1"},
                          "Task_1yjkccw": lambda ctx: {"archived": ctx.get("invoiceId")}}, clock)
    instance = engine.run(engine.start(load_process([fixed]), {}))
    clock.now += 5
    instance = engine.resume(instance)
    assert waits(instance) == ["StartEvent_1"]  # the cycle waits for its next round
    done = {t.task_spec.bpmn_id: t.state for t in instance.workflow.get_tasks()
            if getattr(t.task_spec, "bpmn_id", None)}
    assert done["Task_1yjkccw"] == done["EndEvent_0q2wrcp"] == 64  # COMPLETED
    assert "EndEvent_00asnpf" not in done or done["EndEvent_00asnpf"] != 64
    assert variables(instance.contexts["main"]) == {"invoiceId": "INV-1", "archived": "INV-1"}


def test_the_dataformat_forms_check_the_start_data_and_the_answer_then_the_json_path_runs(tmp_path: Path) -> None:
    from engine import FormAnswerInvalid
    from engine.governance import StartDataInvalid

    fixed = rewritten(tmp_path, DATAFORMAT, [('${dataFormat == "xml"}', 'dataFormat == "xml"'),
                                             ('${dataFormat == "json"}', 'dataFormat == "json"')])
    assert errors(fixed) == []
    engine = engine_with({"Task_03zh96w": lambda ctx: {"customer": "xml"},
                          "Task_1x6a2xs": lambda ctx: {"customer": "json"},
                          "Task_1p179ep": lambda ctx: {"logged": ctx.get("customer")}})
    with pytest.raises(StartDataInvalid) as refused:
        engine.start(load_process([fixed]), {"gender": "other", "age": "x"})
    assert "field 'gender' \"other\" is not one of female, male" in str(refused.value)
    instance = engine.run(engine.start(load_process([fixed]), {"firstname": "Ann", "gender": "female", "age": 41}))
    with pytest.raises(FormAnswerInvalid):
        engine.complete_user_task(instance, "Task_1vjuj1c", {"dataFormat": "yaml"})
    instance = engine.complete_user_task(instance, "Task_1vjuj1c", {"dataFormat": "json"})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["StartEvent_1", "Task_1vjuj1c", "ExclusiveGateway_06znf1b", "Task_1x6a2xs",
                                          "ExclusiveGateway_0tj5ibz", "Task_1p179ep", "EndEvent_1nrs79a"]
    assert variables(instance.contexts["main"]) == {"firstname": "Ann", "gender": "female", "age": 41,
                                                    "dataFormat": "json", "customer": "json", "logged": "json"}


# -- Camunda 7: the model API's test process (execution.setVariable in JUEL, a Groovy println) -----

PARSE = HERE / "camunda7_parse_bpmn_test_process.bpmn"


def test_a_juel_expression_that_sets_a_variable_gets_the_assignment_to_write_not_a_java_bean() -> None:
    """camunda:expression="${execution.setVariable('foo', 'bar')}" was said to call setVariable() "of
    'execution', a Java bean of the other engine's application": execution is Camunda's process API,
    and the expression's work is one assignment, which the gateway after it reads."""
    text = said(PARSE)["serviceTask"]
    assert "a Java bean" not in text
    assert "sets 'foo' through Camunda's process API (execution.setVariable), which is not here" in text
    assert "make 'serviceTask' a bpmn:scriptTask whose script is \"foo = 'bar'\"" in text
    assert "or register a handler for 'serviceTask' that returns {'foo': 'bar'}" in text


def test_an_execution_listener_that_sets_a_variable_says_the_assignment_and_where() -> None:
    text = said(PARSE)["endEvent"]
    assert "its executionListener (event 'start') sets 'finished' (execution.setVariable): write " \
           "'finished = True' in a bpmn:scriptTask drawn before 'endEvent'" in text


def test_a_groovy_println_gets_the_print_to_write() -> None:
    text = said(PARSE)["scriptTask"]
    assert "write it as 'print(\"hello world\")'" in text


def test_the_model_apis_process_edited_as_said_runs_to_user_task_b(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, PARSE, [
        ('<bpmn2:serviceTask id="serviceTask" camunda:expression="${execution.setVariable(\'foo\', \'bar\')}" '
         'camunda:async="true" camunda:exclusive="false" name="Service Task">',
         '<bpmn2:scriptTask id="serviceTask" name="Service Task"><bpmn2:script>foo = \'bar\'</bpmn2:script>'),
        ("</bpmn2:serviceTask>", "</bpmn2:scriptTask>"),
        ("${foo != 'bar'}", "foo != 'bar'"), ("${foo == 'bar'}", "foo == 'bar'"),
        ('scriptFormat="groovy"', 'scriptFormat="python"'),
        ("println 'hello world'", "print(\"hello world\")\nfinished = True")])
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}),
                          answers={"user_tasks": {"userTaskB": {"done": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent", "serviceTask", "gatewayFork", "userTaskB", "gatewayJoin",
                                          "scriptTask", "endEvent"]
    # the start form's defaults, as the submitted form would carry them
    assert variables(instance.contexts["main"]) == {"name": "test", "age": 0, "foo": "bar", "done": True,
                                                    "finished": True}


# -- Camunda 7: Spin's JSON API in a condition and in a JavaScript script ------------------------

JSON_CUSTOMER = HERE / "camunda7_json_customer.bpmn"
SPIN_PRICE = HERE / "camunda7_spin_extract_price.bpmn"


def test_spins_json_api_in_a_condition_gets_the_keys_to_read_not_a_java_bean() -> None:
    """${customer.prop("age").numberValue() >= 21} was said to call "a Java bean of the Camunda
    application" and the Python to write kept .prop() and .numberValue(), which no dict has: Spin is
    Camunda's JSON API, and a JSON object here is a dict."""
    text = said(JSON_CUSTOMER)["SequenceFlow_4"]
    assert "Java bean" not in text
    assert "write 'customer[\"age\"] >= 21'" in text
    assert "Camunda Spin's JSON API (.prop(\"age\"), .numberValue()): a JSON object here is a dict" in text


def test_the_json_customer_edited_as_said_routes_by_age(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, JSON_CUSTOMER, [('${customer.prop("age").numberValue() &gt;= 21}',
                                                 'customer["age"] &gt;= 21'),
                                                ('${customer.prop("age").numberValue() &lt; 21}',
                                                 'customer["age"] &lt; 21')])
    assert errors(fixed) == []
    engine = engine_with({"Task_0n2pfas": lambda ctx: {"validated": True}})
    instance = engine.run(engine.start(load_process([fixed]), {"customer": {"name": "Ann", "age": 19}}),
                          answers={"user_tasks": {"UserTask_1": {"approved": True}, "UserTask_3": {}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["ExclusiveGateway_1", "UserTask_3", "EndEvent_3"]


def test_a_javascript_script_of_camundas_api_is_named_as_such_not_as_invalid_syntax() -> None:
    """`var carJson = execution.getVariableTyped("car")...; execution.setVariable("price", price);` was
    "not Python (invalid syntax in 'var carJson = ...')": its declarations hid what it calls."""
    text = said(SPIN_PRICE)["ScriptTask_1"]
    assert "invalid syntax" not in text
    assert "calls execution.getVariableTyped, execution.setVariable, Camunda's process API" in text
    assert "a JavaScript script (var declarations, ; at line ends)" in text


def test_a_form_field_the_answer_left_out_is_named_where_a_condition_reads_it(tmp_path: Path) -> None:
    """The form's enum has no default and is not required: answered without it, the gateway's
    condition fails with "give 'dataFormat' a value before 'ExclusiveGateway_06znf1b' (the start data
    or an earlier task's output)", while it was the person's answer that left it out."""
    fixed = rewritten(tmp_path, DATAFORMAT, [('${dataFormat == "xml"}', 'dataFormat == "xml"'),
                                             ('${dataFormat == "json"}', 'dataFormat == "json"')])
    engine = engine_with()
    instance = engine.complete_user_task(engine.run(engine.start(load_process([fixed]), {})), "Task_1vjuj1c", {})
    assert instance.status == "error"
    message = instance.error["message"]
    assert "NameError: name 'dataFormat' is not defined" in message
    assert "user task 'Task_1vjuj1c' asks for 'dataFormat' in its form (camunda:formData), and its answer left " \
           "it out (the field has no default and is not required): answer it there, or give the field a " \
           "default or make it required" in message


def test_a_start_form_field_the_start_data_left_out_is_named_where_a_condition_reads_it(tmp_path: Path) -> None:
    fixed = rewritten(tmp_path, DATAFORMAT, [('${dataFormat == "xml"}', "age &gt; 20"),
                                             ('${dataFormat == "json"}', "age &lt;= 20")])
    engine = engine_with()
    instance = engine.complete_user_task(engine.run(engine.start(load_process([fixed]), {})), "Task_1vjuj1c",
                                         {"dataFormat": "xml"})
    assert instance.status == "error"
    assert "start event 'StartEvent_1' asks for 'age' in its form (camunda:formData), and the start data left it " \
           "out (the field has no default and is not required): give it in the start data" in instance.error["message"]
