"""Shapes met in public BPMN files, round 10: the processes of SpiffWorkflow's example application
(sartography/spiff-example-cli's tutorial): a transaction left through a cancel end event and its
cancel boundary event, a Camunda form whose default is written as a Python string literal, a process
that a timer starts, two parallel branches that end each other by signal boundary events with no
outgoing flow and terminate end events, a sub-process with a multi-instance user task over a data
input, an error end event and a non-interrupting escalation while a timer retries, and a call
activity looped by standardLoopCharacteristics with a preScript and a postScript that deletes
variables, and a message to a second pool whose payload (on the bpmn:message) calls the datetime
module that the tutorial's script engine supplied; then Camunda 8's FEEL timeDate off the clock
(``=now() + duration("PT1H")``, ``=today() + ...``) and BPMN's receive task with instantiate="true"
as a process's only start. Each is redrawn small in ``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run
a shape, a case runs it there too and the outcome must agree."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.cli import main
from engine.runtime import ANSWER_ROUNDS
from engine.validate import validate_process

from engine_helpers import ROOT, path_of, run_plain, variables
from test_realworld_4 import rewritten

REALWORLD = Path(__file__).resolve().parent / "realworld"


def errors(path: Path, process_id: str | None = None) -> list[Any]:
    return [p for p in validate_process([path], process_id=process_id).problems if p.severity == "error"]


def run(path: Path, data: dict[str, Any], answers: dict[str, Any] | None = None) -> Any:
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process([path]), data), answers=answers)


# -- spiff-example-cli's transaction --------------------------------------------------------------

TRANSACTION = REALWORLD / "spiff_tutorial_transaction.bpmn"
ORDER = {"product_quantity": 2, "product_price": 5, "shipping_cost": 3}
REVIEW, FEEDBACK = "Activity_0h1938t", "Activity_1ncg4ro"


def test_a_form_default_written_as_a_python_string_is_refused_with_the_text_to_write() -> None:
    """The tutorial's review form gives place_order the default ``'N'``, quotes included, as a Python
    literal. A Camunda form takes defaultValue as text, so a person who left the field alone set
    place_order to the three characters "'N'": this one still reached the cancel path, but a
    condition ``place_order == 'N'`` would have been false, silently. validate refused nothing; it
    names the field now, with the default to write."""
    [problem] = errors(TRANSACTION)
    assert (problem.code, problem.element_id, problem.field) == ("invalid_form", REVIEW, "place_order")
    for said in ('"\'N\'"', "quotes", 'defaultValue="N"'):
        assert said in problem.message, problem.message
    result = CliRunner().invoke(main, ["validate", str(TRANSACTION)])
    assert result.exit_code == 2 and 'defaultValue="N"' in result.output, result.output


@pytest.mark.parametrize("quoted, told", [("&quot;N&quot;", 'defaultValue="N"'), ("&#39;&#39;", 'defaultValue=""')])
def test_a_default_in_double_quotes_or_an_empty_python_string_is_refused_too(tmp_path: Path, quoted: str,
                                                                             told: str) -> None:
    changed = rewritten(tmp_path, TRANSACTION, [('defaultValue="&#39;N&#39;"', f'defaultValue="{quoted}"')])
    [problem] = errors(changed)
    assert problem.field == "place_order" and told in problem.message, problem.message


def test_a_flowable_form_property_default_in_quotes_is_refused_with_its_own_attribute(tmp_path: Path) -> None:
    changed = rewritten(tmp_path, TRANSACTION, [
        ('xmlns:camunda="http://camunda.org/schema/1.0/bpmn"',
         'xmlns:camunda="http://camunda.org/schema/1.0/bpmn" xmlns:flowable="http://flowable.org/bpmn"'),
        ('<camunda:formData>\n            <camunda:formField id="place_order" label="Place Order" type="string" '
         'defaultValue="&#39;N&#39;" />\n          </camunda:formData>',
         '<flowable:formProperty id="place_order" name="Place Order" type="string" default="&#39;N&#39;" />')])
    [problem] = errors(changed)
    assert (problem.element_id, problem.field) == (REVIEW, "place_order")
    assert 'write default="N"' in problem.message and "defaultValue" not in problem.message, problem.message


@pytest.mark.parametrize("default", ["N", "O'Brien", "'N", "it's 'fine'"])
def test_a_default_that_only_holds_quotes_is_no_problem(tmp_path: Path, default: str) -> None:
    changed = rewritten(tmp_path, TRANSACTION, [("&#39;N&#39;", default.replace("'", "&#39;"))])
    assert errors(changed) == []


@pytest.mark.parametrize("review, feedback, end", [
    ({"place_order": "Y"}, None, "Event_136gk7h"),
    ({"place_order": "N"}, {"reason_cancelled": "too dear"}, "Event_1ailogh"),
])
def test_the_transaction_runs_as_in_plain_spiffworkflow(tmp_path: Path, review: dict[str, Any],
                                                       feedback: dict[str, Any] | None, end: str) -> None:
    """Placing the order leaves the transaction by its end event and charges the customer; not
    placing it ends the transaction at its cancel end event, which the cancel boundary event catches,
    and the customer is asked why. The path is plain SpiffWorkflow's, and so are the variables, but
    for what the cancelled transaction wrote: plain SpiffWorkflow drops a sub-process's data when a
    boundary event cancels it, and layerflow's boundary path reads it (as the README says: as after
    an error end event)."""
    fixed = rewritten(tmp_path, TRANSACTION, [("&#39;N&#39;", "N")])
    assert errors(fixed) == []
    people = {REVIEW: review, **({FEEDBACK: feedback} if feedback else {})}
    wf, plain_data = run_plain(fixed, ORDER, people)
    instance = run(fixed, ORDER, {"user_tasks": people})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf) and path_of(wf)[-1] == end
    written_inside = {"order_total": 13, **review}
    if feedback:
        assert variables(instance.main) == {**plain_data, **written_inside}
        assert not set(written_inside) & set(plain_data)
    else:
        assert variables(instance.main) == plain_data == {**ORDER, **written_inside, "charged": 13}


def test_the_default_written_as_validate_said_is_the_answer_a_person_leaves_alone(tmp_path: Path) -> None:
    """With defaultValue="N", a review that leaves place_order alone cancels the order, as a review
    answering "N" does in plain SpiffWorkflow, and the customer is asked why."""
    fixed = rewritten(tmp_path, TRANSACTION, [("&#39;N&#39;", "N")])
    waiting = run(fixed, ORDER, {"user_tasks": {REVIEW: {}}})
    assert waiting.status == "waiting"
    assert [w["task_id"] for w in waiting.waiting_for] == [FEEDBACK]
    people = {REVIEW: {}, FEEDBACK: {"reason_cancelled": "changed my mind"}}
    done = run(fixed, ORDER, {"user_tasks": people})
    wf, plain_data = run_plain(fixed, ORDER, {**people, REVIEW: {"place_order": "N"}})
    assert done.status == "completed", done.error
    assert variables(done.main) == {**plain_data, "order_total": 13, "place_order": "N"}
    assert plain_data == {**ORDER, "reason_cancelled": "changed my mind"}
    assert path_of(done.workflow) == path_of(wf)


# -- spiff-example-cli's timer start --------------------------------------------------------------

TIMER_START = REALWORLD / "spiff_tutorial_timer_start.bpmn"


def test_a_process_a_timer_starts_waits_for_it_as_in_plain_spiffworkflow(tmp_path: Path) -> None:
    """The start event is a one-day timer: layerflow's instance waits for it, due a day from its
    start, as plain SpiffWorkflow's waits at the start event; validate only warns of the flow the
    modeler left with no source. Once the timer has fired (here written "PT0S") the none task waits
    for a person, and completes as in plain SpiffWorkflow."""
    assert errors(TIMER_START) == []
    warned = [(p.code, p.element_id, p.field) for p in validate_process([TIMER_START]).problems]
    assert warned == [("flow_ref_unknown", "Flow_032rj36", "sourceRef"), ("bpmn_schema", None, None)], warned
    before = datetime.now(timezone.utc)
    waiting = run(TIMER_START, {})
    assert waiting.status == "waiting" and path_of(waiting.workflow) == []
    [timer] = waiting.waiting_for
    assert (timer["kind"], timer["task_id"]) == ("timer", "Start_Event")
    due = datetime.fromisoformat(timer["due"])
    assert before + timedelta(days=1) <= due <= datetime.now(timezone.utc) + timedelta(days=1)
    now = rewritten(tmp_path, TIMER_START, [('"P1D"', '"PT0S"')])
    at_task = run(now, {})
    assert [w["task_id"] for w in at_task.waiting_for] == ["any_task"]
    done = run(now, {}, {"user_tasks": {"any_task": {"pressed": True}}})
    wf, plain_data = run_plain(now, {}, {"any_task": {"pressed": True}})
    assert done.status == "completed", done.error
    assert variables(done.main) == plain_data == {"pressed": True}
    assert path_of(done.workflow) == path_of(wf)


# -- spiff-example-cli's race between two branches, settled by signals ----------------------------

RACE = REALWORLD / "spiff_tutorial_signal_race.bpmn"
PAYMENT, CANCEL, CHARGE, ASK = "Activity_0t2klx8", "Activity_1f7q7oz", "Activity_1p0c9z2", "Activity_1ncg4ro"


def plain_in_order(path: Path, process_id: str, steps: list[tuple[str, dict[str, Any]]],
                   data: dict[str, Any] | None = None) -> Any:
    """Plain SpiffWorkflow, a person completing the given tasks in the given order (the first ready
    instance of a task that has several)."""
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(process_id), parser.get_subprocess_specs(process_id))
    wf.task_tree.data.update(data or {})
    wf.do_engine_steps()
    for task_id, answer in steps:
        task = next(t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.task_spec.bpmn_id == task_id)
        task.data.update(answer)
        task.run()
        wf.do_engine_steps()
        wf.refresh_timers()  # a zero-length timer fires
        wf.do_engine_steps()
    return wf


@pytest.mark.parametrize("steps, end", [
    ([(CHARGE, {"customer_charged": "Y"})], "Event_136gk7h"),
    ([(CHARGE, {"customer_charged": "N"})], "Event_10yrr8z"),
    ([(CANCEL, {}), (ASK, {"reason": "found it cheaper"})], "Event_1ailogh"),
], ids=["charged", "charge-failed", "cancelled-first"])
def test_two_branches_that_cancel_each_other_by_signals_run_as_in_plain_spiffworkflow(
        steps: list[tuple[str, dict[str, Any]]], end: str) -> None:
    """Whichever branch a person finishes first throws its signal, and the other branch's task is
    ended by its signal boundary event (which has no outgoing flow); a terminate end event ends
    what is left. Both branches wait for a person at once, each with its signal boundary event;
    the path is plain SpiffWorkflow's, and so are the variables, with the card_number data object
    in the context (plain SpiffWorkflow keeps it apart, in the workflow's data objects)."""
    assert errors(RACE) == []
    steps = [(PAYMENT, {"card_number": "4111"}), *steps]
    wf = plain_in_order(RACE, "order_product", steps)
    assert wf.is_completed() and path_of(wf)[-1] == end
    engine = Engine(store="memory://")
    instance = engine.start(load_process([RACE]), {})
    for n, (task_id, answer) in enumerate(steps):
        instance = engine.run(instance, answers={"user_tasks": {task_id: answer}})
        if n == 0:
            assert sorted(w["task_id"] for w in instance.waiting_for) == sorted(
                [CANCEL, CHARGE, "Event_1yahe0s", "Event_0wdh5sd"])
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == {**dict(wf.last_task.data), **wf.data_objects}
    assert wf.data_objects == {"card_number": "4111"}


# -- spiff-example-cli's fulfilment sub-process -----------------------------------------------------

FULFILLMENT = REALWORLD / "spiff_tutorial_fulfillment.bpmn"
RETRIEVE, SHIP = "Activity_1f76alf", "Activity_1f2e8xi"
PRODUCTS = [{"product_name": "mug"}, {"product_name": "cap"}]


def answered_one_at_a_time(path: Path, data: dict[str, Any], steps: list[tuple[str, dict[str, Any]]]) -> Any:
    """A layerflow instance whose people answer one waiting item at a time, the first of each task."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), data))
    for task_id, answer in steps:
        first = next(w["id"] for w in instance.waiting_for if w["task_id"] == task_id)
        instance = engine.run(instance, answers={"user_tasks": {first: answer}})
    return instance


@pytest.mark.parametrize("availability, shipped, end", [
    (["Y", "Y"], ["Y"], "Event_136gk7h"),
    (["Y", "N"], [], "Event_10yrr8z"),
    (["Y", "Y"], ["N", "Y"], "Event_136gk7h"),
], ids=["shipped", "unavailable", "shipped-on-second-try"])
def test_the_fulfilment_sub_process_runs_as_in_plain_spiffworkflow(availability: list[str], shipped: list[str],
                                                                  end: str) -> None:
    """A person answers each product of the multi-instance user task (loopDataInputRef products,
    outputDataItem product_available, collected into availability); an unavailable product ends the
    sub-process at an error end event that its error boundary event catches; a product not shipped
    throws an escalation that the non-interrupting boundary event catches while the sub-process
    waits on its timer and asks again. The path is plain SpiffWorkflow's, and so are the variables,
    but for what the sub-process wrote before its error: the boundary path reads it under layerflow
    (as the README says), and plain SpiffWorkflow drops it."""
    assert errors(FULFILLMENT) == []
    steps = [(RETRIEVE, {"product_available": a}) for a in availability] + [
        (SHIP, {"product_shipped": s}) for s in shipped]
    wf = plain_in_order(FULFILLMENT, "fulfill_order", steps, {"products": PRODUCTS})
    assert wf.is_completed() and path_of(wf)[-1] == end
    instance = answered_one_at_a_time(FULFILLMENT, {"products": PRODUCTS}, steps)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main)["availability"] == availability
    assert variables(instance.main) == {**dict(wf.last_task.data), "availability": availability}
    assert ("availability" in wf.last_task.data) is (end != "Event_10yrr8z")


# -- spiff-example-cli's shopping loop: a call activity with a standard loop ------------------------

SHOPPING = REALWORLD / "spiff_tutorial_shopping_loop.bpmn"
SELECT = "Activity_select"


def test_a_looped_call_activity_with_pre_and_post_scripts_runs_as_in_plain_spiffworkflow() -> None:
    """The preScript starts the list once, each call asks for a product and appends it, the postScript
    deletes the called process's per-product variables with ``del``, and the loop goes on while its
    condition holds (SpiffWorkflow's reading of loopCondition). Answered one round at a time, the
    path and the variables are plain SpiffWorkflow's."""
    assert errors(SHOPPING, "order_product") == []
    steps = [(SELECT, {"product_name": "mug", "product_quantity": 2, "continue_shopping": "N"}),
             (SELECT, {"product_name": "cap", "product_quantity": 1, "continue_shopping": "Y"})]
    wf = plain_in_order(SHOPPING, "order_product", steps)
    assert wf.is_completed()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([SHOPPING], process_id="order_product"), {}))
    for task_id, answer in steps:
        [item] = [w["id"] for w in instance.waiting_for if w["task_id"] == task_id]
        instance = engine.run(instance, answers={"user_tasks": {item: answer}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(wf)
    assert variables(instance.main) == dict(wf.last_task.data) == {
        "products": [{"product_name": "mug", "product_quantity": 2, "product_price": 5},
                     {"product_name": "cap", "product_quantity": 1, "product_price": 12}],
        "continue_shopping": "Y", "order_total": 22}


def test_an_answer_that_keeps_a_standard_loop_going_leaves_it_waiting_after_the_rounds_allowed(tmp_path: Path) -> None:
    """An answers file answers a step each time the process comes back to it; an answer that keeps
    the loop going (continue_shopping 'N') keeps it going for ever. A gateway's loop stops taking the
    answer after ANSWER_ROUNDS rounds and waits for a person; a standard loop's did not (each
    iteration counted as a step of its own, so every round was the first one), and ``layerflow
    run`` never returned, its list growing without end. It waits now too, saying why."""
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {SELECT: {"product_name": "mug", "product_quantity": 2,
                                                           "continue_shopping": "N"}}}))
    done = subprocess.run([sys.executable, "-m", "engine.cli", "run", str(SHOPPING), "--process", "order_product",
                           "--json", "--store", "memory://", "--answers", str(answers)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, stdin=subprocess.DEVNULL,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    document = json.loads(done.stdout)
    assert (done.returncode, document["status"]) == (3, "waiting"), done.stderr
    assert [w["task_id"] for w in document["waiting_for"]] == [SELECT]
    assert len(document["layers"]["L3"]["products"]) == ANSWER_ROUNDS
    assert f"'{SELECT}'" in done.stderr and f"{ANSWER_ROUNDS} times" in done.stderr, done.stderr


# -- spiff-example-cli's message to the QA pool ------------------------------------------------------

PAYLOAD = REALWORLD / "spiff_tutorial_message_payload.bpmn"


def test_a_message_payload_calling_a_module_nothing_imports_is_named_before_the_run() -> None:
    """The tutorial's payload calls ``datetime.datetime.utcnow()``: its own script engine gave scripts
    the datetime module; SpiffWorkflow 3.2's, and layerflow's, give none. validate said the
    collaboration was valid, and the run stopped at the throw with a NameError. validate warns now,
    at the message, naming the module and what to do."""
    warned = [p for p in validate_process([PAYLOAD]).problems if p.code == "condition_unknown_function"]
    assert [(p.element_id, p.field, p.severity) for p in warned] == [
        ("Message_1ngt47u", "messagePayload", "warning")]
    for said in ("datetime", "import datetime", "script task"):
        assert said in warned[0].message, warned[0].message
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([PAYLOAD]), {}),
                          answers={"user_tasks": {"Activity_19sdt5q": {"reason_delayed": "strike"}}})
    assert instance.status == "error" and instance.error["task_id"] == "Event_1vajwed"
    assert "datetime" in instance.error["message"]


