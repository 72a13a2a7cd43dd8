"""Public models, each in ``tests/engine/public27/`` (``public27/README.md`` names its repository, path and
licence): the BPMN MIWG's A.2.1 (conditional flows out of tasks, BonitaSoft), SpiffWorkflow's own test
models (an escalation with a payload, a multi-instance task with pre/post scripts, an event-based gateway in
a loop, a message boundary event with two lanes, an ioSpecification on a task, a collaboration with a black-box
pool and a correlation key) and Operaton's examples (event sub-processes, a compensation saga). Each is
validated as given (what layerflow refuses is named with the element and what to write), then run, edited as
validate says, and its path and data are compared with plain SpiffWorkflow's where plain SpiffWorkflow is
right."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from SpiffWorkflow.bpmn.util.event import BpmnEvent
from SpiffWorkflow.bpmn.workflow import BpmnWorkflow
from SpiffWorkflow.spiff.parser.process import SpiffBpmnParser
from SpiffWorkflow.util.task import TaskState

from engine import BpmnError, Engine, load_process
from engine.validate import validate_process

from engine_helpers import path_of, run_plain_files, variables
from test_realworld_4 import rewritten

HERE = Path(__file__).resolve().parent / "public27"
COLLABORATION = HERE / "spiff_collaboration_black_box_pool.bpmn"


def problems(path: Path) -> list[tuple[str, str | None, str]]:
    return [(p.severity, p.element_id, str(p)) for p in validate_process([path]).problems]


def edited(tmp_path: Path, path: Path, *changes: tuple[str, str]) -> Path:
    return rewritten(tmp_path, path, list(changes))


# -- SpiffWorkflow's collaboration: a correlation property read over a payload key named 'from' ----------------

def test_a_payload_key_that_is_a_python_keyword_is_named_with_the_rewrite_that_reads_it() -> None:
    """'from.name' is no Python (plain SpiffWorkflow stops with a bare SyntaxError when the response
    comes); validate said only 'fix the correlation retrieval expression'."""
    found = problems(COLLABORATION)
    said = [text for severity, element, text in found if (severity, element) == ("error", "lover_name")
            and "from.name" in text]
    assert len(said) == 1, found
    text = said[0]
    assert "'from' is a Python keyword" in text
    assert "a key named 'from' cannot be read by its name" in text
    assert "write \"globals()['from']['name']\"" in text
    assert "fix the correlation retrieval expression" not in text


def test_the_rewritten_correlation_reads_the_key_and_the_response_is_caught(tmp_path: Path) -> None:
    fixed = edited(tmp_path, COLLABORATION, (">lover.name<", ">lover['name']<"),
                   (">from.name<", ">globals()['from']['name']<"))
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {"lover": {"name": "Peggy"}}))
    assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [("EventReceiveLetter",
                                                                           "Love Letter Response")]
    instance = engine.send_event(instance, "Love Letter Response", {"from": {"name": "Peggy"}})
    assert instance.status == "completed"
    assert variables(instance.context) == {"lover": {"name": "Peggy"}, "from": {"name": "Peggy"}}


def condition_process(tmp_path: Path, text: str) -> Path:
    """An XOR gateway whose flow to ``a`` (``went = 'a'``) is taken when ``text`` (condition XML) holds, else ``b``."""
    from engine_helpers import flow, script_task, write_elements

    return write_elements(tmp_path, "kw", [
        '<bpmn:startEvent id="s"/>', flow("s", "g"), '<bpmn:exclusiveGateway id="g" default="f2"/>',
        f'<bpmn:sequenceFlow id="f1" sourceRef="g" targetRef="a"><bpmn:conditionExpression>{text}'
        '</bpmn:conditionExpression></bpmn:sequenceFlow>', '<bpmn:sequenceFlow id="f2" sourceRef="g" targetRef="b"/>',
        script_task("a", "went = 'a'"), script_task("b", "went = 'b'"), flow("a", "e"), flow("b", "e"),
        '<bpmn:endEvent id="e"/>'])


@pytest.mark.parametrize(("condition", "rewritten"), [
    ("from.name == 'Peggy'", "globals()['from']['name'] == 'Peggy'"),
    ("payload.class == 'gold'", "payload['class'] == 'gold'"),
    ("import['items'][0] > 2", "globals()['import']['items'][0] > 2"),
])
def test_a_condition_that_reads_a_keyword_key_gets_the_rewrite_and_the_rewrite_runs(
        tmp_path: Path, condition: str, rewritten: str) -> None:
    def process(text: str) -> Path:
        return condition_process(tmp_path, text)

    said = [str(p) for p in validate_process([process(condition.replace("'", "&apos;"))]).problems]
    assert len(said) == 1 and f"write {rewritten!r}" in said[0] and "is a Python keyword" in said[0], said
    fixed = process(rewritten)
    assert list(validate_process([fixed]).problems) == []
    engine = Engine(store="memory://")
    data = {"from": {"name": "Peggy"}, "payload": {"class": "gold"}, "import": {"items": [3]}}
    instance = engine.run(engine.start(load_process([fixed]), data))
    assert (instance.status, variables(instance.context)["went"]) == ("completed", "a")


# -- the others: accepted as they are, or refused naming the element and what to write ------------------------

def test_miwg_a21_conditional_flows_out_of_tasks_are_refused_with_the_gateway_to_draw() -> None:
    found = problems(HERE / "miwg_a21_conditional_task_flows.bpmn")
    errors = {element: text for severity, element, text in found if severity == "error"}
    assert set(errors) == {"_To9ZoTOCEeSknpIVFCxNIQ", "_To9ZtjOCEeSknpIVFCxNIQ", "_To9ZzzOCEeSknpIVFCxNIQ",
                           "_To9Z-TOCEeSknpIVFCxNIQ", "_To9Z_DOCEeSknpIVFCxNIQ"}
    assert 'set isExecutable="true"' in errors["_To9ZoTOCEeSknpIVFCxNIQ"]
    assert "draw an inclusive gateway after it" in errors["_To9ZtjOCEeSknpIVFCxNIQ"]
    assert "'Bpmn_SequenceFlow_edepQQbbEealeL5I4Yl3Dw' as its default flow" in errors["_To9ZtjOCEeSknpIVFCxNIQ"]
    assert "add a conditionExpression or set default=" in errors["_To9Z-TOCEeSknpIVFCxNIQ"]


def test_spiff_escalation_payload_reaches_the_boundary_path_as_in_spiffworkflow() -> None:
    path = HERE / "spiff_escalation_event_payload.bpmn"
    assert [p for p in validate_process([path]).problems if p.severity == "error"] == []
    plain = run_plain_files([path], "event_test")
    task = plain.get_tasks(state=TaskState.READY, manual=True)[0]
    task.data.update({"escalation": True, "payload": "ERROR!"})
    task.run()
    plain.do_engine_steps()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}),
                          answers={"user_tasks": {"set_data": {"escalation": True, "payload": "ERROR!"}}})
    assert instance.status == "completed"
    assert variables(instance.context)["result"] == plain.last_task.data["result"] == "ERROR!"
    assert "Event_1nd3odq" in path_of(plain)


def test_spiff_multi_instance_pre_and_post_scripts_collect_as_spiffworkflow_does() -> None:
    path = HERE / "spiff_multiinstance_pre_post_scripts.bpmn"
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(path))
    plain = BpmnWorkflow(parser.get_spec("Process_1"))
    plain.task_tree.data["input_data"] = [1, 2, 3]
    plain.do_engine_steps()
    for task in plain.get_tasks(state=TaskState.READY, manual=True):
        task.data["output_item"] = task.data["input_item"] * 2
        task.run()
    plain.do_engine_steps()
    engine = Engine(store="memory://")   # the .layerflow.yaml beside it maps input_data to WORKING
    instance = engine.run(engine.start(load_process([path]), {"input_data": [1, 2, 3]}))
    assert [w["input"] for w in instance.waiting_for] == [{"input_item": 2}, {"input_item": 3}, {"input_item": 4}]
    answers = {w["id"]: {"output_item": w["input"]["input_item"] * 2} for w in instance.waiting_for}
    instance = engine.run(instance, answers={"user_tasks": answers})
    assert instance.status == "completed"
    assert variables(instance.context) == dict(plain.last_task.data) == {"input_data": [2, 3, 4],
                                                                         "output_data": [3, 5, 7]}


def test_spiff_event_gateway_in_a_loop_takes_the_messages_in_turn_as_spiffworkflow_does() -> None:
    path = HERE / "spiff_event_gateway_loop.bpmn"
    plain = run_plain_files([path], "Process_0pvx19v")
    for name in ["message_1", "message_1", "message_2"]:
        gateway = [t for t in plain.get_tasks(state=TaskState.WAITING) if t.task_spec.bpmn_id == "Gateway_1434v9l"][0]
        definition = [d for d in gateway.task_spec.event_definition.event_definitions if d.name == name][0]
        plain.send_event(BpmnEvent(definition, {}))
        plain.do_engine_steps()
    now = [1_000_000.0]
    engine = Engine(store="memory://", clock=lambda: now[0])
    instance = engine.run(engine.start(load_process([path]), {}))
    assert sorted(w["kind"] for w in instance.waiting_for) == ["event", "event", "timer"]
    for name in ["message_1", "message_1", "message_2"]:
        instance = engine.send_event(instance, name, {"last": name})
    assert plain.is_completed() and instance.status == "completed"
    assert variables(instance.context) == {"last": "message_2"}
    timed = engine.run(engine.start(load_process([path]), {}))
    now[0] += 1
    assert engine.resume(timed).status == "completed"


def test_spiff_message_boundary_second_start_is_warned_and_runs_as_in_spiffworkflow(tmp_path: Path) -> None:
    path = HERE / "spiff_message_boundary_two_lanes.bpmn"
    found = problems(path)
    assert [(s, e) for s, e, _ in found] == [("warning", "Event_0g8w85g"), ("warning", "Event_12moz8m"),
                                            ("error", "Event_0aqmn5y")]
    assert "timeDuration 'PT.1S' is not a Python expression" in found[2][2]
    fixed = edited(tmp_path, path, (">PT.1S<", '>"PT0.1S"<'))
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {}))
    for answer in ["No", "Yes"]:
        assert [w["task_id"] for w in instance.waiting_for] == ["Activity_Interrupt"]
        instance = engine.run(instance, answers={"user_tasks": {"Activity_Interrupt": {"interrupt_task": answer}}})
    assert instance.status == "completed"


def test_spiff_io_specification_on_a_task_gives_it_its_inputs_and_takes_back_its_outputs() -> None:
    path = HERE / "spiff_io_spec_on_task.bpmn"
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    done = engine.run(instance, answers={"user_tasks": {"any_task": {"out_1": "foo", "out_2": "bar", "x": 1}}})
    assert done.status == "completed"
    assert variables(done.context) == {"in_1": 1, "in_2": "hello world", "unused": True, "out_1": "foo",
                                       "out_2": "bar"}
    engine = Engine(store="memory://")
    missing = engine.run(engine.run(engine.start(load_process([path]), {})),
                         answers={"user_tasks": {"any_task": {"out_1": "foo"}}})
    assert missing.status == "error" and "did not set the data output(s) 'out_2'" in missing.error["message"]


@pytest.mark.parametrize("fails", [False, True])
def test_operaton_event_subprocesses_audit_on_signal_and_handle_the_document_error(fails: bool) -> None:
    path = HERE / "operaton_document_processing_event_subprocesses.bpmn"
    assert [p for p in validate_process([path]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")

    def parse(ctx: Any) -> dict[str, Any]:
        if fails:
            raise BpmnError("DOCUMENT_ERROR", "unreadable")
        return {"parsed": True}

    engine.handlers.register("Task_ParseDocument", parse)
    engine.handlers.register("Task_EnrichDocument", lambda ctx: {"enriched": True})
    engine.handlers.register("Task_RecordAudit", lambda ctx: {"audits": ctx.get("audits", 0) + 1})
    engine.handlers.register("Task_HandleError", lambda ctx: {"error_handled": True})
    instance = engine.run(engine.start(load_process([path]), {}))
    if fails:
        assert instance.status == "completed"
        assert variables(instance.context) == {"error_code": "DOCUMENT_ERROR", "error_message": "unreadable",
                                               "error_handled": True}
        return
    for _ in range(2):
        instance = engine.send_event(instance, "AuditRequired", None, kind="signal")
        assert sorted(w["task_id"] for w in instance.waiting_for) == ["Start_AuditSignal", "Task_StoreDocument"]
    instance = engine.run(instance, answers={"user_tasks": {"Task_StoreDocument": {"stored": True}}})
    assert instance.status == "completed"
    assert variables(instance.context) == {"parsed": True, "enriched": True, "audits": 2, "stored": True}


def test_operaton_compensation_saga_is_refused_and_runs_once_the_undo_is_drawn_in_the_flow(tmp_path: Path) -> None:
    path = HERE / "operaton_book_travel_compensation.bpmn"
    errors = {element: text for severity, element, text in problems(path) if severity == "error"}
    assert set(errors) == {"Boundary_CompensateHotel", "Boundary_CompensateFlight", "Event_TriggerCompensation"}
    assert "SpiffWorkflow 3.2 runs no compensation" in errors["Event_TriggerCompensation"]
    assert "('Task_CancelHotel', 'Task_CancelFlight')" in errors["Event_TriggerCompensation"]
    text = path.read_text()
    text = re.sub(r'<bpmn:boundaryEvent id="Boundary_Compensate(Hotel|Flight)".*?</bpmn:boundaryEvent>', "", text,
                  flags=re.S)
    text = re.sub(r'<bpmn:association .*?/>|<bpmn:sequenceFlow id="Flow_Compensate_End".*?/>', "", text)
    text = re.sub(r'<bpmn:intermediateThrowEvent id="Event_TriggerCompensation".*?</bpmn:intermediateThrowEvent>',
                  "", text, flags=re.S)
    text = text.replace('isForCompensation="true"', 'isForCompensation="false"')
    for task, incoming, outgoing in (("cancelHotelDelegate", "undo_hotel", "undo_end"),
                                     ("cancelFlightDelegate", "Flow_Error_Compensate", "undo_hotel")):
        text = text.replace(f'"${{{task}}}"/>', f'"${{{task}}}"><bpmn:incoming>{incoming}</bpmn:incoming>'
                                                f'<bpmn:outgoing>{outgoing}</bpmn:outgoing></bpmn:serviceTask>')
    text = text.replace('targetRef="Event_TriggerCompensation"/>', 'targetRef="Task_CancelFlight"/>'
                        '<bpmn:sequenceFlow id="undo_hotel" sourceRef="Task_CancelFlight" targetRef="Task_CancelHotel"/>'
                        '<bpmn:sequenceFlow id="undo_end" sourceRef="Task_CancelHotel" targetRef="EndEvent_Cancelled"/>')
    text = text.replace("<bpmn:incoming>Flow_Compensate_End</bpmn:incoming>", "<bpmn:incoming>undo_end</bpmn:incoming>")
    fixed = tmp_path / path.name
    fixed.write_text(text)
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    engine = Engine(store="memory://")
    for task, result in (("Task_BookHotel", {"hotel": "booked"}), ("Task_BookFlight", {"flight": "booked"}),
                         ("Task_CancelHotel", {"hotel": "cancelled"}), ("Task_CancelFlight", {"flight": "cancelled"})):
        engine.handlers.register(task, lambda ctx, result=result: result)

    def pay(ctx: Any) -> dict[str, Any]:
        raise BpmnError("PAYMENT_FAILED", "card declined")

    engine.handlers.register("Task_ProcessPayment", pay)
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert instance.status == "completed"
    assert variables(instance.context) == {"hotel": "cancelled", "flight": "cancelled", "error_code": "PAYMENT_FAILED",
                                           "error_message": "card declined"}


# -- Operaton's document review: a multi-instance user task over operaton:collection --------------------------

REVIEW = HERE / "operaton_document_review_multi_instance.bpmn"


def test_a_completion_condition_that_waits_for_every_instance_is_named_as_the_default_to_remove() -> None:
    """${nrOfCompletedInstances == nrOfInstances} holds when every instance is done, which is when a
    multi-instance activity ends anyway; validate said to write it in Python, then that neither name
    exists, and had nrOfInstances counted as the output collection (it is the input's size)."""
    said = [text for severity, element, text in problems(REVIEW)
            if (severity, element) == ("error", "Task_ReviewDocument") and "completionCondition" in text]
    assert len(said) == 1
    text = said[0]
    assert "holds once every instance has completed, which is when a multi-instance activity ends without a " \
           "completionCondition: remove the bpmn:completionCondition of 'Task_ReviewDocument'" in text
    assert "nrOfInstances is a multi-instance counter Camunda sets and SpiffWorkflow does not: count the output" \
        not in text


def test_the_document_review_edited_as_validate_says_runs_each_reviewer_as_spiffworkflow_does(tmp_path: Path) -> None:
    fixed = edited(tmp_path, REVIEW,
                   ("<bpmn:completionCondition>${nrOfCompletedInstances == nrOfInstances}</bpmn:completionCondition>",
                    '<bpmn:loopDataInputRef>reviewers</bpmn:loopDataInputRef>'
                    '<bpmn:inputDataItem id="reviewer" name="reviewer"/>'),
                   ("${approved == true}", "approved == True"), ("${approved != true}", "approved != True"))
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    answers = {"ann": True, "bob": False}
    parser = SpiffBpmnParser()
    parser.add_bpmn_file(str(fixed))
    plain = BpmnWorkflow(parser.get_spec("document-review"))
    plain.task_tree.data["reviewers"] = ["ann", "bob"]
    plain.do_engine_steps()
    for task in plain.get_tasks(state=TaskState.READY, manual=True):
        task.data["approved"] = answers[task.data["reviewer"]]
        task.run()
    plain.do_engine_steps()
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([fixed]), {"reviewers": ["ann", "bob"]}))
    assert [w["input"] for w in instance.waiting_for] == [{"reviewer": "ann"}, {"reviewer": "bob"}]
    instance = engine.run(instance, answers={"user_tasks": {
        w["id"]: {"approved": answers[w["input"]["reviewer"]]} for w in instance.waiting_for}})
    assert instance.status == "completed"
    assert path_of(plain)[-1] == "EndEvent_Rejected"
    assert variables(instance.context)["approved"] is False


