"""Unseen processes, round 17, written by an outsider who read DESIGN.md and the README only; every
expectation below was written down from those two before anything ran.

employee_offboarding (tests/engine/unseen17/employee_offboarding.bpmn): the exit is recorded, access is
revoked by a called process (access_revocation.bpmn, with a config file of its own that names its
handler and a preserved key), then an event-based gateway waits for the equipment (a message) or a
one-hour deadline (a timer, which charges the equipment); an inclusive split runs the exit tasks the
leaver needs (payroll always, equity for stock options, reports for managers) into an inclusive join
that settles `last_pay_date` by BRANCH_PRIORITY and `payout`, `closed_items`, `exit_notes` by reducers
(`sum`, `union`, `append`); HR's exit interview is a user task.

subrogation_recovery: fault and damages are analysed in parallel, damages in two nested parallel
branches whose join settles `recoverable_amount` by a policy rule (`min` and `append` reducers beside);
the outer join asks a person about `fault_share` and `recovery_route` (or a model settles the share and
escalates the route): answered by `--answers`, `resume --answer`, REST, or left to time out (per-key
defaults). The recovery is pursued in a sub-process with an error boundary (insolvent), an escalation
boundary (disputed) and a non-interrupting half-hour reminder timer.

patent_prior_art: the databases' results are compressed after the novelty analysis (`extract_keys`,
`summarize`, `count_only`, `preserveKeys`), the analysis retrieves the office's novelty rules (knowledge),
an examiner decides (user task); rolled back to the compression's snapshot and replayed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from context_layers import Layer, LayeredContext
from context_layers.tokens import count_text
from engine import Engine, load_process

import test_unseen_processes_4
from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json
from test_unseen_processes import _check_document
from test_unseen_processes_13 import Clock, data_of
from test_unseen_processes_3 import assert_replays   # every snapshot of every context rebuilds byte for byte
from test_unseen_processes_16 import _served_url, _until, stop_all   # a served URL from stderr; polling a REST document; stopping

HERE = Path(__file__).resolve().parent / "unseen17"
ROOT = Path(__file__).resolve().parents[2]
OFFBOARD = HERE / "employee_offboarding.bpmn"
ACCESS = HERE / "access_revocation.bpmn"
SUBRO = HERE / "subrogation_recovery.bpmn"
PATENT = HERE / "patent_prior_art.bpmn"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN17", "redis://127.0.0.1:6379/8")   # this module's own database
TOKEN = "os17-token"
fake_model = test_unseen_processes_4.fake_model
cli = cli_in_a_tmp_store

LEAVER = {"employee_id": "E-417", "name": "Rita Novak", "has_stock_options": True, "is_manager": False,
          "successor": "Tom Berg"}
CLAIM = {"claim_id": "SUB-88", "claim_amount": 12000, "other_insurer": "Harbor Mutual"}
APPLICATION = {"application_id": "PA-2026-17", "inventor": "J. Okafor", "title": "Self-locking solar mount hinge"}
RETURNED = {"condition": "good", "received_by": "it-desk"}


def _store(tmp_path: Path, name: str = "u17.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def _nothing_saved(cli: Any, db: Path) -> bool:
    if not db.exists():
        return True
    listed = cli("list", "--store", f"sqlite:///{db}", "--json")
    return listed.exit_code == 0 and json.loads(listed.stdout) in ([], {"instances": []})


def _tape(cli: Any, iid: str, store: str, *args: str) -> list[dict[str, Any]]:
    result = cli("tape", iid, "--store", store, "--json", *args)
    assert result.exit_code == 0, result.stderr
    events: list[dict[str, Any]] = json.loads(result.stdout)
    return events


# ------------------------------------------------------------------ offboarding: event gateway, call activity, inclusive


OFFBOARD_AT_GATEWAY = {"closed_items": ["exit_form"], "exit_recorded": True, "revoked_systems": ["sso", "email", "vpn"],
                       "access_ticket": "ACC-E-417", "badge_status": "revoked:E-417"}


def test_the_leaver_returns_the_equipment_and_the_exit_tasks_merge(cli: Any, tmp_path: Path) -> None:
    """run (3: the event gateway waits for the message and the timer) -> send (3: the exit interview
    waits; payroll and equity ran, reports did not) -> resume --answer (0)."""
    store = _store(tmp_path)
    doc = run_json(cli, "run", str(OFFBOARD), str(ACCESS), "--data", json.dumps(LEAVER), "--store", store, code=3)
    _check_document(doc, 3, "employee_offboarding")
    assert doc["layers"]["L0"] == {"policy": "Company equipment not returned within the deadline is charged to "
                                             "the final pay."}
    assert doc["layers"]["L1"] == LEAVER
    assert data_of(doc["layers"]["L3"]) == OFFBOARD_AT_GATEWAY
    history = doc["layers"]["L3"]
    assert {"activity:record_exit", "activity:disable_accounts", "activity:revoke_badge"} <= set(history)
    kinds = {w["kind"]: w for w in doc["waiting_for"]}
    assert set(kinds) == {"event", "timer"}, doc["waiting_for"]
    event = kinds["event"]
    assert (event["event"], event["task_id"], event["event_id"]) == (
        "equipment_returned", "await_equipment", "equipment_returned_event")
    assert kinds["timer"]["due"] and kinds["timer"]["task_id"] in ("await_equipment", "return_deadline")
    assert doc["conflicts"] == [] and doc["confirmations"] == [] and doc["compressions"] == []
    iid = doc["instance_id"]

    sent = cli("send", iid, "equipment_returned", "--json-payload", json.dumps(RETURNED), "--store", store, "--json")
    assert sent.exit_code == 3, (sent.stdout, sent.stderr)
    doc = json.loads(sent.stdout)
    _check_document(doc, 3, "employee_offboarding")
    history = doc["layers"]["L3"]
    assert "event:equipment_returned_event" in history
    assert {"activity:final_payroll", "activity:equity_settlement"} <= set(history)
    assert "activity:reassign_reports" not in history and "activity:charge_equipment" not in history
    assert data_of(history) == {**OFFBOARD_AT_GATEWAY, **RETURNED, "equipment_status": "returned_good",
                                "equipment_charge": 0, "last_pay_date": "2027-01-15", "payout": 6000,
                                "closed_items": ["exit_form", "payroll", "equity"],
                                "exit_notes": ["final salary booked", "vested options bought back"]}
    by_key = {c["key"]: c for c in doc["conflicts"]}
    pay_date = by_key["last_pay_date"]
    assert (pay_date["gateway_id"], pay_date["layer"], pay_date["base_value"], pay_date["values"]) == (
        "exit_join", "L4", None, {"final_payroll": "2026-12-31", "equity_settlement": "2027-01-15"})
    assert (pay_date["resolution"]["value"], pay_date["resolution"]["resolver"]) == ("2027-01-15", "strategy")
    assert isinstance(pay_date["resolution"]["reason"], str) and pay_date["resolution"]["reason"]
    assert set(by_key) == {"last_pay_date"}    # README (this round): a key its reducer merges is no conflict
    [wait] = doc["waiting_for"]
    assert (wait["kind"], wait["task_id"]) == ("user_task", "hr_exit_interview") and wait["id"]   # id: the run's task
    assert wait["documentation"].startswith("Hold the exit interview")

    doc = run_json(cli, "resume", iid, "--answer", 'hr_exit_interview={"would_return": true}', "--store", store)
    _check_document(doc, 0, "employee_offboarding")
    assert doc["layers"]["L3"]["case_status"] == "closed:rehire"
    assert doc["waiting_for"] == []
    # the tape: one split and one join of the inclusive gateway, the message, the person's answer
    tape = _tape(cli, iid, store)
    main = [e for e in tape if e["context"] == "main"]
    assert [e["seq"] for e in main] == list(range(1, len(main) + 1))
    [join] = _tape(cli, iid, store, "--kind", "join")
    assert join["actor"] == "exit_join"           # a gateway's events name it as their actor
    assert join["seq"] in {e["seq"] for e in _tape(cli, iid, store, "--activity", "exit_join")}
    interview = _tape(cli, iid, store, "--activity", "hr_exit_interview")
    assert any(e.get("data", {}).get("note") == "user_input" for e in interview)
    instance = Engine(store).load(iid)
    assert LayeredContext.replay(instance.main.tape) == instance.main


def test_the_deadline_passes_and_the_equipment_is_charged(tmp_path: Path) -> None:
    """The timer branch of the event gateway: one hour on the engine's clock; the message that comes
    after is refused, naming the timer."""
    clock = Clock(float(int(time.time())))
    engine = Engine(_store(tmp_path), clock=clock)
    waiting = engine.run(load_process([OFFBOARD, ACCESS]), LEAVER)
    assert waiting.status == "waiting"
    clock.now += 3599
    assert engine.run(engine.load(waiting.id)).status == "waiting"
    assert data_of(dict(engine.load(waiting.id).main.layer(Layer.HISTORY))) == OFFBOARD_AT_GATEWAY
    clock.now += 1
    charged = engine.run(engine.load(waiting.id))
    assert charged.status == "waiting", charged.error
    history = dict(charged.main.layer(Layer.HISTORY))
    assert (history["equipment_status"], history["equipment_charge"], history["payout"]) == ("charged", 1200, 4800)
    assert "activity:record_return" not in history
    [wait] = charged.waiting_for
    assert wait["task_id"] == "hr_exit_interview"
    with pytest.raises(Exception) as refused:
        engine.send_event(engine.load(waiting.id), "equipment_returned", RETURNED)
    assert "equipment_returned" in str(refused.value) or "return_deadline" in str(refused.value)


def test_a_manager_without_options_in_python(tmp_path: Path) -> None:
    engine = Engine(_store(tmp_path))
    data = {**LEAVER, "has_stock_options": False, "is_manager": True}
    waiting = engine.run(load_process([OFFBOARD, ACCESS]), data)
    done = engine.send_event(waiting, "equipment_returned", RETURNED)
    done = engine.resume(done.id, answers={"user_tasks": {"hr_exit_interview": {"would_return": False}}})
    assert done.status == "completed", done.error
    history = data_of(dict(done.main.layer(Layer.HISTORY)))
    assert (history["last_pay_date"], history["payout"], history["case_status"]) == ("2026-12-31", 4200,
                                                                                     "closed:no_rehire")
    assert history["closed_items"] == ["exit_form", "payroll", "reports"]
    assert history["exit_notes"] == ["final salary booked", "reports moved to Tom Berg"]
    assert done.to_document()["conflicts"] == [] or all(
        c["key"] != "last_pay_date" for c in done.to_document()["conflicts"])


# ------------------------------------------------------------------ subrogation: nested joins, three resolvers


RECOVERY_ASKED = {"investigate_join/fault_share", "investigate_join/recovery_route"}


def _damages_history(history: dict[str, Any]) -> dict[str, Any]:
    return {k: history[k] for k in ("recoverable_amount", "estimate_days", "damage_items")}


def test_the_outer_join_asks_a_person_twice_after_the_policy_settled_the_inner_join(cli: Any, tmp_path: Path) -> None:
    store = _store(tmp_path)
    doc = run_json(cli, "run", str(SUBRO), "--data", json.dumps(CLAIM), "--store", store, code=3)
    _check_document(doc, 3, "subrogation_recovery")
    assert doc["layers"]["L1"] == CLAIM
    assert data_of(doc["layers"]["L3"]) == {"liability_basis": "rear-end collision"}   # the join has merged nothing yet
    by_key = {c["key"]: c for c in doc["conflicts"]}
    assert set(by_key) == {"recoverable_amount", "fault_share", "recovery_route"}, doc["conflicts"]
    amount = by_key["recoverable_amount"]
    assert (amount["gateway_id"], amount["values"], amount["resolution"]) == (
        "damages_join", {"repair_estimate": 9800, "rental_costs": 10450},
        {"value": 10450, "resolver": "policy", "reason": "claim the full documented loss, rental included"})
    assert (by_key["fault_share"]["gateway_id"], by_key["fault_share"]["values"], by_key["fault_share"]["resolution"]) == (
        "investigate_join", {"fault_analysis": 0.8, "damages_split": 0.6}, None)
    assert by_key["recovery_route"]["values"] == {"fault_analysis": "direct_demand", "damages_split": "arbitration"}
    assert by_key["fault_share"]["base_value"] is None and by_key["fault_share"]["layer"] == "L4"
    asked = {c["id"]: c for c in doc["confirmations"]}
    assert set(asked) == RECOVERY_ASKED
    assert {o["value"] for o in asked["investigate_join/fault_share"]["options"]} == {0.8, 0.6, 0.5, "$escalate"}
    assert {o["value"] for o in asked["investigate_join/recovery_route"]["options"]} == {
        "direct_demand", "arbitration", "$escalate"}
    assert all(c["answer"] is None and c["timed_out"] is False for c in asked.values())
    assert all(c["type"] == "conflict_resolution" and "investigate_join" in c["message"] for c in asked.values())
    assert (asked["investigate_join/fault_share"]["default"], asked["investigate_join/recovery_route"]["default"]) == (
        0.5, "arbitration")                          # humanConfirm.defaults per key, else the join's default
    assert {(w["kind"], w["id"], w["task_id"]) for w in doc["waiting_for"]} == {
        ("confirmation", cid, "investigate_join") for cid in RECOVERY_ASKED}
    assert all(w["due"] for w in doc["waiting_for"])
    iid = doc["instance_id"]

    # one answer at a time: the share by --answer (a number), then the route by --answers
    doc = run_json(cli, "resume", iid, "--answer", "investigate_join/fault_share=0.6", "--store", store, code=3)
    assert [w["id"] for w in doc["waiting_for"]] == ["investigate_join/recovery_route"]
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {"investigate_join/recovery_route": "direct_demand"}}))
    doc = run_json(cli, "resume", iid, "--answers", str(answers), "--store", store, code=3)
    history = doc["layers"]["L3"]
    assert _damages_history(history) == {"recoverable_amount": 10450, "estimate_days": 5,
                                         "damage_items": ["bumper", "tailgate", "rental car"]}
    assert (history["fault_share"], history["recovery_route"], history["demand_amount"]) == (0.6, "direct_demand", 6270)
    logged = {c["key"]: c for c in history["_mergedConflicts"]}
    assert logged["fault_share"]["resolution"]["resolver"] == "human"
    assert logged["recoverable_amount"]["resolution"]["resolver"] == "policy"
    assert {(w["kind"], w["task_id"]) for w in doc["waiting_for"]} == {("user_task", "carrier_response"),
                                                                        ("timer", "reminder_timer")}
    doc = run_json(cli, "resume", iid, "--answer", 'carrier_response={"response": "paid", "amount_paid": 6270}',
                   "--store", store)
    assert doc["layers"]["L3"]["file_status"] == "closed:recovered" and doc["layers"]["L3"]["recovered"] == 6270
    assert "reminder_sent" not in doc["layers"]["L3"]
    for seq in (5, 20, doc["tape_length"] // 2):
        first = cli("replay", iid, "--until", str(seq), "--store", store, "--json")
        again = cli("replay", iid, "--until", str(seq), "--store", store, "--json")
        assert first.exit_code == 0 and first.stdout == again.stdout
    whole = json.loads(cli("replay", iid, "--store", store, "--json").stdout)
    assert whole["layers"] == doc["layers"]
    assert_replays(doc, store)


@pytest.mark.parametrize("response, status, ran", [
    ({"response": "insolvent"}, "written_off", "write_off"),
    ({"response": "disputed"}, "referred_to_counsel", "legal_referral")])
def test_the_other_insurer_is_insolvent_or_disputes(cli: Any, tmp_path: Path, response: dict[str, Any], status: str,
                                                     ran: str) -> None:
    answers = {"confirmations": {"investigate_join/fault_share": 0.8, "investigate_join/recovery_route": "arbitration"},
               "user_tasks": {"carrier_response": response}}
    doc = run_json(cli, "run", str(SUBRO), "--data", json.dumps(CLAIM), "--answers", json.dumps(answers),
                   "--store", _store(tmp_path))
    _check_document(doc, 0, "subrogation_recovery")
    history = doc["layers"]["L3"]
    assert history["recovery_status"] == status and f"activity:{ran}" in history
    assert "file_status" not in history and "activity:book_recovery" not in history
    assert history["demand_amount"] == 8360


def test_the_reminder_goes_out_after_half_an_hour_and_the_claim_still_waits(tmp_path: Path) -> None:
    clock = Clock(float(int(time.time())))
    engine = Engine(_store(tmp_path), clock=clock)
    answers = {"confirmations": {"investigate_join/fault_share": 0.6, "investigate_join/recovery_route": "arbitration"}}
    waiting = engine.run(load_process(SUBRO), CLAIM)
    waiting = engine.resume(waiting.id, answers=answers)
    assert {w["task_id"] for w in waiting.waiting_for} == {"carrier_response", "reminder_timer"}
    clock.now += 1800
    reminded = engine.run(engine.load(waiting.id))
    assert reminded.status == "waiting", reminded.error
    assert [w["task_id"] for w in reminded.waiting_for] == ["carrier_response"]
    # README (written for this round): the reminder's path ended at an end event of its own; it is a
    # side context until the process ends
    [side] = [c for c in reminded.to_document()["contexts"].values() if c["status"] == "side"]
    assert side["branch_id"] == "reminder_timer"
    assert "reminder_sent" not in reminded.main.layer(Layer.HISTORY)
    done = engine.resume(waiting.id, answers={"user_tasks": {"carrier_response": {"response": "paid", "amount_paid": 10}}})
    assert done.status == "completed", done.error
    history = dict(done.main.layer(Layer.HISTORY))
    assert history["reminder_sent"] is True and history["file_status"] == "closed:recovered"
    assert LayeredContext.replay(done.main.tape) == done.main


def test_the_route_times_out_to_its_default_after_the_share_was_answered_through_rest(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    clock = Clock(float(int(time.time())))
    engine = Engine(_store(tmp_path), clock=clock)
    client = TestClient(create_app(engine, HERE, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    started = client.post("/api/instances", json={"process_id": "subrogation_recovery", "data": CLAIM})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    answered = client.post("/api/confirmations/investigate_join%2Ffault_share", json={"value": 0.8, "instance_id": iid})
    assert answered.status_code == 200, answered.text
    assert [w["id"] for w in answered.json()["waiting_for"]] == ["investigate_join/recovery_route"]
    clock.now += 600
    timed_out = engine.run(engine.load(iid))
    doc = timed_out.to_document()
    asked = {c["id"]: c for c in doc["confirmations"]}
    assert (asked["investigate_join/fault_share"]["answer"], asked["investigate_join/fault_share"]["timed_out"]) == (
        0.8, False)
    assert (asked["investigate_join/recovery_route"]["answer"],
            asked["investigate_join/recovery_route"]["timed_out"]) == ("arbitration", True)
    history = doc["layers"]["L3"]
    assert (history["fault_share"], history["recovery_route"], history["demand_amount"]) == (0.8, "arbitration", 8360)
    late = client.post("/api/confirmations/investigate_join%2Frecovery_route",
                       json={"value": "direct_demand", "instance_id": iid})
    assert late.status_code == 409, late.text


def _arbiter(request: dict[str, Any]) -> str:
    text = "\n".join(str(m.get("content")) for m in request["messages"])
    if "recovery_route" in text and "fault_share" not in text:
        return json.dumps({"final_value": "direct_demand", "rationale": "not sure", "escalate": True})
    return json.dumps({"final_value": 0.7, "rationale": "the damages photos show a shared fault", "escalate": False})


def test_a_model_settles_the_share_and_escalates_the_route_to_a_person(fake_model: Any, tmp_path: Path) -> None:
    model = fake_model(_arbiter)
    engine = Engine(_store(tmp_path), model="fake/model")
    waiting = engine.run(load_process(SUBRO), CLAIM)
    doc = waiting.to_document()
    by_key = {c["key"]: c for c in doc["conflicts"]}
    assert (by_key["fault_share"]["resolution"]["value"], by_key["fault_share"]["resolution"]["resolver"]) == (
        0.7, "model")
    assert by_key["recoverable_amount"]["resolution"]["resolver"] == "policy"     # the policy before the model
    assert by_key["recovery_route"]["resolution"] is None
    assert [w["id"] for w in doc["waiting_for"]] == ["investigate_join/recovery_route"]
    assert model.requests
    done = engine.resume(waiting.id, answers={"confirmations": {"investigate_join/recovery_route": "direct_demand"}})
    history = dict(done.main.layer(Layer.HISTORY))
    assert (history["fault_share"], history["demand_amount"]) == (0.7, 7315)


# ------------------------------------------------------------------ patent: compression, knowledge, rollback, replay


def test_the_search_results_are_compressed_after_the_analysis_and_rolled_back(cli: Any, tmp_path: Path) -> None:
    store = _store(tmp_path)
    doc = run_json(cli, "run", str(PATENT), "--data", json.dumps(APPLICATION), "--store", store, code=3)
    _check_document(doc, 3, "patent_prior_art")
    [compression] = doc["compressions"]
    assert compression["activity_id"] == "analyze_novelty" and "token_threshold" in compression["triggers"]
    assert compression["tokens_after"] < compression["tokens_before"] and compression["snapshot_id"]
    history = doc["layers"]["L3"]
    # README: the paths kept at their place, marked `"_compressed": "extract_keys"` (so a decompress finds them)
    assert history["tool_call_result_1"] == {"status": "ok", "data": {"id": "US-1001"}, "_compressed": "extract_keys"}
    assert history["tool_call_result_3"] == {"status": "empty", "data": {"id": "WO-3003"}, "_compressed": "extract_keys"}
    assert [k for k in history if k.startswith("retry_log")] == ["retry_log_4", "retry_log_5"]
    assert history["retry_log_5"].startswith("attempt 5:")
    [counter] = [v for v in history.values() if isinstance(v, dict) and v.get("_compressed") == "count_only"]
    assert (counter["count"], counter["kept"]) == (5, ["retry_log_4", "retry_log_5"])
    chain = history["reasoning_chain"]
    assert 0 < count_text(chain["summary"] if isinstance(chain, dict) else chain) <= 40
    assert (history["novelty_score"], history["closest_art"], history["cited"]) == (0.72, "US-1001",
                                                                                    ["US-1001", "EP-2002"])
    assert history["claim_text"].startswith("A foldable solar panel mount")
    hits = doc["layers"]["L2"]
    assert hits and all(k.startswith("kb:") for k in hits)
    assert all("source" in v and "confidence" in v for v in hits.values())
    assert any("novelty.md" in str(v["source"]) for v in hits.values())
    [wait] = doc["waiting_for"]
    assert (wait["kind"], wait["task_id"]) == ("user_task", "examiner_review")
    iid = doc["instance_id"]
    [compressed] = _tape(cli, iid, store, "--kind", "compression")
    assert any(e.get("data", {}).get("note") == "retrieval" for e in _tape(cli, iid, store, "--activity",
                                                                           "analyze_novelty"))
    # the context before the compression, at the compression's seq, and now
    before = json.loads(cli("replay", iid, "--until", str(compressed["seq"] - 1), "--store", store, "--json").stdout)
    assert before["layers"]["L3"]["tool_call_result_1"]["raw"].startswith("The cited document")
    assert "retry_log_1" in before["layers"]["L3"]
    for seq in (1, compressed["seq"] - 1, compressed["seq"], doc["tape_length"]):
        one = cli("replay", iid, "--until", str(seq), "--store", store, "--json").stdout
        assert one == cli("replay", iid, "--until", str(seq), "--store", store, "--json").stdout
    # rollback of HISTORY to the compression's snapshot: the raw results are back, the tape grew
    rolled = cli("rollback", iid, compression["snapshot_id"], "--layers", "L3", "--store", store)
    assert rolled.exit_code == 0, rolled.stderr
    seen = run_json(cli, "inspect", iid, "--store", store)
    assert seen["tape_length"] > doc["tape_length"]
    assert seen["layers"]["L3"]["tool_call_result_1"]["raw"].startswith("The cited document")
    assert "retry_log_1" in seen["layers"]["L3"]
    assert len(_tape(cli, iid, store, "--kind", "rollback")) == 1
    replayed = json.loads(cli("replay", iid, "--store", store, "--json").stdout)
    assert replayed["layers"] == seen["layers"]
    doc = run_json(cli, "resume", iid, "--answer", 'examiner_review={"decision": "file"}', "--store", store)
    assert doc["layers"]["L3"]["filing_status"] == "filed:US-1001"
    assert_replays(doc, store)
    plain = cli("inspect", iid, "--store", store, "--layer", "L3")
    assert plain.exit_code == 0 and "filing_status" in plain.stdout


def test_rest_replay_matches_the_cli(cli: Any, tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    store = _store(tmp_path)
    doc = run_json(cli, "run", str(PATENT), "--data", json.dumps(APPLICATION), "--store", store, code=3)
    iid = doc["instance_id"]
    client = TestClient(create_app(Engine(store), HERE, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    seq = doc["tape_length"] - 2
    rest = client.get(f"/api/instances/{iid}/replay", params={"context": "main", "until": seq})
    assert rest.status_code == 200, rest.text
    cli_doc = json.loads(cli("replay", iid, "--until", str(seq), "--store", store, "--json").stdout)
    rest_layers = {layer["name"] if "name" in layer else name: {k["key"]: k["value"] for k in layer["keys"]}
                   for name, layer in (rest.json()["layers"].items() if isinstance(rest.json()["layers"], dict)
                                       else enumerate(rest.json()["layers"]))}
    assert sorted(map(json.dumps, rest_layers.values())) == sorted(map(json.dumps, cli_doc["layers"].values()))
    assert client.get(f"/api/instances/{iid}/replay", params={"until": seq}).status_code == 200
    assert TestClient(create_app(Engine(store), HERE, TOKEN)).get(f"/api/instances/{iid}").status_code == 401


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("edit, named", [
    (("exit_join:\n  mergeStrategy: BRANCH_PRIORITY", "exit_join:\n  mergeStrategy: BRANCH_PRIORTY"),
     ("employee_offboarding.layerflow.yaml", "exit_join", "mergeStrategy")),
    (("payout: sum", "payout: average"), ("employee_offboarding.layerflow.yaml", "exit_join", "reducers"))])
def test_a_broken_config_is_bad_input_naming_file_element_and_field(cli: Any, tmp_path: Path,
                                                                     edit: tuple[str, str], named: tuple[str, ...]) -> None:
    for name in ("employee_offboarding.bpmn", "access_revocation.bpmn", "access_revocation.layerflow.yaml",
                 "offboarding_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    (tmp_path / "employee_offboarding.layerflow.yaml").write_text(
        (HERE / "employee_offboarding.layerflow.yaml").read_text().replace(*edit))
    db = tmp_path / "bad.db"
    result = cli("run", str(tmp_path / "employee_offboarding.bpmn"), str(tmp_path / "access_revocation.bpmn"),
                 "--data", json.dumps(LEAVER), "--store", f"sqlite:///{db}", "--json")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    text = result.stdout + result.stderr
    assert all(n in text for n in named), text
    assert _nothing_saved(cli, db)


def test_a_broken_called_config_names_its_own_file(cli: Any, tmp_path: Path) -> None:
    for name in ("employee_offboarding.bpmn", "employee_offboarding.layerflow.yaml", "access_revocation.bpmn",
                 "offboarding_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    (tmp_path / "access_revocation.layerflow.yaml").write_text(
        "disable_accounts:\n  handler: offboarding_handlers.py:disable_accounts\n  preserveKeys: revoked_systems\n"
        "  compressTokenThreshold: lots\n")
    db = tmp_path / "bad.db"
    result = cli("run", str(tmp_path / "employee_offboarding.bpmn"), str(tmp_path / "access_revocation.bpmn"),
                 "--data", json.dumps(LEAVER), "--store", f"sqlite:///{db}", "--json")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    text = result.stdout + result.stderr
    assert "access_revocation.layerflow.yaml" in text and "disable_accounts" in text
    assert "compressTokenThreshold" in text
    assert _nothing_saved(cli, db)


def test_a_broken_bpmn_is_bad_input_naming_the_element(cli: Any, tmp_path: Path) -> None:
    text = SUBRO.read_text().replace('<bpmn:sequenceFlow id="Flow_13" sourceRef="pursue_recovery" targetRef="close_file" />',
                                     '<bpmn:sequenceFlow id="Flow_13" sourceRef="pursue_recovery" targetRef="close_fiel" />')
    (tmp_path / "subrogation_recovery.bpmn").write_text(text)
    db = tmp_path / "bad.db"
    result = cli("run", str(tmp_path / "subrogation_recovery.bpmn"), "--data", json.dumps(CLAIM),
                 "--store", f"sqlite:///{db}", "--json")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    out = result.stdout + result.stderr
    assert "subrogation_recovery.bpmn" in out and ("Flow_13" in out or "close_fiel" in out), out
    assert _nothing_saved(cli, db)
    checked = cli("validate", str(tmp_path / "subrogation_recovery.bpmn"))
    assert checked.exit_code == 2 and "close_fiel" in checked.stdout + checked.stderr


# ------------------------------------------------------------------ two workers and a server on Redis


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_API_TOKEN": TOKEN}
    env.pop("LAYERFLOW_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture()
def redis_store() -> Iterator[tuple[str, str]]:
    with redis_scratch(REDIS, "os17") as prefix:
        yield f"{REDIS}?prefix={prefix}", f"{prefix}:ready"


def test_two_workers_run_offboardings_while_hr_answers_through_rest(cli: Any, redis_store: tuple[str, str],
                                                                    tmp_path: Path) -> None:
    """E-1 returns the equipment (a message through REST); E-2's deadline (two seconds, in a copy of the
    process) passes and a worker's timer scan fires it; HR answers both through REST."""
    store, stream = redis_store
    files = {"E-1": [str(OFFBOARD), str(ACCESS)], "E-2": _offboarding_copy(tmp_path)}
    fast = Path(files["E-2"][0])
    fast.write_text(fast.read_text().replace('"PT1H"', '"PT2S"'))
    leavers = {"E-1": {**LEAVER, "employee_id": "E-1"}, "E-2": {**LEAVER, "employee_id": "E-2", "is_manager": True}}
    procs: list[subprocess.Popen[str]] = []
    try:
        port = _free_port()
        procs.append(_spawn("serve", "--host", "127.0.0.1", "--port", str(port), "--catalog", str(HERE),
                            "--store", store))
        url = _served_url(procs[0])
        assert url.endswith(f":{port}")
        for name in ("a", "b"):
            procs.append(_spawn("worker", "--store", store, "--stream", stream, "--consumer", f"os17-{name}",
                                "--timer-interval", "1"))
        ids = {}
        for who, data in leavers.items():
            result = cli("submit", *files[who], "--data", json.dumps(data), "--store", store,
                         "--stream", stream, "--json")
            assert result.exit_code == 0, (result.stdout, result.stderr)
            [ids[who]] = json.loads(result.stdout)["instance_ids"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as api:
            for who, iid in ids.items():
                doc = _until(api, iid, lambda d: d["status"] == "waiting", "waited", procs)
                _check_document(doc, 3, "employee_offboarding")
                assert data_of(doc["layers"]["L3"])["access_ticket"] == f"ACC-{who}"
                if who == "E-1":
                    sent = api.post(f"/api/instances/{iid}/events", json={"name": "equipment_returned",
                                                                          "payload": RETURNED})
                    assert sent.status_code == 200, sent.text
                    [wait] = sent.json()["waiting_for"]
                else:
                    fired = _until(api, iid, lambda d: [w["task_id"] for w in d["waiting_for"]] == ["hr_exit_interview"],
                                   "fired its deadline", procs)
                    assert fired["layers"]["L3"]["equipment_status"] == "charged"
                    [wait] = fired["waiting_for"]
                assert wait["task_id"] == "hr_exit_interview"
                done = api.post(f"/api/instances/{iid}/user-tasks/hr_exit_interview", json={"data": {"would_return": True}})
                assert done.status_code == 200, done.text
                assert done.json()["status"] == "completed"
            unauthorised = local_http.get(f"{url}/api/instances/{ids['E-1']}")
            assert unauthorised.status_code == 401
    finally:
        stop_all(procs)
    for who, iid in ids.items():
        seen = run_json(cli, "inspect", iid, "--store", store)
        assert seen["status"] == "completed"
        history = seen["layers"]["L3"]
        assert history["case_status"] == "closed:rehire"
        assert (history["equipment_status"], history["payout"]) == (("returned_good", 6000) if who == "E-1" else
                                                                    ("charged", 4800))
        assert history["exit_notes"] == (["final salary booked", "vested options bought back"] if who == "E-1" else
                                         ["final salary booked", "vested options bought back", "reports moved to Tom Berg"])
        ran = [e["activity"] for e in _tape(cli, iid, store) if e["kind"] == "begin"]   # every context's
        assert ran.count("record_exit") == 1 and ran.count("final_payroll") == 1     # every step ran once
        assert ran.count("reassign_reports") == (who == "E-2")


def test_rest_starts_a_catalog_process_that_calls_another_catalog_process(tmp_path: Path) -> None:
    """The catalog lists employee_offboarding; starting it needs access_revocation.bpmn, which the
    catalog holds too (and its config file, whose handler the called service task runs)."""
    from fastapi.testclient import TestClient

    from engine.api import create_app

    client = TestClient(create_app(Engine(_store(tmp_path)), HERE, TOKEN), headers={"Authorization": f"Bearer {TOKEN}"})
    assert "employee_offboarding" in {p["id"] for p in client.get("/api/processes").json()}
    started = client.post("/api/instances", json={"process_id": "employee_offboarding", "data": LEAVER})
    assert started.status_code == 201, started.text
    doc = started.json()
    _check_document(doc, 3, "employee_offboarding")
    assert data_of(doc["layers"]["L3"]) == OFFBOARD_AT_GATEWAY


def test_a_called_process_in_another_folder_finds_its_handler_beside_it(cli: Any, tmp_path: Path) -> None:
    """`handler: file.py:function` is relative to the folder of the BPMN its config file is beside."""
    (tmp_path / "called").mkdir()
    for name in ("employee_offboarding.bpmn", "employee_offboarding.layerflow.yaml"):
        (tmp_path / name).write_text((HERE / name).read_text())
    for name in ("access_revocation.bpmn", "access_revocation.layerflow.yaml", "offboarding_handlers.py"):
        (tmp_path / "called" / name).write_text((HERE / name).read_text())
    files = [str(tmp_path / "employee_offboarding.bpmn"), str(tmp_path / "called" / "access_revocation.bpmn")]
    assert cli("validate", *files).exit_code == 0
    doc = run_json(cli, "run", *files, "--data", json.dumps(LEAVER), "--store", _store(tmp_path), code=3)
    assert data_of(doc["layers"]["L3"]) == OFFBOARD_AT_GATEWAY


def test_a_message_after_the_deadline_came_due_is_refused_naming_the_timer(tmp_path: Path) -> None:
    """README: a message that comes after the timer it races with came due is refused, naming the
    timer, after the timer's path ran."""
    from engine.governance import InstanceStateError

    clock = Clock(float(int(time.time())))
    engine = Engine(_store(tmp_path), clock=clock)
    waiting = engine.run(load_process([OFFBOARD, ACCESS]), LEAVER)
    clock.now += 3601
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(engine.load(waiting.id), "equipment_returned", RETURNED)
    assert "return_deadline" in str(refused.value)
    after = engine.load(waiting.id)
    history = dict(after.main.layer(Layer.HISTORY))
    assert history["equipment_status"] == "charged" and "event:equipment_returned_event" not in history
    assert [w["task_id"] for w in after.waiting_for] == ["hr_exit_interview"]


def _offboarding_copy(tmp_path: Path) -> list[str]:
    for name in ("employee_offboarding.bpmn", "employee_offboarding.layerflow.yaml", "access_revocation.bpmn",
                 "access_revocation.layerflow.yaml", "offboarding_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    return [str(tmp_path / "employee_offboarding.bpmn"), str(tmp_path / "access_revocation.bpmn")]


def test_resume_names_an_edit_of_the_called_processs_config_file_and_nothing_else(cli: Any, tmp_path: Path) -> None:
    """README: `resume` names each element a config file now configures otherwise; the called
    process's file is one of the process's config files."""
    files, store = _offboarding_copy(tmp_path), _store(tmp_path)
    iid = run_json(cli, "run", *files, "--data", json.dumps(LEAVER), "--store", store, code=3)["instance_id"]
    unchanged = cli("resume", iid, "--store", store)
    assert unchanged.exit_code == 3 and "changed since" not in unchanged.stderr, unchanged.stderr
    called = tmp_path / "access_revocation.layerflow.yaml"
    called.write_text(called.read_text().replace("[revoked_systems]", "[revoked_systems, access_ticket]"))
    edited = cli("resume", iid, "--store", store)
    assert edited.exit_code == 3
    [notice] = [line for line in edited.stderr.splitlines() if "changed since" in line]
    assert str(called) in notice and "'disable_accounts'" in notice and "preserveKeys" in notice


def test_a_join_of_the_called_process_asks_as_its_own_config_says(cli: Any, tmp_path: Path) -> None:
    """A called process's join settings come from the file beside it; `GATEWAY/KEY` answers reach it."""
    files = _offboarding_copy(tmp_path)
    called = tmp_path / "access_revocation.bpmn"
    called.write_text(called.read_text().replace(
        '<bpmn:script>badge_status = "revoked:" + employee_id</bpmn:script>',
        '<bpmn:script>badge_status = "revoked:" + employee_id</bpmn:script>').replace(
        '<bpmn:sequenceFlow id="Flow_a2" sourceRef="disable_accounts" targetRef="revoke_badge" />',
        '<bpmn:sequenceFlow id="Flow_a2" sourceRef="disable_accounts" targetRef="access_split" />'
        '<bpmn:parallelGateway id="access_split" /><bpmn:parallelGateway id="access_join" />'
        '<bpmn:scriptTask id="it_check"><bpmn:script>access_level = "none"</bpmn:script></bpmn:scriptTask>'
        '<bpmn:scriptTask id="security_check"><bpmn:script>access_level = "read_only"</bpmn:script></bpmn:scriptTask>'
        '<bpmn:sequenceFlow id="Flow_b1" sourceRef="access_split" targetRef="it_check" />'
        '<bpmn:sequenceFlow id="Flow_b2" sourceRef="access_split" targetRef="security_check" />'
        '<bpmn:sequenceFlow id="Flow_b3" sourceRef="it_check" targetRef="access_join" />'
        '<bpmn:sequenceFlow id="Flow_b4" sourceRef="security_check" targetRef="access_join" />'
        '<bpmn:sequenceFlow id="Flow_b5" sourceRef="access_join" targetRef="revoke_badge" />'))
    (tmp_path / "access_revocation.layerflow.yaml").write_text(
        (HERE / "access_revocation.layerflow.yaml").read_text() + "access_join:\n  humanConfirm: {timeout: 60, default: none}\n")
    assert cli("validate", *files).exit_code == 0
    store = _store(tmp_path)
    doc = run_json(cli, "run", *files, "--data", json.dumps(LEAVER), "--store", store, code=3)
    [asked] = doc["confirmations"]
    assert (asked["id"], asked["default"]) == ("access_join/access_level", "none")
    assert [o["value"] for o in asked["options"]] == ["none", "read_only", "$escalate"]
    [wait] = doc["waiting_for"]
    assert (wait["kind"], wait["task_id"]) == ("confirmation", "access_join") and wait["due"]
    doc = run_json(cli, "resume", doc["instance_id"], "--answer", "access_join/access_level=read_only", "--store", store,
                   code=3)
    assert doc["layers"]["L3"]["access_level"] == "read_only"
    assert {w["task_id"] for w in doc["waiting_for"]} == {"await_equipment", "return_deadline"}


def test_the_cli_with_a_model_through_litellm_settles_the_share_and_asks_about_the_route(
        cli: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--model` through litellm's real HTTP client against the local stub server: the model settles
    `fault_share` (resolver `model`), escalates `recovery_route` to a person (exit 3)."""
    from stub_llm import Reply, StubLLM

    with StubLLM() as stub:
        stub.push(Reply.json({"final_value": 0.7, "rationale": "shared fault on the photos", "escalate": False}),
                  Reply.json({"final_value": "arbitration", "rationale": "unsure", "escalate": True}))
        monkeypatch.setenv("LAYERFLOW_MODEL_API_BASE", stub.url)
        monkeypatch.setenv("LAYERFLOW_MODEL_API_KEY", "test")
        doc = run_json(cli, "run", str(SUBRO), "--data", json.dumps(CLAIM), "--model", "openai/stub",
                       "--store", _store(tmp_path), code=3)
        asked = [json.dumps(r["messages"]) for r in stub.requests]
    assert len(asked) == 2 and "fault_share" in asked[0] and "recovery_route" in asked[1]
    by_key = {c["key"]: c for c in doc["conflicts"]}
    assert by_key["fault_share"]["resolution"] == {"value": 0.7, "resolver": "model",
                                                   "reason": by_key["fault_share"]["resolution"]["reason"]}
    assert "shared fault on the photos" in by_key["fault_share"]["resolution"]["reason"]
    assert by_key["recovery_route"]["resolution"] is None
    assert [w["id"] for w in doc["waiting_for"]] == ["investigate_join/recovery_route"]
    assert doc["model_fallbacks"] == []


def test_validate_warns_that_a_called_files_system_section_is_not_read(cli: Any, tmp_path: Path) -> None:
    files = _offboarding_copy(tmp_path)
    called = tmp_path / "access_revocation.layerflow.yaml"
    called.write_text("system:\n  policy: revoke everything\n" + called.read_text())
    checked = cli("validate", *files)
    assert checked.exit_code == 0, checked.stdout + checked.stderr
    out = checked.stdout + checked.stderr
    assert "called_config_section_ignored" in out or "is not read" in out, out
    assert "access_revocation.layerflow.yaml" in out
    doc = run_json(cli, "run", *files, "--data", json.dumps(LEAVER), "--store", _store(tmp_path), code=3)
    assert doc["layers"]["L0"]["policy"].startswith("Company equipment")


def test_the_files_given_called_first_run_the_process_with_its_own_config(cli: Any, tmp_path: Path) -> None:
    """`run called.bpmn main.bpmn` runs the process no other calls (README), so its config file is the
    one beside its BPMN: SYSTEM from it, and no warning that it were a called process's."""
    files = list(reversed(_offboarding_copy(tmp_path)))
    checked = cli("validate", *files)
    assert checked.exit_code == 0 and "warning" not in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    doc = run_json(cli, "run", *files, "--data", json.dumps(LEAVER), "--store", _store(tmp_path), code=3)
    assert doc["process_id"] == "employee_offboarding"
    assert doc["layers"]["L0"]["policy"].startswith("Company equipment")
    assert data_of(doc["layers"]["L3"]) == OFFBOARD_AT_GATEWAY
