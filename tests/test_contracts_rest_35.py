"""REST documents that name an instance name it as ``instance_id`` (round 35), against a real
``layerflow serve``: the rows of ``GET /api/instances`` carried the store's ``id`` only, while the
instance documents, confirmations, tapes and governance answers say ``instance_id`` (and
``layerflow list --json`` gives both). ``id`` stays (added, never renamed)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import local_http
import pytest

from test_contracts_rest import AUTH, example_catalog, openapi_document, serving

pytestmark = pytest.mark.slow
LOAN = {"amount": 200000, "applicant_id": "APP035", "purpose": "equipment"}  # risk and finance disagree: waits


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest35")
    yield from serving(folder, example_catalog(folder))


def _json(method: str, url: str, **kw: Any) -> Any:
    r = local_http.request(method, url, headers=AUTH, timeout=120, **kw)
    assert r.status_code < 300, r.text[:400]
    return r.json()


def test_every_rest_document_naming_an_instance_says_instance_id(server: str) -> None:
    started = _json("POST", f"{server}/api/instances", json={"process_id": "loan_approval", "data": LOAN})
    iid = started["instance_id"]
    assert started["status"] == "waiting"
    rows = _json("GET", f"{server}/api/instances")
    assert rows and all(row["instance_id"] == row["id"] for row in rows)  # before: no instance_id in a row
    assert iid in {row["instance_id"] for row in rows}
    assert [r["instance_id"] for r in _json("GET", f"{server}/api/instances", params={"status": "waiting"})] == [iid]
    assert _json("GET", f"{server}/api/instances/{iid}")["instance_id"] == iid
    assert _json("GET", f"{server}/api/instances/{iid}/tape")["instance_id"] == iid
    asked = _json("GET", f"{server}/api/confirmations")
    assert asked and {c["instance_id"] for c in asked} == {iid}
    assert _json("POST", f"{server}/api/context-governance/inspect", json={"instance_id": iid})["instance_id"] == iid
    console = _json("GET", f"{server}/api/instance-summaries")  # the console's rows: the same
    assert console and all(row["instance_id"] == row["id"] for row in console)


def test_the_openapi_row_declares_instance_id_beside_id(server: str) -> None:
    schemas = openapi_document(server)["components"]["schemas"]
    row = schemas["InstanceSummary"]
    assert {"id", "instance_id"} <= set(row["required"])
    assert row["properties"]["instance_id"]["type"] == "string"
    # the other documents that name an instance declare it under the same name
    for name in ("InstanceDocument", "TapeDocument", "InspectResult", "InjectResult", "ReplayDocument"):
        assert "instance_id" in schemas[name]["required"], name
