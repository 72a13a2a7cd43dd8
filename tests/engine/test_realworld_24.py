"""Public models, round 24, each in ``tests/engine/realworld24/`` (the file's header comment names its
source; ``realworld24/SOURCES.md`` lists repositories, paths, commits and licences): Operaton's (Camunda 7's
Apache-2.0 fork's) engine test models of cycle timers (an ISO 8601 cycle on a boundary and a start event, a
cron cycle on a non-interrupting event sub-process), a conditional start event, compensation (a
compensation event sub-process, a compensated multi-instance sub-process) and a transaction cancelled
beside compensation handlers. Each is validated as given (validate says what is wrong, naming the element
and what to write), then, edited as validate says, run, and its path and data are checked against what
BPMN says."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, path_of, run_json, variables
from test_realworld_4 import rewritten
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld24"
cli = cli_in_a_tmp_store  # the fixture "cli", here too


def errors(path: Path) -> list[tuple[str, str | None]]:
    return [(p.code, p.element_id) for p in validate_process([path]).problems if p.severity == "error"]


class Clock:
    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def __call__(self) -> float:
        return self.now


def engine_with(handlers: dict[str, Any], clock: Clock | None = None) -> Engine:
    engine = Engine(store="memory://", clock=clock) if clock else Engine(store="memory://")
    for task_id, handler in handlers.items():
        engine.handlers.register(task_id, handler)
    return engine


def started_on_a_clock(tmp_path: Path, source: Path, cycle: str) -> tuple[Engine, Clock, Any]:
    """``source`` with its bare timeCycle ``cycle`` quoted (as validate says), started and run on a clock
    of the test's own."""
    fixed = rewritten(tmp_path, source, [(f"<timeCycle>{cycle}</timeCycle>", f'<timeCycle>"{cycle}"</timeCycle>')])
    assert errors(fixed) == []
    clock = Clock()
    engine = engine_with({}, clock)
    return engine, clock, engine.run(engine.start(load_process([fixed]), {}))


def waits(instance: Any) -> list[str]:
    return sorted(w["task_id"] for w in instance.waiting_for)


# -- Operaton: a transaction cancelled beside compensation handlers and conditional events ---------

TRANSACTION = HERE / "operaton_transaction_compensation_conditionals.bpmn"


def test_a_service_task_whose_expression_is_a_literal_is_not_said_to_name_a_java_bean() -> None:
    """operaton:expression="${true}" evaluates the literal true and does nothing else: the step does no
    work in the other engine. validate said it named 'true', "a Java bean of the other engine's
    application that does the step's work", and asked for that work in Python: there is none."""
    warning = said(TRANSACTION)["Task_1alr7zc"]
    assert "Java bean" not in warning and "naming 'true'" not in warning
    assert "operaton:expression='${true}' is a JUEL literal (true): the other engine evaluates it and " \
           "does nothing else, so the step does no work there" in warning
    assert "make it a bpmn:scriptTask whose script is `pass` (a bpmn:task waits for a person)" in warning


# -- Operaton: a cron cycle on a non-interrupting timer event sub-process --------------------------

CRON = HERE / "operaton_cron_cycle_event_subprocess.bpmn"


def test_a_cron_cycle_of_every_few_minutes_is_refused_with_the_iso_cycle_it_is() -> None:
    """validate said SpiffWorkflow has no cron and gave two unrelated examples ("R/PT1H", a daily
    cycle): the reader had to work out that '0 0/5 * * * ?' (Quartz: second 0 of every fifth minute)
    is a cycle of five minutes. It names the cycle to write."""
    [problem] = validate_process([CRON]).problems
    assert (problem.code, problem.element_id, problem.field) == ("timer_expression", "subprocessStartEvent",
                                                                 "timeCycle")
    text = str(problem)
    assert "'0 0/5 * * * ?' is a cron expression" in text
    assert 'it fires every 5 minutes: write "R/PT5M" (with the quotes)' in text
    assert "counted from when the timer starts, not from the clock's whole minutes" in text


