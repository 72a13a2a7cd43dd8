"""Outsider round 35: processes nobody here had seen, written from README.md and DESIGN.md only
(tests/engine/outsider35/, saved as Camunda Modeler saves them, with their diagrams), driven through
the Python API, the CLI, a real ``layerflow serve`` and Redis workers.

procurement: a parallel multi-instance sub-process over the purchase order's lines; in each line a
  price benchmark (an ``llm:`` step run by its offline handler) and the buyer's review (a user task)
  run in parallel and may disagree on ``line_status``, which the join inside the body puts to a
  person (``humanConfirm`` with a default); the collected ``line_results`` are totalled after it.

payment: a script task that raises ``BpmnError`` is caught by an error boundary event, counted and
  retried through an exclusive gateway, inside a sub-process whose escalation end event (retries
  spent) is caught on the sub-process and leads to a person's manual undo; the context at every
  snapshot is rebuilt from the tape (CLI ``replay --until`` and REST ``replay``) and rolled back.

employee_onboarding: a timer, then an event-based gateway racing a message against a deadline whose
  reminder loops back to the gateway; submitted to Redis, run by two workers at once, its timers fired
  with ``timers --fire --now``.

Expected before anything ran: as README and DESIGN say, and so it was, but for:
- procurement: two lines whose join asked a person (``Gateway_line_join/line_status`` and ``#2``, the
  two firings disagreeing with different values); answering ``#2`` listed its conflict twice in
  ``conflicts``, once settled and once still ``"resolution": null`` (README: "each conflict is listed
  once, however often the join runs again as its questions are answered"). The open questions of the
  other firings were counted by key only; each join confirmation now carries its conflict's ``values``
  (branch id -> value, as the conflict has them), and a firing's answered conflict replaces its own.
  (Answering the three lines' questions in random orders, with a second conflicting key on some lines,
  listed a conflict twice in 96 of 120 orders; none now.)
- procurement: with the three lines waiting for their buyers, REST ``inject`` with ``"context":
  "Activity_buyer_review"`` (README: name the branch by the id of its first element) wrote into the third
  line's branch without a word, and ``inspect``/``replay``/``tape --context`` showed that one: the latest
  of three open contexts. A branch id that several open contexts run at once is now refused (404, CLI exit
  2) naming each of them in full, as ``resolve`` refuses a conflict key open in several confirmations.
- payment: REST ``rollback`` of an unknown snapshot said "``GET /api/instances/{id}/tape?kind=snapshot``
  lists them", the ``{id}`` left as it was, and that listing (like ``layerflow tape --kind snapshot``,
  which ``rollback --help`` pointed to) holds the splits' snapshots only, not the ``before TASK`` one each
  activity's ``begin`` takes, which ``snapshot --list`` shows and rollback takes. Both now name the
  instance and say where each kind of snapshot is listed (``kind=begin``).
- procurement: ``Engine.answer_confirmation`` of a line's question answered already, while the other lines
  still asked theirs, raised a bare ``ActivityError`` ("no open confirmation"), where REST answers 409
  ``already_answered`` naming who answered it: it now raises ``AnsweredAlready`` (the same fields).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, redis_scratch, run_json, serving_catalog
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "outsider35"
TOKEN = "outsider35-token"
REDIS = "redis://127.0.0.1:6379/8"  # this module's own database
ROOT = Path(__file__).resolve().parents[2]
PROCUREMENT = HERE / "procurement.bpmn"
PAYMENT = HERE / "payment.bpmn"
ONBOARDING = HERE / "onboarding.bpmn"
LINE_STATUS = "Gateway_line_join/line_status"
ORDER = {"po_id": "PO-881", "supplier": "Acme", "lines": [
    {"sku": "BOLT-M8", "qty": 1000, "price": 0.12},     # at list price: the benchmark says ok
    {"sku": "PUMP-3KW", "qty": 2, "price": 990.0},      # 18% over list: overpriced
    {"sku": "GLOVE-L", "qty": 40, "price": 2.5}]}


def reviewed_order(engine: Engine, buyer_says: list[str]) -> Any:
    """The order run until each line's buyer answered (in line order) with ``buyer_says``."""
    instance = engine.run(load_process(PROCUREMENT), ORDER)
    reviews = [w["id"] for w in instance.waiting_for if w["task_id"] == "Activity_buyer_review"]
    assert len(reviews) == 3
    for review, status in zip(reviews, buyer_says):
        instance = engine.complete_user_task(instance, review, {"line_status": status, "buyer": "kim"})
    return instance


