"""Unseen processes, round 6: small governed processes of tests/engine/unseen6 (procurement with a
call activity whose camunda:in / camunda:out rename variables, a claim whose settlement message
leaves the instance for a ledger process, KYC with a start form and a person settling a join
conflict, a claim with three assessors merged by reducers and branch priority, a content review
that compresses, a collaboration with a start form), run through the CLI, the REST API and the
Python API. Every expectation was worked out by hand from DESIGN.md and the README first."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import Layer, LayeredContext, RuleDrivenCompressor
from engine import Engine, StartDataInvalid, load_process
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from engine_helpers import run_json
from governance_helpers import TOKEN, ServerThread
from test_unseen_processes_5 import records

HERE = Path(__file__).resolve().parent / "unseen6"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GOV = "/api/context-governance"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN6", "redis://127.0.0.1:6379/14")  # this module's own database


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    """A layer's data keys: no activity, event or engine records."""
    return {k: v for k, v in records(layer).items() if not k.startswith(("event:", "_", "compaction:"))}


# ------------------------------------------------------------------ call activity with camunda:in / out


def test_procurement_call_activity_renames_variables_in_and_out(cli: Any) -> None:
    """README: a call activity with camunda:out mappings runs the called process in a scope of its
    own, as Camunda does: the in mappings set its variables there, and only what the out mappings
    set comes back (an out whose source was never set gives None, as Camunda passes a missing
    variable); the called process's own records stay on the scope's tape."""
    assert cli("validate", str(HERE / "procurement.bpmn")).exit_code == 0
    doc = run_json(cli, "run", str(HERE / "procurement.bpmn"), "--data",
                   json.dumps({"quantity": 4, "unit_price": 2500, "country": "FR"}))
    assert doc["status"] == "completed" and doc["error"] is None
    assert doc["layers"]["L0"] == {"policy": "Orders above 10,000 need a second signature."}
    assert doc["layers"]["L1"] == {"quantity": 4, "unit_price": 2500, "country": "FR"}
    assert data_keys(doc["layers"]["L3"]) == {
        "order_total": 10000, "order_tax": 2000, "order_exemption": None, "gross_total": 12000, "booked": True}
    history = doc["layers"]["L3"]
    assert history["activity:check_tax"]["keys"] == ["order_tax", "order_exemption"]
    assert [k for k in history if k.startswith("activity:")] == [
        "activity:price_order", "activity:check_tax", "activity:book_order"]
    [scope] = [name for name, c in doc["contexts"].items() if c["gateway"] == "check_tax"]
    assert doc["contexts"][scope]["status"] == "joined"


# ------------------------------------------------------------------ a message that leaves the instance


def test_a_settlement_message_leaves_the_claim_and_the_ledger_takes_it_with_send(cli: Any) -> None:
    data = json.dumps({"claim_id": "O'Brien-7", "claimed": 7200})
    doc = run_json(cli, "run", str(HERE / "claim_settlement.bpmn"), "--data", data)
    assert doc["status"] == "completed"
    payload = {"claim_id": "O'Brien-7", "payout": 5000}
    out = doc["messages_out"]
    assert [{k: v for k, v in m.items() if k != "seq"} for m in out] == [
        {"name": "claim_settled", "kind": "message", "element_id": "notify_ledger", "payload": payload,
         "context": "main"}]
    # the tape holds it as a message_out note at the seq the document names
    result = cli("tape", doc["instance_id"], "--kind", "message_out", "--json")
    events = json.loads(result.stdout)  # a list of events
    # (its fields named as on a caught event's note: `event` is the name, `event_kind` the kind)
    assert [(e["seq"], e["data"]["event"], e["data"]["event_kind"], e["data"]["element"], e["data"]["payload"])
            for e in events] == [(out[0]["seq"], "claim_settled", "message", "notify_ledger", payload)]

    # the plain summary prints the send that delivers it, quoted for a shell
    plain = cli("run", str(HERE / "claim_settlement.bpmn"), "--data", data)
    assert plain.exit_code == 0
    import shlex

    line = next(x for x in plain.stdout.splitlines() + plain.stderr.splitlines() if "layerflow send" in x)
    command = line.split("`")[1]
    words = shlex.split(command)
    assert words[:4] == ["layerflow", "send", "OTHER_ID", "claim_settled"]
    assert json.loads(words[words.index("--json-payload") + 1]) == payload

    ledger = run_json(cli, "run", str(HERE / "ledger_posting.bpmn"), code=3)
    assert [(w["kind"], w["task_id"], w["event"], w["event_kind"]) for w in ledger["waiting_for"]] == [
        ("event", "settlement_in", "claim_settled", "message")]
    words[2] = ledger["instance_id"]
    posted = run_json(cli, *words[1:])
    assert posted["status"] == "completed"
    assert data_keys(posted["layers"]["L3"]) == {"settlement": payload, "ledger_entry": "CR O'Brien-7 5000"}
    assert posted["layers"]["L3"]["event:settlement_in"]["event"] == "claim_settled"
    # sent again: nothing waits for it any more
    again = cli(*words[1:])
    assert again.exit_code == 2 and "claim_settled" in again.stderr