def test_a_message_payload_that_is_not_python_is_refused_naming_the_message(tmp_path: Path) -> None:
    """A payload is a Python expression SpiffWorkflow evaluates as the message goes out; validate
    never read it, so a slip in it passed and stopped the run at the throw."""
    changed = rewritten(tmp_path, PAYLOAD, [("datetime.datetime.utcnow().timestamp()\n}", "\n}}")])
    [problem] = errors(changed)
    assert (problem.code, problem.element_id, problem.field) == ("condition_syntax", "Message_1ngt47u",
                                                                 "messagePayload")


def test_the_payload_computed_in_a_script_runs_the_qa_pool(tmp_path: Path) -> None:
    """With the time taken in a script before the throw (where ``import datetime`` works), the QA
    pool's process starts with the payload in order_info."""
    changed = rewritten(tmp_path, PAYLOAD, [
        ("datetime.datetime.utcnow().timestamp()", "noticed_at"),
        ('<bpmn:sequenceFlow id="Flow_1dg8d2v" sourceRef="Activity_19sdt5q" targetRef="Event_1vajwed" />',
         '<bpmn:sequenceFlow id="Flow_1dg8d2v" sourceRef="Activity_19sdt5q" targetRef="Activity_stamp" />'
         '<bpmn:scriptTask id="Activity_stamp"><bpmn:script>import datetime\n'
         'noticed_at = datetime.datetime(2026, 1, 31, tzinfo=datetime.timezone.utc).timestamp()\ndel datetime</bpmn:script></bpmn:scriptTask>'
         '<bpmn:sequenceFlow id="Flow_stamp" sourceRef="Activity_stamp" targetRef="Event_1vajwed" />')])
    # The tutorial keeps the payload on the bpmn:message, which SpiffWorkflow 3.2 reads but deprecates.
    assert [p.code for p in validate_process([changed]).problems] == ["message_extension_deprecated"]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([changed]), {}),
                          answers={"user_tasks": {"Activity_19sdt5q": {"reason_delayed": "strike"}}})
    assert instance.status == "completed", instance.error
    [qa] = [ctx for name, ctx in instance.contexts.items() if "qa_process" in name]
    assert variables(qa)["order_info"] == {"reason_delayed": "strike", "timestamp": 1769817600.0}
    assert variables(qa)["analysed"] == "strike"


