"""Public reference models, round 20, each written again in ``tests/engine/realworld20/`` (the file says
what it follows and what it leaves out): SpiffWorkflow's own test data Parallel-Looping-After-Join (a
parallel gateway drawn "Mixed", which joins a loop and splits again) and call_activity_nested (a
business rule task naming the DMN file's definitions id), the MIWG reference models C.1.0 (Camunda's
invoice process beside the team assistant's pool, whose scan starts it by a message flow), C.2.0 (the
Customer pool) and C.3.0 (the fridge repair: token quantities, a condition reading "Service Level"),
Camunda 7's job announcement (JUEL ``#{...}`` conditions and bean calls) and a Camunda 8 order with a
rollback on a payment error. Each is validated as given (validate says what is wrong, naming the
element and what to write), then, edited as validate says, run to its end with people's answers."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import flow, path_of, variables, write_elements
from test_realworld_4 import rewritten
from test_realworld_10 import plain_in_order
from test_realworld_12 import problems
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld20"


def answered(paths: list[Path], data: dict[str, Any], steps: list[tuple[str, dict[str, Any]]]) -> Any:
    """A layerflow instance whose people answer ``steps`` one at a time, in order."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process(paths), data))
    for task_id, answer in steps:
        assert task_id in [w["task_id"] for w in instance.waiting_for], (task_id, instance.waiting_for)
        instance = engine.run(instance, answers={"user_tasks": {task_id: answer}})
    return instance


# -- SpiffWorkflow's Parallel-Looping-After-Join: a mixed parallel gateway -------------------------

LOOPING = HERE / "parallel_looping_after_join.bpmn"
ROUND = [("task_1", {"one": 1}), ("task_2", {"two": 2}), ("task_2a", {"two_a": 1}), ("task_2b", {"two_b": 1}),
         ("task_2_done", {"two_done": True})]


def test_a_mixed_gateway_that_joins_the_retry_loop_is_no_reentered_join() -> None:
    """The gateway drawn "Mixed" joins the start's flow and the retry loop, then splits into 1 and 2;
    2 splits again (2A, 2B), joined before "2 Done". validate warned that the mixed gateway joined the
    inner split's branches and that the loop re-entered them through 1: the inner branches are joined
    (join_2) before anything reaches the mixed gateway. No problem now."""
    assert problems(LOOPING) == []


def test_parallel_looping_after_join_runs_two_rounds_as_plain_spiffworkflow_does() -> None:
    steps = [*ROUND, ("retry", {"retry": "Yes"}), ("retrying", {"again": True}), *ROUND,
             ("retry", {"retry": "No"}), ("done", {"finished": True})]
    instance = answered([LOOPING], {}, steps)
    assert instance.status == "completed", instance.error
    wf = plain_in_order(LOOPING, "parallel_looping_after_join", steps)
    assert wf.is_completed()
    assert path_of(instance.workflow) == path_of(wf)
    assert path_of(wf).count("mixed") == 2 and path_of(wf).count("join_all") == 2
    assert variables(instance.main) == {k: v for k, v in wf.last_task.data.items()}


def test_a_loop_back_into_the_branches_a_mixed_gateway_joins_still_warns(tmp_path: Path) -> None:
    """The fix looks past a join that merges the inner split's branches first; where the mixed
    gateway itself joins a split's branches and a loop goes back into one of them, the warning stays."""
    path = write_elements(tmp_path, "mixed_reentered", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>', '<bpmn:task id="a"/>',
        '<bpmn:task id="b"/>', '<bpmn:parallelGateway id="mixed"/>', '<bpmn:task id="c"/>', '<bpmn:task id="d"/>',
        '<bpmn:parallelGateway id="join"/>', '<bpmn:exclusiveGateway id="again" default="again_to_end"/>',
        '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "a"), flow("split", "b"), flow("a", "mixed"), flow("b", "mixed"),
        flow("mixed", "c"), flow("mixed", "d"), flow("c", "join"), flow("d", "join"), flow("join", "again"),
        flow("again", "a", "retry"), flow("again", "end")])
    assert ("join_reentered_in_loop", "warning", "mixed") in problems(path)


# -- SpiffWorkflow's call_activity_nested: a DMN definitions id for a decision id -------------------

