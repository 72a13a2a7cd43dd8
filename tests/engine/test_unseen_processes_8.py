"""Unseen processes, round 8: small processes of tests/engine/unseen8 from new domains: a motor claim
whose fraud check (an offline model handler) and coverage check disagree at a join a person settles,
an onboarding whose IT and facilities branches write the same keys (branch priority and reducers), a
supplier invoice dispute that waits at an event-based gateway for two messages and a timer, rounds of
rework reviews that loop back to a person, a reservation sub-process whose script throws a BPMN error
to a boundary event, an inclusive gateway taking two of three checks, and a multi-instance sign-off
whose config file overrides the BPMN's activityConfig. Each runs through the CLI, the REST API and the
Python API, with the bad input an outsider gives. Every expectation was worked out by hand from
DESIGN.md and the README first."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from context_layers import Layer, LayeredContext
from engine import Engine, load_process
from engine.api import create_app

from engine_helpers import cli_in_a_tmp_store  # noqa: F401 - the "cli" fixture
from engine_helpers import redis_scratch, run_json
from governance_helpers import TOKEN, ServerThread
from stub_llm import Reply
from test_arbiter_stub import stub  # noqa: F401 - the "stub" fixture: a local OpenAI-compatible server
from test_unseen_processes_7 import data_keys

HERE = Path(__file__).resolve().parent / "unseen8"
ROOT = Path(__file__).resolve().parents[2]
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN8", "redis://127.0.0.1:6379/12")  # this module's own database


def copied(tmp_path: Path, name: str, config: str | None = None) -> Path:
    """The unseen8 process ``name`` copied into ``tmp_path``, with ``config`` as its config file."""
    path = tmp_path / f"{name}.bpmn"
    shutil.copy(HERE / f"{name}.bpmn", path)
    if config is not None:
        (tmp_path / f"{name}.layerflow.yaml").write_text(config, encoding="utf-8")
    return path


def layerflow(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own, so a run that never ends fails the test instead of hanging it."""
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, stdin=subprocess.DEVNULL,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


# ------------------------------------------------------------------ a fraud model and a coverage check disagree

CLAIM = {"amount": 4000, "policy_limit": 10000, "prior_claims": 4}


def test_fraud_and_coverage_disagree_and_a_person_settles_the_claim(cli: Any) -> None:
    """DESIGN: a key two branches change differently is a conflict, resolved by the policy, the model, then
    a person (`human_confirm`: message, options). The join's `notes` reducer (union) settles the list
    without asking; `claim_status` waits for a person with the branches' values plus the config's extra
    option; an answer outside the options is bad input (exit 2) naming the confirmation, the instance
    still waits; the offered extra option settles it, resolver `human`, in `_mergedConflicts`."""
    assert cli("validate", str(HERE / "claim_fraud.bpmn")).exit_code == 0
    doc = run_json(cli, "run", str(HERE / "claim_fraud.bpmn"), "--data", json.dumps(CLAIM), code=3)
    assert doc["conflicts"] == [{"gateway_id": "checks_join", "layer": "L4", "key": "claim_status",
                                 "base_value": "registered",
                                 "values": {"fraud_check": "hold_for_fraud", "coverage_check": "covered"},
                                 "resolution": None, "context": "main"}]
    assert [(w["kind"], w["id"], w["task_id"]) for w in doc["waiting_for"]] == [
        ("confirmation", "checks_join/claim_status", "checks_join")]
    (asked,) = doc["confirmations"]
    assert asked["message"].startswith("Fraud and coverage disagree on the claim.")
    assert [o["value"] for o in asked["options"]][:3] == ["hold_for_fraud", "covered", "manual_review"]
    iid = doc["instance_id"]

    bad = run_json(cli, "resume", iid, "--answer", "checks_join/claim_status=paid", code=2)
    assert bad["error"]["kind"] == "invalid_answer" and bad["error"]["task_id"] == "checks_join"
    assert "'paid'" in bad["error"]["message"] and "'checks_join/claim_status'" in bad["error"]["message"]
    assert run_json(cli, "inspect", iid)["status"] == "waiting"

    done = run_json(cli, "resume", iid, "--answer", "checks_join/claim_status=manual_review")
    assert done["status"] == "completed"
    assert done["conflicts"][0]["resolution"] == {"value": "manual_review", "resolver": "human",
                                                  "reason": 'a person chose "manual_review"'}
    l3 = done["layers"]["L3"]
    assert (l3["claim_status"], l3["payout"], l3["fraud_score"]) == ("manual_review", 0, 0.9)
    assert l3["notes"] == ["registered", "fraud scored", "coverage checked"]
    (logged,) = l3["_mergedConflicts"]
    assert (logged["key"], logged["conflictingValues"], logged["resolution"]["resolver"]) == (
        "claim_status", ["hold_for_fraud", "covered"], "human")
    instance = Engine(os.environ["LAYERFLOW_STORE"]).load(iid)
    assert LayeredContext.replay(instance.main.tape) == instance.main