@pytest.mark.parametrize("script, warned", [
    ("ts = datetime.datetime.utcnow().timestamp()", True),
    ("n = math.floor(total)", True),
    ("import datetime\nts = datetime.datetime.utcnow().timestamp()", False),
    ("from datetime import datetime\nts = datetime.utcnow().timestamp()", False),
    ("first = calendar.get('first')", False),  # a context value named like a module, read as a dict
    ("tokens = string.split(',')", False),
])
def test_only_a_call_of_a_modules_own_function_that_nothing_imports_is_warned_of(tmp_path: Path, script: str,
                                                                                warned: bool) -> None:
    changed = rewritten(tmp_path, PAYLOAD, [("analysed = order_info['reason_delayed']",
                                             script.replace("'", "&#39;"))])
    found = [p for p in validate_process([changed]).problems if p.element_id == "Activity_1b9i014"]
    assert bool(found) is warned, found
    if warned:
        assert found[0].code == "script_unknown_function" and "add 'import " in found[0].message, found[0].message


# -- Camunda 8's timeDate off the clock ------------------------------------------------------------

FEEL_NOW = REALWORLD / "zeebe_feel_now_timer.bpmn"
FEEL_NOW_DATE = '<bpmn:timeDate xsi:type="bpmn:tFormalExpression">=now() + duration("PT1H")</bpmn:timeDate>'


