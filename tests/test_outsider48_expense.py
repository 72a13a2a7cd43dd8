"""A travel company's expense reimbursement, integrated through the REST governance API only (round 48).

The process (tests/outsider_expense48/expense.bpmn and its .layerflow.yaml): the employee submits the
expense (a user task), a model checks it against the travel policy (an ``llm:`` step whose offline
handler stands in for the model), the process waits for the receipt (a message sent later), then the
manager approves and finance audits in parallel, both deciding ``approved_amount``; the join settles
their conflict by policy (meals: the per-diem; a rejection: 0), through a confirmation a person answers
over REST, or a person escalates it and an administrator settles it with runtime config. A rejected
expense goes back to the employee. Everything runs against a real ``layerflow serve`` (sqlite, and the
Redis store once), every answer checked against what ``/openapi.json`` declares for it.

What the team found:

* ``GET /api/instances?process_id=expense_reimbursement`` listed every instance of every process: a
  query parameter an endpoint does not take was dropped without a word (``?stauts=waiting`` listed
  them all too), while a body field it does not take is refused. Such a parameter is now a 422
  naming it and the parameters the endpoint takes; the instance list takes ``process_id``.
* Paging through an instance's whole tape with ``limit`` and ``since`` lost the branches' events
  (each context numbers its own tape, so ``since`` past the main tape's page skips a branch's early
  events), and a page did not say whether more followed. The tape takes ``offset`` now, and answers
  ``total`` and ``next_offset`` (null on the last page).
* A question an operator's governance model asked through ``tools/human_confirm`` while the expense
  waited stayed open after the instance completed: ``GET /api/confirmations?instance_id=`` listed it
  and a late answer was taken (200, a decision on the tape of a completed instance). It is closed as
  the instance completes (``confirmation_closed``), and a late answer gets 409.
* After the escalation, a resume's answer to the escalated question (the join lies on the rejection
  loop, so the answer waits for a later round) was dropped without a word (200, ``"notices": []``;
  the CLI said so on stderr). The reply names it as not used and says how to settle the join.
* A client whose request was refused (403: nothing applied) got 409 ``version_conflict`` for its
  corrected retry with the version it had read: the refusal's note had been saved as a new version.
  A version that only refusals followed is current still.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_contracts_rest import openapi_document, serving
from test_rest_openapi_32 import Client
from tests.engine.engine_helpers import redis_scratch

HERE = Path(__file__).resolve().parent / "outsider_expense48"
PROCESS = "expense_reimbursement"
REDIS = "redis://127.0.0.1:6379/10"
PREFIX = "o48"
GOV = "/api/context-governance"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("o48")


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[str]:
    yield from serving(folder, HERE)  # its store: folder/rest.db


@pytest.fixture(scope="module")
def call(server: str) -> Client:
    return Client(server, openapi_document(server))


@pytest.fixture(scope="module")
def redis_call(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    with redis_scratch(REDIS, PREFIX) as prefix:  # o48-<random>: its keys deleted afterwards
        for url in serving(tmp_path_factory.mktemp("o48r"), HERE, store=f"{REDIS}?prefix={prefix}"):
            yield Client(url, openapi_document(url))


def ok(r: Any, status: int = 200) -> dict[str, Any]:
    assert r.status_code == status, f"{r.status_code} (expected {status}): {r.text[:600]}"
    doc: dict[str, Any] = r.json()
    return doc


def refused(r: Any, status: int, kind: str, *named: str) -> dict[str, Any]:
    assert r.status_code == status, f"{r.status_code} (expected {status}): {r.text[:600]}"
    error: dict[str, Any] = r.json()["error"]
    assert error["kind"] == kind, error
    for name in named:
        assert name in error["message"], f"{name!r} is not named: {error['message']}"
    return error


def start(call: Client, category: str, **data: Any) -> str:
    doc = ok(call("POST", "/api/instances", body={"process_id": PROCESS, "data": {
        "expense_id": f"EXP-{category}", "employee": "ann", "category": category, "rounds": 0, **data}}), 201)
    assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["submit_expense"]
    return str(doc["instance_id"])


def submit(call: Client, iid: str, amount: int) -> dict[str, Any]:
    return ok(call("POST", "/api/instances/{instance_id}/user-tasks/{task_id}", iid, "submit_expense",
                   body={"data": {"amount_claimed": amount, "description": "client visit"}, "user": "ann"}))


def receipt(call: Client, iid: str, receipt_id: str = "R-1") -> dict[str, Any]:
    return ok(call("POST", "/api/instances/{instance_id}/events", iid,
                   body={"name": "receipt_received", "payload": {"receipt_id": receipt_id}}))


def manager(call: Client, iid: str, amount: int, decision: str = "approved") -> dict[str, Any]:
    return ok(call("POST", "/api/instances/{instance_id}/user-tasks/{task_id}", iid, "manager_approval",
                   body={"data": {"approved_amount": amount, "manager_decision": decision}, "user": "max"}))


def to_the_join(call: Client, category: str, claimed: int, approved: int, decision: str = "approved") -> tuple[str, dict[str, Any]]:
    """An expense through submission, the policy check, the receipt and the manager's decision."""
    iid = start(call, category)
    doc = submit(call, iid, claimed)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["receive_receipt"], doc["waiting_for"]
    doc = receipt(call, iid)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["manager_approval"], doc["waiting_for"]
    return iid, manager(call, iid, approved, decision)


