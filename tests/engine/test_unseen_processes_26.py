"""Outsider round 26: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen26/), driven through the Python API, the CLI and a real server on Redis.

sae_review (bpmn.io file with Flowable form properties): a clinical trial's serious adverse event.
  A start form (`flowable:formProperty`: an enum, a `datePattern` date); `open_case` preserves the
  case id; a parallel split whose branches get `reviewer_role` by contextInject: the investigator's
  `medical_review` (a user task with a Flowable form and a non-interrupting boundary cycle timer,
  `"R2/PT12H"`, that reminds the investigator) and the safety physician's `safety_assessment` (a model
  activity run by its offline handler) that, for a severe event, throws the escalation SAE_SEVERE caught
  by a non-interrupting escalation event sub-process (`dsmb_notice`) while the other branch still waits;
  the join reconciles `reportable` through a person (`humanConfirm` with a per-key `defaults:
  {reportable: true}`) and unions `signal_terms`; an expedited report (a send task whose message
  nothing in the instance catches: `messages_out`) waits for the regulator's acknowledgement; a
  non-interrupting signal event sub-process records an emergency unblinding at any time.

vendor_tender (bpmn.io / SpiffArena): a parallel multi-instance sub-process collects one bid per
  vendor; inside each instance a price check and a capacity check run in parallel and a join asks the
  buyer when they disagree on `bid_ok` (humanConfirm, default false); a vendor on the sanctions list
  makes its instance raise `engine.BpmnError` VENDOR_SANCTIONED, caught by an error boundary event of
  the multi-instance sub-process; a boundary timer closes the bid window after seven days; the
  evaluation writes one near-duplicate tool result per bid and compresses by its attention scores
  (extract_keys); legal and finance approve the award in parallel (BRANCH_PRIORITY, reducers
  `append` and `min`).

mel_deferral (bpmn.io): an airline defers a defect under its minimum equipment list. An inclusive split
  (engineering, safety, operations by default) whose engineering branch waits at an event-based gateway
  for the parts message or a 48-hour deadline; the inclusive join is FAIL_ON_CONFLICT; the captain's
  acceptance (a user task) has a conditional boundary event on `aircraft_grounded`, which the operations
  desk sets with `resume --set` (a WORKING key by `data_layers`); a message-count cliff after it.

Expected before anything ran: as README says for each; in particular, an interrupting event that
cancels a sub-process (an error caught at the multi-instance activity, its deadline timer) closes the
confirmations its joins waited for: the instance no longer waits for them, their conflicts keep
`"resolution": null` and add `"cancelled": true`, as README says of a join an interrupting event
sub-process cancelled.

Found: the boundary events did not: the cancelled join's confirmation stayed open (listed in
`waiting_for` beside the compliance task, taken as an answer later, unanswered in a completed
instance) and its branches stayed `open`; nor did a terminate end event for a join nested in the
branch it cancelled. Documentation gaps (README now says): a `#` in a confirmation id must be written
`%23` in a URL (curl cuts `#2` off, and `POST /api/confirmations/bid_join/bid_ok#2` answered the
first question); DESIGN's default attention thresholds fire at any size when no
`compressTokenThreshold` is set; a branch's `contextInject` keys are gone after the join.
Misread at first (the engine is right, README says so): an answer to a cancelled confirmation is no
bad input (a script gives every resume the same answers); the CLI now says it was cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from engine import Engine, load_process

from engine_helpers import (cli_in_a_tmp_store, flow, redis_scratch, run_json, script_task, wait_until_served,
                            write_elements)
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen26"
SAE, TENDER = HERE / "sae_review.bpmn", HERE / "vendor_tender.bpmn"
VENDORS = [{"name": "Acme", "price": 42000, "lead_days": 20}, {"name": "Borealis", "price": 39000, "lead_days": 45},
           {"name": "Cobalt", "price": 47000, "lead_days": 10}]
TENDER_DATA = {"tender_no": 77, "vendors": VENDORS}
T0 = 1_800_000_000.0
ROOT = Path(__file__).resolve().parents[2]
REDIS_DB8 = "redis://127.0.0.1:6379/8"   # this round's database on the shared Redis
TOKEN = "outsider-26"


class Clock:
    """The engine's clock (``Engine(clock=...)``), moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _confirmation(doc: dict[str, Any], cid: str) -> dict[str, Any]:
    [found] = [c for c in doc["confirmations"] if c["id"] == cid]
    return found