def timer_problem(path: Path) -> Any:
    [problem] = errors(path)
    assert (problem.code, problem.element_id, problem.field) == ("timer_expression", "wait", "timeDate"), problem
    return problem


def waiting_timer(tmp_path: Path, path: Path) -> datetime:
    """The due time of the one timer ``layerflow run`` leaves the process waiting on."""
    result = CliRunner().invoke(main, ["run", "--json", "--store", f"sqlite:///{tmp_path / 'runs.db'}", str(path)])
    assert result.exit_code == 3, result.output  # waiting
    [waiting] = json.loads(result.stdout)["waiting_for"]
    assert (waiting["kind"], waiting["task_id"]) == ("timer", "wait"), waiting
    return datetime.fromisoformat(waiting["due"])


def test_a_feel_time_date_an_hour_from_now_is_told_as_a_duration_that_waits_an_hour(tmp_path: Path) -> None:
    """Camunda 8 writes "an hour after the timer starts" as the timeDate ``=now() + duration("PT1H")``.
    validate told to write ``now() + "PT1H"``: no function now() is here, the run stopped on a
    NameError. now() plus a duration is that duration: the timeDuration it tells to write waits an
    hour (on the engine's clock)."""
    problem = timer_problem(FEEL_NOW)
    assert "now() + \"PT1H\"" not in problem.message, problem.message
    told = problem.message.split("timeDuration, ", 1)[1].split("</bpmn:timeDuration>", 1)[0] + "</bpmn:timeDuration>"
    assert told == '<bpmn:timeDuration xsi:type="bpmn:tFormalExpression">"PT1H"</bpmn:timeDuration>', problem.message
    changed = rewritten(tmp_path, FEEL_NOW, [(FEEL_NOW_DATE, told)])
    assert errors(changed) == []
    before = datetime.now(timezone.utc)
    due = waiting_timer(tmp_path, changed)
    assert before + timedelta(minutes=59) < due < datetime.now(timezone.utc) + timedelta(minutes=61), due


