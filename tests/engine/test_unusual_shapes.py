"""BPMN shapes people draw that the examples do not: empty branches, flows straight to the join."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from engine.cli import main

from engine_helpers import flow, write_elements


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(main, [*args, "--store", f"sqlite:///{tmp_path / 'shapes.db'}", "--json"],
                                catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.parametrize("kind", ["parallelGateway", "inclusiveGateway"])
def test_two_empty_branches_straight_to_the_join_split_and_merge(tmp_path: Path, kind: str) -> None:
    """Two outgoing flows of a split that both go straight to its join are two branches with
    the same first element: each gets a context of its own (the second named ``join#2``) instead of
    the run failing with "branch ids must be unique"."""
    condition = "a > 0" if kind == "inclusiveGateway" else None
    path = write_elements(tmp_path, "empty_branches", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:{kind} id="split"/>',
        '<bpmn:scriptTask id="work"><bpmn:script>x = a + 1</bpmn:script></bpmn:scriptTask>',
        f'<bpmn:{kind} id="join"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "work", condition), flow("work", "join"), flow("join", "end"),
        flow("split", "join", condition),
        flow("split", "join", condition).replace('id="split_to_join"', 'id="split_to_join_2"'),
    ])
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"a": 1}')
    assert doc["error"] is None, doc["error"]
    assert code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["x"] == 2 and doc["conflicts"] == []


def _xor(tmp_path: Path, condition_xml: str) -> Path:
    """start -> XOR (default: small) -> big | small -> end; ``condition_xml`` is the big flow's text, as written."""
    return write_elements(tmp_path, "xor_text", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:exclusiveGateway id="gw" default="gw_to_small"/>',
        '<bpmn:scriptTask id="big"><bpmn:script>path = "big"</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="small"><bpmn:script>path = "small"</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "gw"), flow("gw", "small"), flow("big", "end"), flow("small", "end"),
        '<bpmn:sequenceFlow id="gw_to_big" sourceRef="gw" targetRef="big">'
        f'<bpmn:conditionExpression>{condition_xml}</bpmn:conditionExpression></bpmn:sequenceFlow>',
    ])


@pytest.mark.parametrize("condition_xml", [
    "<![CDATA[amount > 1000 and\n      status == 'open']]>",
    "<![CDATA[\n  amount > 1000\n  and status == 'open'   # the big open ones\n]]>",
])
def test_a_condition_written_over_several_lines_is_an_expression_not_a_sentence(tmp_path: Path,
                                                                                  condition_xml: str) -> None:
    """A modeler's text box wraps a long condition: it is the Python expression it reads as (in
    parentheses, as Python continues lines), valid for validate and run, never a sentence for a
    model that is not there (the flow silently not taken)."""
    from engine.validate import validate_process

    path = _xor(tmp_path, condition_xml)
    report = validate_process(path)
    assert report.problems == (), [str(p) for p in report.problems]
    for amount, taken in ((5000, "big"), (10, "small")):
        code, doc = _run(tmp_path, "run", str(path), "--data", json.dumps({"amount": amount, "status": "open"}))
        assert code == 0 and doc["error"] is None, doc["error"]
        assert doc["layers"]["L3"]["path"] == taken


@pytest.mark.parametrize(("condition_xml", "python"), [
    ('<![CDATA[amount > 1000 && status == "open"]]>', 'amount > 1000 and status == "open"'),
    ("<![CDATA[amount > 1000 || !approved_before]]>", "amount > 1000 or not approved_before"),
])
def test_a_condition_with_javascript_operators_is_an_error_with_the_python_not_a_sentence(
        tmp_path: Path, condition_xml: str, python: str) -> None:
    from engine.validate import validate_process

    report = validate_process(_xor(tmp_path, condition_xml))
    assert [(p.code, p.severity, p.element_id, p.field) for p in report.problems] == [
        ("condition_syntax", "error", "gw_to_big", "conditionExpression")]
    assert f"write {python!r}" in str(report.problems[0])