# ------------------------------------------------------------------ start forms


def test_kyc_start_data_refused_field_by_field_names_the_process(cli: Any) -> None:
    """DESIGN: `--json` gives `"process_id": str`; a refused start names the process it refused
    (no instance exists, so `instance_id` is null)."""
    doc = run_json(cli, "run", str(HERE / "kyc_onboarding.bpmn"), "--data",
                   json.dumps({"customer_name": "A", "risk_score": 140}), code=2)
    assert doc["instance_id"] is None and doc["process_id"] == "kyc_onboarding"
    assert doc["status"] == "error" and doc["error"]["kind"] == "invalid_answer"
    assert doc["error"]["task_id"] == "application_in"
    assert doc["error"]["problems"] == [{"field": "customer_name", "problem": "shorter than 2 characters"},
                                        {"field": "risk_score", "problem": "140 is above the maximum 100"}]
    collab = run_json(cli, "run", str(HERE / "vendor_quote.bpmn"), "--data", json.dumps({"units": 0}), code=2)
    assert collab["process_id"] == "vendor_quote" and collab["instance_id"] is None
    assert "its pool 'requester'" in collab["error"]["message"]
    # a field with a minimum and a default reads as both, not as the range 1..1
    assert "units long 1.. =1" in collab["error"]["message"], collab["error"]["message"]


def test_a_signal_end_event_releases_the_branch_that_waits_for_it(cli: Any) -> None:
    """BPMN's signal end event throws its signal as the path ends (SpiffWorkflow 3.2 parsed it as a
    plain end event and threw nothing): the backorder branch waits for the stock and ships it."""
    doc = run_json(cli, "run", str(HERE / "stock_replenish.bpmn"), "--data", json.dumps({"backorder_units": 5}))
    assert doc["status"] == "completed" and doc["waiting_for"] == []
    assert data_keys(doc["layers"]["L3"]) == {"ordered_units": 10, "arrival": {"units": 10}, "shipped_units": 5}
    assert doc["messages_out"] == []  # caught inside the instance


def test_a_collaboration_records_what_its_pools_throw_to_nobody(cli: Any) -> None:
    """README: a message or signal the process throws that nothing in its instance catches leaves it,
    on the thrower's tape and in `messages_out`. In a collaboration a message waits for a pool that
    catches it; one that no pool can ever catch (the vendor's price audit) and a signal nobody waits
    for (the requester's quote_accepted) leave the instance as they would a single process."""
    doc = run_json(cli, "run", str(HERE / "vendor_quote.bpmn"), "--data", json.dumps({"item": "bolt", "units": 3}))
    assert doc["status"] == "completed"
    assert sorted((m["name"], m["kind"], m["element_id"], json.dumps(m["payload"]), m["context"].split("@")[0])
                  for m in doc["messages_out"]) == [
        ("price_audit", "message", "v_end", json.dumps({"item": "bolt", "unit_price": 12}), "main/vendor"),
        ("quote_accepted", "signal", "r_end", "null", "main/requester")]
    # the messages between the pools did not leave: the rfq and the quote were caught
    assert data_keys(doc["layers"]["L3"])["accepted_total"] == 36
    plain = cli("run", str(HERE / "vendor_quote.bpmn"), "--data", json.dumps({"item": "nut"}))
    said = plain.stdout + plain.stderr
    assert "layerflow send OTHER_ID price_audit" in said and "layerflow send OTHER_ID quote_accepted --signal" in said


