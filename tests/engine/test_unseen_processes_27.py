"""Outsider round 27: two processes nobody here had seen, written from DESIGN.md and README.md only
(tests/engine/unseen27/), driven through the Python API, the CLI, a real server on Redis (database 8) and
a worker.

customs_declaration + goods_inspection (two files, `run main.bpmn called.bpmn`): a broker lodges an
  import declaration (`declaration_ref` preserved); a call activity runs the customs office's
  goods_inspection process of the other file, whose parallel split gives each desk its `desk` by
  contextInject: the tariff desk computes the duty and holds goods over 50000 EUR, the documents desk
  holds goods without an origin certificate; the join (configured by the called file's
  goods_inspection.layerflow.yaml) appends the desks' notes and puts a disagreement on `hold_required`
  to the customs officer (humanConfirm, default true, two days); the main process then releases or
  holds the goods by an XOR on `hold_required`. Submitted to a worker; cancelled while the officer is
  asked; its join reconfigured through REST while the question is open.

food_complaint: a consumer complaint about a packaged food; a model activity (`llm:` with an offline
  handler file) classifies it; an XOR triage whose branches are sentences (config `branches`) with BPMN
  expressions as fallback sends a possible hazard to the quality manager (a user task) and the rest to
  customer care. Run with the stub OpenAI-compatible server behind a real `layerflow serve --model`
  (the model takes the branch the expressions would not: `condition_disagreement`), reconfigured through
  REST while the review waits (a token threshold: a cliff summarized by the model), and rolled back
  while it waits, then resumed.

Expected before anything ran: as README says; in particular a cancelled instance closes what it waited
for: the confirmation (`"cancelled": true`), its conflict (`"resolution": null, "cancelled": true`),
`waiting_for` empty; and, as for the branches an interrupting event cancels, the branches of the join
nobody will reach any more; an answer after the cancel is refused as such (README: "answers ... are
refused after it", 409).

Found: `layerflow cancel` (and REST cancel, `Engine.cancel`) closed the confirmation but left the
branch contexts of the join it asked for `"status": "open"` in `contexts`, as if a join were still to
merge them, with no `cancelled` note on their tapes. The officer's late answer
(`POST /api/confirmations/{id}`, with or without `instance_id`, and `resolve`) got 404 "no open
confirmation ... open: none", as if there never was a question, not 409 naming who cancelled and why;
the same for a confirmation an interrupting event closed in an instance that goes on.
Documentation gap (README now says): a REST `config` change of a join's `humanConfirm` applies to the
questions it asks after; an open confirmation keeps its default and deadline (the timeout proves it).
Misread at first (the engine is right): `resolve` needs a `reason`; `tape --json` is a list of events
and a branch's cancel is a `note` (`"note": "cancelled"`); a rollback of a waiting instance also takes
the keys its activities preserved (a rollback is no compressor), and `resume --set` gives one back.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import AnswerArgs, ConfigArgs, GovernanceService, InstanceStateError

from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json, serving_catalog
from stub_llm import Reply, StubLLM
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "unseen27"
CUSTOMS, INSPECTION = HERE / "customs_declaration.bpmn", HERE / "goods_inspection.bpmn"
ROOT = Path(__file__).resolve().parents[2]
REDIS_DB8 = "redis://127.0.0.1:6379/8"   # this round's database on the shared Redis
TOKEN = "outsider-27"
LINES = [{"hs_code": "847130", "value": 18000}, {"hs_code": "940360", "value": 4000}]
COMPLAINT = HERE / "food_complaint.bpmn"
GLASS = {"ticket_no": 5521, "product": {"sku": "GRAN-500", "batch": "L2611"},
         "complaint_text": "Found a piece of glass in the granola"}
T0 = 1_800_000_000.0
DISPUTED = {"declaration_no": 7781, "origin_certificate": False, "lines": LINES}   # tariff: clear; documents: hold


def _lodge(cli: Any, data: dict[str, Any], code: int = 3) -> dict[str, Any]:
    doc = run_json(cli, "run", str(CUSTOMS), str(INSPECTION), "--data", json.dumps(data), code=code)
    check_run_document(doc)
    return doc


def _branch_statuses(doc: dict[str, Any]) -> dict[str, str]:
    return {c["branch_id"]: c["status"] for c in doc["contexts"].values()}


# ===== the customs declaration: a join inside a call activity asks the officer ======================

def test_the_desks_disagree_inside_the_called_process_and_the_officer_holds_the_goods(cli: Any) -> None:
    doc = _lodge(cli, DISPUTED)
    assert [(w["kind"], w["id"]) for w in doc["waiting_for"]] == [("confirmation", "inspection_join/hold_required")]
    [conflict] = doc["conflicts"]
    assert conflict["values"] == {"tariff_check": False, "document_check": True} and conflict["resolution"] is None
    [asked] = doc["confirmations"]
    assert asked["message"].startswith("The tariff and documents desks disagree") and asked["default"] is True
    assert _branch_statuses(doc) == {"tariff_check": "open", "document_check": "open"}
    done = run_json(cli, "resume", doc["instance_id"], "--answer", "inspection_join/hold_required=true")
    history = done["layers"]["L3"]
    assert (history["clearance"], history["amount_payable"], history["duty_due"]) == ("held", 0, 2640.0)
    assert history["inspection_notes"] == ["tariff: tariff", "documents: documents"]
    assert "desk" not in history and "desk" not in done["layers"]["L4"]
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    assert _branch_statuses(done) == {"tariff_check": "joined", "document_check": "joined"}


def test_the_desks_agree_and_the_goods_are_released_with_the_duty(cli: Any) -> None:
    doc = _lodge(cli, dict(DISPUTED, origin_certificate=True), code=0)
    history = doc["layers"]["L3"]
    assert (history["clearance"], history["amount_payable"], history["hold_required"]) == ("released", 2640.0, False)
    assert doc["conflicts"] == [] and doc["confirmations"] == []


def test_cancelling_while_the_officer_is_asked_closes_the_question_and_the_branches(cli: Any) -> None:
    doc = _lodge(cli, DISPUTED)
    iid = doc["instance_id"]
    cancelled = run_json(cli, "cancel", iid, "--reason", "broker withdrew the declaration")
    assert cancelled["status"] == "cancelled" and cancelled["waiting_for"] == []
    [conflict] = cancelled["conflicts"]
    assert conflict["resolution"] is None and conflict["cancelled"] is True
    [asked] = cancelled["confirmations"]
    assert asked["cancelled"] is True and asked["answer"] is None
    # nobody will merge the desks' contexts any more: they say so, as a cancelling event's branches do
    assert _branch_statuses(cancelled) == {"tariff_check": "cancelled", "document_check": "cancelled"}
    for name in cancelled["contexts"]:
        events: Any = run_json(cli, "tape", iid, "--context", name, "--kind", "cancelled")
        assert [(e["kind"], e["data"]["note"], e["actor"]) for e in events] == [("note", "cancelled", "cli")], events
    late = cli("resume", iid, "--answer", "inspection_join/hold_required=true", "--json")
    assert late.exit_code == 2 and "was cancelled" in json.loads(late.stdout)["error"]["message"]


class Clock:
    """The engine's clock (``Engine(clock=...)``), moved by the test."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def test_a_config_change_while_the_officer_is_asked_leaves_the_open_question_as_asked() -> None:
    """README: an open confirmation keeps the options, default and deadline it was asked with; a
    runtime `config` change of the join (default false, one minute) is recorded and changes nothing
    of it: two days later the timeout gives the default it was asked with."""
    clock = Clock()
    engine = Engine("memory://", clock=clock)
    waiting = engine.run(engine.start(load_process([CUSTOMS, INSPECTION]), DISPUTED))
    [asked] = waiting.confirmations
    changed = GovernanceService(engine).config(waiting.id, ConfigArgs(
        activity_id="inspection_join", config={"humanConfirm": {"default": False, "timeout": 60}}))
    assert (changed["previous"]["humanConfirm"]["default"], changed["config"]["humanConfirm"]["timeout"]) == (True, 60)
    clock.now += 120
    assert engine.resume(waiting.id).status == "waiting"
    clock.now += 2 * 86400
    done = engine.resume(waiting.id)
    assert done.status == "completed", done.error
    assert (done.main.resolve("hold_required"), done.main.resolve("clearance")) == (True, "held")
    [conflict] = done.conflicts
    assert conflict["resolution"]["resolver"] == "policy" and "172800s" in conflict["resolution"]["reason"]
    [note] = done.main.tape.filter(kind="config")
    assert note.data["change"] == {"humanConfirm": {"default": False, "timeout": 60.0}}