def test_meals_conflict_is_settled_by_the_policy(call: Client) -> None:
    iid, doc = to_the_join(call, "meals", 85, 85)
    assert doc["status"] == "completed", doc["error"]
    [conflict] = doc["conflicts"]
    assert conflict["key"] == "approved_amount" and conflict["values"] == {"manager_approval": 85, "finance_audit": 60}
    assert conflict["resolution"] == {"value": 60, "resolver": "policy", "reason": "meals are reimbursed at the per-diem"}
    history = doc["layers"]["L3"]
    assert history["paid_amount"] == 60 and history["policy_ok"] is False
    assert history["policy_note"] == "meals: 85 claimed against a limit of 60"
    merged = history["_mergedConflicts"]
    assert [c["resolution"]["resolver"] for c in merged] == ["policy"]


def test_a_confirmation_two_clients_answer_at_once_takes_one_answer(call: Client) -> None:
    iid, doc = to_the_join(call, "hotel", 300, 280)
    assert doc["status"] == "waiting"
    [item] = doc["waiting_for"]
    assert item["kind"] == "confirmation" and item["id"] == "review_join/approved_amount"
    listed = ok(call("GET", "/api/confirmations", params={"instance_id": iid}))
    [confirmation] = listed
    assert [o["value"] for o in confirmation["options"]] == [280, 250, "$escalate"]
    answers: dict[str, Any] = {}
    barrier = threading.Barrier(2)

    def answer(who: str, value: int) -> None:
        barrier.wait()
        answers[who] = call("POST", "/api/confirmations/{confirmation_id}", "review_join/approved_amount",
                            body={"value": value, "instance_id": iid, "user": who})

    threads = [threading.Thread(target=answer, args=a) for a in (("bob", 280), ("carol", 250))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    codes = sorted(r.status_code for r in answers.values())
    assert codes == [200, 409], {who: r.text[:300] for who, r in answers.items()}
    winner = next(who for who, r in answers.items() if r.status_code == 200)
    loser = next(who for who, r in answers.items() if r.status_code == 409)
    error = refused(answers[loser], 409, "already_answered", winner)
    assert error["answered_by"] == winner
    final = ok(call("GET", "/api/instances/{instance_id}", iid))
    value = {"bob": 280, "carol": 250}[winner]
    assert final["status"] == "completed" and final["layers"]["L3"]["paid_amount"] == value
    [conflict] = final["conflicts"]
    assert conflict["resolution"]["resolver"] == "human" and conflict["resolution"]["value"] == value
    decisions = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"kind": "human_decision"}))
    assert [e["actor"] for e in decisions["events"]] == [winner]