def test_submit_json_lists_the_refused_fields_and_the_process(cli: Any) -> None:
    import engine.cli_worker  # noqa: F401 - registers the commands
    from engine.worker import queue_client

    try:
        client = queue_client(queue_url=REDIS)
        client.ping()
    except Exception:
        pytest.skip(f"no Redis at {REDIS}")
    stream = f"u6-{uuid.uuid4().hex[:12]}:ready"
    try:
        result = cli("submit", str(HERE / "kyc_onboarding.bpmn"), "--data", json.dumps({"risk_score": "high"}),
                     "--store", f"memory://u6-{uuid.uuid4().hex}", "--queue", REDIS, "--stream", stream, "--json")
        assert client.xlen(stream) == 0  # refused before anything was queued
    finally:
        client.delete(stream)
        client.close()
    assert result.exit_code == 2, result.stderr
    doc = json.loads(result.stdout)
    assert doc["process_id"] == "kyc_onboarding" and doc["instance_id"] is None
    assert doc["error"]["problems"] == [{"field": "customer_name", "problem": "is required and missing"},
                                        {"field": "risk_score", "problem": '"high" is not a whole number (type long)'}]


def test_kyc_disagreeing_checks_wait_for_a_person_then_open_no_account(cli: Any) -> None:
    doc = run_json(cli, "run", str(HERE / "kyc_onboarding.bpmn"), "--data",
                   json.dumps({"customer_name": "Ann Lee", "risk_score": 20, "pep": True}), code=3)
    assert doc["layers"]["L1"] == {"customer_name": "Ann Lee", "risk_score": 20, "pep": True}
    assert doc["conflicts"] == [{"gateway_id": "checks_join", "layer": "L4", "key": "kyc_status",
                                 "base_value": None, "base_absent": True,
                                 "values": {"sanctions_check": "cleared", "address_check": "refer"},
                                 "resolution": None, "context": "main"}]
    assert [(w["kind"], w["id"]) for w in doc["waiting_for"]] == [("confirmation", "checks_join/kyc_status")]
    (asked,) = doc["confirmations"]
    assert [o["value"] for o in asked["options"]] == ["cleared", "refer", "$escalate"]
    assert (asked["suggested"], asked["default"], asked["timeout"]) == ("refer", "refer", 600.0)
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "checks_join/kyc_status=refer")
    assert done["status"] == "completed"
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    assert data_keys(done["layers"]["L3"]) == {"kyc_status": "refer", "sanctions_hits": 0,
                                               "address_verified": True, "account_open": False}
    # the form's default fills the field left out; agreeing checks need nobody
    fine = run_json(cli, "run", str(HERE / "kyc_onboarding.bpmn"), "--data",
                    json.dumps({"customer_name": "Bo Ek", "risk_score": 20}))
    assert fine["layers"]["L1"]["pep"] is False and fine["conflicts"] == []
    assert fine["layers"]["L3"]["account_open"] is True


# ------------------------------------------------------------------ join settings, knowledge


def test_three_assessors_merge_by_reducers_and_branch_priority(cli: Any) -> None:
    doc = run_json(cli, "run", str(HERE / "claim_assessment.bpmn"), "--data", json.dumps({"claim_no": "C-55"}))
    assert doc["status"] == "completed"
    assert data_keys(doc["layers"]["L3"]) == {
        "recommendation": "investigate", "estimate": 1850, "flags": ["injury", "glass", "late_report"],
        "severity": 3, "decision": "investigate:1850"}
    (conflict,) = doc["conflicts"]
    assert conflict["key"] == "recommendation" and conflict["base_value"] == "undecided"
    assert conflict["values"] == {"medical_assessor": "pay", "damage_assessor": "pay_partial",
                                  "fraud_assessor": "investigate"}
    assert conflict["resolution"]["value"] == "investigate" and conflict["resolution"]["resolver"] == "strategy"
    # the damage assessor retrieved the repair rates beside the process, with source and confidence
    (hit,) = doc["layers"]["L2"].values()
    assert hit["source"].startswith("repair_rates/windscreen_rates.md") and 0 < hit["confidence"] <= 1
    assert "650 EUR" in hit["text"]


