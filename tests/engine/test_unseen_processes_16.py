"""Unseen processes, round 16, written by an outsider who read DESIGN.md and the README only; every
expectation below was written down from those two before anything ran.

purchase_order (tests/engine/unseen16/purchase_order.bpmn): a model step classifies the spend; an
inclusive gateway runs the reviews the order needs (legal for a new vendor, security for personal
data, finance over 50,000; a standard check, its default, otherwise) into an inclusive join; the
legal and the security reviewer, both model steps (offline: handlers), rate `risk_rating`
differently, and the join asks a person (`humanConfirm`, ten minutes, default `high`): answered in
advance (`--answers`), through REST, or by the timeout's default. A high risk holds the order.

protocol_amendment: a clinical-trial protocol amendment is drafted, reviewed by every trial site at
once (a parallel multi-instance task, one result per site), compiled (compression: `preserveKeys`,
an attention threshold, an `extract_keys` rule over the sites' results and a `summarize` rule over
the amendment's text), then approved by the IRB (a person); a non-interrupting timer event
sub-process reminds the IRB after an hour. Rolled back and replayed through the CLI and REST.

churn_retention: a churn case scored by a model step (offline: a handler), analysed in two parallel
branches (a `union` reducer, a policy ranking), then an account manager's call (a user task answered
through REST on a real `layerflow serve`), a two-second cooling-off timer and the outcome; run by two
`layerflow worker` processes on Redis, checked with `inspect` and `tape` afterwards."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from context_layers import Layer, LayeredContext
from engine import Engine, load_process
from engine.api import create_app
from engine.worker import AT_REST

import test_unseen_processes_4
from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json
from test_unseen_processes import _check_document
from test_unseen_processes_13 import Clock, data_of  # a clock of the test's own; a layer's data keys, no records

HERE = Path(__file__).resolve().parent / "unseen16"
ROOT = Path(__file__).resolve().parents[2]
PO = HERE / "purchase_order.bpmn"
TRIAL = HERE / "protocol_amendment.bpmn"
CHURN = HERE / "churn_retention.bpmn"
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN16", "redis://127.0.0.1:6379/10")  # this module's own database
fake_model = test_unseen_processes_4.fake_model  # the deterministic fake model's fixture, shared
cli = cli_in_a_tmp_store  # the in-process CLI's fixture, shared

ORDER = {"po_id": "PO-501", "vendor": "Nimbus CRM", "item": "CRM licences", "amount": 80000,
         "budget_remaining": 120000, "new_vendor": True, "personal_data": True}
RISK_CONFLICT = {"gateway_id": "review_join", "layer": "L4", "key": "risk_rating", "base_value": None,
                 "base_absent": True, "values": {"legal_review": "medium", "security_review": "high"},
                 "context": "main"}


def _rest(engine: Engine) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(create_app(engine, HERE, "t0k"), headers={"Authorization": "Bearer t0k"})


# ------------------------------------------------------------------ the purchase order: one question, three ways


def test_the_order_waits_for_a_person_at_the_inclusive_join(cli: Any, tmp_path: Path) -> None:
    """legal, security and finance ran (the standard check, the default, did not); nothing of the
    reviews is in the main context while the join waits; one conflict, one question offering both
    ratings (the default `high` is one of them, offered once) and `$escalate`."""
    store = f"sqlite:///{tmp_path / 'po.db'}"
    doc = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), "--store", store, code=3)
    _check_document(doc, 3, "purchase_order")
    assert doc["layers"]["L0"] == {"policy": "Purchases from new vendors or with personal data need a legal or "
                                             "security review."}
    assert doc["layers"]["L1"] == ORDER
    assert data_of(doc["layers"]["L3"]) == {"spend_class": "software"}
    assert doc["conflicts"] == [{**RISK_CONFLICT, "resolution": None, "context": "main"}]
    [asked] = doc["confirmations"]
    assert (asked["id"], asked["type"], asked["answer"], asked["timed_out"], asked["default"]) == (
        "review_join/risk_rating", "conflict_resolution", None, False, "high")
    assert [o["value"] for o in asked["options"]] == ["medium", "high", "$escalate"]
    assert "legal_review" in asked["message"] and "security_review" in asked["message"]
    [wait] = doc["waiting_for"]
    assert (wait["kind"], wait["id"], wait["task_id"]) == ("confirmation", "review_join/risk_rating", "review_join")
    branches = {info["branch_id"] for info in doc["contexts"].values()}
    assert branches == {"legal_review", "security_review", "finance_review"}
    assert all(info["gateway"] == "review_routing" and info["status"] == "open" for info in doc["contexts"].values())


def test_answers_given_in_advance_settle_the_rating_and_issue_the_order(cli: Any, tmp_path: Path) -> None:
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"confirmations": {"review_join/risk_rating": "medium"}}))
    doc = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), "--answers", str(answers),
                   "--store", f"sqlite:///{tmp_path / 'po.db'}")
    _check_document(doc, 0, "purchase_order")
    history = doc["layers"]["L3"]
    assert data_of(history) == {"spend_class": "software", "risk_rating": "medium", "budget_ok": True,
                                "legal_note": "standard terms with Nimbus CRM",
                                "security_note": "the vendor stores customer emails outside the EU",
                                "po_status": "issued:medium"}
    assert "activity:standard_check" not in history and "activity:hold_po" not in history
    [conflict] = doc["conflicts"]
    assert conflict == {**RISK_CONFLICT, "resolution": conflict["resolution"]}
    assert (conflict["resolution"]["value"], conflict["resolution"]["resolver"]) == ("medium", "human")
    [asked] = doc["confirmations"]
    assert (asked["answer"], asked["timed_out"]) == ("medium", False)
    [logged] = history["_mergedConflicts"]
    assert (logged["key"], logged["conflictingValues"], logged["sourceBranches"]) == (
        "risk_rating", ["medium", "high"], ["legal_review", "security_review"])


@pytest.mark.parametrize("answers, named", [
    ({"confirmations": {"review_join/risk_rating": "low"}}, "'low'"),           # not an offered option
    ({"confirmations": {"review_joins/risk_rating": "high"}}, "review_joins"),   # a typo of the join's id
    ({"user_tasks": {"cfo_signoff": {"ok": True}}}, "cfo_signoff")])            # no such element
def test_answers_that_can_fit_nothing_are_bad_input(cli: Any, tmp_path: Path, answers: dict[str, Any],
                                                    named: str) -> None:
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(answers))
    store = f"sqlite:///{tmp_path / 'po.db'}"
    result = cli("run", str(PO), "--data", json.dumps(ORDER), "--answers", str(path), "--store", store, "--json")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    doc = json.loads(result.stdout)
    assert doc["status"] == "error" and doc["error"]["kind"] == "invalid_answer"
    assert named in doc["error"]["message"], doc["error"]["message"]


def test_the_purchasing_lead_answers_through_rest_and_the_order_is_held(tmp_path: Path) -> None:
    engine = Engine(f"sqlite:///{tmp_path / 'po.db'}")
    client = _rest(engine)
    started = client.post("/api/instances", json={"process_id": "purchase_order", "data": ORDER})
    assert started.status_code == 201, started.text
    iid = started.json()["instance_id"]
    pending = client.get("/api/confirmations").json()
    [mine] = [c for c in (pending if isinstance(pending, list) else pending["confirmations"])
              if c.get("instance_id") == iid]
    assert mine["id"] == "review_join/risk_rating" and [o["value"] for o in mine["options"]] == [
        "medium", "high", "$escalate"]
    wrong = client.post("/api/confirmations/review_join%2Frisk_rating", json={"value": "low", "instance_id": iid})
    assert wrong.status_code == 400 and wrong.json()["error"]["kind"] == "invalid_answer"
    answered = client.post("/api/confirmations/review_join%2Frisk_rating", json={"value": "high", "instance_id": iid})
    assert answered.status_code == 200, answered.text
    doc = answered.json()
    assert doc["status"] == "completed" and doc["layers"]["L3"]["po_status"] == "on_hold"
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"
    again = client.post("/api/confirmations/review_join%2Frisk_rating", json={"value": "medium", "instance_id": iid})
    assert again.status_code == 409
    [decided] = client.get(f"/api/instances/{iid}/tape", params={"kind": "human_decision"}).json()["events"]
    assert decided["data"]["value"] == "high" and decided["data"]["confirmation_id"] == "review_join/risk_rating"


def test_nobody_answers_and_the_default_holds_the_order_after_ten_minutes(tmp_path: Path) -> None:
    clock = Clock(float(int(time.time())))
    engine = Engine(f"sqlite:///{tmp_path / 'po.db'}", clock=clock)
    waiting = engine.run(load_process(PO), ORDER)
    [wait] = waiting.waiting_for
    assert wait["due"] == time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(clock.now + 600))
    clock.now += 599
    assert engine.run(engine.load(waiting.id)).status == "waiting"
    assert [(t["kind"] if "kind" in t else "confirmation") for t in engine.due_timers()] == []
    clock.now += 1
    assert len(engine.due_timers()) == 1
    done = engine.run(engine.load(waiting.id))
    assert done.status == "completed", done.error
    doc = done.to_document()
    assert [(c["id"], c["answer"], c["timed_out"]) for c in doc["confirmations"]] == [
        ("review_join/risk_rating", "high", True)]
    assert doc["layers"]["L3"]["po_status"] == "on_hold"
    assert doc["conflicts"][0]["resolution"]["value"] == "high"
    assert LayeredContext.replay(done.main.tape) == done.main


@pytest.mark.parametrize("change, ran, status", [
    ({"new_vendor": False, "personal_data": False, "amount": 900}, "standard_check", "issued:low"),
    ({"new_vendor": True, "personal_data": False, "amount": 900}, "legal_review", "issued:medium"),
    ({"new_vendor": False, "personal_data": True, "amount": 900}, "security_review", "on_hold")])
def test_one_review_alone_asks_nobody(cli: Any, change: dict[str, Any], ran: str, status: str) -> None:
    doc = run_json(cli, "run", str(PO), "--data", json.dumps({**ORDER, **change}), "--store", "memory://")
    assert doc["conflicts"] == [] and doc["confirmations"] == []
    history = doc["layers"]["L3"]
    assert history["po_status"] == status
    reviews = {"standard_check", "legal_review", "security_review", "finance_review"}
    assert {k.split(":", 1)[1] for k in history if k.startswith("activity:")} & reviews == {ran}


def _reviewers(escalate: bool) -> Any:
    def answer(request: dict[str, Any]) -> str:
        text = "\n".join(m["content"] for m in request["messages"])
        if '"final_value"' in text:
            return json.dumps({"final_value": "medium", "rationale": "the contract caps the data the vendor sees",
                               "escalate": escalate})
        if "Review the vendor contract" in text:
            return json.dumps({"risk_rating": "low", "legal_note": "model: standard terms"})
        if "Review what data the vendor gets" in text:
            return json.dumps({"risk_rating": "high", "security_note": "model: emails leave the EU"})
        return json.dumps({"spend_class": "software"})
    return answer


def test_with_a_model_the_reviewers_disagree_and_an_unsure_model_leaves_it_to_a_person(
        cli: Any, fake_model: Any, tmp_path: Path) -> None:
    """`--model`: the three `llm:` steps ask the model (not the handlers); the join asks the model
    (DESIGN: policy, then the model, then a person); the model is unsure (`escalate`), so its value is
    the person's suggestion, and `resume --yes` takes it."""
    model = fake_model(_reviewers(escalate=True))
    store = f"sqlite:///{tmp_path / 'po.db'}"
    doc = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), "--model", "fake/model", "--store", store, code=3)
    assert len(model.requests) == 4
    assert doc["conflicts"] == [{**RISK_CONFLICT, "values": {"legal_review": "low", "security_review": "high"},
                                 "resolution": None, "context": "main"}]
    [asked] = doc["confirmations"]
    assert (asked["suggested"], asked["suggested_by"]) == ("medium", "model")
    assert [o["value"] for o in asked["options"]] == ["low", "high", "medium", "$escalate"]
    done = run_json(cli, "resume", doc["instance_id"], "--yes", "--model", "fake/model", "--store", store)
    assert done["layers"]["L3"]["po_status"] == "issued:medium"
    assert done["layers"]["L3"]["legal_note"] == "model: standard terms"
    resolution = done["conflicts"][0]["resolution"]
    assert (resolution["value"], resolution["resolver"]) == ("medium", "human")