def test_a_clean_claim_still_meets_coverage_at_the_join(cli: Any) -> None:
    """With few prior claims the fraud handler clears the claim: its `fraud_clear` and coverage's `covered`
    still differ (a conflict); `--yes` has no suggestion to take (no rule, no model), so it waits."""
    doc = run_json(cli, "run", str(HERE / "claim_fraud.bpmn"), "--data", json.dumps({**CLAIM, "prior_claims": 0}),
                   "--yes", code=3)
    assert doc["conflicts"][0]["values"] == {"fraud_check": "fraud_clear", "coverage_check": "covered"}


@pytest.fixture
def redis_store() -> Iterator[str]:
    with redis_scratch(REDIS, "unseen8") as prefix:
        yield f"{REDIS}?prefix={prefix}"


def test_a_claim_waiting_on_redis_is_settled_by_another_engine(redis_store: str) -> None:
    """DESIGN: an instance waiting for a person is persisted and resumed later by another process; the
    `*` answer takes any other confirmation. The store is Redis, as workers on several machines share."""
    first = Engine(redis_store).run(load_process(HERE / "claim_fraud.bpmn"), {**CLAIM, "amount": 20000,
                                                                              "prior_claims": 0})
    assert first.status == "waiting"
    assert first.to_document()["conflicts"][0]["values"] == {"fraud_check": "fraud_clear",
                                                             "coverage_check": "not_covered"}
    done = Engine(redis_store).resume(first.id, answers={"confirmations": {"*": "not_covered"}})
    assert done.status == "completed"
    assert (done.main.resolve("claim_status"), done.main.resolve("payout")) == ("not_covered", 0)
    assert LayeredContext.replay(Engine(redis_store).load(first.id).main.tape) == done.main


def test_with_a_model_the_fraud_model_scores_and_its_unsure_ruling_goes_to_a_person(cli: Any, stub: Any) -> None:
    """With `--model` the `llm:` block calls the model (through litellm's HTTP client, to the local stub)
    instead of the offline handler; the join's conflict goes to the model, which suggests a value and
    escalates: the person is asked with the model's suggestion, and `resume --yes` takes it (resolver
    `human`, its reason saying `--yes` took the model's suggestion, with the model's rationale)."""
    stub.push(Reply.json({"fraud_score": 0.95, "claim_status": "hold_for_fraud"}))
    stub.push(Reply.json({"final_value": "hold_for_fraud", "rationale": "fraud score is high", "escalate": True}))
    doc = run_json(cli, "run", str(HERE / "claim_fraud.bpmn"), "--data", json.dumps({**CLAIM, "prior_claims": 0}),
                   "--model", "openai/stub", code=3)
    assert doc["conflicts"][0]["values"] == {"fraud_check": "hold_for_fraud", "coverage_check": "covered"}
    (asked,) = doc["confirmations"]
    assert (asked["suggested"], asked["suggested_by"]) == ("hold_for_fraud", "model")
    assert doc["model_fallbacks"] == [] and len(stub.requests) == 2
    done = run_json(cli, "resume", doc["instance_id"], "--yes")
    assert done["conflicts"][0]["resolution"] == {
        "value": "hold_for_fraud", "resolver": "human",
        "reason": "layerflow --yes took the model's suggestion \"hold_for_fraud\" without asking a person: fraud score is high"}
    assert (done["layers"]["L3"]["fraud_score"], done["layers"]["L3"]["payout"]) == (0.95, 0)


# ------------------------------------------------------------------ onboarding: two branches write the same keys

