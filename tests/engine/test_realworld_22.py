"""Public models, round 22, each written again in ``tests/engine/realworld22/`` (the file says what it
follows and what it leaves out; ``realworld22/README.md`` lists the sources and licences): Camunda 8's
insurance application (an embedded form, a DMN risk rating, FEEL conditions, a non-interrupting timer
cycle, a message boundary event with a correlation key, a call activity) with the process it calls,
Camunda 8's campaign (a multi-instance call activity over a collection, an input mapping) with its
letter process, and Camunda 7's REST connector, Camunda Forms invoice, external-task order process (a
Quartz cron timer cycle, a conditional boundary event on a sub-process) and message-start pair (a Java
delegate starting a process by its message). Each is validated as given
(validate says what is wrong, naming the element and what to write), then, edited as validate says,
run to its end with fake handlers for the service tasks. Also the spiffworkflow:messagePayload that
SpiffWorkflow 3.2 reads on a bpmn:message and deprecates."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser

from context_layers import Layer
from engine import Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, variables, write_elements, flow
from test_realworld_4 import rewritten
from test_realworld_17 import said

HERE = Path(__file__).resolve().parent / "realworld22"
START = 1_800_000_000.0  # 2027-01-15T08:00:00Z


def codes(paths: list[Path], process_id: str | None = None) -> list[tuple[str, str, str | None]]:
    return [(p.code, p.severity, p.element_id) for p in validate_process(paths, process_id=process_id).problems]


def engine_with(handlers: dict[str, Any], now: list[float] | None = None) -> Engine:
    engine = Engine(store="memory://", clock=(lambda: now[0]) if now is not None else (lambda: START))
    for task_id, handler in handlers.items():
        engine.handlers.register(task_id, handler)
    return engine


# -- a spiffworkflow:messagePayload on the bpmn:message: read by SpiffWorkflow 3.2, deprecated -----

TUTORIAL = HERE.parent / "realworld" / "spiff_tutorial_message_payload.bpmn"


def test_a_payload_on_the_bpmn_message_is_a_warning_naming_the_events_to_move_it_to() -> None:
    """SpiffWorkflow 3.2 warns (DeprecationWarning) for each event naming such a message; validate
    said nothing of it. It now says where each setting goes: the payload to the throw event, the
    variable to the catch event."""
    parser = SpiffBpmnParser()
    with pytest.warns(DeprecationWarning, match="messagePayload and spiffworkflow:messageVariable have been moved"):
        parser.add_bpmn_file(str(TUTORIAL))
        parser.get_spec("order_product")
    [warning] = [p for p in validate_process([TUTORIAL]).problems if p.code == "message_extension_deprecated"]
    assert (warning.severity, warning.element_id) == ("warning", "Message_1ngt47u")
    text = str(warning)
    assert "holds spiffworkflow:messagePayload and spiffworkflow:messageVariable" in text
    assert "move its spiffworkflow:messagePayload into the bpmn:messageEventDefinition of each event that sends " \
        "it ('Event_1vajwed'" in text
    assert "its spiffworkflow:messageVariable into that of each event that catches it ('Event_0avgftb'" in text
    assert "remove them from the bpmn:message" in text


def test_the_payload_moved_as_validate_says_runs_the_same_without_the_deprecation(tmp_path: Path) -> None:
    text = TUTORIAL.read_text()
    payload = text[text.index("      <spiffworkflow:messagePayload>"):text.index("</spiffworkflow:messagePayload>") + 31]
    variable = "      <spiffworkflow:messageVariable>order_info</spiffworkflow:messageVariable>"
    moved = rewritten(tmp_path, TUTORIAL, [
        (payload, ""), (variable, ""),
        ('<bpmn:messageEventDefinition id="MessageEventDefinition_0achvk2" messageRef="Message_1ngt47u" />',
         '<bpmn:messageEventDefinition id="MessageEventDefinition_0achvk2" messageRef="Message_1ngt47u">'
         '<bpmn:extensionElements>' + payload.replace("datetime.datetime.utcnow().timestamp()", "'late'")
         + '</bpmn:extensionElements></bpmn:messageEventDefinition>'),
        ('<bpmn:messageEventDefinition id="MessageEventDefinition_1s2ihho" messageRef="Message_1ngt47u" />',
         '<bpmn:messageEventDefinition id="MessageEventDefinition_1s2ihho" messageRef="Message_1ngt47u">'
         f'<bpmn:extensionElements>{variable}</bpmn:extensionElements></bpmn:messageEventDefinition>')])
    assert "message_extension_deprecated" not in [code for code, _, _ in codes([moved])]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        parser = SpiffBpmnParser()
        parser.add_bpmn_file(str(moved))
        parser.get_spec("order_product")
        process = load_process([moved])
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(process, {}),
                          answers={"user_tasks": {"Activity_19sdt5q": {"reason_delayed": "strike"}}})
    assert instance.status == "completed", instance.error
    [qa] = [ctx for name, ctx in instance.contexts.items() if "qa_process" in name]
    assert variables(qa)["order_info"]["reason_delayed"] == "strike"


def test_a_message_holding_only_a_variable_names_its_catches_and_says_it(tmp_path: Path) -> None:
    path = write_elements(tmp_path, "only_var", [
        '<bpmn:startEvent id="start"/>', '<bpmn:receiveTask id="wait" messageRef="msg"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "wait"), flow("wait", "end")],
        '  <bpmn:message id="msg" name="note"><bpmn:extensionElements><spiffworkflow:messageVariable>note'
        '</spiffworkflow:messageVariable></bpmn:extensionElements></bpmn:message>\n')
    [warning] = [p for p in validate_process([path]).problems if p.code == "message_extension_deprecated"]
    assert "holds spiffworkflow:messageVariable, a place" in str(warning)
    assert "into that of each event that catches it ('wait'" in str(warning)
    assert "messagePayload into" not in str(warning) and "remove it from the bpmn:message" in str(warning)


# -- Camunda 7's REST connector: a camunda:connector, JUEL conditions ------------------------------

REST = HERE / "camunda7_rest_connector.bpmn"


def test_the_rest_connector_is_refused_for_its_juel_conditions_with_the_python_to_write() -> None:
    refused = said(REST)
    assert "write 'isHoliday'" in refused["SequenceFlow_3"] and "write 'not isHoliday'" in refused["SequenceFlow_4"]
    assert refused["ServiceTask_1"].startswith("warning:")
    assert "another engine's settings that layerflow does not run" in refused["ServiceTask_1"]
    # the file writes camunda:connector, its camunda prefix bound to Activiti's namespace (as Camunda
    # 7.0 saved it): validate named activiti:connector, which a search of the file does not find
    assert "has activiti:connector (written camunda:connector in this file, whose prefix camunda names " \
        "Activiti's namespace http://activiti.org/bpmn)" in refused["ServiceTask_1"]


@pytest.mark.parametrize("holiday, packed_at", [(True, "UserTask_1"), (False, "UserTask_2")])
def test_the_rest_connector_edited_runs_with_a_handler_for_the_call(tmp_path: Path, holiday: bool,
                                                                   packed_at: str) -> None:
    path = rewritten(tmp_path, REST, [("${isHoliday}", "isHoliday"), ("${!isHoliday}", "not isHoliday")])
    assert [c for c, severity, _ in codes([path]) if severity == "error"] == []
    engine = engine_with({"ServiceTask_1": lambda ctx: {"isHoliday": holiday}})
    instance = engine.run(engine.start(load_process([path]), {}),
                          answers={"user_tasks": {packed_at: {"packed": True}}})
    assert instance.status == "completed", instance.error
    assert packed_at in path_of(instance.workflow)
    assert variables(instance.main) == {"isHoliday": holiday, "packed": True}


# -- Camunda 7's Camunda Forms quickstart: forms deployed beside the BPMN ----------------------------

FORMS = HERE / "camunda7_forms_invoice.bpmn"


def test_the_forms_invoice_is_valid_and_warns_of_each_form_file_it_lacks() -> None:
    refused = said(FORMS)
    assert sorted(refused) == ["StartEvent_1", "UserTask_1"]
    assert "start-form.form is no such file" in refused["StartEvent_1"]
    assert "task-form.form is no such file" in refused["UserTask_1"]
    assert all(text.startswith("warning:") for text in refused.values())


def test_the_forms_invoice_waits_for_the_approver_then_completes() -> None:
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([FORMS]), {"amount": 30}))
    assert instance.status == "waiting"
    assert [w["task_id"] for w in instance.waiting_for] == ["UserTask_1"]
    instance = engine.complete_user_task(instance, "UserTask_1", {"approved": True})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"amount": 30, "approved": True}


# -- Camunda 8's insurance application: DMN, FEEL, a timer cycle, a message, a call activity --------

INSURANCE = HERE / "camunda8_insurance_application.bpmn"
RISK = HERE / "camunda8_risk_rating.dmn"
DOCUMENTS = HERE / "camunda8_document_providing.bpmn"


REFUSED = [
    ("camunda8_insurance_application.bpmn", "SequenceFlow_1vgvpxc", "write \"rating['group'] == 'green'\""),
    ("camunda8_insurance_application.bpmn", "SequenceFlow_0hm08qj", "write 'not(accepted)'"),
    ("camunda8_insurance_application.bpmn", "BoundaryEvent_0vgivfc", "write it as a string: \"R1/PT1M\""),
    ("camunda8_insurance_application.bpmn", "Activity_1gaclo9",
     "name the process it calls, calledElement=\"documentProviding\""),
    ("camunda7_external_order_cron.bpmn", "StartEvent_1", "'0/5 0/1 * 1/1 * ?' is a cron expression"),
    ("camunda7_external_order_cron.bpmn", "StartEvent_1",
     'it fires every 5 seconds: write "R/PT5S" (with the quotes)'),
    ("camunda7_external_order_cron.bpmn", "BoundaryEvent_1y1bvad", "write 'invoiceId != None'"),
]


@pytest.mark.parametrize("name, element_id, todo", REFUSED, ids=[f"{e}-{i}" for i, (_, e, _) in enumerate(REFUSED)])
def test_each_foreign_expression_is_refused_naming_the_element_and_what_to_write(name: str, element_id: str,
                                                                                 todo: str) -> None:
    refused = said(HERE / name)[element_id]
    assert refused.startswith("error:") and todo in refused


def test_the_risk_rating_is_refused_for_its_feel_negation_with_the_python_to_write() -> None:
    found = said(RISK)
    assert "inputEntry 'not(\"X3\")'" in found["DecisionRule_0nv7bxh_in2"]
    assert "write it as Python: '? != \"X3\"'" in found["DecisionRule_0nv7bxh_in2"]


def insurance_runnable(tmp_path: Path) -> list[Path]:
    """As validate says: Python conditions, the timer cycle a string, the called process named, the
    DMN's not(...) as Python."""
    bpmn = rewritten(tmp_path, INSURANCE, [
        ('=rating.group = "green"', "rating['group'] == 'green'"),
        ('=rating.group = "yellow"', "rating['group'] == 'yellow'"),
        ('=rating.group = "red"', "rating['group'] == 'red'"),
        ('= accepted<', 'accepted<'), ('= not(accepted)', 'not(accepted)'), ('>R1/PT1M<', '>"R1/PT1M"<'),
        ('name="Document providing process">', 'name="Document providing process" calledElement="documentProviding">')])
    dmn = rewritten(tmp_path, RISK, [('not("X3")', '? != "X3"')])
    return [bpmn, dmn, DOCUMENTS]


