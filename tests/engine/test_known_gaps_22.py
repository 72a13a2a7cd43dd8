"""Gaps closed in round 22.

(a) An event-based gateway waiting on a timer, a message and a signal listed its three waits in
    ``waiting_for`` under one ``id`` (the gateway's task), and only the message and signal items
    named their catch event (``event_id``); the timer's named it as ``task_id`` only. Each branch's
    item now has an ``id`` of its own (the task of its catch event, which runs when it wins), its
    ``event_id`` and the ``gateway_id`` it races at; ``kind`` and ``task_id`` are as before (the
    message's and signal's ``task_id`` the gateway, the timer's its timer event). A conditional branch
    was not listed at all; it is now, as the others are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import Engine, load_process
from engine import spiff

from engine_helpers import cli_in_a_tmp_store, run_json

cli = cli_in_a_tmp_store

HERE = Path(__file__).parent
RACE = HERE / "unseen2" / "approval_race.bpmn"  # Gateway_0race: message approval, signal veto, timer P3D


# ----- (a) each branch of an event-based gateway is its own waiting_for item ------------------------------------

def _branch_tasks(instance: Any) -> dict[str, str]:
    """BPMN id -> task id of the gateway's branches (their catch events' tasks)."""
    gateway = next(t for t in instance.workflow.get_tasks() if spiff.bpmn_id_of(t) == "Gateway_0race")
    return {spiff.bpmn_id_of(c): str(c.id) for c in gateway.children}


def test_each_branch_of_an_event_based_gateway_waits_under_its_own_id() -> None:
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([RACE]), {}))
    branches = _branch_tasks(instance)
    items = {w["event_id"]: w for w in instance.waiting_for}
    assert set(items) == {"Event_0late", "Activity_0approval", "Event_0veto"}, instance.waiting_for
    assert len({w["id"] for w in instance.waiting_for}) == 3
    for event_id, item in items.items():
        assert item["id"] == branches[event_id] and item["gateway_id"] == "Gateway_0race"
    # kinds and task ids as before: the timer's its event, the message's and signal's the gateway
    assert (items["Event_0late"]["kind"], items["Event_0late"]["task_id"]) == ("timer", "Event_0late")
    assert [(items[e]["kind"], items[e]["event_kind"], items[e]["task_id"]) for e in ("Activity_0approval", "Event_0veto")] \
        == [("event", "message", "Gateway_0race"), ("event", "signal", "Gateway_0race")]
    done = engine.send_event(instance, "veto", None, kind="signal")
    assert done.status == "completed" and done.waiting_for == []


def test_the_run_document_lists_each_branch_with_its_event(cli: Any) -> None:
    doc = run_json(cli, "run", str(RACE), code=3)
    assert sorted((w["kind"], w["event_id"], w["gateway_id"]) for w in doc["waiting_for"]) == [
        ("event", "Activity_0approval", "Gateway_0race"), ("event", "Event_0veto", "Gateway_0race"),
        ("timer", "Event_0late", "Gateway_0race")]
    assert len({w["id"] for w in doc["waiting_for"]}) == 3
    shown = run_json(cli, "inspect", doc["instance_id"])
    assert shown["waiting_for"] == doc["waiting_for"]


def test_a_conditional_branch_of_an_event_based_gateway_is_listed_beside_its_message() -> None:
    """It was not listed at all: the gateway's task waited for the message, and a waiting task
    that catches a message was not looked at again for its conditions."""
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process([HERE / "gaps22" / "cond_race.bpmn"]), {}))
    assert sorted((w["event_kind"], w["event_id"], w["gateway_id"], w["task_id"]) for w in instance.waiting_for) == [
        ("conditional", "restocked", "gw", "gw"), ("message", "ok_in", "gw", "gw")]
    assert next(w for w in instance.waiting_for if w["event_kind"] == "conditional")["condition"] == "stock > 5"
    assert len({w["id"] for w in instance.waiting_for}) == 2
