"""Shapes met in public BPMN and DMN files, round 8: the variables Camunda 7 and Flowable set as an
error or escalation is caught (``camunda:errorCodeVariable``, ``camunda:errorMessageVariable``,
``camunda:escalationCodeVariable``, ``flowable:errorVariableName``), event sub-processes that a
condition starts, jBPM's on-entry and on-exit scripts and work items, Flowable Design's exports, and
the loops, completion conditions, escalations and terminate events of bpmn.io and SpiffArena
drawings. Each is redrawn small in ``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run
a shape, a case runs it there too and the outcome must agree."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process

from engine_helpers import path_of, run_plain, variables
from test_realworld_4 import plain, rewritten

REALWORLD = Path(__file__).resolve().parent / "realworld"


def found_for(path: Path, *codes: str, process_id: str | None = None) -> list[Any]:
    return [p for p in validate_process([path], process_id=process_id).problems if p.code in codes]


def run(path: Path, data: dict[str, Any], process_id: str | None = None, answers: dict[str, Any] | None = None) -> Any:
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process([path], process_id=process_id), data), answers=answers)


# -- what Camunda 7 sets as an error or escalation is caught --------------------------------------

CAUGHT = REALWORLD / "error_code_variable.bpmn"


@pytest.mark.parametrize("amount, credit, end, expected", [
    (500, 800, "paid", {}),
    (900, 800, "failed", {"failureCode": "DECLINED", "failureText": "The bank declined the card",
                          "notice": "DECLINED: The bank declined the card"}),
    (1500, 2000, "paid", {"reviewReason": "REVIEW", "review": "queued: REVIEW"}),
    (1500, 800, "failed", {"reviewReason": "REVIEW", "review": "queued: REVIEW", "failureCode": "DECLINED",
                           "failureText": "The bank declined the card", "notice": "DECLINED: The bank declined the card"}),
], ids=["paid", "declined", "reviewed", "reviewed-and-declined"])
def test_camunda7_caught_error_and_escalation_variables_are_set(amount: int, credit: int, end: str,
                                                                 expected: dict[str, Any]) -> None:
    """Camunda Modeler's error boundary event names the variables Camunda sets to the caught error's
    code and message (``camunda:errorCodeVariable``, ``camunda:errorMessageVariable``; the message
    is the bpmn:error's ``camunda:errorMessage``), an escalation boundary event the one it sets to
    the escalation's code. Neither SpiffWorkflow nor layerflow set them, and validate said nothing:
    the step after the catch stopped with "name 'failureCode' is not defined". They are set now, as
    the event catches, and nothing is reported."""
    if expected:
        with pytest.raises(Exception, match="is not defined"):
            plain(CAUGHT, "card_payment", {"amount": amount, "credit": credit})
    assert [p for p in validate_process([CAUGHT]).problems] == []
    instance = run(CAUGHT, {"amount": amount, "credit": credit})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"amount": amount, "credit": credit, **expected}
    assert end in path_of(instance.workflow)


def test_a_caught_code_variable_of_a_catch_that_names_no_error_is_refused_where_it_is_read(tmp_path: Path) -> None:
    """A boundary event that names no bpmn:error catches every error, so which code it caught is
    known only as it catches: layerflow does not set ``camunda:errorCodeVariable`` there. validate
    refuses it where a script reads the variable (the run would stop there, as it did), at the event
    definition's line, naming the event, the attributes and their variables and what to do; where
    nothing reads them, a warning."""
    changed = rewritten(tmp_path, CAUGHT, [
        ('errorRef="Error_Declined" camunda:errorCodeVariable', 'camunda:errorCodeVariable')])
    [problem] = found_for(changed, "caught_variable_not_set")
    line = next(i for i, text in enumerate(changed.read_text().splitlines(), 1)
                if 'camunda:errorCodeVariable="failureCode"' in text)
    assert (problem.severity, problem.element_id, problem.field, problem.line, problem.file) == (
        "error", "payment_failed", "camunda:errorCodeVariable", line, str(changed))
    assert ("camunda:errorCodeVariable='failureCode', camunda:errorMessageVariable='failureText'"
            in problem.message)
    assert "it catches every error; the run stops where 'failureCode' is read" in problem.message
    assert "give its bpmn:errorEventDefinition an errorRef naming the bpmn:error" in problem.message
    assert [p.code for p in validate_process([changed]).problems] == ["caught_variable_not_set"]
    (tmp_path / "unread").mkdir()
    unread = rewritten(tmp_path / "unread", changed, [('notice = failureCode + ": " + failureText', "notice = 1")])
    [warning] = found_for(unread, "caught_variable_not_set")
    assert warning.severity == "warning" and "is read" not in warning.message


def test_a_caught_message_variable_for_an_error_without_a_message_is_null(tmp_path: Path) -> None:
    """An error with no camunda:errorMessage gives its message variable null, as in Camunda."""
    changed = rewritten(tmp_path, CAUGHT, [(' camunda:errorMessage="The bank declined the card"', ""),
                                           ('failureCode + ": " + failureText', "f'{failureCode}: {failureText}'")])
    assert list(validate_process([changed]).problems) == []
    instance = run(changed, {"amount": 900, "credit": 800})
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert (found["failureCode"], found["failureText"], found["notice"]) == ("DECLINED", None, "DECLINED: None")


def test_an_error_event_sub_process_start_sets_the_caught_error_variables() -> None:
    """An error event sub-process whose start event names the code and message variables, the
    message given as ``operaton:errorMessage`` (a BPMN DSL's import fixture, saved as Operaton's
    modeler does): plain SpiffWorkflow stops in the clean-up step on ``code``; layerflow sets both as
    the event sub-process starts."""
    path = REALWORLD / "error_start_variables.bpmn"
    with pytest.raises(Exception, match="name 'code' is not defined"):
        plain(path, "import_first", {})
    assert list(validate_process([path]).problems) == []
    instance = run(path, {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"code": "BOOM", "text": "It went boom", "cleaned": "BOOM: It went boom"}
    assert path_of(instance.workflow)[-3:] == ["Cleanup", "Recovered", "RecoverBoom"]


# -- event sub-processes that a condition starts ---------------------------------------------------

CONDITIONAL_ESP = REALWORLD / "conditional_event_subprocess.bpmn"


def test_plain_spiffworkflow_never_starts_an_event_sub_process_on_a_condition() -> None:
    """SpiffWorkflow 3.2 connects an event sub-process with a conditional start to nothing: no event
    is ever thrown for it, so it never starts, even with its condition true from the outset."""
    wf = plain(CONDITIONAL_ESP, "order_review", {"items": [1, 2, 3, 4, 5, 6], "cancelled": True})
    assert "alert" not in path_of(wf) and "refund" not in path_of(wf)


@pytest.mark.parametrize("items, answer, expected, end", [
    (["a", "b"], {"cancelled": False}, {"shipped": True}, "done"),
    (["a"] * 6, {"cancelled": False}, {"alerted": 60, "shipped": True}, "done"),
    (["a"] * 6, {"cancelled": True}, {"alerted": 60, "refunded": True}, "cancelled_end"),
], ids=["low-risk", "high-risk-alerted", "cancelled-while-reviewed"])
def test_an_event_sub_process_starts_once_its_condition_holds(items: list[str], answer: dict[str, Any],
                                                              expected: dict[str, Any], end: str) -> None:
    """A conditional start event of an event sub-process fires once its condition holds, as BPMN
    (and Camunda) says: the risk alert as soon as the score is written, beside the review (it does
    not interrupt), the cancellation as the review's answer sets ``cancelled``, interrupting the
    process (nothing ships)."""
    assert list(validate_process([CONDITIONAL_ESP]).problems) == []
    instance = run(CONDITIONAL_ESP, {"items": items}, answers={"user_tasks": {"review": answer}})
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert {k: found[k] for k in found if k not in ("items", "risk", "cancelled")} == expected
    assert end in path_of(instance.workflow)
    if "refunded" in expected:
        assert "ship" not in path_of(instance.workflow)


def test_a_conditional_event_sub_process_started_before_a_save_is_not_started_again(tmp_path: Path) -> None:
    """The instance waits for the review after the alert ran, is saved, loaded by another engine and
    answered: the alert does not run again (its condition held all along), and the cancellation
    starts from the answer, interrupting the process."""
    store = f"sqlite:///{tmp_path / 'instances.db'}"
    first = Engine(store=store)
    waiting = first.run(first.start(load_process([CONDITIONAL_ESP]), {"items": ["a"] * 6}))
    assert waiting.status == "waiting" and variables(waiting.main)["alerted"] == 60
    second = Engine(store=store)
    done = second.resume(waiting.id, answers={"user_tasks": {"review": {"cancelled": True}}})
    assert done.status == "completed", done.error
    ran = path_of(done.workflow)
    assert ran.count("alert") == 1 and "refund" in ran and "ship" not in ran


def test_a_conditional_event_sub_process_inside_a_sub_process_starts_in_its_scope() -> None:
    """Inside a sub-process, the event sub-process starts once the sub-process's step wrote what its
    condition reads, beside the user task that waits (it does not interrupt)."""
    path = REALWORLD / "conditional_event_subprocess_nested.bpmn"
    assert list(validate_process([path]).problems) == []
    instance = run(path, {}, answers={"user_tasks": {"u": {}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"risk": 90, "alerted": True}
    ran = path_of(instance.workflow)
    assert ran.index("alert") < ran.index("u") and ran[-1] == "e"


# -- Flowable Design's export (flowable/flowable-examples) ----------------------------------------

FLOWABLE = REALWORLD / "flowable_design_export.bpmn"


def test_flowable_designs_own_extension_elements_are_no_settings_and_its_juel_timer_is_refused() -> None:
    """Flowable Design writes a design: element for every property of every element (stencil ids,
    colours, the timer's date again): they decide nothing and nothing is said of them. What is said:
    the initiator variable nothing sets, the mail task that runs by a handler here, and the timer's
    JUEL date (``${reservationTime}``), refused with the Python to write; plain SpiffWorkflow cannot
    load the mail task ("A Service Task must have an operator")."""
    found = sorted((p.code, p.severity, p.element_id, p.field or "") for p in validate_process([FLOWABLE]).problems)
    assert found == [
        ("foreign_extension", "warning", "emailtask1", ""),
        ("foreign_extension", "warning", "startnoneevent1", ""),
        ("no_implementation", "warning", "emailtask1", ""),
        ("timer_expression", "error", "intermediatetimereventcatching1", "timeDate")]
    [timer] = [p for p in validate_process([FLOWABLE]).problems if p.code == "timer_expression"]
    assert "write 'reservationTime'" in timer.message
    assert not any("design:" in p.message for p in validate_process([FLOWABLE]).problems)


def test_the_flowable_export_with_the_timer_written_as_python_runs_with_a_mail_handler(tmp_path: Path) -> None:
    """The timer's date written as validate says, and the mail task given a handler: the instance
    reserves, mails and waits until the date (past here), then completes."""
    changed = rewritten(tmp_path, FLOWABLE, [("<timeDate>${reservationTime}</timeDate>",
                                               "<timeDate>reservationTime</timeDate>")])
    assert [p.code for p in validate_process([changed]).problems if p.severity == "error"] == []
    sent: list[Any] = []
    engine = Engine(store="memory://", handlers={"emailtask1": lambda actx: sent.append(actx.get("customerEmail"))})
    instance = engine.run(engine.start(load_process([changed]), {
        "reservationTime": "2020-01-01T12:00:00Z", "customerEmail": "guest@example.org", "initiator": "ann"}))
    assert instance.status == "completed", instance.error
    assert sent == ["guest@example.org"] and variables(instance.main)["table"] == 7
    assert path_of(instance.workflow)[-3:] == ["endnoneevent1", "subprocess1", "endnoneevent2"]


# -- loops, completion conditions, terminate and escalation events that run as in SpiffWorkflow ---


@pytest.mark.parametrize("name, process_id, data, expected, answers", [
    ("standard_loop_condition.bpmn", "delivery_attempts", {"home_after": 2}, {"attempts": 2, "delivered": True}, None),
    ("standard_loop_condition.bpmn", "delivery_attempts", {"home_after": 9}, {"attempts": 3, "delivered": False},
     None),
    ("mi_completion_condition.bpmn", "first_good_offer", {"offers": [50, 120, 80, 200], "floor": 100},
     {"verdicts": [False, True]}, None),
    ("mi_completion_condition.bpmn", "first_good_offer", {"offers": [50, 60], "floor": 100},
     {"verdicts": [False, False]}, None),
    ("terminate_in_subprocess.bpmn", "checks_then_report", {}, {"auto": "passed", "report": "checks: passed"}, {}),
    ("escalation_non_interrupting.bpmn", "order_with_escalation", {"days": 5}, {"packed": True, "apology": "sent"},
     None),
    ("escalation_non_interrupting.bpmn", "order_with_escalation", {"days": 1}, {"packed": True}, None),
], ids=["loop-until-delivered", "loop-maximum", "mi-completes-early", "mi-runs-all", "terminate-ends-sub-process",
        "escalation-beside", "no-escalation"])
def test_shapes_that_run_as_in_plain_spiffworkflow(name: str, process_id: str, data: dict[str, Any],
                                                   expected: dict[str, Any], answers: dict[str, Any] | None) -> None:
    """A standard loop with a loopCondition and a loopMaximum (bpmn.io's loop marker), a sequential
    multi-instance task with a completionCondition (SpiffArena), a terminate end event inside a
    sub-process that cancels the person's task beside it and goes on after the sub-process
    (bpmn-js-token-simulation's terminate-nested-scopes), a non-interrupting escalation boundary
    event (Camunda's escalation example): validate says nothing, and layerflow ends with the
    variables and the path plain SpiffWorkflow ends with."""
    path = REALWORLD / name
    assert list(validate_process([path]).problems) == []
    wf = plain(path, process_id, data)
    assert wf.is_completed()
    instance = run(path, data, answers={"user_tasks": answers} if answers is not None else None)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {**data, **expected} == dict(wf.last_task.data)
    assert path_of(instance.workflow) == path_of(wf)


# -- jBPM's on-entry and on-exit scripts and work items --------------------------------------------

JBPM = REALWORLD / "jbpm_entry_exit_scripts.bpmn2"


def test_jbpms_entry_and_exit_scripts_are_refused_where_what_they_set_is_read() -> None:
    """jBPM runs a task's drools:onEntry-script as the task starts and its onExit-script as it ends,
    as SpiffWorkflow runs a preScript and a postScript; they are Java (or MVEL), and neither
    SpiffWorkflow nor layerflow runs them: validate said nothing, and the run stopped later on
    "name 'subject' is not defined". The entry script sets ``subject``, which a script reads: an
    error at its line, with the Python to write as the task's spiffworkflow:preScript; the exit
    script sets nothing: a warning. The work item task (drools:taskName="Email", run by jBPM's work
    item handler) is a plain task here, which waits for a person: a warning naming it and what to do."""
    with pytest.raises(Exception, match="name 'subject' is not defined"):
        run_plain(JBPM, {"employee": "ann"}, {"review": {}, "notify": {}})
    found = {(p.code, p.field): p for p in validate_process([JBPM]).problems}
    assert set(found) == {("jbpm_script_not_run", "drools:onEntry-script"), ("jbpm_script_not_run", "drools:onExit-script"),
                          ("foreign_extension", "drools:taskName")}
    entry = found[("jbpm_script_not_run", "drools:onEntry-script")]
    text = JBPM.read_text().splitlines()
    assert (entry.severity, entry.element_id, entry.file, entry.line) == (
        "error", "review", str(JBPM), next(i for i, t in enumerate(text, 1) if "<drools:onEntry-script" in t))
    assert "it sets 'subject', which the files read" in entry.message
    assert "write it in Python as a spiffworkflow:preScript of 'review' (subject = ...)" in entry.message
    leave = found[("jbpm_script_not_run", "drools:onExit-script")]
    assert leave.severity == "warning" and "spiffworkflow:postScript of 'review'" in leave.message
    item = found[("foreign_extension", "drools:taskName")]
    assert item.severity == "warning" and item.element_id == "notify"
    assert "work item 'Email'" in item.message and "waits for a person" in item.message
    assert "handler: file.py:function" in item.message


def test_the_jbpm_entry_script_written_as_a_prescript_runs(tmp_path: Path) -> None:
    """Written as validate says, the entry script runs before the person's task; the work item given
    a handler runs without a person."""
    changed = rewritten(tmp_path, JBPM, [
        ('<drools:onEntry-script scriptFormat="http://www.java.com/java">\n'
         '          <drools:script><![CDATA[kcontext.setVariable("subject", "Evaluation of " + employee);]]></drools:script>\n'
         '        </drools:onEntry-script>',
         '<spiffworkflow:preScript>subject = "Evaluation of " + employee</spiffworkflow:preScript>'),
        ('xmlns:drools=', 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" xmlns:drools=')])
    assert [p.code for p in validate_process([changed]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://", handlers={"notify": lambda actx: {"mailed": True}})
    instance = engine.run(engine.start(load_process([changed]), {"employee": "ann"}),
                          answers={"user_tasks": {"review": {"score": 4}}})
    assert instance.status == "completed", instance.error
    assert {k: v for k, v in variables(instance.main).items() if k != "employee"} == {
        "subject": "Evaluation of ann", "score": 4, "mailed": True, "logged": "Evaluation of ann"}


@pytest.mark.parametrize("definition, status", [
    ('errorRef="Error_Declined" flowable:errorVariableName="failureCode"', "completed"),
    ('flowable:errorVariableName="failureCode" flowable:errorVariableLocalScope="true"', "refused"),
], ids=["names-its-error", "catch-all"])
def test_flowables_error_variable_name_is_the_caught_code(tmp_path: Path, definition: str, status: str) -> None:
    """Flowable's ``flowable:errorVariableName`` on an error boundary event names the variable Flowable
    sets to the caught error's code: set as the event catches when it names its error; a catch-all
    (as Flowable's own examples draw it) is refused where the variable is read."""
    changed = rewritten(tmp_path, CAUGHT, [
        ('errorRef="Error_Declined" camunda:errorCodeVariable="failureCode" camunda:errorMessageVariable="failureText"',
         definition),
        ('notice = failureCode + ": " + failureText', 'notice = "declined: " + failureCode'),
        ('xmlns:camunda=', 'xmlns:flowable="http://flowable.org/bpmn" xmlns:camunda=')])
    found = found_for(changed, "caught_variable_not_set")
    if status == "refused":
        [problem] = found
        assert (problem.severity, problem.element_id, problem.field) == (
            "error", "payment_failed", "flowable:errorVariableName")
        assert "flowable:errorVariableName='failureCode'" in problem.message
        return
    assert found == []
    instance = run(changed, {"amount": 900, "credit": 800})
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["notice"] == "declined: DECLINED"


def test_layerflow_run_json_starts_the_conditional_event_sub_processes(tmp_path: Path) -> None:
    """``layerflow run --json`` with the start data and the review's answer: completed, the alert and
    the refund ran in their event sub-processes, nothing shipped."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"review": {"cancelled": True}}}))
    result = CliRunner().invoke(main, ["run", str(CONDITIONAL_ESP), "--store", "memory://", "--json",
                                       "--data", json.dumps({"items": ["a"] * 6}), "--answers", str(answers)])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["status"] == "completed" and doc["error"] is None
    ran = result.stderr
    assert "activity alert" in ran and "activity refund" in ran and "activity ship" not in ran