def test_with_a_sure_model_nobody_is_asked(cli: Any, fake_model: Any) -> None:
    fake_model(_reviewers(escalate=False))
    doc = run_json(cli, "run", str(PO), "--data", json.dumps(ORDER), "--model", "fake/model", "--store", "memory://")
    assert doc["confirmations"] == [] and doc["layers"]["L3"]["po_status"] == "issued:medium"
    resolution = doc["conflicts"][0]["resolution"]
    assert resolution == {"value": "medium", "resolver": "model", "reason": resolution["reason"]}
    assert "caps the data" in resolution["reason"]


# ------------------------------------------------------------------ the protocol amendment: sites, compression, rollback

AMENDMENT = {"trial_id": "CT-88", "amendment_id": "AM-3", "sites": ["BER", "PAR", "MAD"],
             "change_summary": "dose escalation moves from week 4 to week 6"}
SITE_ROWS = [{"site": "BER", "accepted": True}, {"site": "PAR", "accepted": True}, {"site": "MAD", "accepted": False}]


def _trial_waiting(doc: dict[str, Any]) -> dict[str, Any]:
    """What a run of the amendment shows while the IRB has not answered; its one compression."""
    _check_document(doc, 3, "protocol_amendment")
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "irb_approval"),
                                                                       ("timer", "reminder_due")]
    assert doc["waiting_for"][0]["documentation"] == "Approve or reject the protocol amendment."
    history = doc["layers"]["L3"]
    # each site's instance wrote its own result; only the collection comes back, in the sites' order
    assert not {"site", "site_result"} & set(history)
    assert history["site_results"] == SITE_ROWS                  # the extract_keys rule kept site and accepted
    assert (history["amendment_version"], history["accepted_sites"], history["objections"]) == (2, ["BER", "PAR"],
                                                                                                ["MAD"])
    text = history["amendment_text"]
    assert text["_compressed"] == "summarize" and len(text["summary"].split()) <= 30
    [c] = doc["compressions"]
    assert (c["activity_id"], c["context"], c["triggers"]) == ("compile_reviews", "main", ["density"])
    assert c["tokens_before"] > c["tokens_after"] == doc["tokens"]["L3"] + doc["tokens"]["L4"]
    assert c["attention_before"]["density"] < 0.5 and c["snapshot_id"].startswith("snap:")
    assert c["missing_paths"] == {}
    assert {r["pattern"]: r["entries"] for r in c["rules"]} == {"site_results": 1, "amendment_text": 1}
    return c