# ------------------------------------------------------------------ REST: forms, compression, governance


def test_rest_start_forms_compression_and_governance() -> None:
    with ServerThread(create_app("memory://", HERE, TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        kyc = c.get("/api/processes/kyc_onboarding").json()["start_form"]
        assert kyc["event_id"] == "application_in"
        assert [(f["id"], f["required"], f["default"]) for f in kyc["fields"]] == [
            ("customer_name", True, None), ("risk_score", True, None), ("pep", False, False)]
        assert c.get("/api/processes/procurement").json()["start_form"] is None
        pool = c.get("/api/processes/vendor_quote").json()["start_form"]
        assert pool["event_id"] == "need_in" and [f["id"] for f in pool["fields"]] == ["item", "units"]
        refused = c.post("/api/instances", json={"process_id": "vendor_quote", "data": {"units": 0}})
        assert refused.status_code == 400
        assert refused.json()["error"]["problems"] == [{"field": "item", "problem": "is required and missing"},
                                                       {"field": "units", "problem": "0 is below the minimum 1"}]
        assert c.get("/api/instances").json() == []
        quote = c.post("/api/instances", json={"process_id": "vendor_quote", "data": {"item": "bolt", "units": 3}})
        assert quote.status_code == 201 and quote.json()["status"] == "completed"
        assert data_keys(quote.json()["layers"]["L3"]) == {"quote": {"unit_price": 12}, "accepted_total": 36,
                                                           "rfq": {"item": "bolt", "units": 3}, "unit_price": 12}

        review = c.post("/api/instances", json={"process_id": "content_review", "data": {"article_no": 8}}).json()
        iid = review["instance_id"]
        (comp,) = review["compressions"]
        assert comp["activity_id"] == "check_claims" and "token_threshold" in comp["triggers"]
        assert comp["tokens_after"] < comp["tokens_before"]
        history = review["layers"]["L3"]
        # preserved keys survive unchanged; the folded tool results are gone from HISTORY
        assert history["article_id"] == "ART-8" and history["verdict"] == "publish"
        assert history["claim_check"] == "all three claims are supported by SRC-1 and SRC-2"
        assert "tool_call_result_1" not in history and "compaction:1" in history
        evaluated = c.post(f"{GOV}/compress", json={"instance_id": iid, "action": "evaluate"}).json()
        assert evaluated["snapshot_id"] == comp["snapshot_id"] and evaluated["preserved_intact"] is True
        assert sorted(evaluated["checked_preserved"]) == ["article_id", "claim_check"]
        undone = c.post(f"{GOV}/compress", json={"instance_id": iid, "action": "decompress"})
        assert undone.status_code == 200, undone.text
        after = c.get(f"/api/instances/{iid}").json()["layers"]["L3"]
        assert after["tool_call_result_2"]["data"]["id"] == "SRC-2" and "compaction:1" not in after
        assert after["verdict"] == "publish"  # written after the compression: kept
        # rollback is a tape event too: HISTORY as the compression's snapshot held it (before publish_decision)
        rolled = c.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": comp["snapshot_id"],
                                                 "layers": ["L3"]})
        assert rolled.status_code == 200, rolled.text
        back = c.get(f"/api/instances/{iid}").json()["layers"]["L3"]
        assert "verdict" not in back and back["tool_call_result_1"]["data"]["id"] == "SRC-1"
        restores = c.get(f"/api/instances/{iid}/tape?kind=rollback").json()["events"]
        # (the decompress above restored the same snapshot: it is a restore too)
        assert [(e["actor"], e["data"]["snapshot_id"]) for e in restores] == [("api", comp["snapshot_id"])] * 2

        kyc_run = c.post("/api/instances", json={"process_id": "kyc_onboarding",
                                                 "data": {"customer_name": "Ann Lee", "risk_score": 20,
                                                          "pep": True}}).json()
        kid = kyc_run["instance_id"]
        denied = c.post(f"{GOV}/inject", json={"instance_id": kid, "context": "address_check",
                                               "key": "policy", "value": "x"})
        assert denied.status_code == 403 and "policy" in denied.json()["error"]["message"]
        # the main context waits for the join; a branch takes an operator's note, merged at the join
        assert c.post(f"{GOV}/inject", json={"instance_id": kid, "key": "officer_note", "value": "seen"}).status_code == 409
        noted = c.post(f"{GOV}/inject", json={"instance_id": kid, "context": "address_check",
                                              "key": "officer_note", "value": "passport seen"})
        assert noted.status_code == 200 and noted.json()["written"] == {"officer_note": "L4"}
        configured = c.post(f"{GOV}/config", json={"instance_id": kid, "config": {
            "activityId": "open_account", "preserveKeys": ["kyc_status"]}})
        assert configured.status_code == 200, configured.text
        scripted = c.post(f"{GOV}/config", json={"instance_id": kid, "config": {"activityId": "open_account",
                                                                                "script": "x = 1"}})
        assert scripted.status_code == 422
        settled = c.post(f"{GOV}/resolve", json={"instance_id": kid, "confirmation_id": "checks_join/kyc_status",
                                                 "resolution": "cleared", "reason": "officer checked"})
        assert settled.status_code == 200 and settled.json()["status"] == "completed"
        final = c.get(f"/api/instances/{kid}").json()
        assert final["layers"]["L3"]["account_open"] is True
        assert final["layers"]["L3"]["officer_note"] == "passport seen"
        assert final["conflicts"][0]["resolution"]["resolver"] == "human"


