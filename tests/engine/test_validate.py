"""validate_process: every error class, its location and its advice; all problems at once."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from context_layers.errors import ProcessError
from engine.validate import (
    BPMN_NS,
    ValidationReport,
    format_report,
    raise_for_problems,
    read_extension_configs,
    validate_process,
)

FIXTURES = Path(__file__).parent / "fixtures" / "validate"


def fixture_line(name: str, needle: str) -> int:
    """1-based line of the first line of a fixture that contains ``needle``."""
    for number, line in enumerate((FIXTURES / name).read_text().splitlines(), start=1):
        if needle in line:
            return number
    raise AssertionError(f"{needle!r} not in {name}")


@dataclass(frozen=True)
class Case:
    id: str
    bpmn: str
    code: str
    at: tuple[str, str] | None  # (fixture holding the problem, text on its line); None: no line
    element_id: str | None
    field: str | None
    says: tuple[str, ...]  # fragments the printed problem must contain (what is wrong, what to do)
    config: str | None = None
    process_id: str | None = None
    severity: str = "error"
    column: int | None = None


CASES = [
    # (a) malformed XML: file, line and column from the parser
    Case("xml_malformed", "malformed.bpmn", "xml_malformed", ("malformed.bpmn", "</bpmn:process>"), None, None,
         ("not well-formed XML", "tag mismatch: task line 8"), column=18),
    # (b) wrong namespace: which one was found, which one is expected
    Case("bpmn_namespace", "wrong_namespace.bpmn", "bpmn_namespace", ("wrong_namespace.bpmn", 'id="defs"'), None,
         "xmlns", ("'http://www.omg.org/spec/BPMN/20100524/MODEL/'", f"requires namespace {BPMN_NS!r}")),
    # (c) no executable process: names the process and the attribute to set
    Case("no_executable_process", "not_executable.bpmn", "no_executable_process",
         ("not_executable.bpmn", 'id="draft_process"'), "draft_process", "isExecutable",
         ("process 'draft_process' has isExecutable='false'", 'set isExecutable="true"')),
    # (d) process id given but absent: lists the ones present
    Case("process_not_found", "valid.bpmn", "process_not_found", None, None, "process_id",
         ("process 'loan_aproval' is not in", "did you mean 'loan_approval'", "processes present: 'loan_approval'"),
         process_id="loan_aproval"),
    Case("process_not_found_in_config", "valid.bpmn", "process_not_found",
         ("process_id.layerflow.yaml", "process_id:"), None, "process_id",
         ("did you mean 'loan_approval'", "set process.process_id in the config file"),
         config="process_id.layerflow.yaml"),
    # (e) config for an id that does not exist: close ids suggested
    Case("unknown_element_id", "valid.bpmn", "unknown_element_id", ("unknown_id.layerflow.yaml", "risk_assesment:"),
         "risk_assesment", None,
         ("config for an id that does not exist in process 'loan_approval' (did you mean 'risk_assessment'?)",
          "fix the id or remove the entry"), config="unknown_id.layerflow.yaml"),
    Case("config_not_a_flow_node", "valid.bpmn", "config_not_a_flow_node", ("flow_config.layerflow.yaml", "f_fast:"),
         "f_fast", None, ("'f_fast' is a bpmn:sequenceFlow", "gateway's branches"), config="flow_config.layerflow.yaml"),
    # (f) invalid config fields: in the config file, in an extension element, invalid JSON
    Case("invalid_config_field_file", "valid.bpmn", "invalid_config_field",
         ("bad_fields.layerflow.yaml", "compressTokenThreshold:"), "risk_assessment",
         "contextStrategy.compressTokenThreshold", ("Input should be greater than 0", "correct this value"),
         config="bad_fields.layerflow.yaml"),
    Case("invalid_config_field_extension", "bad_extension_field.bpmn", "invalid_config_field",
         ("bad_extension_field.bpmn", "spiffworkflow:activityConfig"), "join", "mergeStrategy",
         ("Input should be 'MERGE_WITH_CONFLICT_DETECT'",)),
    Case("invalid_config_json", "bad_extension_json.bpmn", "invalid_config_json",
         ("bad_extension_json.bpmn", '"preserveKeys": ["risk_level",]'), "risk_assessment", None,
         ("<layerflow:config> is not valid JSON", "no trailing commas"), column=41),
    Case("config_misplaced", "config_misplaced.bpmn", "config_misplaced", ("config_misplaced.bpmn", "<layerflow:config>"),
         "x", None, ("inside the <bpmn:extensionElements>",)),
    # (g) exclusive gateways without a default flow
    Case("gateway_coverage_gap", "gateway_gap.bpmn", "gateway_coverage_gap", ("gateway_gap.bpmn", 'id="decide"'),
         "decide", "default", ("conditions do not cover x == 5", "add a default flow")),
    Case("gateway_not_exhaustive", "gateway_equality.bpmn", "gateway_not_exhaustive",
         ("gateway_equality.bpmn", 'id="decide"'), "decide", "default",
         ("only handle decision == 'approve', decision == 'reject': not exhaustive", "add a default flow"),
         severity="warning"),  # the variable may never take another value: a warning, the process runs
    Case("gateway_flow_without_condition", "gateway_no_condition.bpmn", "gateway_flow_without_condition",
         ("gateway_no_condition.bpmn", 'id="f_b"'), "f_b", "conditionExpression",
         ("flow 'f_b' of gateway 'decide' (to 'b') has no condition", 'set default="f_b"')),
    Case("gateway_default_invalid", "gateway_bad_default.bpmn", "gateway_default_invalid",
         ("gateway_bad_default.bpmn", 'id="decide"'), "decide", "default",
         ("default='f_c' is not an outgoing flow", "outgoing flows: 'f_a', 'f_b'")),
    Case("condition_syntax", "condition_syntax.bpmn", "condition_syntax", ("condition_syntax.bpmn", "amount &gt; = 5"),
         "f_a", "conditionExpression", ("condition is not valid Python", "'amount > = 5'")),
    Case("condition_syntax_multiline_inclusive", "inclusive_condition_syntax.bpmn", "condition_syntax",
         ("inclusive_condition_syntax.bpmn", "amount &gt; 10000 and"), "f_fraud", "conditionExpression",
         ("condition is not valid Python", "'amount > 10000 and'")),
    Case("script_syntax", "script_syntax.bpmn", "script_syntax", ("script_syntax.bpmn", "total = amount +"),
         "x", "script", ("script is not valid Python", "'total = amount +'")),
    Case("script_indented", "script_indented.bpmn", "script_syntax", ("script_indented.bpmn", "total = 1"),
         "x", "script", ("unexpected indent", "start top-level lines at column 0")),
    # (h) gateway branches that no outgoing flow targets
    Case("branch_not_outgoing", "valid.bpmn", "branch_not_outgoing", ("bad_branch.layerflow.yaml", "- id: fast_trak"),
         "route", "branches.1.id",
         ("branch 'fast_trak' is not the target of an outgoing flow of gateway 'route' (did you mean 'fast_track'?)",
          "lead to 'fast_track', 'full_review'"), config="bad_branch.layerflow.yaml"),
    Case("branches_on_non_gateway", "valid.bpmn", "branches_on_non_gateway",
         ("branches_on_task.layerflow.yaml", "branches:"), "fast_track", "branches",
         ("'fast_track' is a bpmn:task", "move them to the gateway"), config="branches_on_task.layerflow.yaml"),
    Case("branch_priority_unknown_id", "valid.bpmn", "branch_priority_unknown_id",
         ("branch_priority.layerflow.yaml", "branchPriority:"), "merge", "branchPriority.1",
         ("'fast_trak'", "did you mean 'fast_track'"), config="branch_priority.layerflow.yaml"),
    # a policy rule the join could not evaluate: validate said "valid", the join stopped the instance
    Case("policy_rule_expression", "valid.bpmn", "policy_rule_expression",
         ("policy_rule.layerflow.yaml", 'when: "amount >"'), "merge", "conflictPolicy.rules.1.when",
         ("conflictPolicy rule 1 (key 'approval_status')", "syntax error", "write a Python expression"),
         config="policy_rule.layerflow.yaml"),
    # a retrieval query that is no template went out as written, braces and all, with no word from validate
    Case("knowledge_query_template", "valid.bpmn", "knowledge_query_template",
         ("query_template.layerflow.yaml", "query:"), "risk_assessment", "knowledgeConfig.query",
         ("'risk rules for {industry'", "is not a template", "write {key}"), config="query_template.layerflow.yaml",
         severity="warning"),
    # references SpiffWorkflow would report crudely or not at all
    Case("flow_ref_unknown", "flow_ref_unknown.bpmn", "flow_ref_unknown", ("flow_ref_unknown.bpmn", 'id="f_lost"'),
         "f_lost", "targetRef", ("targetRef='archive'", "point it at an existing element")),
    Case("call_activity_unknown_process", "call_unknown.bpmn", "call_activity_unknown_process",
         ("call_unknown.bpmn", "calledElement"), "x", "calledElement",
         ("calledElement='credit_check' is no process of", "add the BPMN file that defines it")),
    Case("duplicate_id", "duplicate_id.bpmn", "duplicate_id", ("duplicate_id.bpmn", '<bpmn:task id="x"/>\n'), "x", None,
         ("id 'x' is used twice in this file (first on line 9)",)),
    # (i) SpiffWorkflow's own parser, last
    Case("no_start_event", "no_start_event.bpmn", "no_start_event", ("no_start_event.bpmn", '<bpmn:subProcess id="x">'),
         "x", None, ("bpmn:subProcess 'x' has no start event", "draw a bpmn:startEvent in it", "to 'inner'")),
    Case("spiff_validation", "spiff_rejects.bpmn", "spiff_validation", ("spiff_rejects.bpmn", '<bpmn:task id="x">'),
         "x", None, ("SpiffWorkflow cannot load the process", "must specify a cardinality or a loop input")),
    # warnings: reported, but the process is still ok
    Case("process_executable_unset", "executable_unset.bpmn", "process_executable_unset",
         ("executable_unset.bpmn", 'id="unset"'), "unset", "isExecutable", ('add isExecutable="true"',),
         severity="warning"),
    Case("config_namespace", "config_namespace.bpmn", "config_namespace", ("config_namespace.bpmn", "<lf:config"), "x",
         None, ("'http://layerflow.dev/bpmn' is ignored", "'https://layerflow.dev/bpmn'"), severity="warning"),
    Case("bpmn_schema", "schema_warning.bpmn", "bpmn_schema",
         ("schema_warning.bpmn", "documentation after extensionElements"), None, None,
         ("BPMN 2.0 schema", "'bpmn:documentation': This element is not expected"), severity="warning"),
]


def _line(at: tuple[str, str]) -> int:
    name, needle = at
    if needle.endswith("\n"):  # the second line holding the text
        lines = (FIXTURES / name).read_text().splitlines()
        hits = [i for i, line in enumerate(lines, start=1) if needle.strip() in line]
        return hits[1]
    return fixture_line(name, needle)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_each_problem_class_names_file_line_element_field_and_what_to_do(case: Case) -> None:
    report = validate_process(
        FIXTURES / case.bpmn,
        config_path=FIXTURES / case.config if case.config else None,
        process_id=case.process_id,
        discover_config=False,
    )
    # Exactly the one problem the fixture was made for: nothing duplicated by SpiffWorkflow's check.
    assert [p.code for p in report.problems] == [case.code], format_report(report)
    problem = report.problems[0]
    expected_file = FIXTURES / (case.at[0] if case.at else case.bpmn)
    assert problem.file == str(expected_file)
    assert problem.line == (_line(case.at) if case.at else None)
    assert problem.column == case.column
    assert problem.element_id == case.element_id
    assert problem.field == case.field
    assert problem.severity == case.severity
    assert report.ok is (case.severity == "warning")

    text = str(problem)
    location = f"{expected_file}:{problem.line}" if problem.line else f"{expected_file}:"
    assert text.startswith(location)
    if case.element_id:
        assert f"element {case.element_id!r}" in text
    if case.field:
        assert f"field {case.field!r}" in text
    for fragment in case.says:
        assert fragment in text, text


def test_missing_bpmn_file_is_a_problem_not_an_exception(tmp_path: Path) -> None:
    report = validate_process(tmp_path / "nope.bpmn")
    assert [p.code for p in report.problems] == ["bpmn_file_not_found"]
    assert str(report.problems[0]).startswith(f"{tmp_path / 'nope.bpmn'}: cannot read BPMN file")


def test_valid_process_with_config_beside_it_has_no_problems() -> None:
    report = validate_process(FIXTURES / "valid.bpmn")
    assert report.problems == ()
    assert report.ok
    assert report.process_id == "loan_approval"
    assert report.config_path == FIXTURES / "valid.layerflow.yaml"
    assert report.config is not None and report.config.system["policy"].startswith("Loans over")
    # The effective config: extension elements, then the config file over them.
    configs = report.element_configs
    assert set(configs) == {"risk_assessment", "route", "full_review"}
    assert configs["risk_assessment"].effective_preserve_keys == ["risk_level", "assessment_id"]
    assert configs["risk_assessment"].effective_token_threshold == 2000
    assert [b.id for b in configs["route"].branches] == ["fast_track", "full_review"]
    assert configs["full_review"].human_confirm is not None and configs["full_review"].human_confirm.timeout == 60
    assert format_report(report).endswith("valid.bpmn: process 'loan_approval' is valid")
    raise_for_problems(report)  # does not raise


def test_a_valid_process_also_loads_in_spiffworkflow() -> None:
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(FIXTURES / "valid.bpmn"))
    spec = parser.get_spec("loan_approval")
    assert {"risk_assessment", "route", "fast_track", "full_review"} <= set(spec.task_specs)


def test_several_problems_in_one_file_are_all_reported() -> None:
    report = validate_process(FIXTURES / "many_problems.bpmn")
    bpmn, cfg = "many_problems.bpmn", "many_problems.layerflow.yaml"
    found = {(p.code, Path(p.file or "").name, p.line, p.element_id, p.field) for p in report.problems}
    assert found == {
        ("invalid_config_json", bpmn, fixture_line(bpmn, "<layerflow:config>"), "triage", None),
        ("script_syntax", bpmn, fixture_line(bpmn, "severity = = 3"), "triage", "script"),
        ("gateway_coverage_gap", bpmn, fixture_line(bpmn, 'id="by_severity"'), "by_severity", "default"),
        ("gateway_flow_without_condition", bpmn, fixture_line(bpmn, 'id="f_other"'), "f_other", "conditionExpression"),
        ("unknown_element_id", cfg, fixture_line(cfg, "triag:"), "triag", None),
        ("invalid_config_field", cfg, fixture_line(cfg, "timeout: 0"), "escalate", "humanConfirm.timeout"),
        ("branch_not_outgoing", cfg, fixture_line(cfg, "- id: escalation"), "by_severity", "branches.0.id"),
    }
    assert not report.ok
    gap = next(p for p in report.problems if p.code == "gateway_coverage_gap")
    assert "do not cover 2 < severity <= 3" in gap.message
    # Sorted: the BPMN file first, by line, then the config file.
    assert [Path(p.file or "").name for p in report.problems] == [bpmn] * 4 + [cfg] * 3
    lines = format_report(report).splitlines()
    assert len(lines) == 8 and lines[-1].endswith("7 errors; nothing runs until they are fixed")


@pytest.mark.parametrize("process_id", [None, "draft"])
def test_a_process_that_is_not_executable_has_its_other_problems_reported_too(tmp_path: Path,
                                                                               process_id: str | None) -> None:
    """Making it executable must not reveal a second round of errors: all at once."""
    path = tmp_path / "draft.bpmn"
    path.write_text(f"""<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="{BPMN_NS}" id="defs" targetNamespace="t">
  <bpmn:process id="draft" isExecutable="false">
    <bpmn:startEvent id="start"/>
    <bpmn:exclusiveGateway id="decide"/>
    <bpmn:endEvent id="big"/><bpmn:endEvent id="small"/>
    <bpmn:sequenceFlow id="f0" sourceRef="start" targetRef="decide"/>
    <bpmn:sequenceFlow id="f1" sourceRef="decide" targetRef="big"><bpmn:conditionExpression>amount &gt; 10</bpmn:conditionExpression></bpmn:sequenceFlow>
    <bpmn:sequenceFlow id="f2" sourceRef="decide" targetRef="small"><bpmn:conditionExpression>amount &lt; 5</bpmn:conditionExpression></bpmn:sequenceFlow>
  </bpmn:process>
  <bpmn:process id="customer_pool" isExecutable="false">
    <bpmn:exclusiveGateway id="drawn_only"/>
  </bpmn:process>