NESTED = HERE / "call_activity_nested"
NESTED_FILES = [NESTED / "call_activity_nested.bpmn", NESTED / "call_activity_level_2.bpmn",
                NESTED / "call_activity_level_2b.bpmn", NESTED / "call_activity_level_3.bpmn"]


def test_the_nested_calls_are_refused_naming_each_file_and_the_decision_ids_of_the_dmn_file() -> None:
    """As written: the 2b file's process kept the id Level2, Level1 calls Level2b, Level3 calls itself
    on its only path, and calledDecisionId "Level2c" is the id of level2c.dmn's definitions. validate
    said no DMN file defines 'Level2c' while giving that very file; it says what 'Level2c' is and the
    decision id to write."""
    found = {(p.code, p.element_id): str(p) for p in validate_process([*NESTED_FILES, NESTED / "level2c.dmn"]).problems}
    assert set(found) == {("duplicate_id", "Level2"), ("call_activity_unknown_process", "Activity_0rkbhbz"),
                          ("call_activity_recursion", "Activity_12zat0d"),
                          ("business_rule_without_dmn", "Activity_0gg4414")}
    dmn_said = found["business_rule_without_dmn", "Activity_0gg4414"]
    assert "'Level2c' is the id of" in dmn_said and "level2c.dmn's definitions" in dmn_said
    assert "'Decision_0vrtcmk'" in dmn_said and "no DMN file" not in dmn_said
    assert "<spiffworkflow:calledDecisionId>Decision_0vrtcmk</spiffworkflow:calledDecisionId>" in dmn_said


def nested_fixed(tmp_path: Path) -> list[Path]:
    out = tmp_path / "nested"
    shutil.copytree(NESTED, out)
    rewritten(out, out / "call_activity_nested.bpmn", [(">Level2c<", ">Decision_0vrtcmk<"),
                                                      ('decisionRef="Level2c"', 'decisionRef="Decision_0vrtcmk"')])
    rewritten(out, out / "call_activity_level_2b.bpmn", [('id="Level2"', 'id="Level2b"')])
    rewritten(out, out / "call_activity_level_3.bpmn", [
        ('<bpmn:callActivity id="Activity_12zat0d" name="call level 3" calledElement="Level3"/>',
         '<bpmn:scriptTask id="Activity_12zat0d" name="level 3"><bpmn:script>level = "three"</bpmn:script>'
         '</bpmn:scriptTask>')])
    return [out / p.name for p in NESTED_FILES] + [out / "level2c.dmn"]


def test_the_nested_calls_fixed_run_through_three_levels_and_the_decision_as_plain_spiffworkflow(tmp_path: Path) -> None:
    files = nested_fixed(tmp_path)
    assert validate_process(files).problems == ()
    steps = [("Activity_16ayqi8", {"checked": True})]
    instance = answered(files, {}, steps)
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"level": "three", "checked": True, "my_other_var": "World"}
    parser = SpiffBpmnParser()  # plain SpiffWorkflow, its one person's step answered alike
    parser.add_bpmn_files([str(p) for p in files[:-1]])
    parser.add_dmn_files([str(files[-1])])
    wf = BpmnWorkflow(parser.get_spec("Level1"), parser.get_subprocess_specs("Level1"))
    wf.do_engine_steps()
    [person] = wf.get_tasks(state=TaskState.READY, manual=True)
    person.data.update(steps[0][1])
    person.run()
    wf.do_engine_steps()
    assert wf.is_completed() and wf.last_task.data["my_other_var"] == "World"
    assert path_of(instance.workflow) == path_of(wf)


# -- MIWG C.1.0: the invoice process, started by the team assistant's scan ---------------------------

C10 = HERE / "miwg_c10_invoice.bpmn"
C10_ANSWERS = [("assignApprover", {"approver": "mary"}), ("approveInvoice", {"approved": False}),
               ("reviewInvoice", {"clarified": "yes"}), ("approveInvoice", {"approved": True}),
               ("prepareBankTransfer", {"transferred": True}), ("archiveInvoice", {"archived": True})]


