"""Public models, each in ``tests/engine/public28/`` (``public28/README.md`` names its repository, path and
licence): SpiffWorkflow's own test models (a parallel split with a script, an exclusive gateway into a
multi-instance task, a loop back into a parallel gateway, an inclusive split and join, a signal event
sub-process, a join a loop feeds past its split, a second start event beside a non-interrupting message
boundary) and Operaton's use cases (employee onboarding over two called processes, a travel booking
transaction with compensation, an order fulfilment with lanes and an error boundary, a quote handling started
by a message, a bank account opening with parallel checks and a DMN decision, an incident management with an
SLA timer and an escalation signal). Each is validated as given (what layerflow refuses is named with the
element and what to write), then run, edited as validate says, and its path and data are compared with plain
SpiffWorkflow's where plain SpiffWorkflow is right."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from SpiffWorkflow.util.task import TaskState

from engine import BpmnError, Engine, load_process
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, path_of, run_json, run_plain, run_plain_files, variables
from test_realworld_4 import rewritten

HERE = Path(__file__).resolve().parent / "public28"
ONBOARDING = HERE / "operaton_employee_onboarding.bpmn"
cli = cli_in_a_tmp_store  # the fixture "cli", here too
CALLED = [HERE / "operaton_provision_equipment.bpmn", HERE / "operaton_grant_system_access.bpmn"]
TRAVEL = HERE / "operaton_travel_booking_transaction.bpmn"
ORDER = HERE / "operaton_order_fulfillment_lanes.bpmn"


def problems(*paths: Path) -> list[tuple[str, str | None, str]]:
    return [(p.severity, p.element_id, str(p)) for p in validate_process(list(paths)).problems]


def errors(*paths: Path) -> dict[str | None, list[str]]:
    found: dict[str | None, list[str]] = {}
    for severity, element, text in problems(*paths):
        if severity == "error":
            found.setdefault(element, []).append(text)
    return found


def edited(tmp_path: Path, path: Path, *changes: tuple[str, str]) -> Path:
    return rewritten(tmp_path, path, list(changes))


def run(engine: Engine, paths: list[Path], data: dict[str, Any], answers: dict[str, Any] | None = None) -> Any:
    return engine.run(engine.start(load_process(paths), data), answers={"user_tasks": answers or {}})


# -- SpiffWorkflow's own models: accepted as they are, run as plain SpiffWorkflow runs them -------------------

@pytest.mark.parametrize(("name", "data", "answers"), [
    ("spiff_parallel_with_script.bpmn", {},
     {"user_task_A": {"a": 1}, "user_task_B": {"b": 2}, "user_task_C": {"c": 3}}),
    ("spiff_exclusive_into_multi.bpmn", {}, {"Activity_1j43xon": {}}),
    ("spiff_gateway_loop_input.bpmn", {}, {"task": {}}),
    ("spiff_inclusive_gateway.bpmn", {}, {"set_data": {"u": 1, "v": 0, "w": 1}}),
])
def test_spiff_models_run_the_path_and_data_of_plain_spiffworkflow(
        name: str, data: dict[str, Any], answers: dict[str, dict[str, Any]]) -> None:
    path = HERE / name
    assert [p for p in problems(path) if p[0] == "error"] == []
    plain, plain_data = run_plain(path, data, answers)
    instance = run(Engine(store="memory://"), [path], data, answers)
    assert instance.status == "completed", instance.error
    assert path_of(instance.workflow) == path_of(plain)
    assert variables(instance.context) == plain_data


def test_spiff_signal_event_sub_process_interrupts_the_flow_and_its_writes_stay_where_spiffworkflow_drops_them(
        ) -> None:
    """The event sub-process's start is interrupting (BPMN's default, which SpiffWorkflow 3.2 ignores: it
    still ends the main flow at 'Event_03f19jy'); layerflow cancels that end as the README says, and keeps what
    the event sub-process's task wrote, which plain SpiffWorkflow's final data does not hold."""
    path = HERE / "spiff_event_subprocess_signal.bpmn"
    answers = {"set_data": {"set": True}, "task": {"handled": True}}
    assert problems(path) == []
    plain, plain_data = run_plain(path, {}, answers)
    instance = run(Engine(store="memory://"), [path], {}, answers)
    assert instance.status == "completed", instance.error
    assert [t for t in path_of(plain) if t != "Event_03f19jy"] == path_of(instance.workflow)
    assert plain_data == {"set": True}
    assert variables(instance.context) == {"set": True, "handled": True}


@pytest.mark.parametrize(("given", "then"), [({"u": 0, "v": 0, "w": 0}, {"u": 0, "v": 1, "w": 0}),
                                             ({"u": 1, "v": 1, "w": 0}, {"u": 2, "v": 1, "w": 0})])
def test_spiff_inclusive_join_whose_only_flow_fails_its_condition_stops_naming_the_gateway_and_value(
        given: dict[str, int], then: dict[str, int]) -> None:
    """The join's one outgoing flow has a condition (v == 0); plain SpiffWorkflow stops with 'No
    conditions satisfied on gateway.'; layerflow names the gateway, the condition and the value."""
    path = HERE / "spiff_inclusive_gateway.bpmn"
    with pytest.raises(Exception, match="No conditions satisfied"):
        run_plain(path, {}, {"set_data": given})
    instance = run(Engine(store="memory://"), [path], {}, {"set_data": given})
    assert (instance.status, instance.error["task_id"]) == ("error", "second")
    assert "no condition of its outgoing flows holds (to 'Event_05yg5je': v == 0)" in instance.error["message"]
    assert f"the context has v={then['v']}" in instance.error["message"]
    assert variables(instance.context) == then