def test_onboarding_branches_meet_by_priority_and_reducers(cli: Any) -> None:
    """Both branches set `ready` to True (changed identically: taken, no conflict), add to `equipment`
    (union) and `tasks_done` (sum), and choose different desks: BRANCH_PRIORITY gives facilities' desk,
    resolver `strategy`. The split's contextInject `team` is each branch's own."""
    doc = run_json(cli, "run", str(HERE / "hr_onboarding.bpmn"), "--data", json.dumps({"employee": "kim", "site": "BER"}))
    assert doc["status"] == "completed"
    assert [(c["key"], c["values"], c["resolution"]["value"], c["resolution"]["resolver"]) for c in doc["conflicts"]] == [
        ("desk", {"it_setup": "hot desk BER", "facilities_setup": "BER-3.14"}, "BER-3.14", "strategy")]
    assert data_keys(doc["layers"]["L3"]) == {
        "equipment": ["badge", "laptop", "phone", "chair"], "ready": True, "desk": "BER-3.14", "tasks_done": 3,
        "account": "kim@corp.example", "welcome": "Welcome kim, desk BER-3.14, 4 items, 3 tasks"}


def test_a_config_with_typos_is_refused_naming_file_line_element_and_field(cli: Any, tmp_path: Path) -> None:
    path = copied(tmp_path, "hr_onboarding", "prepare_join:\n  mergeStrategy: BRANCH_PRIORTY\n"
                                             "  reducers: {equipment: unoin}\nit_setup:\n  preserveKey: [account]\n")
    checked = cli("validate", str(path))
    said = checked.stdout + checked.stderr
    assert checked.exit_code == 2
    assert "hr_onboarding.layerflow.yaml:2: element 'prepare_join': field 'mergeStrategy'" in said, said
    assert "field 'reducers.equipment'" in said and "'unoin'" in said, said
    assert "hr_onboarding.layerflow.yaml:5: element 'it_setup': field 'preserveKey'" in said and "preserveKeys" in said
    doc = run_json(cli, "run", str(path), "--data", json.dumps({"employee": "kim", "site": "BER"}), code=2)
    assert doc["instance_id"] is None and doc["error"]["kind"] == "invalid_config"


@pytest.mark.parametrize(("data", "said"), [
    ('{"employee": "kim"', "not valid JSON"),
    ("[1]", "must hold an object"),
    ("missing.json", "missing.json"),
])
def test_bad_start_data_is_bad_input(cli: Any, data: str, said: str) -> None:
    result = cli("run", str(HERE / "hr_onboarding.bpmn"), "--data", data)
    assert result.exit_code == 2 and said in result.stderr, result.stderr


# ------------------------------------------------------------------ an invoice dispute at an event-based gateway

DISPUTE = {"invoice_total": 1200, "agreed_total": 1000}


def test_the_dispute_waits_for_two_messages_and_a_timer_and_takes_the_credit_note(cli: Any) -> None:
    """README: the branches of an event-based gateway are listed in `waiting_for` (a timer with its `due`,
    each message with `event` and `event_kind`). A message nobody waits for is refused naming what the
    instance waits for; a payload key the layer rules refuse (a PROCESS key) is refused whole, on the tape;
    a payload that is not an object is refused naming the catch event. The credit note then goes in."""
    doc = run_json(cli, "run", str(HERE / "invoice_dispute.bpmn"), "--data", json.dumps(DISPUTE), code=3)
    assert sorted((w["kind"], w.get("event")) for w in doc["waiting_for"]) == [
        ("event", "credit_note_issued"), ("event", "dispute_withdrawn"), ("timer", None)]
    timer = next(w for w in doc["waiting_for"] if w["kind"] == "timer")
    assert timer["task_id"] == "supplier_silent" and timer["due"]
    # each message's item names the gateway that waits and its own catch event, where the payload's
    # `event:` record goes, as the timer's item names its event
    assert sorted((w["task_id"], w["event_id"]) for w in doc["waiting_for"] if w["kind"] == "event") == [
        ("await_supplier", "credit_in"), ("await_supplier", "withdrawn_in")]
    iid = doc["instance_id"]

    wrong = cli("send", iid, "credit_issued", "--json-payload", '{"credit_amount": 200}')
    assert wrong.exit_code == 2 and "'credit_issued'" in wrong.stderr and "credit_note_issued" in wrong.stderr
    denied = cli("send", iid, "credit_note_issued", "--json-payload", '{"credit_amount": 200, "agreed_total": 5}')
    assert denied.exit_code == 2 and "'agreed_total'" in denied.stderr and "L1" in denied.stderr, denied.stderr
    listed = cli("send", iid, "credit_note_issued", "--json-payload", "[1, 2]")
    assert listed.exit_code == 2 and "credit_in" in listed.stderr, listed.stderr
    refused = json.loads(cli("tape", iid, "--kind", "denied", "--json").stdout)
    assert [e["data"]["key"] for e in refused] == ["agreed_total"]

    done = run_json(cli, "send", iid, "credit_note_issued", "--json-payload", '{"credit_amount": 200}')
    assert done["status"] == "completed" and done["waiting_for"] == []
    l3 = done["layers"]["L3"]
    assert data_keys(l3) == {"dispute_state": "credited", "disputed_amount": 200, "credit_amount": 200,
                             "payable": 1000, "closed_with": "credited:1000"}
    assert l3["event:credit_in"]["event"] == "credit_note_issued"
    assert "activity:pay_in_full" not in l3 and "activity:short_pay" not in l3

    # the plain summary names when the timer is due (not "once the event has happened")
    plain = cli("run", str(HERE / "invoice_dispute.bpmn"), "--data", json.dumps(DISPUTE))
    line = next(x for x in plain.stdout.splitlines() if "supplier_silent" in x)
    assert re.search(r"` after 20\d\d-\d\d-\d\dT[^ ]*, when it is due", line), line
    assert "layerflow timers --fire" in line and "once the event" not in line, line

    # the supplier withdraws too late: the dispute is closed, and the refusal says so
    late = cli("send", iid, "dispute_withdrawn")
    assert late.exit_code == 2 and f"instance {iid} is completed" in late.stderr, late.stderr


