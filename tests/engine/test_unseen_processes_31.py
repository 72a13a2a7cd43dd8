"""Outsider round 31: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/outsider31/, drawn as Camunda Modeler exports them: diagram, generated-looking ids),
driven through the CLI, the Python API and one real ``layerflow serve``.

supplier_onboarding: a document check (script), a risk screening by a model step (offline, its
  handler stands in for the model), an inclusive split into compliance (a person), finance (a
  script, only for a large spend) and legal (a person, with a three-day boundary timer that notes
  the overdue review instead), an inclusive join where the reviews write the same key
  (`onboarding_decision`) and a person settles it through `human_confirm`, and a rework loop back to
  the document check.
incident_postmortem: starts on the message `incident_closed`; a long, noisy timeline (a dozen log
  lines), then root cause and customer impact in parallel, the root cause compressing its history
  by rules (`count_only`, `extract_keys`, `summarize`); the author writes the post-mortem. A wrong
  severity set by hand is rolled back to a snapshot, `replay --until` is compared with what `inspect`
  showed then, and the instance is finished by another process.

Expected before anything ran: as README and DESIGN say. Misread at first (the engine is right): a
branch that writes the value the key had before the split has not changed it, so the legal
timeout's `rework` in the second round (the key was `rework` since the first) is no conflict with
compliance's `approve`: approve wins without a question.
Found and fixed: the compression a parallel branch made could not be undone once its branch was
joined. REST `compress` with `action: decompress` on the joined branch answered 409 "change the
context the process goes on in instead (`context`: 'main')", and on `main` 400 "has no compression to
refer to; pass snapshot_id", then, given the snapshot id, 404 "snapshot ... was not taken in context
'main'": a dead end against DESIGN ("every compression ... can be undone") and README (`decompress`
"undoes a compression and keeps what was written after it"). `decompress` on the context a branch
was merged into now undoes what that branch's compression changed there and still stands.
Found and fixed: `rollback` to a joined branch's snapshot (`snapshot --list` lists it) was refused with
"change ... (`--context`: 'main')", and `--context main` then refused the snapshot as not main's; the
refusal now says main never was in that state and names the split's snapshot to roll back to.
Found and fixed (round 25 of the gaps): when one branch's `count_only` rule and the other branch's fold
both removed the same old entries, the join brought them back verbatim beside the counter that counted
them (two compressions of one key kept the base); they now stay removed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import Layer, LayeredContext
from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json, serving_catalog
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent / "outsider31"
SUPPLIER = HERE / "supplier_onboarding.bpmn"
POSTMORTEM = HERE / "incident_postmortem.bpmn"
TOKEN = "outsider31-token"
JOIN_Q = "Gateway_review_join/onboarding_decision"
DAY = 86400.0


def supplier(**extra: Any) -> dict[str, Any]:
    data = {"supplier_id": "S-311", "supplier_name": "Nordwerk GmbH", "annual_spend": 400000, "needs_contract": True,
            "documents": ["tax_certificate", "bank_letter"], "document_rounds": 0}
    return {**data, **extra}


def data_keys(layer: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in layer.items() if ":" not in k and not k.startswith("_")}


def answer(task: str, value: dict[str, Any]) -> tuple[str, str]:
    return "--answer", f"{task}={json.dumps(value)}"


def waiting(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(w["kind"], w["task_id"]) for w in doc["waiting_for"]]


def test_both_processes_validate(cli: Any) -> None:
    for path in (SUPPLIER, POSTMORTEM):
        result = cli("validate", str(path))
        assert result.exit_code == 0, result.output
        assert "is valid" in result.stdout


# ===== supplier onboarding: CLI ==================================================================

def test_reviews_disagree_a_person_sends_it_back_and_the_second_round_passes(cli: Any) -> None:
    doc = run_json(cli, "run", str(SUPPLIER), "--data", json.dumps(supplier()), code=3)
    check_run_document(doc)
    iid = doc["instance_id"]
    assert waiting(doc) == [("user_task", "Activity_compliance_review"), ("user_task", "Activity_legal_review"),
                            ("timer", "Event_legal_overdue")]
    history = data_keys(doc["layers"]["L3"])
    assert history["missing_documents"] == ["insurance_policy"] and history["documents_ok"] is False
    assert (history["risk_score"], history["risk_band"]) == (30, "medium")   # the fake model's screening
    assert doc["layers"]["L1"] == {k: v for k, v in supplier().items() if k not in ("documents", "document_rounds")}

    doc = run_json(cli, "resume", iid,
                   *answer("Activity_compliance_review", {"onboarding_decision": "approve", "reviewed_by": ["compliance"]}),
                   *answer("Activity_legal_review", {"onboarding_decision": "rework", "reviewed_by": ["legal"]}), code=3)
    assert [w["id"] for w in doc["waiting_for"]] == [JOIN_Q]
    (conflict,) = doc["conflicts"]
    assert conflict["values"] == {"Activity_compliance_review": "approve", "Activity_finance_review": "approve",
                                  "Activity_legal_review": "rework"}
    assert conflict["resolution"] is None and conflict["base_absent"] is True
    (question,) = doc["confirmations"]
    assert [o["value"] for o in question["options"]] == ["approve", "rework", "$escalate"]
    assert question["message"].startswith("The reviews disagree on the onboarding decision.")

    doc = run_json(cli, "resume", iid, "--answer", f"{JOIN_Q}=rework", "--by", "dana", code=3)
    assert waiting(doc) == [("user_task", "Activity_request_documents")]
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"
    merged = doc["layers"]["L3"]
    assert merged["onboarding_decision"] == "rework"
    assert merged["reviewed_by"] == ["compliance", "legal"]             # the union reducer: no conflict
    # the log is in WORKING while the next step (the user task) waits, then in HISTORY
    assert doc["layers"]["L4"]["_mergedConflicts"][0]["resolution"]["by"] == "dana"

    doc = run_json(cli, "resume", iid, *answer("Activity_request_documents",
                                               {"documents": ["tax_certificate", "bank_letter", "insurance_policy"]}), code=3)
    history = data_keys(doc["layers"]["L3"])
    assert (history["document_rounds"], history["documents_ok"], history["risk_band"]) == (2, True, "low")
    due = next(w["due"] for w in doc["waiting_for"] if w["kind"] == "timer")

    # legal does not answer in time: the timer fires first, its answer is not used (stderr says so)
    late = datetime.fromtimestamp(datetime.fromisoformat(due).timestamp() + 3600, timezone.utc)
    result = cli("resume", iid, "--now", late.strftime("%Y-%m-%dT%H:%M:%SZ"), "--json",
                 *answer("Activity_compliance_review", {"onboarding_decision": "approve"}),
                 *answer("Activity_legal_review", {"onboarding_decision": "reject"}))
    assert result.exit_code == 0, result.output
    assert "Activity_legal_review" in result.stderr and "not used" in result.stderr
    doc = json.loads(result.stdout)
    history = data_keys(doc["layers"]["L3"])
    assert history["legal_note"] == "legal review overdue: contract to be resubmitted"
    # the timeout's `rework` is what the key held before the split: not a change, so approve stands
    assert (history["onboarding_decision"], history["supplier_status"], history["vendor_number"]) == (
        "approve", "active", "V-S-311")
    assert len(doc["conflicts"]) == 1                                      # the first round's, listed once
    decisions = run_json(cli, "tape", iid, "--kind", "human_decision")
    assert [e["actor"] for e in decisions] == ["dana"]


def test_a_question_nobody_answers_escalates_and_then_a_person_rejects(cli: Any, tmp_path: Path) -> None:
    answers = {"user_tasks": {"Activity_compliance_review": {"onboarding_decision": "approve"},
                              "Activity_legal_review": {"onboarding_decision": "reject"}}}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    doc = run_json(cli, "run", str(SUPPLIER), "--data", json.dumps(supplier(annual_spend=5000)),
                   "--answers", str(tmp_path / "answers.json"), code=3)
    iid = doc["instance_id"]
    (item,) = doc["waiting_for"]
    assert item["id"] == JOIN_Q and "due" in item
    after = datetime.fromtimestamp(datetime.fromisoformat(item["due"]).timestamp() + 60, timezone.utc)
    fired = run_json(cli, "timers", "--now", after.strftime("%Y-%m-%dT%H:%M:%SZ"), "--fire")
    assert [f["instance_id"] for f in fired["fired"]] == [iid]
    doc = run_json(cli, "inspect", iid)
    (item,) = doc["waiting_for"]
    assert item["escalated"] is True and "due" not in item                 # it waits for a person now
    assert doc["confirmations"][0]["timed_out"] is True
    doc = run_json(cli, "resume", iid, "--answer", f"{JOIN_Q}=reject")
    assert doc["status"] == "completed"
    assert doc["layers"]["L3"]["onboarding_decision"] == "reject" and "supplier_status" not in doc["layers"]["L3"]


# ===== supplier onboarding: Python API, the engine's clock ========================================

def test_the_boundary_timer_on_the_engines_clock_and_a_person_settles_the_first_round(tmp_path: Path) -> None:
    now = [1_800_000_000.0]
    engine = Engine(f"sqlite:///{tmp_path / 'py.db'}", clock=lambda: now[0])
    instance = engine.run(load_process(SUPPLIER), supplier(annual_spend=2_000_000))
    assert instance.status == "waiting"
    assert instance.main.resolve("risk_band") == "high"                   # 30 for the spend, 10 for a document
    now[0] += 3 * DAY + 1
    instance = engine.resume(instance.id, answers={"user_tasks": {"Activity_compliance_review": {
        "onboarding_decision": "approve"}}})
    # finance rejects a high risk, compliance approves, the overdue legal review asks for rework (its
    # branch is named by its first element, the legal review, whose timer took it on)
    assert [w["id"] for w in instance.waiting_for] == [JOIN_Q]
    (conflict,) = instance.conflicts
    assert conflict["values"] == {"Activity_compliance_review": "approve", "Activity_finance_review": "reject",
                                  "Activity_legal_review": "rework"}
    instance = engine.answer_confirmation(instance.id, JOIN_Q, "reject", by="erin")
    assert instance.status == "completed"
    assert instance.main.resolve("onboarding_decision") == "reject"
    assert instance.main.resolve("_mergedConflicts")[0]["resolution"]["by"] == "erin"


# ===== incident post-mortem: CLI ==================================================================

def test_postmortem_compresses_rolls_back_replays_and_is_finished_by_another_process(cli: Any, tmp_path: Path) -> None:
    doc = run_json(cli, "run", str(POSTMORTEM), code=3)
    iid = doc["instance_id"]
    assert [(w["kind"], w["task_id"], w["event"]) for w in doc["waiting_for"]] == [
        ("event", "Start_incident_closed", "incident_closed")]
    doc = run_json(cli, "send", iid, "incident_closed", "--json-payload",
                   json.dumps({"incident_id": "INC-311", "service": "checkout", "severity": "sev2"}), code=3)
    check_run_document(doc)
    assert waiting(doc) == [("user_task", "Activity_write_postmortem")]
    (compression,) = doc["compressions"]
    assert compression["activity_id"] == "Activity_root_cause" and "token_threshold" in compression["triggers"]
    assert compression["tokens_after"] < compression["tokens_before"]
    history = doc["layers"]["L3"]
    assert history["summary:count:log_line"]["count"] == 12 and history["summary:count:log_line"]["kept"] == [
        "log_line_10", "log_line_11"]
    assert "log_line_00" not in history
    assert history["tool_call_result_1"] == {"kind": "tool_call_result", "_compressed": "extract_keys",
                                             "status": "ok", "data": {"host": "db-2"}}
    assert history["incident_id"] == "INC-311" and history["root_cause"].startswith("retry storm")
    # customer impact wrote the severity the message brought: no change, no conflict; root cause's stands
    assert history["severity"] == "sev1" and doc["conflicts"] == []

    snap = cli("snapshot", iid)
    assert snap.exit_code == 0, snap.output
    snap_id = snap.stdout.strip()
    seq = int(snap_id.rsplit(":", 1)[1])
    then = run_json(cli, "inspect", iid)
    doc = run_json(cli, "resume", iid, "--set", "severity=sev4", code=3)
    assert doc["layers"]["L3"]["severity"] == "sev4"
    rolled = run_json(cli, "rollback", iid, snap_id, "--layers", "L3", "--reason", "severity set by mistake")
    assert rolled["snapshot_id"] == snap_id
    assert run_json(cli, "inspect", iid, "--layer", "L3")["layers"]["L3"]["severity"] == "sev1"
    (restore,) = run_json(cli, "tape", iid, "--kind", "rollback")
    assert restore["data"]["reason"] == "severity set by mistake"
    # the root cause's own snapshot (listed too) is of a branch merged since: not main's to go back to
    listed = [s["snapshot_id"] for s in run_json(cli, "snapshot", iid, "--list")["snapshots"]]
    branch_snap = next(s for s in listed if s.startswith("snap:main/Activity_root_cause@"))
    refused = cli("rollback", iid, branch_snap)
    assert refused.exit_code == 2
    assert "merged into 'main' at 'Gateway_analysis_join'" in refused.stderr
    split_snap = run_json(cli, "tape", iid, "--kind", "split")[0]["data"]["snapshot_id"]
    assert f"the split's, {split_snap!r}" in refused.stderr                # what to roll back to instead
    assert "--context" not in refused.stderr                              # main never held that state
    replayed = run_json(cli, "replay", iid, "--until", str(seq))
    assert replayed["layers"] == then["layers"]
    end = run_json(cli, "replay", iid, "--until", "9999")
    assert end["tape_end"] == restore["seq"] + 1 and end["layers"]["L3"]["severity"] == "sev1"

    # another process (no memory of this one) finishes it from the store
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "engine.cli", "resume", iid, "--json", "--answer",
                           'Activity_write_postmortem={"action_items": ["cap retries"], "author": "mia"}'],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    final = json.loads(done.stdout)
    assert final["status"] == "completed"
    assert (final["layers"]["L3"]["published_severity"], final["layers"]["L3"]["author"]) == ("sev1", "mia")


# ===== REST: one real server =====================================================================

@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    folder = tmp_path_factory.mktemp("served31")
    with serving_catalog(HERE, f"sqlite:///{folder / 'rest.db'}", folder / "serve.err", TOKEN) as client:
        yield client


def _started_postmortem(api: httpx.Client) -> dict[str, Any]:
    started = api.post("/api/instances", json={"process_id": "incident_postmortem", "data": {}})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    sent = api.post(f"/api/instances/{iid}/events", json={"name": "incident_closed", "payload": {
        "incident_id": "INC-9", "service": "search", "severity": "sev2"}})
    assert sent.status_code == 200, sent.text
    doc: dict[str, Any] = sent.json()
    assert doc["status"] == "waiting" and doc["notices"] == []
    return doc


def test_rest_a_joined_branchs_compression_is_undone_in_the_context_it_merged_into(api: httpx.Client) -> None:
    doc = _started_postmortem(api)
    iid = doc["instance_id"]
    (compression,) = doc["compressions"]
    assert compression["context"] != "main"                              # made in the root-cause branch
    folded = doc["layers"]["L3"]
    assert "log_line_03" not in folded and "service" not in folded and "compaction:1" in folded

    undone = api.post("/api/context-governance/compress", json={
        "instance_id": iid, "action": "decompress", "snapshot_id": compression["snapshot_id"]})
    assert undone.status_code == 200, undone.text
    assert undone.json()["context"] == "main" and undone.json()["tokens_after"] > undone.json()["tokens_before"]
    history = api.get(f"/api/instances/{iid}").json()["layers"]["L3"]
    assert history["log_line_03"].startswith("09:21 search pager")       # the folded entries are back
    assert history["service"] == "search" and "event:Start_incident_closed" in history
    assert history["tool_call_result_1"]["data"]["matches"][0] == "ERROR pool exhausted 0"
    assert "compaction:1" not in history and "summary:count:log_line" not in history
    # what was written after the compression stays: the other branch's and the root cause's decisions
    assert (history["affected_customers"], history["severity"]) == (1840, "sev1")
    assert history["root_cause"].startswith("retry storm")
    (event,) = [e for e in api.get(f"/api/instances/{iid}/tape", params={"kind": "decompress"}).json()["events"]
                if e["context"] == "main"]
    assert event["data"]["snapshot_id"] == compression["snapshot_id"]
    # the instance lists the compression as undone there, and has none left to undo
    (listed,) = api.get(f"/api/instances/{iid}").json()["compressions"]
    assert listed["undone"] == {"by": "decompress", "seq": event["seq"], "context": "main"}
    again = api.post("/api/context-governance/compress", json={"instance_id": iid, "action": "decompress"})
    assert again.status_code == 400 and compression["snapshot_id"] in again.json()["error"]["message"]
    # the undo is a tape event like any: the tape alone rebuilds main as it is now
    tape = api.get(f"/api/instances/{iid}/tape").json()["events"]
    assert dict(LayeredContext.replay(tape).layer(Layer.HISTORY)) == history

    # without a snapshot id, main's latest compression is that branch's (it is main's history now)
    doc = _started_postmortem(api)
    undone = api.post("/api/context-governance/compress", json={"instance_id": doc["instance_id"], "action": "decompress"})
    assert undone.status_code == 200, undone.text
    assert "log_line_00" in api.get(f"/api/instances/{doc['instance_id']}").json()["layers"]["L3"]


def test_rest_snapshot_inject_rollback_replay_and_the_person_finishes(api: httpx.Client) -> None:
    doc = _started_postmortem(api)
    iid = doc["instance_id"]
    snap = api.post("/api/context-governance/snapshot", json={"instance_id": iid})
    assert snap.status_code == 200, snap.text
    snap_id, seq = snap.json()["snapshot_id"], snap.json()["seq"]
    injected = api.post("/api/context-governance/inject", json={"instance_id": iid, "key": "severity", "value": "sev5",
                                                                 "reason": "typo"})
    assert injected.status_code == 200 and injected.json()["written"] == {"severity": "L3"}
    rolled = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": snap_id,
                                                                "layers": ["L3"], "reason": "typo undone"})
    assert rolled.status_code == 200, rolled.text
    assert api.get(f"/api/instances/{iid}").json()["layers"]["L3"]["severity"] == "sev1"
    replay = api.get(f"/api/instances/{iid}/replay", params={"context": "main", "until": seq}).json()
    shown = {k["key"]: k["value"] for k in replay["layers"]["L3"]["keys"]}
    assert shown["severity"] == "sev1" and replay["event"]["kind"] == "snapshot"
    done = api.post(f"/api/instances/{iid}/user-tasks/Activity_write_postmortem", json={"data": {"action_items": ["x"]}})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "completed" and done.json()["completed_user_task"]["task_id"] == "Activity_write_postmortem"


def test_rest_supplier_started_with_answers_and_settled_by_a_confirmation(api: httpx.Client) -> None:
    started = api.post("/api/instances", json={"process_id": "supplier_onboarding", "data": supplier(needs_contract=False),
                                                "answers": {"user_tasks": {"Activity_compliance_review": {
                                                    "onboarding_decision": "rework"}}}})
    assert started.status_code == 201, started.text
    doc = started.json()
    iid = doc["instance_id"]
    assert [w["id"] for w in doc["waiting_for"]] == [JOIN_Q]
    assert doc["conflicts"][0]["values"] == {"Activity_compliance_review": "rework", "Activity_finance_review": "approve"}
    pending = api.get("/api/confirmations").json()
    assert any(c["id"] == JOIN_Q and c.get("instance_id", iid) == iid for c in pending)
    answered = api.post(f"/api/confirmations/{JOIN_Q}", json={"value": "approve", "instance_id": iid, "user": "olu"})
    assert answered.status_code == 200, answered.text
    doc = api.get(f"/api/instances/{iid}").json()
    assert doc["status"] == "completed" and doc["layers"]["L3"]["vendor_number"] == "V-S-311"
    again = api.post(f"/api/confirmations/{JOIN_Q}", json={"value": "rework", "instance_id": iid})
    assert again.status_code == 409 and again.json()["error"]["kind"] == "already_answered"


def test_entries_one_branch_counted_and_another_folded_stay_removed(tmp_path: Path) -> None:
    for name in ("incident_postmortem.bpmn", "postmortem_handlers.py"):
        (tmp_path / name).write_text((HERE / name).read_text())
    config = (HERE / "incident_postmortem.layerflow.yaml").read_text()
    (tmp_path / "incident_postmortem.layerflow.yaml").write_text(config + "  compressTokenThreshold: 250\n")
    engine = Engine("memory://")
    instance = engine.run(load_process(tmp_path / "incident_postmortem.bpmn"), {})
    instance = engine.send_event(instance, "incident_closed", {"incident_id": "I-1", "service": "s", "severity": "sev2"})
    assert [c["activity_id"] for c in instance.compressions] == ["Activity_root_cause", "Activity_customer_impact"]
    history = dict(instance.main.layer(Layer.HISTORY))
    assert history["summary:count:log_line"]["count"] == 12
    # every branch that removed the old log lines compressed them: a compression, not a decision
    assert [k for k in history if k.startswith("log_line_")] == []