</bpmn:definitions>
""", encoding="utf-8")
    report = validate_process(path, process_id=process_id)
    codes = {(p.code, p.element_id) for p in report.problems}
    assert ("gateway_coverage_gap", "decide") in codes
    assert codes & {("no_executable_process", "draft"), ("process_not_executable", "draft")}
    if process_id is not None:  # the pool drawn beside it is not the one to run: not checked
        assert not {c for c in codes if c[1] == "customer_pool" or c[1] == "drawn_only"}


def test_raise_for_problems_names_every_error() -> None:
    report = validate_process(FIXTURES / "many_problems.bpmn")
    with pytest.raises(ProcessError) as caught:
        raise_for_problems(report)
    err = caught.value
    assert err.kind == "invalid_process"
    assert len(err.problems) == 7
    assert all(str(p) in str(err) for p in report.errors)
    assert {p["code"] for p in err.problems} >= {"invalid_config_json", "branch_not_outgoing"}


def test_warnings_do_not_raise() -> None:
    report = validate_process(FIXTURES / "executable_unset.bpmn")
    assert report.ok and len(report.warnings) == 1
    raise_for_problems(report)
    assert "(1 warning)" in format_report(report)


def test_report_to_dict_is_json() -> None:
    report = validate_process(FIXTURES / "gateway_gap.bpmn")
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and data["errors"] == 1 and data["process_id"] == "gap"
    (problem,) = data["problems"]
    assert problem["code"] == "gateway_coverage_gap"
    assert problem["element_id"] == "decide" and problem["line"] == fixture_line("gateway_gap.bpmn", 'id="decide"')
    assert problem["text"].startswith(str(FIXTURES / "gateway_gap.bpmn"))


def test_processes_across_files_resolve_call_activities() -> None:
    report = validate_process([FIXTURES / "call_unknown.bpmn", FIXTURES / "credit_check.bpmn"])
    assert report.ok and report.problems == ()
    assert report.process_id == "caller"


def test_process_id_selects_among_several_processes() -> None:
    files = [FIXTURES / "call_unknown.bpmn", FIXTURES / "credit_check.bpmn"]
    assert validate_process(files, process_id="credit_check").process_id == "credit_check"


def test_two_unrelated_executable_processes_need_a_process_id() -> None:
    files = [FIXTURES / "credit_check.bpmn", FIXTURES / "valid.bpmn"]
    report = validate_process(files, discover_config=False)
    assert [p.code for p in report.problems] == ["process_ambiguous"]
    assert "('credit_check', 'loan_approval')" in report.problems[0].message
    assert report.process_id is None
    assert validate_process(files, process_id="loan_approval", discover_config=False).ok


TWO_EXTENSIONS = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:layerflow="https://layerflow.dev/bpmn" xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"
    id="defs" targetNamespace="t">
  <bpmn:process id="p" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="join"/>
    <bpmn:parallelGateway id="join">
      <bpmn:extensionElements>
        <spiffworkflow:activityConfig>{"mergeStrategy": "BRANCH_PRIORITY", "reducers": {"n": "%s"}}</spiffworkflow:activityConfig>
        <layerflow:config>{"branchPriority": ["start"], "preserveKeys": [%s]}</layerflow:config>
      </bpmn:extensionElements>
    </bpmn:parallelGateway>
    <bpmn:sequenceFlow id="f2" sourceRef="join" targetRef="end"/>
    <bpmn:endEvent id="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_both_extension_elements_merge_before_validation(tmp_path: Path) -> None:
    path = tmp_path / "two.bpmn"
    path.write_text(TWO_EXTENSIONS % ("sum", '"n"'))
    report = validate_process(path)
    assert report.ok and report.problems == ()
    join = report.element_configs["join"]
    assert join.merge_strategy == "BRANCH_PRIORITY" and join.branch_priority == ["start"]
    # A bad field is located on the extension element that holds it.
    path.write_text(TWO_EXTENSIONS % ("avg", "3"))
    problems = {(p.field, p.line) for p in validate_process(path).problems}
    assert problems == {("reducers.n", 10), ("preserveKeys.0", 11)}


def test_config_file_and_extension_that_are_invalid_together(tmp_path: Path) -> None:
    path = tmp_path / "two.bpmn"
    path.write_text(TWO_EXTENSIONS % ("sum", '"n"'))
    (tmp_path / "two.layerflow.yaml").write_text("join:\n  branchPriority: []\n")
    report = validate_process(path)
    assert [(p.code, p.line, p.element_id) for p in report.problems] == [("config_merge_invalid", 1, "join")]
    assert "needs branchPriority" in report.problems[0].message
    assert "join" not in report.element_configs


def test_several_config_files_beside_the_process_warn(tmp_path: Path) -> None:
    shutil.copy(FIXTURES / "valid.bpmn", tmp_path / "loan.bpmn")
    shutil.copy(FIXTURES / "valid.layerflow.yaml", tmp_path / "loan.layerflow.yaml")
    (tmp_path / "loan.layerflow.json").write_text("{}")
    report = validate_process(tmp_path / "loan.bpmn")
    assert report.ok
    assert report.config_path == tmp_path / "loan.layerflow.yaml"
    assert [p.code for p in report.problems] == ["config_ambiguous"]
    assert validate_process(tmp_path / "loan.bpmn", discover_config=False).config_path is None


def test_the_engine_parser_runs_the_last_check() -> None:
    from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

    built: list[object] = []

    def factory() -> SpiffBpmnParser:
        parser = SpiffBpmnParser()
        built.append(parser)
        return parser

    assert validate_process(FIXTURES / "valid.bpmn", parser_factory=factory).ok
    assert len(built) == 1


def test_read_extension_configs_in_merge_order() -> None:
    from lxml import etree

    root = etree.parse(str(FIXTURES / "valid.bpmn")).getroot()
    found = read_extension_configs(root)
    assert set(found) == {"risk_assessment", "full_review"}
    assert json.loads(found["full_review"][0][1]) == {"humanConfirm": {"timeout": 60}}


# -- the static coverage check of exclusive gateways -------------------------------------------

GATEWAY = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="defs" targetNamespace="t">
  <bpmn:process id="p" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:sequenceFlow id="f_in" sourceRef="start" targetRef="gw"/>
    <bpmn:exclusiveGateway id="gw"{default}/>
{flows}
  </bpmn:process>
</bpmn:definitions>
"""


