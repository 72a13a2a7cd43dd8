"""Shapes met in public BPMN files (SpiffWorkflow's and Camunda's test and example processes)
that layerflow ran differently from plain SpiffWorkflow 3.2, or refused although SpiffWorkflow
runs them. Each is redrawn small in ``tests/engine/realworld/``; a case runs it through
layerflow and, where SpiffWorkflow can, through plain SpiffWorkflow with the same data, and
the final variables must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.exceptions import WorkflowDataException
from SpiffWorkflow.bpmn.parser.ValidationException import ValidationException
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.camunda.parser.CamundaParser import CamundaParser
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

from context_layers.errors import ProcessError
from engine import Engine, load_process
from engine.cli import main
from engine.governance import FormAnswerInvalid, InvalidAnswer

from engine_helpers import variables

REALWORLD = Path(__file__).resolve().parent / "realworld"


def plain_camunda(files: list[Path], process_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """The final variables of plain SpiffWorkflow with its Camunda parser (camunda:decisionRef)."""
    parser = CamundaParser()
    parser.add_bpmn_files([str(f) for f in files if f.suffix == ".bpmn"])
    parser.add_dmn_files([str(f) for f in files if f.suffix == ".dmn"])
    wf = BpmnWorkflow(parser.get_spec(process_id))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    assert wf.is_completed()
    return dict(wf.last_task.data)


def run(files: list[Path], data: dict[str, Any]) -> Any:
    engine = Engine(store="memory://")
    return engine.run(engine.start(load_process(files), data))


def test_a_decision_output_named_with_a_dot_sets_a_key_of_an_object_the_process_holds() -> None:
    """A DMN output named ``claim.grade`` (as Camunda Modeler users name outputs into an object)
    adds ``grade`` to the ``claim`` an earlier task wrote; layerflow lost it, because the
    decision ran on a copy of the context that shared its nested objects with the baseline the
    changes were diffed against, so the change was in both and nothing was written."""
    files = [REALWORLD / "nested_output.bpmn", REALWORLD / "claim_grade.dmn"]
    expected = plain_camunda(files, "nested_output", {"score": 70})
    assert expected["claim"] == {"score": 70, "notes": ["opened"], "grade": "A"}
    instance = run(files, {"score": 70})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == expected
    assert instance.main.layer(3)["activity:grade"]["keys"] == ["claim"]


def test_a_camunda_form_field_of_a_custom_type_is_a_warning_and_the_task_runs() -> None:
    """``type="textarea"`` (a form plugin's type, common in processes written for SpiffWorkflow's
    Camunda parser, which runs them) is not one of Camunda 7's built-in types: validate warns,
    naming the file, the task and the field, and the run asks for it with its type unchecked;
    validate refused the whole process."""
    path = REALWORLD / "custom_field_type.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "'textarea'" in ln)
    assert "warning" in line and str(path) in line and "'describe_site'" in line and "field 'access_notes'" in line
    answers = {"describe_site": {"visits": 2, "access_notes": "gate code at the lodge"}}
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}), answers={"user_tasks": answers})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == answers["describe_site"]
    with pytest.raises(InvalidAnswer, match="visits"):  # the typed field beside it is still checked
        engine.run(engine.start(load_process([path]), {}), answers={"user_tasks": {"describe_site": {"visits": "two"}}})


def test_a_data_item_whose_name_is_a_label_draws_no_warning() -> None:
    """A multi-instance item with id="parcel" and name="parcel to weigh" (a label, as modelers
    fill the name in; SpiffWorkflow's own test processes do) is read by its id, as the script
    does: validate warned that the variable was its id and told to write id='parcel to weigh',
    which is no valid XML id and no variable a script could name."""
    path = REALWORLD / "labelled_items.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output, result.output
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("labelled_items"))
    wf.task_tree.data.update({"parcels": [1.5, 2]})
    wf.do_engine_steps()
    assert wf.is_completed()
    instance = run([path], {"parcels": [1.5, 2]})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data) == {"parcels": [1.5, 2], "weights": [1500.0, 2000]}


def test_a_correlation_over_a_message_nothing_exchanges_is_a_warning_and_the_process_runs() -> None:
    """SpiffArena keeps the correlation properties of a whole collection of processes in each file;
    one whose retrieval expression is no Python (``from.depot``: a keyword) over a message no element
    sends or catches is never evaluated, and SpiffWorkflow runs the process: validate refused it.
    It warns, naming the file, the property and the message."""
    path = REALWORLD / "unused_correlation.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "'from.depot'" in ln)
    assert "warning" in line and str(path) in line and "'shipment_ref'" in line and "'shipment_notice'" in line
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("unused_correlation"))
    wf.do_engine_steps()
    assert wf.is_completed()
    instance = run([path], {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data) == {"boxes": 3}


def test_a_connector_with_no_handler_stops_naming_its_operator() -> None:
    """A SpiffArena service task names its connector (``spiffworkflow:serviceTaskOperator``); with
    no handler registered, the run stopped telling the user to register one under the task's id
    only, not under the operator name validate had pointed to (which also gets the parameters)."""
    path = REALWORLD / "connector_without_handler.bpmn"
    instance = run([path], {})
    assert instance.status == "error"
    assert instance.error["task_id"] == "fetch_rate"
    message = instance.error["message"]
    assert "@activity('fx/LatestRate')" in message and "ctx.params" in message, message
    assert "@activity('fetch_rate')" in message, message

    engine = Engine(store="memory://")
    engine.handlers.register("fx/LatestRate", lambda ctx: 0.92 if ctx.params["currency"] == "EUR" else None)
    done = engine.run(engine.start(load_process([path]), {}))
    assert done.status == "completed", done.error
    assert variables(done.main) == {"rate": 0.92}


def test_a_decision_output_into_an_object_the_instance_started_with_is_refused_naming_the_output() -> None:
    """The data an instance starts with is PROCESS (append-only), so a decision output named
    ``claim.grade`` cannot change a ``claim`` given at the start; the refusal named the key and
    the layer but not the decision output that wrote it, nor how to rename it."""
    files = [REALWORLD / "grade_given_claim.bpmn", REALWORLD / "claim_grade.dmn"]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process(files), {"claim": {"score": 70}}))
    assert instance.status == "error"
    assert instance.error["task_id"] == "grade"
    message = instance.error["message"]
    assert "'claim'" in message and "'claim.grade'" in message and "'table_claim_grade'" in message, message
    assert "'claim_grade'" in message, message  # the name to give the output instead


def test_a_flow_with_no_source_left_behind_by_the_modeler_is_a_warning_and_the_process_runs() -> None:
    """A sequence flow whose source shape was deleted keeps its targetRef and loses its sourceRef
    (SpiffArena's own send and receive task test processes carry one). Nothing can take such a
    flow, and SpiffWorkflow runs the process without it; validate refused the whole process. It
    warns, naming the file, the flow and what to do."""
    path = REALWORLD / "dangling_flow.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "'leftover'" in ln)
    assert "warning" in line and str(path) in line and "sourceRef" in line and "remove" in line, line
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("dangling_flow"))
    wf.do_engine_steps()
    assert wf.is_completed()
    instance = run([path], {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data) == {"boxes": 2}


def test_task_inputs_given_by_bpmn_assignment_are_refused_naming_the_task_and_the_inputs() -> None:
    """jBPM saves a person's task with its parameters (TaskName, Skippable, ...) as data inputs that
    a bpmn:assignment gives their values. SpiffWorkflow runs no assignment, so the inputs are never
    set and the task stops the instance, in layerflow as in plain SpiffWorkflow; validate passed it,
    with a warning per input telling to rename its id to its name (which would not have helped).
    It is refused, naming the file, the task, the inputs and what to do."""
    path = REALWORLD / "assigned_inputs.bpmn2"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("assigned_inputs"))
    with pytest.raises(WorkflowDataException, match="Missing data input"):
        wf.do_engine_steps()

    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if "bpmn:assignment" in ln]
    assert str(path) in line and "'review'" in line and "'TaskName'" in line and "'Skippable'" in line, line
    assert "remove" in line and "script" in line, line
    assert "give it id=" not in result.output, result.output  # renaming the ids would not set them


def test_a_java_script_that_parses_as_python_is_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """jBPM's script tasks are Java (scriptFormat http://www.java.com/java): ``System.out.println(...)``
    and ``kcontext.setVariable("x", v)`` lines happen to parse as Python, so validate passed the
    process with a warning to check the script, and the run stopped with a NameError on 'System'
    (plain SpiffWorkflow stops there too). It is refused, naming the file, the task and the calls,
    with the Python to write; that Python runs, in layerflow as in plain SpiffWorkflow."""
    path = REALWORLD / "java_script.bpmn2"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("java_script"))
    wf.task_tree.data.update({"item": "books"})
    with pytest.raises(Exception, match="System"):
        wf.do_engine_steps()

    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if "System.out.println" in ln]
    assert str(path) in line and "'pack'" in line and "kcontext.setVariable" in line, line
    instead = 'print("Packing " + item)\npacked = True'
    assert repr(instead) in line, line

    fixed = tmp_path / "java_script.bpmn"
    source = path.read_text()
    start = source.index("<script>") + len("<script>")
    fixed.write_text(source[:start] + instead + source[source.index("</script>"):])
    assert CliRunner().invoke(main, ["validate", str(fixed)]).exit_code == 0
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(fixed))
    wf = BpmnWorkflow(parser.get_spec("java_script"))
    wf.task_tree.data.update({"item": "books"})
    wf.do_engine_steps()
    instance = run([fixed], {"item": "books"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data) == {"item": "books", "packed": True}


def test_a_timer_whose_type_was_never_chosen_is_refused_naming_the_event_and_what_to_write(tmp_path: Path) -> None:
    """Camunda Modeler and bpmn.io save a timer event whose type (duration, date, cycle) is not
    chosen yet as an empty bpmn:timerEventDefinition. SpiffWorkflow cannot load it, and validate
    passed its words on: 'Time Specification Error. Unknown Time Specification', which says
    neither what is missing nor what to write. It names the event, the three choices and an example."""
    path = REALWORLD / "empty_timer.bpmn"
    parser = SpiffBpmnParser()
    with pytest.raises(ValidationException, match="Unknown Time Specification"):
        parser.add_bpmn_file(str(path))
        parser.get_spec("empty_timer")

    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if "'cool_down'" in ln]
    assert str(path) in line and "timeDuration" in line and "timeDate" in line and "timeCycle" in line, line
    assert '"PT1H"' in line and "Unknown Time Specification" not in result.output, result.output

    # a timer whose type was chosen but whose value was left empty: SpiffWorkflow fails when it is reached
    empty_value = tmp_path / "empty_duration.bpmn"
    empty_value.write_text(path.read_text().replace(
        '<bpmn:timerEventDefinition id="cool_down_timer" />',
        '<bpmn:timerEventDefinition id="cool_down_timer"><bpmn:timeDuration /></bpmn:timerEventDefinition>'))
    result = CliRunner().invoke(main, ["validate", str(empty_value)])
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if "'cool_down'" in ln]
    assert "an empty one" in line and '"PT1H"' in line, line


def test_a_pool_that_is_not_run_does_not_stop_the_one_chosen_with_process() -> None:
    """A collaboration exported with every pool executable (the MIWG reference files, Signavio) runs
    one pool, chosen with --process. A shape SpiffWorkflow cannot load in another pool (here an
    implicit split) refused the chosen pool too, although plain SpiffWorkflow runs it; it is checked
    when that pool is the one chosen (or one the chosen pool calls), and without --process."""
    path = REALWORLD / "two_pools.bpmn"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("shipping"))
    wf.do_engine_steps()
    assert wf.is_completed()

    chosen = CliRunner().invoke(main, ["validate", str(path), "--process", "shipping"])
    assert chosen.exit_code == 0, chosen.output
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], process_id="shipping"), {}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data) == {"shipped": 2}

    other = CliRunner().invoke(main, ["validate", str(path), "--process", "billing"])
    assert other.exit_code == 2 and "'bill' has 2 outgoing flows" in other.output, other.output
    unchosen = CliRunner().invoke(main, ["validate", str(path)])
    assert unchosen.exit_code == 2 and "'bill' has 2 outgoing flows" in unchosen.output, unchosen.output


def test_a_loop_that_passes_no_deciding_gateway_is_refused_naming_it() -> None:
    """A loop drawn straight back into an event or task (bpmn.io's pizza collaboration: the vendor
    calms the customer and waits for the next complaint) passes no exclusive, inclusive or
    event-based gateway. SpiffWorkflow cannot create an instance of such a process: it predicts the
    loop's steps without end (RecursionError). Validate passed it and the run printed that
    traceback (no JSON with --json); it is refused, naming the loop and the gateway to draw."""
    path = REALWORLD / "loop_without_gateway.bpmn"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    with pytest.raises(RecursionError):
        BpmnWorkflow(parser.get_spec("loop_without_gateway"))

    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    [line] = [ln for ln in result.output.splitlines() if "'calm_customer'" in ln]
    assert str(path) in line and "'complaint' -> 'calm_customer' -> 'complaint'" in line, line
    assert "exclusive gateway" in line and "RecursionError" in line, line
    run_result = CliRunner().invoke(main, ["run", str(path), "--store", "memory://", "--json"])
    assert run_result.exit_code == 2, run_result.output
    assert '"invalid_process"' in run_result.stdout and "calm_customer" in run_result.stdout

    # loaded without validation, the engine refuses to start it with the same advice, not a traceback
    with pytest.raises(ProcessError, match="loop that passes no exclusive"):
        Engine(store="memory://").start(load_process([path], validate=False), {})


@pytest.mark.parametrize("data", [{"amount": 100, "credit": 30}, {"amount": 20, "credit": 30}])
def test_an_amount_split_into_more_than_zero_and_zero_is_a_warning_and_runs(data: dict[str, int]) -> None:
    """``remaining > 0`` / ``remaining == 0`` with no default flow (Camunda 8's payment example)
    misses only negative numbers, which an amount or a count never is; plain SpiffWorkflow runs
    the process. Validate refused it ("do not cover remaining < 0", an error) although it treated
    the same doubt about fractions (``x <= 4`` / ``x >= 5``) as a warning; it warns now."""
    path = REALWORLD / "amount_split.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "'credit_enough'" in ln)
    assert "warning" in line and "remaining < 0" in line, line
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("amount_split"))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    assert wf.is_completed()
    instance = run([path], data)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == dict(wf.last_task.data)


@pytest.mark.parametrize("score", [30, 70])
def test_a_decision_table_with_hit_policy_first_runs_as_plain_spiffworkflow_runs_it(score: int) -> None:
    """SpiffWorkflow 3.2 keeps every matching rule of a table that is not UNIQUE and gives the
    first one's outputs unless the table is COLLECT: hit policy FIRST (common in Camunda's DMN)
    runs as FIRST means. Validate refused it ("runs UNIQUE and COLLECT only"); it runs, and a
    result variable mapped to singleResult gets the first matching rule, not an error for two."""
    files = [REALWORLD / "first_hit.bpmn", REALWORLD / "first_hit.dmn"]
    result = CliRunner().invoke(main, ["validate", *map(str, files)])
    assert result.exit_code == 0, result.output
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(files[0]))
    parser.add_dmn_file(str(files[1]))
    wf = BpmnWorkflow(parser.get_spec("first_hit"))
    wf.task_tree.data.update({"score": score})
    wf.do_engine_steps()
    assert wf.is_completed()
    expected = {"score": score, "route": "manual" if score < 50 else "auto"}
    assert dict(wf.last_task.data) == expected
    instance = run(files, {"score": score})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == expected

    mapped = run([REALWORLD / "first_hit_single_result.bpmn", files[1]], {"score": score})
    assert mapped.status == "completed", mapped.error
    assert variables(mapped.main) == {"score": score, "routing": {"route": expected["route"]}}


def test_feel_booleans_in_a_decision_table_are_refused_with_the_python_to_write() -> None:
    """Camunda's DMN editor writes a boolean output as FEEL's ``true`` / ``false``; SpiffWorkflow's
    DMN engine evaluates entries as Python, where they are unknown names. Validate passed the table
    and the run failed at the business rule task calling the entry a condition; it is refused,
    naming the DMN file, the rule and entry, and what to write (True, False)."""
    files = [REALWORLD / "feel_booleans.bpmn", REALWORLD / "feel_booleans.dmn"]
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(files[0]))
    parser.add_dmn_file(str(files[1]))
    wf = BpmnWorkflow(parser.get_spec("feel_booleans"))
    wf.task_tree.data.update({"payment_type": "prepaid"})
    with pytest.raises(Exception, match="false"):
        wf.do_engine_steps()

    result = CliRunner().invoke(main, ["validate", *map(str, files)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if "outputEntry" in ln]
    assert len(lines) == 2, result.output
    assert str(files[1]) in lines[0] and "'prepaid'" in lines[0] and "'false'" in lines[0] and "False" in lines[0]
    assert "'otherwise'" in lines[1] and "True" in lines[1]


def test_a_camunda_worker_type_draws_no_warning_once_the_task_has_a_handler() -> None:
    """A Camunda 8 service task names its job worker (zeebe:taskDefinition). Validate warned that
    this is not run and told to run the step with a handler, also when the config beside the
    process gave it one; the advice is left out then. The input mapping beside it runs (before
    the handler: ``test_realworld_7``), so nothing is said of the task."""
    path = REALWORLD / "zeebe_worker.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert [ln for ln in result.output.splitlines() if "'send_mail'" in ln] == [], result.output


def test_a_camunda_form_written_under_the_activiti_namespace_is_read_and_checked() -> None:
    """Camunda Modeler before 3.0 (and the MIWG reference files, Camunda 7's generated-forms example)
    bound ``camunda:`` to ``http://activiti.org/bpmn``: its ``camunda:formData`` was not read, so the
    waiting task showed no form and an answer giving a boolean field ``"yes"`` or changing a read-only
    field was taken unchecked. It is read as Camunda 7's form, and checked."""
    path = REALWORLD / "legacy_camunda_form.bpmn"
    engine = Engine(store="memory://")
    waiting = engine.run(engine.start(load_process([path]), {"quantity": 3}))
    (item,) = [w for w in waiting.to_document()["waiting_for"] if w["kind"] == "user_task"]
    assert item["form"]["source"] == "camunda:formData"
    assert [(f["id"], f["type"], f.get("readonly", False), f["required"]) for f in item["form"]["fields"]] == [
        ("quantity", "long", True, False), ("accepted", "boolean", False, True)]
    with pytest.raises(FormAnswerInvalid, match="accepted"):
        engine.run(engine.start(load_process([path]), {"quantity": 3}),
                   answers={"user_tasks": {"check_order": {"accepted": "yes"}}})
    done = engine.run(engine.start(load_process([path]), {"quantity": 3}),
                      answers={"user_tasks": {"check_order": {"accepted": True}}})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"quantity": 3, "accepted": True}


def test_sequence_flows_without_ids_are_refused_naming_their_ends() -> None:
    """BPMN lets a sequence flow go without an id, and hand-written processes (Flowable's and Activiti's
    test processes) leave them out; SpiffWorkflow keys the flows by id, so it follows none of them: the
    instance completed at once with every task skipped, and validate said the process was valid. It is
    refused, each flow named by its ends and line, with what to write."""
    path = REALWORLD / "flows_without_ids.bpmn"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec("flows_without_ids"))
    wf.do_engine_steps()
    assert wf.is_completed() and dict(wf.last_task.data) == {}  # plain SpiffWorkflow: nothing ran
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if "has no id" in ln]
    assert len(lines) == 4, result.output
    assert f"{path}:6:" in lines[0] and "'start' to 'split'" in lines[0] and 'id="' in lines[0]
    assert any("'pack' to 'join'" in ln for ln in lines)
    assert not any("label_done" in ln for ln in lines)
    with pytest.raises(ProcessError, match="has no id"):
        load_process([path])