# ===== the tender: an interrupt of the multi-instance sub-process closes what its joins asked ======

def test_a_sanctioned_vendor_cancels_the_bidding_and_the_question_another_bid_asked(cli: Any) -> None:
    """Cobalt's instance throws VENDOR_SANCTIONED while Borealis's join waits for the buyer: the
    boundary event ends the whole multi-instance sub-process, so nobody will answer that question."""
    doc = run_json(cli, "run", str(TENDER), "--data", json.dumps(dict(TENDER_DATA, sanctions_list=["Cobalt"])), code=3)
    check_run_document(doc)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["compliance_review"]
    history = doc["layers"]["L3"]
    assert (history["error_code"], history["vendor"]) == ("VENDOR_SANCTIONED", "Cobalt")
    [conflict] = doc["conflicts"]
    assert (conflict["gateway_id"], conflict["key"], conflict["resolution"]) == ("bid_join", "bid_ok", None)
    assert conflict["cancelled"] is True
    asked = _confirmation(doc, "bid_join/bid_ok")
    assert asked["cancelled"] is True and asked["answer"] is None
    branches = {c["branch_id"]: c["status"] for name, c in doc["contexts"].items() if "collect_bids#2" in name}
    assert branches["price_check"] == branches["capacity_check"] == "cancelled"
    # an answer to it (a script gives every resume the same answers) changes nothing: not bad input
    late = cli("resume", doc["instance_id"], "--answer", "bid_join/bid_ok=false", "--json")
    assert late.exit_code == 3 and "'bid_join/bid_ok'" in late.stderr and "was cancelled" in late.stderr
    late_doc = json.loads(late.stdout)
    assert late_doc["conflicts"] == doc["conflicts"] and _confirmation(late_doc, "bid_join/bid_ok")["answer"] is None
    done = run_json(cli, "resume", doc["instance_id"], "--answer", 'compliance_review={"decision": "void"}', code=0)
    assert done["status"] == "completed" and done["conflicts"][0]["cancelled"] is True


def test_the_bid_window_closing_cancels_the_question_a_bid_asked() -> None:
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process(TENDER), TENDER_DATA))
    assert [w["id"] for w in waiting.waiting_for if w["kind"] == "confirmation"] == ["bid_join/bid_ok"]
    clock.now += 7 * 86400 + 1
    done = engine.resume(waiting.id)
    doc = done.to_document()
    assert doc["status"] == "completed", doc["error"]
    assert done.main.resolve("tender_outcome").startswith("lapsed")
    assert "bids" not in done.main and "awarded_to" not in done.main
    [conflict] = doc["conflicts"]
    assert conflict["resolution"] is None and conflict["cancelled"] is True
    assert _confirmation(doc, "bid_join/bid_ok")["cancelled"] is True



def test_a_terminate_end_event_closes_what_a_join_in_another_branch_asked(tmp_path: Path) -> None:
    """The same for a terminate end event in a parallel branch (README: it drops the other branches):
    the nested join's question is closed and every branch inside the dropped one is cancelled."""
    path = write_elements(tmp_path, "terminated", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="top_split"/>', '<bpmn:parallelGateway id="split"/>',
        script_task("check_a", "ok = True"), script_task("check_b", "ok = False"), '<bpmn:parallelGateway id="join"/>',
        '<bpmn:endEvent id="joined"/>', '<bpmn:userTask id="withdraw"/>',
        '<bpmn:endEvent id="withdrawn"><bpmn:terminateEventDefinition/></bpmn:endEvent>',
        flow("start", "top_split"), flow("top_split", "split"), flow("top_split", "withdraw"), flow("split", "check_a"),
        flow("split", "check_b"), flow("check_a", "join"), flow("check_b", "join"), flow("join", "joined"),
        flow("withdraw", "withdrawn")])
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(path), {}))
    assert [w["id"] for w in waiting.waiting_for if w["kind"] == "confirmation"] == ["join/ok"]
    done = engine.resume(waiting.id, answers={"user_tasks": {"withdraw": {"reason": "withdrawn"}}}).to_document()
    assert done["status"] == "completed"
    assert done["conflicts"][0]["cancelled"] is True and _confirmation(done, "join/ok")["cancelled"] is True
    assert {c["branch_id"]: c["status"] for c in done["contexts"].values()} == {
        "split": "cancelled", "withdraw": "joined", "check_a": "cancelled", "check_b": "cancelled"}