# ------------------------------------------------------------------ the Python API as README shows it


def test_python_api_as_the_readme_describes_it() -> None:
    engine = Engine(f"memory://u6-{uuid.uuid4().hex}")
    bought = engine.run(load_process(HERE / "procurement.bpmn"), {"quantity": 2, "unit_price": 100, "country": "DE"})
    assert bought.status == "completed"
    assert (bought.main["order_tax"], bought.main["gross_total"], bought.main["order_exemption"]) == (20, 220, None)

    with pytest.raises(StartDataInvalid) as refused:
        engine.start(load_process(HERE / "kyc_onboarding.bpmn"), {"risk_score": 5})
    assert refused.value.problems == [("customer_name", "is required and missing")]
    waiting = engine.run(load_process(HERE / "kyc_onboarding.bpmn"),
                         {"customer_name": "Ann Lee", "risk_score": 20, "pep": True})
    assert waiting.status == "waiting"
    done = engine.resume(waiting.id, answers={"confirmations": {"checks_join/kyc_status": "refer"}})
    assert done.status == "completed" and done.main["kyc_status"] == "refer"

    settled = engine.run(load_process(HERE / "claim_settlement.bpmn"), {"claim_id": "CL-9", "claimed": 100})
    (message,) = settled.messages_out()
    ledger = engine.run(load_process(HERE / "ledger_posting.bpmn"), {})
    posted = engine.send_event(ledger.id, message["name"], message["payload"])
    assert posted.status == "completed" and posted.main["ledger_entry"] == "CR CL-9 100"

    ctx = LayeredContext(system={"policy": "cite sources"}, process={"case": "K1"})
    assert ctx["case"] == "K1" and list(ctx) == ["policy", "case"]
    for i in range(4):
        ctx.begin_activity(f"search_{i}")
        ctx.write(Layer.WORKING, f"tool_call_result_{i}", {"status": "ok", "data": {"id": i, "body": "x " * 200}})
        ctx.complete_activity(f"search_{i}")
    compressor = RuleDrivenCompressor()
    config = {"compressRules": [{"pattern": "tool_call_result", "action": "extract_keys",
                                 "extractKeys": ["status", "data.id"]}]}
    result = compressor.compress(ctx, config, triggers=[])
    assert ctx["tool_call_result_0"] == {"status": "ok", "data": {"id": 0}, "_compressed": "extract_keys"} \
        or ctx["tool_call_result_0"]["data"] == {"id": 0}
    report = compressor.evaluate(ctx, result)
    assert report.snapshot_id == result.snapshot_id and report.tokens_after < report.tokens_before
    compressor.decompress(ctx, result)
    assert ctx["tool_call_result_0"]["data"]["body"] == "x " * 200
    assert LayeredContext.replay(ctx.tape) == ctx


