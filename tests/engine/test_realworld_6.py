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
from gateways.conditions import is_flow_sentence

from test_realworld_4 import plain, problems, rewritten
from test_realworld_5 import plain_camunda

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


# -- DMN ----------------------------------------------------------------------------------------------


def test_a_default_output_entry_is_refused_with_the_catch_all_rule_to_write(tmp_path: Path) -> None:
    """dmn-scala's and Camunda's tables give an output a defaultOutputEntry: its value when no rule
    matches. Validate passed it, and SpiffWorkflow 3.2 does not read it: for a zone no rule names,
    the fee was never set and the next script stopped with "NameError: name 'fee' is not defined"
    (plain SpiffWorkflow likewise ends without it). Validate now refuses it, naming the output and
    the rule to write; that rule gives the default in layerflow as in plain SpiffWorkflow."""
    bpmn, table = REALWORLD / "default_output.bpmn", REALWORLD / "default_output.dmn"
    [problem] = problems(bpmn, table)
    assert (problem.code, problem.element_id, problem.field, problem.line) == (
        "dmn_unsupported", "out_fee", "defaultOutputEntry", 11)
    assert problem.file == str(table)
    assert problem.message == (
        "decision 'shipping_fee', output 'fee': its defaultOutputEntry (25) is the value when no rule matches, "
        "and SpiffWorkflow 3.2 does not read it: when no rule matches, 'fee' is not set, and the first condition "
        "or script that reads it stops the run; remove it and add a last rule whose 1 input entry is empty (it "
        "matches anything) and whose output is 25: the first matching rule decides, so it gives the value only "
        "when no other rule matches")
    # as validate said: no default entry, a last rule that matches anything
    source = table.read_text()
    default = '<defaultOutputEntry id="out_fee_default"><text>25</text></defaultOutputEntry>'
    assert default in source
    source = source.replace(default, "").replace("    </decisionTable>", (
        '      <rule id="elsewhere"><inputEntry id="elsewhere_zone"><text></text></inputEntry>'
        '<outputEntry id="elsewhere_fee"><text>25</text></outputEntry></rule>\n    </decisionTable>'))
    fixed = tmp_path / "default_output.dmn"
    fixed.write_text(source)
    fixed_bpmn = tmp_path / "default_output.bpmn"
    fixed_bpmn.write_text(bpmn.read_text())
    assert problems(fixed_bpmn, fixed) == []
    for zone, fee in (("europe", 12), ("asia", 25)):
        expected = plain_camunda(fixed_bpmn, [fixed], "default_output", {"zone": zone, "amount": 100})
        assert expected["fee"] == fee
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, fixed]), {"zone": zone, "amount": 100}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == expected


def test_a_literal_expression_decision_is_refused_once_with_the_script_to_write(tmp_path: Path) -> None:
    """dmn-scala's greeting decision (and the DMN TCK's) is a literalExpression, not a table.
    Validate said twice that it could not run it: at the DMN, "has no decision table ... (no
    literal expressions ...)" with nothing to do, and at the business rule task, "SpiffWorkflow
    cannot load the process: IndexError('list index out of range') ... fix the BPMN element named
    here", where the BPMN is right. It now says it once, at the decision, with the script task
    that computes the same, which then runs."""
    bpmn, table = REALWORLD / "literal_decision.bpmn", REALWORLD / "literal_decision.dmn"
    found = problems(bpmn, table)
    assert [(p.code, p.file, p.element_id, p.field, p.line) for p in found] == [
        ("dmn_unsupported", str(table), "vat", "literalExpression", 7)]
    assert found[0].message == (
        "decision 'vat' is a literal expression ('amount * 0.2'), not a decision table; SpiffWorkflow 3.2 runs "
        "a decision by exactly one dmn:decisionTable: draw a script task in place of the business rule task "
        "that runs it, with the script vat = amount * 0.2")
    task = ('<bpmn:businessRuleTask id="tax" name="Work out the VAT" camunda:decisionRef="vat">\n'
            '      <bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>\n'
            '    </bpmn:businessRuleTask>')
    source = bpmn.read_text()
    assert task in source
    fixed = tmp_path / "literal_decision.bpmn"
    fixed.write_text(source.replace(task, '<bpmn:scriptTask id="tax"><bpmn:incoming>f1</bpmn:incoming>'
                                          '<bpmn:outgoing>f2</bpmn:outgoing><bpmn:script>vat = amount * 0.2'
                                          '</bpmn:script></bpmn:scriptTask>'))
    assert problems(fixed) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {"amount": 50}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"amount": 50, "vat": 10.0}