def test_a_credit_note_after_the_supplier_timer_came_due_takes_no_second_branch(tmp_path: Path) -> None:
    """An event-based gateway takes one branch: the event that comes first. Eleven days on, with nothing
    run since, the ten-day timer came due before the credit note: `send_event` delivered the message and
    the timer fired as well, so both `book_credit` and `short_pay` ran and the dispute was closed twice.
    README: a timer that is due fires before any answer, whichever interface brings it; the message then
    finds nothing waiting for it, refused (InstanceStateError, REST 409) naming the timer that ran."""
    from engine.governance import InstanceStateError

    now = [1_800_000_000.0]
    engine = Engine(f"sqlite:///{tmp_path / 'clock.db'}", clock=lambda: now[0])
    waiting = engine.run(load_process(HERE / "invoice_dispute.bpmn"), DISPUTE)
    now[0] += 11 * 86400
    with pytest.raises(InstanceStateError) as refused:
        engine.send_event(waiting.id, "credit_note_issued", {"credit_amount": 200})
    message = str(refused.value)
    assert "'supplier_silent'" in message and "credit_note_issued" in message, message
    done = engine.load(waiting.id)
    assert done.status == "completed"
    history = done.main.layer(Layer.HISTORY)
    assert history["closed_with"] == "short_paid:1000"
    assert "credit_amount" not in history and "activity:book_credit" not in history
    assert "activity:close_dispute#2" not in history

    # over REST: 409, the same words, the timer's path ran
    second = engine.run(load_process(HERE / "invoice_dispute.bpmn"), DISPUTE)
    now[0] += 11 * 86400
    with ServerThread(create_app(engine, HERE, TOKEN)) as server:
        r = local_http.post(f"{server.url}/api/instances/{second.id}/events", headers=AUTH, timeout=60,
                       json={"name": "credit_note_issued", "payload": {"credit_amount": 200}})
    assert r.status_code == 409 and "'supplier_silent'" in r.text, r.text
    assert engine.load(second.id).main.resolve("closed_with") == "short_paid:1000"


# ------------------------------------------------------------------ rework rounds that loop back to a person

REJECT = {"approved": False, "comment": "tighten the retention section"}