def test_an_escalation_fails_the_join_until_runtime_config_settles_it(call: Client) -> None:
    iid, doc = to_the_join(call, "flight", 1000, 950)
    assert doc["status"] == "waiting"
    doc = ok(call("POST", "/api/confirmations/{confirmation_id}", "review_join/approved_amount",
                  body={"value": "$escalate", "instance_id": iid, "user": "max"}))
    assert doc["status"] == "error" and doc["error"]["kind"] == "merge_conflict"
    assert "escalated" in doc["error"]["message"] and "/api/context-governance/config" in doc["error"]["message"]
    # a later answer is no way round the escalation
    refused(call("POST", "/api/confirmations/{confirmation_id}", "review_join/approved_amount",
                 body={"value": 900, "instance_id": iid}), 409, "already_answered")
    # the join lies on the rejection loop, so a resume's answer for it waits for a later round: this
    # resume does not use it, and its reply says so (it was silent: 200, `"notices": []`)
    doc = ok(call("POST", "/api/instances/{instance_id}/resume", iid,
                  body={"answers": {"confirmations": {"review_join/approved_amount": 900}}}))
    assert doc["status"] == "error" and doc["conflicts"][0]["resolution"] is None
    [notice] = doc["notices"]
    assert "review_join/approved_amount" in notice and "was not used" in notice and "$escalate" in notice, notice
    change = ok(call("POST", f"{GOV}/config", body={"instance_id": iid, "reason": "CFO decision", "config": {
        "activityId": "review_join", "conflictPolicy": {"rules": [
            {"key": "approved_amount", "when": 'category == "flight"', "value": 900, "reason": "flights at the audited fare"}]}}}))
    assert change["config_version"] == 1 and change["config"]["conflictPolicy"]["rules"][0]["value"] == 900
    doc = ok(call("POST", "/api/instances/{instance_id}/resume", iid, body={}))
    assert doc["status"] == "completed", doc["error"]
    [conflict] = doc["conflicts"]
    assert conflict["resolution"]["resolver"] == "policy" and conflict["resolution"]["value"] == 900
    assert doc["layers"]["L3"]["paid_amount"] == 900


def test_a_rejection_goes_back_to_the_employee(call: Client) -> None:
    iid, doc = to_the_join(call, "hotel", 300, 0, "rejected")
    assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["submit_expense"]
    assert doc["conflicts"][0]["resolution"]["reason"] == "the manager rejected the expense"
    assert doc["layers"]["L3"]["rounds"] == 1
    submit(call, iid, 240)
    receipt(call, iid, "R-2")
    doc = manager(call, iid, 240)
    assert doc["status"] == "completed", doc["error"]
    assert doc["layers"]["L3"]["paid_amount"] == 240 and doc["layers"]["L3"]["receipt"] == {"receipt_id": "R-2"}
    # round two agreed: no new conflict
    assert len(doc["conflicts"]) == 1
    rounds = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"kind": "user_input"}))
    assert [e["data"]["task_id"] for e in rounds["events"]] == ["submit_expense", "manager_approval"] * 2