def insurance_engine(now: list[float] | None = None) -> Engine:
    return engine_with({"Task_0flfjop": lambda ctx: {"policy": f"policy for {ctx.get('vehicleModel')}"},
                        "Task_0zily2o": lambda ctx: {"rejected": True}}, now)


@pytest.mark.parametrize("applicant, group, end", [
    ({"age": 40, "vehicleManufacturer": "Audi", "vehicleModel": "A4"}, "green", "EndEvent_14jsowc"),
    ({"age": 24, "vehicleManufacturer": "Porsche", "vehicleModel": "p911"}, "red", "EndEvent_0l1eu5j"),
    ({"age": 35, "vehicleManufacturer": "BMW", "vehicleModel": "X5"}, "green", "EndEvent_14jsowc"),
], ids=["audi", "young-porsche", "bmw-not-x3"])
def test_the_insurance_application_edited_decides_by_the_risk_rating(tmp_path: Path, applicant: dict[str, Any],
                                                                     group: str, end: str) -> None:
    files = insurance_runnable(tmp_path)
    assert [c for c, severity, _ in codes(files, "InsuranceApplication") if severity == "error"] == []
    engine = insurance_engine()
    instance = engine.run(engine.start(load_process(files, process_id="InsuranceApplication"), applicant))
    assert instance.status == "completed", instance.error
    assert variables(instance.main)["rating"]["group"] == group
    assert path_of(instance.workflow)[-1] == end


