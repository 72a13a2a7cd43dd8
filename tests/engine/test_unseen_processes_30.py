"""Outsider round 30: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen30/), driven through the CLI and the Python API.

capex_request: a plant's capital expenditure request. An inclusive gateway sends the request to the
  reviews its data asks for (building work, network, hazardous materials: two of three in the run
  below); each review adds its cost estimate to the scoped contingency, names its stakeholders and
  scores the risk, and the inclusive join merges them by per-key reducers (`sum`, `union`, `max`), no
  conflict. Budget and treasury then both pick a funding source in parallel; their join ranks treasury
  first (`BRANCH_PRIORITY`): a conflict settled by the strategy. Three approvers sign one after the
  other (a sequential multi-instance user task), answered from an `--answers` file or one by one.

breach_response: a personal-data breach. An investigation sub-process triages the breach, then in
  parallel throws an escalation from an end event (the regulator must be told) and waits for the
  forensics report; a non-interrupting escalation boundary event on the sub-process notifies the
  regulator in a side branch, merged as the process ends. The forensics report turns out to be for
  another case: the DPO rolls HISTORY back to the snapshot taken at the split (`snapshot --list`,
  `rollback`) and signs off (`resume`). `replay --until SEQ` is checked against what `inspect`
  showed at that moment.

Expected before anything ran: as README and DESIGN say. Misread at first (the engine is right): the
inclusive split's `default` flow was drawn to facilities, which BPMN takes only when no other
condition holds (so the first draft ran one review, not two); `sum` adds each branch's change to the
split's value (a contingency of 1000 plus 42000 and 8500 is 51500, not 52500).
Found: the multi-instance notes on the tape number one instance in two ways: the person's
`user_input` note says `"instance": 1` as `waiting_for` does, the engine's `instance_item` /
`instance_done` notes beside it say `"instance": 0` (the input item's index, or its key for a dict
collection). README named only the first: now it says what each means.
Found and fixed: a BRANCH_PRIORITY resolution's reason said "branch 'it_review' ranks first in
['environment_review', 'it_review', ...]" when the branch ranked above it had not run: it now names the
ranking among the branches that changed the key.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen30"
CAPEX = HERE / "capex_request.bpmn"
BREACH = HERE / "breach_response.bpmn"
REQUEST = {"request_no": "CX-77", "needs_building_work": True, "needs_network": True, "hazardous_materials": False}
BREACH_DATA = {"breach_id": "BR-9", "records_affected": 1200}
FUNDING_CONFLICT = {
    "gateway_id": "funding_join", "layer": "L4", "key": "funding_source", "base_value": None, "base_absent": True,
    "values": {"budget_check": "opex_reallocation", "treasury_check": "capital_lease"},
    "resolution": {"value": "capital_lease", "resolver": "strategy",
                   "reason": "BRANCH_PRIORITY: branch 'treasury_check' ranks first in ['treasury_check', 'budget_check']"},
    "context": "main"}


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in layer.items() if ":" not in k and not k.startswith("_")}


def main_events(cli: Any, iid: str, *args: str) -> list[dict[str, Any]]:
    return [e for e in run_json(cli, "tape", iid, *args) if e["context"] == "main"]


def test_two_of_three_reviews_are_merged_by_their_reducers(cli: Any) -> None:
    doc = run_json(cli, "run", str(CAPEX), "--data", json.dumps(REQUEST), code=3)
    check_run_document(doc)
    history = doc["layers"]["L3"]
    assert "activity:facilities_review" in history and "activity:it_review" in history
    assert "activity:environment_review" not in history  # its condition was false
    assert data_keys(history) == {
        "estimated_cost": 1000 + 42000 + 8500, "stakeholders": ["requester", "facilities", "it_security"],
        "risk_score": 5, "approvers": ["plant_manager", "controller", "cfo"],
        "funding_source": "capital_lease", "budget_ok": True}
    # a reduced key is no conflict: only the funding source, settled by BRANCH_PRIORITY
    assert doc["conflicts"] == [FUNDING_CONFLICT]
    (join,) = [e for e in main_events(cli, doc["instance_id"], "--kind", "join")
               if e["data"]["gateway_id"] == "review_join"]
    assert join["data"]["branches"] == ["facilities_review", "it_review"] and join["data"]["conflicts"] == 0
    assert [c[1:] for c in join["changes"] if ":" not in c[1]] == [
        ["estimated_cost", 51500], ["stakeholders", ["requester", "facilities", "it_security"]], ["risk_score", 5]]


def test_the_strategy_settled_conflict_is_logged_in_merged_conflicts(cli: Any) -> None:
    doc = run_json(cli, "run", str(CAPEX), "--data", json.dumps(REQUEST), code=3)
    # the sign-off waits: the join's log is in WORKING until that activity completes
    (logged,) = doc["layers"]["L4"]["_mergedConflicts"]
    assert logged["gatewayId"] == "funding_join" and logged["key"] == "funding_source"
    assert logged["conflictingValues"] == ["opex_reallocation", "capital_lease"]
    assert logged["sourceBranches"] == ["budget_check", "treasury_check"]
    assert logged["resolution"] == FUNDING_CONFLICT["resolution"]
    assert doc["waiting_for"] == [{"kind": "user_task", "id": doc["waiting_for"][0]["id"], "task_id": "sign_off",
                                   "name": "Sign off", "context": "main", "instance": 1,
                                   "input": {"approver": "plant_manager"}}]


def test_sequential_approvers_are_answered_from_an_answers_file(cli: Any, tmp_path: Path) -> None:
    doc = run_json(cli, "run", str(CAPEX), "--data", json.dumps(REQUEST), code=3)
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"sign_off": {"signature": {"approved": True}}}}))
    done = run_json(cli, "resume", doc["instance_id"], "--answers", str(answers))
    check_run_document(done)
    assert done["status"] == "completed" and done["waiting_for"] == []
    history = done["layers"]["L3"]
    assert history["signatures"] == [{"approved": True}] * 3 and history["po_released"] is True
    assert history["_mergedConflicts"][0]["resolution"]["resolver"] == "strategy"
    notes = [e["data"] for e in main_events(cli, doc["instance_id"], "--activity", "sign_off")
             if e["kind"] in ("note", "changes")]
    assert [n["instance"] for n in notes if n["note"] == "user_input"] == [1, 2, 3]
    # the engine's own notes count the input item's index, from 0 (README, "User task forms")
    assert [n["instance"] for n in notes if n["note"] == "instance_item"] == [0, 1, 2]


def test_one_approver_answers_by_item_id_and_rejects(cli: Any) -> None:
    doc = run_json(cli, "run", str(CAPEX), "--data", json.dumps(REQUEST), code=3)
    iid, first = doc["instance_id"], doc["waiting_for"][0]["id"]
    reject = json.dumps({"signature": {"approved": False, "by": "plant_manager"}})
    second = run_json(cli, "resume", iid, "--answer", f"{first}={reject}", code=3)
    assert [(w["task_id"], w["instance"], w["input"]) for w in second["waiting_for"]] == [
        ("sign_off", 2, {"approver": "controller"})]
    done = run_json(cli, "resume", iid, "--answer", 'sign_off={"signature": {"approved": true}}')
    assert done["layers"]["L3"]["signatures"] == [{"approved": False, "by": "plant_manager"},
                                                  {"approved": True}, {"approved": True}]
    assert done["layers"]["L3"]["po_released"] is False


def test_all_three_reviews_through_the_python_api() -> None:
    engine = Engine("memory://")
    process = load_process(CAPEX)
    instance = engine.run(process, {**REQUEST, "hazardous_materials": True})
    assert instance.status == "waiting"
    ctx = instance.main
    assert ctx.resolve("estimated_cost") == 1000 + 42000 + 8500 + 99999
    assert ctx.resolve("stakeholders") == ["requester", "facilities", "it_security", "ehs"]
    assert ctx.resolve("risk_score") == 9
    done = engine.resume(instance.id, answers={"user_tasks": {"sign_off": {"signature": {"approved": True}}}})
    assert done.status == "completed" and done.main.resolve("budget_ok") is False


def test_escalation_end_event_runs_the_non_interrupting_boundary_path(cli: Any) -> None:
    doc = run_json(cli, "run", str(BREACH), "--data", json.dumps(BREACH_DATA), code=3)
    check_run_document(doc)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["forensics_report"]
    side = doc["contexts"]["main/regulator_watch@11"]
    assert (side["status"], side["branch_id"]) == ("side", "regulator_watch")
    # the notification is the side branch's until the process ends
    assert "regulator_ref" not in doc["layers"]["L3"]
    iid = doc["instance_id"]
    run_json(cli, "resume", iid, "--answer", 'forensics_report={"root_cause": "phishing"}', code=3)
    done = run_json(cli, "resume", iid, "--answer", 'dpo_signoff={"dpo_approved": true}')
    assert done["status"] == "completed"
    history = done["layers"]["L3"]
    assert history["regulator_ref"] == "REG-BR-9" and history["regulator_notified"] is True
    record = history["event:regulator_watch"]
    assert (record["event_kind"], record["code"], record["sent_by"], record["keys"]) == (
        "escalation", "REGULATOR", "process", [])
    assert {c["status"] for c in done["contexts"].values()} == {"joined"}
    assert history["case_status"] == "closed" and history["root_cause"] == "phishing"


def test_replay_matches_inspect_then_rollback_and_resume(cli: Any) -> None:
    iid = run_json(cli, "run", str(BREACH), "--data", json.dumps(BREACH_DATA), code=3)["instance_id"]
    run_json(cli, "resume", iid, "--answer", 'forensics_report={"root_cause": "phishing"}', code=3)
    seen = run_json(cli, "inspect", iid)
    seq = main_events(cli, iid)[-1]["seq"]
    replayed = run_json(cli, "replay", iid, "--until", str(seq))
    assert (replayed["until"], replayed["context"]) == (seq, "main")
    assert json.dumps(replayed["layers"]) == json.dumps(seen["layers"])
    assert replayed["tokens"] == seen["tokens"]

    listed = cli("snapshot", iid, "--list")
    assert listed.exit_code == 0
    split = next(line.split("\t")[0] for line in listed.stdout.splitlines() if line.endswith("split:inv_split"))
    back = run_json(cli, "rollback", iid, split, "--layers", "L3", "--reason", "report of another case")
    assert (back["snapshot_id"], back["restored_layers"], back["event_seq"]) == (split, ["L3"], seq + 1)
    after = run_json(cli, "inspect", iid)
    assert "root_cause" not in after["layers"]["L3"] and after["layers"]["L3"]["severity"] == "high"
    (restore,) = main_events(cli, iid, "--kind", "restore")
    assert restore["seq"] == seq + 1
    # the tape still rebuilds the context before the rollback, byte for byte
    assert json.dumps(run_json(cli, "replay", iid, str(seq))["layers"]) == json.dumps(seen["layers"])

    done = run_json(cli, "resume", iid, "--answer", 'dpo_signoff={"dpo_approved": true}')
    history = done["layers"]["L3"]
    assert "root_cause" not in history and "activity:forensics_report" not in history
    assert history["case_status"] == "closed" and history["regulator_ref"] == "REG-BR-9"
    assert json.dumps(run_json(cli, "replay", iid)["layers"]) == json.dumps(done["layers"])


def test_rollback_past_the_side_branch_fork_stays_rolled_back_when_it_merges(cli: Any) -> None:
    """The regulator's side branch was forked after triage; main is rolled back to before the case was
    logged. As the side branch merges at the end, what main dropped stays dropped (only main changed
    it since the fork), and what the side branch wrote comes in."""
    iid = run_json(cli, "run", str(BREACH), "--data", json.dumps({**BREACH_DATA, "breach_id": "BR-11"}),
                   code=3)["instance_id"]
    # with the sub-process's branches open, main cannot be rolled back: they would merge into it
    refused = cli("rollback", iid, "snap:main:3", "--layers", "L3")
    assert refused.exit_code == 2 and "open branches (escalate_end, forensics_report)" in refused.stderr
    run_json(cli, "resume", iid, "--answer", 'forensics_report={"root_cause": "lost laptop"}', code=3)
    back = run_json(cli, "rollback", iid, "snap:main:3", "--layers", "L3", "--reason", "start over")
    assert back["tokens_after"]["L3"] == 0
    assert run_json(cli, "replay", iid, str(back["event_seq"]))["tokens"] == back["tokens_after"]
    done = run_json(cli, "resume", iid, "--answer", 'dpo_signoff={"dpo_approved": false}')
    history = done["layers"]["L3"]
    assert data_keys(history) == {"dpo_approved": False, "case_status": "reopened", "regulator_ref": "REG-BR-11",
                                  "regulator_notified": True}
    assert "activity:triage" not in history and "event:regulator_watch" in history


def test_branch_priority_reason_names_the_ranking_among_the_branches_in_conflict(tmp_path: Path) -> None:
    """The inclusive join ranks environment first, but the environment review did not run: the record
    must not say that IT "ranks first" in a list that starts with environment."""
    (tmp_path / CAPEX.name).write_bytes(CAPEX.read_bytes())
    (tmp_path / "capex_request.layerflow.yaml").write_text(
        "review_join:\n  mergeStrategy: BRANCH_PRIORITY\n"
        "  branchPriority: [environment_review, it_review, facilities_review]\n  reducers: {stakeholders: union}\n")
    instance = Engine("memory://").run(load_process(tmp_path / CAPEX.name), REQUEST)
    logged = {c["key"]: c["resolution"] for c in instance.main.resolve("_mergedConflicts")}
    assert set(logged) == {"estimated_cost", "risk_score"}
    assert logged["estimated_cost"] == {
        "value": 1000 + 8500, "resolver": "strategy",
        "reason": "BRANCH_PRIORITY: branch 'it_review' ranks first of the branches that changed the key "
                  "(it_review, facilities_review) in ['environment_review', 'it_review', 'facilities_review']"}