def gateway_report(tmp_path: Path, conditions: list[str], default: bool = False) -> ValidationReport:
    from xml.sax.saxutils import escape

    flows = []
    for i, cond in enumerate(conditions):
        flows.append(f'    <bpmn:sequenceFlow id="f{i}" sourceRef="gw" targetRef="e{i}">'
                     f"<bpmn:conditionExpression>{escape(cond)}</bpmn:conditionExpression></bpmn:sequenceFlow>")
        flows.append(f'    <bpmn:endEvent id="e{i}"/>')
    if default:
        flows.append('    <bpmn:sequenceFlow id="f_default" sourceRef="gw" targetRef="e_default"/>')
        flows.append('    <bpmn:endEvent id="e_default"/>')
    path = tmp_path / "gw.bpmn"
    path.write_text(GATEWAY.format(default=' default="f_default"' if default else "", flows="\n".join(flows)))
    return validate_process(path, discover_config=False)


COVERAGE = [
    # numbers: interval coverage of the real line
    (["x < 5", "x > 5"], "gateway_coverage_gap", "do not cover x == 5"),
    (["x < 5", "x >= 5"], None, None),
    (["x <= 4", "x >= 5"], "gateway_coverage_gap", "do not cover 4 < x < 5"),
    (["0 <= x < 10", "x >= 10"], "gateway_coverage_gap", "do not cover x < 0"),
    (["x > 0"], "gateway_coverage_gap", "do not cover x <= 0"),
    (["x < -1.5", "x > 2"], "gateway_coverage_gap", "do not cover -1.5 <= x <= 2"),
    (["5 > x", "x >= 5"], None, None),
    (["-1 < x", "x <= -1"], None, None),
    (["x < 5 or x > 5", "x == 5"], None, None),
    (["not x < 5", "x < 5"], None, None),
    (["x > 5 and x < 3", "x >= 3"], "gateway_coverage_gap", "do not cover x < 3"),
    (["x == 1", "x == 2"], "gateway_not_exhaustive", "only handle x == 1, x == 2"),
    (["x in (1, 2)", "x not in (1, 2)"], None, None),
    (["x == 1", "x != 1"], None, None),
    # (a field read as an attribute, applicant.score, is refused first: condition_attribute_read)
    (["applicant['score'] < 600", "applicant['score'] > 600"], "gateway_coverage_gap", "applicant['score'] == 600"),
    (["applicant['score'] < 600", "applicant['score'] >= 600"], None, None),
    (["False", "x < 5"], "gateway_coverage_gap", "do not cover x >= 5"),
    # strings, booleans, None: the set of possible values is unknown
    (['decision == "approve"', 'decision == "reject"'], "gateway_not_exhaustive", "not exhaustive"),
    (['decision in ("approve", "reject")'], "gateway_not_exhaustive", "decision == 'approve', decision == 'reject'"),
    (['decision == "approve"', 'decision != "approve"'], None, None),
    (['decision != "a"', 'decision != "b"'], None, None),
    (['decision != "a" and decision != "b"', 'decision == "a"'], "gateway_coverage_gap", "do not cover decision == 'b'"),
    (["x == True", "x == False"], "gateway_not_exhaustive", "x == False, x == True"),
    (["x is None", "x is not None"], None, None),
    (["approved", "not approved"], None, None),
    (["approved", "approved and approved"], "gateway_coverage_gap", "do not cover approved being false"),
    # out of the analysable fragment: not reported
    (["x < 5", "y >= 5"], None, None),
    (["len(x) < 5", "len(x) > 5"], None, None),
    (["x < 'm'", "x > 'm'"], None, None),
    (["x == 1", 'x == "one"'], None, None),
    (["x + 1 < 5", "x + 1 > 5"], None, None),
    (["'a' in x", "'a' not in x"], None, None),
    (["x in 'abc'"], None, None),
]


