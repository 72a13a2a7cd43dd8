"""Shapes met in public BPMN and DMN files, round 5: SpiffArena's process models (data objects
written by a sub-process), Camunda 7's examples. Each is redrawn small in
``tests/engine/realworld/``; where plain SpiffWorkflow 3.2 can run a shape, a case runs it there
too and the outcome must agree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.exceptions import WorkflowDataException
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.util.task import TaskState

from engine import Engine, FormAnswerInvalid, load_process
from engine.validate import _feel_negation, _feel_range, _python_instead, validate_process

from engine_helpers import path_of, variables
from test_realworld_4 import plain, problems

REALWORLD = Path(__file__).resolve().parent / "realworld"


# -- data objects --------------------------------------------------------------------------------


def test_a_sub_process_that_writes_a_data_object_hands_it_to_the_next_one() -> None:
    """A sub-process with a dataOutputAssociation (SpiffArena's data-object-in-subprocess model):
    its steps write the object, the next sub-process's task reads it through a reference drawn
    inside that sub-process. Validate passed and the run stopped as the first sub-process ended,
    "WorkflowDataException: A data object could not be set; 'draft' not exist in the task" (exit 1,
    no task named): SpiffWorkflow takes the value from the sub-process task's data, and under
    layerflow the value is in the context. It now runs as in plain SpiffWorkflow."""
    path = REALWORLD / "subprocess_data_object.bpmn"
    assert problems(path) == []
    expected = plain(path, "subprocess_data_object", {"claim_id": "C-7"}).last_task.data
    assert expected["verdict"] == "C-7: small"
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"claim_id": "C-7"}))
    assert instance.status == "completed", instance.error
    found = variables(instance.main)
    assert found["verdict"] == expected["verdict"]
    # the data object stays in the context, as every data object does under layerflow
    assert found["draft"] == {"claim": "C-7", "amount": 120}
    assert {k: v for k, v in found.items() if k != "draft"} == dict(expected)


def test_a_sub_process_whose_steps_never_set_its_data_object_names_it(tmp_path: Path) -> None:
    """The same sub-process whose steps set something else: plain SpiffWorkflow stops with a
    WorkflowDataException naming no element; layerflow's error names the sub-process and the object
    and says what to do."""
    source = (REALWORLD / "subprocess_data_object.bpmn").read_text()
    script = 'draft = {"claim": claim_id, "amount": 120}'
    assert script in source
    path = tmp_path / "subprocess_data_object.bpmn"
    path.write_text(source.replace(script, "notes = claim_id"))
    with pytest.raises(WorkflowDataException, match="'draft' not exist"):
        plain(path, "subprocess_data_object", {"claim_id": "C-7"})
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"claim_id": "C-7"}))
    assert instance.status == "error"
    assert instance.error == {
        "kind": "activity_failed", "task_id": "drafting",
        "message": "sub-process 'drafting' writes the data object(s) 'draft' (its dataOutputAssociation), and "
                   "nothing in it set them; set them in a step before it ends, or remove the association"}


# -- Operaton (Camunda 7's fork) --------------------------------------------------------------------


def test_operaton_forms_and_decisions_are_read_as_camunda_7s() -> None:
    """Operaton's examples (leave-request, dmn-decision's loan-application) write Camunda 7's
    settings in Operaton's namespace: operaton:formData on a user task, operaton:decisionRef,
    resultVariable and mapDecisionResult on a business rule task. Validate refused the task as naming
    no decision ("name it ... or camunda:decisionRef"), and the form was not read, so any answer
    passed. They are read as Camunda 7's."""
    bpmn, table = REALWORLD / "operaton_expense.bpmn", REALWORLD / "operaton_expense.dmn"
    assert problems(bpmn, table) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([bpmn, table])))
    assert instance.status == "waiting"
    [item] = instance.waiting_for
    assert item["form"]["source"] == "operaton:formData"
    assert [(f["id"], f["type"], f["required"], f["default"]) for f in item["form"]["fields"]] == [
        ("amount", "long", True, None), ("category", "enum", False, "travel")]
    with pytest.raises(FormAnswerInvalid) as refused:
        engine.complete_user_task(instance, item["id"], {"amount": 25, "category": "fuel"})
    assert refused.value.problems == [("category", '"fuel" is not one of travel, meals')]
    for amount, route in ((25, "auto"), (250, "manager")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, table])))
        instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"amount": amount})
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == {"amount": amount, "category": "travel", "route": route}


