"""Gaps closed in round 20 (b).

(a) ``--by NAME`` on ``run``, ``demo loan`` and ``resume``: the CLI names the person whose answers these are,
as REST's ``user`` and ``Engine.run/resume/answer_confirmation(by=...)`` do. The join's resolution says
``by`` and its reason names them, the tape's ``human_decision`` note and a user task's writes have them as
their actor; without ``--by`` the answer stays an unnamed person's; ``--yes`` stays unattended whoever runs it.
(b) ``GET /api/confirmations`` gives an open confirmation with a timeout its ``due`` (ISO 8601 UTC) beside
the epoch ``deadline``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from engine import Engine

from engine_helpers import cli_in_a_tmp_store, run_json

cli = cli_in_a_tmp_store
EXAMPLES = Path(__file__).resolve().parents[2] / "bpmn_examples"
CONFLICT_ANSWER = "review_join/approval_status=pending_dual_approval"


def _instance(iid: str) -> Any:
    return Engine(os.environ["LAYERFLOW_STORE"]).load(iid)


def _decisions(iid: str) -> list[Any]:
    instance = _instance(iid)
    return [e for ctx in instance.contexts.values() for e in ctx.tape if (e.data or {}).get("note") == "human_decision"]


def test_demo_answered_by_a_named_person_names_them_in_the_resolution_and_on_the_tape(cli: Any) -> None:
    doc = run_json(cli, "demo", "loan", "--scenario", "conflict", "--answer", CONFLICT_ANSWER, "--by", "alice")
    [conflict] = doc["conflicts"]
    resolution = conflict["resolution"]
    assert (resolution["value"], resolution["resolver"], resolution.get("by")) == (
        "pending_dual_approval", "human", "alice"), resolution
    assert resolution["reason"].startswith("a person (alice) "), resolution
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "alice" and "unattended" not in decision.data, decision


def test_resume_by_a_named_person_names_them(cli: Any) -> None:
    waiting = run_json(cli, "demo", "loan", "--scenario", "conflict", code=3)
    doc = run_json(cli, "resume", waiting["instance_id"], "--answer", CONFLICT_ANSWER, "--by", " bob ")
    resolution = doc["conflicts"][0]["resolution"]
    assert resolution.get("by") == "bob" and resolution["reason"].startswith("a person (bob) "), resolution
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "bob", decision


def test_without_by_the_answer_stays_an_unnamed_persons(cli: Any) -> None:
    doc = run_json(cli, "demo", "loan", "--scenario", "conflict", "--answer", CONFLICT_ANSWER)
    resolution = doc["conflicts"][0]["resolution"]
    assert "by" not in resolution and resolution["reason"].startswith("a person confirmed"), resolution
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "person", decision


def test_yes_stays_unattended_with_by(cli: Any) -> None:
    doc = run_json(cli, "demo", "loan", "--scenario", "conflict", "--yes", "--by", "alice")
    resolution = doc["conflicts"][0]["resolution"]
    assert "by" not in resolution and resolution["reason"].startswith("layerflow --yes took"), resolution
    [decision] = _decisions(doc["instance_id"])
    assert decision.actor == "layerflow --yes" and decision.data["unattended"] is True, decision


def test_a_user_task_answered_by_a_named_person_has_them_as_its_actor(cli: Any) -> None:
    bpmn = str(EXAMPLES / "parallel_user_task.bpmn")
    waiting = run_json(cli, "run", bpmn, "--data", '{"title": "Q3 report"}', code=3)
    doc = run_json(cli, "resume", waiting["instance_id"], "--answer", 'review={"approved": true, "reviewer": "ann"}', "--by", "ann")
    assert doc["status"] == "completed", doc
    inputs = [e for ctx in _instance(doc["instance_id"]).contexts.values() for e in ctx.tape
              if (e.data or {}).get("note") == "user_input"]
    assert inputs and {e.actor for e in inputs} == {"ann"}, inputs


def test_an_empty_by_is_bad_input_and_nothing_starts(cli: Any) -> None:
    result = cli("demo", "loan", "--scenario", "conflict", "--by", "  ")
    assert result.exit_code == 2, (result.stdout, result.stderr)
    assert "--by: give the name of the person answering" in result.stderr, result.stderr
    assert Engine(os.environ["LAYERFLOW_STORE"]).store.list_instances() == []


def test_an_open_confirmation_with_a_deadline_is_listed_with_its_iso_due(tmp_path: Path) -> None:
    """GET /api/confirmations: a confirmation with a timeout gives ``due`` (ISO 8601 UTC) beside its epoch
    ``deadline``, the same moment ``waiting_for`` names."""
    from datetime import datetime

    from fastapi.testclient import TestClient

    from engine.api import create_app
    from governance_helpers import LOAN_CONFLICT, TOKEN, make_catalog

    auth = {"Authorization": f"Bearer {TOKEN}"}
    with TestClient(create_app("memory://", make_catalog(tmp_path), TOKEN)) as client:
        started = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_CONFLICT},
                              headers=auth).json()
        [pending] = client.get("/api/confirmations", headers=auth).json()
        doc = client.get(f"/api/instances/{started['instance_id']}", headers=auth).json()
    assert datetime.fromisoformat(pending["due"]).timestamp() == pytest.approx(pending["deadline"]), pending
    [waiting] = [w for w in doc["waiting_for"] if w["kind"] == "confirmation"]
    assert pending["due"] == waiting["due"], (pending, waiting)
