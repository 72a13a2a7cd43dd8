"""Business rule tasks run DMN decision tables: given with the BPMN or found beside it, named as
SpiffArena (spiffworkflow:calledDecisionId) or Camunda Modeler (camunda:decisionRef) names them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

from engine import Engine, load_process
from engine.cli import main
from engine.validate import validate_process

from engine_helpers import variables

DMN13 = "https://www.omg.org/spec/DMN/20191111/MODEL/"


def decision(decision_id: str = "risk_decision", *, hit_policy: str = "UNIQUE", extra: str = "") -> str:
    return f'''<?xml version="1.0" encoding="UTF-8"?>
<definitions xmlns="{DMN13}" id="defs_{decision_id}" name="Risk" namespace="http://camunda.org/schema/1.0/dmn">
  <decision id="{decision_id}" name="Risk level">
    <decisionTable id="table_{decision_id}" hitPolicy="{hit_policy}">
      <input id="in_amount" label="Amount">
        <inputExpression id="ie_amount" typeRef="number"><text>amount</text></inputExpression>
      </input>
      <input id="in_industry" label="Industry">
        <inputExpression id="ie_industry" typeRef="string"><text>industry</text></inputExpression>
      </input>
      <output id="out_risk" label="Risk" name="risk_level" typeRef="string"/>
      <output id="out_limit" label="Limit" name="approval_limit" typeRef="number"/>
      <rule id="r_black">
        <inputEntry id="e1"><text>-</text></inputEntry>
        <inputEntry id="e2"><text>"gambling"</text></inputEntry>
        <outputEntry id="o1"><text>"high"</text></outputEntry>
        <outputEntry id="o2"><text>0</text></outputEntry>
      </rule>
      <rule id="r_low">
        <inputEntry id="e3"><text>&lt; 50000</text></inputEntry>
        <inputEntry id="e4"><text>!= "gambling"</text></inputEntry>
        <outputEntry id="o3"><text>"low"</text></outputEntry>
        <outputEntry id="o4"><text>50000</text></outputEntry>
      </rule>
      <rule id="r_medium">
        <inputEntry id="e5"><text>&gt;= 50000</text></inputEntry>
        <inputEntry id="e6"><text>!= "gambling"</text></inputEntry>
        <outputEntry id="o5"><text>"medium"</text></outputEntry>
        <outputEntry id="o6"><text>200000</text></outputEntry>
      </rule>
    </decisionTable>
  </decision>{extra}
</definitions>
'''


SPIFF_REF = ('<bpmn:extensionElements><spiffworkflow:calledDecisionId>{ref}</spiffworkflow:calledDecisionId>'
             '</bpmn:extensionElements>')


def process(rule_task: str, *, then: str = '<bpmn:scriptTask id="after"><bpmn:script>'
            'msg = f"{risk_level} risk, limit {approval_limit}"</bpmn:script></bpmn:scriptTask>') -> str:
    return f'''<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
    xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="defs" targetNamespace="http://bpmn.io/schema/bpmn">
  <bpmn:process id="credit" isExecutable="true">
    <bpmn:startEvent id="start"/>
    {rule_task}
    {then}
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="decide"/>
    <bpmn:sequenceFlow id="f2" sourceRef="decide" targetRef="after"/>
    <bpmn:sequenceFlow id="f3" sourceRef="after" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
'''


def spiff_task(ref: str = "risk_decision") -> str:
    return f'<bpmn:businessRuleTask id="decide" name="Decide risk">{SPIFF_REF.format(ref=ref)}</bpmn:businessRuleTask>'


def write(tmp_path: Path, bpmn: str, dmn: str | None = decision(), *, dmn_name: str = "risk.dmn") -> Path:
    path = tmp_path / "credit.bpmn"
    path.write_text(bpmn, encoding="utf-8")
    if dmn is not None:
        (tmp_path / dmn_name).write_text(dmn, encoding="utf-8")
    return path


def plain(bpmn: Path, dmn: Path, data: dict[str, Any]) -> dict[str, Any]:
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(bpmn))
    parser.add_dmn_file(str(dmn))
    wf = BpmnWorkflow(parser.get_spec("credit"))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    assert wf.is_completed()
    return dict(wf.last_task.data)


@pytest.mark.parametrize("data", [
    {"amount": 20000, "industry": "bakery"},
    {"amount": 120000, "industry": "logistics"},
    {"amount": 1000, "industry": "gambling"},
])
def test_a_decision_table_gives_the_same_outputs_as_under_plain_spiffworkflow(tmp_path: Path, data: dict) -> None:
    path = write(tmp_path, process(spiff_task()))
    expected = plain(path, tmp_path / "risk.dmn", data)
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path, tmp_path / "risk.dmn"]), data))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == expected
    # the outputs are the activity's writes: on the tape, in HISTORY with its record
    record = instance.main.layer(3)["activity:decide"]
    assert sorted(record["keys"]) == ["approval_limit", "risk_level"]


def test_a_camunda_decision_ref_runs_and_the_dmn_beside_the_process_is_found(tmp_path: Path) -> None:
    """Camunda Modeler names the decision in camunda:decisionRef; the .dmn lies beside the .bpmn
    (as SpiffArena and Camunda projects keep them) and is not named on the command line."""
    path = write(tmp_path, process('<bpmn:businessRuleTask id="decide" camunda:decisionRef="risk_decision"/>'))
    (tmp_path / "unrelated.dmn").write_text(decision("other_decision"), encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(path), "--data", json.dumps({"amount": 120000, "industry": "retail"}),
                                       "--store", "memory://", "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert doc["error"] is None, doc["error"]
    assert result.exit_code == 0 and doc["status"] == "completed"
    assert doc["layers"]["L3"]["risk_level"] == "medium" and doc["layers"]["L3"]["msg"] == "medium risk, limit 200000"


def test_a_dmn_file_given_from_another_folder_is_used(tmp_path: Path) -> None:
    (tmp_path / "rules").mkdir()
    path = write(tmp_path, process(spiff_task()), None)
    (tmp_path / "rules" / "risk.dmn").write_text(decision(), encoding="utf-8")
    result = CliRunner().invoke(main, ["run", str(path), str(tmp_path / "rules" / "risk.dmn"), "--data",
                                       json.dumps({"amount": 20000, "industry": "bakery"}), "--store", "memory://",
                                       "--json"], catch_exceptions=False)
    doc = json.loads(result.stdout)
    assert result.exit_code == 0 and doc["layers"]["L3"]["risk_level"] == "low", doc["error"]


def test_an_instance_saved_after_its_decision_resumes_in_a_new_engine(tmp_path: Path) -> None:
    """The decision table travels in the saved workflow: resumed from the store (a new engine,
    the DMN file gone), the instance goes on with what the decision wrote."""
    path = write(tmp_path, process(spiff_task(), then='<bpmn:userTask id="after"/>'))
    store = f"sqlite:///{tmp_path / 'dmn.db'}"
    engine = Engine(store=store)
    instance = engine.run(engine.start(load_process(path), {"amount": 20000, "industry": "bakery"}))
    assert instance.status == "waiting" and instance.main.resolve("risk_level") == "low"
    (tmp_path / "risk.dmn").unlink()
    again = Engine(store=store)
    resumed = again.load(instance.id)
    resumed = again.complete_user_task(resumed, "after", {"signed": True})
    assert resumed.status == "completed", resumed.error
    assert resumed.main.resolve("approval_limit") == 50000 and resumed.main.resolve("signed") is True


def test_a_business_rule_task_run_by_a_handler_needs_no_decision(tmp_path: Path) -> None:
    path = write(tmp_path, process('<bpmn:businessRuleTask id="decide"/>'), None)
    (tmp_path / "credit.layerflow.yaml").write_text("decide:\n  handler: rules.py:decide\n", encoding="utf-8")
    (tmp_path / "rules.py").write_text("def decide(ctx):\n    return {'risk_level': 'low', 'approval_limit': 1}\n",
                                       encoding="utf-8")
    assert validate_process(path).ok
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process(path), {"amount": 1, "industry": "x"}))
    assert instance.status == "completed", instance.error
    assert instance.main.resolve("msg") == "low risk, limit 1"


def _problems(path: Path, *more: Path) -> list[tuple[str, str | None, str | None]]:
    report = validate_process([path, *more])
    return [(p.code, Path(p.file).name if p.file else None, p.element_id) for p in report.problems
            if p.severity == "error"]


def test_a_decision_nobody_gives_is_named_with_what_to_do(tmp_path: Path) -> None:
    path = write(tmp_path, process(spiff_task("credit_limits")))
    [problem] = validate_process(path).problems
    assert (problem.code, problem.element_id, problem.field, problem.line) == (
        "business_rule_without_dmn", "decide", "calledDecisionId", 7)
    assert "decision 'credit_limits'" in problem.message and "DECISION.dmn" in problem.message
    result = CliRunner().invoke(main, ["run", str(path), "--store", "memory://", "--json"], catch_exceptions=False)
    assert result.exit_code == 2 and "credit_limits" in json.loads(result.stdout)["error"]["message"]


def test_a_business_rule_task_naming_no_decision_and_no_handler_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, process('<bpmn:businessRuleTask id="decide"/>'), None)
    [problem] = validate_process(path).problems
    assert (problem.code, problem.element_id) == ("business_rule_without_dmn", "decide")
    assert "names no DMN decision" in problem.message and "calledDecisionId" in problem.message


@pytest.mark.parametrize(("dmn_text", "code", "where"), [
    (decision().replace("</decision>", "</decisio>"), "xml_malformed", None),
    (decision().replace(DMN13, "http://example.com/not-dmn"), "dmn_namespace", None),
    (decision(extra='\n  <decision id="second"><decisionTable id="t2"/></decision>'), "dmn_unsupported", "second"),
    (decision().replace('<decisionTable id="table_risk_decision" hitPolicy="UNIQUE">', '<literalExpression>')
     .replace("</decisionTable>", "</literalExpression>"), "dmn_unsupported", "risk_decision"),
    (decision(hit_policy="RULE ORDER"), "dmn_unsupported", "risk_decision"),  # FIRST runs: test_realworld_shapes
    # FEEL that SpiffWorkflow's Python-based DMN engine cannot run: a range, a negation, an output
    (decision().replace("&lt; 50000", "[0..50000["), "dmn_unsupported", "e3"),
    (decision().replace('!= "gambling"', 'not("gambling")', 1), "dmn_unsupported", "e4"),
    (decision().replace('<text>"medium"</text>', "<text>if amount then</text>"), "dmn_unsupported", "o5"),
])
def test_a_dmn_file_the_engine_cannot_run_is_named_with_its_line(tmp_path: Path, dmn_text: str, code: str,
                                                                   where: str | None) -> None:
    path = write(tmp_path, process(spiff_task()), dmn_text)
    report = validate_process([path, tmp_path / "risk.dmn"])
    found = [p for p in report.problems if p.code == code]
    assert found, report.problems
    assert found[0].file == str(tmp_path / "risk.dmn") and found[0].line is not None
    assert found[0].element_id == where
    assert not report.ok


def test_a_test_of_the_input_written_with_a_question_mark_runs(tmp_path: Path) -> None:
    """``0 <= ? < 50000``: SpiffWorkflow's DMN engine reads ``?`` as the input's value."""
    path = write(tmp_path, process(spiff_task()), decision().replace("&lt; 50000", "0 &lt;= ? &lt; 50000"))
    assert validate_process(path).ok
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process(path), {"amount": 20000, "industry": "bakery"}))
    assert instance.status == "completed" and instance.main.resolve("risk_level") == "low", instance.error


def test_only_dmn_files_given_is_bad_input(tmp_path: Path) -> None:
    write(tmp_path, process(spiff_task()))
    with pytest.raises(Exception, match="only DMN files given"):
        load_process(tmp_path / "risk.dmn")
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "risk.dmn")])
    assert result.exit_code == 2 and "only DMN files given" in result.output


def test_the_loan_examples_are_unchanged_by_a_dmn_file_nobody_names(tmp_path: Path) -> None:
    """A .dmn beside a process without business rule tasks is not loaded (nothing needs it)."""
    from engine_helpers import LOAN

    examples = tmp_path / "examples"
    shutil.copytree(LOAN.parent, examples)
    (examples / "broken.dmn").write_text("<not-xml", encoding="utf-8")
    report = validate_process(examples / LOAN.name)
    assert report.ok, report.problems
    assert load_process(examples / LOAN.name).paths == (str(examples / LOAN.name),)


# ----- the decision's result in one variable (Camunda 7's camunda:resultVariable, Camunda 8's
# zeebe:calledDecision resultVariable) ------------------------------------------------------------

ZEEBE_NS = "http://camunda.org/schema/zeebe/1.0"


def one_output_decision(decision_id: str = "risk_decision", *, hit_policy: str = "UNIQUE") -> str:
    """``decision()`` with the risk level as its only output."""
    text = decision(decision_id, hit_policy=hit_policy)
    text = text.replace('      <output id="out_limit" label="Limit" name="approval_limit" typeRef="number"/>\n', "")
    for entry in ("o2", "o4", "o6"):
        text = "\n".join(line for line in text.splitlines() if f'id="{entry}"' not in line) + "\n"
    return text


def camunda7_task(attributes: str) -> str:
    return f'<bpmn:businessRuleTask id="decide" camunda:decisionRef="risk_decision" {attributes}/>'


def zeebe_task(result_variable: str | None = "risk", decision_id: str = "risk_decision") -> str:
    result = f' resultVariable="{result_variable}"' if result_variable is not None else ""
    return (f'<bpmn:businessRuleTask id="decide"><bpmn:extensionElements><zeebe:calledDecision '
            f'decisionId="{decision_id}"{result}/></bpmn:extensionElements></bpmn:businessRuleTask>')


def zeebe_process(rule_task: str, then: str = '<bpmn:scriptTask id="after"><bpmn:script>seen = risk'
                  '</bpmn:script></bpmn:scriptTask>') -> str:
    return process(rule_task, then=then).replace('xmlns:camunda=', f'xmlns:zeebe="{ZEEBE_NS}" xmlns:camunda=')


def run_json(path: Path, data: dict[str, Any], *more: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["run", str(path), *more, "--data", json.dumps(data), "--store", "memory://",
                                       "--json"], catch_exceptions=False)
    return result.exit_code, json.loads(result.stdout)


AFTER = '<bpmn:scriptTask id="after"><bpmn:script>seen = risk</bpmn:script></bpmn:scriptTask>'
MEDIUM = {"amount": 120000, "industry": "retail"}
BOTH = {"risk_level": "medium", "approval_limit": 200000}


@pytest.mark.parametrize(("rule_task", "dmn_text", "expected"), [
    # Camunda 7: camunda:mapDecisionResult says what the variable holds; resultList is its default
    (camunda7_task('camunda:resultVariable="risk"'), decision(), [BOTH]),
    (camunda7_task('camunda:resultVariable="risk" camunda:mapDecisionResult="resultList"'), decision(), [BOTH]),
    (camunda7_task('camunda:resultVariable="risk" camunda:mapDecisionResult="singleResult"'), decision(), BOTH),
    (camunda7_task('camunda:resultVariable="risk" camunda:mapDecisionResult="singleEntry"'),
     one_output_decision(), "medium"),
    (camunda7_task('camunda:resultVariable="risk" camunda:mapDecisionResult="collectEntries"'),
     one_output_decision(), ["medium"]),
    # Camunda 8: the decision's output: a single output's value, or a dict of the outputs
    (zeebe_task(), one_output_decision(), "medium"),
    (zeebe_task(), decision(), BOTH),
])
def test_the_decision_result_lands_in_the_result_variable(tmp_path: Path, rule_task: str, dmn_text: str,
                                                          expected: Any) -> None:
    path = write(tmp_path, zeebe_process(rule_task), dmn_text)
    assert validate_process(path).ok, validate_process(path).problems
    code, doc = run_json(path, MEDIUM)
    assert (code, doc["status"], doc["error"]) == (0, "completed", None)
    history = doc["layers"]["L3"]
    assert history["risk"] == expected and history["seen"] == expected
    # as in Camunda, the result variable is what the task writes: the outputs are no keys of their own
    assert "risk_level" not in history and "approval_limit" not in history
    assert sorted(history["activity:decide"]["keys"]) == ["risk"]


@pytest.mark.parametrize(("rule_task", "data", "expected"), [
    # no rule matches: Camunda 8 and Camunda 7's single mappings give null, the lists are empty
    (zeebe_task(), {"amount": None, "industry": "retail"}, None),
    (camunda7_task('camunda:resultVariable="risk" camunda:mapDecisionResult="singleEntry"'),
     {"amount": None, "industry": "retail"}, None),
    (camunda7_task('camunda:resultVariable="risk"'), {"amount": None, "industry": "retail"}, []),
])
def test_a_decision_no_rule_of_which_matches_gives_null_or_an_empty_list(tmp_path: Path, rule_task: str,
                                                                         data: dict, expected: Any) -> None:
    path = write(tmp_path, zeebe_process(rule_task), one_output_decision()
                 .replace("<text>&lt; 50000</text>", "<text>? is not None and ? &lt; 50000</text>")
                 .replace("<text>&gt;= 50000</text>", "<text>? is not None and ? &gt;= 50000</text>"))
    code, doc = run_json(path, data)
    assert (code, doc["error"]) == (0, None)
    assert doc["layers"]["L3"]["risk"] == expected


def test_a_collect_table_gives_a_list_in_the_result_variable(tmp_path: Path) -> None:
    """Camunda 8: a multiple-hit table's result is the list of its matched rules' outputs."""
    dmn_text = one_output_decision(hit_policy="COLLECT").replace('<text>!= "gambling"</text>', "<text>-</text>")
    path = write(tmp_path, zeebe_process(zeebe_task()), dmn_text)
    code, doc = run_json(path, {"amount": 20000, "industry": "gambling"})
    assert (code, doc["error"]) == (0, None)
    assert doc["layers"]["L3"]["risk"] == ["high", "low"]


def test_a_single_entry_of_a_table_with_two_outputs_is_an_error_naming_the_task(tmp_path: Path) -> None:
    path = write(tmp_path, zeebe_process(camunda7_task('camunda:resultVariable="risk" '
                                                       'camunda:mapDecisionResult="singleEntry"')))
    code, doc = run_json(path, MEDIUM)
    assert (code, doc["status"]) == (1, "error")
    message = doc["error"]["message"]
    assert doc["error"]["task_id"] == "decide"
    assert "singleEntry" in message and "approval_limit" in message and "singleResult" in message


def test_an_unknown_map_decision_result_is_refused_by_validate(tmp_path: Path) -> None:
    path = write(tmp_path, zeebe_process(camunda7_task('camunda:resultVariable="risk" '
                                                       'camunda:mapDecisionResult="firstEntry"')))
    problems = [p for p in validate_process(path).problems if p.severity == "error"]
    assert [(p.code, p.element_id, p.field) for p in problems] == [
        ("dmn_result_mapping", "decide", "camunda:mapDecisionResult")]
    assert "'firstEntry'" in problems[0].message and "singleEntry" in problems[0].message
    code, doc = run_json(path, MEDIUM)
    assert code == 2 and "firstEntry" in doc["error"]["message"]


def test_a_zeebe_called_decision_is_the_decision_reference(tmp_path: Path) -> None:
    """Camunda 8's zeebe:calledDecision names the decision (found beside the process); with no
    resultVariable the outputs are keys of their own, as for SpiffArena's calledDecisionId."""
    path = write(tmp_path, zeebe_process(zeebe_task(None), then=AFTER.replace("seen = risk", "seen = risk_level")))
    report = validate_process(path)
    assert report.ok and not report.problems, report.problems
    code, doc = run_json(path, MEDIUM)
    assert (code, doc["error"]) == (0, None)
    assert doc["layers"]["L3"]["risk_level"] == "medium" and doc["layers"]["L3"]["seen"] == "medium"