def test_operaton_loop_collection_and_bean_are_named_as_camunda_7s() -> None:
    """Operaton's document-review example loops over operaton:collection="${reviewers}": validate
    passed on SpiffWorkflow's 'A multiinstance task must specify a cardinality or a loop input data
    reference ... fix the BPMN element named here', and said nothing of operaton:delegateExpression.
    It now says what to write, with the loop's own names, as for camunda:collection."""
    found = validate_process([REALWORLD / "operaton_reviews.bpmn"]).problems
    assert [(p.code, p.element_id, p.severity) for p in found if p.code in (
        "multi_instance_foreign_collection", "foreign_extension")] == [
        ("multi_instance_foreign_collection", "review", "error"), ("foreign_extension", "archive", "warning")]
    loop = next(p for p in found if p.code == "multi_instance_foreign_collection")
    assert "operaton:collection='${reviewers}'" in loop.message
    assert loop.message.endswith('write <bpmn:loopDataInputRef>reviewers</bpmn:loopDataInputRef> and '
                                 '<bpmn:inputDataItem id="reviewer" name="reviewer"/> in its '
                                 'bpmn:multiInstanceLoopCharacteristics')
    bean = next(p for p in found if p.code == "foreign_extension")
    assert "has operaton:delegateExpression, another engine's settings" in bean.message
    assert "cannot load the process" not in " ".join(p.message for p in found)


# -- decision requirements graphs, FEEL ranges ---------------------------------------------------------


def plain_camunda(bpmn: Path, dmns: list[Path], process_id: str, data: dict[str, Any]) -> dict[str, Any]:
    """The final variables of plain SpiffWorkflow with its Camunda parser (camunda:decisionRef)."""
    from SpiffWorkflow.camunda.parser.CamundaParser import CamundaParser

    parser = CamundaParser()
    parser.add_bpmn_file(str(bpmn))
    for dmn in dmns:
        parser.add_dmn_file(str(dmn))
    wf = BpmnWorkflow(parser.get_spec(process_id))
    wf.task_tree.data.update(data)
    wf.do_engine_steps()
    assert wf.is_completed()
    return dict(wf.last_task.data)


def rewritten(tmp_path: Path, source: Path, pairs: list[tuple[str, str]]) -> Path:
    """A copy of ``source`` with each text replaced as validate said to write it."""
    text = source.read_text()
    for old, new in pairs:
        assert old in text, old
        text = text.replace(old, new)
    out = tmp_path / source.name
    out.write_text(text)
    return out


def test_a_decision_that_requires_another_is_refused_with_the_task_to_add(tmp_path: Path) -> None:
    """Operaton's dmn-decision example: the task runs 'credit-decision', whose table reads the
    riskLevel that the decision it requires ('risk-level', an informationRequirement) gives.
    SpiffWorkflow 3.2 evaluates no required decision. Validate said only to put each decision in a file
    of its own; done so, it passed, and the run stopped at the first rule, "name 'riskLevel' is not
    defined". It now names the required decision, what it gives, and the task to add; done so, the
    process runs as in plain SpiffWorkflow."""
    bpmn = REALWORLD / "required_decision.bpmn"
    discount, tier = REALWORLD / "required_discount.dmn", REALWORLD / "required_tier.dmn"
    with pytest.raises(Exception, match="customerTier"):
        plain_camunda(bpmn, [discount, tier], "required_decision", {"spend": 2000})
    [problem] = [p for p in problems(bpmn, discount, tier) if p.element_id == "price"]
    assert (problem.code, problem.file, problem.line, problem.field) == (
        "dmn_unsupported", str(bpmn), 8, "calledDecisionId")
    assert problem.message == (
        "business rule task 'price' runs DMN decision 'discount', which requires decision 'tier' (its "
        "informationRequirement), the one that gives 'customerTier'; SpiffWorkflow 3.2 evaluates no required "
        "decision, so 'customerTier' has no value and the run stops at the first rule: run 'tier' in a business "
        "rule task of its own before 'price' (each decision in a DMN file of its own)")
    # without the file of the decision it requires, the message still names it
    [alone] = problems(bpmn, discount)
    assert "requires decision 'tier' (its informationRequirement); SpiffWorkflow 3.2 evaluates no required " \
           "decision, so what it gives has no value" in alone.message
    fixed_bpmn = rewritten(tmp_path, bpmn, [
        ('<bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="price" />',
         '<bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="rate" />'
         '<bpmn:businessRuleTask id="rate" camunda:decisionRef="tier"><bpmn:incoming>f1</bpmn:incoming>'
         '<bpmn:outgoing>f0</bpmn:outgoing></bpmn:businessRuleTask>'
         '<bpmn:sequenceFlow id="f0" sourceRef="rate" targetRef="price" />'),
        ("<bpmn:incoming>f1</bpmn:incoming>\n      <bpmn:outgoing>f2</bpmn:outgoing>",
         "<bpmn:incoming>f0</bpmn:incoming>\n      <bpmn:outgoing>f2</bpmn:outgoing>")])
    fixed_tier = rewritten(tmp_path, tier, [("[1000..1000000]", "1000 &lt;= ? &lt;= 1000000"),
                                            ("[100..1000)", "100 &lt;= ? &lt; 1000")])
    assert problems(fixed_bpmn, discount, fixed_tier) == []
    for spend, expected in ((2000, ("gold", 15)), (500, ("silver", 0)), (10, ("basic", 0))):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, discount, fixed_tier]), {"spend": spend}))
        assert instance.status == "completed", instance.error
        found = variables(instance.main)
        assert (found["customerTier"], found["discount"]) == expected
        assert found == plain_camunda(fixed_bpmn, [discount, fixed_tier], "required_decision", {"spend": spend})