@pytest.mark.parametrize("feel, duration", [('=now() + duration("P1D")', '"P1D"'), ("=now()", '"PT0S"'),
                                            ('=now() + duration("PT" + string(hours) + "H")', '"PT" + str(hours) + "H"')])
def test_other_feel_time_dates_from_now_are_told_as_their_duration(tmp_path: Path, feel: str, duration: str) -> None:
    problem = timer_problem(rewritten(tmp_path, FEEL_NOW, [('=now() + duration("PT1H")', feel)]))
    assert f'<bpmn:timeDuration xsi:type="bpmn:tFormalExpression">{duration}</bpmn:timeDuration>' in problem.message, \
        problem.message


@pytest.mark.parametrize("feel, days", [("=today()", 0), ('=today() + duration("P1D")', 1),
                                        ('=today() + duration("P2W")', 14)])
def test_a_feel_time_date_from_today_is_told_as_python_that_waits_for_that_day(tmp_path: Path, feel: str,
                                                                               days: int) -> None:
    """``=today() + duration("P1D")``: midnight of tomorrow. validate told to write ``today() + "P1D"``,
    a call of a function that is not here; the Python it tells now runs and waits for that day."""
    problem = timer_problem(rewritten(tmp_path, FEEL_NOW, [('=now() + duration("PT1H")', feel)]))
    told = problem.message.split("write ", 1)[1].split(" (midnight", 1)[0]
    assert told.startswith("'") and told.endswith("'") and not told.startswith("'today()"), problem.message
    expression = told[1:-1]
    changed = rewritten(tmp_path, FEEL_NOW, [('=now() + duration("PT1H")', expression.replace('"', "&quot;"))])
    assert errors(changed) == []
    if days == 0:  # midnight of today has passed: the timer fires at once, as Camunda's does
        result = CliRunner().invoke(main, ["run", "--json", "--store", f"sqlite:///{tmp_path / 'r.db'}", str(changed)])
        assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "completed", result.output
        return
    day = datetime.now().date() + timedelta(days=days)
    due = waiting_timer(tmp_path, changed)
    assert due == datetime.combine(day, datetime.min.time()).astimezone(timezone.utc), due