# ------------------------------------------------------------------ validate on call mappings


CALLER = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL"
                  xmlns:camunda="http://camunda.org/schema/1.0/bpmn" id="d" targetNamespace="https://layerflow.dev/t">
  <bpmn:process id="caller" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:callActivity id="call" calledElement="callee">
      <bpmn:extensionElements>MAPPINGS</bpmn:extensionElements>
    </bpmn:callActivity>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="call"/>
    <bpmn:sequenceFlow id="f2" sourceRef="call" targetRef="end"/>
  </bpmn:process>
  <bpmn:process id="callee" isExecutable="true">
    <bpmn:startEvent id="c_start"/>
    <bpmn:scriptTask id="work"><bpmn:script>result = amount * 2</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="c_end"/>
    <bpmn:sequenceFlow id="c1" sourceRef="c_start" targetRef="work"/>
    <bpmn:sequenceFlow id="c2" sourceRef="work" targetRef="c_end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def _caller(tmp_path: Path, mappings: str, system: str | None = None) -> Path:
    path = tmp_path / "caller.bpmn"
    path.write_text(CALLER.replace("MAPPINGS", mappings), encoding="utf-8")
    if system is not None:
        (tmp_path / "caller.layerflow.yaml").write_text(f"system:\n  {system}: fixed\n", encoding="utf-8")
    return path


def test_validate_names_a_business_key_mapping_and_not_the_renames_that_run(cli: Any, tmp_path: Path) -> None:
    """A call activity as Camunda Modeler saves it passes its business key beside renames that run:
    the warning is about the business key alone (the renames are not "settings layerflow does not run")."""
    path = _caller(tmp_path, '<camunda:in businessKey="#{execution.processBusinessKey}"/>'
                             '<camunda:in source="amount" target="net"/><camunda:out source="result" target="doubled"/>')
    result = cli("validate", str(path), "--process", "caller")
    assert result.exit_code == 0, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert "businessKey" in said and "call" in said
    assert "camunda:out" not in said, said


def test_validate_refuses_a_mapping_target_the_system_layer_fixes(cli: Any, tmp_path: Path) -> None:
    """As a DMN task's result variable named like a SYSTEM key is refused before the run: the instance
    would stop at the call activity, after the called process ran."""
    path = _caller(tmp_path, '<camunda:out source="result" target="policy"/>', system="policy")
    result = cli("validate", str(path), "--process", "caller")
    assert result.exit_code == 2, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert "'policy'" in said and "'call'" in said and "camunda:out" in said and "SYSTEM" in said


def test_validate_refuses_a_signal_payload_on_the_event_definition(cli: Any, tmp_path: Path) -> None:
    """SpiffWorkflow reads a signal's (error's, escalation's) payloadExpression and variableName from
    the bpmn:signal element: written on the event's signalEventDefinition, as a message's payload is
    written on its messageEventDefinition, they are never read (the catch's variable is never set,
    and the step that reads it stops the run). validate names each, with where to move it."""
    text = (HERE / "stock_replenish.bpmn").read_text(encoding="utf-8")
    text = text.replace('''  <bpmn:signal id="arrived_signal" name="stock_arrived">
    <bpmn:extensionElements>
      <spiffworkflow:payloadExpression>{"units": ordered_units}</spiffworkflow:payloadExpression>
      <spiffworkflow:variableName>arrival</spiffworkflow:variableName>
    </bpmn:extensionElements>
  </bpmn:signal>''', '''  <bpmn:signal id="arrived_signal" name="stock_arrived"/>''')
    text = text.replace('<bpmn:signalEventDefinition id="stock_in_def" signalRef="arrived_signal"/>',
                        '<bpmn:signalEventDefinition id="stock_in_def" signalRef="arrived_signal"><bpmn:extensionElements>'
                        '<spiffworkflow:payloadExpression>{"units": ordered_units}</spiffworkflow:payloadExpression>'
                        '</bpmn:extensionElements></bpmn:signalEventDefinition>')
    text = text.replace('<bpmn:signalEventDefinition id="wait_stock_def" signalRef="arrived_signal"/>',
                        '<bpmn:signalEventDefinition id="wait_stock_def" signalRef="arrived_signal"><bpmn:extensionElements>'
                        '<spiffworkflow:variableName>arrival</spiffworkflow:variableName>'
                        '</bpmn:extensionElements></bpmn:signalEventDefinition>')
    path = tmp_path / "stock_replenish.bpmn"
    path.write_text(text, encoding="utf-8")
    result = cli("validate", str(path))
    assert result.exit_code == 2, result.stdout + result.stderr
    said = result.stdout + result.stderr
    for element, name in (("stock_in", "payloadExpression"), ("wait_stock", "variableName")):
        line = next(x for x in said.splitlines() if f"'{element}'" in x and name in x)
        assert "'arrived_signal'" in line and "bpmn:signal" in line, line