def test_the_sites_review_the_amendment_and_the_compilation_compresses(cli: Any, tmp_path: Path) -> None:
    """run (3) -> rollback of the compression through the CLI (the context as before it, on the tape)
    -> replay before and after -> the IRB's approval (0): the sites that accepted are notified."""
    store = f"sqlite:///{tmp_path / 'trial.db'}"
    doc = run_json(cli, "run", str(TRIAL), "--data", json.dumps(AMENDMENT), "--store", store, code=3)
    c = _trial_waiting(doc)
    iid = doc["instance_id"]
    before = run_json(cli, "replay", iid, "--until", str(c["event_seq"] - 1), "--store", store)
    assert before["layers"]["L3"]["site_results"][0]["note"].startswith("Site BER read amendment 2 of CT-88")
    assert before["layers"]["L3"]["amendment_text"].startswith("Section 1 of trial CT-88 changes: dose")
    assert run_json(cli, "replay", iid, "--store", store)["layers"] == doc["layers"]

    listed = cli("tape", iid, "--kind", "compression", "--store", store, "--json")
    [event] = json.loads(listed.stdout)
    assert (event["seq"], event["actor"]) == (c["event_seq"], "compile_reviews")
    rolled = cli("rollback", iid, "--snapshot", c["snapshot_id"], "--store", store, "--json")
    assert rolled.exit_code == 0, rolled.stderr
    after = run_json(cli, "inspect", iid, "--store", store)
    assert after["status"] == "waiting" and after["tape_length"] == doc["tape_length"] + 2   # restore, its note
    assert after["layers"]["L3"] == before["layers"]["L3"]
    [restore] = json.loads(cli("tape", iid, "--kind", "rollback", "--store", store, "--json").stdout)
    assert restore["data"]["snapshot_id"] == c["snapshot_id"]

    done = run_json(cli, "resume", iid, "--answer", 'irb_approval={"irb_approved": true}', "--store", store)
    history = done["layers"]["L3"]
    assert history["notification"] == "Amendment 2 of CT-88 approved for BER, PAR"
    assert "irb_reminded" not in history and "activity:remind_irb" not in history     # its timer never came
    main = Engine(store).load(iid).main
    assert LayeredContext.replay(main.tape) == main