# -- BPMN's instantiating receive task -------------------------------------------------------------

INSTANTIATING = REALWORLD / "bpmn_instantiating_receive_task.bpmn"
RECEIVE_TASK = ('<bpmn:receiveTask id="receive_order" name="Receive order" messageRef="order_placed" '
                'instantiate="true" />')


def test_an_instantiating_receive_task_is_told_as_the_message_start_event_to_write(tmp_path: Path) -> None:
    """A process started by a receive task with instantiate="true" (no start event): SpiffWorkflow
    ignores instantiate and refuses the process ("No start event found"); validate said only to draw
    a start event before the receive task, which then waits for a message the process was to start
    on. It names the receive task and the message start event to write in its place, which runs."""
    with pytest.raises(Exception, match="No start event found"):
        parser = SpiffBpmnParser()
        parser.add_bpmn_file(str(INSTANTIATING))
        BpmnWorkflow(parser.get_spec("order_intake"))
    [problem] = errors(INSTANTIATING)
    assert (problem.code, problem.element_id) == ("no_start_event", "receive_order"), problem
    told = problem.message.split("in place of the receive task, ", 1)[1].split(", and keep", 1)[0]
    assert told == ('<bpmn:startEvent id="receive_order"><bpmn:messageEventDefinition messageRef="order_placed" />'
                    '</bpmn:startEvent>'), problem.message
    assert "instantiate" in problem.message, problem.message
    changed = rewritten(tmp_path, INSTANTIATING, [(RECEIVE_TASK, told)])
    assert errors(changed) == []
    store = f"sqlite:///{tmp_path / 'runs.db'}"
    result = CliRunner().invoke(main, ["run", "--json", "--store", store, str(changed)])
    assert result.exit_code == 3, result.output
    out = json.loads(result.stdout)
    assert [(w["task_id"], w["event"]) for w in out["waiting_for"]] == [("receive_order", "order_placed")], out
    sent = CliRunner().invoke(main, ["send", "--json", "--store", store, out["instance_id"], "order_placed",
                                     "--json-payload", '{"order": 7}'])
    assert sent.exit_code == 0, sent.output
    assert json.loads(sent.stdout)["status"] == "completed", sent.output