def test_a_decision_table_without_ids_is_refused_naming_the_dmn_file_and_what_lacks_one() -> None:
    """Camunda's older DMN editor wrote ``<decisionTable hitPolicy="COLLECT">`` with no id (Camunda 7's
    dinner-decisions example); SpiffWorkflow's DMN parser needs an id on the table, its inputs,
    outputs, rules and entries. validate said "SpiffWorkflow cannot load the process: KeyError('id')
    (at bpmn:businessRuleTask)", blaming the BPMN task; it names the DMN file, the line, the decision
    and each element without an id."""
    bpmn, table = REALWORLD / "unnamed_table.bpmn", REALWORLD / "unnamed_table.dmn"
    parser = CamundaParser()
    parser.add_bpmn_file(str(bpmn))
    parser.add_dmn_file(str(table))
    with pytest.raises(ValidationException, match="KeyError"):  # plain SpiffWorkflow: no more than that
        parser.get_spec("unnamed_table")
    result = CliRunner().invoke(main, ["validate", str(bpmn), str(table)])
    assert result.exit_code == 2, result.output
    assert "KeyError" not in result.output, result.output
    lines = [ln for ln in result.output.splitlines() if "has no id" in ln]
    assert [ln.split(": ", 1)[0] for ln in lines] == [f"{table}:5", f"{table}:14", f"{table}:16"], result.output
    assert "decision 'shipping_mode'" in lines[0] and "decisionTable" in lines[0] and 'id="' in lines[0]
    assert "rule 2" in lines[1] and "outputEntry" in lines[2]