def test_a_conditional_catch_false_at_first_fires_once_its_condition_holds(tmp_path: Path) -> None:
    """BPMN's conditional event waits until its condition holds. SpiffWorkflow 3.2 checked it only
    as it became ready: false then, the instance waited for ever whatever changed. Now the wait
    says what it waits for, and a resume after the operator set the key goes on."""
    path = write_elements(tmp_path, "conditional", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="prep"><bpmn:script>ready = False</bpmn:script></bpmn:scriptTask>',
        '<bpmn:intermediateCatchEvent id="until_ready"><bpmn:conditionalEventDefinition>'
        '<bpmn:condition>ready</bpmn:condition></bpmn:conditionalEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:scriptTask id="after"><bpmn:script>done = True</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "prep"), flow("prep", "until_ready"), flow("until_ready", "after"), flow("after", "end"),
    ])
    code, doc = _run(tmp_path, "run", str(path))
    assert code == 3 and doc["status"] == "waiting"
    [item] = doc["waiting_for"]
    assert item["task_id"] == "until_ready" and item["event_kind"] == "conditional" and item["condition"] == "ready"
    code, again = _run(tmp_path, "resume", doc["instance_id"])
    assert code == 3 and again["waiting_for"] == doc["waiting_for"]
    code, done = _run(tmp_path, "resume", doc["instance_id"], "--set", "ready=true")
    assert done["error"] is None, done["error"]
    assert code == 0 and done["status"] == "completed" and done["layers"]["L3"]["done"] is True


def test_a_conditional_catch_is_listed_beside_a_user_task_that_waits_too(tmp_path: Path) -> None:
    """A conditional catch in one parallel branch and a user task in the other: both are what the
    instance waits for (a message catch is listed beside a user task too), and each goes on."""
    path = write_elements(tmp_path, "both", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="prep"><bpmn:script>ready = False</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="split"/>',
        '<bpmn:userTask id="approve"/>',
        '<bpmn:intermediateCatchEvent id="until_ready"><bpmn:conditionalEventDefinition>'
        '<bpmn:condition>ready</bpmn:condition></bpmn:conditionalEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:parallelGateway id="join"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "prep"), flow("prep", "split"), flow("split", "approve"), flow("split", "until_ready"),
        flow("approve", "join"), flow("until_ready", "join"), flow("join", "end"),
    ])
    code, doc = _run(tmp_path, "run", str(path))
    assert code == 3 and doc["status"] == "waiting"
    assert sorted((w["kind"], w["task_id"], w.get("event_kind")) for w in doc["waiting_for"]) == [
        ("event", "until_ready", "conditional"), ("user_task", "approve", None)]
    # the main context waits for its branches: --set names the branch (by its first element's id)
    code, refused = _run(tmp_path, "resume", doc["instance_id"], "--set", "ready=true")
    assert code == 2 and "open branches (approve, until_ready)" in refused["error"]["message"]
    assert "`--context`: a branch id" in refused["error"]["message"]
    code, half = _run(tmp_path, "resume", doc["instance_id"], "--set", "ready=true", "--context", "until_ready")
    assert half["error"] is None, half["error"]
    assert code == 3 and [(w["kind"], w["task_id"]) for w in half["waiting_for"]] == [("user_task", "approve")]
    code, alone = _run(tmp_path, "resume", doc["instance_id"], "--context", "approve")
    assert code == 2 and "give --set KEY=VALUE too" in alone["error"]["message"]
    code, done = _run(tmp_path, "resume", doc["instance_id"], "--answer", 'approve={"ok": true}')
    assert done["error"] is None, done["error"]
    assert code == 0 and done["status"] == "completed"


def test_a_waiting_user_task_says_what_the_person_is_asked(tmp_path: Path) -> None:
    """Its bpmn:documentation and SpiffArena's spiffworkflow:instructionsForEndUser (as written)."""
    path = write_elements(tmp_path, "asked", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:userTask id="approve" name="Approve"><bpmn:documentation>Check the invoice.</bpmn:documentation>'
        '<bpmn:extensionElements><spiffworkflow:instructionsForEndUser>Approve {{amount}}?'
        '</spiffworkflow:instructionsForEndUser></bpmn:extensionElements></bpmn:userTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "approve"), flow("approve", "end"),
    ])
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"amount": 5}')
    [item] = doc["waiting_for"]
    assert code == 3 and (item["name"], item["documentation"], item["instructions"]) == (
        "Approve", "Check the invoice.", "Approve {{amount}}?")
    # the plain summary shows it under the waiting line too: a person at a terminal sees what to answer
    plain = CliRunner().invoke(main, ["resume", doc["instance_id"], "--store", f"sqlite:///{tmp_path / 'shapes.db'}"],
                               catch_exceptions=False)
    lines = plain.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "waiting for user_task" in line)
    assert lines[at + 1:at + 3] == ["    instructions: Approve {{amount}}?", "    documentation: Check the invoice."]