def test_spiff_join_fed_by_a_loop_past_its_split_is_warned_and_stops_clearly_where_spiffworkflow_crashes() -> None:
    """SpiffWorkflow 3.2 dies on this model with an AttributeError (its test pins the later fix);
    validate warns of both shapes, and the run stops at the join naming the branch that had not come."""
    path = HERE / "spiff_parallel_join_dropped_parent.bpmn"
    warned = {element: text for severity, element, text in problems(path) if severity == "warning"}
    assert set(warned) == {"mergeB", "join"}
    assert "merge them in a parallel gateway instead" in warned["mergeB"]
    assert "move the flow back to an exclusive gateway in front of 'outer_split'" in warned["join"]
    answers = {"C1": {"c1": 1}, "C2": {"c2": 2}, "retry": {}}
    with pytest.raises(AttributeError):
        run_plain(path, {}, answers)
    instance = run(Engine(store="memory://"), [path], {}, answers)
    assert (instance.status, instance.error["kind"], instance.error["task_id"]) == ("error", "merge_conflict", "join")
    assert "'C2' had not arrived" in instance.error["message"]
    assert "give the join one incoming flow per branch of 'outer_split'" in instance.error["message"]


# -- Operaton's employee onboarding: a multi-instance call activity over operaton:collection ------------------

def onboarding_edited(tmp_path: Path) -> Path:
    return edited(tmp_path, ONBOARDING,
                  ("<bpmn:completionCondition>${nrOfCompletedInstances == nrOfInstances}</bpmn:completionCondition>",
                   '<bpmn:loopDataInputRef>equipmentList</bpmn:loopDataInputRef>'
                   '<bpmn:inputDataItem id="equipmentItem" name="equipmentItem"/>'),
                  ("${accessGranted == false}", "accessGranted == False"))


def test_onboarding_as_given_is_refused_naming_each_element_and_what_to_write() -> None:
    found = errors(ONBOARDING)
    assert set(found) == {"CallActivity_ProvisionEquipment", "CallActivity_GrantAccess", "Flow_Denied_Flag"}
    said = " ".join(found["CallActivity_ProvisionEquipment"])
    assert "write <bpmn:loopDataInputRef>equipmentList</bpmn:loopDataInputRef>" in said
    assert "remove the bpmn:completionCondition of 'CallActivity_ProvisionEquipment'" in said
    assert "operaton_provision_equipment.bpmn defines it" in said
    assert "write 'accessGranted == False'" in found["Flow_Denied_Flag"][0]
    assert set(errors(ONBOARDING, *CALLED)) == {"CallActivity_ProvisionEquipment", "Flow_Denied_Flag"}