@pytest.mark.parametrize(("conditions", "severity"), [
    (["x < 5", "x > 5"], "error"),            # x == 5 is certainly missed
    (["x <= 4", "x >= 5"], "warning"),        # only fractions are missed: fine for counts
    (["x > 0", "x == 0"], "warning"),         # only negative numbers are missed: fine for amounts and counts
    (["x < 4", "x > 5"], "error"),            # 4, 5 missed
    (['decision == "a"', 'decision == "b"'], "warning"),
])
def test_only_certain_gaps_stop_a_process(tmp_path: Path, conditions: list[str], severity: str) -> None:
    report = gateway_report(tmp_path, conditions)
    assert [p.severity for p in report.problems] == [severity], format_report(report)
    assert report.ok is (severity == "warning")


@pytest.mark.parametrize(("conditions", "code", "says"), COVERAGE, ids=lambda v: " | ".join(v) if isinstance(v, list) else None)
def test_exclusive_gateway_coverage(tmp_path: Path, conditions: list[str], code: str | None, says: str | None) -> None:
    report = gateway_report(tmp_path, conditions)
    if code is None:
        assert report.problems == (), format_report(report)
        return
    assert [p.code for p in report.problems] == [code], format_report(report)
    assert says in report.problems[0].message
    assert report.problems[0].element_id == "gw"