def test_a_flowable_dmn_task_is_named_with_the_business_rule_task_to_draw(tmp_path: Path) -> None:
    """Flowable's intro example runs its decision from a service task of flowable:type="dmn" whose
    decisionTableReferenceKey field names it. Validate said to give the step a handler or an llm:
    block, as for any service task of another engine, and the run stopped at the task for want of
    a handler. It now names the decision and the business rule task to draw, which then runs it."""
    path = REALWORLD / "flowable_dmn_task.bpmn"
    [said] = [p for p in validate_process([path]).problems if p.code == "foreign_extension"]
    assert (said.element_id, said.severity) == ("route", "warning")
    assert said.message.endswith(
        "it runs DMN decision 'route_claim' (the flowable:type=\"dmn\" task and its decisionTableReferenceKey "
        "field): draw a bpmn:businessRuleTask instead, with camunda:decisionRef=\"route_claim\" (or "
        "<spiffworkflow:calledDecisionId>), and give the .dmn file (`layerflow run PROCESS.bpmn DECISION.dmn`, "
        "or put it beside the process)")
    source = path.read_text()
    task = source[source.index('<serviceTask id="route"'):source.index("</serviceTask>") + len("</serviceTask>")]
    fixed = tmp_path / "flowable_dmn_task.bpmn"
    fixed.write_text(source.replace(task, '<businessRuleTask id="route" camunda:decisionRef="route_claim" '
                                          'xmlns:camunda="http://camunda.org/schema/1.0/bpmn" />'))
    table = REALWORLD / "first_hit.dmn"
    assert problems(fixed, table) == []
    for score, route in ((20, "manual"), (80, "auto")):
        expected = plain_camunda(fixed, [table], "flowable_dmn_task", {"score": score})
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed, table]), {"score": score}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == expected
        assert expected["route"] == route


# -- odd but valid BPMN -----------------------------------------------------------------------------------


def test_a_call_activity_calling_a_global_task_is_named_as_such() -> None:
    """BPMNspector's test processes call a bpmn:globalTask from a call activity. Validate said
    "calledElement='GT_1' is no process of FILE; add the BPMN file that defines it to the files
    validated and run, or fix the id", while the file given defines it, as a global task, which
    SpiffWorkflow does not call. It now says what the element is and what to draw."""
    path = REALWORLD / "call_global_task.bpmn"
    [problem] = problems(path)
    assert (problem.code, problem.element_id, problem.field, problem.line) == (
        "call_activity_unknown_process", "sign_off", "calledElement", 8)
    assert problem.message == (
        f"calledElement='approve' is the bpmn:globalUserTask of {path}, and SpiffWorkflow's call activity calls a "
        "bpmn:process only: draw the task itself in place of call activity 'sign_off', or make 'approve' a "
        "bpmn:process (a start event, the task, an end event)")


# -- jBPM / Kogito ------------------------------------------------------------------------------------


def test_a_java_return_statement_as_a_condition_is_code_not_a_sentence(tmp_path: Path) -> None:
    """Kogito's traffic-violation example branches on ``return "yes".equalsIgnoreCase(suspended);``
    (language Java). Its words made it a designer's sentence: validate warned that a model would
    decide the flow, and without one the flow was not taken. It is Java: refused with the Python to
    write, which then runs as in plain SpiffWorkflow."""
    for java in ('return "yes".equalsIgnoreCase(suspended);', "return driver.isValidLicense();",
                 'status.equals("open");'):
        assert not is_flow_sentence(java), java
    assert is_flow_sentence("the customer is a returning customer")
    assert is_flow_sentence("Ship it with DHL.com (express)")
    path = REALWORLD / "java_return_conditions.bpmn"
    found = problems(path)
    assert [(p.code, p.element_id, p.field) for p in found] == [
        ("condition_syntax", "yes", "conditionExpression"), ("condition_syntax", "no", "conditionExpression")]
    assert found[0].message.endswith(
        "invalid syntax in 'return \"yes\".equalsIgnoreCase(customsHold);'; a condition is an expression: no "
        "'return', no ';'; write 'customsHold.lower() == \"yes\"'")
    assert found[1].message.endswith(
        "a condition is an expression: no 'return', no ';'; write "
        "'not customsHold.lower() == \"yes\" and carrier == \"post\"'")
    fixed = rewritten(tmp_path, path, [
        ('return "yes".equalsIgnoreCase(customsHold);', 'customsHold.lower() == "yes"'),
        ('return !"yes".equalsIgnoreCase(customsHold) && carrier.equals("post");',
         'not customsHold.lower() == "yes" and carrier == "post"')])
    assert problems(fixed) == []
    for hold, step in (("YES", "release"), ("no", "deliver")):
        data = {"customsHold": hold, "carrier": "post"}
        expected = plain(fixed, "java_return_conditions", data).last_task.data
        assert expected["step"] == step
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), data))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == dict(expected)