def test_onboarding_edited_as_validate_says_is_not_told_again_what_it_now_has(tmp_path: Path) -> None:
    """Once the loop has the loopDataInputRef and inputDataItem validate asked for, the operaton:collection
    and elementVariable beside them say the same thing; and operaton:in sourceExpression='${equipmentItem}'
    target='equipmentItem' passes the item under its own name, which the called process reads. validate
    still said to add what was there and that 'nothing sets equipmentItem'."""
    said = [text for severity, element, text in problems(onboarding_edited(tmp_path), *CALLED)
            if element == "CallActivity_ProvisionEquipment"]
    assert said == []


@pytest.mark.parametrize("granted", [True, False])
def test_onboarding_provisions_each_item_in_the_called_process_and_routes_on_access(
        tmp_path: Path, granted: bool) -> None:
    fixed = onboarding_edited(tmp_path)
    assert errors(fixed, *CALLED) == {}
    engine = Engine(store="memory://")
    engine.handlers.register("Task_PrepareOnboarding", lambda ctx: {"prepared": True})
    engine.handlers.register("Task_OrderItem",
                             lambda ctx: {"ordered": [ctx.get("employeeId"), ctx.get("equipmentItem")]})
    engine.handlers.register("Task_GrantAccess", lambda ctx: {"accessGranted": granted, "grantedRole": ctx.get("role")})
    engine.handlers.register("Task_ActivateAccount", lambda ctx: {"active": True})
    engine.handlers.register("Task_FlagForItReview", lambda ctx: {"flagged": True})
    instance = run(engine, [fixed, *CALLED], {"employeeId": "e1", "role": "dev", "equipmentList": ["laptop", "phone"]})
    assert instance.status == "completed", instance.error
    done = path_of(instance.workflow)
    assert done.count("Task_OrderItem") == 2
    assert done[-2:] == (["Task_ActivateAccount", "EndEvent_Onboarded"] if granted
                         else ["Task_FlagForItReview", "EndEvent_ManualRemediation"])
    got = variables(instance.context)
    assert (got["accessGranted"], got["grantedRole"]) == (granted, "dev")
    assert got["ordered"] == ["e1", "phone"]   # the last instance's, as in plain SpiffWorkflow (README: no conflict)


# -- Operaton's travel booking: a transaction whose cancel end event undoes the bookings by compensation -------

def test_travel_booking_is_refused_at_each_compensation_boundary_and_the_juel_condition() -> None:
    found = errors(TRAVEL)
    assert set(found) == {"Boundary_CompFlight", "Boundary_CompHotel", "Boundary_CompCar", "Flow_GW_Approved"}
    assert "SpiffWorkflow 3.2 runs no compensation" in found["Boundary_CompCar"][0]
    assert "the undo tasks ('Task_CancelCar')" in found["Boundary_CompCar"][0]
    assert "write 'paymentApproved'" in found["Flow_GW_Approved"][0]


def travel_edited(tmp_path: Path) -> Path:
    """The undo drawn as validate says: the cancel tasks on the path out of the transaction's cancel boundary."""
    text = TRAVEL.read_text()
    text = re.sub(r'<bpmn:boundaryEvent id="Boundary_Comp\w+".*?</bpmn:boundaryEvent>|<bpmn:association .*?/>', "",
                  text, flags=re.S)
    undo = {m.group(1): m.group(0) for m in re.finditer(r'<bpmn:serviceTask id="(Task_Cancel\w+)"[^>]*?/>', text)}
    drawn = ""
    for task, incoming, outgoing in (("Task_CancelCar", "Flow_Cancel_Notify", "undo_1"),
                                     ("Task_CancelHotel", "undo_1", "undo_2"),
                                     ("Task_CancelFlight", "undo_2", "undo_3")):
        text = text.replace(undo[task], "")
        drawn += undo[task].replace('isForCompensation="true"', "").replace(
            "/>", f"><bpmn:incoming>{incoming}</bpmn:incoming><bpmn:outgoing>{outgoing}</bpmn:outgoing>"
                  "</bpmn:serviceTask>")
    text = text.replace('sourceRef="Boundary_TransactionCancelled" targetRef="Task_NotifyCancellation"/>',
                        'sourceRef="Boundary_TransactionCancelled" targetRef="Task_CancelCar"/>'
                        '<bpmn:sequenceFlow id="undo_1" sourceRef="Task_CancelCar" targetRef="Task_CancelHotel"/>'
                        '<bpmn:sequenceFlow id="undo_2" sourceRef="Task_CancelHotel" targetRef="Task_CancelFlight"/>'
                        '<bpmn:sequenceFlow id="undo_3" sourceRef="Task_CancelFlight" '
                        'targetRef="Task_NotifyCancellation"/>' + drawn)
    text = text.replace("<bpmn:incoming>Flow_Cancel_Notify</bpmn:incoming>\n      <bpmn:outgoing>Flow_Notify_End",
                        "<bpmn:incoming>undo_3</bpmn:incoming>\n      <bpmn:outgoing>Flow_Notify_End")
    fixed = tmp_path / TRAVEL.name
    fixed.write_text(text.replace("${paymentApproved}", "paymentApproved"))
    return fixed