def test_a_multi_instance_call_activity_maps_each_instance_in_and_out(cli: Any) -> None:
    """Camunda applies a multi-instance call activity's in / out mappings to each instance (each
    call gets its own item as `invoice_amount`, each gives back its `paid_ref` as the output item
    `ref`), as layerflow runs them: as each instance's preScript and postScript."""
    assert cli("validate", str(HERE / "batch_payments.bpmn")).exit_code == 0
    doc = run_json(cli, "run", str(HERE / "batch_payments.bpmn"), "--data", json.dumps({"invoices": [100, 250]}))
    assert doc["status"] == "completed", doc["error"]
    history = data_keys(doc["layers"]["L3"])
    assert history["refs"] == ["P-100", "P-250"] and history["paid_count"] == 2
    # what a call's mappings set is that call's (Camunda's called instance's): the caller gets the refs only
    assert "invoice_amount" not in history and "paid_ref" not in history and "ref" not in history


def test_resume_of_a_completed_instance_says_what_it_did_not_use(cli: Any) -> None:
    """A script that resumes an instance that has completed meanwhile: its answers are not used (stderr
    says so, exit 0: nothing waits), and a --set, which would change a finished context, is refused
    (exit 2), as REST refuses an inject into a completed instance (409)."""
    doc = run_json(cli, "run", str(HERE / "procurement.bpmn"), "--data",
                   json.dumps({"quantity": 1, "unit_price": 10, "country": "DE"}))
    iid = doc["instance_id"]
    answered = cli("resume", iid, "--answer", "checks_join/kyc_status=refer")
    assert answered.exit_code == 0
    assert "checks_join/kyc_status" in answered.stderr and "completed" in answered.stderr, answered.stderr
    corrected = cli("resume", iid, "--set", "order_total=99")
    assert corrected.exit_code == 2
    assert "--set" in corrected.stderr and "completed" in corrected.stderr, corrected.stderr
    assert run_json(cli, "inspect", iid)["layers"]["L3"]["order_total"] == 10


def test_a_cliff_over_extracted_tool_results_keeps_every_extracted_value(cli: Any) -> None:
    """content_review's extract_keys rule keeps each tool result's status and data.id; the cliff that
    then folded the fetching activity summarized those short lines to a quarter: "tool_call_result_1:
    status:" with no value, the second result gone. What the rule kept is now carried verbatim in the
    record's ``kept``; only the rest is summarized, and ``tokens_after`` counts it."""
    doc = run_json(cli, "run", str(HERE / "content_review.bpmn"), "--data", json.dumps({"article_no": 7}))
    history = doc["layers"]["L3"]
    record = history["compaction:1"]
    assert record["kept"] == ["tool_call_result_1: data.id: SRC-1; status: ok",
                              "tool_call_result_2: data.id: SRC-2; status: ok"]
    assert record["covers"] == ["activity:fetch_sources"] and "tool_call_result_1" not in history
    (comp,) = doc["compressions"]
    assert record["tokens_after"] == comp["tokens_after"] < comp["tokens_before"]
    assert history["article_id"] == "ART-7"  # preserved, not folded
