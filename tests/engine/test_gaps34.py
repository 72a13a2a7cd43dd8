"""Round 34 gaps: the REST instance documents name who holds an instance's lease (``held_by``) as
`layerflow list` and `inspect --json` do; ..."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from engine.api import create_app
from engine.governance import GovernanceService
from engine.leases import lease_store
from engine.runtime import Engine

from governance_helpers import NOTES, TOKEN, make_catalog

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