def test_a_java_condition_calling_a_method_of_a_value_says_values_have_none(tmp_path: Path) -> None:
    """``return driver.isValidLicense();``: no Python twin to suggest (a context value is JSON)."""
    source = (REALWORLD / "java_return_conditions.bpmn").read_text()
    path = tmp_path / "java_return_conditions.bpmn"
    path.write_text(source.replace('return "yes".equalsIgnoreCase(customsHold);', "return parcel.isHeld();"))
    said = next(p for p in problems(path) if p.element_id == "yes")
    assert said.message.endswith(
        "a condition is an expression: no 'return', no ';', and it is Python over the context, whose values have "
        "no Java methods: write the test of 'parcel.isHeld()' in Python")


# -- Activiti -------------------------------------------------------------------------------------------


def test_activiti_timer_settings_are_named_as_not_run() -> None:
    """Activiti's timer tests stop a cycle at activiti:endDate and count a duration in a business
    calendar (activiti:businessCalendarName). Validate said nothing of either: the reminder would
    repeat for ever past the end date, and the wait be counted round the clock."""
    found = [p for p in validate_process([REALWORLD / "timer_engine_settings.bpmn"]).problems
             if p.code == "foreign_extension"]
    assert [(p.element_id, p.field, p.severity, p.line) for p in found] == [
        ("cool_off", "activiti:businessCalendarName", "warning", 9),
        ("remind", "activiti:endDate", "warning", 14)]
    calendar, end = found
    assert calendar.message == (
        "timer 'cool_off' (bpmn:intermediateCatchEvent) has activiti:businessCalendarName='office', another "
        "engine's timer setting that layerflow does not run (nor does SpiffWorkflow): it names the calendar whose "
        "working hours the time is counted in, and here it is counted in plain time, round the clock: write the "
        "time as plain time")
    assert end.message.endswith(
        "it sets the date its repetitions stop, and here the cycle repeats as many times as its R<n> says (for ever "
        "when there is no n), whatever the date: give the count in the cycle (R5/PT10S), or end the waiting by "
        "another path")


def test_a_start_events_initiator_variable_is_named_with_the_start_data_to_give() -> None:
    """Flowable's vacation request starts with flowable:initiator="employeeName": the engine sets
    that variable to the user who started the instance, and a later step reads it. Validate said
    nothing, and the step stopped with a NameError. It is now a warning naming the variable, and the
    instance runs once the start data gives it."""
    path = REALWORLD / "start_initiator.bpmn"
    [said] = [p for p in validate_process([path]).problems if p.code == "foreign_extension"]
    assert (said.element_id, said.severity) == ("start", "warning")
    assert said.message.endswith(
        "has camunda:initiator, another engine's settings that layerflow does not run (nor does SpiffWorkflow's "
        "own parser): it names the variable ('requester') that the engine sets to the user who started the "
        "instance; nothing sets it here: give 'requester' in the start data (--data)")
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {"requester": "ana"}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"requester": "ana", "greeting": "Dear ana"}