def test_a_feel_range_in_a_decision_table_gets_the_python_test_to_write(tmp_path: Path) -> None:
    """Operaton's and Camunda's tables write intervals, ``[600..699]``; validate said only to write
    Python ('a value, a comparison to finish, or a test of ?'). It now gives the test the range means,
    each end inclusive or not as the brackets say (a FEEL date's text compares in order)."""
    bpmn, discount, tier = (REALWORLD / "required_decision.bpmn", REALWORLD / "required_discount.dmn",
                            REALWORLD / "required_tier.dmn")
    found = {p.element_id: p.message for p in problems(bpmn, discount, tier) if p.file == str(tier)}
    assert set(found) == {"tier_gold_in", "tier_silver_in"}
    assert found["tier_gold_in"].endswith("a range is FEEL's; write it as Python: '1000 <= ? <= 1000000'")
    assert found["tier_silver_in"].endswith("a range is FEEL's; write it as Python: '100 <= ? < 1000'")
    dates = rewritten(tmp_path, tier, [("[100..1000)", '[date("2026-01-01")..date("2026-03-31")]')])
    [quarter] = [p.message for p in problems(bpmn, discount, dates) if p.element_id == "tier_silver_in"]
    assert quarter.endswith("""a range is FEEL's; write it as Python: '"2026-01-01" <= ? <= "2026-03-31"'""")
    assert _feel_range("]1..10[") == "1 < ? < 10"
    assert _feel_range('(date("2026-01-01")..date("2026-03-31")]') == 'date("2026-01-01") < ? <= date("2026-03-31")'
    assert _feel_range("[1..2] or 3") is None and _feel_range("[a..") is None


# -- call activities' variable mappings ----------------------------------------------------------


def test_a_call_activity_mapping_that_renames_a_variable_runs(tmp_path: Path) -> None:
    """Operaton's call-activity example maps the called process's isValid to orderValid
    (``operaton:out source="isValid" target="orderValid"``) and its gateway reads orderValid.
    SpiffWorkflow runs no such mapping: plain SpiffWorkflow stops in the called process on the input
    it renamed ("name 'ref' is not defined"). layerflow runs the mappings, so the process takes the
    path it takes in Camunda: nothing to report, ``claimOk`` decides the gateway. As in Camunda, a
    call with out mappings runs in a scope of its own: only what they set comes back."""
    path = REALWORLD / "call_mapping_renamed.bpmn"
    with pytest.raises(Exception, match="name 'ref' is not defined"):
        plain(path, "claim_intake", {"claimId": "C-1"})
    found = [p for p in validate_process([path], process_id="claim_intake").problems
             if p.code in ("call_mapping_expression", "foreign_extension")]
    assert found == []
    for claim, ok, end in (("C-1", True, "accepted"), ("X-1", False, "rejected")):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([path], process_id="claim_intake"), {"claimId": claim}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == {"claimId": claim, "claimOk": ok, "checkedOn": "2026-01-31"}
        [scope] = [c for name, c in instance.contexts.items() if name != "main"]
        assert variables(scope)["ref"] == claim and variables(scope)["ok"] is ok
        assert path_of(instance.workflow)[-3:] == ["check", "valid", end]