def test_the_yellow_application_takes_the_document_message_the_call_and_the_manager_timer(tmp_path: Path) -> None:
    """The clerk's task waits with its two boundary events: the 'document' message interrupts it and
    runs the called process (a person uploads), which leads back to the clerk; a minute later the
    non-interrupting timer (R1/PT1M) asks the manager, whose form is the process's embedded
    zeebe:userTaskForm; the clerk rejects."""
    now = [START]
    engine = insurance_engine(now)
    process = load_process(insurance_runnable(tmp_path), process_id="InsuranceApplication")
    instance = engine.run(engine.start(process, {"age": 20, "vehicleManufacturer": "Volkswagen",
                                                 "vehicleModel": "Golf", "applicationId": "A-17"}))
    waiting = {w["task_id"]: w for w in instance.waiting_for}
    assert sorted(waiting) == ["BoundaryEvent_0vgivfc", "Event_064nnn0", "Task_0pl5522"]
    assert waiting["BoundaryEvent_0vgivfc"]["due"] == "2027-01-15T08:01:00+00:00"
    instance = engine.send_event(instance, "document", {"doc": "licence.pdf"})
    assert [w["task_id"] for w in instance.waiting_for] == ["Activity_0zr8wlp"]
    instance = engine.complete_user_task(instance, "Activity_0zr8wlp", {"uploaded": True})
    assert "Task_0pl5522" in [w["task_id"] for w in instance.waiting_for]
    now[0] += 61
    instance = engine.resume(instance)
    manager = next(w for w in instance.waiting_for if w["task_id"] == "Task_136l2di")
    assert manager["form"]["source"] == "zeebe:userTaskForm"
    assert [(f["id"], f["required"]) for f in manager["form"]["fields"]] == [("applicationId", False),
                                                                          ("comment", True)]
    instance = engine.resume(instance, answers={"user_tasks": {"Task_136l2di": {"comment": "overdue"},
                                                               "Task_0pl5522": {"accepted": False}}})
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert {"Activity_1gaclo9", "Task_136l2di", "Task_0zily2o", "EndEvent_0l1eu5j"} <= set(done)
    assert variables(instance.main)["rejected"] is True