def test_a_decision_output_with_no_name_is_named_before_the_run(tmp_path: Path) -> None:
    """dmn-js's decision tables (its editor's test tables) hold an output whose name and label
    were never typed. Validate passed, and the run stopped at the business rule task with "value
    for key '' is not JSON-compatible: keys must be non-empty strings" (no DMN file, no output named,
    nothing to do). Validate now refuses it at the output, and warns of an output whose label alone
    gives its key; named, the table runs as in plain SpiffWorkflow."""
    bpmn, table = REALWORLD / "unnamed_output.bpmn", REALWORLD / "unnamed_output.dmn"
    found = [p for p in validate_process([bpmn, table]).problems if p.code == "dmn_unsupported"]
    assert [(p.element_id, p.field, p.severity, p.line) for p in found] == [
        ("out_unnamed", "name", "error", 11), ("out_review", "name", "warning", 12)]
    assert found[0].file == str(table)
    assert found[0].message == (
        "decision 'bonus', output 'out_unnamed' has no name and no label: SpiffWorkflow sets the variable an "
        "output's name gives (else its label), so this one's value would go under an empty key, and the run stops "
        "at the business rule task; give the output the variable to set: name=\"...\"")
    assert found[1].message == (
        "decision 'bonus', output 'out_review' has no name, so SpiffWorkflow sets its label, 'Needs review', which "
        "no condition or script can read by its name; give the output the variable to set: name=\"needs_review\"")
    fixed = tmp_path / "unnamed_output.dmn"
    fixed.write_text(table.read_text().replace('label="" typeRef', 'label="" name="amount" typeRef')
                     .replace('label="Needs review"', 'label="Needs review" name="needs_review"'))
    fixed_bpmn = tmp_path / "unnamed_output.bpmn"
    fixed_bpmn.write_text(bpmn.read_text())
    assert problems(fixed_bpmn, fixed) == []
    for grade in ("A", "C"):
        expected = plain_camunda(fixed_bpmn, [fixed], "unnamed_output", {"grade": grade})
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, fixed]), {"grade": grade}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == expected
    assert expected == {"grade": "C", "band": "low", "amount": 100, "needs_review": False}


def test_a_script_kept_in_a_deployment_file_is_named_with_where_to_copy_it() -> None:
    """camunda:resource="deployment://score.py" gives a script task its script from a file of the
    deployment. Validate said the task has no script, with no word of the file it names."""
    said = [p for p in validate_process([REALWORLD / "script_resource.bpmn"]).problems
            if p.code == "foreign_extension"]
    assert [(p.element_id, p.severity) for p in said] == [("score", "warning")]
    assert said[0].message.endswith(
        "has camunda:resource, another engine's settings that layerflow does not run (nor does SpiffWorkflow's own "
        "parser): copy the Python of the file it names into the task's bpmn:script")


def test_feel_one_word_functions_in_a_decision_table_are_refused_with_the_python_to_write(tmp_path: Path) -> None:
    """A table's output entries call FEEL's string(), count() and floor(): each parses as Python, so
    validate passed it, and the run stopped at the business rule task with "condition 'string(amount)
    + " EUR"' ... NameError: name 'string' is not defined; ... give 'string' a value" (an output
    entry called a condition, a function to give a value, no DMN file or rule). Each is refused at
    its entry with the Python to write, which then decides as in plain SpiffWorkflow."""
    bpmn, table = REALWORLD / "feel_builtin_calls.bpmn", REALWORLD / "feel_builtin_calls.dmn"
    found = {p.element_id: p for p in problems(bpmn, table)}
    assert set(found) == {"priced_label", "priced_lines", "priced_tens"}
    assert all(p.code == "dmn_unsupported" and p.file == str(table) and p.field == "outputEntry"
               for p in found.values())
    assert found["priced_label"].message.endswith(
        """outputEntry 'string(amount) + " EUR"' is not what SpiffWorkflow's DMN engine runs (Python, not FEEL); """
        """string() is FEEL's, no function here: write it as 'str(amount) + " EUR"'""")
    assert found["priced_lines"].message.endswith("count() is FEEL's, no function here: write it as 'len(items)'")
    assert found["priced_tens"].message.endswith(
        "floor() is FEEL's, no function here: write it as a Python expression (floor(x): int(x // 1))")
    fixed = rewritten(tmp_path, table, [("string(amount)", "str(amount)"), ("count(items)", "len(items)"),
                                        ("floor(amount / 10)", "int(amount / 10 // 1)")])
    fixed_bpmn = tmp_path / "feel_builtin_calls.bpmn"
    fixed_bpmn.write_text(bpmn.read_text())
    assert problems(fixed_bpmn, fixed) == []
    for amount in (42, 0):
        data = {"amount": amount, "items": ["a", "b"]}
        expected = plain_camunda(fixed_bpmn, [fixed], "feel_builtin_calls", data)
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, fixed]), data))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == expected
    assert (expected["label"], expected["lines"]) == ("free", 0)