def test_racing_completions_of_one_user_task_complete_it_once(call: Client) -> None:
    iid = start(call, "hotel")
    submit(call, iid, 300)
    receipt(call, iid)
    results: list[Any] = []
    barrier = threading.Barrier(2)

    def complete(amount: int, decision: str) -> None:
        barrier.wait()
        results.append(call("POST", "/api/instances/{instance_id}/user-tasks/{task_id}", iid, "manager_approval",
                            body={"data": {"approved_amount": amount, "manager_decision": decision}}))

    threads = [threading.Thread(target=complete, args=a) for a in ((280, "approved"), (0, "rejected"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200, 409], [r.text[:300] for r in results]
    refused(next(r for r in results if r.status_code == 409), 409, "invalid_state", "manager_approval")
    inputs = ok(call("GET", "/api/instances/{instance_id}/tape", iid,
                     params={"kind": "user_input", "activity": "manager_approval"}))
    assert inputs["count"] == 1


def test_inspect_inject_snapshot_rollback_and_replay(call: Client) -> None:
    iid = start(call, "hotel")
    submit(call, iid, 180)
    snap = ok(call("POST", f"{GOV}/snapshot", body={"instance_id": iid, "label": "before the fix"}))
    injected = ok(call("POST", f"{GOV}/inject", body={"instance_id": iid, "layer": "L4", "key": "cost_centre",
                                                      "value": "CC-7", "reason": "the employee forgot it"}))
    assert injected["version"] > snap["version"]
    seen = ok(call("POST", f"{GOV}/inspect", body={"instance_id": iid}))
    assert "cost_centre" in seen["L4"]["keys"]
    refused(call("POST", f"{GOV}/inject", body={"instance_id": iid, "layer": "L1", "key": "category", "value": "x",
                                                "reason": "r"}), 403, "permission_denied", "category")
    back = ok(call("POST", f"{GOV}/rollback", body={"instance_id": iid, "snapshot_id": snap["snapshot_id"]}))
    assert "cost_centre" not in back["layers"]["L4"] and back["snapshot_id"] == snap["snapshot_id"]
    replay = ok(call("GET", "/api/instances/{instance_id}/replay", iid, params={"until": snap["seq"]}))
    assert replay["until"] == snap["seq"]
    keys = {row["key"] for layer in replay["layers"].values() for row in layer["keys"]}
    assert {"amount_claimed", "policy_limit"} <= keys and "cost_centre" not in keys
    # the instance still goes on where it waited
    doc = receipt(call, iid)
    assert [w["task_id"] for w in doc["waiting_for"]] == ["manager_approval"]


@pytest.mark.parametrize(("method", "template", "args", "body", "status", "kind"), [
    ("GET", "/api/instances/{instance_id}", ("EXP-nope",), None, 404, "not_found"),
    ("POST", "/api/instances", (), {"data": {}}, 422, "validation_error"),
    ("POST", "/api/instances", (), {"process_id": "nope", "data": {}}, 404, "not_found"),
    ("POST", "/api/instances", (), {"process_id": PROCESS, "data": ["x"]}, 422, "validation_error"),
    ("POST", "/api/instances", (), {"process_id": PROCESS, "data": {"policy": "pay all"}}, 403, "permission_denied"),
    ("POST", "/api/instances/{instance_id}/user-tasks/{task_id}", ("EXP-nope", "submit_expense"), {"data": {}}, 404,
     "not_found"),
    ("POST", "/api/confirmations/{confirmation_id}", ("review_join/nope",), {"value": 1}, 404, "not_found"),
    ("POST", "/api/confirmations/{confirmation_id}", ("review_join/approved_amount",), {}, 422, "validation_error"),
    ("POST", "/api/instances/{instance_id}/events", ("EXP-nope",), {"name": "receipt_received"}, 404, "not_found"),
    ("POST", f"{GOV}/inspect", (), {}, 422, "validation_error"),
    ("POST", f"{GOV}/rollback", (), {"instance_id": "EXP-nope", "snapshot_id": "s"}, 404, "not_found"),
])
def test_wrong_payloads_answer_the_declared_errors(call: Client, method: str, template: str, args: tuple[str, ...],
                                                   body: Any, status: int, kind: str) -> None:
    refused(call(method, template, *args, body=body), status, kind)


def test_wrong_payloads_on_a_waiting_instance(call: Client) -> None:
    iid = start(call, "hotel")
    path = "/api/instances/{instance_id}/user-tasks/{task_id}"
    refused(call("POST", path, iid, "submit_expense", body={"data": "85"}), 422, "validation_error", "body.data")
    refused(call("POST", path, iid, "submit_expense", body={"data": {"x": 1}, "expected_version": "old"}), 422,
            "validation_error", "expected_version")
    refused(call("POST", path, iid, "submit_expense", body={"data": {"x": 1}, "expected_version": 1}), 409,
            "version_conflict")
    refused(call("POST", path, iid, "manager_approval", body={"data": {}}), 409, "invalid_state", "submit_expense")
    refused(call("POST", path, iid, "submit_expense", body={"data": {"_mergedConflicts": []}}), 403,
            "permission_denied", "_mergedConflicts")
    refused(call("POST", "/api/instances/{instance_id}/events", iid, body={"name": "receipt_received"}), 409,
            "invalid_state", "submit_expense")
    refused(call("POST", path, iid, "submit_expense", content=b'{"data": {"amount_claimed": 1}}',
                 headers={"content-type": "text/plain"}), 422, "validation_error", "Content-Type")
    refused(call("POST", path, iid, "submit_expense", content=b'{"data": {"amount_claimed": 1}',
                 headers={"content-type": "application/json"}), 422, "validation_error", "not valid JSON")
    refused(call("POST", "/api/instances/{instance_id}/cancel", iid, body={"reason": 5}), 422, "validation_error")
    # nothing of it was applied; the one trace is the refused answer's note (README)
    doc = ok(call("GET", "/api/instances/{instance_id}", iid))
    assert doc["status"] == "waiting" and doc["layers"]["L3"] == {} and doc["layers"]["L4"] == {"rounds": 0}
    assert [w["task_id"] for w in doc["waiting_for"]] == ["submit_expense"]
    notes = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"kind": "denied"}))
    assert [e["data"].get("note") for e in notes["events"] if e["kind"] == "note"] == ["answer_refused"]