def c10_runnable(tmp_path: Path, *, plain_start: bool = False) -> Path:
    """C.1.0 as validate says: Python conditions, no data store, the archive step a person's."""
    text = C10.read_text()

    def cut(start: str, end: str) -> str:
        at = text.index(start)
        return text[at:text.index(end, at) + len(end)]

    edits = [("${approved}", "approved"), ("${!approved}", "not approved"),
             ("${clarified == 'yes'}", "clarified == 'yes'"), ("${clarified == 'no'}", "clarified == 'no'"),
             (cut("<dataStore id", "/>"), ""), (cut("<dataStoreReference", "/>"), ""),
             (cut("<dataOutputAssociation", "</dataOutputAssociation>"), ""),
             ('<serviceTask id="archiveInvoice" camunda:delegateExpression="#{archiveService}"', '<userTask id="archiveInvoice"'),
             ('implementation="webService"/>\n    <endEvent id="invoiceProcessed"', '/>\n    <endEvent id="invoiceProcessed"')]
    if plain_start:
        edits.append(('<messageEventDefinition id="StartEvent_1_def" messageRef="invoice_received_message"/>\n'
                      '    </startEvent>', '</startEvent>'))
        edits.append(('name="Invoice&#xA;received">\n      </startEvent>', 'name="Invoice&#xA;received"/>'))
    return rewritten(tmp_path, C10, edits)


def test_the_miwg_invoice_is_refused_for_its_juel_conditions_and_data_store_and_warns_of_its_start() -> None:
    refused = said(C10)
    assert "write 'not approved'" in refused["invoiceNotApproved"] and "JUEL" in refused["invoiceNotApproved"]
    assert "write \"clarified == 'yes'\"" in refused["reviewSuccessful"]
    assert "has no implementation" in refused["financial_accounting"]
    bean = refused["archiveInvoice"]
    assert "'#{archiveService}'" in bean and "naming 'archiveService', a Java bean" in bean
    start = refused["scanned_invoice_flow"]
    assert start.startswith("warning:") and "from pool 'Team-Assistant'" in start
    assert "message start event 'StartEvent_1'" in start and "'invoice-received-C.1.0'" in start
    assert "layerflow send INSTANCE_ID invoice-received-C.1.0 --data PAYLOAD" in start
    assert "draw a plain start event" in start


def test_a_message_start_fed_from_a_black_box_pool_says_the_message_comes_from_outside_the_files() -> None:
    """realworld16's message receiver: the sending pool has no process, so running it too is no advice."""
    text = said(Path(__file__).resolve().parent / "realworld16" / "message_start_error_handler.bpmn")["Flow_1lktxcr"]
    assert "from pool 'Message Sender' starts process 'Process_MessageReceiverNotification'" in text
    assert "is drawn as a black box" in text and "run the collaboration" not in text


@pytest.mark.parametrize("condition, said_of_it", [
    ("${approved}", "(Camunda 7's ${...})"),
    ("#{approved}", "(JUEL's deferred #{...}, as Camunda 7, Activiti and Flowable write it, evaluated as ${...} is)"),
], ids=["dollar", "hash"])
def test_a_juel_condition_is_named_by_its_own_delimiters(tmp_path: Path, condition: str, said_of_it: str) -> None:
    path = rewritten(tmp_path, C10, [("${approved}", condition)])
    text = said(path)["invoiceApproved"]
    assert f"condition '{condition}' is a JUEL expression {said_of_it}" in text and "write 'approved'" in text


def test_the_miwg_invoice_waits_at_its_message_start_until_the_scan_is_sent_then_runs_to_its_end(tmp_path: Path) -> None:
    path = c10_runnable(tmp_path)
    assert problems(path) == [("message_flow_from_outside", "warning", "scanned_invoice_flow"),
                              ("gateway_not_exhaustive", "warning", "reviewSuccessful_gw")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "waiting"
    assert [(w["task_id"], w.get("event")) for w in instance.waiting_for] == [("StartEvent_1", "invoice-received-C.1.0")]
    instance = engine.send_event(instance, "invoice-received-C.1.0", {"invoice_number": "R-42", "amount": 130})
    for task_id, answer in C10_ANSWERS:
        instance = engine.run(instance, answers={"user_tasks": {task_id: answer}})
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-3:] == ["prepareBankTransfer", "archiveInvoice", "invoiceProcessed"]
    assert variables(instance.main)["invoice_number"] == "R-42"


