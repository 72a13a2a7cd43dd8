"""Shapes met in public BPMN and DMN files, round 4: processes written for JavaScript engines
(bpmn-engine, bpmn-server), whose scripts and conditions often parse as Python and mean something
else, and Camunda decision tables that call FEEL's functions. Each is redrawn small in
``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run a shape, a case runs it there
too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.exceptions import WorkflowTaskException
from SpiffWorkflow.bpmn.parser.BpmnParser import BpmnParser
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process
from gateways.conditions import is_flow_sentence

from engine_helpers import variables

REALWORLD = Path(__file__).resolve().parent / "realworld"


def plain(path: Path, process_id: str, data: dict[str, Any]) -> BpmnWorkflow:
    """Plain SpiffWorkflow 3.2 run of ``path`` with ``data`` (its engine steps only)."""
    parser = BpmnParser()
    parser.add_bpmn_file(str(path))
    wf = BpmnWorkflow(parser.get_spec(process_id), parser.get_subprocess_specs(process_id))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    return wf


def problems(*paths: Path) -> list[Any]:
    return [p for p in validate_process(list(paths)).problems if p.severity == "error"]


def rewritten(tmp_path: Path, source: Path, pairs: list[tuple[str, str]]) -> Path:
    """A copy of ``source`` with each text replaced as validate said to write it."""
    text = source.read_text()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / source.name
    out.write_text(text)
    return out


# -- JavaScript engines' processes ----------------------------------------------------------------


def test_a_javascript_negation_is_not_a_sentence_and_is_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """``!environment.variables.stopLoop`` (bpmn-engine's mother-of-all process) has three words and
    does not parse as Python, so layerflow took it for the designer's sentence: validate only warned,
    and offline the run left the flow untaken and completed through the default flow, where plain
    SpiffWorkflow stops on the expression. It is code: validate refuses it naming the flow, with the
    Python that reads the variable by its name."""
    path = REALWORLD / "javascript_negation.bpmn"
    assert not is_flow_sentence("!environment.variables.stopLoop")
    assert not is_flow_sentence("!(approved)")
    assert is_flow_sentence("the applicant is known to us!")
    with pytest.raises(WorkflowTaskException, match="stopLoop"):
        plain(path, "javascript_negation", {"stopLoop": False})
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    line = next(ln for ln in result.output.splitlines() if "'again'" in ln)
    assert f"{path}:15:" in line and "not valid Python" in line and "language='JavaScript'" in line
    assert "write 'not stopLoop'" in line
    assert "sentence" not in result.output
    fixed = rewritten(tmp_path, path, [("!environment.variables.stopLoop", "not stopLoop")])
    for stop, end in ((False, "retry"), (True, None)):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), {"stopLoop": stop}))
        assert instance.status == "completed", instance.error
        expected = plain(fixed, "javascript_negation", {"stopLoop": stop}).last_task.data
        assert variables(instance.main) == dict(expected)
        assert ("activity:retry" in instance.main.layer(3)) == (end == "retry")


def test_a_javascript_negation_reaching_the_engine_unvalidated_fails_as_in_spiffworkflow() -> None:
    """The engine's own evaluation (a process loaded without validation) no longer sends the
    expression to the model as a sentence, nor skips its flow offline: it fails at the gateway."""
    path = REALWORLD / "javascript_negation.bpmn"
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], validate=False), {"stopLoop": False}))
    assert instance.status == "error"
    assert instance.error is not None and "stopLoop" in instance.error["message"]
    assert "finish" not in str(instance.main.layer(3))


def test_juel_reads_of_a_javascript_engine_suggest_the_variable_by_its_name() -> None:
    """``${variables.skipAll}`` and ``${environment.output.count > 2}`` (bpmn-engine's expressions read
    its environment): validate said to write 'variables.skipAll', which stops with a NameError too.
    It says to read the variable by its name, and that a call of the environment's services
    (``environment.services.isAbove(...)``, bpmn-engine's escalation example) is none of Python's."""
    found = {p.element_id: p.message for p in problems(REALWORLD / "juel_engine_reads.bpmn")}
    assert set(found) == {"skip", "many", "big"}
    assert found["skip"].endswith("write 'skipAll'")
    assert found["many"].endswith("write 'count > 2'")
    # a service of the engine's environment has no Python twin: the message says so, and where to compute it
    assert "write 'environment.services.isAbove(10, amount)' (environment.services.isAbove is a JavaScript " \
           "engine's (bpmn-engine's) runtime, which is not here: compute the value in a handler" in found["big"]


def test_javascript_engine_scripts_and_conditions_that_parse_as_python_are_refused(tmp_path: Path) -> None:
    """bpmn-engine's scripts hand control back with ``next()`` and reach the process variables through
    ``this.environment.variables`` (``console.log`` prints); they parse as Python, so validate only
    warned and the run stopped at the first one (TypeError: next expected at least 1 argument). A
    condition reading ``this.environment.variables.rounds`` passed silently and stopped with a
    NameError. Each is refused naming the task or flow, with the Python to write; that Python runs
    as in plain SpiffWorkflow."""
    path = REALWORLD / "javascript_engine_loop.bpmn"
    found = {p.element_id: p for p in problems(path)}
    assert set(found) == {"log_round", "count_round", "more"}, found
    log, count, more = found["log_round"], found["count_round"], found["more"]
    assert log.code == "script_language" and log.line == 12
    assert "next()" in log.message and "console.log" in log.message
    assert "write it as 'print(\"round\", rounds)'" in log.message
    assert count.code == "script_language" and "write it as 'rounds += 1'" in count.message
    assert more.code == "condition_javascript_api" and more.field == "conditionExpression"
    assert "this.environment.variables.rounds" in more.message and "write 'rounds < 2'" in more.message
    fixed = rewritten(tmp_path, path, [
        ('console.log("round", environment.variables.rounds);\nnext();', 'print("round", rounds)'),
        ("this.environment.variables.rounds += 1;\nnext();", "rounds += 1"),
        ("this.environment.variables.rounds &lt; 2", "rounds &lt; 2"),
        ('scriptFormat="JavaScript"', 'scriptFormat="python"')])
    assert problems(fixed) == []
    # the counter changes, so the start data gives it to WORKING (PROCESS keys are append-only)
    (tmp_path / "javascript_engine_loop.layerflow.yaml").write_text("data_layers:\n  rounds: WORKING\n")
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {"rounds": 0}))
    assert instance.status == "completed", instance.error
    expected = plain(fixed, "javascript_engine_loop", {"rounds": 0})
    assert expected.is_completed()
    assert variables(instance.main) == dict(expected.last_task.data) == {"rounds": 2}


# -- FEEL's functions in decision tables --------------------------------------------------------


def plain_camunda(bpmn: Path, dmn: Path, process_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """The final variables of plain SpiffWorkflow with its Camunda parser (camunda:decisionRef)."""
    from SpiffWorkflow.camunda.parser.CamundaParser import CamundaParser

    parser = CamundaParser()
    parser.add_bpmn_file(str(bpmn))
    parser.add_dmn_file(str(dmn))
    wf = BpmnWorkflow(parser.get_spec(process_id))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    assert wf.is_completed()
    return dict(wf.last_task.data)


def test_feel_functions_in_a_decision_table_are_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """camunda-dmn-tester's tables read ``upper case(currentCountry)`` as an input and compare dates with
    FEEL's ``date and time("...")``. validate checked neither: the input expression is no Python (the
    run stopped with 'invalid syntax (<unknown>, line 1). Failed to execute DMN Rule on row 1', naming
    neither the input nor FEEL), and ``date and time("...")`` parses as Python ``date and time(...)``
    (the run stopped with "name 'time' is not defined", told to give 'time' a value). Each is refused
    naming the DMN file, decision, input or rule, with the Python to write; that Python decides as
    in plain SpiffWorkflow."""
    bpmn, dmn = REALWORLD / "feel_functions.bpmn", REALWORLD / "feel_functions.dmn"
    found = {p.element_id: p for p in problems(bpmn, dmn)}
    assert set(found) == {"input_country_expr", "rule_late_swiss_date", "rule_late_swiss_out", "rule_other_out"}, found
    assert all(p.code == "dmn_unsupported" and p.file == str(dmn) for p in found.values())
    country = found["input_country_expr"]
    assert country.line == 10 and country.field == "inputExpression"
    assert "decision 'travel_review', input 'Country' ('input_country')" in country.message
    assert "upper case(country)" in country.message and "write it as 'country.upper()'" in country.message
    late = found["rule_late_swiss_date"]
    assert "rule 1 ('rule_late_swiss')" in late.message and "FEEL's date and time(...)" in late.message
    assert """write it as '> "2021-12-23T00:00"'""" in late.message
    assert """write it as '"2022-01-10T00:00"'""" in found["rule_late_swiss_out"].message
    assert """write it as '"2021-12-31"'""" in found["rule_other_out"].message
    fixed_dmn = rewritten(tmp_path, dmn, [
        ("upper case(country)", "country.upper()"),
        ('&gt; date and time("2021-12-23T00:00")', '&gt; "2021-12-23T00:00"'),
        ('date and time("2022-01-10T00:00")', '"2022-01-10T00:00"'),
        ('date("2021-12-31")', '"2021-12-31"')])
    assert problems(bpmn, fixed_dmn) == []
    for data, review_by in (({"country": "ch", "travel_date": "2022-01-05"}, "2022-01-10T00:00"),
                            ({"country": "ch", "travel_date": "2021-12-01"}, "2021-12-31"),
                            ({"country": "de", "travel_date": "2022-01-05"}, "2021-12-31")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, fixed_dmn]), data))
        assert instance.status == "completed", instance.error
        expected = plain_camunda(bpmn, fixed_dmn, "feel_functions", data)
        assert expected["review_by"] == review_by
        assert variables(instance.main) == expected


# -- events left unfinished in the modeler ------------------------------------------------------


def test_a_conditional_event_with_an_empty_condition_is_refused_naming_the_event() -> None:
    """bpmn-js-token-simulation saves a conditional catch event whose condition was never written as
    ``<condition xsi:type="tFormalExpression" />``. validate called the process valid; plain SpiffWorkflow
    stops there ("Error evaluating expression 'None'") and layerflow stopped with an engine error,
    "AttributeError: 'NoneType' object has no attribute 'strip'", naming no task. validate refuses it
    naming the event and what to write; an engine that runs it unvalidated names the event too."""
    path = REALWORLD / "empty_conditional_event.bpmn"
    with pytest.raises(WorkflowTaskException, match="None"):
        plain(path, "empty_conditional_event", {})
    [problem] = problems(path)
    assert (problem.code, problem.element_id, problem.line, problem.field) == (
        "condition_syntax", "wait_for_stock", 18, "condition")
    assert "conditional event 'wait_for_stock' has no condition" in problem.message
    assert "<bpmn:condition>approved == True</bpmn:condition>" in problem.message
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path], validate=False), {}))
    assert instance.status == "error"
    assert instance.error is not None
    assert instance.error["kind"] == "activity_failed" and instance.error["task_id"] == "wait_for_stock"
    assert "has no condition" in instance.error["message"] and "AttributeError" not in instance.error["message"]


# -- gateways -------------------------------------------------------------------------------------


def test_flows_of_an_inclusive_gateway_without_a_condition_are_refused_naming_each(tmp_path: Path) -> None:
    """go-bpmn's inclusive-default process leaves the other flows of an inclusive gateway without a
    condition (BPMN takes such a flow always). SpiffWorkflow cannot load it, and validate passed its
    words on: 'Non-default exclusive outgoing sequence flow without condition (at bpmn:sequenceFlow); fix
    the BPMN element named here', calling the gateway exclusive and naming only the first flow. Each
    flow is named, with what to write; written so, the gateway takes them as plain SpiffWorkflow does."""
    path = REALWORLD / "inclusive_flows_without_conditions.bpmn"
    found = {p.element_id: p for p in problems(path)}
    assert set(found) == {"by_mail", "by_phone"}, found
    mail = found["by_mail"]
    assert (mail.code, mail.line, mail.field) == ("gateway_flow_without_condition", 15, "conditionExpression")
    assert "outgoing flow 'by_mail' of inclusive gateway 'notify' (to 'mail') has no condition" in mail.message
    assert "<bpmn:conditionExpression>True</bpmn:conditionExpression>" in mail.message
    assert "exclusive" not in mail.message
    always = '<bpmn:sequenceFlow id="{0}" sourceRef="notify" targetRef="{1}"><bpmn:conditionExpression>True' \
             '</bpmn:conditionExpression></bpmn:sequenceFlow>'
    fixed = rewritten(tmp_path, path, [
        ('<bpmn:sequenceFlow id="by_mail" sourceRef="notify" targetRef="mail"/>', always.format("by_mail", "mail")),
        ('<bpmn:sequenceFlow id="by_phone" sourceRef="notify" targetRef="phone"/>', always.format("by_phone", "phone"))])
    assert problems(fixed) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "completed", instance.error
    expected = plain(fixed, "inclusive_flows_without_conditions", {})
    assert variables(instance.main) == dict(expected.last_task.data) == {"mailed": True, "phoned": True}


def test_a_javascript_length_and_semicolon_in_conditions_are_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """Camunda 7's validate-claims example branches on ``resultCheckUniqueRspID.length == 0`` (JavaScript):
    it parses as Python, so validate passed it and the run stopped with "'list' object has no attribute
    'length'"; its twin ``... .length > 0;`` ends with JavaScript's semicolon, and validate said only 'fix
    the condition'. Both are refused with the Python to write, which decides as plain SpiffWorkflow does."""
    path = REALWORLD / "javascript_length.bpmn"
    found = {p.element_id: p for p in problems(path)}
    assert set(found) == {"none", "some"}, found
    assert found["none"].code == "condition_javascript_api"
    assert "duplicates.length" in found["none"].message and "write 'len(duplicates) == 0'" in found["none"].message
    assert found["some"].code == "condition_syntax" and "write 'len(duplicates) > 0'" in found["some"].message
    fixed = rewritten(tmp_path, path, [("duplicates.length == 0", "len(duplicates) == 0"),
                                       ("duplicates.length > 0;", "len(duplicates) > 0")])
    assert problems(fixed) == []
    for duplicates, end in (([], "accepted"), (["R-7"], "rejected")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), {"duplicates": duplicates}))
        assert instance.status == "completed", instance.error
        expected = plain(fixed, "javascript_length", {"duplicates": duplicates})
        assert [t.task_spec.bpmn_id for t in expected.get_tasks() if t.task_spec.bpmn_id in ("accepted", "rejected")
                and t.state == TaskState.COMPLETED] == [end]
        assert variables(instance.main) == dict(expected.last_task.data) == {"duplicates": duplicates}