def test_a_decision_table_given_its_ids_runs_as_plain_spiffworkflow_runs_it(tmp_path: Path) -> None:
    """The three ids validate asked for are all the table lacked: with them it runs, as in SpiffWorkflow."""
    bpmn = REALWORLD / "unnamed_table.bpmn"
    table = tmp_path / "unnamed_table.dmn"
    table.write_text((REALWORLD / "unnamed_table.dmn").read_text().replace(
        "<decisionTable ", '<decisionTable id="modes" ').replace("<rule>", '<rule id="heavy">').replace(
        "<outputEntry>", '<outputEntry id="heavy_mode">'))
    result = CliRunner().invoke(main, ["validate", str(bpmn), str(table)])
    assert result.exit_code == 0, result.output
    expected = plain_camunda([bpmn, table], "unnamed_table", {"weight": 5})
    assert expected["mode"] == "parcel"
    instance = run([bpmn, table], {"weight": 5})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == expected


def test_a_dmn_input_entry_listing_values_is_refused_with_the_python_test_to_write(tmp_path: Path) -> None:
    """``"S","M"`` (FEEL: the input is one of these; Camunda 7's dinner example writes
    ``"Fall","Winter","Spring"``) reads in Python as a tuple the input is compared to, so the rule never
    matches: plain SpiffWorkflow silently took the next rule (a size "M" got the large box), and validate
    passed it. It is refused naming the rule, with ``? in ("S", "M")``, which runs as FEEL meant."""
    bpmn, table = REALWORLD / "one_of_list.bpmn", REALWORLD / "one_of_list.dmn"
    assert plain_camunda([bpmn, table], "one_of_list", {"size": "M"})["box"] == "large box"
    result = CliRunner().invoke(main, ["validate", str(bpmn), str(table)])
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if "small_sizes" in ln]
    assert line.startswith(f"{table}:11:") and "'? in (\"S\", \"M\")'" in line, line
    fixed = tmp_path / "one_of_list.dmn"
    fixed.write_text(table.read_text().replace('<text>"S","M"</text>', '<text>? in ("S", "M")</text>'))
    assert CliRunner().invoke(main, ["validate", str(bpmn), str(fixed)]).exit_code == 0
    expected = plain_camunda([bpmn, fixed], "one_of_list", {"size": "M"})
    assert expected["box"] == "small box"
    instance = run([bpmn, fixed], {"size": "M"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == expected


def test_a_retrieval_expression_naming_no_message_is_refused_at_its_line() -> None:
    """SpiffArena's modeler can leave a correlation property's retrieval expression without the
    message it reads (its own collaboration test file has one). SpiffWorkflow refuses the file with
    "Message identifier is missing from correlation property: parcel_ref", and validate passed that on
    with no line and "fix the BPMN element named here". It names the file, the line, the property and
    what to write."""
    path = REALWORLD / "retrieval_without_message.bpmn"
    parser = SpiffBpmnParser()
    with pytest.raises(ValidationException, match="Message identifier is missing"):
        parser.add_bpmn_file(str(path))
        parser.get_spec("retrieval_without_message")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if "'parcel_ref'" in ln]
    assert line.startswith(f"{path}:9:") and "messageRef" in line and "'tracking_number'" in line, line
    assert "fix the BPMN element named here" not in result.output


def test_a_script_calling_a_function_nothing_defines_is_a_warning_naming_it() -> None:
    """SpiffArena's process models call its backend scripts (``get_current_user()``,
    ``get_frontend_url()``), which exist only inside SpiffArena: validate said the process was valid
    and the run stopped with a NameError. It warns, naming the task, the function and what to do;
    functions the script defines itself and Python's builtins draw nothing."""
    path = REALWORLD / "backend_script_call.bpmn"
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.output.splitlines() if "get_current_user" in ln]
    assert "warning" in line and "'stamp'" in line and "SpiffArena" in line and "handler" in line, line
    assert "twice" not in result.output and "'max'" not in result.output
    instance = run([path], {})
    assert instance.status == "error" and "get_current_user" in str(instance.error)