def test_the_miwg_invoice_with_a_plain_start_event_starts_with_its_data_and_warns_of_nothing(tmp_path: Path) -> None:
    """validate's other advice: a plain start event starts the instance at once with the run's data."""
    path = c10_runnable(tmp_path, plain_start=True)
    assert problems(path) == [("gateway_not_exhaustive", "warning", "reviewSuccessful_gw")]
    instance = answered([path], {"invoice_number": "R-43"}, C10_ANSWERS[:2] + [("reviewInvoice", {"clarified": "no"})])
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow)[-1] == "invoiceNotProcessed"


# -- MIWG C.3.0: the fridge repair -----------------------------------------------------------------

C30 = HERE / "miwg_c30_fridge_repair.bpmn"


def test_the_miwg_fridge_repair_is_refused_saying_how_to_write_a_name_with_a_space_and_warns_of_token_quantities() -> None:
    refused = said(C30)
    premium = refused["premium"]
    assert "'Service Level' is a name with spaces" in premium and "name the key service_level" in premium
    assert "write \"service_level == 'Premium'\"" in premium
    quantity = refused["analyse_request"]
    assert quantity.startswith("warning:") and "startQuantity='2'" in quantity and "completionQuantity='2'" in quantity
    assert "SpiffWorkflow ignores" in quantity
    assert [p for p in problems(C30) if p[0] == "token_quantity"] == [("token_quantity", "warning", "analyse_request")]
    assert 'write it as a string: "PT2H"' in refused["two_hours"]
    assert "has no start event" in refused["emergency_repair"]


@pytest.mark.parametrize("condition, written, severity", [
    ("Credit Score > 600", "credit_score > 600", "error"),
    ("Customer Age >= 18 and not Blocked", "customer_age >= 18 and not Blocked", "error"),
    # six words and no ==-like operator: read as a sentence (the model decides it), with the expression
    # it would be named beside, for a designer who meant one
    ("amount > 5 and Risk Level in ('high', 'very high')", "amount > 5 and risk_level in ('high', 'very high')",
     "warning"),
], ids=["comparison", "conjunction", "read-as-a-sentence"])
def test_a_condition_reading_a_name_with_spaces_says_the_python_name_to_write(tmp_path: Path, condition: str,
                                                                              written: str, severity: str) -> None:
    path = write_elements(tmp_path, "spaced", [
        '<bpmn:startEvent id="start"/>', '<bpmn:exclusiveGateway id="gw" default="gw_to_no"/>',
        '<bpmn:endEvent id="yes"/>', '<bpmn:endEvent id="no"/>',
        flow("start", "gw"), flow("gw", "yes", condition), flow("gw", "no")])
    text = said(path)["gw_to_yes"]
    assert text.startswith(f"{severity}:") and f"write {written!r}" in text and "is a name with spaces" in text


def test_a_sentence_that_joined_up_parses_is_still_only_a_sentence(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "sentence", [
        '<bpmn:startEvent id="start"/>', '<bpmn:exclusiveGateway id="gw" default="gw_to_no"/>',
        '<bpmn:endEvent id="yes"/>', '<bpmn:endEvent id="no"/>',
        flow("start", "gw"), flow("gw", "yes", "the applicant is reliable"), flow("gw", "no")])
    text = said(path)["gw_to_yes"]
    assert text.startswith("warning:") and "is a sentence" in text and "name with spaces" not in text


@pytest.mark.parametrize("attributes, warned", [
    ('startQuantity="2"', ["startQuantity='2'"]),
    ('completionQuantity="3"', ["completionQuantity='3'"]),
    ('startQuantity="1" completionQuantity="1"', []),
], ids=["start", "completion", "ones"])
def test_a_token_quantity_other_than_one_is_a_warning(tmp_path: Path, attributes: str, warned: list[str]) -> None:
    path = write_elements(tmp_path, "quantities", [
        '<bpmn:startEvent id="start"/>', f'<bpmn:scriptTask id="work" {attributes}><bpmn:script>x = 1</bpmn:script>'
        '</bpmn:scriptTask>', '<bpmn:endEvent id="end"/>', flow("start", "work"), flow("work", "end")])
    found = [str(p) for p in validate_process([path]).problems if p.code == "token_quantity"]
    assert len(found) == len(warned) and all(w in found[0] for w in warned)
    if not warned:  # the warning aside, the step runs once, as SpiffWorkflow runs it
        assert answered([path], {}, []).status == "completed"