def test_a_rollback_before_the_compilation_loses_its_keys_and_resume_set_gives_them_back(cli: Any,
                                                                                        tmp_path: Path) -> None:
    """README: a rollback puts a context back, the process does not go back with it; a later step that
    reads a key it removed fails naming it, and `resume --set` gives it back."""
    store = f"sqlite:///{tmp_path / 'trial.db'}"
    iid = run_json(cli, "run", str(TRIAL), "--data", json.dumps(AMENDMENT), "--store", store, code=3)["instance_id"]
    listed = cli("snapshot", iid, "--list", "--store", store).stdout
    [snap] = [line.split("\t")[0] for line in listed.splitlines() if line.endswith("before compile_reviews")]
    assert cli("rollback", iid, snap, "--store", store).exit_code == 0
    assert "accepted_sites" not in run_json(cli, "inspect", iid, "--store", store)["layers"]["L3"]
    failed = run_json(cli, "resume", iid, "--answer", 'irb_approval={"irb_approved": true}', "--store", store,
                      code=1)
    assert failed["error"]["task_id"] == "notify_sites" and "accepted_sites" in failed["error"]["message"]
    done = run_json(cli, "resume", iid, "--set", 'accepted_sites=["BER"]', "--store", store)
    assert done["layers"]["L3"]["notification"] == "Amendment 2 of CT-88 approved for BER"