# ===== validate ==================================================================================

def test_validate_accepts_both_and_names_a_config_field_the_schema_lacks(cli: Any, tmp_path: Path) -> None:
    for bpmn in (SAE, TENDER, HERE / "mel_deferral.bpmn"):
        result = cli("validate", str(bpmn))
        assert result.exit_code == 0, result.output
        # The only warning allowed: a payload on the bpmn:message, which SpiffWorkflow 3.2 reads but deprecates.
        warned = [line for line in result.output.splitlines() if ": warning: " in line]
        assert "is valid" in result.output, result.output
        assert all("a place SpiffWorkflow 3.2 still reads but deprecates" in line for line in warned), result.output
    copy = tmp_path / "sae_review.bpmn"
    copy.write_text(SAE.read_text(encoding="utf-8"), encoding="utf-8")
    config = (HERE / "sae_review.layerflow.yaml").read_text(encoding="utf-8")
    (tmp_path / "sae_review.layerflow.yaml").write_text(config.replace("defaults:", "defualts:"), encoding="utf-8")
    (tmp_path / "sae_handlers.py").write_text((HERE / "sae_handlers.py").read_text(encoding="utf-8"), encoding="utf-8")
    result = cli("validate", str(copy))
    assert result.exit_code == 2, result.output
    assert "sae_review.layerflow.yaml" in result.output and "assess_join" in result.output
    assert "defualts" in result.output


# ===== sae_review through the CLI ================================================================

SEVERE = {"subject_id": "1007", "event_term": "Hepatitis", "severity": "severe", "onset_date": "03-12-2026"}
MODERATE = {"subject_id": "1010", "event_term": "Rash", "severity": "moderate"}


def test_the_start_form_refuses_data_it_does_not_fit_before_any_instance_exists(cli: Any) -> None:
    bad = dict(SEVERE, severity="catastrophic", onset_date="2026-12-03")
    doc = run_json(cli, "run", str(SAE), "--data", json.dumps(bad), code=2)
    check_run_document(doc)
    assert doc["instance_id"] is None
    assert (doc["error"]["kind"], doc["error"]["task_id"]) == ("invalid_answer", "sae_received")
    assert {p["field"] for p in doc["error"]["problems"]} == {"severity", "onset_date"}
    assert "dd-MM-yyyy" in doc["error"]["message"]
    listed = cli("list", "--json")
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []          # nothing was created


def test_a_severe_event_waits_for_the_investigator_while_the_dsmb_is_told(cli: Any) -> None:
    doc = run_json(cli, "run", str(SAE), "--data", json.dumps(SEVERE), code=3)
    check_run_document(doc)
    kinds = [(w["kind"], w["task_id"]) for w in doc["waiting_for"]]
    assert kinds == [("user_task", "medical_review"), ("timer", "review_reminder"), ("event", "unblinding_asked")]
    review, reminder = doc["waiting_for"][0], doc["waiting_for"][1]
    assert review["form"]["source"] == "flowable:formProperty"
    assert [f["id"] for f in review["form"]["fields"] if f["required"]] == ["causality", "expected"]
    assert reminder["repetitions_left"] == 2
    # the escalation the safety branch threw was caught by the non-interrupting event sub-process,
    # which ran to its end; it merges into the main context once the assessment branches have joined
    escalated = {c["branch_id"]: c for c in doc["contexts"].values()}["severe_escalated"]
    assert (escalated["gateway"], escalated["status"]) == ("dsmb_notice", "event_done")
    assert "dsmb_notice" not in doc["layers"]["L3"]
    assert doc["layers"]["L1"] == SEVERE and doc["layers"]["L3"]["case_id"] == "SAE-1007"