def test_a_share_of_the_instances_counts_the_input_collection_for_nr_of_instances(tmp_path: Path) -> None:
    share = edited(tmp_path, REVIEW, ("${nrOfCompletedInstances == nrOfInstances}",
                                      "${nrOfCompletedInstances / nrOfInstances &gt;= 0.6}"))
    [text] = [text for _, element, text in problems(share) if "completionCondition" in text]
    assert "nrOfInstances is a multi-instance counter Camunda sets and SpiffWorkflow does not: the number of " \
           "instances is the size of the input collection (loopDataInputRef), len(...)" in text
    assert "nrOfCompletedInstances is a multi-instance counter Camunda sets and SpiffWorkflow does not: count the " \
           "output collection (loopDataOutputRef) instead" in text
    assert "remove the bpmn:completionCondition" not in text


@pytest.mark.parametrize(("claim", "reviews"), [("medical", ["Task_ReviewMedical"]), ("other", []),
                                                ("both", ["Task_ReviewMedical", "Task_ReviewProperty"])])
def test_operaton_inclusive_claim_routes_as_spiffworkflow_and_asks_when_the_reviews_disagree(
        tmp_path: Path, claim: str, reviews: list[str]) -> None:
    from SpiffWorkflow.bpmn.parser.BpmnParser import BpmnParser

    path = HERE / "operaton_insurance_claim_inclusive.bpmn"
    fixed = edited(tmp_path, path,
                   ("${claimType == 'medical' || claimType == 'both'}", "claimType == 'medical' or claimType == 'both'"),
                   ("${claimType == 'property' || claimType == 'both'}",
                    "claimType == 'property' or claimType == 'both'"))
    assert [p for p in validate_process([fixed]).problems if p.severity == "error"] == []
    answers = {"Task_ReviewMedical": {"decision": "pay"}, "Task_ReviewProperty": {"decision": "deny"}}
    parser = BpmnParser()   # SpiffWorkflow's own parser refuses a service task without its operator
    parser.add_bpmn_file(str(fixed))
    plain = BpmnWorkflow(parser.get_spec("insurance-claim"))
    plain.task_tree.data["claimType"] = claim
    plain.do_engine_steps()
    while ready := plain.get_tasks(state=TaskState.READY, manual=True):
        ready[0].data.update(answers[ready[0].task_spec.bpmn_id])
        ready[0].run()
        plain.do_engine_steps()
    assert sorted(t for t in path_of(plain) if t.startswith("Task_")) == reviews
    engine = Engine(store="memory://")
    engine.handlers.register("ServiceTask_SettleClaim", lambda ctx: {"settled": True})
    instance = engine.run(engine.start(load_process([fixed]), {"claimType": claim}),
                          answers={"user_tasks": answers, "confirmations": {"Gateway_Join/decision": "deny"}})
    assert instance.status == "completed"
    settled = variables(instance.context).get("settled")
    assert settled is (None if claim == "other" else True)
    conflicts = [(c["key"], c["values"], c["resolution"]["value"]) for c in instance.conflicts]
    assert conflicts == ([("decision", {"Task_ReviewMedical": "pay", "Task_ReviewProperty": "deny"}, "deny")]
                         if claim == "both" else [])