def c30_runnable(tmp_path: Path) -> Path:
    return rewritten(tmp_path, C30, [
        ("<![CDATA[Service Level == 'Premium']]>", "<![CDATA[service_level == 'Premium']]>"),
        ("<![CDATA[PT2H]]>", '<![CDATA["PT2H"]]>'),
        ('gatewayDirection="Diverging"/>\n    <userTask id="replace_fridge"',
         'gatewayDirection="Diverging" default="regular"/>\n    <userTask id="replace_fridge"'),
        ('<exclusiveGateway id="successful" name="Successful?" gatewayDirection="Diverging"/>',
         '<exclusiveGateway id="successful" name="Successful?" gatewayDirection="Diverging" default="no"/>'),
        ('<exclusiveGateway id="service_level" name="Service level" gatewayDirection="Diverging"/>',
         '<exclusiveGateway id="service_level" name="Service level" gatewayDirection="Diverging" default="standard"/>'),
        ('sourceRef="service_type" targetRef="replace_fridge"/>',
         'sourceRef="service_type" targetRef="replace_fridge"><conditionExpression>service_type == "warranty"'
         '</conditionExpression></sequenceFlow>'),
        ('sourceRef="service_type" targetRef="emergency_repair"/>',
         'sourceRef="service_type" targetRef="emergency_repair"><conditionExpression>service_type == "emergency"'
         '</conditionExpression></sequenceFlow>'),
        ('sourceRef="successful" targetRef="emergency_done"/>',
         'sourceRef="successful" targetRef="emergency_done"><conditionExpression>repaired</conditionExpression>'
         '</sequenceFlow>'),
        ('triggeredByEvent="false"/>', 'triggeredByEvent="false"><startEvent id="emergency_start"/>'
         '<userTask id="emergency_fix" name="Fix on site"/><endEvent id="emergency_end"/>'
         '<sequenceFlow id="e1" sourceRef="emergency_start" targetRef="emergency_fix"/>'
         '<sequenceFlow id="e2" sourceRef="emergency_fix" targetRef="emergency_end"/></subProcess>'),
    ])


@pytest.mark.parametrize("analysis, steps, end", [
    ({"service_type": "regular", "service_level": "Premium"}, [("repair_premium", {"fixed": True})], "repair_completed"),
    ({"service_type": "warranty"}, [("replace_fridge", {"replaced": True})], "fridge_replaced"),
    ({"service_type": "emergency"}, [("emergency_fix", {"repaired": False}), ("replace_fridge", {"replaced": True})],
     "fridge_replaced"),
], ids=["premium", "warranty", "emergency-then-replaced"])
def test_the_miwg_fridge_repair_fixed_runs_from_the_customer_request_to_its_end(
        tmp_path: Path, analysis: dict[str, Any], steps: list[tuple[str, dict[str, Any]]], end: str) -> None:
    path = c30_runnable(tmp_path)
    assert problems(path) == [("token_quantity", "warning", "analyse_request")]
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    instance = engine.send_event(instance, "Service Level", {"customer": "C-7"})
    for task_id, answer in [("analyse_request", analysis), *steps]:
        instance = engine.run(instance, answers={"user_tasks": {task_id: answer}})
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done[-1] == end and done.count("analyse_request") == 1  # once, whatever the quantities ask


def test_a_customer_upgrading_to_premium_interrupts_the_standard_repair(tmp_path: Path) -> None:
    """The message boundary event on the standard repair catches the same "Service Level" message
    that starts the process: the standard repair is cancelled and the premium one runs."""
    path = c30_runnable(tmp_path)
    engine = Engine(store="memory://")
    instance = engine.send_event(engine.run(engine.start(load_process([path]), {})), "Service Level", {})
    instance = engine.run(instance, answers={"user_tasks": {"analyse_request": {"service_type": "regular",
                                                                                 "service_level": "Standard"}}})
    assert [w["task_id"] for w in instance.waiting_for if w["kind"] == "user_task"] == ["repair_standard"]
    instance = engine.send_event(instance, "Service Level", {"upgraded": True})
    instance = engine.run(instance, answers={"user_tasks": {"repair_premium": {"fixed": True}}})
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert "upgraded" in done and "repair_standard" not in done and done[-1] == "repair_completed"