def test_the_medical_monitor_settles_reportable_and_the_report_goes_out(cli: Any) -> None:
    iid = run_json(cli, "run", str(SAE), "--data", json.dumps(SEVERE), code=3)["instance_id"]
    asked = run_json(cli, "resume", iid, "--answer", 'medical_review={"causality": "unrelated", "expected": true}',
                     code=3)
    assert [w["id"] for w in asked["waiting_for"]] == ["assess_join/reportable", "unblinding_asked"]
    [conflict] = asked["conflicts"]
    assert (conflict["layer"], conflict["base_value"], conflict["base_absent"], conflict["resolution"]) == (
        "L4", None, True, None)
    assert conflict["values"] == {"medical_review": False, "safety_assessment": True}
    question = _confirmation(asked, "assess_join/reportable")
    # the join's default is text; the per-key default fits the boolean conflict and is what is offered
    assert (question["default"], question["default_by"]) == (True, "config")
    assert [o["value"] for o in question["options"]] == [False, True, "$escalate"]
    assert question["message"].startswith("The investigator and the safety physician disagree")
    # an option the question does not offer is bad input, nothing applied
    refused = run_json(cli, "resume", iid, "--answer", "assess_join/reportable=needs_review", code=2)
    assert refused["error"]["kind"] == "invalid_answer" and "needs_review" in refused["error"]["message"]
    reported = run_json(cli, "resume", iid, "--answer", "assess_join/reportable=true", "--by", "dr_meyer", code=3)
    [conflict] = reported["conflicts"]
    assert conflict["resolution"]["value"] is True and conflict["resolution"]["resolver"] == "human"
    history = reported["layers"]["L3"]
    assert history["signal_terms"] == ["hepatitis", "causality:unrelated", "meddra:hepatitis"]   # union
    assert history["dsmb_notice"] == "DSMB: SAE-1007 (TRIAL-042)"          # merged after the join
    assert "reviewer_role" not in history      # injected per branch, left alone: no conflict, not merged
    [sent] = reported["messages_out"]
    assert (sent["name"], sent["element_id"]) == ("expedited_report", "file_expedited_report")
    assert sent["payload"] == {"case_id": "SAE-1007", "term": "Hepatitis", "trial": "TRIAL-042"}
    assert [w["task_id"] for w in reported["waiting_for"]] == ["regulator_ack", "unblinding_asked"]
    # an emergency unblinding at any time: the signal's keys, then the event sub-process's step
    unblinded = run_json(cli, "send", iid, "unblinding_requested", "--signal", "--json-payload",
                         '{"requested_by": "dr_lee"}', code=3)
    assert unblinded["layers"]["L3"]["unblinded_arm"] == "arm-dr_lee"
    done = run_json(cli, "send", iid, "regulator_acknowledged", "--json-payload", '{"ack_id": "EMA-55"}', code=0)
    assert done["status"] == "completed" and done["layers"]["L3"]["ack_id"] == "EMA-55"
    conflicts = cli("tape", iid, "--kind", "conflict")
    assert conflicts.exit_code == 0 and "reportable" in conflicts.output
    decided = cli("tape", iid, "--kind", "human_decision", "--json")
    assert [e["actor"] for e in json.loads(decided.stdout)] == ["dr_meyer"]


def test_an_answer_the_layer_rules_refuse_and_a_typo_are_bad_input(cli: Any) -> None:
    iid = run_json(cli, "run", str(SAE), "--data", json.dumps(MODERATE), code=3)["instance_id"]
    before = run_json(cli, "inspect", iid)
    hacked = run_json(cli, "resume", iid, "--answer",
                      'medical_review={"causality": "related", "expected": false, "trial_id": "TRIAL-000"}', code=2)
    assert "trial_id" in hacked["error"]["message"] and "L0" in hacked["error"]["message"]
    refusal = cli("tape", iid, "--activity", "medical_review")
    assert "answer_refused" in refusal.output and "trial_id" in refusal.output
    typo = cli("resume", iid, "--answer", 'medical_reviw={"causality": "related", "expected": false}')
    assert typo.exit_code == 2 and "'medical_reviw'" in typo.stderr and "medical_review" in typo.stderr
    after = run_json(cli, "inspect", iid)
    assert after["layers"] == before["layers"] and after["waiting_for"] == before["waiting_for"]
    # all or nothing: an answer the join will not offer refuses the investigator's answer given with it
    refused = run_json(cli, "resume", iid, "--answer", 'medical_review={"causality": "unrelated", "expected": true}',
                       "--answer", "assess_join/reportable=needs_review", code=2)
    assert refused["error"]["task_id"] == "assess_join"
    assert [w["task_id"] for w in run_json(cli, "inspect", iid)["waiting_for"]][0] == "medical_review"