@pytest.mark.parametrize("approved", [True, False])
def test_travel_booking_with_the_undo_drawn_confirms_or_cancels_every_booking_in_reverse(
        tmp_path: Path, approved: bool) -> None:
    fixed = travel_edited(tmp_path)
    assert errors(fixed) == {}
    engine = Engine(store="memory://")
    steps = ["Task_ReserveFlight", "Task_ReserveHotel", "Task_ReserveCar", "Task_CancelFlight", "Task_CancelHotel",
             "Task_CancelCar", "Task_SendConfirmation", "Task_NotifyCancellation"]
    for step in steps:
        engine.handlers.register(step, lambda ctx, step=step: {"done": [*ctx.get("done", []), step[5:]]})
    engine.handlers.register("Task_ChargePayment", lambda ctx: {"paymentApproved": approved})
    instance = run(engine, [fixed], {"trip": "T-1"})
    assert instance.status == "completed", instance.error
    assert variables(instance.context) == {"trip": "T-1", "paymentApproved": approved, "done": [
        "ReserveFlight", "ReserveHotel", "ReserveCar",
        *(["SendConfirmation"] if approved else ["CancelCar", "CancelHotel", "CancelFlight", "NotifyCancellation"])]}


# -- Operaton's order fulfilment: lanes, an error boundary on the payment, a listener on a flow -----------------

def test_order_fulfillment_flow_listener_is_named_with_the_assignment_to_draw() -> None:
    """${execution.setVariable('orderStatus', 'FAILED')} on the flow out of the error boundary: validate said
    only 'does the listener's work'; the assignment is known, so it is what to write."""
    [said] = [text for severity, element, text in problems(ORDER) if element == "Flow_error_to_failed"]
    assert "sets 'orderStatus' (execution.setVariable)" in said
    assert "whose script is \"orderStatus = 'FAILED'\"" in said
    assert set(errors(ORDER)) == {"Flow_in_stock", "Flow_out_of_stock"}


@pytest.mark.parametrize(("available", "pays", "then"), [
    (True, True, {"charged": True, "tracking": "T1", "notified": True}),
    (True, False, {"error_code": "PAYMENT_FAILED", "error_message": "declined"}),
    (False, True, {"backordered": True}),
])
def test_order_fulfillment_ships_backorders_or_fails_on_the_payment_error(
        tmp_path: Path, available: bool, pays: bool, then: dict[str, Any]) -> None:
    fixed = edited(tmp_path, ORDER, ("${available == true}", "available == True"),
                   ("${available == false}", "available == False"))
    assert errors(fixed) == {}
    engine = Engine(store="memory://")

    def pay(ctx: Any) -> dict[str, Any]:
        if not pays:
            raise BpmnError("PAYMENT_FAILED", "declined")
        return {"charged": True}

    engine.handlers.register("Task_ValidateInventory", lambda ctx: {"available": available})
    engine.handlers.register("Task_ChargePayment", pay)
    engine.handlers.register("Task_NotifyBackorder", lambda ctx: {"backordered": True})
    engine.handlers.register("Task_NotifyCustomer", lambda ctx: {"notified": True})
    instance = run(engine, [fixed], {"orderId": "o1"}, {"Task_PackShip": {"tracking": "T1"}})
    assert instance.status == "completed", instance.error
    assert variables(instance.context) == {"orderId": "o1", "available": available, **then}