def test_a_zeebe_decision_nobody_gives_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, zeebe_process(zeebe_task(decision_id="credit_limits")))
    [problem] = [p for p in validate_process(path).problems if p.severity == "error"]
    assert (problem.code, problem.element_id) == ("business_rule_without_dmn", "decide")
    assert "'credit_limits'" in problem.message


def test_a_camunda_result_variable_is_no_warning_any_more(tmp_path: Path) -> None:
    path = write(tmp_path, zeebe_process(camunda7_task('camunda:resultVariable="risk"')))
    assert not validate_process(path).problems


def test_the_result_variable_survives_a_save_and_a_new_engine(tmp_path: Path) -> None:
    path = write(tmp_path, zeebe_process(zeebe_task(), then='<bpmn:userTask id="after"/>'), one_output_decision())
    store = f"sqlite:///{tmp_path / 'dmn.db'}"
    engine = Engine(store=store)
    instance = engine.run(engine.start(load_process(path), MEDIUM))
    assert instance.status == "waiting" and instance.main.resolve("risk") == "medium"
    again = Engine(store=store)
    resumed = again.load(instance.id)
    spec = next(t.task_spec for t in resumed.workflow.get_tasks() if t.task_spec.name == "decide")
    assert (spec.result_variable, spec.result_mapping) == ("risk", "decision")