# ===== sae_review through the Python API, on the engine's clock ==================================

def test_the_reminders_repeat_then_the_timeout_takes_the_per_key_default() -> None:
    from engine.governance import AnsweredByTimeout

    clock = Clock()
    engine = Engine("memory://", clock=clock)
    instance = engine.run(engine.start(load_process(SAE), MODERATE))
    branch = next(name for name, info in instance.branches.items() if info["branch_id"] == "medical_review")
    for n in (1, 2):
        clock.now += 12 * 3600 + 1
        instance = engine.resume(instance.id)
        assert instance.contexts[branch].resolve("reminder_note") == f"reminder {n}: SAE-1010 awaits causality"
    assert [w["kind"] for w in instance.waiting_for] == ["user_task", "event"]   # the cycle is spent
    instance = engine.resume(instance.id, answers={"user_tasks": {
        "medical_review": {"causality": "unrelated", "expected": True}}})
    [item] = [w for w in instance.waiting_for if w["kind"] == "confirmation"]
    assert item["due"] == "2027-01-17T08:00:02+00:00"          # a day after the join asked
    clock.now += 86400 + 5
    instance = engine.resume(instance.id)
    [conflict] = instance.to_document()["conflicts"]
    assert conflict["resolution"]["value"] is True and conflict["resolution"]["resolver"] == "policy"
    assert "the timeout took the configured default" in conflict["resolution"]["reason"]
    assert instance.main.resolve("reminder_note") == "reminder 2: SAE-1010 awaits causality"
    with pytest.raises(AnsweredByTimeout, match="assess_join"):
        engine.answer_confirmation(instance.id, "assess_join/reportable", False)


# ===== vendor_tender: the happy path =============================================================

def test_the_buyer_settles_a_bid_then_finance_wins_the_award_by_priority(cli: Any) -> None:
    doc = run_json(cli, "run", str(TENDER), "--data", json.dumps(TENDER_DATA), code=3)
    # Borealis is cheap but slow: its checks disagree, the buyer is asked; the bid window is open
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("confirmation", "bid_join"),
                                                                      ("timer", "bid_window_closed")]
    assert _confirmation(doc, "bid_join/bid_ok")["context"].startswith("main/collect_bids#2@")
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "bid_join/bid_ok=false", code=0)
    check_run_document(done)
    history = done["layers"]["L3"]
    assert [b["ok"] for b in history["bids"]] == [True, False, True]             # in the vendors' order
    assert (history["shortlist"], history["best_price"], history["awarded_to"]) == (["Acme", "Cobalt"], 42000, "Acme")
    # the award join: BRANCH_PRIORITY settles the status, the reducers append notes and take the lower ceiling
    award = [c for c in done["conflicts"] if c["gateway_id"] == "award_join"]
    assert [(c["key"], c["resolution"]["value"], c["resolution"]["resolver"]) for c in award] == [
        ("award_status", "approved_with_conditions", "strategy")]
    assert history["risk_notes"] == ["legal: standard terms", "finance: fx exposure"]
    assert history["price_ceiling"] == pytest.approx(46200)
    # the evaluation compressed on an attention score: the tool results cut to what the rule keeps
    [compression] = done["compressions"]
    assert compression["activity_id"] == "evaluate_bids" and compression["triggers"] == ["density"]
    assert compression["tokens_after"] < compression["tokens_before"]
    assert history["tool_call_result_2"] == {"kind": "tool_call_result", "_compressed": "extract_keys",
                                             "status": "ok", "data": {"id": "Borealis"}}