def test_a_default_flow_makes_any_conditions_safe(tmp_path: Path) -> None:
    assert gateway_report(tmp_path, ["x < 5", "x > 5"], default=True).problems == ()


def test_lowercase_literals_in_a_condition_warn_naming_the_flow(tmp_path: Path) -> None:
    report = gateway_report(tmp_path, ["approved == true", "approved == false or note == null"], default=True)
    found = [(p.code, p.element_id, p.field, p.severity) for p in report.problems]
    assert found == [("condition_literal_name", "f0", "conditionExpression", "warning"),
                     ("condition_literal_name", "f1", "conditionExpression", "warning")], format_report(report)
    assert "'approved == true' reads 'true' as a context key" in report.problems[0].message
    assert "reads 'false', 'null'" in report.problems[1].message  # every one, in one warning
    assert "write True, False or None" in report.problems[1].message
    assert report.ok  # a context may hold a key named true: the process still runs
    assert gateway_report(tmp_path, ["approved == True", "approved is None"], default=True).problems == ()


def test_a_service_task_without_a_handler_warns(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The run would stop at the task: validate says so before anything runs, as a warning
    (code may still register a handler under the task's id before the run)."""
    from engine.handlers import REGISTRY
    from engine_helpers import chain_bpmn

    path = tmp_path / "svc.bpmn"
    path.write_text(chain_bpmn("svc", ['<bpmn:serviceTask id="charge"/>', '<bpmn:serviceTask id="notify"/>',
                                       '<bpmn:serviceTask id="score"/>']), encoding="utf-8")
    (tmp_path / "svc.layerflow.yaml").write_text("notify:\n  handler: notify_handler\n", encoding="utf-8")
    report = validate_process(path)
    assert report.ok  # a warning: nothing is refused
    missing = [p for p in report.warnings if p.code == "no_implementation"]
    assert [p.element_id for p in missing] == ["charge", "score"]
    assert "@activity('charge')" in missing[0].message and missing[0].line and missing[0].file == str(path)
    monkeypatch.setitem(REGISTRY._handlers, "score", lambda ctx: {})
    assert [p.element_id for p in validate_process(path).warnings if p.code == "no_implementation"] == ["charge"]


def test_a_service_task_operator_is_not_a_handler(tmp_path: Path) -> None:
    """layerflow runs a service task by its handler: a spiffworkflow:serviceTaskOperator alone
    would stop the run there, so validate warns, naming the operator."""
    from engine_helpers import chain_bpmn

    task = ('<bpmn:serviceTask id="call"><bpmn:extensionElements xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core"><spiffworkflow:serviceTaskOperator '
            'id="http/GetRequest" resultVariable="r"/></bpmn:extensionElements></bpmn:serviceTask>')
    path = tmp_path / "op.bpmn"
    path.write_text(chain_bpmn("op", [task]), encoding="utf-8")
    (warning,) = [p for p in validate_process(path).warnings if p.code == "no_implementation"]
    assert warning.element_id == "call" and "serviceTaskOperator 'http/GetRequest'" in warning.message


def test_branches_on_a_gateway_that_splits_nothing_warn(tmp_path: Path) -> None:
    """A gateway with one outgoing flow never splits: its branches' contextInject was ignored
    without a word."""
    from engine_helpers import chain_bpmn

    path = tmp_path / "one.bpmn"
    path.write_text(chain_bpmn("one", ['<bpmn:exclusiveGateway id="gw"/>',
                                       '<bpmn:scriptTask id="work"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>']),
                    encoding="utf-8")
    (tmp_path / "one.layerflow.yaml").write_text(
        "gw:\n  branches:\n    - {id: work, contextInject: {track: fast}}\n", encoding="utf-8")
    report = validate_process(path)
    assert report.ok
    (warning,) = [p for p in report.problems if p.code == "branches_ignored"]
    assert (warning.element_id, warning.field, warning.line) == ("gw", "branches", 2)
    assert "one outgoing flow" in warning.message and not [p for p in report.problems if p.code == "branch_not_outgoing"]


SPLITTING = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">
  <bpmn:process id="split" isExecutable="true">
    <bpmn:startEvent id="s"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:scriptTask id="a"><bpmn:script>x = 1</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="b"><bpmn:script>y = 1</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"/>
    <bpmn:endEvent id="e"/>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="fork"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fork" targetRef="a"/>
    <bpmn:sequenceFlow id="f3" sourceRef="fork" targetRef="b"/>
    <bpmn:sequenceFlow id="f4" sourceRef="a" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="b" targetRef="join"/>
    <bpmn:sequenceFlow id="f6" sourceRef="join" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_a_context_inject_the_split_would_refuse_or_overwrite_is_reported(tmp_path: Path) -> None:
    """A branch injecting a key the config fixes in SYSTEM stops the run at the split: an
    error before anything runs, naming file, line, gateway and field. Injecting a split
    marker (``_branch_id``) is overwritten by the split: a warning."""
    from engine import Engine, load_process

    path = tmp_path / "split.bpmn"
    path.write_text(SPLITTING, encoding="utf-8")
    (tmp_path / "split.layerflow.yaml").write_text(
        "system:\n  policy: strict\nfork:\n  branches:\n"
        "    - id: a\n      contextInject: {track: fast, policy: lax}\n"
        "    - id: b\n      contextInject: {_branch_id: mine}\n", encoding="utf-8")
    report = validate_process(path)
    found = {(p.field, p.severity): p for p in report.problems if p.code == "inject_fixed_key"}
    assert set(found) == {("branches.0.contextInject.policy", "error"), ("branches.1.contextInject._branch_id", "warning")}
    error = found["branches.0.contextInject.policy", "error"]
    assert (error.file, error.line, error.element_id) == (str(tmp_path / "split.layerflow.yaml"), 6, "fork")
    assert "'policy'" in error.message and "SYSTEM" in error.message and "inject a different key" in error.message
    with pytest.raises(ProcessError, match="policy"):
        load_process(path)
    # without the SYSTEM key the process runs, and the split's marker wins
    (tmp_path / "split.layerflow.yaml").write_text(
        "fork:\n  branches:\n    - id: b\n      contextInject: {_branch_id: mine}\n", encoding="utf-8")
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(path)))
    assert instance.status == "completed", instance.error
    (branch,) = [c for c in instance.contexts.values() if c.branch_id == "b"]
    assert branch.resolve("_branch_id") == "b"