@pytest.mark.parametrize("rule_task", [zeebe_task("policy"), camunda7_task('camunda:resultVariable="policy"')])
def test_a_result_variable_the_config_fixes_in_system_is_refused_by_validate(tmp_path: Path, rule_task: str) -> None:
    """SYSTEM is never writable by activities: a result variable named like a key of the config's
    system: would stop the instance at the task; validate says so before it runs."""
    path = write(tmp_path, zeebe_process(rule_task).replace("seen = risk", "seen = policy"))
    (tmp_path / "credit.layerflow.yaml").write_text("system:\n  policy: strict\n")
    problems = [p for p in validate_process(path).problems if p.severity == "error"]
    assert [(p.code, p.element_id) for p in problems] == [("dmn_result_variable", "decide")]
    assert "'policy'" in problems[0].message and "SYSTEM" in problems[0].message
    assert "resultVariable" in problems[0].message


def test_a_result_variable_the_process_fixed_stops_the_run_naming_the_result_variable(tmp_path: Path) -> None:
    """A result variable named like a PROCESS key (the data the instance started with) is refused by
    the layer rules: the error names the task, the result variable and what to do."""
    path = write(tmp_path, zeebe_process(zeebe_task("amount"), then=AFTER.replace("risk", "amount")),
                 one_output_decision())
    code, doc = run_json(path, MEDIUM)
    assert (code, doc["status"]) == (1, "error")
    error = doc["error"]
    assert error["task_id"] == "decide" and error["kind"] == "permission_denied"
    assert "result variable 'amount'" in error["message"] and "L1" in error["message"]
    assert "name another result variable" in error["message"]
    assert doc["layers"]["L1"]["amount"] == 120000