@pytest.mark.parametrize(("association", "field", "verb"), [
    ('<bpmn:property id="Property_1" name="__targetRef_placeholder"/>'
     '<bpmn:dataInputAssociation id="read_crm"><bpmn:sourceRef>crm_store</bpmn:sourceRef>'
     '<bpmn:targetRef>Property_1</bpmn:targetRef></bpmn:dataInputAssociation>', "dataInputAssociation", "reads"),
    ('<bpmn:dataOutputAssociation id="write_crm"><bpmn:targetRef>crm_store</bpmn:targetRef></bpmn:dataOutputAssociation>',
     "dataOutputAssociation", "writes"),
])
def test_a_data_store_drawn_as_camunda_modeler_draws_it_is_refused_naming_task_store_and_fix(
        tmp_path: Path, association: str, field: str, verb: str) -> None:
    """Camunda Modeler and bpmn.io draw a data store as a bpmn:dataStoreReference with no
    bpmn:dataStore. SpiffWorkflow said only "Cannot resolve dataInputAssociation <Element ... at
    0x7f...>"; validate names the task, the store and what to do."""
    from engine.validate import validate_process

    path = write_elements(tmp_path, "crm", [
        '<bpmn:startEvent id="start"/>',
        f'<bpmn:scriptTask id="lookup">{association}<bpmn:script>n = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:dataStoreReference id="crm_store" name="CRM"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "lookup"), flow("lookup", "end"),
    ])
    errors = [p for p in validate_process(path).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field) for p in errors] == [("data_store_unsupported", "lookup", field)]
    text = str(errors[0])
    assert f"{verb} the data store 'CRM' (bpmn:dataStoreReference 'crm_store')" in text
    assert "delete the association" in text and "0x" not in text


def test_an_inclusive_gateway_whose_conditions_leave_a_gap_warns_as_an_exclusive_one_would(tmp_path: Path) -> None:
    """No condition holding and no default flow stops the instance at an inclusive split as at an
    exclusive one ("no condition of its outgoing flows holds"); validate says so before the run."""
    from engine.validate import validate_process

    path = write_elements(tmp_path, "incl_gap", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:inclusiveGateway id="split"/>',
        '<bpmn:scriptTask id="big"><bpmn:script>b = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="small"><bpmn:script>s = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:inclusiveGateway id="join"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "big", "amount > 1000"), flow("split", "small", "amount < 10"),
        flow("big", "join"), flow("small", "join"), flow("join", "end"),
    ])
    report = validate_process(path)
    assert [(p.code, p.severity, p.element_id, p.field) for p in report.problems] == [
        ("gateway_coverage_gap", "warning", "split", "default")]
    assert "10 <= amount <= 1000" in str(report.problems[0])
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"amount": 50}')
    assert code == 1 and doc["error"]["task_id"] == "split"


def test_branches_of_an_exclusive_gateway_joined_in_a_parallel_one_are_named_before_and_when_stuck(
        tmp_path: Path) -> None:
    """A classic modelling slip: validate said the process was valid, and the run stopped with
    "the process neither completed nor waits for anything; check gateways and joins" (task_id null)."""
    from engine.validate import validate_process

    path = write_elements(tmp_path, "xor_and", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:exclusiveGateway id="choose" default="choose_to_b"/>',
        '<bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="b"><bpmn:script>y = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="both"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "choose"), flow("choose", "a", "go_a"), flow("choose", "b"), flow("a", "both"),
        flow("b", "both"), flow("both", "end"),
    ])
    report = validate_process(path)
    assert [(p.code, p.severity, p.element_id) for p in report.problems] == [
        ("join_never_complete", "warning", "both")]
    assert "'choose'" in str(report.problems[0]) and "exclusive gateway instead" in str(report.problems[0])
    code, doc = _run(tmp_path, "run", str(path), "--data", '{"go_a": true}')
    assert code == 1 and doc["status"] == "error" and doc["error"]["task_id"] == "both"
    assert "parallel gateway 'both' waits for 2 incoming flows" in doc["error"]["message"]


def test_a_parallel_split_and_join_and_a_loop_back_are_no_exclusive_join(tmp_path: Path) -> None:
    from engine.validate import validate_process

    path = write_elements(tmp_path, "and_and", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:parallelGateway id="split"/>',
        '<bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="b"><bpmn:script>y = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="both"/>',
        '<bpmn:exclusiveGateway id="again" default="again_to_end"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "a"), flow("split", "b"), flow("a", "both"), flow("b", "both"),
        flow("both", "again"), flow("again", "end"), flow("again", "split", "False"),
    ])
    assert [p.code for p in validate_process(path).problems if p.code == "join_never_complete"] == []