def test_call_mappings_in_other_engines_spellings(tmp_path: Path) -> None:
    """A sourceExpression that only names a variable runs as that source, Flowable's namespace as
    Camunda's; ``variables="all"`` is what happens anyway (no warning); a missing source gives None;
    a sourceExpression that computes something is refused where its target is read, with the
    Python to write in a preScript."""
    path = REALWORLD / "call_mapping_renamed.bpmn"
    spelled = rewritten(tmp_path, path, [
        ('<camunda:in source="claimId" target="ref" />',
         '<camunda:in variables="all" /><flowable:in sourceExpression="${claimId}" target="ref" />'
         '<camunda:in source="notSet" target="extra" />'),
        ('xmlns:camunda=', 'xmlns:flowable="http://flowable.org/bpmn" xmlns:camunda=')])
    assert [p for p in validate_process([spelled], process_id="claim_intake").problems] == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([spelled], process_id="claim_intake"), {"claimId": "C-3"}))
    assert instance.status == "completed", instance.error
    [scope] = [c for name, c in instance.contexts.items() if name != "main"]
    assert variables(scope)["ref"] == "C-3" and variables(scope)["extra"] is None
    assert variables(instance.main)["claimOk"] is True and "ref" not in variables(instance.main)

    computed = rewritten(tmp_path, path, [('<camunda:in source="claimId" target="ref" />',
                                           '<camunda:in sourceExpression="${claimId.trim()}" target="ref" />')])
    [problem] = [p for p in validate_process([computed], process_id="claim_intake").problems
                 if p.code == "call_mapping_expression"]
    assert (problem.severity, problem.element_id, problem.field, problem.line) == ("error", "check", "camunda:in", 12)
    assert "sourceExpression='${claimId.trim()}' target='ref'" in problem.message
    assert "spiffworkflow:preScript of 'check' (ref = ..." in problem.message


# -- handlers where none runs --------------------------------------------------------------------------


def test_a_handler_for_a_send_task_is_refused_since_none_runs_there(tmp_path: Path) -> None:
    """Operaton's expense-reimbursement example mails the requester from a bpmn:sendTask run by a
    bean (operaton:delegateExpression). Validate said to run the step with a handler; given one in the
    config, validate called the process valid with no word, and the run completed without it: a send
    task sends its message, and no handler runs there. The handler is refused, naming the task and
    what to draw instead; done so, it runs."""
    path = REALWORLD / "send_task_delegate.bpmn"
    found = [p for p in validate_process([path]).problems if p.element_id == "notify"]
    assert [(p.code, p.severity, p.field) for p in found] == [
        ("foreign_extension", "warning", None), ("handler_not_run", "error", "handler")]
    assert found[0].message.endswith("has operaton:delegateExpression, another engine's settings that layerflow "
                                     "does not run (nor does SpiffWorkflow's own parser): do its work in a "
                                     "bpmn:serviceTask drawn before it (a handler or an llm: block there), or make "
                                     "it a bpmn:serviceTask")
    assert (found[1].file, found[1].line) == (str(REALWORLD / "send_task_delegate.layerflow.yaml"), 4)
    assert found[1].message == (
        "'notify' is a bpmn:sendTask, which sends its message (spiffworkflow:messagePayload, or nothing) and runs "
        "no handler or llm: block, so its handler never runs; do its work in a bpmn:serviceTask drawn before it (a "
        "handler or an llm: block there), or make it a bpmn:serviceTask")
    fixed = rewritten(tmp_path, path, [('<bpmn:sendTask id="notify"', '<bpmn:serviceTask id="notify"'),
                                       ("</bpmn:sendTask>", "</bpmn:serviceTask>")])
    for name in ("send_task_delegate.layerflow.yaml", "send_task_delegate_handlers.py"):
        (tmp_path / name).write_text((REALWORLD / name).read_text())
    assert problems(fixed) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed])))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"paid": True, "notified": True}
    assert "activity:notify" in instance.main.layer(3)


def test_a_handler_for_a_call_activity_or_sub_process_is_refused(tmp_path: Path) -> None:
    """The same for a call activity and a sub-process: their steps run, never a handler of theirs."""
    path = tmp_path / "called.bpmn"
    path.write_text((REALWORLD / "subprocess_data_object.bpmn").read_text())
    (tmp_path / "called.layerflow.yaml").write_text("drafting:\n  llm:\n    instructions: draft the claim\n")
    [problem] = [p for p in problems(path) if p.code == "handler_not_run"]
    assert (problem.element_id, problem.field, problem.line) == ("drafting", "llm", 2)
    assert problem.message == ("'drafting' is a bpmn:subProcess, which runs the steps drawn inside it and runs no "
                               "handler or llm: block, so its llm never runs; give the handler to a task inside it")