def test_a_script_raising_bpmn_error_draws_no_unknown_function_warning() -> None:
    """``BpmnError`` is in every script's namespace (engine.BpmnError), as ``ctx`` is."""
    path = Path(__file__).resolve().parent / "bpmn_errors" / "charge.bpmn"
    assert "BpmnError(" in path.read_text()
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert "script_unknown_function" not in result.output and "BpmnError()" not in result.output, result.output


def test_a_data_association_with_a_process_variable_names_the_property_and_what_to_do() -> None:
    """jBPM saves process variables as ``bpmn:property`` and maps them into a task by a data association
    with no id; SpiffWorkflow refuses it ("Cannot resolve dataInputAssociation <Element ... at 0x...>"),
    and validate said "dataInputAssociation None of 'pick' has sourceRef 'courier', which is no
    dataObjectReference ...": a None for the missing id, and no word of the property it names. It names
    the property, what SpiffWorkflow does with it and what to write."""
    path = REALWORLD / "process_variable_association.bpmn"
    parser = SpiffBpmnParser()
    with pytest.raises(ValidationException, match="Cannot resolve dataInputAssociation"):
        parser.add_bpmn_file(str(path))
        parser.get_spec("process_variable_association")
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    (line,) = [ln for ln in result.output.splitlines() if "'courier'" in ln and "sourceRef" in ln]
    assert line.startswith(f"{path}:16:") and "a dataInputAssociation of 'pick'" in line, line
    assert "bpmn:property" in line and "by its name" in line and "None" not in line, line
