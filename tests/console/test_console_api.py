"""The console's endpoints and files, through the app (no browser): auth, errors, replay, SVG."""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from fastapi.testclient import TestClient

from context_layers import LayeredContext
from engine.api import create_app
from engine.cli import LOAN_SCENARIOS
from engine.console import SECURITY_HEADERS

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "console-unit-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIRMATION = "review_join/approval_status"


@pytest.fixture
def client():
    with TestClient(create_app("memory://", ROOT / "bpmn_examples", TOKEN)) as c:
        yield c


@pytest.fixture
def loan(client) -> str:
    r = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_SCENARIOS["conflict"]},
                    headers=AUTH)
    assert r.status_code == 201 and r.json()["status"] == "waiting"
    return str(r.json()["instance_id"])


def paths(instance_id: str) -> list[str]:
    return ["/api/instance-summaries", f"/api/instances/{instance_id}/diagram.svg",
            "/api/processes/loan_approval/diagram.svg", f"/api/instances/{instance_id}/replay"]


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_every_console_endpoint_needs_the_token(client, loan, headers):
    for path in paths(loan):
        r = client.get(path, headers=headers)
        assert r.status_code == 401, path
        assert r.json()["error"]["kind"] == "unauthorized"
        assert loan not in r.text


def test_the_endpoints_are_documented(client):
    schema = client.get("/openapi.json").json()
    for path in ("/api/instance-summaries", "/api/instances/{instance_id}/diagram.svg",
                 "/api/processes/{process_id}/diagram.svg", "/api/instances/{instance_id}/replay"):
        op = schema["paths"][path]["get"]
        assert op["tags"] == ["console"] and op["summary"] and op["description"]
        assert op.get("security"), f"{path} does not declare the bearer token"
        assert {"401", "404"} <= set(op["responses"]) or path == "/api/instance-summaries"  # a list: no 404
    svg = schema["paths"]["/api/instances/{instance_id}/diagram.svg"]["get"]["responses"]["200"]["content"]
    assert "image/svg+xml" in svg
    assert "/" not in schema["paths"]  # the page is not an API operation


def test_the_page_and_its_files_are_open_and_locked_down(client, loan):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == SECURITY_HEADERS["Content-Security-Policy"]
    assert "connect-src 'self'" in page.headers["content-security-policy"]
    assert loan not in page.text  # the page holds no data; it asks the API with the token
    # an inline icon (CSP img-src allows data:): browsers ask for no /favicon.ico, which is a 404
    assert '<link rel="icon" href="data:,">' in page.text and "img-src 'self' data:" in page.headers["content-security-policy"]
    for name, kind in (("app.js", "javascript"), ("app.css", "text/css")):
        r = client.get(f"/console/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
        assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/console/nope.js").status_code == 404


def test_static_files_fetch_nothing_from_elsewhere():
    for path in (ROOT / "engine" / "static").iterdir():
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, path.name
        assert "innerHTML" not in text, path.name  # text goes in with textContent only


def test_instance_summaries(client, loan):
    done = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_SCENARIOS["fast"]},
                       headers=AUTH).json()["instance_id"]
    rows = client.get("/api/instance-summaries", headers=AUTH).json()
    assert {r["id"] for r in rows} == {loan, done}
    row = next(r for r in rows if r["id"] == loan)
    assert row["process_id"] == "loan_approval" and row["status"] == "waiting" and row["open_conflicts"] == 1
    assert [w["id"] for w in row["waiting_for"]] == [CONFIRMATION]
    assert row["tokens_total"] > 0 and row["started"].endswith("Z") and row["version"] >= 1
    assert [r["id"] for r in client.get("/api/instance-summaries?status=completed", headers=AUTH).json()] == [done]
    assert len(client.get("/api/instance-summaries?limit=1", headers=AUTH).json()) == 1
    assert client.get("/api/instance-summaries?limit=0", headers=AUTH).status_code == 422
    # a new version of an instance is a new row (the cache is keyed by version)
    answered = client.post(f"/api/confirmations/{CONFIRMATION}", headers=AUTH,
                           json={"value": "pending_dual_approval", "reason": "dual", "user": "ann"})
    assert answered.status_code == 200, answered.text
    row = next(r for r in client.get("/api/instance-summaries", headers=AUTH).json() if r["id"] == loan)
    assert row["status"] == "completed" and row["waiting_for"] == [] and row["open_conflicts"] == 0