def test_an_operator_rolls_back_and_replays_through_rest_then_the_reminder_fires_and_the_irb_rejects(
        tmp_path: Path) -> None:
    clock = Clock(float(int(time.time())))
    engine = Engine(f"sqlite:///{tmp_path / 'trial.db'}", clock=clock)
    client = _rest(engine)
    started = client.post("/api/instances", json={"process_id": "protocol_amendment", "data": AMENDMENT})
    assert started.status_code == 201, started.text
    doc = started.json()
    c = _trial_waiting(doc)
    iid = doc["instance_id"]
    assert doc["waiting_for"][1]["due"] == time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(clock.now + 3600))
    replayed = client.get(f"/api/instances/{iid}/replay", params={"context": "main", "until": c["event_seq"] - 1})
    assert replayed.status_code == 200, replayed.text
    seen = replayed.json()
    assert (seen["until"], seen["event"]["kind"]) == (c["event_seq"] - 1, "snapshot")   # the snapshot it took first
    # README: the REST replay's layers list each key (the console's shape), not `layerflow replay`'s maps
    layers = {name: {k["key"]: k["value"] for k in layer["keys"]} for name, layer in seen["layers"].items()}
    assert layers["L3"]["site_results"][2]["note"].startswith("Site MAD read")
    assert layers["L3"]["amendment_text"].startswith("Section 1 of trial CT-88")
    rolled = client.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": c["snapshot_id"]})
    assert rolled.status_code == 200, rolled.text
    now = client.get(f"/api/instances/{iid}").json()
    assert now["layers"]["L3"] == layers["L3"] and now["tape_length"] == doc["tape_length"] + 2
    # an hour later the reminder fires (a context of its own, merged back: no branch is open)
    clock.now += 3600
    reminded = client.post(f"/api/instances/{iid}/resume", json={})
    assert reminded.status_code == 200, reminded.text
    assert [w["task_id"] for w in reminded.json()["waiting_for"]] == ["irb_approval"]
    assert reminded.json()["layers"]["L3"]["irb_reminded"] is True
    done = client.post(f"/api/instances/{iid}/user-tasks/irb_approval", json={"data": {"irb_approved": False}})
    assert done.status_code == 200, done.text
    final = done.json()
    assert final["status"] == "completed" and final["layers"]["L3"]["notification"] == "Amendment 2 of CT-88 withdrawn"
    assert final["completed_user_task"]["task_id"] == "irb_approval"
    main = engine.load(iid).main
    assert LayeredContext.replay(main.tape) == main


# ------------------------------------------------------------------ the churn case: two workers, a person through REST