_CALLED_WITH_EVENT_SUBPROCESS = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:message id="m_ping" name="ping"/>
  <bpmn:process id="main" isExecutable="true">
    <bpmn:startEvent id="s"/>
    <bpmn:callActivity id="c" calledElement="called"/>
    <bpmn:endEvent id="e"/>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="c"/>
    <bpmn:sequenceFlow id="f2" sourceRef="c" targetRef="e"/>
  </bpmn:process>
  <bpmn:process id="called" isExecutable="true">
    <bpmn:startEvent id="cs"/>
    <bpmn:userTask id="wait"/>
    <bpmn:endEvent id="ce"/>
    <bpmn:sequenceFlow id="g1" sourceRef="cs" targetRef="wait"/>
    <bpmn:sequenceFlow id="g2" sourceRef="wait" targetRef="ce"/>
    <bpmn:subProcess id="evs" triggeredByEvent="true">
      <bpmn:startEvent id="es" isInterrupting="false"><bpmn:messageEventDefinition messageRef="m_ping"/></bpmn:startEvent>
      <bpmn:scriptTask id="on_ping"><bpmn:script>pinged = 1</bpmn:script></bpmn:scriptTask>
      <bpmn:endEvent id="ee"/>
      <bpmn:sequenceFlow id="h1" sourceRef="es" targetRef="on_ping"/>
      <bpmn:sequenceFlow id="h2" sourceRef="on_ping" targetRef="ee"/>
    </bpmn:subProcess>
  </bpmn:process>
