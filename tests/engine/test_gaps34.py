"""Round 34 gaps: the REST instance documents name who holds an instance's lease (``held_by``) as
`layerflow list` and `inspect --json` do; ..."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from engine.api import create_app
from engine.governance import GovernanceService
from engine.leases import lease_store
from engine.process import load_process
from engine.runtime import Engine

from governance_helpers import EXAMPLES, LOAN_CONFLICT, NOTES, ROOT, TOKEN, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _waiting(client: TestClient) -> str:
    r = client.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}, headers=AUTH)
    assert r.status_code == 201 and r.json()["status"] == "waiting", r.text
    return str(r.json()["instance_id"])


def test_rest_instance_list_and_document_name_the_lease_holder(tmp_path: Path) -> None:
    """A worker holding a waiting instance's lease (its timer or an answer being run) is named in
    GET /api/instances and GET /api/instances/{id}, as `layerflow list --json` names it; the
    OpenAPI schema declares the field."""
    engine = Engine(f"sqlite:///{tmp_path / 'gaps34.db'}")
    with TestClient(create_app(GovernanceService(engine, _catalog(tmp_path)), token=TOKEN)) as client:
        iid = _waiting(client)
        assert _held(client, iid) == (None, None)
        leases = lease_store(engine.store)
        assert leases is not None and leases.acquire_lease(iid, "worker-7", 30.0)
        assert _held(client, iid) == ("worker-7", "worker-7")
        leases.release_lease(iid, "worker-7")
        assert _held(client, iid) == (None, None)
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
        assert "held_by" in schemas["InstanceView"]["properties"]
        assert "held_by" in schemas["InstanceSummary"]["properties"]
        listing = client.get("/openapi.json").json()["paths"]["/api/instances"]["get"]["responses"]["200"]
        assert listing["content"]["application/json"]["schema"]["items"]["$ref"].endswith("/InstanceSummary")


def _catalog(tmp_path: Path) -> Path:
    return make_catalog(tmp_path)


def _held(client: TestClient, iid: str) -> tuple[Any, Any]:
    (row,) = [r for r in client.get("/api/instances", headers=AUTH).json() if r["id"] == iid]
    doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
    return row["held_by"], doc["held_by"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_tape_activity_typo_lists_only_the_process_ids_and_names_the_nearest(tmp_path: Path) -> None:
    """The loan tape has events by the actors ``engine`` and ``input`` (no activity of the process):
    a mistyped ``--activity`` listed them as "activities and gateways" and gave no hint."""
    store = f"sqlite:///{tmp_path / 'tape.db'}"
    engine = Engine(store)
    instance = engine.run(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_CONFLICT)
    doc = GovernanceService(engine).tape(instance.id, activity="risk_asessment")
    assert doc["count"] == 0
    assert "risk_assessment" in doc["activities"] and "approval_split" in doc["activities"]
    assert not {"engine", "input"} & set(doc["activities"]), doc["activities"]
    assert "did you mean 'risk_assessment'?" in doc["note"], doc["note"]
    result = _cli("tape", instance.id, "--activity", "risk_asessment", "--store", store)
    assert result.returncode == 0 and result.stdout == "", result
    assert result.stderr.strip() == f"layerflow: {doc['note']}"
    listed = result.stderr.split("activities and gateways on this tape: ")[1].strip().split(", ")
    assert listed == doc["activities"]