# -- SpiffWorkflow's non-interrupting message boundary: a second start event that never runs -----------------

def test_spiff_second_start_event_is_warned_and_the_first_path_loops_as_in_spiffworkflow() -> None:
    """The sub-process with the message boundary hangs off a second start event, which neither engine runs
    (plain SpiffWorkflow marks it completed and runs nothing after it); the first lane's loop runs the same."""
    path = HERE / "spiff_noninterrupting_message_boundary.bpmn"
    warned = {element: text for severity, element, text in problems(path)}
    assert set(warned) == {"Event_0g8w85g", "Event_12moz8m"}
    assert "start event 'Event_12moz8m' never runs" in warned["Event_12moz8m"]
    assert "write the payload as a Python expression in a spiffworkflow:messagePayload" in warned["Event_0g8w85g"]
    rounds = [{"flag_task": "No"}, {"flag_task": "Yes"}]
    plain = run_plain_files([path], "Process_1kjyavs")
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([path]), {}))
    for answer in rounds:
        [task] = plain.get_tasks(state=TaskState.READY, manual=True)
        task.data.update(answer)
        task.run()
        plain.do_engine_steps()
        [waiting] = instance.waiting_for
        instance = engine.run(instance, answers={"user_tasks": {waiting["id"]: answer}})
    assert plain.is_completed() and instance.status == "completed"
    assert path_of(instance.workflow) == [t for t in path_of(plain) if t != "Event_12moz8m"]
    assert variables(instance.context) == dict(plain.last_task.data) == {"flag_task": "Yes"}


# -- Operaton's quote handling: started by a message, waits for the buyer's decision ---------------------------

@pytest.mark.parametrize("accepted", [True, False])
def test_operaton_quote_handling_starts_on_its_message_and_routes_on_the_decision(
        tmp_path: Path, accepted: bool) -> None:
    path = HERE / "operaton_quote_handling_messages.bpmn"
    assert set(errors(path)) == {"Flow_Accepted_Reserve"}
    assert "write 'accepted'" in errors(path)["Flow_Accepted_Reserve"][0]
    fixed = edited(tmp_path, path, ("${accepted}", "accepted"))
    assert errors(fixed) == {}
    engine = Engine(store="memory://")
    engine.handlers.register("Task_CalculateQuote", lambda ctx: {"quote": 100 * ctx["qty"]})
    engine.handlers.register("Task_ReserveStock", lambda ctx: {"reserved": True})
    engine.handlers.register("Task_ReleaseQuote", lambda ctx: {"released": True})
    instance = engine.run(engine.start(load_process([fixed]), {"item": "bolts"}))
    assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [("StartEvent_QuoteRequest", "QuoteRequest")]
    instance = engine.send_event(instance, "QuoteRequest", {"qty": 5})
    assert [(w["task_id"], w["event"]) for w in instance.waiting_for] == [("IntermediateCatch_OrderDecision",
                                                                           "OrderDecision")]
    instance = engine.send_event(instance, "OrderDecision", {"accepted": accepted})
    assert instance.status == "completed"
    assert variables(instance.context) == {"item": "bolts", "qty": 5, "quote": 500, "accepted": accepted,
                                           **({"reserved": True} if accepted else {"released": True})}
    assert path_of(instance.workflow)[-1] == ("EndEvent_OrderFulfilled" if accepted else "EndEvent_QuoteReleased")


# -- Operaton's bank account opening: parallel KYC checks, a DMN decision, a compliance review ----------------

BANK = HERE / "operaton_bank_account_opening.bpmn"
RISK = HERE / "operaton_account_risk.dmn"


def test_bank_account_opening_is_refused_at_each_juel_condition_and_feel_entry() -> None:
    found = errors(BANK, RISK)
    assert set(found) == {"Flow_decision_approve", "Flow_decision_reject", "Flow_review_approve", "ie1_verified",
                          "ie2_verified", "ie3_verified", "ie3_risk", "ie4_verified"}
    assert "write \"decision == 'APPROVE'\"" in found["Flow_decision_approve"][0]
    assert "'false' is FEEL's: write False" in found["ie1_verified"][0]
    assert "FEEL's not(...) matches any other value; write it as Python: '? != \"LOW\"'" in found["ie3_risk"][0]