def test_instance_diagram(client, loan):
    r = client.get(f"/api/instances/{loan}/diagram.svg", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("image/svg+xml")
    root = ET.fromstring(r.content)
    join = next(g for g in root.iter("{http://www.w3.org/2000/svg}g") if g.get("id") == "node-review_join")
    assert "conflict" in join.get("class", "").split()
    assert 'risk_review: "rejected"' in "".join(root.itertext())
    plain = client.get("/api/processes/loan_approval/diagram.svg", headers=AUTH)
    assert plain.status_code == 200 and "conflict" not in ET.fromstring(plain.content).get("class", "")
    assert "callout open" not in plain.text and "Conflict on" not in plain.text


@pytest.mark.parametrize("path", ["/api/instances/nope/diagram.svg", "/api/processes/nope/diagram.svg",
                                  "/api/instances/nope/replay"])
def test_unknown_things_are_404(client, path):
    r = client.get(path, headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"


def test_a_moved_bpmn_file_falls_back_to_the_catalog(client, loan, tmp_path):
    service = client.app.state.service
    instance = service.load(loan)
    instance.process.paths = (str(tmp_path / "gone.bpmn"),)
    service._save(instance)
    assert client.get(f"/api/instances/{loan}/diagram.svg", headers=AUTH).status_code == 200
    service.catalog.directory = tmp_path  # nor in the catalog: a 404 that says so
    r = client.get(f"/api/instances/{loan}/diagram.svg", headers=AUTH)
    assert r.status_code == 404 and "gone" in r.json()["error"]["message"]


def test_replay_rebuilds_the_context_from_the_tape(client, loan):
    service = client.app.state.service
    main = service.load(loan).main
    now = client.get(f"/api/instances/{loan}/replay", headers=AUTH).json()
    assert now["context"] == "main" and now["until"] == now["tape_last_seq"] == main.tape[-1].seq
    assert {k: {e["key"]: e["value"] for e in layer["keys"]} for k, layer in now["layers"].items()} == main.as_dict()
    assert now["tokens"] == main.token_report()
    risk = next(e for e in now["layers"]["L3"]["keys"] if e["key"] == "risk_level")
    assert risk["preserved"] and risk["written_by"]["activity"] == "risk_assessment"
    assert risk["written_by"]["kind"] == "complete"

    at = 8
    past = client.get(f"/api/instances/{loan}/replay", params={"until": at}, headers=AUTH).json()
    expected = LayeredContext.replay(main.tape, until=at, name="main")
    assert past["until"] == at and past["event"]["seq"] == at
    assert {k: {e["key"]: e["value"] for e in layer["keys"]} for k, layer in past["layers"].items()} == expected.as_dict()
    empty = client.get(f"/api/instances/{loan}/replay", params={"until": 0}, headers=AUTH).json()
    assert all(not layer["keys"] for layer in empty["layers"].values()) and empty["event"] is None
    beyond = client.get(f"/api/instances/{loan}/replay", params={"until": 10**6}, headers=AUTH).json()
    assert beyond["until"] == now["until"]
    assert client.get(f"/api/instances/{loan}/replay", params={"until": -1}, headers=AUTH).status_code == 422


def test_replay_of_a_branch_traces_inherited_keys_into_the_parent(client, loan):
    r = client.get(f"/api/instances/{loan}/replay", params={"context": "risk_review", "until": 3}, headers=AUTH)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["context"].startswith("main/risk_review") and doc["branch_id"] == "risk_review"
    history = {e["key"]: e for e in doc["layers"]["L3"]["keys"]}
    assert history["approval_status"]["value"] == "rejected"
    assert history["approval_status"]["written_by"]["activity"] == "risk_review"
    inherited = history["risk_level"]["written_by"]
    assert inherited["context"] == "main" and inherited["activity"] == "risk_assessment"
    working = {e["key"]: e for e in doc["layers"]["L4"]["keys"]}
    assert working["review_type"]["written_by"]["kind"] == "fork"
    r = client.get(f"/api/instances/{loan}/replay", params={"context": "nope"}, headers=AUTH)
    assert r.status_code == 404