def test_a_feel_negation_in_a_decision_table_gets_the_python_test_to_write(tmp_path: Path) -> None:
    """Operaton's account-risk table writes ``not("LOW")``; validate refused it with the general
    advice ('a value, a comparison to finish, or a test of ?'). It now gives the test it means, for a
    value, a list of values and a range; done so, the table decides as in plain SpiffWorkflow."""
    bpmn, table = REALWORLD / "negated_entry.bpmn", REALWORLD / "negated_entry.dmn"
    found = {p.element_id: p.message for p in problems(bpmn, table)}
    advice = "FEEL's not(...) matches any other value; write it as Python: "
    assert {k: v.split("(Python, not FEEL); ", 1)[1] for k, v in found.items()} == {
        "risky_risk": advice + """'? != "LOW"'""", "abroad_country": advice + """'? not in ("DE", "AT")'""",
        "odd_score_in": advice + "'? < 60 or ? > 100'"}
    fixed = rewritten(tmp_path, table, [('not("LOW")', '? != "LOW"'), ('not("DE","AT")', '? not in ("DE", "AT")'),
                                        ("not([60..100])", "? &lt; 60 or ? &gt; 100")])
    assert problems(bpmn, fixed) == []
    cases = [({"backgroundRisk": "HIGH", "country": "DE", "score": 80}, "risk"),
             ({"backgroundRisk": "LOW", "country": "FR", "score": 80}, "abroad"),
             ({"backgroundRisk": "LOW", "country": "AT", "score": 20}, "score"),
             ({"backgroundRisk": "LOW", "country": "DE", "score": 70}, "none")]
    for data, review in cases:
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, fixed]), data))
        assert instance.status == "completed", instance.error
        assert variables(instance.main)["review"] == review
        assert plain_camunda(bpmn, [fixed], "negated_entry", data)["review"] == review
    assert _feel_negation("not((1..5])") == "? <= 1 or ? > 5"
    assert _feel_negation("not(< 5)") is None and _feel_negation("notable") is None


# -- JUEL ---------------------------------------------------------------------------------------------


def test_a_juel_condition_calling_a_java_bean_says_the_bean_is_not_here() -> None:
    """Camunda's pizza-order example decides by ``${orderBusinessLogic.getOrder(orderId).approved}``;
    validate said only to write ``orderBusinessLogic.getOrder(orderId).approved``, which stops with
    a NameError too. It now says the call is a bean of the Camunda application, and where to compute
    the value (as round 4 does for a JavaScript engine's services)."""
    [problem] = problems(REALWORLD / "juel_bean_call.bpmn")
    assert (problem.element_id, problem.field) == ("review_flow", "conditionExpression")
    assert problem.message.endswith(
        "write 'riskService.isHighRisk(applicant).flagged' (riskService.isHighRisk() calls a Java bean of the "
        "Camunda application, which is not here: compute the value in a handler (handler: file.py:function in the "
        "config of a task before it) and read it by its name)")
    # a Python method of a value (lower case, as str's) is no bean
    assert "Java bean" not in _python_instead("${name.upper() == 'X'}", "JUEL")