# ===== REST: a real server on a Redis store ======================================================

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    """``layerflow serve --port 0`` on database 8 under a prefix of its own (removed afterwards), the
    catalog unseen26/; the client carries the token."""
    with redis_scratch(REDIS_DB8, "outsider26") as prefix:
        store = f"{REDIS_DB8}?prefix={prefix}"
        log = tmp_path_factory.mktemp("served") / "serve.err"
        env = dict(os.environ, PYTHONPATH=str(ROOT), LAYERFLOW_API_TOKEN=TOKEN)
        with log.open("w") as err:
            proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                     "--catalog", str(HERE), "--store", store], env=env, cwd=ROOT,
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        try:
            url = wait_until_served(log, proc)
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as api:
                yield api, store
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)


def _error(reply: httpx.Response, status: int) -> str:
    assert reply.status_code == status, reply.text
    message: str = reply.json()["error"]["message"]
    return message


def test_rest_the_second_question_of_a_multi_instance_join_is_answered_by_its_escaped_id(
        served: tuple[httpx.Client, str]) -> None:
    api, _ = served
    vendors = [*VENDORS[:2], {"name": "Dyna", "price": 61000, "lead_days": 5}]    # Borealis slow, Dyna dear
    started = api.post("/api/instances", json={"process_id": "vendor_tender", "data": {"tender_no": 8, "vendors": vendors}})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    asked = {c["id"]: c["context"] for c in started.json()["confirmations"]}
    assert sorted(asked) == ["bid_join/bid_ok", "bid_join/bid_ok#2"]
    assert asked["bid_join/bid_ok#2"].startswith("main/collect_bids#3@")   # Dyna's instance
    answered = api.post("/api/confirmations/bid_join/bid_ok%232", json={"value": True, "instance_id": iid})
    assert answered.status_code == 200, answered.text
    assert answered.json()["confirmation_id"] == "bid_join/bid_ok#2"
    assert [w["id"] for w in answered.json()["waiting_for"] if w["kind"] == "confirmation"] == ["bid_join/bid_ok"]
    done = api.post("/api/confirmations/bid_join/bid_ok", json={"value": False, "instance_id": iid})
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    bids = {b["vendor"]: b["ok"] for b in done.json()["layers"]["L3"]["bids"]}
    assert bids == {"Acme": True, "Borealis": False, "Dyna": True}


def test_rest_the_sae_review_refuses_bad_input_and_runs_to_the_report(served: tuple[httpx.Client, str], cli: Any) -> None:
    api, store = served
    assert local_http.post(str(api.base_url.join("/api/instances")), json={"process_id": "sae_review"}).status_code == 401
    form = api.get("/api/processes/sae_review").json()["start_form"]
    assert form["event_id"] == "sae_received" and [f["id"] for f in form["fields"]][:3] == [
        "subject_id", "event_term", "severity"]
    assert "catastrophic" in _error(api.post("/api/instances", json={
        "process_id": "sae_review", "data": dict(SEVERE, severity="catastrophic")}), 400)
    started = api.post("/api/instances", json={"process_id": "sae_review", "data": SEVERE})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    task = f"/api/instances/{iid}/user-tasks/medical_review"
    assert "causality" in _error(api.post(task, json={"data": {"causality": "maybe", "expected": False}}), 400)
    assert "trial_id" in _error(api.post(task, json={"data": {"causality": "related", "expected": False,
                                                              "trial_id": "T-0"}}), 403)
    inject = "/api/context-governance/inject"
    assert "trial_id" in _error(api.post(inject, json={"instance_id": iid, "key": "trial_id", "value": "T-0"}), 403)
    assert "open branches" in _error(api.post(inject, json={"instance_id": iid, "key": "site_note", "value": "x"}), 409)
    noted = api.post(inject, json={"instance_id": iid, "context": "medical_review", "key": "site_note",
                                   "value": "called the site"})
    assert noted.status_code == 200 and noted.json()["written"] == {"site_note": "L4"}, noted.text
    early = api.post(f"/api/instances/{iid}/events", json={"name": "regulator_acknowledged", "payload": {}})
    assert "medical_review" in _error(early, 409)
    answered = api.post(task, json={"data": {"causality": "unrelated", "expected": True}})
    assert answered.status_code == 200, answered.text
    assert [w["id"] for w in answered.json()["waiting_for"]] == ["assess_join/reportable", "unblinding_asked"]
    assert "needs_review" in _error(api.post("/api/confirmations/assess_join/reportable", json={
        "value": "needs_review", "instance_id": iid}), 400)
    resolved = api.post("/api/context-governance/resolve", json={
        "instance_id": iid, "conflict_key": "reportable", "resolution": True, "reason": "medical monitor: SUSAR"})
    assert resolved.status_code == 200, resolved.text
    doc = api.get(f"/api/instances/{iid}").json()
    assert [w["task_id"] for w in doc["waiting_for"]] == ["regulator_ack", "unblinding_asked"]
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"
    assert doc["layers"]["L3"]["site_note"] == "called the site"     # the branch's note came through the join
    # the CLI reads what the server ran: one store
    assert run_json(cli, "inspect", iid, "--store", store)["tape_length"] == doc["tape_length"]


