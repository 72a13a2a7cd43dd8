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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process

from engine_helpers import cli_in_a_tmp_store, run_json, serving_catalog
from test_contracts_cli import check_run_document

cli = cli_in_a_tmp_store  # the fixture "cli", here too

HERE = Path(__file__).resolve().parent / "outsider35"
TOKEN = "outsider35-token"
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
def api(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One real ``layerflow serve`` of this folder's processes for the module's REST tests."""
    tmp = tmp_path_factory.mktemp("serve35")
    with serving_catalog(HERE, f"sqlite:///{tmp / 'api.db'}", tmp / "serve.log", TOKEN) as client:
        yield client


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