def test_a_collect_table_aggregation_is_refused_with_the_sum_to_write(tmp_path: Path) -> None:
    """``hitPolicy="COLLECT" aggregation="SUM"`` (camunda-dmn-tester's collect-sum-numbers) gives the sum of
    the matched rules' outputs in Camunda; SpiffWorkflow 3.2 ignores the aggregation and gives their
    list, and validate called the table valid: ``surcharge`` was [5, 12] where the table says 17. It is
    refused naming the DMN file, decision and table, with what to write instead; written so, the process
    gives the sum, in layerflow as in plain SpiffWorkflow."""
    bpmn, dmn = REALWORLD / "collect_sum.bpmn", REALWORLD / "collect_sum.dmn"
    assert plain_camunda(bpmn, dmn, "collect_sum", {"weight": 30})["surcharge"] == [5, 12]
    [problem] = problems(bpmn, dmn)
    assert (problem.code, problem.file, problem.line, problem.element_id, problem.field) == (
        "dmn_unsupported", str(dmn), 6, "surcharges", "aggregation")
    assert "aggregation SUM" in problem.message and "[5, 12]" not in problem.message
    assert "surcharge = sum(surcharge)" in problem.message
    fixed_dmn = rewritten(tmp_path, dmn, [(' aggregation="SUM"', "")])
    summed = '''<bpmn:sequenceFlow id="to_end" sourceRef="price" targetRef="total"/>
    <bpmn:scriptTask id="total" scriptFormat="python"><bpmn:incoming>to_end</bpmn:incoming>
      <bpmn:outgoing>to_done</bpmn:outgoing><bpmn:script>surcharge = sum(surcharge)</bpmn:script></bpmn:scriptTask>
    <bpmn:sequenceFlow id="to_done" sourceRef="total" targetRef="end"/>
    <bpmn:endEvent id="end"><bpmn:incoming>to_done</bpmn:incoming></bpmn:endEvent>'''
    fixed_bpmn = rewritten(tmp_path, bpmn, [('''<bpmn:sequenceFlow id="to_end" sourceRef="price" targetRef="end"/>
    <bpmn:endEvent id="end"><bpmn:incoming>to_end</bpmn:incoming></bpmn:endEvent>''', summed)])
    assert problems(fixed_bpmn, fixed_dmn) == []
    for weight, total in ((30, 17), (3, 5)):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, fixed_dmn]), {"weight": weight}))
        assert instance.status == "completed", instance.error
        expected = plain_camunda(fixed_bpmn, fixed_dmn, "collect_sum", {"weight": weight})
        assert variables(instance.main) == expected == {"weight": weight, "surcharge": total}