# ===== mel_deferral: an inclusive split, an event-based gateway in a branch, FAIL_ON_CONFLICT ======

MEL = HERE / "mel_deferral.bpmn"
PACK = {"tail_number": "D-ABCD", "mel_item": "21-51-01", "mel_category": "B", "defect": "pack 1 inoperative",
        "defect_critical": False, "aircraft_grounded": False}


def test_parts_arrive_the_captain_accepts_and_the_cliff_keeps_the_preserved_decision(cli: Any) -> None:
    doc = run_json(cli, "run", str(MEL), "--data", json.dumps(PACK), code=3)
    # one inclusive branch (engineering) waits at its event-based gateway: the parts or the deadline
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("timer", "parts_deadline"),
                                                                      ("event", "await_parts")]
    assert doc["waiting_for"][1]["event_id"] == "parts_arrived"
    iid = doc["instance_id"]
    waiting = run_json(cli, "send", iid, "parts_available", "--json-payload", '{"part_no": "PN-778"}', code=3)
    assert [(w["kind"], w["task_id"]) for w in waiting["waiting_for"]] == [("user_task", "captain_acceptance"),
                                                                          ("event", "grounded_meanwhile")]
    assert waiting["waiting_for"][1]["condition"] == "aircraft_grounded == True"
    done = run_json(cli, "resume", iid, "--answer", 'captain_acceptance={"captain": "Capt. Ruiz"}', code=0)
    [cliff] = done["compressions"]
    # the entry count, and DESIGN's default density (no token threshold: no floor) with the keys preserved
    assert (cliff["activity_id"], cliff["triggers"]) == ("captain_acceptance", ["message_threshold", "density"])
    history = done["layers"]["L3"]
    assert (history["dispatch_status"], history["deferral_id"]) == ("deferred", "D-ABCD-21-51-01")   # preserved
    assert "repair_slot" not in history and history["compaction:1"]["covers"][0] == "activity:open_deferral"
    assert history["closed_by"] == "Capt. Ruiz"


def test_the_desk_grounds_the_aircraft_and_a_conflicting_assessment_stops_the_instance(cli: Any) -> None:
    iid = run_json(cli, "run", str(MEL), "--data", json.dumps(PACK), code=3)["instance_id"]
    run_json(cli, "send", iid, "parts_available", "--json-payload", '{"part_no": "PN-778"}', code=3)
    grounded = run_json(cli, "resume", iid, "--set", "aircraft_grounded=true", code=0)
    assert grounded["layers"]["L3"]["dispatch_cancelled"] is True and "closed_by" not in grounded["layers"]["L3"]
    # a critical defect of category C: engineering defers, safety grounds; FAIL_ON_CONFLICT stops the join
    critical = dict(PACK, mel_category="C", defect_critical=True)
    iid = run_json(cli, "run", str(MEL), "--data", json.dumps(critical), code=3)["instance_id"]
    failed = run_json(cli, "send", iid, "parts_available", "--json-payload", '{"part_no": "PN-1"}', code=1)
    assert (failed["error"]["kind"], failed["error"]["task_id"]) == ("merge_conflict", "assess_join")
    assert "'dispatch_status'" in failed["error"]["message"] and "FAIL_ON_CONFLICT" in failed["error"]["message"]
    [conflict] = failed["conflicts"]
    assert conflict["values"] == {"engineering_review": "deferred", "safety_review": "grounded"}
