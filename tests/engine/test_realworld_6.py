"""Shapes met in public BPMN and DMN files, round 6: Camunda 8's examples and the processes of Go
and Camunda 7 engines' test suites (lib-bpmn-engine, camunda-7-code-examples): comments among the
XML, listeners that no task holds, Camunda 8's lists of listeners. Each is redrawn small in
``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run a shape, a case runs it there
too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import variables
from test_realworld_4 import plain, problems

REALWORLD = Path(__file__).resolve().parent / "realworld"


# -- XML comments ----------------------------------------------------------------------------------


def test_an_xml_comment_among_extension_elements_is_no_setting_and_the_task_runs() -> None:
    """Camunda's four-eyes example writes a comment among a user task's extension elements. Validate
    and run stopped with a traceback, "ValueError: Invalid tag name '<cyfunction Comment ...>'"
    (the check for another engine's settings took the comment for an element). The comment says
    nothing to run: the process validates and runs as in plain SpiffWorkflow."""
    path = REALWORLD / "comment_in_extensions.bpmn"
    assert problems(path) == []
    expected = plain(path, "comment_in_extensions", {"reviewers": ["ann", "bo"]}).last_task.data
    assert expected["reviews"] == 2
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"reviewers": ["ann", "bo"]}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(expected)


def test_a_comment_inside_a_script_task_loads_and_runs_as_in_spiffworkflow() -> None:
    """A comment inside a script task, before its script: SpiffWorkflow's BPMN parser runs it; its
    Spiff parser (the one layerflow builds on) took the comment for an element, and validate refused
    the process with "SpiffWorkflow cannot load the process: AttributeError(\"'...cython_function_
    or_method' object has no attribute 'endswith'\")". It now runs, as in plain SpiffWorkflow."""
    path = REALWORLD / "comment_in_script_task.bpmn"
    assert problems(path) == []
    for amounts, route in (([40, 90], "approval"), ([10, 20], "paid")):
        expected = plain(path, "comment_in_script_task", {"amounts": amounts}).last_task.data
        assert expected["route"] == route
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path]), {"amounts": amounts}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == dict(expected)


def test_a_comment_inside_a_condition_does_not_hide_it(tmp_path: Path) -> None:
    """A comment before a condition's text: validate read the text before the comment (none) and
    said the flow had no condition, while the engine's parser reads the condition whole."""
    source = (REALWORLD / "comment_in_script_task.bpmn").read_text()
    condition = 'xsi:type="bpmn:tFormalExpression">total &gt; 100'
    assert condition in source
    path = tmp_path / "comment_in_script_task.bpmn"
    source = source.replace("<!-- the lines of the invoice come with the start data -->", "")
    path.write_text(source.replace(condition, 'xsi:type="bpmn:tFormalExpression"><!-- euros -->total &gt; 100'))
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"amounts": [40, 90]}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["route"] == "approval"


# -- listeners --------------------------------------------------------------------------------------


def test_camunda_8_lists_of_task_and_execution_listeners_are_named_as_not_run() -> None:
    """Camunda 8.8 writes a user task's listeners in a zeebe:taskListeners list (Camunda's
    task-listener example: jobs run as the task is created and completed), and execution listeners
    in zeebe:executionListeners. Validate said the process was valid with no word of them (it looked
    for camunda:taskListener-like elements only), so the jobs silently never ran."""
    found = validate_process([REALWORLD / "camunda8_task_listeners.bpmn"]).problems
    listeners = [(p.code, p.element_id, p.severity) for p in found if p.code == "foreign_extension"]
    assert listeners == [("foreign_extension", "review", "warning"), ("foreign_extension", "file", "warning")]
    review, file = (p for p in found if p.code == "foreign_extension")
    assert "has zeebe:taskListeners, another engine's settings that layerflow does not run" in review.message
    assert "has zeebe:executionListeners, another engine's settings" in file.message
    assert review.message.endswith("do the listener's work in a task of the process")


def test_listeners_on_a_process_and_on_a_sequence_flow_are_named_as_not_run() -> None:
    """Camunda 7's execution listeners on the process (run as an instance starts) and on a sequence
    flow (run as it is taken; here a script that sets a variable): validate said nothing, as it
    looked at tasks, events and gateways only, and the run went on as if they had run."""
    path = REALWORLD / "listeners_on_process_and_flow.bpmn"
    found = [p for p in validate_process([path]).problems if p.code == "foreign_extension"]
    assert [(p.element_id, p.field, p.severity, p.line) for p in found] == [
        ("listeners_on_process_and_flow", "camunda:executionListener", "warning", 6),
        ("f2", "camunda:executionListener", "warning", 17)]
    process, flow = found
    assert process.message.startswith("process 'listeners_on_process_and_flow' has camunda:executionListener, "
                                       "run as an instance starts or ends")
    assert process.message.endswith("do the listener's work in a task after the start event (or before the end "
                                    "event)")
    assert flow.message.startswith("sequence flow 'f2' has camunda:executionListener, run as the flow is taken: "
                                   "another engine's listener that layerflow does not run")
    assert flow.message.endswith("draw a script task (or a task with a handler) on the flow, from 'weigh' to "
                                 "'end', that does the listener's work")
    # a warning: the process runs, without what the listeners did
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path])))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"grams": 1200}