# -- Camunda 8's campaign: a multi-instance call activity over a collection -------------------------

CAMPAIGN = HERE / "camunda8_campaign_multi_instance.bpmn"
LETTER = HERE / "camunda8_letter_process.bpmn"


def test_the_campaign_is_refused_naming_the_called_process_and_the_collection_to_write() -> None:
    refused = said(CAMPAIGN)["Activity_1qvfx0i"]
    assert 'name the process it calls, calledElement="letterProcess"' in refused
    assert "write <bpmn:loopDataInputRef>itemList</bpmn:loopDataInputRef> and <bpmn:inputDataItem id=\"itemId\" " \
        "name=\"itemId\"/> in its bpmn:multiInstanceLoopCharacteristics" in refused


def test_the_campaign_edited_calls_the_letter_process_once_per_item(tmp_path: Path) -> None:
    """Each call sees its item; the call activity's zeebe:input (itemList = null, "provide empty
    list" to each call) runs in each instance and, as the README says (no task-local scope), stays
    after the calls, where Camunda 8 would drop it. Each call writes its own ``letter``: parallel
    instances deciding one key differently meet as a join's branches (round 35), so the call
    activity says which stays (here: the last to end, as before)."""
    path = rewritten(tmp_path, CAMPAIGN, [
        ('name="Letter processing">', 'name="Letter processing" calledElement="letterProcess">'),
        ('inputElement="itemId" />\n        </bpmn:extensionElements>',
         'inputElement="itemId" />\n        </bpmn:extensionElements>\n'
         '        <bpmn:loopDataInputRef>itemList</bpmn:loopDataInputRef>\n'
         '        <bpmn:inputDataItem id="itemId" name="itemId"/>')])
    (tmp_path / f"{path.stem}.layerflow.yaml").write_text("Activity_1qvfx0i:\n  mergeStrategy: LAST_WRITER_WINS\n")
    assert [c for c, severity, _ in codes([path, LETTER], "CampaignProcess") if severity == "error"] == []
    assert "bpmn_schema" not in [c for c, _, _ in codes([path, LETTER], "CampaignProcess")]
    seen: list[str] = []

    def create_letter(ctx: Any) -> dict[str, Any]:
        seen.append(ctx.get("itemId"))
        return {"letter": f"letter {ctx.get('itemId')}"}

    engine = engine_with({"Activity_14ibl90": lambda ctx: {"itemList": ["c-1", "c-2", "c-3"]},
                          "Activity_1rm3wel": create_letter})
    instance = engine.run(engine.start(load_process([path, LETTER], process_id="CampaignProcess"), {}))
    assert instance.status == "completed", instance.error
    assert sorted(seen) == ["c-1", "c-2", "c-3"]
    assert variables(instance.main)["itemList"] is None
    assert {c["key"] for c in instance.conflicts} == {"letter"}
    assert all(c["resolution"]["resolver"] == "strategy" for c in instance.conflicts)