def test_the_event_sub_process_edited_as_said_runs_once_per_period_beside_the_main_task(tmp_path: Path) -> None:
    cron = CRON.read_text().replace("<timeCycle>0 0/5 * * * ?</timeCycle>", "<timeCycle>R/PT5M</timeCycle>")
    (tmp_path / "given").mkdir()
    (tmp_path / "given" / CRON.name).write_text(cron)
    engine, clock, instance = started_on_a_clock(tmp_path, tmp_path / "given" / CRON.name, "R/PT5M")
    assert waits(instance) == ["subprocessStartEvent", "userTask"]
    clock.now += 5 * 60
    instance = engine.resume(instance)
    assert waits(instance) == ["subprocessStartEvent", "userTask", "userTask2"]
    instance = engine.run(instance, answers={"user_tasks": {"userTask2": {"reminded": 1}}})
    assert waits(instance) == ["subprocessStartEvent", "userTask"]
    # the main path's end ends the instance: the non-interrupting cycle waits no longer
    instance = engine.run(instance, answers={"user_tasks": {"userTask": {"done": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent", "userTask2", "subprocessEndEvent", "userTask", "endEvent"]
    assert variables(instance.contexts["main"]) == {"reminded": 1, "done": True}


def test_a_cron_calendar_schedule_keeps_the_general_advice() -> None:
    from engine.validate import _cron_every
    assert [_cron_every(t) for t in ("0 0/5 * * * ?", "0/5 0/1 * 1/1 * ?", "*/10 * * * *", "0 0 */2 * * ?",
                                     "0 0 9 * * ?", "0 15 10 ? * MON-FRI", "0 0/5 9 * * ?")] == [
        (5, "M", "minute"), (5, "S", "second"), (10, "M", "minute"), (2, "H", "hour"), None, None, None]


def test_the_transaction_is_refused_for_its_compensation_boundary_events_and_juel_conditions() -> None:
    refused = said(TRANSACTION)
    for boundary, handler in (("BoundaryEvent_17u4kle", "Task_0a7j3wa"), ("BoundaryEvent_0fpk9ez", "Task_0bjphcl")):
        assert refused[boundary].startswith("error:") and "SpiffWorkflow 3.2 runs no compensation" in refused[boundary]
        assert f"undo tasks ({handler!r}) (set" in refused[boundary]
    for conditional in ("StartEvent_1v6l1up", "BoundaryEvent_0j9zalh"):
        assert "write 'variable == 1'" in refused[conditional]
    assert sorted(code for code, _ in errors(TRANSACTION)) == ["compensation_unsupported"] * 2 + [
        "condition_syntax"] * 2


def test_the_transaction_edited_as_said_is_cancelled_by_its_cancel_end_event(tmp_path: Path) -> None:
    """The cancel end event cancels the transaction: its cancel boundary event (which has no outgoing
    flow) ends that path, and the sequence flow after the transaction is never taken."""
    text = TRANSACTION.read_text().replace("${variable == 1}", "variable == 1")
    for boundary in ("BoundaryEvent_17u4kle", "BoundaryEvent_0fpk9ez"):
        text = re.sub(rf'<bpmn:boundaryEvent id="{boundary}".*?</bpmn:boundaryEvent>', "", text, flags=re.S)
    text = re.sub(r'<bpmn:serviceTask id="(Task_1alr7zc|Task_1qkzpv7)" operaton:expression="\$\{true\}">(.*?)'
                  r"</bpmn:serviceTask>", r"<bpmn:scriptTask id=\1>\2<bpmn:script>pass</bpmn:script></bpmn:scriptTask>"
                  .replace("id=\\1", 'id="\\1"'), re.sub(r"<bpmn:association [^>]*/>", "", text), flags=re.S)
    fixed = tmp_path / TRANSACTION.name
    fixed.write_text(text)
    assert errors(fixed) == []
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([fixed]), {}),
                          answers={"user_tasks": {"Task_1jw03rz": {"cancelled_by": "clerk"}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path.count("Task_1alr7zc") == 4  # the multi-instance body and its three instances
    assert path[-3:] == ["EndEvent_0qfzfs9", "Task_01dhlzm", "BoundaryEvent_0q8go63"]
    assert "EndEvent_0n4q4pj" not in path
    assert variables(instance.contexts["main"]) == {"cancelled_by": "clerk"}


# -- Operaton: compensation event sub-process; a compensated multi-instance sub-process ------------

BOOKING = HERE / "operaton_compensation_event_subprocess.bpmn"
SCOPE = HERE / "operaton_compensate_subprocess_scope.bpmn"


def test_the_booking_is_refused_at_each_compensation_element_and_its_juel_condition() -> None:
    refused = said(BOOKING)
    assert sorted(e for e, text in refused.items() if text.startswith("error:")) == [
        "boundaryEvent_bookFlight", "boundaryEvent_bookHotel", "compensateFlight", "compensateHotel",
        "compensationStartEvent", "notValid", "throwCompensation"]
    assert "it would start 'compensationSubProcess' at once, whenever its scope starts" in refused[
        "compensationStartEvent"]
    assert "write 'valid == False'" in refused["notValid"]
    assert "no compensation handler runs and the process goes on as if it had been compensated" in refused[
        "throwCompensation"]


def test_the_booking_without_its_compensation_runs_its_parallel_bookings_and_the_valid_path(tmp_path: Path) -> None:
    text = BOOKING.read_text().replace("${valid == false}", "valid == False")
    text = re.sub(r'<bpmn2:boundaryEvent id="boundaryEvent_book\w+".*?</bpmn2:boundaryEvent>', "", text, flags=re.S)
    text = re.sub(r'<bpmn2:subProcess id="compensationSubProcess".*?</bpmn2:subProcess>', "", text, flags=re.S)
    text = text.replace('<bpmn2:compensateEventDefinition id="CompensateEventDefinition_4" waitForCompletion="true"/>',
                        "")
    fixed = tmp_path / BOOKING.name
    fixed.write_text(re.sub(r"<bpmn2:association [^>]*/>", "", text))
    assert errors(fixed) == []
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([fixed]), {}), answers={"user_tasks": {
        "bookFlight": {"flight": "LH1"}, "bookHotel": {"hotel": "Ritz"}, "validateBooking": {"valid": True}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path[-2:] == ["ExclusiveGateway_1", "end"] and "throwCompensation" not in path
    assert {"cancelFlight", "cancelHotel"}.isdisjoint(path)
    assert variables(instance.contexts["main"]) == {"flight": "LH1", "hotel": "Ritz", "valid": True}


def test_the_compensated_scope_is_refused_for_its_flows_without_ids_and_its_compensation() -> None:
    found = errors(SCOPE)
    assert [code for code, _ in found].count("flow_id_missing") == 6
    assert {eid for code, eid in found if code == "compensation_unsupported"} == {"compensateBookHotelEvt",
                                                                                   "throwCompensate"}


def test_the_scope_edited_as_said_books_five_times_in_sequence_and_undoes_nothing(tmp_path: Path) -> None:
    count = iter(range(1, 10))
    text = re.sub(r'<sequenceFlow sourceRef="(\w+)"\s*targetRef="(\w+)" />', r'<sequenceFlow id="\1_to_\2" '
                  r'sourceRef="\1" targetRef="\2" />', SCOPE.read_text())
    text = re.sub(r'<boundaryEvent id="compensateBookHotelEvt".*?</boundaryEvent>', "", text, flags=re.S)
    text = text.replace('<compensateEventDefinition activityRef="scope" />', "")
    fixed = tmp_path / SCOPE.name
    fixed.write_text(re.sub(r"<association [^>]*/>", "", text))
    assert errors(fixed) == []
    engine = engine_with({"bookHotel": lambda ctx: {"booked": next(count)}})
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path.count("bookHotel") == 6 and "undoBookHotel" not in path  # the body and five instances
    assert path[-3:] == ["throwCompensate", "beforeEnd", "end"]  # the receive task names no message
    assert variables(instance.contexts["main"]) == {"booked": 5}


# -- Operaton: ISO 8601 cycles on a non-interrupting boundary event and a start event --------------

BOUNDARY_CYCLE = HERE / "operaton_boundary_cycle.bpmn"
START_CYCLE = HERE / "operaton_cycle_start_with_limit.bpmn"


def test_a_bare_iso_cycle_is_refused_with_the_string_to_write() -> None:
    assert 'timeCycle R/PT1H is read as a Python expression' in said(BOUNDARY_CYCLE)["timer"]
    assert 'write it as a string: "R/PT1H"' in said(BOUNDARY_CYCLE)["timer"]
    assert 'write it as a string: "R2/PT5M"' in said(START_CYCLE)["theStart"]


def test_the_hourly_reminder_runs_beside_the_task_it_is_attached_to(tmp_path: Path) -> None:
    engine, clock, instance = started_on_a_clock(tmp_path, BOUNDARY_CYCLE, "R/PT1H")
    assert waits(instance) == ["task", "timer"]
    clock.now += 3600
    instance = engine.resume(instance)
    assert waits(instance) == ["task", "timer", "timerFiredTask"]
    instance = engine.run(instance, answers={"user_tasks": {"timerFiredTask": {"reminded": True},
                                                            "task": {"done": True}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert {"end", "nonInterruptingEnd"} <= set(path)
    assert variables(instance.contexts["main"]) == {"reminded": True, "done": True}


def test_a_start_cycle_of_two_runs_its_path_twice_then_completes(tmp_path: Path) -> None:
    engine, clock, instance = started_on_a_clock(tmp_path, START_CYCLE, "R2/PT5M")
    assert [(w["task_id"], w["repetitions_left"]) for w in instance.waiting_for] == [("theStart", 2)]
    clock.now += 5 * 60
    instance = engine.resume(instance)
    assert [(w["task_id"], w["repetitions_left"]) for w in instance.waiting_for] == [("theStart", 1)]
    clock.now += 5 * 60
    instance = engine.resume(instance)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("theEnd") == 2


# -- Operaton: a conditional start event (operaton:variableName) ---------------------------------

CONDITIONAL_START = HERE / "operaton_conditional_start_variable_name.bpmn"


def test_the_conditional_start_runs_from_the_cli_with_answers(tmp_path: Path, cli: Any) -> None:
    assert "write 'True'" in said(CONDITIONAL_START)["StartEvent_1"]
    fixed = rewritten(tmp_path, CONDITIONAL_START, [("${true}", "True")])
    assert [p.code for p in validate_process([fixed]).problems] == ["foreign_extension"]  # its variableName
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"Task_1": {"ready": True}, "Task_3": {"flavour": "lemon"},
                                                  "Task_4": {"reps": 20}}}))
    doc = run_json(cli, "run", str(fixed), "--answers", str(answers))
    assert (doc["status"], doc["error"], doc["waiting_for"]) == ("completed", None, [])
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([fixed]), {}), answers=json.loads(answers.read_text()))
    assert path_of(instance.workflow) == ["StartEvent_1", "Task_1", "Task_3", "ExclusiveGateway_1pcoch7", "Task_4",
                                          "EndEvent_1"]
    assert variables(instance.contexts["main"]) == {"ready": True, "flavour": "lemon", "reps": 20}


# -- Operaton: the escalation code a non-interrupting boundary event puts in a variable ------------

ESCALATION = HERE / "operaton_escalation_code_variable.bpmn"


def test_the_caught_escalation_code_is_set_on_the_boundary_path_and_both_paths_end(tmp_path: Path) -> None:
    assert [code for code, _ in errors(ESCALATION)] == ["flow_id_missing"] * 7
    flows = iter(range(1, 8))
    fixed = tmp_path / ESCALATION.name
    fixed.write_text(re.sub(r"<sequenceFlow ", lambda m: f'<sequenceFlow id="flow{next(flows)}" ',
                            ESCALATION.read_text()))
    assert list(validate_process([fixed]).problems) == []
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["taskAfterCatchedEscalation", "taskInSubprocess"]
    instance = engine.run(instance, answers={"user_tasks": {"taskInSubprocess": {"a": 1},
                                                            "taskAfterCatchedEscalation": {"b": 2}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow).count("theEnd") == 2
    assert variables(instance.contexts["main"]) == {"a": 1, "escalationCodeVar": "escalationCode", "b": 2}


def test_a_conditional_events_variable_filter_is_a_warning_that_it_is_not_read(tmp_path: Path) -> None:
    """operaton:variableName="foo" makes Operaton (Camunda 7) check the condition only as 'foo' changes
    (camunda:variableEvents narrows it to a create, update or delete); layerflow checks it after every
    step, whatever changed. validate said nothing, so a condition over other names fires where the
    other engine would not have."""
    [warning] = [p for p in validate_process([CONDITIONAL_START]).problems if p.code == "foreign_extension"]
    assert (warning.severity, warning.element_id, warning.field) == ("warning", "StartEvent_1", "operaton:variableName")
    text = str(warning)
    assert "has operaton:variableName='foo'" in text
    assert "the other engine's filter: it checks its condition only when variable 'foo' changes" in text
    assert "layerflow does not read it: the condition is checked after every step, whatever changed" in text
    assert "make the condition read 'foo'" in text
    filtered = rewritten(tmp_path, CONDITIONAL_START, [('operaton:variableName="foo"',
                                                         'operaton:variableName="foo" operaton:variableEvents="update"')])
    [warning] = [p for p in validate_process([filtered]).problems if p.code == "foreign_extension"]
    assert "operaton:variableEvents='update'" in str(warning)
    assert "only when variable 'foo' is updated" in str(warning)


def test_a_compensation_boundary_event_names_its_own_handler_and_no_event_sub_process() -> None:
    """Each refusal listed every compensation handler of the file as "the undo tasks ... (set
    isForCompensation="false" on them)", the compensation event sub-process among them: that one has
    no incoming flow to draw (its compensation start is refused on its own), and the boundary event
    of 'bookFlight' is undone by 'cancelFlight' alone (the association says so)."""
    refused = said(BOOKING)
    assert "undo tasks ('cancelFlight') (set" in refused["boundaryEvent_bookFlight"]
    assert "undo tasks ('cancelHotel') (set" in refused["boundaryEvent_bookHotel"]
    for throw in ("compensateFlight", "compensateHotel", "throwCompensation"):
        assert "undo tasks ('cancelFlight', 'cancelHotel') (set" in refused[throw]
        assert "compensationSubProcess'" not in refused[throw].split("undo tasks")[1]