def test_a_rejection_given_in_advance_does_not_send_the_rework_loop_round_for_ever(tmp_path: Path) -> None:
    """README: an answer is given each time its step comes back. Here every round changes the context (the
    draft's version goes up), so the guard for rounds that change nothing never held: `run --answers` with
    a rejection (and `resume --answer`, the one answer a reviewer gives) went round the rework loop for
    ever, writing thousands of rounds to the store and printing nothing. One answer is given to one step
    at most `ANSWER_ROUNDS` (100) times in a run; then the step waits for a person, and stderr says so."""
    from engine.runtime import ANSWER_ROUNDS

    (tmp_path / "answers.json").write_text(json.dumps({"user_tasks": {"review_draft": REJECT}}))
    store = f"sqlite:///{tmp_path / 'rounds.db'}"
    done = layerflow("run", str(HERE / "rework_reviews.bpmn"), "--answers", "answers.json", "--json",
                     "--store", store, cwd=tmp_path)
    doc = json.loads(done.stdout)
    assert (done.returncode, doc["status"]) == (3, "waiting"), done.stderr[-2000:]
    assert [w["task_id"] for w in doc["waiting_for"]] == ["review_draft"]
    assert doc["layers"]["L3"]["draft_version"] == ANSWER_ROUNDS + 1
    assert "'review_draft'" in done.stderr and f"{ANSWER_ROUNDS} times" in done.stderr, done.stderr[-2000:]

    # a resume with the same rejection counts its own rounds: it too ends, waiting
    again = layerflow("resume", doc["instance_id"], "--answer", "review_draft=" + json.dumps(REJECT), "--json",
                      "--store", store, cwd=tmp_path)
    assert again.returncode == 3 and "'review_draft'" in again.stderr, again.stderr[-2000:]
    assert json.loads(again.stdout)["layers"]["L3"]["draft_version"] == 2 * ANSWER_ROUNDS + 1
    approve = layerflow("resume", doc["instance_id"], "--answer", 'review_draft={"approved": true, "comment": "ok"}',
                        "--json", "--store", store, cwd=tmp_path)
    final = json.loads(approve.stdout)
    assert (approve.returncode, final["status"]) == (0, "completed"), approve.stderr[-2000:]
    assert final["layers"]["L3"]["published"] == f"v{2 * ANSWER_ROUNDS + 1}"


def test_rework_rounds_keep_the_draft_version_through_compression() -> None:
    """The rework step's config preserves `draft_version` and compresses at eight HISTORY entries: the
    cliff folds the older rounds into a compaction record, the preserved key stays, and the tape rebuilds
    the context."""
    engine = Engine("memory://")
    instance = engine.run(load_process(HERE / "rework_reviews.bpmn"))
    for n in range(5):
        (item,) = instance.waiting_for
        instance = engine.complete_user_task(instance, item["id"], {"approved": False, "comment": f"round {n}"})
    assert instance.status == "waiting"
    history = instance.main.layer(Layer.HISTORY)
    assert history["draft_version"] == 6
    assert any(key.startswith("compaction:") for key in history), list(history)
    assert len(history) <= 9, list(history)
    assert LayeredContext.replay(instance.main.tape) == instance.main
    instance = engine.complete_user_task(instance, instance.waiting_for[0]["id"], {"approved": True, "comment": "ok"})
    assert instance.status == "completed" and instance.main.resolve("published") == "v6"


# ------------------------------------------------------------------ a sub-process's script throws to a boundary event

@pytest.mark.parametrize(("quantity", "state", "extra"), [
    (5, "confirmed", {"reserved": 5}),
    (12, "backordered", {"short_by": 3, "error_code": "out_of_stock", "error_message": "only 9 left",
                         "backordered": 3}),
])
def test_stock_reservation_confirms_or_backorders(cli: Any, quantity: int, state: str, extra: dict[str, Any]) -> None:
    """README: a script raising BpmnError throws at its task; the error boundary event on the sub-process
    around it catches it (its errorRef's code), the throwing activity's writes are dropped and its record
    says `error_thrown`; the catching event's context gets `error_code`, `error_message` and the payload."""
    doc = run_json(cli, "run", str(HERE / "stock_reservation.bpmn"), "--data",
                   json.dumps({"sku": "A1", "quantity": quantity, "on_hand": 9}))
    l3 = doc["layers"]["L3"]
    assert data_keys(l3) == {"bins_checked": True, "reservation_note": "checked A1", "order_state": state, **extra}
    if state == "backordered":
        assert (l3["activity:take_stock"]["status"], l3["activity:take_stock"]["caught_by"]) == (
            "error_thrown", ["stock_short"])
        assert "activity:confirm_order" not in l3


# ------------------------------------------------------------------ an inclusive gateway takes two of three checks