def test_a_decision_input_with_no_expression_that_a_rule_tests_is_named(tmp_path: Path) -> None:
    """holunda-io/camunda-decision's legal_age table leaves two inputs' inputExpression empty, as
    Camunda's DMN editor does until one is written. SpiffWorkflow then reads the variable named by the
    input's label: validate passed, and the run stopped with "WorkflowTaskException: 'Country'.
    Business Rule Task 'None'." Such an input is named with the key to write: an error when its
    label can be no variable ('Customer Age'), a warning when the context may hold it ('Country'),
    nothing when no rule tests it ('Note')."""
    bpmn, table = REALWORLD / "empty_input_expression.bpmn", REALWORLD / "empty_input_expression.dmn"
    with pytest.raises(Exception, match="'Country'"):
        plain_camunda(bpmn, [table], "empty_input_expression", {"country": "USA", "age": 30})
    found = [p for p in validate_process([bpmn, table]).problems if p.field == "inputExpression"]
    assert [(p.element_id, p.severity, p.line) for p in found] == [("in_country", "warning", 8), ("in_age", "error", 9)]
    assert found[0].message.endswith(
        "its inputExpression is empty, and rule 'usa' tests it; SpiffWorkflow then reads the variable named by its "
        "label, 'Country', and the run stops unless the context holds that key: write the context key the input "
        "reads as its inputExpression (<text>country</text>)")
    assert found[1].message == (
        "decision 'adult', input 'Customer Age' ('in_age'): its inputExpression is empty, and rule 'usa' tests it; "
        "SpiffWorkflow then reads the variable named by its label, 'Customer Age', which no variable can be named, "
        "and the run stops there: write the context key the input reads as its inputExpression "
        "(<text>customer_age</text>)")
    fixed = rewritten(tmp_path, table, [('typeRef="string"><text></text>', 'typeRef="string"><text>country</text>'),
                                        ('typeRef="integer"><text></text>', 'typeRef="integer"><text>age</text>')])
    assert [p for p in validate_process([bpmn, fixed]).problems if p.field == "inputExpression"] == []
    for data, adult in (({"country": "USA", "age": 25}, True), ({"country": "DE", "age": 16}, False)):
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([bpmn, fixed]), data))
        assert instance.status == "completed", instance.error
        assert variables(instance.main)["adult"] is adult
        assert plain_camunda(bpmn, [fixed], "empty_input_expression", data)["adult"] is adult


# -- Camunda 7's form-js forms --------------------------------------------------------------------------


def test_a_camunda_7_form_js_form_beside_the_bpmn_checks_the_answers(tmp_path: Path) -> None:
    """Camunda's task-camunda-forms example names its forms camunda:formKey="camunda-forms:app:
    task-form.form": a form-js form deployed with the BPMN. layerflow showed the key and checked
    nothing; it now reads the file beside the BPMN as it reads Camunda 8's linked forms, and a
    missing file is a warning naming the key and the path."""
    path = REALWORLD / "camunda7_form_js.bpmn"
    assert problems(path) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path])))
    [item] = instance.waiting_for
    assert item["form"]["source"] == "approve-invoice.form"
    assert [(f["id"], f["type"], f["required"]) for f in item["form"]["fields"]] == [
        ("approved", "boolean", True), ("reason", "enum", False), ("amount", "double", False)]
    with pytest.raises(FormAnswerInvalid) as refused:
        engine.complete_user_task(instance, item["id"], {"approved": True, "reason": "cheap"})
    assert refused.value.problems == [("reason", '"cheap" is not one of price, goods')]
    instance = engine.complete_user_task(instance, item["id"], {"approved": True, "reason": "goods"})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"approved": True, "reason": "goods"}
    alone = tmp_path / "camunda7_form_js.bpmn"
    alone.write_text(path.read_text())
    [warning] = [p for p in validate_process([alone]).problems if p.element_id == "approve_invoice"]
    assert warning.severity == "warning"
    assert warning.message.endswith(
        f"camunda:formKey 'camunda-forms:app:approve-invoice.form': {tmp_path / 'approve-invoice.form'} is no such "
        "file, so answers to this task are not checked against a form; Camunda deploys the form with the BPMN: put "
        "its approve-invoice.form beside the BPMN")


def test_a_scoped_call_that_waits_for_a_person_resumes_in_a_fresh_engine(tmp_path: Path) -> None:
    """A call with out mappings runs in a scope of its own (README); a person's step inside the called
    process makes it wait: loaded anew from sqlite and answered, it ends as an uninterrupted run
    would, with only the out mappings given back."""
    path = rewritten(tmp_path, REALWORLD / "call_mapping_renamed.bpmn", [(
        '<bpmn:sequenceFlow id="c1" sourceRef="check_start" targetRef="inspect" />',
        '<bpmn:sequenceFlow id="c1" sourceRef="check_start" targetRef="look" /><bpmn:userTask id="look" />'
        '<bpmn:sequenceFlow id="c0" sourceRef="look" targetRef="inspect" />')])
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    engine = Engine(store=url)
    waiting = engine.run(engine.start(load_process([path], process_id="claim_intake"), {"claimId": "C-5"}))
    assert waiting.status == "waiting" and [w["task_id"] for w in waiting.waiting_for] == ["look"]
    fresh = Engine(store=url)
    done = fresh.complete_user_task(fresh.load(waiting.id), "look", {"seen": True})
    assert done.status == "completed", done.error
    assert variables(done.main) == {"claimId": "C-5", "claimOk": True, "checkedOn": "2026-01-31"}
