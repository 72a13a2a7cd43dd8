"""Outsider round 37: processes nobody here had seen, written from README.md and DESIGN.md only
(tests/engine/outsider37/, saved as Camunda Modeler saves them, with their diagrams), driven through
the Python API and the CLI.

contract_review: a drafting agent (an ``llm:`` step run by its offline handler) loops through an
  exclusive gateway whose back edge reads the key the agent wrote (``needs_rework and draft_round < 3``);
  a parallel split into a legal review (a user task with a Camunda form) and a send task, a receive task
  and a screening agent whose sanctions verdict ends the instance at a terminate end event, while the
  legal review waits or waits at the join; legal and compliance disagree on ``approval`` at the join,
  settled by a person.

order_fulfilment: lanes, a data object, a business rule task (Camunda 7 ``decisionRef`` with
  ``resultVariable``/``singleResult`` over shipping_decision.dmn, hit policy FIRST), an inclusive gateway
  with a parallel gateway nested in one of its branches, a send task, a receive task, a link event pair,
  an interrupting message event sub-process (order cancelled) and a non-interrupting timer one (a
  reminder after a day unpaid).

trip_booking: a transaction whose hotel agent finds no room and ends it at a cancel end event while the
  traveller's seat choice waits; the cancel boundary event's path reads the agent's note. The same
  transaction with a compensation boundary event and its handler is refused, naming the event.

Expected before anything ran: as README and DESIGN say, and so it was, but for:
- order_fulfilment: ``inspect``'s ``written_by`` (and REST/console ``replay``'s) credited a value to the
  activity whose completion moved it from WORKING into HISTORY, not to whoever wrote it: an operator's
  ``resume --set gift_wrap=true`` showed as written by ``Activity_payment`` (the receive task that
  completed next), and the join's ``_mergedConflicts`` likewise, though that activity's own record lists
  neither key. A move is no write: such a value keeps its writer (the operator, the join).
- order_fulfilment: an order whose ``weight`` came as ``"heavy"`` (or null) stopped at the business rule task
  with SpiffWorkflow's bare ``TypeError: '>=' not supported between instances of 'str' and 'int'``; the
  table's input declares ``typeRef="number"`` (Camunda refuses such a value naming the input). The error now
  names the input, its table, the key, the value and what to give.
- contract_review: ``Engine.complete_user_task`` for the legal review a terminate end event had ended raised
  an ``ActivityError`` of kind ``activity_failed``, as if the review had failed; REST answers 409
  ``invalid_state``. It is now ``InstanceStateError`` (``invalid_state``) there too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "outsider37"
CONTRACT = HERE / "contract_review.bpmn"
ORDER = HERE / "order_fulfilment.bpmn"
TRIP = HERE / "trip_booking.bpmn"
ACME = {"counterparty": "Acme GmbH", "value": 120000}
EXPRESS = {"order_id": "SO-881", "weight": 4, "priority": "high"}


def waiting(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return sorted((w["kind"], w["task_id"]) for w in doc["waiting_for"])


# ----------------------------------------------------------------------------- contract review


def test_the_rework_loop_reads_the_agents_key_and_a_person_settles_the_join(cli: Any) -> None:
    doc = run_json(cli, "run", str(CONTRACT), "--data", json.dumps(ACME), code=3)
    check_run_document(doc)
    assert waiting(doc) == [("event", "Activity_screening_result"), ("user_task", "Activity_legal")]
    assert [m["name"] for m in doc["messages_out"]] == ["screening_request"]
    assert doc["layers"]["L3"]["draft_round"] == 2 and doc["layers"]["L3"]["needs_rework"] is False
    assert [k for k in doc["layers"]["L3"] if k.startswith("activity:Activity_draft")] == [
        "activity:Activity_draft", "activity:Activity_draft#2"]  # two rounds, the back edge taken once
    iid = doc["instance_id"]
    run_json(cli, "resume", iid, "--answer", 'Activity_legal={"approval": "reject", "legal_note": "clause 9"}', code=3)
    asked = run_json(cli, "send", iid, "screening_result", "--json-payload", '{"listed": false}', code=3)
    check_run_document(asked)
    [conflict] = asked["conflicts"]
    assert conflict["values"] == {"Activity_legal": "reject", "Activity_request_screening": "approve"}  # branch ids: first elements
    assert conflict["resolution"] is None and conflict["gateway_id"] == "Gateway_join"
    assert [(w["kind"], w["id"]) for w in asked["waiting_for"]] == [("confirmation", "Gateway_join/approval")]
    refused = run_json(cli, "resume", iid, "--answer", "Gateway_join/approval=maybe", code=2)
    assert refused["error"]["instance_status"] == "waiting" and refused["layers"] == asked["layers"]
    done = run_json(cli, "resume", iid, "--answer", "Gateway_join/approval=reject")
    check_run_document(done)
    assert done["layers"]["L3"]["contract_status"] == "rejected"
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    decisions = cli("tape", iid, "--kind", "human_decision")
    assert decisions.exit_code == 0 and 'value="reject"' in decisions.stdout


def test_a_terminate_end_event_ends_the_legal_review_that_waits_at_the_join(cli: Any) -> None:
    doc = run_json(cli, "run", str(CONTRACT), "--data", json.dumps(ACME), code=3)
    iid = doc["instance_id"]
    run_json(cli, "resume", iid, "--answer", 'Activity_legal={"approval": "approve"}', code=3)
    done = run_json(cli, "send", iid, "screening_result", "--json-payload", '{"listed": true}')
    check_run_document(done)
    assert done["status"] == "completed" and done["waiting_for"] == [] and done["confirmations"] == []
    assert "contract_status" not in done["layers"]["L3"]  # nothing after the join ran
    statuses = {c["branch_id"]: c["status"] for c in done["contexts"].values()}
    assert statuses == {"Activity_legal": "cancelled", "Activity_request_screening": "joined"}
    legal = cli("tape", iid, "--branch", "Activity_legal")
    assert legal.exit_code == 0 and "note:cancelled\tEvent_blocked" in legal.stdout


# ----------------------------------------------------------------------------- order fulfilment


def test_the_order_runs_dmn_nested_gateways_links_and_both_event_sub_processes() -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(ORDER), EXPRESS, answers={"confirmations": {"Gateway_express_join/handling": "courier"}})
    assert instance.main.resolve("shipping") == {"carrier": "DHL", "express": True}  # rule 2 of a FIRST table
    assert sorted(w["task_id"] for w in instance.waiting_for) == ["Activity_payment", "Event_cancel_start",
                                                                  "Event_reminder_start"]
    done = engine.send_event(engine.load(instance.id), "payment_received", {"paid_amount": 249.9})
    assert done.status == "completed"
    assert done.main.resolve("order_doc") == {"order_id": "SO-881", "carrier": "DHL", "paid": 249.9}
    assert done.main.resolve("handling") == "courier" and done.main.resolve("label") == "DHL EXPRESS SO-881"


def test_an_interrupting_cancellation_closes_the_nested_joins_question(cli: Any) -> None:
    doc = run_json(cli, "run", str(ORDER), "--data", json.dumps(EXPRESS), code=3)
    assert [w["id"] for w in doc["waiting_for"] if w["kind"] == "confirmation"] == ["Gateway_express_join/handling"]
    done = run_json(cli, "send", doc["instance_id"], "order_cancelled", "--json-payload", '{"reason": "changed mind"}')
    check_run_document(done)
    assert done["waiting_for"] == [] and done["layers"]["L3"]["order_status"] == "cancelled"
    [conflict] = done["conflicts"]
    assert conflict["resolution"] is None and conflict["cancelled"] is True
    assert {c["status"] for name, c in done["contexts"].items() if name != "main/Activity_cancel_handler@8"} == {"cancelled"}


def test_a_value_moved_into_history_keeps_its_writer(cli: Any) -> None:
    doc = run_json(cli, "run", str(ORDER), "--data", json.dumps(EXPRESS), "--answers", json.dumps(
        {"confirmations": {"*": "courier"}}), code=3)
    iid = doc["instance_id"]
    run_json(cli, "resume", iid, "--set", "gift_wrap=true", code=3)
    run_json(cli, "send", iid, "payment_received", "--json-payload", '{"paid_amount": 249.9}')
    entries = {e["key"]: e for e in run_json(cli, "inspect", iid)["layer_stats"]["L3"]["entries"]}
    gift, merged, paid = entries["gift_wrap"]["written_by"], entries["_mergedConflicts"]["written_by"], entries[
        "paid_amount"]["written_by"]
    assert (gift["activity"], gift["actor"]) == (None, "operator"), gift
    assert (merged["activity"], merged["actor"], merged["via"]) == (None, "Gateway_options_join", "join"), merged
    assert paid["activity"] == "Activity_payment"  # the receive task's own write is still its own
    from engine.console import replay_document

    instance = Engine(os.environ["LAYERFLOW_STORE"]).load(iid)  # the store the cli fixture set
    keys = {k["key"]: k["written_by"] for k in replay_document(instance, instance.main, None)["layers"]["L3"]["keys"]}
    assert (keys["gift_wrap"]["activity"], keys["gift_wrap"]["actor"]) == (None, "operator"), keys["gift_wrap"]
    assert (keys["_mergedConflicts"]["actor"], keys["_mergedConflicts"]["kind"]) == ("Gateway_options_join", "changes")
    assert keys["paid_amount"]["activity"] == "Activity_payment"


# ----------------------------------------------------------------------------- trip booking


def test_a_cancel_end_event_ends_the_transaction_while_the_seat_choice_waits(cli: Any) -> None:
    done = run_json(cli, "run", str(TRIP), "--data", '{"city": "Venice"}')
    check_run_document(done)
    assert done["waiting_for"] == [] and done["layers"]["L3"]["trip_status"] == "not booked: Venice: fully booked"
    assert {c["branch_id"]: c["status"] for c in done["contexts"].values()} == {
        "Activity_seat": "cancelled", "Activity_hotel": "joined"}
    booked = run_json(cli, "run", str(TRIP), "--data", '{"city": "Lyon"}', code=3)
    assert waiting(booked) == [("user_task", "Activity_seat")]
    assert run_json(cli, "resume", booked["instance_id"], "--answer", 'Activity_seat={"seat": "12A"}')[
        "layers"]["L3"]["trip_status"] == "booked seat 12A"


def test_a_compensation_boundary_event_is_refused_naming_it(tmp_path: Path, cli: Any) -> None:
    text = TRIP.read_text().replace('      <bpmn:parallelGateway id="Gateway_book_join">', '''      <bpmn:boundaryEvent id="Event_release" name="Release" attachedToRef="Activity_hotel">
        <bpmn:compensateEventDefinition id="CompensateEventDefinition_0r1" />
      </bpmn:boundaryEvent>
      <bpmn:scriptTask id="Activity_release_room" name="Release room" isForCompensation="true" scriptFormat="python">
        <bpmn:script>hotel_released = True</bpmn:script>
      </bpmn:scriptTask>
      <bpmn:parallelGateway id="Gateway_book_join">''', 1)
    path = tmp_path / "trip_booking.bpmn"
    path.write_text(text)
    for name in ("trip_booking.layerflow.yaml", "trip_agents.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    refused = run_json(cli, "run", str(path), "--data", '{"city": "Venice"}', code=2)
    message = refused["error"]["message"]
    assert refused["instance_id"] is None and "'Event_release'" in message and "compensation" in message
    assert "'Activity_release_room'" in message


@pytest.mark.parametrize(("weight", "shown"), [("heavy", '"heavy" (a string)'), (None, "null")])
def test_a_decision_input_of_another_type_than_its_table_declares_is_named(weight: Any, shown: str) -> None:
    instance = Engine("memory://").run(load_process(ORDER), {**EXPRESS, "weight": weight})
    assert instance.status == "error" and instance.error["task_id"] == "Activity_shipping_rule"
    message = instance.error["message"]
    # Camunda refuses such a value as the input's typeRef; SpiffWorkflow's TypeError alone said neither
    # which input nor what to give
    assert "input 'Weight (kg)' of decision table 'DecisionTable_ship'" in message, message
    assert f"'weight' holds {shown}" in message and "typeRef 'number'" in message
    assert "give 'weight' a number" in message


def test_the_python_api_refuses_an_answer_for_a_terminated_review_as_rest_does() -> None:
    from engine.governance import InstanceStateError

    engine = Engine("memory://")
    instance = engine.send_event(engine.run(load_process(CONTRACT), ACME), "screening_result", {"listed": True})
    assert instance.status == "completed" and instance.waiting_for == []
    length = instance.tape_length()
    # REST answers 409 invalid_state; Engine.complete_user_task raised an ActivityError of kind
    # activity_failed, as if the legal review had failed
    with pytest.raises(InstanceStateError) as refused:
        engine.complete_user_task(engine.load(instance.id), "Activity_legal", {"approval": "approve"})
    assert refused.value.kind == "invalid_state" and "does not wait for task 'Activity_legal'" in str(refused.value)
    assert engine.load(instance.id).tape_length() == length