def test_conditions_reading_fields_by_path_are_refused_with_the_keys_to_write(tmp_path: Path) -> None:
    """FEEL and JUEL read an object's fields by path (``=order.shipping.express``, as Camunda 8 models
    do). validate told to write 'order.shipping.express', and passed ``order.weight > 20`` silently:
    context values are JSON, so both stop the run with "'dict' object has no attribute ...", as in
    plain SpiffWorkflow. Each is refused with the keys to write; a method call (``.lower()``) is
    Python's own and stays. Written so, the gateway decides as plain SpiffWorkflow does."""
    path = REALWORLD / "attribute_paths.bpmn"
    order = {"shipping": {"express": False}, "weight": 30, "customer": "ACME"}
    (tmp_path / "advised").mkdir()
    advised = rewritten(tmp_path / "advised", path, [("=order.shipping.express", "order.shipping.express")])
    with pytest.raises(WorkflowTaskException, match="order.shipping.express"):
        plain(advised, "attribute_paths", {"order": order})  # what validate told to write
    found = {p.element_id: p for p in problems(path)}
    assert set(found) == {"express", "heavy"}, found
    assert found["express"].code == "condition_syntax"
    assert found["express"].message.endswith("""write "order['shipping']['express']\"""")
    heavy = found["heavy"]
    assert (heavy.code, heavy.line, heavy.field) == ("condition_attribute_read", 18, "conditionExpression")
    assert "reads order.weight, order.customer as attributes" in heavy.message
    assert """write "order['weight'] > 20 and order['customer'].lower() != 'walk-in'\"""" in heavy.message
    fixed = rewritten(tmp_path, path, [
        ("=order.shipping.express", "order['shipping']['express']"),
        ('order.weight &gt; 20 and order.customer.lower() != "walk-in"',
         "order['weight'] &gt; 20 and order['customer'].lower() != 'walk-in'")])
    assert problems(fixed) == []
    for express, weight, end in ((True, 30, "courier"), (False, 30, "freight"), (False, 5, "post")):
        data = {"order": {**order, "shipping": {"express": express}, "weight": weight}}
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), data))
        assert instance.status == "completed", instance.error
        expected = plain(fixed, "attribute_paths", data)
        assert [t.task_spec.bpmn_id for t in expected.get_tasks(state=TaskState.COMPLETED)
                if t.task_spec.bpmn_id in ("courier", "freight", "post")] == [end]
        assert variables(instance.main) == dict(expected.last_task.data) == data