def test_the_redis_store_runs_the_same_walk(redis_call: Client) -> None:
    call = redis_call
    iid, doc = to_the_join(call, "hotel", 300, 0, "rejected")
    assert [w["task_id"] for w in doc["waiting_for"]] == ["submit_expense"]
    submit(call, iid, 320)
    receipt(call, iid, "R-3")
    doc = manager(call, iid, 300)
    assert doc["status"] == "waiting"
    doc = ok(call("POST", "/api/confirmations/{confirmation_id}", "review_join/approved_amount",
                  body={"answer": 250, "user": "carol"}))
    assert doc["status"] == "completed" and doc["layers"]["L3"]["paid_amount"] == 250
    refused(call("POST", "/api/confirmations/{confirmation_id}", "review_join/approved_amount",
                 body={"value": 300}), 409, "already_answered", "carol")
    listed = ok(call("GET", "/api/instances", params={"status": "completed"}))
    assert [row["instance_id"] for row in listed] == [iid]


def test_an_unknown_query_parameter_is_refused(call: Client) -> None:
    start(call, "meals")
    error = refused(call("GET", "/api/instances", params={"stauts": "waiting"}), 422, "validation_error", "stauts")
    assert error["problems"][0]["field"] == "query.stauts" and "status" in error["problems"][0]["message"]
    iid = start(call, "hotel")
    refused(call("GET", "/api/instances/{instance_id}/tape", iid, params={"kinds": "write"}), 422,
            "validation_error", "kinds", "kind")
    refused(call("POST", f"{GOV}/inspect", params={"instance_id": iid, "layer": "L3"}), 422,
            "validation_error", "query.layer")
    # one filter given twice took the last value without a word
    refused(call("GET", "/api/instances", params=[("status", "waiting"), ("status", "error")]), 422,
            "validation_error", "query.status", "'waiting', 'error'")
    assert ok(call("GET", "/api/instances", params=[("status", "waiting"), ("status", "waiting")]))


def test_the_instance_list_filters_by_process(call: Client) -> None:
    iid = start(call, "meals")
    rows = ok(call("GET", "/api/instances", params={"process_id": PROCESS, "status": "waiting"}))
    assert iid in [row["instance_id"] for row in rows]
    assert {row["process_id"] for row in rows} == {PROCESS}
    assert ok(call("GET", "/api/instances", params={"process_id": "loan_approval"})) == []
    summaries = ok(call("GET", "/api/instance-summaries", params={"process_id": PROCESS, "limit": 500}))
    assert iid in [row["id"] for row in summaries]
    assert ok(call("GET", "/api/instance-summaries", params={"process_id": "loan_approval"})) == []


def test_a_started_instance_is_located(call: Client) -> None:
    """201 Created names where the new instance is (``Location``), as an HTTP client expects of a create."""
    created = call("POST", "/api/instances", body={"process_id": PROCESS, "data": {
        "expense_id": "EXP-loc", "employee": "ann", "category": "meals", "rounds": 0}})
    iid = ok(created, 201)["instance_id"]
    assert created.headers["location"] == f"/api/instances/{iid}"
    assert ok(call("GET", "/api/instances/{instance_id}", iid))["instance_id"] == iid


