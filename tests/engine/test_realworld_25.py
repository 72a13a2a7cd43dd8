"""Public models, round 25, each in ``tests/engine/realworld25/`` (the file's header comment names its
source; ``realworld25/SOURCES.md`` lists repositories, paths, commits and licences): Flowable's engine test
models of signal event sub-processes (interrupting and not, one running an embedded sub-process, two
without ids, one caught from a called process), signal boundary events (on a user task, on an event
sub-process, thrown by a called process), a terminate end event with terminateAll in an event sub-process,
boundary timers (a non-interrupting reminder, a cycle that ends at a JUEL date), a message named by an
expression; and jBPM's process-scope terminate, ad-hoc sub-process, link events in a sub-process and a
data object. Each is validated as given (validate says what is wrong, naming the element and what to
write), then, edited as validate says, run, and its path and data are checked against plain
SpiffWorkflow's and against what BPMN says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, run_plain_files, variables
from test_realworld_4 import rewritten
from test_realworld_17 import said
from test_realworld_24 import Clock

HERE = Path(__file__).resolve().parent / "realworld25"


def errors(path: Path) -> list[tuple[str, str | None]]:
    return [(p.code, p.element_id) for p in validate_process([path]).problems if p.severity == "error"]


def with_flow_ids(tmp_path: Path, source: Path, pairs: tuple[tuple[str, str], ...] = ()) -> Path:
    """``source`` with each text of ``pairs`` replaced and an id on each sequence flow (as validate
    says: flow1, flow2, ...)."""
    out = rewritten(tmp_path, source, list(pairs))
    count = iter(range(1, 100))
    out.write_text(re.sub(r"<sequenceFlow (?!id=)", lambda m: f'<sequenceFlow id="flow{next(count)}" ',
                          out.read_text()))
    return out


def problem_of(path: Path, element_id: str) -> tuple[tuple[str, str, str | None], str]:
    """The one problem validate has with ``element_id``: (code, severity, field), and its text."""
    [problem] = [p for p in validate_process([path]).problems if p.element_id == element_id]
    return (problem.code, problem.severity, problem.field), str(problem)


def waits(instance: Any) -> list[str]:
    return sorted(w["task_id"] for w in instance.waiting_for)


# -- Flowable: signal event sub-processes without ids ---------------------------------------------

NESTED = HERE / "flowable_signal_interrupting_nested_subprocess.bpmn"
TWO = HERE / "flowable_two_interrupting_signal_event_subprocesses.bpmn"


def test_an_event_sub_process_without_an_id_is_refused_naming_its_start_event(tmp_path: Path) -> None:
    """The event sub-process has no id (BPMN requires one; Flowable makes one up). validate said the
    file was valid once its flows had ids, and starting it crashed in SpiffWorkflow's serializer with
    KeyError 'Duplicate task spec name: None' (plain SpiffWorkflow crashes as its signal arrives)."""
    fixed = with_flow_ids(tmp_path, NESTED)
    [problem] = [p for p in validate_process([fixed]).problems if p.severity == "error"]
    assert (problem.code, problem.element_id, problem.field, problem.line) == ("node_id_missing", None, "id", 21)
    text = str(problem)
    assert "the event sub-process starting at 'eventProcessStart' has no id" in text
    assert 'give it an id unique in the file, e.g. id="eventProcessStart_subprocess"' in text


def test_two_event_sub_processes_without_ids_are_each_named_and_spiffs_duplicate_none_is_not() -> None:
    """SpiffWorkflow refused the file with "Duplicate process ID: None (at bpmn:subProcess)", naming no
    line and no element: the reader had to guess that None was a missing id. Each sub-process is
    named by its start event, with the line and the id to write; the None is not repeated."""
    refused = said(TWO)
    assert "Duplicate process ID" not in "".join(refused.values())
    problems = [p for p in validate_process([TWO]).problems if p.code == "node_id_missing"]
    assert [(p.line, p.field) for p in problems] == [(22, "id"), (32, "id")]
    assert 'e.g. id="eventProcessStart2_subprocess"' in str(problems[1])
    assert sorted(code for code, _ in errors(TWO)) == ["flow_id_missing"] * 6 + ["node_id_missing"] * 2


# -- terminate end events that another engine makes end the whole instance ------------------------

TERMINATE_ALL = HERE / "flowable_terminate_all_in_event_subprocess.bpmn"
JBPM_SCOPE = HERE / "jbpm_terminate_process_scope.bpmn2"


def test_flowables_terminate_all_in_a_non_interrupting_event_sub_process_is_a_warning_of_the_other_path() -> None:
    """flowable:terminateAll="true" makes Flowable end the whole instance at the event sub-process's
    terminate end event (its test asserts the process ended); BPMN, SpiffWorkflow and layerflow end
    only the event sub-process, and the instance goes on waiting at 'task'. validate said nothing."""
    kind, text = problem_of(TERMINATE_ALL, "subProcessEndEvent")
    assert kind == ("foreign_extension", "warning", "flowable:terminateAll")
    assert "has flowable:terminateAll='true': Flowable ends the whole process instance there" in text
    assert "layerflow (as BPMN says, and SpiffWorkflow) ends only event sub-process 'eventSubProcess'" in text
    assert 'make the event sub-process interrupting (isInterrupting="true" on its start event ' \
           "'subProcessStart')" in text


def test_jbpms_process_scope_terminate_in_a_sub_process_is_a_warning_of_the_other_path() -> None:
    warning = said(JBPM_SCOPE)["_10-3"]
    assert warning.startswith("warning:")
    assert "has tns:scope='process': jBPM ends the whole process instance there" in warning
    assert "ends only sub-process '_10' and the process goes on after it" in warning
    assert "end '_10' with an error end event and draw an error boundary event on '_10' that leads to a " \
           "terminate end event of the process" in warning


def engine_with(handlers: dict[str, Any] | None = None) -> Engine:
    engine = Engine(store="memory://")
    for task_id, handler in (handlers or {}).items():
        engine.handlers.register(task_id, handler)
    return engine


def test_terminate_all_edited_as_said_ends_only_the_event_sub_process_then_the_whole_instance(tmp_path: Path) -> None:
    """Given ids, the terminate end event ends the non-interrupting event sub-process alone (the path
    plain SpiffWorkflow takes); made interrupting, as validate says, the signal ends the instance at
    once, as Flowable's terminateAll did: 'task' never completes."""
    fixed = with_flow_ids(tmp_path, TERMINATE_ALL)
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.send_event(engine.run(engine.start(load_process([fixed]), {})), "signal", {}, kind="signal")
    assert waits(instance) == ["subProcessStart", "task"]
    instance = engine.run(instance, answers={"user_tasks": {"task": {"done": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent1", "subProcessStart", "subProcessEndEvent", "eventSubProcess",
                                          "task", "endEvent"]
    (tmp_path / "interrupting").mkdir()
    interrupting = with_flow_ids(tmp_path / "interrupting", TERMINATE_ALL,
                                 (('isInterrupting="false"', 'isInterrupting="true"'),))
    assert [p.code for p in validate_process([interrupting]).problems] == []
    instance = engine.send_event(engine.run(engine.start(load_process([interrupting]), {})), "signal", {},
                                 kind="signal")
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent1", "subProcessStart", "subProcessEndEvent", "eventSubProcess"]


def test_jbpms_terminate_edited_as_said_runs_the_sub_process_and_the_step_after_it(tmp_path: Path) -> None:
    """Its Java println scripts refused (with the Python to write), then written so: BPMN's terminate
    ends the sub-process and 'AfterSubprocess' runs, as in plain SpiffWorkflow (jBPM would stop)."""
    assert sorted(e for e, text in said(JBPM_SCOPE).items() if text.startswith("error:")) == ["_10-5", "_15"]
    fixed = tmp_path / "scope.bpmn"
    fixed.write_text(JBPM_SCOPE.read_text().replace('System.out.println(&quot;****** AfterSubprocess&quot;);',
                                                    "after = 1").replace(
        'System.out.println(&quot;****** BeforeTerminate&quot;);', "before = 1"))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["_1", "_10-2", "_10-5", "_10-3", "_10", "_15", "_12"]
    assert variables(instance.contexts["main"]) == {"before": 1, "after": 1}


# -- Flowable: signal event sub-processes and a signal boundary event, run -----------------------

NON_INTERRUPTING = HERE / "flowable_signal_non_interrupting_nested_subprocess.bpmn"
BOUNDARY = HERE / "flowable_signal_boundary_on_user_task.bpmn"


def test_the_interrupting_event_sub_process_cancels_the_task_and_runs_its_embedded_sub_process(tmp_path: Path) -> None:
    fixed = with_flow_ids(tmp_path, NESTED, (('<subProcess triggeredByEvent="true">',
                                              '<subProcess id="eventProcessStart_subprocess" triggeredByEvent="true">'),))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["eventProcessStart", "task"]
    instance = engine.send_event(instance, "eventSignal", {"reason": "recall"}, kind="signal")
    assert waits(instance) == ["eventSubProcessTask"]
    instance = engine.run(instance, answers={"user_tasks": {"eventSubProcessTask": {"handled": True}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert "task" not in path and "theEnd" not in path
    assert path == ["theStart", "eventProcessStart", "nestedStart", "eventSubProcessTask", "nestedEnd", "subProcess",
                    "eventSubProcessEnd", "eventProcessStart_subprocess"]
    assert variables(instance.contexts["main"]) == {"reason": "recall", "handled": True}


def test_the_non_interrupting_event_sub_process_runs_beside_the_task_and_the_instance_waits_for_both(
        tmp_path: Path) -> None:
    """As plain SpiffWorkflow: the main path's end does not end the instance while the event
    sub-process's person has not answered; what both wrote is in the context (plain SpiffWorkflow
    drops the event sub-process's data)."""
    fixed = with_flow_ids(tmp_path, NON_INTERRUPTING)
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.send_event(engine.run(engine.start(load_process([fixed]), {})), "newSignal", {}, kind="signal")
    assert waits(instance) == ["eventProcessStart", "eventSubProcessTask", "task"]
    instance = engine.run(instance, answers={"user_tasks": {"task": {"main": 1}}})
    # (plain SpiffWorkflow stops listening for the signal here; layerflow still does while its scope
    # runs, as the event sub-process keeps the process active)
    assert instance.status == "waiting" and waits(instance) == ["eventProcessStart", "eventSubProcessTask"]
    instance = engine.run(instance, answers={"user_tasks": {"eventSubProcessTask": {"side": 2}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["theStart", "eventProcessStart", "nestedStart", "task", "theEnd",
                                          "eventSubProcessTask", "nestedEnd", "subProcess", "eventSubProcessEnd",
                                          "eventSubProcess"]
    assert variables(instance.contexts["main"]) == {"main": 1, "side": 2}


def test_two_interrupting_event_sub_processes_given_ids_the_second_signal_runs_the_second(tmp_path: Path) -> None:
    fixed = with_flow_ids(tmp_path, TWO, (
        ('<subProcess triggeredByEvent="true">\n\t\t\t<startEvent id="eventProcessStart" ',
         '<subProcess id="eventProcessStart_subprocess" triggeredByEvent="true">\n\t\t\t<startEvent id="eventProcessStart" '),
        ('<subProcess triggeredByEvent="true">', '<subProcess id="eventProcessStart2_subprocess" triggeredByEvent="true">')))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["eventProcessStart", "eventProcessStart2", "task"]
    instance = engine.send_event(instance, "newSignal2", {}, kind="signal")
    assert waits(instance) == ["eventSubProcessTask2"]  # the other event sub-process no longer waits
    instance = engine.run(instance, answers={"user_tasks": {"eventSubProcessTask2": {"second": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["theStart", "eventProcessStart2", "eventSubProcessTask2",
                                          "eventSubProcessEnd2", "eventProcessStart2_subprocess"]


def test_the_signal_boundary_event_takes_the_task_over_as_in_plain_spiffworkflow() -> None:
    assert list(validate_process([BOUNDARY]).problems) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([BOUNDARY]), {}))
    assert waits(instance) == ["signalBoundary", "taskWait1"]
    instance = engine.send_event(instance, "waitsig", {}, kind="signal")
    instance = engine.run(instance, answers={"user_tasks": {"taskWait2": {"waited": 2}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startEvent1", "signalBoundary", "taskWait2", "endEvent1"]
    assert variables(instance.contexts["main"]) == {"waited": 2}


# -- Flowable: Groovy println scripts indented in the XML; a cycle that ends at a JUEL date -------

REPEAT = HERE / "flowable_repeat_with_duration_and_end.bpmn"


def test_an_indented_groovy_println_is_named_with_the_python_to_write_not_as_an_indentation_error() -> None:
    """The Groovy scripts are indented as the XML is. validate said "this one is not Python (unexpected
    indent in 'System.out.println(...)'); rewrite it in Python": the reader learnt nothing of the
    println, and the same jBPM script unindented got the Python to write. Dedented, it is the Java
    API call it is, with the Python to write at column 0."""
    refused = said(REPEAT)
    for task, text in (("processStartedScript", "Process started"), ("timerFiredTask", "Boundary Event"),
                       ("task2Completed", "Process ended")):
        assert "unexpected indent" not in refused[task]
        assert "calls System.out.println, Java's and jBPM's API" in refused[task]
        assert f"write it as 'print(\"{text}\")'" in refused[task]
        assert "start its lines at column 0 (scripts run exactly as written)" in refused[task]


def test_an_indented_groovy_script_that_is_python_says_to_unindent_it(tmp_path: Path) -> None:
    indented = tmp_path / "repeat.bpmn"
    indented.write_text(REPEAT.read_text().replace('System.out.println("Process started");', "started = True"))
    text = said(indented)["processStartedScript"]
    assert "it is Python once its lines start at column 0 (scripts run exactly as written): unindent it " \
           "and set scriptFormat=\"python\"" in text
    assert "rewrite it in Python" not in text


def test_a_cycle_ending_at_a_juel_date_is_not_said_to_be_quoted_as_it_stands() -> None:
    """validate said to write 'R5/PT10S/${date:format(EndDateForBoundary)}' quoted: a string whose
    end date is JUEL that nothing fills in, which fails when the timer starts. It names the JUEL and
    the Python to write, and what SpiffWorkflow makes of a date after the period."""
    kind, text = problem_of(REPEAT, "timer")
    assert kind == ("timer_expression", "error", "timeCycle")
    assert 'write it as a string: "R5/PT10S/${' not in text
    assert "holds the JUEL expression ${date:format(EndDateForBoundary)}, which the other engine fills in" in text
    assert "write '\"R5/PT10S/\" + EndDateForBoundary' with EndDateForBoundary holding the date as ISO 8601 " \
           "text" in text
    assert "SpiffWorkflow reads a date after the period as the end of the repetitions and fires first one " \
           "period before it" in text
    assert 'for 5 repetitions PT10S apart, counted from when the timer starts, write "R5/PT10S"' in text


def test_the_repeating_boundary_timer_edited_as_said_fires_beside_task_b_until_it_is_done(tmp_path: Path) -> None:
    fixed = tmp_path / REPEAT.name
    text = REPEAT.read_text().replace("<timeCycle>R5/PT10S/${date:format(EndDateForBoundary)}</timeCycle>",
                                      '<timeCycle>"R5/PT10S"</timeCycle>')
    for script, python in (("Process started", "started = True"), ("Boundary Event", "fired = True"),
                           ("Process ended", "ended = True")):
        text = text.replace(f'\n                System.out.println("{script}");\n            ', python)
    fixed.write_text(text.replace('scriptFormat="groovy"', 'scriptFormat="python"'))
    assert errors(fixed) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([fixed]), {}), answers={"user_tasks": {"task1": {}}})
    assert waits(instance) == ["task2", "timer"]
    for _ in range(2):
        clock.now += 10
        instance = engine.resume(instance)
    instance = engine.run(instance, answers={"user_tasks": {"task2": {"done": True}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path.count("timerFiredTask") == 2 and path.count("nonInterruptingEnd") == 2
    assert path[-2:] == ["task2Completed", "end"]
    assert variables(instance.contexts["main"]) == {"started": True, "fired": True, "done": True, "ended": True}


# -- Flowable: a non-interrupting reminder and two interrupting timers ----------------------------

THREE_TIMERS = HERE / "flowable_three_boundary_timers.bpmn"


def test_three_boundary_timers_quoted_as_said_remind_close_the_reminder_then_cancel_the_task(tmp_path: Path) -> None:
    """At 1 h the non-interrupting reminder starts 'reminderTask' beside 'firstTask' (which still
    waits); at 2 h the reminder's own interrupting timer closes it (its path ends at 'end', the
    instance goes on); at 4 h the interrupting timer cancels 'firstTask' and the instance completes."""
    assert sorted(e for e, text in said(THREE_TIMERS).items() if text.startswith("error:")) == [
        "closeReminder", "fireExecution", "reminderTimer"]
    fixed = tmp_path / THREE_TIMERS.name
    fixed.write_text(THREE_TIMERS.read_text().replace("<timeDuration>PT1H</timeDuration>",
                                                      '<timeDuration>"PT1H"</timeDuration>').replace(
        "<timeDuration>PT4H</timeDuration>", '<timeDuration>"PT4H"</timeDuration>'))
    assert errors(fixed) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([fixed]), {"initiator": "kermit"}))
    seen = [waits(instance)]
    for _ in range(4):
        clock.now += 3600
        instance = engine.resume(instance)
        seen.append(waits(instance))
    assert seen == [["fireExecution", "firstTask", "reminderTimer"],
                    ["closeReminder", "fireExecution", "firstTask", "reminderTask"],
                    ["fireExecution", "firstTask"], ["fireExecution", "firstTask"], []]
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["start", "reminderTimer", "closeReminder", "end", "fireExecution", "end"]


# -- Flowable: a signal boundary event on an error event sub-process ------------------------------

ON_EVENT_SUB = HERE / "flowable_boundary_on_event_subprocess.bpmn"


def test_a_boundary_event_on_an_event_sub_process_is_refused_naming_both_and_what_to_draw() -> None:
    """SpiffWorkflow failed with "AttributeError: 'BoundaryEventSplit' object has no attribute 'spec'",
    naming no element. BPMN draws no boundary event on an event sub-process (nothing flows into it,
    there is no activity to interrupt before its event comes); Flowable runs one."""
    assert not [p for p in validate_process([ON_EVENT_SUB]).problems if "BoundaryEventSplit" in str(p)]
    kind, text = problem_of(ON_EVENT_SUB, "signalBoundary")
    assert kind == ("boundary_on_event_subprocess", "error", "attachedToRef")
    assert "boundary event 'signalBoundary' is attached to event sub-process 'eventSubProcess'" in text
    assert "SpiffWorkflow cannot load a boundary event on an event sub-process" in text
    assert "inside 'eventSubProcess', put its steps ('taskInEventSubProcess') in an embedded sub-process after " \
           "'eventErrorStart' and attach 'signalBoundary' to that sub-process" in text


def test_a_groovy_throw_of_a_bpmn_error_gets_the_raise_to_write_and_the_error_its_code() -> None:
    """"this one is not Python (invalid syntax in 'throw new org.flowable.engine.delegate.BpmnError(...)');
    rewrite it in Python": layerflow has the very thing (BpmnError is in every script's namespace), so
    it says what to write. The errorRef that names no bpmn:error is Flowable's error code: the
    bpmn:error to add carries it as its errorCode, which is what a BpmnError's code is matched with."""
    refused = said(ON_EVENT_SUB)
    assert "throws BPMN error 'scriptError' (org.flowable.engine.delegate.BpmnError)" in refused["scriptTask"]
    assert "write it as 'raise BpmnError(\"scriptError\")' (BpmnError is in every script's namespace)" in refused[
        "scriptTask"]
    assert "add <bpmn:error id=\"scriptError\" errorCode=\"scriptError\"/> (the code jBPM and Flowable read from " \
           "an errorRef that names no element) under bpmn:definitions" in refused[
        "eventErrorStart"]


def edited_as_said(tmp_path: Path) -> Path:
    text = ON_EVENT_SUB.read_text().replace(
        'scriptFormat="groovy"', 'scriptFormat="python"').replace(
        'throw new org.flowable.engine.delegate.BpmnError("scriptError");', 'raise BpmnError("scriptError")').replace(
        '<process id=', '<error id="scriptError" errorCode="scriptError"/>\n    <process id=').replace(
        '<userTask id="taskInEventSubProcess" name="User task"/>',
        '<subProcess id="handling"><startEvent id="handlingStart"/><userTask id="taskInEventSubProcess" name="User '
        'task"/><endEvent id="handlingEnd"/><sequenceFlow id="h1" sourceRef="handlingStart" targetRef="taskInEventSub'
        'Process"/><sequenceFlow id="h2" sourceRef="taskInEventSubProcess" targetRef="handlingEnd"/></subProcess>')
    text = text.replace('targetRef="taskInEventSubProcess"/>\n', 'targetRef="handling"/>\n').replace(
        'sourceRef="taskInEventSubProcess" targetRef="eventEnd"', 'sourceRef="handling" targetRef="eventEnd"').replace(
        'attachedToRef="eventSubProcess"', 'attachedToRef="handling"')
    # the boundary event and its path move into the event sub-process, beside the sub-process it watches
    boundary = re.search(r'\s*<boundaryEvent id="signalBoundary".*?<sequenceFlow id="flow4"[^>]*/>', text, re.S)
    assert boundary is not None
    text = text.replace(boundary.group(0), "").replace("        </subProcess>\n    </process>",
                                                        boundary.group(0) + "\n        </subProcess>\n    </process>")
    fixed = tmp_path / ON_EVENT_SUB.name
    fixed.write_text(text)
    return fixed


def test_the_event_sub_process_edited_as_said_is_started_by_the_raised_error_then_left_by_the_signal(
        tmp_path: Path) -> None:
    fixed = edited_as_said(tmp_path)
    assert errors(fixed) == [], said(fixed)
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == ["signalBoundary", "taskInEventSubProcess"]
    instance = engine.send_event(instance, "eventSignal", {"why": "recalled"}, kind="signal")
    instance = engine.run(instance, answers={"user_tasks": {"taskAfterSignal": {"after": True}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert "end1" not in path and "taskInEventSubProcess" not in path
    assert path[-3:] == ["taskAfterSignal", "end2", "eventSubProcess"]
    # the caught error's code (and message) as the error start event's variables, as README says
    assert variables(instance.contexts["main"]) == {"error_code": "scriptError", "error_message": None,
                                                    "why": "recalled", "after": True}


def test_the_event_sub_process_edited_as_said_without_the_signal_ends_through_its_user_task(tmp_path: Path) -> None:
    engine = engine_with()
    instance = engine.run(engine.start(load_process([edited_as_said(tmp_path)]), {}),
                          answers={"user_tasks": {"taskInEventSubProcess": {"handled": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-5:] == ["taskInEventSubProcess", "handlingEnd", "handling", "eventEnd",
                                               "eventSubProcess"]


# -- jBPM: a data object a script reads; link events inside a sub-process -------------------------

DATA_OBJECT = HERE / "jbpm_data_object.bpmn2"
LINKS = HERE / "jbpm_link_events_in_subprocess.bpmn2"


def test_the_data_object_script_written_in_python_reads_the_start_data_as_in_plain_spiffworkflow(
        tmp_path: Path) -> None:
    fixed = tmp_path / "data_object.bpmn"
    fixed.write_text(DATA_OBJECT.read_text().replace(
        'System.out.println("Processing evaluation for employee " + employee);',
        'said = "Processing evaluation for employee " + employee'))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {"employee": "UserId-12345"}))
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["_1", "_2", "_3"]
    assert variables(instance.contexts["main"]) == {"employee": "UserId-12345",
                                                    "said": "Processing evaluation for employee UserId-12345"}


def test_a_script_reading_an_unset_data_object_says_what_it_is_and_where_to_give_it(tmp_path: Path) -> None:
    """Started without 'employee' (jBPM's test gives it), the run stopped with "NameError: name
    'employee' is not defined" and nothing more: it names the data object and the start data."""
    fixed = tmp_path / "data_object.bpmn"
    fixed.write_text(DATA_OBJECT.read_text().replace(
        'System.out.println("Processing evaluation for employee " + employee);',
        'said = "Processing evaluation for employee " + employee'))
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "error"
    message = instance.error["message"]
    assert "NameError: name 'employee' is not defined" in message
    assert "'employee' is bpmn:dataObject 'employee' of process 'DataObject', which holds no value until a step " \
           "writes it" in message
    assert "give 'employee' a value before '_2' (the start data or an earlier task's output)" in message


def test_the_link_inside_the_sub_process_jumps_where_plain_spiffworkflow_stops(tmp_path: Path) -> None:
    """Plain SpiffWorkflow stops at the link throw event (its path ends there, the instance never
    completes); layerflow follows the link to its catch event, as BPMN says."""
    fixed = tmp_path / "links.bpmn"
    fixed.write_text(LINKS.read_text().replace('System.out.println("about to jump");', 'before = 1').replace(
        'System.out.println("jumped");', "after = 2"))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["_1", "_2-1", "_2-2", "_2-3", "_2-4", "_2-9", "_2-11", "_2", "_3"]
    assert variables(instance.contexts["main"]) == {"before": 1, "after": 2}


def test_jbpms_ad_hoc_sub_process_is_refused_with_the_loop_to_draw_and_its_java_scripts_with_the_python() -> None:
    refused = said(HERE / "jbpm_ad_hoc_subprocess.bpmn2")
    assert sorted(e for e, text in refused.items() if text.startswith("error:")) == ["_2", "_2-1", "_2-2", "_3"]
    assert "ad-hoc sub-process '_2': SpiffWorkflow 3.2 cannot run one to its end" in refused["_2"]
    assert "draw the choice as a loop instead" in refused["_2"]
    assert "write it as 'print(\"Goodbye World\")'" in refused["_3"]


# -- Flowable: a message event sub-process named by flowable:messageExpression ---------------------

MESSAGE_EXPRESSION = HERE / "flowable_message_expression_event_subprocess.bpmn"


def test_a_message_named_by_an_expression_is_warned_of_as_that_expression_not_as_no_message() -> None:
    """validate said the event's definition "names none", as if the modeler had left it empty: it
    names its message by flowable:messageExpression="${subprocessMessage}" (the value of that
    variable as the event starts waiting), which layerflow does not read."""
    warning = said(MESSAGE_EXPRESSION)["startMessageEvent1"]
    assert warning.startswith("warning:")
    assert "names its message by flowable:messageExpression='${subprocessMessage}'" in warning
    assert "the other engine's: the message is named by the value of subprocessMessage as the event starts waiting" \
        in warning
    assert "layerflow does not read it: nothing can send it, so it never fires" in warning
    assert 'add messageRef="ID" naming a bpmn:message whose name is the one subprocessMessage holds' in warning


def test_the_message_event_sub_process_given_a_message_as_said_interrupts_the_user_task(tmp_path: Path) -> None:
    fixed = tmp_path / MESSAGE_EXPRESSION.name
    fixed.write_text(MESSAGE_EXPRESSION.read_text().replace(
        '<messageEventDefinition flowable:messageExpression="${subprocessMessage}">',
        '<messageEventDefinition messageRef="cancelled">').replace(
        "<process id=", '<message id="cancelled" name="cancelled"/>\n    <process id='))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {"initiator": "kermit"}))
    assert waits(instance) == ["formTask1", "startMessageEvent1"]
    instance = engine.send_event(instance, "cancelled", {"by": "customer"})
    assert waits(instance) == ["formTask2"]
    instance = engine.run(instance, answers={"user_tasks": {"formTask2": {"noted": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["startnoneevent1", "startMessageEvent1", "formTask2", "endNoneEvent2",
                                          "eventSubprocess1"]
    assert variables(instance.contexts["main"]) == {"initiator": "kermit", "by": "customer", "noted": True}


# -- Flowable: signals thrown in a called process ---------------------------------------------------

FROM_CALLED = HERE / "flowable_signal_from_called_process_to_boundary.bpmn"
CALL_SIGNAL = sorted((HERE / "flowable_call_activity_signal").glob("*.bpmn"))


def test_a_signal_the_called_process_throws_interrupts_the_callers_task_as_in_plain_spiffworkflow() -> None:
    """As Flowable's test asserts: the called process ends, the caller's boundary event takes
    'userTaskWithSignalCatch' over, and the join completes once 'userTaskAfterSignalCatch' is done."""
    assert [p.code for p in validate_process([FROM_CALLED]).problems] == ["process_executable_unset"]
    engine = engine_with()
    instance = engine.run(engine.start(load_process([FROM_CALLED]), {}))
    assert waits(instance) == ["beforeThrowTask", "signalCatch", "userTaskWithSignalCatch"]
    instance = engine.run(instance, answers={"user_tasks": {"beforeThrowTask": {"thrown": 1}}})
    assert waits(instance) == ["userTaskAfterSignalCatch"]
    instance = engine.run(instance, answers={"user_tasks": {"userTaskAfterSignalCatch": {"after": 2}}})
    assert instance.status == "completed", instance.error
    wf = run_plain_files([FROM_CALLED], "processWithSignalCatch")
    for task_id in ("beforeThrowTask", "userTaskAfterSignalCatch"):
        [task] = [t for t in wf.get_tasks(state=TaskState.READY, manual=True) if t.task_spec.bpmn_id == task_id]
        task.run()
        wf.do_engine_steps()
    assert wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf) == [
        "theStart2", "fork", "theStart", "beforeThrowTask", "signalThrow", "theEnd", "callActivity", "signalCatch",
        "userTaskAfterSignalCatch", "gateway", "join", "theEnd2"]
    assert variables(instance.contexts["main"]) == {"thrown": 1, "after": 2}


def test_a_signal_the_called_process_throws_starts_the_callers_interrupting_event_sub_process() -> None:
    """The caller's main path never reaches 'endNoneEvent1': the event sub-process interrupts it
    (plain SpiffWorkflow, which ignores isInterrupting, runs both)."""
    assert [p.code for p in validate_process(CALL_SIGNAL).problems] == ["foreign_extension"] * 2  # initiator
    engine = engine_with()
    instance = engine.run(engine.start(load_process(CALL_SIGNAL), {"initiator": "kermit"}))
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert "endNoneEvent1" not in path and path[-2:] == ["endNoneEvent2", "eventSubprocess1"]
    assert "endNoneEvent1" in path_of(run_plain_files(CALL_SIGNAL, "SignalEventSubprocessAndCallActivityProcess"))


# -- jBPM: a global data store with an empty name, touched by plain associations -----------------

DATA_STORE = HERE / "jbpm_user_task_with_data_store.bpmn2"


def test_a_data_store_with_an_empty_name_is_named_by_its_id_and_line() -> None:
    """SpiffWorkflow said "Data Store with name  has no implementation" (two spaces: the name is
    empty), and validate passed that on with no element and no line."""
    found = [p for p in validate_process([DATA_STORE]).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.line) for p in found] == [
        ("data_store_unsupported", "_642F1C24-40EE-4F9B-9562-F3A419DB49D1", 12)]
    text = str(found[0])
    assert "Data Store with name  has" not in text
    assert "bpmn:dataStore '_642F1C24-40EE-4F9B-9562-F3A419DB49D1' (it has no name either) has no implementation" \
        in text
    assert "no bpmn:dataStoreReference names it, so no task reads or writes it (a bpmn:association carries no " \
        "data): remove it and the associations drawn to it" in text


def test_the_two_user_tasks_without_the_data_store_run_in_turn(tmp_path: Path) -> None:
    fixed = tmp_path / DATA_STORE.name
    text = re.sub(r"<bpmn2:dataStore .*?/>", "", DATA_STORE.read_text(), flags=re.S)
    fixed.write_text(re.sub(r"<bpmn2:association .*?/>", "", text, flags=re.S))
    assert errors(fixed) == []
    joe, barney = "_64D3D89E-4738-46A0-A5C5-33596B0FA087", "_4D157129-E208-4296-9706-C029C1C76743"
    engine = engine_with()
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert waits(instance) == [joe]
    instance = engine.run(instance, answers={"user_tasks": {joe: {"user": "joe"}, barney: {"seen": True}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.contexts["main"]) == {"user": "joe", "seen": True}


# -- jBPM: a signal event sub-process whose signalRef names no bpmn:signal --------------------------

NO_SIGNAL = HERE / "jbpm_signal_event_subprocess_no_signal_element.bpmn2"


def test_a_signal_ref_naming_no_signal_suggests_the_signal_of_that_name() -> None:
    """jBPM reads signalRef="MySignal" as the signal's name. validate said to add a bpmn:signal with
    name="...", leaving the reader to guess the name `layerflow send` must then use."""
    refused = said(NO_SIGNAL)["StartEvent_2"]
    assert "add <bpmn:signal id=\"MySignal\" name=\"MySignal\"/> (the name jBPM and Flowable read from a signalRef " \
           "that names no element) under bpmn:definitions" in refused
    assert "(the name jBPM and Flowable read from a signalRef that names no element)" in refused


def test_the_signal_event_sub_process_given_its_signal_runs_beside_the_user_task(tmp_path: Path) -> None:
    fixed = tmp_path / "signal.bpmn"
    fixed.write_text(NO_SIGNAL.read_text().replace(
        'System.out.println("Event sub process triggered");', "triggered = True").replace(
        "<bpmn2:process ", '<bpmn2:signal id="MySignal" name="MySignal"/>\n  <bpmn2:process '))
    assert errors(fixed) == []
    engine = engine_with()
    instance = engine.send_event(engine.run(engine.start(load_process([fixed]), {})), "MySignal", {}, kind="signal")
    assert waits(instance) == ["StartEvent_2", "UserTask_1"]  # non-interrupting: it may start again
    instance = engine.run(instance, answers={"user_tasks": {"UserTask_1": {"done": True}}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == ["StartEvent_1", "StartEvent_2", "ScriptTask_1", "EndEvent_2", "SubProcess_1",
                                          "UserTask_1", "EndEvent_1"]
    assert variables(instance.contexts["main"]) == {"triggered": True, "done": True}


# -- Flowable: a signal's payload mapped out of the thrower and into the catcher -------------------

PAYLOAD = HERE / "flowable_signal_payload"


def test_flowables_out_and_in_on_signal_events_get_the_payload_settings_to_write() -> None:
    """validate said "set the variables in a script, a handler or an ioSpecification" at both events:
    none of which carries a signal's payload. It says what to write where SpiffWorkflow reads it."""
    thrown = said(PAYLOAD / "throw_alert_signal_with_out_parameters.bpmn")["signalEvent"]
    assert "set the variables in a script, a handler or an ioSpecification" not in thrown
    assert "flowable:out puts 'textVar' as 'outTextVar', 'numberVar' as 'outNumberVar' into the signal's payload" \
        in thrown
    assert 'write <spiffworkflow:payloadExpression>{"outTextVar": textVar, "outNumberVar": numberVar}' \
           "</spiffworkflow:payloadExpression> in the extensionElements of bpmn:signal 'alertSignal'" in thrown
    caught = said(PAYLOAD / "catch_alert_signal_boundary_with_in_parameters.bpmn")["boundary"]
    assert "set the variables in a script, a handler or an ioSpecification" not in caught
    assert "flowable:in copies the payload's 'outTextVar' to 'myNewTextVar', 'outNumberVar' to 'myNewNumberVar'" \
        in caught
    assert "copy them in a bpmn:scriptTask after 'boundary': 'myNewTextVar = outTextVar\\nmyNewNumberVar = " \
           "outNumberVar'" in caught


def test_the_alert_signal_written_as_said_carries_its_payload_from_the_thrower_to_the_renamed_keys(
        tmp_path: Path) -> None:
    """The thrower's payload leaves its instance (no catch there) with the keys Flowable's flowable:out
    gave it; sent to the catcher, the boundary event takes the task over, and the script drawn after
    it, as validate says, copies them under flowable:in's names."""
    spiff = 'xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" targetNamespace'
    throw = with_flow_ids(tmp_path, PAYLOAD / "throw_alert_signal_with_out_parameters.bpmn", (
        ("targetNamespace", spiff), ('<signal id="alertSignal" name="alert" />',
                                     '<signal id="alertSignal" name="alert"><extensionElements><spiffworkflow:'
                                     'payloadExpression>{"outTextVar": textVar, "outNumberVar": numberVar}'
                                     "</spiffworkflow:payloadExpression></extensionElements></signal>")))
    assert errors(throw) == []
    engine = engine_with()
    thrower = engine.run(engine.start(load_process([throw]), {"textVar": "Alert!", "numberVar": 1}))
    assert thrower.status == "completed", thrower.error
    [out] = thrower.messages_out()
    assert (out["name"], out["kind"], out["payload"]) == ("alert", "signal", {"outTextVar": "Alert!",
                                                                              "outNumberVar": 1})
    (tmp_path / "catch").mkdir()
    catch = with_flow_ids(tmp_path / "catch", PAYLOAD / "catch_alert_signal_boundary_with_in_parameters.bpmn", (
        ('<sequenceFlow sourceRef="boundary" targetRef="task2" />',
         '<sequenceFlow id="to_rename" sourceRef="boundary" targetRef="rename" /><scriptTask id="rename"><script>'
         "myNewTextVar = outTextVar\nmyNewNumberVar = outNumberVar</script></scriptTask>"
         '<sequenceFlow id="renamed" sourceRef="rename" targetRef="task2" />'),))
    catcher = engine.run(engine.start(load_process([catch]), {}))
    catcher = engine.send_event(catcher, out["name"], out["payload"], kind="signal")
    catcher = engine.run(catcher, answers={"user_tasks": {"task2": {}}})
    assert catcher.status == "completed", catcher.error
    assert path_of(catcher.workflow) == ["start", "boundary", "rename", "task2", "end"]
    assert variables(catcher.contexts["main"]) == {"outTextVar": "Alert!", "outNumberVar": 1,
                                                   "myNewTextVar": "Alert!", "myNewNumberVar": 1}


# -- Flowable: non-interrupting timer cycles of event sub-processes, at the top and in a sub-process --

ADDITIONAL = HERE / "flowable_timer_event_subprocesses_additional_tasks.bpmn"


def test_daily_cycles_add_tasks_beside_the_process_and_its_sub_process_which_waits_for_its_own(
        tmp_path: Path) -> None:
    """R3/P1D quoted as validate says. Each day adds a task of the event sub-process whose scope is
    running (the sub-process's only while it runs); the sub-process ends only once the tasks its
    event sub-process added are done, and the process once every added task is."""
    assert sorted(e for e, text in said(ADDITIONAL).items() if text.startswith("error:")) == [
        "signalStartEvent", "subEventStartEvent"]
    fixed = rewritten(tmp_path, ADDITIONAL, [("<timeCycle>R3/P1D</timeCycle>", '<timeCycle>"R3/P1D"</timeCycle>')])
    assert errors(fixed) == []
    clock = Clock()
    engine = Engine(store="memory://", clock=clock)
    instance = engine.run(engine.start(load_process([fixed]), {}), answers={"user_tasks": {"task1": {}}})
    assert waits(instance) == ["signalStartEvent", "subEventStartEvent", "subTask1"]
    clock.now += 86400
    instance = engine.resume(instance)
    assert waits(instance) == ["additionalSubTask", "additionalTask", "signalStartEvent", "subEventStartEvent",
                               "subTask1"]
    instance = engine.run(instance, answers={"user_tasks": {"subTask1": {"sub": 1}}})
    assert waits(instance) == ["additionalSubTask", "additionalTask", "signalStartEvent", "subEventStartEvent"]
    instance = engine.run(instance, answers={"user_tasks": {"additionalSubTask": {"added_in_sub": 1}}})
    assert waits(instance) == ["additionalTask", "signalStartEvent", "task2"]  # the sub-process's timer stopped
    instance = engine.run(instance, answers={"user_tasks": {"task2": {"t2": 1}, "additionalTask": {"added": 1}}})
    assert instance.status == "completed", instance.error
    path = path_of(instance.workflow)
    assert path.count("additionalTask") == path.count("additionalSubTask") == 1 and path[-1] == "endEvent"
    assert variables(instance.contexts["main"]) == {"sub": 1, "added_in_sub": 1, "t2": 1, "added": 1}