@pytest.mark.parametrize(("data", "taken", "expected"), [
    ({"listed_building": True, "floors": 5}, ["heritage_check", "fire_check"],
     {"findings": ["listed facade", "two exits"], "fee": 330, "verdict": "conditions"}),
    ({"listed_building": True, "floors": 2}, ["heritage_check"],
     {"findings": ["listed facade"], "fee": 250, "verdict": "conditions"}),
    ({"listed_building": False, "floors": 1}, ["zoning_check"],
     {"findings": ["zoning ok"], "fee": 100, "verdict": "ok"}),
])
def test_permit_checks_merge_the_branches_the_inclusive_gateway_took(cli: Any, data: dict[str, Any],
                                                                     taken: list[str],
                                                                     expected: dict[str, Any]) -> None:
    """The default flow is taken only when no condition holds (BPMN); the join merges the branches taken:
    `findings` appended, `fee` summed, and `verdict` by the policy's ranking (resolver `policy`)."""
    doc = run_json(cli, "run", str(HERE / "permit_checks.bpmn"), "--data", json.dumps(data))
    l3 = doc["layers"]["L3"]
    assert sorted(k.split(":", 1)[1] for k in l3 if k.startswith("activity:") and k.endswith("_check")) == sorted(taken)
    assert {k: l3[k] for k in expected} == expected
    assert [(c["key"], c["resolution"]["resolver"]) for c in doc["conflicts"]] == (
        [("verdict", "policy")] if len(taken) == 2 else [])


# ------------------------------------------------------------------ a multi-instance sign-off, config over BPMN

HEADS = {"heads": ["ann", "bo", "cy"]}


def test_the_config_file_overrides_the_bpmn_and_preserve_keys_add_up() -> None:
    """README: the file wins field by field, `preserveKeys` add up."""
    cfg = load_process(HERE / "budget_signoff.bpmn").config("tally")
    assert cfg is not None
    assert cfg.compress_token_threshold == 40
    assert sorted(cfg.preserve_keys) == ["all_signed", "signed_by"]


def test_sign_off_over_rest_one_instance_at_a_time(tmp_path: Path) -> None:
    """Each instance of the multi-instance user task waits with its `instance` and `input`; completing one by
    its `waiting_for` id leaves the others waiting; the same id a second time is refused (409) naming what
    waits; the signatures are collected in order of the input."""
    app = create_app(f"sqlite:///{tmp_path / 'api.db'}", HERE, TOKEN)
    with ServerThread(app) as server:
        client = httpx.Client(base_url=server.url, headers=AUTH, timeout=60)
        started = client.post("/api/instances", json={"process_id": "budget_signoff", "data": HEADS})
        assert started.status_code == 201, started.text
        doc = started.json()
        iid = doc["instance_id"]
        items = doc["waiting_for"]
        assert [(w["task_id"], w["instance"], w["input"]) for w in items] == [
            ("sign_budget", 1, {"head": "ann"}), ("sign_budget", 2, {"head": "bo"}), ("sign_budget", 3, {"head": "cy"})]
        order = [items[2], items[0], items[1]]
        for n, item in enumerate(order):
            head = item["input"]["head"]
            r = client.post(f"/api/instances/{iid}/user-tasks/{item['id']}",
                            json={"data": {"signature": {"by": head, "ok": head != "bo"}}})
            assert r.status_code == 200, r.text
            assert len(r.json()["waiting_for"]) == 2 - n
            if n == 0:
                again = client.post(f"/api/instances/{iid}/user-tasks/{item['id']}", json={"data": {}})
                assert again.status_code == 409 and item["id"] in again.text, again.text
        final = r.json()
        assert final["status"] == "completed"
        l3 = final["layers"]["L3"]
        assert l3["signatures"] == [{"by": "ann", "ok": True}, {"by": "bo", "ok": False}, {"by": "cy", "ok": True}]
        assert (l3["signed_by"], l3["all_signed"]) == (["ann", "cy"], False)


def test_an_answer_for_one_instance_wins_over_the_answer_for_all(cli: Any, tmp_path: Path) -> None:
    """README: the instances of a multi-instance user task are answered one by its `id`, or all alike by the
    BPMN id. Given both, the one instance's own answer is the more specific (as a confirmation's id wins over
    `GATEWAY/KEY` and `*`): it was ignored, and bo's refusal was signed as everyone else's approval."""
    doc = run_json(cli, "run", str(HERE / "budget_signoff.bpmn"), "--data", json.dumps(HEADS), code=3)
    bo = next(w["id"] for w in doc["waiting_for"] if w["input"] == {"head": "bo"})
    answers = {"user_tasks": {"sign_budget": {"signature": {"by": "head", "ok": True}},
                              bo: {"signature": {"by": "bo", "ok": False}}}}
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    done = run_json(cli, "resume", doc["instance_id"], "--answers", str(tmp_path / "answers.json"))
    assert done["layers"]["L3"]["signatures"] == [{"by": "head", "ok": True}, {"by": "bo", "ok": False},
                                                  {"by": "head", "ok": True}]
    assert done["layers"]["L3"]["all_signed"] is False