def test_an_answer_to_a_question_an_interrupting_event_closed_is_refused_as_closed() -> None:
    """The same for a confirmation whose join a boundary event cancelled while the instance goes on
    (round 26's tender: a sanctioned vendor ends the bidding while another bid's join asks the buyer)."""
    tender = Path(__file__).resolve().parent / "unseen26" / "vendor_tender.bpmn"
    vendors = [{"name": "Acme", "price": 42000, "lead_days": 20}, {"name": "Borealis", "price": 39000, "lead_days": 45},
               {"name": "Cobalt", "price": 47000, "lead_days": 10}]
    engine = Engine("memory://")
    waiting = engine.run(engine.start(load_process(tender), {"tender_no": 77, "vendors": vendors,
                                                             "sanctions_list": ["Cobalt"]}))
    assert [w["task_id"] for w in waiting.waiting_for] == ["compliance_review"]
    for instance_id in (waiting.id, None):
        with pytest.raises(InstanceStateError, match="'bid_join/bid_ok' of instance .* was cancelled with its join"):
            GovernanceService(engine).answer("bid_join/bid_ok", AnswerArgs(value=False, instance_id=instance_id))


# ===== the food complaint: rollback of a waiting instance, then resume =============================

def test_rolling_back_a_waiting_complaint_then_resuming_names_the_key_the_rollback_took(cli: Any) -> None:
    doc = run_json(cli, "run", str(COMPLAINT), "--data", json.dumps(GLASS), code=3)
    check_run_document(doc)
    iid = doc["instance_id"]
    assert [w["task_id"] for w in doc["waiting_for"]] == ["quality_review"]
    assert (doc["layers"]["L3"]["hazard_type"], doc["layers"]["L3"]["illness_reported"]) == ("foreign_object", False)
    snaps = cli("snapshot", iid, "--list")
    assert "snap:main:3\tmain#3\tbefore log_complaint" in snaps.stdout, snaps.stdout
    rolled = run_json(cli, "rollback", iid, "--snapshot", "snap:main:3", "--reason", "classification rerun")
    assert rolled["restored_layers"] == ["L2", "L3", "L4", "L5"]
    after = run_json(cli, "inspect", iid)
    assert after["status"] == "waiting" and after["layers"]["L3"] == {}   # the preserved keys went back too
    failed = run_json(cli, "resume", iid, "--answer", 'quality_review={"recall_started": true}', code=1)
    assert failed["error"]["task_id"] == "close_complaint" and "'batch_code'" in failed["error"]["message"]
    done = run_json(cli, "resume", iid, "--set", "batch_code=L2611")
    history = done["layers"]["L3"]
    assert (history["outcome"], history["recall_started"]) == ("recall L2611", True)
    [restore] = run_json(cli, "tape", iid, "--kind", "restore")  # type: ignore[misc]
    assert restore["data"]["reason"] == "classification rerun"


