"""The REST API through httpx (Starlette's TestClient is an ``httpx.Client``), and over real
HTTP for concurrent writers: success, 401, 403, 404, 409 and 422 for every endpoint."""

from __future__ import annotations

import json

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import local_http
import pytest
from fastapi.testclient import TestClient

from engine.api import STATUS_BY_KIND, create_app, status_for
from engine.governance import GovernanceService
from engine.runtime import Engine
from governance_helpers import LOAN_CONFLICT, NOTES, TOKEN, ServerThread, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}
CONFIRMATION = "review_join/approval_status"


@pytest.fixture
def app(tmp_path):
    return create_app("memory://", make_catalog(tmp_path), TOKEN)


@pytest.fixture
def client(app):
    with TestClient(app) as c:
        yield c


def start(client, process_id="notes_review", data=NOTES) -> dict:
    r = client.post("/api/instances", json={"process_id": process_id, "data": data}, headers=AUTH)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def notes(client):
    return start(client)


@pytest.fixture
def loan(client):
    return start(client, "loan_approval", LOAN_CONFLICT)


def error_of(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["error"]["kind"] == kind and body["error"]["message"], body
    return body["error"]


# ----------------------------------------------------------------------------- success

def test_instances_endpoints(client, notes):
    iid = notes["instance_id"]
    assert notes["status"] == "waiting" and notes["version"] >= 1
    listed = client.get("/api/instances", headers=AUTH).json()
    assert [r["id"] for r in listed] == [iid]
    assert client.get("/api/instances?status=completed", headers=AUTH).json() == []
    doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
    assert {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
            "confirmations", "waiting_for", "tape_length", "version"} <= set(doc)
    assert doc["layers"]["L0"]["policy"].startswith("Decisions")
    tape = client.get(f"/api/instances/{iid}/tape", params={"kind": "complete"}, headers=AUTH).json()
    assert [e["activity"] for e in tape["events"]] == ["collect", "analyse", "research"]
    assert client.get(f"/api/instances/{iid}/tape", params={"key": "notes", "limit": 1},
                      headers=AUTH).json()["count"] == 1
    since = client.get(f"/api/instances/{iid}/tape", params={"since": 5, "context": "main"}, headers=AUTH).json()
    assert min(e["seq"] for e in since["events"]) == 5
    processes = client.get("/api/processes", headers=AUTH).json()
    assert {p["id"] for p in processes} == {"loan_approval", "notes_review"}


def test_governance_endpoints(client, notes):
    iid = notes["instance_id"]
    r = client.post("/api/context-governance/inspect", headers=AUTH, json={
        "instance_id": iid, "layers": ["L3", "L4"], "metrics": ["token_count", "attention_score"],
        "filter": {"key_prefix": "r*", "modified_after": "2000-01-01T00:00:00Z"}})
    assert r.status_code == 200 and set(r.json()["layers"]) == {"L3", "L4"}
    r = client.post("/api/context-governance/inject", headers=AUTH,
                    json={"instance_id": iid, "values": {"hint": "x"}, "user": "ann",
                          "expected_version": notes["version"]})
    assert r.status_code == 200 and r.json()["version"] == notes["version"] + 1
    snap = client.post("/api/context-governance/snapshot", headers=AUTH, json={"instance_id": iid, "label": "s"}).json()
    r = client.post("/api/context-governance/compress", headers=AUTH, json={
        "instance_id": iid, "action": "compress", "target_layers": ["L3"], "preserve_keys": ["risk_level"],
        "compress_rules": [{"pattern": "research", "action": "extract_keys", "extractKeys": ["status"]}],
        "max_tokens": 300})
    assert r.status_code == 200 and r.json()["changed"]
    r = client.post("/api/context-governance/compress", headers=AUTH,
                    json={"instance_id": iid, "action": "evaluate", "before_snapshot_id": r.json()["snapshot_id"]})
    assert r.status_code == 200 and r.json()["preserved_intact"]
    r = client.post("/api/context-governance/rollback", headers=AUTH,
                    json={"instance_id": iid, "snapshot_id": snap["snapshot_id"], "reason": "undo"})
    assert r.status_code == 200
    r = client.post("/api/context-governance/config", headers=AUTH, json={
        "instance_id": iid, "activity_id": "finish", "config": {"preserveKeys": ["outcome"]}})
    assert r.status_code == 200 and r.json()["config_version"] == 1
    r = client.post("/api/context-governance/branch-evaluate", headers=AUTH,
                    json={"instance_id": iid, "required_keys": ["risk_level", "nope"]})
    assert r.status_code == 200 and r.json()["missing"] == ["nope"]


def test_resolve_and_confirmation_endpoints(client, loan):
    (pending,) = client.get("/api/confirmations", headers=AUTH).json()
    assert pending["id"] == CONFIRMATION and pending["instance_id"] == loan["instance_id"]
    r = client.post("/api/context-governance/resolve", headers=AUTH, json={
        "instance_id": loan["instance_id"], "conflict_key": "approval_status", "resolution": "pending_dual_approval",
        "reason": "dual approval"})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    other = start(client, "loan_approval", LOAN_CONFLICT)
    assert [c["instance_id"] for c in client.get("/api/confirmations", headers=AUTH).json()] == [other["instance_id"]]
    r = client.post(f"/api/confirmations/{CONFIRMATION}", headers=AUTH,
                    json={"value": "approved", "reason": "finance is sure", "user": "bob"})
    assert r.status_code == 200 and r.json()["status"] == "completed"
    tape = client.get(f"/api/instances/{other['instance_id']}/tape", params={"kind": "human_decision"},
                      headers=AUTH).json()
    assert tape["events"][0]["actor"] == "bob" and tape["events"][0]["data"]["reason"] == "finance is sure"
    third = start(client, "loan_approval", LOAN_CONFLICT)  # "answer", as the confirmation names it, is taken too
    r = client.post(f"/api/confirmations/{CONFIRMATION}", headers=AUTH,
                    json={"instance_id": third["instance_id"], "answer": "rejected"})
    assert r.status_code == 200 and r.json()["layers"]["L3"]["approval_status"] == "rejected"


def test_openapi_and_docs_are_open(client):
    schema = client.get("/openapi.json").json()
    for path in ("inspect", "compress", "inject", "resolve", "rollback", "config"):
        assert f"/api/context-governance/{path}" in schema["paths"]
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    assert client.get("/docs").status_code == 200
    assert client.get("/api/health").json() == {"status": "ok"}


# ----------------------------------------------------------------------------- 401

ENDPOINTS = [
    ("POST", "/api/context-governance/inspect", {"instance_id": "x"}),
    ("POST", "/api/context-governance/compress", {"instance_id": "x", "action": "evaluate"}),
    ("POST", "/api/context-governance/inject", {"instance_id": "x", "values": {"a": 1}}),
    ("POST", "/api/context-governance/resolve", {"instance_id": "x", "conflict_key": "k", "resolution": 1, "reason": "r"}),
    ("POST", "/api/context-governance/rollback", {"instance_id": "x", "snapshot_id": "s"}),
    ("POST", "/api/context-governance/config", {"instance_id": "x", "activity_id": "a", "config": {}}),
    ("POST", "/api/context-governance/snapshot", {"instance_id": "x"}),
    ("POST", "/api/context-governance/branch-evaluate", {"instance_id": "x", "required_keys": ["a"]}),
    ("GET", "/api/instances", None),
    ("POST", "/api/instances", {"process_id": "notes_review"}),
    ("GET", "/api/instances/x", None),
    ("GET", "/api/instances/x/tape", None),
    ("POST", "/api/instances/x/user-tasks/approve", {"data": {"decision": "approved"}}),
    ("POST", "/api/instances/x/resume", {}),
    ("GET", "/api/confirmations", None),
    ("POST", f"/api/confirmations/{CONFIRMATION}", {"value": "approved"}),
    ("GET", "/api/processes", None),
]


@pytest.mark.parametrize("method, path, body", ENDPOINTS)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                                     {"Authorization": "Bearer"}])
def test_every_endpoint_needs_the_token(client, method, path, body, headers):
    r = client.request(method, path, json=body, headers=headers)
    error_of(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"


def test_no_token_is_checked_before_the_body(client):
    r = client.post("/api/context-governance/inject", content=b"{not json", headers={"Content-Type": "application/json"})
    error_of(r, 401, "unauthorized")


def test_a_server_without_a_token_refuses_everything(tmp_path, monkeypatch):
    monkeypatch.delenv("LAYERFLOW_API_TOKEN", raising=False)
    with TestClient(create_app("memory://", make_catalog(tmp_path))) as c:
        assert "no API token configured" in error_of(c.get("/api/instances", headers=AUTH), 401, "unauthorized")["message"]
    monkeypatch.setenv("LAYERFLOW_API_TOKEN", "from-env")
    with TestClient(create_app("memory://", make_catalog(tmp_path))) as c:
        assert c.get("/api/instances", headers={"Authorization": "Bearer from-env"}).status_code == 200


# ----------------------------------------------------------------------------- 403, 400

@pytest.mark.parametrize("values, layer", [({"policy": "anything goes"}, "L4"), ({"new": 1}, "L0"),
                                           ({"applicant": "APP2"}, "L4")])
def test_a_denied_write_through_inject_is_403(client, notes, values, layer):
    r = client.post("/api/context-governance/inject", headers=AUTH,
                    json={"instance_id": notes["instance_id"], "values": values, "layer": layer})
    err = error_of(r, 403, "permission_denied")
    assert err["key"] == next(iter(values)) and err["effective_layer"] in ("L0", "L1")
    doc = client.get(f"/api/instances/{notes['instance_id']}", headers=AUTH).json()
    assert doc["layers"]["L0"]["policy"].startswith("Decisions") and doc["layers"]["L1"]["applicant"] == "APP9"


def test_bad_input_is_400(client, notes, loan):
    r = client.post("/api/context-governance/resolve", headers=AUTH, json={
        "instance_id": loan["instance_id"], "confirmation_id": CONFIRMATION, "resolution": "maybe", "reason": "r"})
    error_of(r, 400, "invalid_answer")
    r = client.post("/api/context-governance/compress", headers=AUTH,
                    json={"instance_id": notes["instance_id"], "action": "compress", "target_layers": ["L4"]})
    error_of(r, 400, "bad_request")


def test_inject_into_the_parent_of_open_branches_is_409(client, loan):
    r = client.post("/api/context-governance/inject", headers=AUTH,
                    json={"instance_id": loan["instance_id"], "values": {"x": 1}})
    error_of(r, 409, "invalid_state")


# ----------------------------------------------------------------------------- 404

NOT_FOUND = [
    ("POST", "/api/context-governance/inspect", {"instance_id": "missing"}),
    ("POST", "/api/context-governance/compress", {"instance_id": "missing", "action": "evaluate"}),
    ("POST", "/api/context-governance/inject", {"instance_id": "missing", "values": {"a": 1}}),
    ("POST", "/api/context-governance/resolve", {"instance_id": "missing", "conflict_key": "k", "resolution": 1,
                                                 "reason": "r"}),
    ("POST", "/api/context-governance/rollback", {"instance_id": "missing", "snapshot_id": "s"}),
    ("POST", "/api/context-governance/config", {"instance_id": "missing", "activity_id": "a", "config": {}}),
    ("POST", "/api/context-governance/snapshot", {"instance_id": "missing"}),
    ("POST", "/api/context-governance/branch-evaluate", {"instance_id": "missing", "required_keys": ["a"]}),
    ("GET", "/api/instances/missing", None),
    ("GET", "/api/instances/missing/tape", None),
    ("POST", "/api/instances", {"process_id": "../../etc/passwd"}),
    ("GET", "/api/confirmations?instance_id=missing", None),
    ("POST", "/api/confirmations/nope/key", {"value": 1}),
    ("GET", "/api/nothing-here", None),
]


@pytest.mark.parametrize("method, path, body", NOT_FOUND)
def test_unknown_things_are_404(client, method, path, body):
    error = error_of(client.request(method, path, json=body, headers=AUTH), 404, "not_found")
    if "missing" in (path + json.dumps(body)) and "confirmations" not in path:
        # an unknown instance is named, with what a client of the API does to find the right one
        assert "'missing'" in error["message"] and "GET /api/instances" in error["message"], error


@pytest.mark.parametrize("path, body", [
    ("/api/context-governance/rollback", {"snapshot_id": "snap:main:999"}),
    ("/api/context-governance/inspect", {"context": "ghost"}),
    ("/api/context-governance/config", {"activity_id": "ghost", "config": {}}),
    ("/api/context-governance/resolve", {"conflict_key": "ghost", "resolution": 1, "reason": "r"}),
    ("/api/context-governance/branch-evaluate", {"branch_id": "ghost", "required_keys": ["a"]}),
])
def test_unknown_parts_of_an_instance_are_404(client, notes, path, body):
    r = client.post(path, headers=AUTH, json={"instance_id": notes["instance_id"], **body})
    assert "ghost" in error_of(r, 404, "not_found")["message"] or "999" in r.json()["error"]["message"]


# ----------------------------------------------------------------------------- 409

STALE = [
    ("/api/context-governance/compress", {"action": "compress", "max_tokens": 300}),
    ("/api/context-governance/inject", {"values": {"a": 1}}),
    ("/api/context-governance/resolve", {"confirmation_id": CONFIRMATION, "resolution": "approved", "reason": "r"}),
    ("/api/context-governance/rollback", {"snapshot_id": "snap:main:1"}),
    ("/api/context-governance/config", {"activity_id": "review_join", "config": {}}),
    ("/api/context-governance/snapshot", {}),
]


@pytest.mark.parametrize("path, body", STALE)
def test_a_stale_version_is_409(client, loan, path, body):
    iid = loan["instance_id"]
    stale = loan["version"] - 1
    r = client.post(path, headers=AUTH, json={"instance_id": iid, "expected_version": stale, **body})
    assert str(stale) in error_of(r, 409, "version_conflict")["message"]
    assert client.get(f"/api/instances/{iid}", headers=AUTH).json()["version"] == loan["version"]


def test_a_stale_answer_is_409(client, loan):
    r = client.post(f"/api/confirmations/{CONFIRMATION}", headers=AUTH,
                    json={"value": "approved", "instance_id": loan["instance_id"],
                          "expected_version": loan["version"] + 5})
    error_of(r, 409, "version_conflict")


# ----------------------------------------------------------------------------- 422

BAD_BODIES = [
    ("/api/context-governance/inspect", {}),
    ("/api/context-governance/inspect", {"instance_id": "x", "layers": ["L7"]}),
    ("/api/context-governance/inspect", {"instance_id": "x", "metrics": ["mood"]}),
    ("/api/context-governance/inspect", {"instance_id": "x", "filter": {"modified_after": "yesterday"}}),
    ("/api/context-governance/compress", {"instance_id": "x", "action": "explode"}),
    ("/api/context-governance/compress", {"instance_id": "x", "action": "compress", "max_tokens": -1}),
    ("/api/context-governance/inject", {"instance_id": "x", "values": {}}),
    ("/api/context-governance/inject", {"instance_id": "x", "values": [1, 2]}),
    ("/api/context-governance/inject", {"instance_id": "x", "values": {"a": 1}, "expected_version": "one"}),
    ("/api/context-governance/inject", {"instance_id": "x", "values": {"a": 1}, "surprise": True}),
    ("/api/context-governance/resolve", {"instance_id": "x", "resolution": 1, "reason": "r"}),
    ("/api/context-governance/resolve", {"instance_id": "x", "conflict_key": "k", "reason": ""}),
    ("/api/context-governance/rollback", {"instance_id": "x"}),
    ("/api/context-governance/config", {"instance_id": "x", "activity_id": "a", "config": "handler"}),
    ("/api/context-governance/snapshot", {"instance_id": 5}),
    ("/api/context-governance/branch-evaluate", {"instance_id": "x", "required_keys": []}),
    ("/api/instances", {"process_id": "notes_review", "bpmn": "<definitions/>"}),
    ("/api/instances", {"data": {}}),
    (f"/api/confirmations/{CONFIRMATION}", {}),
]


@pytest.mark.parametrize("path, body", BAD_BODIES)
def test_bad_bodies_are_422(client, path, body):
    err = error_of(client.post(path, json=body, headers=AUTH), 422, "validation_error")
    assert err["problems"] and all(p["field"] for p in err["problems"])


def test_malformed_json_is_422(client):
    r = client.post("/api/context-governance/inject", content=b"{not json", headers={**AUTH, "Content-Type": "application/json"})
    error_of(r, 422, "validation_error")


@pytest.mark.parametrize("config", [{"handler": "os:system"}, {"preScript": "import os"},
                                    {"conflictPolicy": {"rules": [{"key": "k", "when": "open('x')", "value": 1,
                                                                   "reason": "r"}]}}])
def test_config_with_code_is_422(client, notes, config):
    r = client.post("/api/context-governance/config", headers=AUTH,
                    json={"instance_id": notes["instance_id"], "activity_id": "finish", "config": config})
    assert error_of(r, 422, "invalid_config")["problems"]


# ----------------------------------------------------------------------------- the mapping

def test_one_mapping_from_kinds_to_status_codes():
    assert {k: STATUS_BY_KIND[k] for k in ("bad_request", "unauthorized", "permission_denied", "not_found",
                                           "version_conflict", "validation_error", "invalid_config")} == {
        "bad_request": 400, "unauthorized": 401, "permission_denied": 403, "not_found": 404,
        "version_conflict": 409, "validation_error": 422, "invalid_config": 422}
    assert status_for("something_new") == 500


def test_every_kind_of_the_error_trees_is_mapped():
    import inspect as pyinspect

    import context_layers.errors as errors
    import engine.governance as governance

    kinds = {cls.kind for module in (errors, governance) for _, cls in pyinspect.getmembers(module, pyinspect.isclass)
             if issubclass(cls, errors.LayerflowError) and cls.kind != "error"}
    internal = {"activity_failed", "merge_conflict"}  # they end up in the instance's error, not in a response
    assert kinds - internal <= set(STATUS_BY_KIND), kinds - internal - set(STATUS_BY_KIND)


# ----------------------------------------------------------------------------- concurrency over HTTP

def test_concurrent_injects_over_http_never_lose_a_write(tmp_path):
    """Two servers on one sqlite store, six threads: each accepted write is on the tape and in the
    final state; every refused one got 409."""
    store = f"sqlite:///{tmp_path / 'api.db'}"
    catalog = make_catalog(tmp_path)
    apps = [create_app(GovernanceService(Engine(store), catalog), token=TOKEN) for _ in range(2)]
    with ServerThread(apps[0]) as one, ServerThread(apps[1]) as two:
        iid = local_http.post(f"{one.url}/api/instances", json={"process_id": "notes_review", "data": NOTES},
                         headers=AUTH, timeout=30).json()["instance_id"]
        results: list[tuple[str, int]] = []
        lock = threading.Lock()

        def writer(n: int) -> None:
            with httpx.Client(base_url=(one if n % 2 else two).url, headers=AUTH, timeout=30) as c:
                for j in range(5):
                    key = f"w{n}_{j}"
                    r = c.post("/api/context-governance/inject", json={"instance_id": iid, "values": {key: n * 10 + j}})
                    assert r.status_code in (200, 409), r.text
                    with lock:
                        results.append((key, r.status_code))

        with ThreadPoolExecutor(6) as pool:
            list(pool.map(writer, range(6)))
        doc = local_http.get(f"{two.url}/api/instances/{iid}", headers=AUTH, timeout=30).json()
        tape = local_http.get(f"{one.url}/api/instances/{iid}/tape", params={"kind": "write"}, headers=AUTH,
                         timeout=30).json()["events"]
    accepted = {k for k, status in results if status == 200}
    refused = {k for k, status in results if status == 409}
    written = {e["changes"][0][1] for e in tape}
    assert len(results) == 30 and accepted
    assert accepted <= set(doc["layers"]["L4"]) and accepted <= written
    assert not refused & set(doc["layers"]["L4"]) and not refused & written


def test_one_expected_version_wins_once(tmp_path):
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server:
        created = local_http.post(f"{server.url}/api/instances", json={"process_id": "notes_review", "data": NOTES},
                             headers=AUTH, timeout=30).json()

        def write(n: int) -> int:
            return local_http.post(f"{server.url}/api/context-governance/inject", headers=AUTH, timeout=30, json={
                "instance_id": created["instance_id"], "values": {f"k{n}": n},
                "expected_version": created["version"]}).status_code

        with ThreadPoolExecutor(8) as pool:
            codes = sorted(pool.map(write, range(8)))
    assert codes == [200] + [409] * 7


# ----------------------------------------------------------------------------- people's steps over HTTP

def test_a_user_task_is_completed_over_http(tmp_path):
    """A waiting user task is completed by its BPMN id or by its waiting item's id, and the
    instance runs on; what it does not wait for is 409 naming what it waits for, a stale
    version 409, data that is not an object 422, an unknown instance 404."""
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        first, second = (c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()
                         for _ in range(2))
        iid = first["instance_id"]
        (item,) = first["waiting_for"]
        assert item["kind"] == "user_task" and item["task_id"] == "approve"
        url = f"/api/instances/{iid}/user-tasks"
        wrong = error_of(c.post(f"{url}/finish", json={"data": {"decision": "approved"}}), 409, "invalid_state")
        assert "'finish'" in wrong["message"] and f"approve ({item['id']})" in wrong["message"]
        error_of(c.post(f"{url}/approve", json={"data": ["approved"]}), 422, "validation_error")
        error_of(c.post(f"{url}/approve", json={"data": {}, "expected_version": first["version"] + 5}),
                 409, "version_conflict")
        error_of(c.post("/api/instances/nosuch/user-tasks/approve", json={"data": {}}), 404, "not_found")
        assert c.get(f"/api/instances/{iid}").json()["version"] == first["version"]  # nothing changed

        done = c.post(f"{url}/approve", json={"data": {"decision": "approved"}, "expected_version": first["version"]})
        assert done.status_code == 200, done.text
        doc = done.json()
        assert doc["status"] == "completed" and doc["waiting_for"] == [] and doc["version"] > first["version"]
        assert doc["layers"]["L3"]["outcome"] == "approved RA-APP9"
        error_of(c.post(f"{url}/approve", json={"data": {"decision": "approved"}}), 409, "invalid_state")

        (other,) = second["waiting_for"]  # by the waiting item's id
        doc = c.post(f"/api/instances/{second['instance_id']}/user-tasks/{other['id']}",
                     json={"data": {"decision": "rejected"}, "user": "Ann Officer"}).json()
        assert doc["status"] == "completed" and doc["layers"]["L3"]["outcome"] == "rejected RA-APP9"
        tape = c.get(f"/api/instances/{second['instance_id']}/tape", params={"key": "decision"}).json()["events"]
        assert [e["activity"] for e in tape if e["kind"] == "write"] == ["approve"]
        # who gave the data is on the tape, before the task's writes
        for iid_, who in ((iid, "api"), (second["instance_id"], "Ann Officer")):
            notes = [e for e in c.get(f"/api/instances/{iid_}/tape").json()["events"]
                     if e.get("data", {}).get("note") == "user_input"]
            assert [(e["actor"], e["data"]["task_id"], e["data"]["keys"]) for e in notes] == [(who, "approve", ["decision"])]


MI_SIGN = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">
  <bpmn:process id="mi_sign" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="sign">
      <bpmn:multiInstanceLoopCharacteristics isSequential="false">
        <bpmn:loopDataInputRef>heads</bpmn:loopDataInputRef>
        <bpmn:loopDataOutputRef>signatures</bpmn:loopDataOutputRef>
        <bpmn:inputDataItem id="head" name="head"/>
        <bpmn:outputDataItem id="signature" name="signature"/>
      </bpmn:multiInstanceLoopCharacteristics>
    </bpmn:userTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="sign"/>
    <bpmn:sequenceFlow id="f2" sourceRef="sign" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_a_multi_instance_user_task_by_its_bpmn_id_completes_the_first_waiting_and_names_it(tmp_path):
    """Several instances wait under one BPMN id: POST .../user-tasks/{bpmn id} completes one, the first
    ``waiting_for`` lists, and says which (``completed_user_task``: its waiting id, instance, input);
    the tape's ``user_input`` note names the instance. By a waiting item's own id: that instance."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "mi_sign.bpmn").write_text(MI_SIGN, encoding="utf-8")
    with TestClient(create_app("memory://", catalog, TOKEN)) as c:
        started = c.post("/api/instances", headers=AUTH,
                         json={"process_id": "mi_sign", "data": {"heads": ["ann", "bo", "cy"]}}).json()
        iid, waiting = started["instance_id"], started["waiting_for"]
        assert [(w["task_id"], w["instance"], w["input"]) for w in waiting] == [
            ("sign", 1, {"head": "ann"}), ("sign", 2, {"head": "bo"}), ("sign", 3, {"head": "cy"})]
        url = f"/api/instances/{iid}/user-tasks"
        third = c.post(f"{url}/{waiting[2]['id']}", headers=AUTH, json={"data": {"signature": "cy"}}).json()
        assert third["completed_user_task"] == {"id": waiting[2]["id"], "task_id": "sign", "instance": 3,
                                                "input": {"head": "cy"}}
        signed = []
        doc = third
        while doc["waiting_for"]:
            first = doc["waiting_for"][0]
            doc = c.post(f"{url}/sign", headers=AUTH, json={"data": {"signature": first["input"]["head"]}}).json()
            assert doc["completed_user_task"] == {k: first[k] for k in ("id", "task_id", "instance", "input")}
            signed.append(doc["completed_user_task"]["instance"])
        assert signed == [1, 2] and doc["status"] == "completed"
        assert doc["layers"]["L3"]["signatures"] == ["ann", "bo", "cy"]
        notes = [e["data"] for e in c.get(f"/api/instances/{iid}/tape", headers=AUTH).json()["events"]
                 if e.get("data", {}).get("note") == "user_input"]
        assert [(n["task_id"], n["instance"]) for n in notes] == [("sign", 3), ("sign", 1), ("sign", 2)]


def test_user_task_data_the_layer_rules_refuse_is_403_and_the_task_still_waits(tmp_path):
    """A person's answer that would change a PROCESS key is refused (403, the refusal on the
    tape), the instance is not failed: it still waits, and a corrected answer completes it."""
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        first = c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()
        iid = first["instance_id"]
        url = f"/api/instances/{iid}/user-tasks/approve"
        denied = error_of(c.post(url, json={"data": {"decision": "approved", "applicant": "APP1"}}), 403,
                          "permission_denied")
        assert "'applicant'" in denied["message"] and "L1" in denied["message"]
        doc = c.get(f"/api/instances/{iid}").json()
        assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["approve"]
        assert doc["layers"]["L1"]["applicant"] == "APP9" and "decision" not in doc["layers"]["L4"]
        events = c.get(f"/api/instances/{iid}/tape").json()["events"]
        assert [(e["kind"], e["data"]["key"]) for e in events if e["kind"] == "denied"] == [("denied", "applicant")]
        assert not [e for e in events if e.get("data", {}).get("note") == "user_input"]
        same = c.post(url, json={"data": {"decision": "approved", "applicant": "APP9"}}).json()  # unchanged: fine
        assert same["status"] == "completed" and same["layers"]["L3"]["outcome"] == "approved RA-APP9"


def test_resume_over_http_takes_the_answers_file_shape(tmp_path):
    """``POST /api/instances/{id}/resume`` is ``layerflow resume ID --answers``: without an
    answer the instance still waits, with one it runs on; a completed one comes back as it is (200, its
    version and tape unchanged), as `layerflow resume` of it exits 0."""
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        iid = c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()["instance_id"]
        still = c.post(f"/api/instances/{iid}/resume", json={}).json()
        assert still["status"] == "waiting" and [w["task_id"] for w in still["waiting_for"]] == ["approve"]
        error_of(c.post(f"/api/instances/{iid}/resume", json={"answers": {"user_task": {}}}), 422, "validation_error")
        doc = c.post(f"/api/instances/{iid}/resume", json={
            "answers": {"user_tasks": {"approve": {"decision": "approved"}}}, "expected_version": still["version"]}).json()
        assert doc["status"] == "completed" and doc["layers"]["L3"]["outcome"] == "approved RA-APP9"
        again = c.post(f"/api/instances/{iid}/resume", json={})
        assert again.status_code == 200 and again.json()["status"] == "completed"
        assert (again.json()["version"], again.json()["tape_length"]) == (doc["version"], doc["tape_length"])


def test_answers_for_a_task_the_process_does_not_have_are_refused(tmp_path):
    # `layerflow run/resume --answers` refuse a user_tasks key that names no element (a typo); over
    # HTTP it was dropped without a word and the task went on waiting
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        typo = {"user_tasks": {"aprove": {"decision": "approved"}}}
        refused = error_of(c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES,
                                                         "answers": typo}), 400, "invalid_answer")
        assert "'aprove'" in refused["message"] and "user_tasks" in refused["message"]
        assert c.get("/api/instances").json() == []  # nothing was started
        iid = c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()["instance_id"]
        version = c.get(f"/api/instances/{iid}").json()["version"]
        assert "'aprove'" in error_of(c.post(f"/api/instances/{iid}/resume", json={"answers": typo}), 400,
                                      "invalid_answer")["message"]
        assert c.get(f"/api/instances/{iid}").json()["version"] == version


def test_a_start_whose_answer_the_layer_rules_refuse_names_the_instance_it_started(client):
    """The instance is started and saved, waiting for a valid answer; the 403 said nothing of it,
    so the client could neither correct its answer nor find the instance (the CLI prints its id)."""
    key = next(iter(NOTES))
    refused = error_of(client.post("/api/instances", headers=AUTH, json={
        "process_id": "notes_review", "data": NOTES,
        "answers": {"user_tasks": {"approve": {key: "changed"}}}}), 403, "permission_denied")
    assert refused["task_id"] == "approve" and refused["key"] == key
    doc = client.get(f"/api/instances/{refused['instance_id']}", headers=AUTH).json()
    assert doc["status"] == "waiting" and [w["task_id"] for w in doc["waiting_for"]] == ["approve"]
    done = client.post(f"/api/instances/{refused['instance_id']}/user-tasks/approve", headers=AUTH,
                       json={"data": {"decision": "approved"}}).json()
    assert done["status"] == "completed"