# -- Camunda 7's external-task order process: a cron cycle, a conditional boundary event ------------

ORDER = HERE / "camunda7_external_order_cron.bpmn"


def order_runnable(tmp_path: Path) -> Path:
    return rewritten(tmp_path, ORDER, [(">0/5 0/1 * 1/1 * ?<", '>"R/PT5S"<'),
                                       ("${invoiceId != null}", "invoiceId != None")])


def test_the_order_process_edited_starts_on_its_timer_and_archives_once_the_invoice_exists(tmp_path: Path) -> None:
    """The conditional boundary event reads invoiceId, which the sub-process's task sets: it waits
    until then (as Camunda 7, whose condition.tryEvaluate counts a variable not set yet as false).
    It stopped the instance with a NameError as the sub-process began."""
    path = order_runnable(tmp_path)
    assert [c for c, severity, _ in codes([path]) if severity == "error"] == []
    now = [START]
    engine = engine_with({"Task_06z99p1": lambda ctx: {"invoiceId": "INV-1"},
                          "Task_1yjkccw": lambda ctx: {"archived": ctx.get("invoiceId")}}, now)
    instance = engine.run(engine.start(load_process([path]), {}))
    assert [(w["kind"], w["task_id"]) for w in instance.waiting_for] == [("timer", "StartEvent_1")]
    now[0] += 6
    instance = engine.resume(instance)
    assert variables(instance.main) == {"invoiceId": "INV-1", "archived": "INV-1"}
    # the cycle has no end (R/): the instance waits for its next period, as SpiffWorkflow runs it
    assert instance.status == "waiting", instance.error
    assert [(w["task_id"], w["due"], w["repetitions_left"]) for w in instance.waiting_for] == [
        ("StartEvent_1", "2027-01-15T08:00:10+00:00", None)]
    records = [k for k in instance.main.layer(Layer.HISTORY) if k.startswith("activity:")]
    assert records == ["activity:Task_06z99p1", "activity:Task_1yjkccw"]
    assert "EndEvent_00asnpf" not in path_of(instance.workflow)  # the boundary event interrupted the sub-process