# ===== REST: a real server on a Redis store =======================================================

def _serving(store: str, log: Path, *args: str, **env: str) -> Any:
    """``layerflow serve --port 0`` with the catalog unseen27/ on ``store`` (extra ``args`` and
    environment); the client carries the token."""
    return serving_catalog(HERE, store, log, TOKEN, *args, **env)


@pytest.fixture(name="store")
def redis_store() -> Iterator[str]:
    """Database 8 under a prefix of the test's own (its keys removed afterwards)."""
    with redis_scratch(REDIS_DB8, "outsider27") as prefix:
        yield f"{REDIS_DB8}?prefix={prefix}"


def test_rest_a_late_answer_to_a_cancelled_declaration_is_refused_as_cancelled(store: str, tmp_path: Path,
                                                                                cli: Any) -> None:
    with _serving(store, tmp_path / "serve.err") as api:
        started = api.post("/api/instances", json={"process_id": "customs_declaration", "data": DISPUTED})
        assert started.status_code == 201, started.text
        iid = started.json()["instance_id"]
        # a config change while the officer is asked: recorded, but the question keeps what it was asked with
        changed = api.post("/api/context-governance/config", json={
            "instance_id": iid, "config": {"activityId": "inspection_join", "humanConfirm": {"default": False}}})
        assert changed.status_code == 200 and changed.json()["config"]["humanConfirm"]["default"] is False
        [asked] = api.get("/api/confirmations").json()
        assert (asked["id"], asked["instance_id"], asked["default"]) == ("inspection_join/hold_required", iid, True)
        cancelled = api.post(f"/api/instances/{iid}/cancel", json={"reason": "broker withdrew the declaration"})
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        assert {c["status"] for c in cancelled.json()["contexts"].values()} == {"cancelled"}
        assert api.get("/api/confirmations").json() == []
        # the officer's answer comes late: the instance was cancelled (409, who and why), not "no such question"
        for body in ({"value": True, "instance_id": iid}, {"value": True}):
            late = api.post("/api/confirmations/inspection_join/hold_required", json=body)
            assert late.status_code == 409, late.text
            error = late.json()["error"]
            assert error["kind"] == "invalid_state" and "cancelled" in error["message"], error
            assert "broker withdrew the declaration" in error["message"] and iid in error["message"]
        resolved = api.post("/api/context-governance/resolve", json={
            "instance_id": iid, "confirmation_id": "inspection_join/hold_required", "resolution": True,
            "reason": "physical inspection found nothing"})
        assert resolved.status_code == 409 and "cancelled" in resolved.json()["error"]["message"], resolved.text
    # the CLI reads what the server ran: one store
    doc = run_json(cli, "inspect", iid, "--store", store)
    assert doc["status"] == "cancelled" and doc["conflicts"][0]["cancelled"] is True