@pytest.mark.parametrize(("identity", "risk", "review", "decision", "end"), [
    ((True, 80), "LOW", None, "APPROVE", "EndEvent_AccountOpened"),
    ((False, 0), "LOW", None, "REJECT", "EndEvent_ApplicationRejected"),
    ((True, 80), "HIGH", "APPROVE", "MANUAL_REVIEW", "EndEvent_AccountOpened"),
    ((True, 50), "LOW", "REJECT", "MANUAL_REVIEW", "EndEvent_ApplicationRejected"),
])
def test_bank_account_opening_merges_both_checks_and_decides_by_the_table(
        tmp_path: Path, identity: tuple[bool, int], risk: str, review: str | None, decision: str, end: str) -> None:
    bank = edited(tmp_path, BANK, *[("${" + c + "}", c) for c in ("decision == 'APPROVE'", "decision == 'REJECT'",
                                                                  "reviewOutcome == 'APPROVE'")])
    table = edited(tmp_path, RISK, ("<text>false</text>", "<text>False</text>"),
                   ("<text>true</text>", "<text>True</text>"), ('not("LOW")', '? != "LOW"'))
    assert errors(bank, table) == {}
    engine = Engine(store="memory://")
    engine.handlers.register("ServiceTask_RegisterApplication", lambda ctx: {"applicationId": "A-1"})
    engine.handlers.register("ServiceTask_ValidateIdentity",
                             lambda ctx: {"identityVerified": identity[0], "identityScore": identity[1]})
    engine.handlers.register("ServiceTask_RunBackgroundCheck", lambda ctx: {"backgroundRisk": risk, "rationale": "r"})
    for task in ("ServiceTask_OpenAccount", "ServiceTask_NotifyApproval", "ServiceTask_NotifyRejection"):
        engine.handlers.register(task, lambda ctx, task=task: {task.removeprefix("ServiceTask_"): True})
    instance = run(engine, [bank, table], {"fullName": "Ann"},
                   {"UserTask_ComplianceReview": {"reviewOutcome": review}} if review else {})
    assert instance.status == "completed", instance.error
    got = variables(instance.context)
    assert (got["identityVerified"], got["identityScore"], got["backgroundRisk"]) == (*identity, risk)
    assert got["decision"] == decision and path_of(instance.workflow)[-1] == end
    assert instance.conflicts == []


# -- the CLI: validate's exit code and messages, run --json with answers -----------------------------------------

def test_cli_validate_refuses_the_order_fulfillment_and_run_json_gives_the_merged_parallel_answers(
        tmp_path: Path, cli: Any) -> None:
    refused = cli("validate", str(ORDER))
    assert refused.exit_code != 0
    assert "element 'Flow_in_stock': field 'conditionExpression'" in refused.stdout + refused.stderr
    assert "write 'available == True'" in refused.stdout + refused.stderr
    path = HERE / "spiff_parallel_with_script.bpmn"
    assert cli("validate", str(path)).exit_code == 0
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"user_task_A": {"a": 1}, "user_task_B": {"b": 2},
                                                  "user_task_C": {"c": 3}}}))
    doc = run_json(cli, "run", str(path), "--answers", str(answers))
    assert (doc["status"], doc["error"], doc["waiting_for"], doc["conflicts"]) == ("completed", None, [], [])
    assert {k: v for layer in ("L1", "L3", "L4") for k, v in doc["layers"][layer].items()
            if k in "abc"} == {"a": 1, "b": 2, "c": 3}
    answers.write_text(json.dumps({"user_tasks": {"set_data": {"u": 0, "v": 0, "w": 0}}}))
    stuck = run_json(cli, "run", str(HERE / "spiff_inclusive_gateway.bpmn"), "--answers", str(answers), code=1)
    assert (stuck["status"], stuck["error"]["task_id"]) == ("error", "second")
    assert "the context has v=1" in stuck["error"]["message"]


# -- Operaton's incident management: an SLA timer and a non-interrupting escalation signal on the triage -------

INCIDENT = HERE / "operaton_incident_management_sla.bpmn"