@pytest.mark.parametrize("late", [False, True])
def test_operaton_sla_timer_quoted_as_validate_says_escalates_after_the_hour(tmp_path: Path, late: bool) -> None:
    path = HERE / "operaton_sla_escalation_timer.bpmn"
    [(severity, element, text)] = problems(path)
    assert (severity, element) == ("error", "BoundaryEvent_SlaTimer") and 'write it as a string: "PT1H"' in text
    fixed = edited(tmp_path, path, (">PT1H<", '>"PT1H"<'))
    now = [1_000_000.0]
    engine = Engine(store="memory://", clock=lambda: now[0])
    instance = engine.run(engine.start(load_process([fixed]), {}))
    assert sorted(w["kind"] for w in instance.waiting_for) == ["timer", "user_task"]
    now[0] += 3601 if late else 60
    instance = engine.resume(instance, answers={"user_tasks": {"UserTask_HandleRequest": {"resolved": True}}})
    assert instance.status == "completed"
    assert ("resolved" in variables(instance.context)) is not late


def test_spiff_data_store_without_an_implementation_is_refused_as_spiffworkflow_refuses_it() -> None:
    path = HERE / "spiff_data_store_reference.bpmn"
    [(severity, element, text)] = problems(path)
    assert (severity, element) == ("error", "variableTiedToDataStore")
    assert "has no implementation" in text and "keep the value in the process context instead" in text
    with pytest.raises(Exception, match="TestDataStore has no implementation"):
        run_plain_files([path], "JustDataStoreRef")