def test_a_decision_entry_that_fails_at_run_time_is_named_as_an_entry_not_a_condition(tmp_path: Path) -> None:
    """An output entry that reads a key the context does not hold (a variable, valid Python, so
    validate passes it): the run stopped with "condition 'queue' at 'route' failed", a business rule
    task having no condition. The error now names the entry, its rule and its table."""
    table = tmp_path / "first_hit.dmn"
    source = (REALWORLD / "first_hit.dmn").read_text()
    assert source.count('<text>"manual"</text>') == 1
    table.write_text(source.replace('<text>"manual"</text>', "<text>queue</text>"))
    bpmn = tmp_path / "first_hit.bpmn"
    bpmn.write_text((REALWORLD / "first_hit.bpmn").read_text())
    assert problems(bpmn, table) == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([bpmn, table]), {"score": 20}))
    assert instance.status == "error"
    message = instance.error["message"]
    assert "output entry of rule 'low_score' of decision table 'table_route_claim': 'queue' at " in message
    assert "condition 'queue'" not in message
    assert "NameError: name 'queue' is not defined" in message


# -- Camunda 8 ------------------------------------------------------------------------------------------


def test_a_feel_is_defined_condition_gets_the_python_test_to_write(tmp_path: Path) -> None:
    """Camunda 8's get-up example branches on ``=is defined(breakfastPrepared)`` and
    ``=not(is defined(breakfastPrepared))``. Validate refused them with "rewrite it as a Python
    expression over the process variables", no Python to write. It now gives the test, which
    decides as in plain SpiffWorkflow."""
    path = REALWORLD / "feel_is_defined.bpmn"
    found = {p.element_id: p for p in problems(path)}
    assert set(found) == {"with_coupon", "without_coupon"}
    assert found["with_coupon"].message.endswith("""write "'coupon' in locals()\"""")
    assert found["without_coupon"].message.endswith("""write "'coupon' not in locals()\"""")
    fixed = rewritten(tmp_path, path, [(">=is defined(coupon)<", ">'coupon' in locals()<"),
                                       (">=not(is defined(coupon))<", ">'coupon' not in locals()<")])
    assert problems(fixed) == []
    for data, price in (({"coupon": "SPRING"}, 80), ({}, 100)):
        expected = plain(fixed, "feel_is_defined", data).last_task.data
        assert expected["price"] == price
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed]), data))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == dict(expected)


def test_feel_durations_compared_in_a_table_get_a_test_over_numbers(tmp_path: Path) -> None:
    """dmn-js's tables compare yearMonthDuration inputs: ``< duration("P6M")``,
    ``[duration("P6M")..duration("P2Y")[``. Validate said to write the ISO 8601 text, claiming it
    "compares in time order when written alike": for durations it does not ("P1Y" sorts before
    "P6M"), and a tenure of P1Y would have been rated "new". It now says so, with the same test over
    months, which decides as in plain SpiffWorkflow."""
    bpmn, table = REALWORLD / "feel_durations.bpmn", REALWORLD / "feel_durations.dmn"
    found = {p.element_id: p for p in problems(bpmn, table)}
    assert set(found) == {"new_tenure", "regular_tenure"}
    for said in found.values():
        assert "compares in time order" not in said.message
        assert ("""ISO 8601 durations do not compare in order as text ("P10D" sorts before "P2D", "P1Y" """
                """before "P6M"): give the input as a number of months (or days) and compare numbers""") in said.message
    assert found["new_tenure"].message.endswith("in months, write '< 6'")
    assert found["regular_tenure"].message.endswith("in months, write '6 <= ? < 24'")
    fixed = rewritten(tmp_path, table, [('&lt; duration("P6M")', "&lt; 6"),
                                        ('[duration("P6M")..duration("P2Y")[', "6 &lt;= ? &lt; 24"),
                                        ('typeRef="yearMonthDuration"', 'typeRef="number"')])
    fixed_bpmn = tmp_path / "feel_durations.bpmn"
    fixed_bpmn.write_text(bpmn.read_text())
    assert problems(fixed_bpmn, fixed) == []
    for months, tier in ((3, "new"), (12, "regular"), (30, "loyal")):
        expected = plain_camunda(fixed_bpmn, [fixed], "feel_durations", {"tenure": months})
        engine = Engine(store="memory://")
        instance = engine.run(engine.start(load_process([fixed_bpmn, fixed]), {"tenure": months}))
        assert instance.status == "completed", instance.error
        assert variables(instance.main) == expected
        assert expected["tier"] == tier