# -- MIWG C.2.0: the Customer pool -----------------------------------------------------------------

C20 = HERE / "miwg_c20_customer.bpmn"


def c20_runnable(tmp_path: Path) -> Path:
    def decided(flow_id: str, condition: str) -> tuple[str, str]:
        old = next(line for line in C20.read_text().splitlines() if f'id="{flow_id}"' in line).strip()
        return old, old.replace("/>", f"><semantic:conditionExpression>{condition}</semantic:conditionExpression>"
                                      "</semantic:sequenceFlow>")

    return rewritten(tmp_path, C20, [
        ('isExecutable="false"', 'isExecutable="true"'),
        decided("shop_more", "not done"), decided("to_checkout", "done"),
        decided("not_accepted", "not accepted"), decided("accepted", "accepted"),
        decided("retry_yes", "retry"), decided("retry_no", "not retry")])


def test_the_miwg_customer_pool_is_refused_as_drawn_and_runs_once_its_splits_decide(tmp_path: Path) -> None:
    refused = said(C20)
    assert "isExecutable" in refused["WFP-Page_1-3"]
    assert sum("has no condition and is not the default flow" in t for t in refused.values()) == 6
    path = c20_runnable(tmp_path)
    assert problems(path) == []
    # "Retry?" decides on what the person paying answered (retry), as "Payment accepted?" does
    steps = [("browse", {"looked": 1}), ("add_item", {"done": False}), ("browse", {"looked": 2}),
             ("add_item", {"done": True}), ("pay_order", {"accepted": False, "retry": True}),
             ("pay_order", {"accepted": True}), ("receive_items", {"received": True})]
    instance = answered([path], {}, steps)
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    # the refusal given in advance is given again as Pay Order comes back in the same run, then not (README:
    # "not to a step it was given to before in the same run with nothing changed since"): two refusals
    assert done.count("browse") == 2 and done.count("pay_order") == 3 and done[-1] == "customer_end"
    assert "send_order" in done


def test_a_payment_refused_without_retry_ends_the_checkout_at_its_error_caught_on_the_sub_process(tmp_path: Path) -> None:
    path = c20_runnable(tmp_path)
    instance = answered([path], {}, [("browse", {}), ("add_item", {"done": True}),
                                     ("pay_order", {"accepted": False, "retry": False})])
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done[-2:] == ["checkout_failed", "checkout_failed_end"] and "receive_items" not in done


# -- Camunda 7's job announcement: JUEL #{...} everywhere --------------------------------------------

JOBS = HERE / "job_announcement"
JOB_FILES = [JOBS / "job_announcement.bpmn", JOBS / "job_announcement_publication.bpmn"]

JOB_SERVICE = '''
def post_to_website(ctx):
    return {"website_url": f"https://jobs.example/{ctx['jobAnnouncementId']}"}
def post_to_twitter(ctx):
    return {"twitter_url": "https://twitter.example/1"}
def post_to_facebook(ctx):
    return {"facebook_url": "https://facebook.example/1"}
def notify_about_postings(ctx):
    return {"notified": sorted(k for k in ("website_url", "twitter_url", "facebook_url") if ctx.get(k))}
'''
JOB_CONFIG = '''
notify: {handler: job_service.py:notify_about_postings}
website: {handler: job_service.py:post_to_website}
twitter_post: {handler: job_service.py:post_to_twitter}
facebook_post: {handler: job_service.py:post_to_facebook}
'''