def test_the_instance_list_pages_with_limit_and_offset(call: Client) -> None:
    """A client at scale pages the list as it pages a tape (``limit`` and ``offset`` were refused as unknown)."""
    started = [start(call, "meals") for _ in range(3)]
    whole = [row["instance_id"] for row in ok(call("GET", "/api/instances", params={"process_id": PROCESS}))]
    assert set(started) <= set(whole)
    pages = [row["instance_id"] for offset in range(0, len(whole), 2)
             for row in ok(call("GET", "/api/instances", params={"process_id": PROCESS, "limit": 2, "offset": offset}))]
    assert pages == whole
    assert ok(call("GET", "/api/instances", params={"offset": len(whole) + 100, "process_id": PROCESS})) == []
    refused(call("GET", "/api/instances", params={"limit": 0}), 422, "validation_error", "query.limit")


def test_paging_through_the_whole_tape_loses_no_event(call: Client) -> None:
    iid, _ = to_the_join(call, "hotel", 300, 0, "rejected")
    whole = ok(call("GET", "/api/instances/{instance_id}/tape", iid))
    assert whole["total"] == whole["count"] == len(whole["events"]) and whole["next_offset"] is None
    assert len({e["context"] for e in whole["events"]}) == 3  # main and the two branches
    pages: list[dict[str, Any]] = []
    offset: int | None = 0
    while offset is not None:
        page = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"limit": 7, "offset": offset}))
        assert page["total"] == whole["total"] and page["count"] == len(page["events"]) <= 7
        pages.extend(page["events"])
        offset = page["next_offset"]
    assert [json.dumps(e, sort_keys=True) for e in pages] == [json.dumps(e, sort_keys=True) for e in whole["events"]]
    last = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"offset": whole["total"]}))
    assert last["events"] == [] and last["next_offset"] is None
    refused(call("GET", "/api/instances/{instance_id}/tape", iid, params={"offset": -1}), 422,
            "validation_error", "query.offset")