def incident_edited(tmp_path: Path) -> Path:
    """As validate says: Python conditions, the timer's variable bare, the start listener's assignment as a
    script task after the start event."""
    return edited(tmp_path, INCIDENT, ("${resolved == true}", "resolved == True"),
                  ("${resolved != true}", "resolved != True"), (">${timerDuration}<", ">timerDuration<"),
                  ('<bpmn:sequenceFlow id="Flow_start_to_triage" sourceRef="StartEvent_1" '
                   'targetRef="Task_FirstLineTriage" />',
                   '<bpmn:sequenceFlow id="Flow_start_to_triage" sourceRef="StartEvent_1" targetRef="Task_SetLow" />'
                   '<bpmn:scriptTask id="Task_SetLow"><bpmn:incoming>Flow_start_to_triage</bpmn:incoming>'
                   "<bpmn:outgoing>Flow_low</bpmn:outgoing><bpmn:script>incidentPriority = 'LOW'</bpmn:script>"
                   '</bpmn:scriptTask><bpmn:sequenceFlow id="Flow_low" sourceRef="Task_SetLow" '
                   'targetRef="Task_FirstLineTriage" />'),
                  ("<bpmn:incoming>Flow_start_to_triage</bpmn:incoming>\n      <bpmn:outgoing>Flow_triage_to_gw",
                   "<bpmn:incoming>Flow_low</bpmn:incoming>\n      <bpmn:outgoing>Flow_triage_to_gw"))


def test_incident_management_is_refused_naming_each_juel_expression_and_warned_of_each_listener() -> None:
    found = problems(INCIDENT)
    assert {e for s, e, _ in found if s == "error"} == {"Flow_resolved", "Flow_not_resolved", "BoundaryTimer_Escalate"}
    said = {element: text for _, element, text in found}
    assert "timeDuration '${timerDuration}' is not a Python expression" in said["BoundaryTimer_Escalate"]
    assert "write \"incidentPriority = 'LOW'\" in a bpmn:scriptTask drawn after 'StartEvent_1'" in said["StartEvent_1"]
    assert "whose script is \"incidentPriority = 'HIGH'\"" in said["Task_SetHighPriority"]


@pytest.mark.parametrize("case", ["signal, not resolved", "signal, resolved", "sla timer"])
def test_incident_management_escalates_by_signal_or_timer(tmp_path: Path, case: str) -> None:
    fixed = incident_edited(tmp_path)
    assert errors(fixed) == {}
    now = [1_000_000.0]
    engine = Engine(store="memory://", clock=lambda: now[0])
    engine.handlers.register("Task_SetHighPriority", lambda ctx: {"incidentPriority": "HIGH"})
    engine.handlers.register("Task_PostMortem", lambda ctx: {"postmortems": ctx.get("postmortems", 0) + 1})
    engine.handlers.register("Task_CloseTicket", lambda ctx: {"closedAt": ctx.get("incidentPriority")})
    instance = engine.run(engine.start(load_process([fixed]), {"timerDuration": "PT1H"}))
    assert sorted(w["kind"] for w in instance.waiting_for) == ["event", "timer", "user_task"]
    if case == "sla timer":
        now[0] += 3601
        instance = engine.resume(instance)
        assert [w["task_id"] for w in instance.waiting_for] == ["Task_SecondLine"]
        assert variables(instance.context) == {"timerDuration": "PT1H", "incidentPriority": "LOW"}
        return
    instance = engine.send_event(instance, "EscalationSignal", None, kind="signal")
    assert "Task_SecondLine" in [w["task_id"] for w in instance.waiting_for]
    resolved = case == "signal, resolved"
    instance = engine.run(instance, answers={"user_tasks": {"Task_FirstLineTriage": {"resolved": resolved}}})
    lines = [w["id"] for w in instance.waiting_for if w["task_id"] == "Task_SecondLine"]
    assert len(lines) == (1 if resolved else 2)   # the signal's path, and the unresolved triage's
    for line in lines:
        instance = engine.run(instance, answers={"user_tasks": {line: {"handledBy": "bob"}}})
    assert instance.status == "completed", instance.error
    got = variables(instance.context)
    assert got["incidentPriority"] == "HIGH" and got["postmortems"] == len(lines)
    assert got.get("closedAt") == ("HIGH" if resolved else None)