def test_rest_the_model_triages_against_the_expressions_and_a_config_change_waits_for_the_review(
        store: str, tmp_path: Path) -> None:
    """A real server with a model (the stub OpenAI-compatible server): the model classifies the
    complaint as a taste problem, which the expressions send to customer care, but decides the triage
    sentence for the quality manager (a rash): followed, and noted `condition_disagreement`. While the
    manager's review waits, a `config` change gives close_complaint a token threshold: the cliff after
    it is summarized by the model."""
    rash = dict(GLASS, ticket_no=5522, complaint_text="My daughter got a rash after the granola; it tastes odd")
    with StubLLM() as stub:
        stub.push(Reply.json({"hazard_type": "quality", "illness_reported": False}),
                  Reply.json({"branch": "quality_review", "rationale": "a rash after eating it is a possible allergy"}))
        with _serving(store, tmp_path / "serve.err", "--model", "openai/stub",
                      LAYERFLOW_MODEL_API_BASE=stub.url, LAYERFLOW_MODEL_API_KEY="test") as api:
            started = api.post("/api/instances", json={"process_id": "food_complaint", "data": rash})
            assert started.status_code == 201, started.text
            doc = started.json()
            iid = doc["instance_id"]
            assert [w["task_id"] for w in doc["waiting_for"]] == ["quality_review"] and doc["model_fallbacks"] == []
            assert doc["layers"]["L3"]["hazard_type"] == "quality"
            [note] = api.get(f"/api/instances/{iid}/tape", params={"kind": "condition_disagreement"}).json()["events"]
            assert (note["data"]["followed"], note["data"]["followed_by"], note["data"]["expression_branch"]) == (
                "quality_review", "model", "standard_reply")
            changed = api.post("/api/context-governance/config", json={
                "instance_id": iid, "config": {"activityId": "close_complaint", "compressTokenThreshold": 50},
                "reason": "long complaints"})
            assert changed.status_code == 200 and changed.json()["previous"]["compressTokenThreshold"] is None
            stub.push(Reply.text("FC-5522: quality complaint, rash reported; reviewed by Q. Manager."))
            reviewed = api.post(f"/api/instances/{iid}/user-tasks/quality_review",
                                json={"data": {"recall_started": True, "reviewer": "Q. Manager"}})
            assert reviewed.status_code == 200, reviewed.text
            done = reviewed.json()
            assert done["status"] == "completed" and done["model_fallbacks"] == [], done["model_fallbacks"]
            [cliff] = done["compressions"]
            assert cliff["activity_id"] == "close_complaint" and "token_threshold" in cliff["triggers"]
            history = done["layers"]["L3"]
            assert history["compaction:1"]["summary"].startswith("FC-5522: quality complaint")
            assert (history["complaint_ref"], history["batch_code"], history["outcome"]) == (
                "FC-5522", "L2611", "recall L2611")   # preserved through the cliff
            assert "hazard_type" not in history
        assert len(stub.requests) == 3
        assert "a possible safety hazard" in json.dumps(stub.requests[1]["messages"])


def test_a_worker_on_database_8_runs_a_submitted_declaration_to_the_officers_question(store: str, cli: Any) -> None:
    stream = store.rsplit("=", 1)[1] + "ready"   # the stream of this test's own (no ':' in it)
    submitted = run_json(cli, "submit", str(CUSTOMS), str(INSPECTION), "--data", json.dumps(DISPUTED), "--store", store,
                         "--stream", stream)
    [iid] = submitted["instance_ids"]
    assert run_json(cli, "inspect", iid, "--store", store)["status"] == "running"
    ran = run_json(cli, "worker", "--store", store, "--stream", stream, "--stop-after", "1", "--timer-interval", "0")
    assert (ran["ran"], ran["statuses"]) == (1, {"waiting": 1})
    doc = run_json(cli, "inspect", iid, "--store", store)
    assert [w["id"] for w in doc["waiting_for"]] == ["inspection_join/hold_required"]
    done = run_json(cli, "resume", iid, "--store", store, "--answer", "inspection_join/hold_required=false")
    assert (done["layers"]["L3"]["clearance"], done["layers"]["L3"]["amount_payable"]) == ("released", 2640.0)