@pytest.mark.parametrize(("condition", "called", "hint"), [
    ("count(items) > 0", "'count'", "len(...)"),
    ('contains(name, "x")', "'contains'", "PART in TEXT"),
])
def test_a_condition_calling_another_languages_function_warns_naming_it_and_the_python(
        tmp_path: Path, condition: str, called: str, hint: str) -> None:
    """FEEL's count() or contains() in a condition passed validate and stopped the run with a NameError."""
    from xml.sax.saxutils import escape

    from engine.validate import validate_process

    report = validate_process(_xor(tmp_path, escape(condition)))
    assert [(p.code, p.severity, p.element_id, p.field) for p in report.problems] == [
        ("condition_unknown_function", "warning", "gw_to_big", "conditionExpression")]
    assert called in str(report.problems[0]) and hint in str(report.problems[0])
    builtin_only = validate_process(_xor(tmp_path, escape("len(items) > 0 and max(items) < 5")))
    assert builtin_only.problems == ()


def test_a_branch_id_yaml_reads_as_a_boolean_says_to_quote_it(tmp_path: Path) -> None:
    """Tasks named yes and no: ``- id: no`` in the config file is False to YAML; the problem said only
    "Input should be a valid string"."""
    from engine.validate import validate_process

    path = write_elements(tmp_path, "yes_no", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        '<bpmn:scriptTask id="yes"><bpmn:script>a = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:scriptTask id="no"><bpmn:script>b = 1</bpmn:script></bpmn:scriptTask>',
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "yes"), flow("split", "no"), flow("yes", "join"), flow("no", "join"),
        flow("join", "end")])
    (tmp_path / "yes_no.layerflow.yaml").write_text(
        "split:\n  branches:\n    - id: no\n      contextInject: {side: b}\n", encoding="utf-8")
    [problem] = validate_process(path).problems
    assert (problem.code, problem.element_id, problem.field) == ("invalid_config_field", "split", "branches.0.id")
    assert "got False" in problem.message and "put the value in quotes" in problem.message


def test_a_completion_condition_on_camundas_counters_warns_and_the_suggested_one_runs(tmp_path: Path) -> None:
    """``nrOfCompletedInstances >= 2`` (Camunda's counter) passed validate and stopped the run with a
    NameError; the warning's ``len(labels) >= 2`` completes after two instances."""
    from engine.validate import validate_process
    from engine_helpers import EXAMPLES

    text = (EXAMPLES / "multi_instance_cardinality.bpmn").read_text(encoding="utf-8")
    anchor = '<bpmn:outputDataItem id="one_label" name="one_label"/>'

    def with_condition(name: str, condition: str) -> Path:
        path = tmp_path / f"{name}.bpmn"
        path.write_text(text.replace(anchor, f"{anchor}<bpmn:completionCondition>{condition}"
                                             "</bpmn:completionCondition>"), encoding="utf-8")
        return path

    [warning] = validate_process(with_condition("camunda", "nrOfCompletedInstances &gt;= 2")).problems
    assert (warning.code, warning.severity, warning.element_id, warning.field) == (
        "condition_camunda_variable", "warning", "label", "completionCondition")
    assert "'nrOfCompletedInstances'" in warning.message and "len(labels)" in warning.message
    fixed = with_condition("python", "len(labels) &gt;= 2")
    assert validate_process(fixed).problems == ()
    code, doc = _run(tmp_path, "run", str(fixed), "--data", '{"copies": 3, "title": "t"}')
    assert code == 0 and doc["layers"]["L3"]["summary"] == "t-1, t-2"


def test_an_error_end_event_nothing_can_catch_warns_that_the_instance_ends_completed(tmp_path: Path) -> None:
    """The run ends with status completed and nothing on the tape says an error was thrown; the
    diagram reads as a failure. validate says so before anyone relies on it."""
    from engine.validate import validate_process

    path = write_elements(tmp_path, "rejects", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:scriptTask id="check"><bpmn:script>ok = False</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="rejected"><bpmn:errorEventDefinition errorRef="rejection"/></bpmn:endEvent>',
        flow("start", "check"), flow("check", "rejected")],
        extra='  <bpmn:error id="rejection" name="Rejected" errorCode="REJ"/>\n')
    [warning] = validate_process(path).problems
    assert (warning.code, warning.severity, warning.element_id) == ("error_end_uncaught", "warning", "rejected")
    assert "'Rejected'" in warning.message and "status completed" in warning.message
    code, doc = _run(tmp_path, "run", str(path))
    assert code == 0 and doc["status"] == "completed"