def test_layerflow_list_filters_by_process_as_rest_does(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from engine.cli import main

    store = f"sqlite:///{tmp_path / 'runs.db'}"
    data = json.dumps({"expense_id": "EXP-cli", "employee": "ann", "category": "meals", "rounds": 0})
    run = CliRunner().invoke(main, ["run", str(HERE / "expense.bpmn"), "--data", data, "--store", store, "--json"])
    assert run.exit_code == 3, run.output
    iid = json.loads(run.stdout)["instance_id"]

    def listed(*args: str) -> list[str]:
        out = CliRunner().invoke(main, ["list", *args, "--store", store, "--json"])
        assert out.exit_code == 0, out.output
        return [row["instance_id"] for row in json.loads(out.stdout)]

    assert listed("--process", PROCESS) == [iid] == listed("--process", PROCESS, "--status", "waiting")
    assert listed("--process", "loan_approval") == []
    second = CliRunner().invoke(main, ["run", str(HERE / "expense.bpmn"), "--data", data, "--store", store, "--json"])
    newer = json.loads(second.stdout)["instance_id"]
    assert listed("--limit", "1") == [newer] and listed("--limit", "1", "--offset", "1") == [iid]
    assert listed("--offset", "2") == []


def test_layerflow_tape_pages_with_offset_as_rest_does(call: Client, folder: Path) -> None:
    from click.testing import CliRunner

    from engine.cli import main

    iid, _ = to_the_join(call, "hotel", 300, 0, "rejected")
    whole = ok(call("GET", "/api/instances/{instance_id}/tape", iid))
    store = f"sqlite:///{folder / 'rest.db'}"

    def page(*args: str) -> list[Any]:
        out = CliRunner().invoke(main, ["tape", iid, *args, "--store", store, "--json"])
        assert out.exit_code == 0, out.output
        return list(json.loads(out.stdout))

    assert page("--offset", "5", "--limit", "4") == whole["events"][5:9]
    assert page("--offset", str(whole["total"])) == []


def test_a_question_left_open_when_the_instance_completes_is_closed(call: Client) -> None:
    """An operator's governance model asks a person through the ``human_confirm`` tool while the
    expense waits for the manager; the manager approves and the expense is paid. The question was
    still listed as open (``GET /api/confirmations?instance_id=``) and a late answer was taken (200,
    a ``human_decision`` on the tape of a completed instance). It is closed as the instance completes."""
    iid = start(call, "hotel")
    submit(call, iid, 200)
    receipt(call, iid)
    asked = ok(call("POST", f"{GOV}/tools/{{name}}", "human_confirm",
                    body={"instance_id": iid, "arguments": {"message": "Is the receipt legible?", "options": [
                        {"label": "yes", "value": True}, {"label": "no", "value": False}]}}))
    assert asked["status"] == "pending"
    question = asked["confirmation_id"]
    assert [c["id"] for c in ok(call("GET", "/api/confirmations", params={"instance_id": iid}))] == [question]
    doc = manager(call, iid, 200)
    assert doc["status"] == "completed" and doc["conflicts"] == [], doc["error"]
    [closed] = [c for c in doc["confirmations"] if c["id"] == question]
    assert closed["answer"] is None and closed["cancelled"] is True
    assert ok(call("GET", "/api/confirmations", params={"instance_id": iid})) == []
    version = doc["version"]
    refused(call("POST", "/api/confirmations/{confirmation_id}", question, body={"value": True, "instance_id": iid}),
            409, "invalid_state", question, "completed")
    after = ok(call("GET", "/api/instances/{instance_id}", iid))
    assert after["version"] == version
    notes = ok(call("GET", "/api/instances/{instance_id}/tape", iid, params={"kind": "confirmation_closed"}))
    assert [e["data"]["confirmation_id"] for e in notes["events"]] == [question]


def test_a_refused_request_does_not_make_the_clients_version_stale(call: Client) -> None:
    """The employee's form sends a key the layer rules refuse (403, nothing applied); the client fixes
    it and sends again with the version it read. That retry got 409 ``version_conflict``: the refusal's
    note on the tape had been saved as a new version. A version that only refusals followed is current
    still; a change in between makes it stale as before."""
    iid = start(call, "hotel")
    read = ok(call("GET", "/api/instances/{instance_id}", iid))["version"]
    path = "/api/instances/{instance_id}/user-tasks/{task_id}"
    refused(call("POST", path, iid, "submit_expense", body={"data": {"category": "meals"}, "expected_version": read}),
            403, "permission_denied", "category")
    refused(call("POST", f"{GOV}/inject", body={"instance_id": iid, "layer": "L0", "key": "policy", "value": "x",
                                                "reason": "r", "expected_version": read}), 403, "permission_denied")
    assert ok(call("GET", "/api/instances/{instance_id}", iid))["version"] > read  # the refusals are on the tape
    doc = ok(call("POST", path, iid, "submit_expense", body={"data": {"amount_claimed": 120}, "expected_version": read}))
    assert [w["task_id"] for w in doc["waiting_for"]] == ["receive_receipt"]
    # a change since that version: stale, as before
    refused(call("POST", "/api/instances/{instance_id}/events", iid, body={
        "name": "receipt_received", "payload": {"receipt_id": "R-7"}, "expected_version": read}), 409, "version_conflict")
    refused(call("POST", "/api/instances/{instance_id}/events", iid, body={
        "name": "receipt_received", "payload": {"receipt_id": "R-7"}, "expected_version": read + 1}), 409,
        "version_conflict")


def test_a_nan_in_start_data_is_refused_in_json_terms(call: Client) -> None:
    """A client's JSON encoder that lets NaN through (Python's does) sent start data the engine cannot keep:
    the refusal spoke Python ("write None, bool, int, ...") to an HTTP client; it names JSON's values."""
    body = ('{"process_id": "%s", "data": {"expense_id": "EXP-nan", "employee": "ann", "category": "meals", '
            '"rounds": 0, "limit": NaN}}' % PROCESS)
    r = call("POST", "/api/instances", content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    message = r.json()["error"]["message"]
    assert "limit" in message and "None, bool" not in message, message
    assert "null, true or false, a finite number" in message, message