</bpmn:definitions>
"""


def test_a_message_event_sub_process_of_a_called_process_warns_that_it_never_starts(tmp_path: Path) -> None:
    """SpiffWorkflow 3.2 starts message and signal event sub-processes of the top-level process
    only: called, the process never catches the message (run on its own, it does)."""
    from engine import Engine, load_process
    from engine.governance import InstanceStateError

    path = tmp_path / "calls.bpmn"
    path.write_text(_CALLED_WITH_EVENT_SUBPROCESS)
    report = validate_process(path, process_id="main", discover_config=False)
    found = [(p.code, p.element_id, p.severity, p.line) for p in report.problems]
    assert found == [("called_event_subprocess_never_starts", "es", "warning", 18)], format_report(report)
    assert "call activity 'c'" in report.problems[0].message and "boundary event on 'c'" in report.problems[0].message
    assert validate_process(path, process_id="called", discover_config=False).problems == ()
    engine = Engine("memory://")
    called = engine.run(engine.start(load_process(path, "main")))
    assert [w["task_id"] for w in called.waiting_for] == ["wait"]
    with pytest.raises(InstanceStateError, match="does not wait for message 'ping'"):
        engine.send_event(called, "ping", {})
    alone = engine.run(engine.start(load_process(path, "called")))
    alone = engine.send_event(alone, "ping", {})
    assert alone.main.resolve("pinged") == 1


def test_an_llm_block_with_no_model_and_no_handler_is_a_warning(tmp_path: Path, monkeypatch) -> None:
    """Offline, a model step runs its handler; with neither a model nor a handler the run stops
    there, so validate says so (a warning: a run with --model is fine)."""
    from engine.handlers import REGISTRY
    from engine_helpers import chain_bpmn

    path = tmp_path / "llm.bpmn"
    path.write_text(chain_bpmn("llm", ['<bpmn:serviceTask id="classify"/>', '<bpmn:serviceTask id="offline"/>',
                                       '<bpmn:serviceTask id="named"/>']), encoding="utf-8")
    (tmp_path / "llm.layerflow.yaml").write_text(
        "classify:\n  llm: {instructions: classify it, outputKeys: [category]}\n"
        "offline:\n  handler: h\n  llm: {instructions: x}\n"
        "named:\n  llm: {model: openai/gpt-4o-mini}\n", encoding="utf-8")
    report = validate_process(path)
    assert report.ok
    found = [p for p in report.warnings if p.code == "llm_without_handler"]
    assert [p.element_id for p in found] == ["classify"] and "--model" in found[0].message
    assert not [p for p in report.warnings if p.code == "no_implementation"]
    monkeypatch.setitem(REGISTRY._handlers, "classify", lambda ctx: {})
    assert not [p for p in validate_process(path).warnings if p.code == "llm_without_handler"]


@pytest.mark.parametrize("which", ["preScript", "postScript"])
def test_a_pre_or_post_script_on_a_script_task_runs_and_is_not_warned_of(tmp_path: Path, which: str) -> None:
    """SpiffWorkflow's parser drops a script task's spiffworkflow:preScript / postScript, but
    layerflow runs them around the task's script (as SpiffArena offers them): validate says
    nothing of them, and the script reads what the preScript set / the postScript reads it."""
    path = tmp_path / "scripted.bpmn"
    script, extra = ("b = a + 1", "a = 1") if which == "preScript" else ("a = 1", "b = a + 1")
    path.write_text(f'''<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
    xmlns:spiffworkflow="http://spiffworkflow.org/bpmn/schema/1.0/core" id="d" targetNamespace="b">
  <bpmn:process id="scripted" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:scriptTask id="calc">
      <bpmn:extensionElements><spiffworkflow:{which}>{extra}</spiffworkflow:{which}></bpmn:extensionElements>
      <bpmn:script>{script}</bpmn:script>
    </bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="calc"/>
    <bpmn:sequenceFlow id="f2" sourceRef="calc" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
''', encoding="utf-8")
    report = validate_process(path)
    assert report.ok and not report.problems, report.problems
    from engine import Engine, load_process
    instance = Engine("memory://").run(load_process(path), {})
    assert instance.status == "completed"
    assert (instance.main.resolve("a"), instance.main.resolve("b")) == (1, 2)