def test_the_job_announcement_is_refused_for_its_juel_and_names_the_bean_each_service_task_calls() -> None:
    found = {(p.code, p.element_id): str(p) for p in validate_process(JOB_FILES).problems}
    assert "'#{approved}' is a JUEL expression (JUEL's deferred #{...}" in found["condition_syntax", "yes"]
    assert "write 'not approved'" in found["condition_syntax", "no"]
    assert "write 'twitter'" in found["condition_syntax", "to_twitter"]
    for task, method in [("notify", "notifyAboutPostings"), ("website", "postToWebsite"), ("facebook_post", "postToFacebook")]:
        assert f"calling {method}() of 'jobAnnouncementService', a Java bean" in found["foreign_extension", task]
    assert sorted(code for code, _ in found if code not in ("foreign_extension", "no_implementation")) == ["condition_syntax"] * 4


def test_the_job_announcement_runs_a_correction_round_and_publishes_where_the_editor_chose(tmp_path: Path) -> None:
    out = tmp_path / "jobs"
    shutil.copytree(JOBS, out)
    rewritten(out, out / "job_announcement.bpmn", [("#{approved}", "approved"), ("#{!approved}", "not approved")])
    rewritten(out, out / "job_announcement_publication.bpmn", [("${twitter}", "twitter"), ("${facebook}", "facebook")])
    (out / "job_service.py").write_text(JOB_SERVICE)
    (out / "job_announcement.layerflow.yaml").write_text(JOB_CONFIG)
    files = [out / p.name for p in JOB_FILES]
    assert [(p.code, p.element_id) for p in validate_process(files).problems] == [("foreign_extension", "start")]
    # (camunda:initiator names the requester: given in the start data here)
    instance = answered(files, {"jobAnnouncementId": 7, "requester": "mary"}, [
        ("describe", {"description": "engineer"}), ("edit", {"twitter": True, "facebook": False}),
        ("review", {"approved": False}), ("correct", {"description": "senior engineer"}), ("review", {"approved": True})])
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done.count("review") == 2 and "twitter_post" in done and "facebook_post" not in done
    assert variables(instance.main)["notified"] == ["twitter_url", "website_url"]


# -- Camunda 8: an order rolled back on a payment error ----------------------------------------------

ROLLBACK = HERE / "camunda8_rollback_on_error.bpmn"

ORDER_SERVICE = '''
from engine import BpmnError

def reserve_stock(ctx):
    return {"reserved": True}
def charge_payment(ctx):
    if ctx["chargeAmount"] > ctx["card_limit"]:
        raise BpmnError("PAYMENT_FAILED", "over the card's limit")
    return {"charged": ctx["chargeAmount"]}
def release_stock(ctx):
    return {"reserved": False}
'''
ORDER_CONFIG = '''
reserve_stock: {handler: order_service.py:reserve_stock}
charge_payment: {handler: order_service.py:charge_payment}
release_stock: {handler: order_service.py:release_stock}
'''


def test_the_camunda8_rollback_is_refused_for_its_feel_condition_only() -> None:
    found = [(p.code, p.severity, p.element_id) for p in validate_process([ROLLBACK]).problems]
    assert [f for f in found if f[1] == "error"] == [("condition_syntax", "error", "large_order")]
    assert "write 'amount > 1000'" in said(ROLLBACK)["large_order"]


@pytest.mark.parametrize("data, steps, end, reserved", [
    ({"amount": 200, "card_limit": 500}, [], "order_completed", True),
    ({"amount": 2000, "card_limit": 5000}, [("approve_order", {"approved": True})], "order_completed", True),
    ({"amount": 800, "card_limit": 500}, [("confirm_cancellation", {"confirmed": True})], "order_rolled_back", False),
], ids=["paid", "approved-then-paid", "rolled-back"])
def test_the_camunda8_order_pays_or_rolls_back_its_reservation(tmp_path: Path, data: dict[str, Any],
                                                               steps: list[tuple[str, dict[str, Any]]], end: str,
                                                               reserved: bool) -> None:
    path = rewritten(tmp_path, ROLLBACK, [("=amount &gt; 1000", "amount &gt; 1000")])
    (tmp_path / "order_service.py").write_text(ORDER_SERVICE)
    (tmp_path / "camunda8_rollback_on_error.layerflow.yaml").write_text(ORDER_CONFIG)
    assert [p for p in problems(path) if p[1] == "error"] == []
    instance = answered([path], data, steps)
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done[-1] == end and variables(instance.main)["reserved"] is reserved
    assert ("payment_failed" in done) is (end == "order_rolled_back")