def test_a_conditional_boundary_event_fires_on_the_last_write_of_its_sub_process(tmp_path: Path) -> None:
    """The condition held only after the sub-process's last task, whose end event came next: the
    condition was checked when nothing else could run, after the sub-process had ended and
    cancelled the event, so the interrupting path never ran."""
    path = write_elements(tmp_path, "last_write", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:subProcess id="sub"><bpmn:startEvent id="sub_start"/><bpmn:scriptTask id="set_flag">'
        '<bpmn:script>flag = True</bpmn:script></bpmn:scriptTask><bpmn:endEvent id="sub_end"/>'
        + flow("sub_start", "set_flag") + flow("set_flag", "sub_end") + '</bpmn:subProcess>',
        '<bpmn:boundaryEvent id="on_flag" attachedToRef="sub"><bpmn:conditionalEventDefinition><bpmn:condition>'
        'flag == True</bpmn:condition></bpmn:conditionalEventDefinition></bpmn:boundaryEvent>',
        '<bpmn:scriptTask id="flagged"><bpmn:script>handled = True</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="normal_end"/>', '<bpmn:endEvent id="flag_end"/>',
        flow("start", "sub"), flow("sub", "normal_end"), flow("on_flag", "flagged"), flow("flagged", "flag_end")])
    assert [c for c, severity, _ in codes([path]) if severity == "error"] == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"flag": True, "handled": True}
    assert "normal_end" not in path_of(instance.workflow)


# -- Camunda 7's message start: a Java delegate starts a process by its message ---------------------

INSTANTIATING = HERE / "camunda7_instantiating_process.bpmn"
MESSAGE_START = HERE / "camunda7_message_start_process.bpmn"


def test_the_message_start_pair_given_together_is_refused_until_one_process_is_named() -> None:
    """Two executable processes and no collaboration: validate asks which to run; the Java
    delegate's camunda:class is named as the file writes it (camunda: bound to Activiti's namespace)."""
    report = validate_process([INSTANTIATING, MESSAGE_START])
    [refused] = [p for p in report.problems if p.severity == "error"]
    assert refused.field == "process_id"
    assert "2 executable processes ('Instantiating_Process', 'Message_Start_Process')" in str(refused)
    assert validate_process([MESSAGE_START]).problems == ()
    [foreign] = [str(p) for p in validate_process([INSTANTIATING]).problems if p.code == "foreign_extension"]
    assert "has activiti:class (written camunda:class in this file" in foreign


def test_the_message_start_process_waits_for_its_message_and_takes_its_payload() -> None:
    engine = engine_with({})
    instance = engine.run(engine.start(load_process([MESSAGE_START]), {}))
    assert [(w["kind"], w["task_id"], w.get("event")) for w in instance.waiting_for] == [
        ("event", "StartEvent_1", "instantiationMessage")]
    instance = engine.send_event(instance, "instantiationMessage", {"orderId": "o-1"})
    assert [w["task_id"] for w in instance.waiting_for] == ["UserTask_1"]
    instance = engine.complete_user_task(instance, "UserTask_1", {})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"orderId": "o-1"}


def test_the_instantiating_process_chosen_runs_its_handler_in_the_delegates_place() -> None:
    engine = engine_with({"ServiceTask_1": lambda ctx: {"instantiated": True}})
    process = load_process([INSTANTIATING, MESSAGE_START], process_id="Instantiating_Process")
    instance = engine.run(engine.start(process, {}), answers={"user_tasks": {"UserTask_1": {}}})
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"instantiated": True}


def test_an_intermediate_conditional_catch_reading_a_key_not_set_yet_waits_for_it(tmp_path: Path) -> None:
    """It stopped the instance with a NameError; it now waits, listed with its condition, and fires
    once the key is set (here by an injection, as ``layerflow resume --set`` does)."""
    path = write_elements(tmp_path, "wait_for_key", [
        '<bpmn:startEvent id="start"/>',
        '<bpmn:intermediateCatchEvent id="until_paid"><bpmn:conditionalEventDefinition><bpmn:condition>'
        'paid == True</bpmn:condition></bpmn:conditionalEventDefinition></bpmn:intermediateCatchEvent>',
        '<bpmn:scriptTask id="ship"><bpmn:script>shipped = True</bpmn:script></bpmn:scriptTask>',
        '<bpmn:endEvent id="end"/>', flow("start", "until_paid"), flow("until_paid", "ship"), flow("ship", "end")])
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    assert instance.status == "waiting", instance.error
    assert [(w["task_id"], w["event_kind"], w["condition"]) for w in instance.waiting_for] == [
        ("until_paid", "conditional", "paid == True")]
    instance = engine.resume(engine.inject(instance, {"paid": True}))
    assert instance.status == "completed", instance.error
    assert variables(instance.main) == {"paid": True, "shipped": True}