def open_conflicts(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [c["values"] for c in doc["conflicts"] if c["resolution"] is None]


@pytest.mark.parametrize("first", [f"{LINE_STATUS}#2", LINE_STATUS])
def test_each_line_conflict_is_listed_once_as_its_firing_is_answered(first: str) -> None:
    engine = Engine("memory://")
    instance = reviewed_order(engine, ["ok", "ok", "hold"])  # line 2 and line 3 disagree, differently
    doc = instance.to_document()
    assert sorted(c["id"] for c in doc["confirmations"]) == [LINE_STATUS, f"{LINE_STATUS}#2"]
    assert open_conflicts(doc) == [{"Activity_price_check": "overpriced", "Activity_buyer_review": "ok"},
                                   {"Activity_price_check": "ok", "Activity_buyer_review": "hold"}]
    line_of = {c["id"]: 2 if "Activity_lines#2@" in c["context"] else 3 for c in doc["confirmations"]}
    values = {2: {"Activity_price_check": "overpriced", "Activity_buyer_review": "ok"},
              3: {"Activity_price_check": "ok", "Activity_buyer_review": "hold"}}
    answer = "ok" if line_of[first] == 3 else "hold"
    instance = engine.answer_confirmation(instance, first, answer)
    doc = instance.to_document()
    check_run_document(doc)
    assert len(doc["conflicts"]) == 2, doc["conflicts"]
    [still_open] = open_conflicts(doc)
    assert still_open == values[5 - line_of[first]]
    [settled] = [c for c in doc["conflicts"] if c["resolution"] is not None]
    assert settled["values"] == values[line_of[first]] and settled["resolution"]["value"] == answer
    # each question shows the branches' values it asks about, as its conflict lists them
    assert {c["id"]: c["values"] for c in doc["confirmations"]} == {i: values[n] for i, n in line_of.items()}
    [other] = [c["id"] for c in doc["confirmations"] if not c["answered"]]
    instance = engine.answer_confirmation(instance, other, "hold" if answer == "ok" else "ok")
    doc = instance.to_document()
    assert len(doc["conflicts"]) == 2 and open_conflicts(doc) == []
    results = instance.main.resolve("line_results")
    assert [r["sku"] for r in results] == ["BOLT-M8", "PUMP-3KW", "GLOVE-L"]
    assert results[0]["status"] == "ok"
    assert [w["task_id"] for w in doc["waiting_for"]] == ["Activity_manager"]  # a line is held


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One real ``layerflow serve`` of this folder's processes for the module's REST tests: its client
    and the store it keeps the instances in (the CLI reads them there)."""
    tmp = tmp_path_factory.mktemp("serve35")
    store = f"sqlite:///{tmp / 'api.db'}"
    with serving_catalog(HERE, store, tmp / "serve.log", TOKEN) as client:
        yield client, store


@pytest.fixture
def api(served: Any) -> Any:
    return served[0]


def test_a_branch_id_that_names_several_open_lines_is_refused_not_guessed(api: Any) -> None:
    started = api.post("/api/instances", json={"process_id": "procurement", "data": ORDER})
    assert started.status_code in (200, 201), started.text
    doc = started.json()
    iid = doc["instance_id"]
    assert [w["task_id"] for w in doc["waiting_for"]] == ["Activity_buyer_review"] * 3
    tape_before = api.get(f"/api/instances/{iid}/tape").json()["count"]
    refused = api.post("/api/context-governance/inject", json={
        "instance_id": iid, "context": "Activity_buyer_review", "key": "buyer_note", "value": "pump: ask for 5% off"})
    assert refused.status_code == 404, refused.text
    message = refused.json()["error"]["message"]
    names = [n for n, c in doc["contexts"].items() if c["branch_id"] == "Activity_buyer_review"]
    assert len(names) == 3 and all(name in message for name in names), message
    assert "'Activity_buyer_review'" in message
    after = api.get(f"/api/instances/{iid}").json()
    assert after["version"] == doc["version"] and api.get(f"/api/instances/{iid}/tape").json()["count"] == tape_before
    # the line meant, named in full: that context alone gets the note
    pump = next(n for n in names if "Activity_lines#2@" in n)
    done = api.post("/api/context-governance/inject", json={
        "instance_id": iid, "context": pump, "key": "buyer_note", "value": "pump: ask for 5% off"})
    assert done.status_code == 200 and done.json()["context"] == pump, done.text
    inspected = api.post("/api/context-governance/inspect", json={"instance_id": iid, "context": "Activity_buyer_review"})
    assert inspected.status_code == 404 and pump in inspected.json()["error"]["message"]
    replayed = api.get(f"/api/instances/{iid}/replay", params={"context": pump})
    assert replayed.status_code == 200, replayed.text
    assert any(k["key"] == "buyer_note" for k in replayed.json()["layers"]["L4"]["keys"])


def order(fail_times: int) -> dict[str, Any]:
    return {"order_id": f"O-{fail_times}", "items": ["kettle", "mug"], "fail_times": fail_times}


def test_a_charge_that_times_out_twice_is_retried_and_paid() -> None:
    engine = Engine("memory://")
    instance = engine.run(load_process(PAYMENT), order(2))
    doc = instance.to_document()
    check_run_document(doc)
    assert doc["status"] == "completed", doc["error"]
    history = doc["layers"]["L3"]
    assert history["receipt"] == "R-O-2-3" and history["outcome"] == "paid" and history["attempt"] == 2
    assert history["failures"] == ["acq-1", "acq-2"] and history["reservation"]["state"] == "shipped"
    thrown = [history[k] for k in history if k.startswith("activity:Activity_charge")]
    assert [t["status"] for t in thrown] == ["error_thrown", "error_thrown", "completed"]
    assert thrown[0]["error_code"] == "gateway_timeout" and thrown[0]["caught_by"] == ["Event_timeout"]
    assert [k for k in history if k.startswith("event:")] == ["event:Event_timeout", "event:Event_timeout#2"]


def test_retries_spent_escalate_to_a_manual_undo(cli: Any) -> None:
    doc = run_json(cli, "run", str(PAYMENT), "--data", json.dumps(order(5)), code=3)
    check_run_document(doc)
    [undo] = doc["waiting_for"]
    assert undo["task_id"] == "Activity_undo" and undo["documentation"].startswith("The card could not")
    history = doc["layers"]["L3"]
    assert history["attempt"] == 3 and history["reservation"]["state"] == "held" and "receipt" not in history
    assert history["event:Event_failed"]["event_kind"] == "escalation"
    assert history["event:Event_failed"]["code"] == "payment_failed"
    done = run_json(cli, "resume", doc["instance_id"], "--answer", 'Activity_undo={"released_by": "ops"}')
    assert done["status"] == "completed" and done["layers"]["L3"]["reservation"]["state"] == "released"
    assert done["layers"]["L3"]["outcome"] == "cancelled"


def test_every_snapshot_replays_alike_on_the_cli_and_rest_and_a_rollback_gives_it_back(
        served: Any, cli: Any) -> None:
    api, url = served
    store = ["--store", url]
    started = api.post("/api/instances", json={"process_id": "payment", "data": order(5)}).json()
    iid = started["instance_id"]
    assert started["status"] == "waiting"
    tape = api.get(f"/api/instances/{iid}/tape", params={"context": "main"}).json()["events"]
    # what rollback takes: the snapshots of the splits (kind snapshot) and the one each activity's begin took,
    # as `snapshot --list` and the refusal of an unknown snapshot (below) name them
    taken = [e for e in tape if e["kind"] in ("snapshot", "begin") and "snapshot_id" in e["data"]]
    listed = run_json(cli, "snapshot", iid, "--list", *store)["snapshots"]
    assert sorted(e["data"]["snapshot_id"] for e in taken) == sorted(
        s["snapshot_id"] for s in listed if s["context"] == "main")
    seqs = [e["seq"] for e in taken]
    assert len(seqs) >= 10
    replayed = {}
    for seq in seqs:
        rest = api.get(f"/api/instances/{iid}/replay", params={"context": "main", "until": seq}).json()
        layers = {name: {k["key"]: k["value"] for k in layer["keys"]} for name, layer in rest["layers"].items()}
        on_cli = run_json(cli, "replay", iid, "--until", str(seq), *store)
        assert on_cli["layers"] == layers, seq
        replayed[seq] = layers
    # back to before the second count: attempt 1, one failure
    second_count = [e for e in taken if e["activity"] == "Activity_count"][1]
    version = api.get(f"/api/instances/{iid}").json()["version"]
    rolled = api.post("/api/context-governance/rollback", json={
        "instance_id": iid, "snapshot_id": second_count["data"]["snapshot_id"], "expected_version": version,
        "reason": "audit the retries"})
    assert rolled.status_code == 200, rolled.text
    back = rolled.json()
    assert back["layers"] == replayed[second_count["seq"]] and back["restored_layers"] == ["L2", "L3", "L4", "L5"]
    assert back["layers"]["L3"]["attempt"] == 1 and back["layers"]["L3"]["failures"] == ["acq-1"]
    stale = api.post("/api/context-governance/rollback", json={
        "instance_id": iid, "snapshot_id": second_count["data"]["snapshot_id"], "expected_version": version})
    assert stale.status_code == 409 and stale.json()["error"]["kind"] == "version_conflict"
    unknown = api.post("/api/context-governance/rollback", json={"instance_id": iid, "snapshot_id": "snap:main:999"})
    assert unknown.status_code == 404
    refusal = unknown.json()["error"]["message"]
    assert f"/api/instances/{iid}/tape?kind=snapshot" in refusal and "?kind=begin" in refusal
    # the whole tape, replayed, is the context the rollback left
    assert run_json(cli, "replay", iid, *store)["layers"] == back["layers"]
    done = api.post(f"/api/instances/{iid}/user-tasks/Activity_undo", json={"data": {"released_by": "ops"}})
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    assert done.json()["layers"]["L3"]["reservation"]["state"] == "released"


@pytest.fixture
def redis_store() -> Iterator[tuple[str, str]]:
    with redis_scratch(REDIS, "outsider35") as prefix:
        yield f"{REDIS}?prefix={prefix}", f"{prefix}:ready"


def hire(name: str) -> str:
    return json.dumps({"employee": f"{name} Smith", "start_date": "2027-01-04", "cooldown": "PT1S", "deadline": "P3D"})


def waits_at_the_race(doc: dict[str, Any]) -> bool:
    return sorted(w["task_id"] for w in doc["waiting_for"]) == ["Event_deadline", "Gateway_wait_signature"]


def test_two_workers_run_the_onboardings_and_cron_fires_their_deadlines(
        cli: Any, redis_store: tuple[str, str]) -> None:
    store, stream = redis_store
    on = ["--store", store]
    ids = [json.loads(cli("submit", str(ONBOARDING), "--data", hire(n), *on, "--stream", stream, "--json").stdout)
           ["instance_ids"][0] for n in ("Ann", "Bob", "Cy", "Dee")]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [subprocess.Popen([sys.executable, "-m", "engine.cli", "worker", *on, "--stream", stream,
                                 "--timer-interval", "0.2", "--consumer", f"o35-{n}-{uuid.uuid4().hex[:6]}"],
                                env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                stdin=subprocess.DEVNULL, start_new_session=True) for n in (1, 2)]
    try:
        deadline = time.monotonic() + 30
        while not all(waits_at_the_race(run_json(cli, "inspect", i, *on)) for i in ids):
            assert all(w.poll() is None for w in workers) and time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        for w in workers:
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            w.wait(timeout=20)
    signed = [run_json(cli, "send", i, "contract_signed", "--json-payload", json.dumps({"signed_copy": f"{i}.pdf"}),
                       *on) for i in ids[:2]]
    assert [d["status"] for d in signed] == ["completed", "completed"]
    assert signed[0]["layers"]["L3"]["accounts"] == {"email": "ann.smith@example.com", "laptop": True}
    now = (datetime.now(timezone.utc) + timedelta(days=3, minutes=5)).strftime("%Y-%m-%dT%H:%M:%SZ")
    fired = run_json(cli, "timers", *on, "--now", now, "--fire")
    assert sorted(f["instance_id"] for f in fired["fired"]) == sorted(ids[2:])
    assert all(f["status"] == "waiting" for f in fired["fired"])
    for iid in ids:
        doc = run_json(cli, "inspect", iid, *on)
        history = doc["layers"]["L3"]
        # each step ran once, whichever worker ran it (no retry, no second firing of a timer)
        assert [k for k in history if k.startswith("activity:Activity_prepare")] == ["activity:Activity_prepare"]
        retries = cli("tape", iid, "--kind", "retry", "--json", *on)
        assert retries.exit_code == 0 and json.loads(retries.stdout) == []
        if iid in ids[2:]:
            assert waits_at_the_race(doc) and history["reminders"] == 1
            [due] = [w["due"] for w in doc["waiting_for"] if w["task_id"] == "Event_deadline"]
            assert datetime.fromisoformat(due) > datetime.fromisoformat(now.replace("Z", "+00:00")) + timedelta(days=2)
        else:
            assert doc["status"] == "completed" and history["reminders"] == 0


def test_a_second_answer_to_one_line_is_refused_as_answered_while_other_lines_still_ask() -> None:
    """REST answers a second answer to a line's question with 409 ``already_answered``; the Python API
    said only that there is "no open confirmation", as for an id that never existed."""
    from engine.governance import AnsweredAlready

    engine = Engine("memory://")
    instance = reviewed_order(engine, ["hold", "hold", "hold"])  # every line asks
    first = next(c for c in instance.confirmations if c["id"] == LINE_STATUS)
    instance = engine.answer_confirmation(instance, LINE_STATUS, "hold", by="maria")
    version = instance.version
    with pytest.raises(AnsweredAlready) as refused:
        engine.answer_confirmation(instance, LINE_STATUS, "ok")
    assert refused.value.kind == "already_answered" and refused.value.answered_by == "maria"
    assert refused.value.context == first["context"] and '"hold"' in str(refused.value)
    assert engine.load(instance.id).version == version
    assert sorted(w["id"] for w in instance.waiting_for) == [f"{LINE_STATUS}#2", f"{LINE_STATUS}#3"]


def test_the_lines_questions_are_answered_over_rest_one_by_one(api: Any) -> None:
    started = api.post("/api/instances", json={"process_id": "procurement", "data": ORDER})
    iid = started.json()["instance_id"]
    for status in ("ok", "ok", "hold"):  # the BPMN id completes the first line that waits
        done = api.post(f"/api/instances/{iid}/user-tasks/Activity_buyer_review",
                        json={"data": {"line_status": status, "buyer": "kim"}})
        assert done.status_code == 200, done.text
    doc = done.json()
    check_run_document(doc)
    assert done.json()["completed_user_task"]["instance"] == 3
    asked = {c["id"]: c for c in api.get("/api/confirmations", params={"instance_id": iid}).json()}
    assert sorted(asked) == [LINE_STATUS, f"{LINE_STATUS}#2"]
    assert asked[f"{LINE_STATUS}#2"]["values"] == {"Activity_price_check": "ok", "Activity_buyer_review": "hold"}
    # the instance document's waiting items name the line each question belongs to, as the list does
    assert len({c["context"] for c in asked.values()}) == 2
    assert {w["id"]: w["context"] for w in doc["waiting_for"] if w["kind"] == "confirmation"} == {
        cid: c["context"] for cid, c in asked.items()}
    not_offered = api.post(f"/api/confirmations/{LINE_STATUS}%232", json={"value": "overpriced", "instance_id": iid})
    assert not_offered.status_code == 400 and not_offered.json()["error"]["kind"] == "invalid_answer"
    answered = api.post(f"/api/confirmations/{LINE_STATUS}%232", json={"value": "ok", "instance_id": iid, "user": "maria"})
    assert answered.status_code == 200, answered.text
    doc = answered.json()
    assert [c["values"]["Activity_price_check"] for c in doc["conflicts"] if c["resolution"] is None] == ["overpriced"]
    assert len(doc["conflicts"]) == 2 and [w["id"] for w in doc["waiting_for"]] == [LINE_STATUS]
    again = api.post(f"/api/confirmations/{LINE_STATUS}%232", json={"value": "hold", "instance_id": iid})
    assert again.status_code == 409 and again.json()["error"]["answered_by"] == "maria"
    last = api.post(f"/api/confirmations/{LINE_STATUS}", json={"value": "hold", "instance_id": iid})
    doc = last.json()
    assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["Activity_manager"]
    assert [r["status"] for r in doc["layers"]["L3"]["line_results"]] == ["ok", "hold", "ok"]
    assert doc["layers"]["L3"]["held"] == ["PUMP-3KW"] and doc["layers"]["L3"]["approved_total"] == 220.0
    assert sorted(c["resolution"]["value"] for c in doc["conflicts"]) == ["hold", "ok"]