CUSTOMERS = {
    "C-100": ({"customer_id": "C-100", "tenure_months": 30, "monthly_spend": 40, "complaints": 3,
               "logins_last_30d": 2, "late_payments": True}, "accepted"),
    "C-200": ({"customer_id": "C-200", "tenure_months": 6, "monthly_spend": 25, "complaints": 0,
               "logins_last_30d": 12, "late_payments": False}, "declined")}
CHURN_EXPECTED = {
    "C-100": {"churn_risk": 0.8, "offer_percent": 20, "signals": ["low_logins", "late_payment"],
              "contact_channel": "phone", "lifetime_value": 1200, "call_outcome": "accepted",
              "retention_status": "retained", "discount_applied": 20},
    "C-200": {"churn_risk": 0.2, "offer_percent": 10, "signals": [], "contact_channel": "phone",
              "lifetime_value": 150, "call_outcome": "declined", "retention_status": "churned"}}
TOKEN = "u16-token"


def _spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LAYERFLOW_API_TOKEN": TOKEN}
    env.pop("LAYERFLOW_STORE", None)
    return subprocess.Popen([sys.executable, "-m", "engine.cli", *args], env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_all(procs: list[subprocess.Popen[Any]]) -> None:
    """Stop the started server and workers: all are told at once, then each is waited for."""
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def _served_url(server: subprocess.Popen[str]) -> str:
    deadline = time.monotonic() + 60
    assert server.stderr is not None
    while True:
        line = server.stderr.readline()
        assert line or server.poll() is None, "the server exited"
        assert time.monotonic() < deadline, "the server did not start"
        found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", line)
        if found:
            return found.group(1)


def _until(api: httpx.Client, iid: str, done: Any, what: str, procs: list[subprocess.Popen[str]]) -> dict[str, Any]:
    deadline = time.monotonic() + 45
    while True:
        doc: dict[str, Any] = api.get(f"/api/instances/{iid}").json()
        if done(doc):
            return doc
        assert time.monotonic() < deadline, f"{iid} never {what}: {doc['status']} {doc['waiting_for']} {doc['error']}"
        assert all(p.poll() is None for p in procs), "a worker or the server exited"
        time.sleep(0.1)


@pytest.fixture()
def churn_store() -> Iterator[tuple[str, str]]:
    with redis_scratch(REDIS, "lfu16-churn") as prefix:
        yield f"{REDIS}?prefix={prefix}", f"{prefix}:ready"


def test_two_workers_run_the_churn_cases_while_account_managers_answer_through_rest(
        churn_store: tuple[str, str], cli: Any) -> None:
    """submit (Redis) -> two workers run each case to the account manager's call -> the calls are
    answered through `layerflow serve` (the server runs the case on to the cooling-off timer) -> a
    worker's timer scan fires the due timer, another runs the case to its end -> `inspect` and `tape`."""
    store, stream = churn_store
    procs: list[subprocess.Popen[str]] = []
    try:
        procs.append(_spawn("serve", "--host", "127.0.0.1", "--port", "0", "--catalog", str(HERE), "--store", store))
        url = _served_url(procs[0])
        for name in ("w1", "w2"):
            procs.append(_spawn("worker", "--store", store, "--stream", stream, "--consumer", f"lfu16-{name}",
                                "--timer-interval", "0.5", "--idle-ms", "5000"))
        ids: dict[str, str] = {}
        for customer, (data, _) in CUSTOMERS.items():
            result = cli("submit", str(CHURN), "--data", json.dumps(data), "--store", store, "--stream", stream,
                         "--json")
            assert result.exit_code == 0, result.stderr
            [ids[customer]] = json.loads(result.stdout)["instance_ids"]
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as api:
            for customer, iid in ids.items():
                doc = _until(api, iid, lambda d: d["status"] == "waiting", "waited", procs)
                _check_document(doc, 3, "churn_retention")
                [wait] = doc["waiting_for"]
                assert (wait["kind"], wait["task_id"]) == ("user_task", "account_manager_call")
                assert wait["documentation"].startswith("Call the customer")
                history = data_of(doc["layers"]["L3"])
                assert {k: history[k] for k in ("churn_risk", "signals", "contact_channel")} == {
                    k: CHURN_EXPECTED[customer][k] for k in ("churn_risk", "signals", "contact_channel")}
                [conflict] = doc["conflicts"]
                assert (conflict["key"], conflict["values"], conflict["resolution"]["resolver"]) == (
                    "contact_channel", {"usage_analysis": "email", "billing_analysis": "phone"}, "policy")
            for customer, iid in ids.items():
                answered = api.post(f"/api/instances/{iid}/user-tasks/account_manager_call",
                                    json={"data": {"call_outcome": CUSTOMERS[customer][1]}})
                assert answered.status_code == 200, answered.text
                doc = answered.json()
                assert doc["completed_user_task"]["task_id"] == "account_manager_call" and doc["notices"] == []
                [wait] = doc["waiting_for"]
                assert (wait["kind"], wait["task_id"]) == ("timer", "cooling_off") and wait["due"]
            # at rest: a worker's run saves after each activity, "running" (and, until it stops, the
            # waiting_for it started from: the fired timer), which is no outcome yet
            finals = {c: _until(api, iid, lambda d: d["status"] in AT_REST and d["status"] != "waiting", "completed",
                                procs) for c, iid in ids.items()}
        for customer, doc in finals.items():
            assert doc["status"] == "completed", doc["error"]
            history = {k: v for k, v in data_of(doc["layers"]["L3"]).items() if not k.startswith("_")}
            assert history == CHURN_EXPECTED[customer]
    finally:
        stop_all(procs)
    # the CLI, afterwards, on the same store
    for customer, iid in ids.items():
        seen = run_json(cli, "inspect", iid, "--store", store)
        assert seen["status"] == "completed" and seen["layers"] == finals[customer]["layers"]
        assert seen["layers"]["L3"]["churn_risk"] == CHURN_EXPECTED[customer]["churn_risk"]
        tape = json.loads(cli("tape", iid, "--store", store, "--json").stdout)
        main = [e for e in tape if e["context"] == "main"]
        assert [e["seq"] for e in main] == sorted({e["seq"] for e in main})        # one tape, in order, no gaps
        assert [e["seq"] for e in main] == list(range(1, len(main) + 1))
        notes = [e.get("data", {}).get("note") for e in main]
        assert notes.count("split") == 1 + 1 and notes.count("join") == 1      # the parallel split, the XOR
        [conflict] = json.loads(cli("tape", iid, "--kind", "conflict", "--store", store, "--json").stdout)
        assert conflict["data"]["key"] == "contact_channel"
        call = json.loads(cli("tape", iid, "--activity", "account_manager_call", "--store", store, "--json").stdout)
        assert any(e.get("data", {}).get("note") == "user_input" for e in call)
        ran = [e["activity"] for e in main if e["kind"] == "begin"]
        assert ran.count("score_churn") == 1 and ran.count(
            "apply_offer" if customer == "C-100" else "close_account") == 1      # every step ran once
        engine = Engine(store)
        ctx = engine.load(iid).main
        assert LayeredContext.replay(ctx.tape) == ctx


def test_the_tape_of_the_call_shows_what_the_account_manager_entered_and_what_was_refused(cli: Any,
                                                                                       tmp_path: Path) -> None:
    """An auditor asks what happened at the call: `layerflow tape --activity account_manager_call` (and
    REST's `?activity=`) listed the task's begin, write and complete, but not the person's answer
    (the `user_input` note) nor the refusal of an answer the layer rules refused (`answer_refused`):
    both name the task in `task_id`, not as the event's activity, like a join's `human_decision`."""
    store = f"sqlite:///{tmp_path / 'churn.db'}"
    data, outcome = CUSTOMERS["C-100"]
    iid = run_json(cli, "run", str(CHURN), "--data", json.dumps(data), "--store", store, code=3)["instance_id"]
    refused = cli("resume", iid, "--answer", 'account_manager_call={"customer_id": "C-999"}', "--store", store)
    assert refused.exit_code == 2 and "customer_id" in refused.stderr
    answer = "account_manager_call=" + json.dumps({"call_outcome": outcome})
    run_json(cli, "resume", iid, "--answer", answer, "--store", store, code=3)
    listed = json.loads(cli("tape", iid, "--activity", "account_manager_call", "--store", store, "--json").stdout)
    notes = [(e["data"].get("note"), e["data"].get("keys") or e["data"].get("key")) for e in listed
             if e["kind"] == "note"]
    assert notes == [("answer_refused", "customer_id"), ("user_input", ["call_outcome"])]
    assert [e["kind"] for e in listed if e["kind"] != "note"] == ["begin", "write", "complete"]
    rest = _rest(Engine(store)).get(f"/api/instances/{iid}/tape", params={"activity": "account_manager_call"}).json()
    assert [(e["context"], e["seq"]) for e in rest["events"]] == [(e["context"], e["seq"]) for e in listed]


def test_a_later_cliff_folds_the_site_reviews_and_keeps_every_sites_verdict(cli: Any) -> None:
    """README: what a rule kept survives the fold verbatim, in the record's `kept`. The sites' results,
    reduced by `extract_keys` at the compilation, are folded by the cliff after the IRB's approval:
    each site's verdict is in `kept`; the preserved keys stay where they were."""
    answers = json.dumps({"user_tasks": {"irb_approval": {"irb_approved": True}}})
    doc = run_json(cli, "run", str(TRIAL), "--config", str(HERE / "protocol_amendment.fold.yaml"), "--data",
                   json.dumps(AMENDMENT), "--answers", answers, "--store", "memory://")
    assert doc["status"] == "completed", doc["error"]
    history = doc["layers"]["L3"]
    first, second = doc["compressions"]
    assert (first["activity_id"], second["activity_id"], second["triggers"][0]) == (
        "compile_reviews", "irb_approval", "token_threshold")
    assert "site_results" in second["folded"] and "site_results" not in history
    assert history["compaction:1"]["kept"] == [
        "site_results: accepted: true; site: BER; accepted: true; site: PAR; accepted: false; site: MAD"]
    assert (history["amendment_version"], history["accepted_sites"], history["objections"]) == (2, ["BER", "PAR"],
                                                                                                ["MAD"])
    assert history["notification"] == "Amendment 2 of CT-88 approved for BER, PAR"


def test_the_site_review_instances_share_the_tasks_working_and_the_last_write_stays(tmp_path: Path) -> None:
    """README (written for this round): the instances of a multi-instance task, parallel ones too, run
    in the task's context one after another; a key each writes, other than its output item, keeps the
    last instance's value (no join, no conflict). Collect per-instance values in the output item."""
    text = TRIAL.read_text().replace('<bpmn:script>site_result = {', '<bpmn:script>last_reviewed = site\nsite_result = {')
    path = tmp_path / "protocol_amendment.bpmn"
    path.write_text(text)
    (tmp_path / "protocol_amendment.layerflow.yaml").write_text((HERE / "protocol_amendment.layerflow.yaml").read_text())
    waiting = Engine("memory://").run(load_process(path), AMENDMENT)
    history = waiting.main.layer(Layer.HISTORY)
    assert history["last_reviewed"] == "MAD" and [r["site"] for r in history["site_results"]] == ["BER", "PAR", "MAD"]
    assert waiting.to_document()["conflicts"] == []


def test_cron_fires_the_purchasing_question_that_timed_out(cli: Any, tmp_path: Path) -> None:
    """README: a confirmation with a timeout is due like a timer: `layerflow timers` lists it, `--fire`
    applies its default. A one-second timeout in a config of the test's own (handlers are found beside
    the BPMN)."""
    config = tmp_path / "fast.yaml"
    config.write_text((HERE / "purchase_order.layerflow.yaml").read_text().replace("timeout: 600", "timeout: 1"))
    store = f"sqlite:///{tmp_path / 'po.db'}"
    iid = run_json(cli, "run", str(PO), "--config", str(config), "--data", json.dumps(ORDER), "--store", store,
                   code=3)["instance_id"]
    time.sleep(1.2)
    listed = cli("timers", "--store", store)
    assert listed.exit_code == 0 and f"{iid}  confirmation review_join/risk_rating times out" in listed.stdout
    fired = json.loads(cli("timers", "--fire", "--store", store, "--json").stdout)
    assert [(f["instance_id"], f["status"]) for f in fired["fired"]] == [(iid, "completed")]
    doc = run_json(cli, "inspect", iid, "--store", store)
    assert doc["layers"]["L3"]["po_status"] == "on_hold"
    assert [(c["answer"], c["timed_out"]) for c in doc["confirmations"]] == [("high", True)]
