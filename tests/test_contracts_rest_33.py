"""An integration that approves expenses over HTTP only meets a real ``layerflow serve`` (REST round 33):

- a user task id the instance does not have is 404 naming it, the tasks it waits for and the likely
  one; a task of the process it does not wait for (yet, or any more) stays 409;
- instance rows (``GET /api/instances``, ``/api/instance-summaries``) carry the definition ``version``
  the instance runs (its documents' ``definition.version``), as ``layerflow list --json`` does;
- a person's ``reason`` for a resolution is bounded as their other text is (422 naming the field);
- ``ETag`` / ``If-Match``: the instance's version, as ``expected_version`` is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import local_http
import pytest

from test_contracts_rest import AUTH, ROOT, serving

pytestmark = pytest.mark.slow

EXPENSE = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="expense_defs" targetNamespace="x">
  <bpmn:process id="expense" name="Expense approval" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:userTask id="manager_approval" name="Manager approves"/>
    <bpmn:userTask id="finance_approval" name="Finance approves"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="manager_approval"/>
    <bpmn:sequenceFlow id="f2" sourceRef="manager_approval" targetRef="finance_approval"/>
    <bpmn:sequenceFlow id="f3" sourceRef="finance_approval" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("rest33")
    (folder / "catalog").mkdir()
    (folder / "catalog" / "expense.bpmn").write_text(EXPENSE)
    return folder


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[str]:
    yield from serving(folder, folder / "catalog")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_STORE", "LAYERFLOW_QUEUE")}
    env["PYTHONPATH"] = str(ROOT)
    return env


def _call(method: str, url: str, **kw: Any) -> httpx.Response:
    return local_http.request(method, url, headers={**AUTH, **kw.pop("headers", {})}, timeout=120, **kw)


def _start(server: str) -> dict[str, Any]:
    r = _call("POST", f"{server}/api/instances", json={"process_id": "expense", "data": {"amount": 120}})
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def test_a_user_task_the_instance_does_not_have_is_404_naming_what_it_waits_for(server: str) -> None:
    doc = _start(server)
    iid, waiting = doc["instance_id"], doc["waiting_for"][0]
    for task in ("manager_aproval", "no-such-task", "0b5b3a66-6a4e-4d8c-9a8e-1a2b3c4d5e6f"):
        r = _call("POST", f"{server}/api/instances/{iid}/user-tasks/{task}", json={"data": {"ok": True}})
        assert r.status_code == 404, (task, r.text)
        error = r.json()["error"]
        assert error["kind"] == "not_found"
        assert repr(task) in error["message"] and "manager_approval" in error["message"], error
        assert waiting["id"] in error["message"], error  # what it waits for, by both ids
    r = _call("POST", f"{server}/api/instances/{iid}/user-tasks/manager_aproval", json={"data": {}})
    assert "did you mean 'manager_approval'" in r.json()["error"]["message"]
    # a task of the process it does not wait for yet: a state, 409 as before
    r = _call("POST", f"{server}/api/instances/{iid}/user-tasks/finance_approval", json={"data": {"ok": True}})
    assert r.status_code == 409 and r.json()["error"]["kind"] == "invalid_state", r.text
    done = _call("POST", f"{server}/api/instances/{iid}/user-tasks/{waiting['id']}", json={"data": {"ok": True}})
    assert done.status_code == 200, done.text
    # ... or any more: by its BPMN id and by the id it waited under
    for task in ("manager_approval", waiting["id"]):
        r = _call("POST", f"{server}/api/instances/{iid}/user-tasks/{task}", json={"data": {"ok": True}})
        assert r.status_code == 409 and r.json()["error"]["kind"] == "invalid_state", (task, r.text)
    assert _call("GET", f"{server}/api/instances/{iid}").json()["version"] == done.json()["version"]


def test_instance_rows_name_the_definition_version_the_instance_runs(server: str, folder: Path) -> None:
    doc = _start(server)
    iid, defined = doc["instance_id"], doc["definition"]["version"]
    assert isinstance(defined, str) and defined
    rows = {r["id"]: r for r in _call("GET", f"{server}/api/instances").json()}
    assert rows[iid]["definition_version"] == defined
    assert rows[iid]["version"] == doc["version"]  # the store's version stays what it was
    paged = _call("GET", f"{server}/api/instances", params={"process_id": "expense", "limit": 1}).json()
    assert paged[0]["definition_version"] == _call("GET", f"{server}/api/instances/{paged[0]['id']}").json()[
        "definition"]["version"]
    answered = _call("GET", f"{server}/api/instance-summaries").json()
    summaries = {r["id"]: r for r in answered}
    assert summaries[iid]["definition_version"] == defined
    # the rows are what /openapi.json declares (they were declared as any objects)
    openapi = local_http.get(f"{server}/openapi.json", timeout=30).json()
    schema = openapi["paths"]["/api/instance-summaries"]["get"]["responses"]["200"]["content"]["application/json"][
        "schema"]
    assert schema["items"] == {"$ref": "#/components/schemas/ConsoleSummary"}
    jsonschema.validate(answered, {**schema, "components": openapi["components"]})
    for name in ("ConsoleSummary", "InstanceSummary"):
        assert "definition_version" in openapi["components"]["schemas"][name]["properties"], name
    listed = subprocess.run([sys.executable, "-m", "engine.cli", "list", "--json", "--store",
                             f"sqlite:///{folder / 'rest.db'}"], cwd=ROOT, env=_env(), capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert {r["id"]: r for r in json.loads(listed.stdout)}[iid]["definition_version"] == defined


@pytest.mark.parametrize("path", ["/api/context-governance/resolve", "/api/context-governance/tools/context_branch"])
def test_a_resolution_reason_is_bounded_as_a_persons_other_text(server: str, path: str) -> None:
    iid = _start(server)["instance_id"]
    body: dict[str, Any] = {"instance_id": iid, "conflict_key": "amount", "resolution": 1, "reason": "x" * 10_001}
    if path.endswith("context_branch"):
        body["action"] = "resolve_conflict"
    r = _call("POST", f"{server}{path}", json=body)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["kind"] == "validation_error" and "reason" in error["message"] and "10000" in error["message"], error
    tape = _call("GET", f"{server}/api/instances/{iid}/tape").json()
    assert not any("x" * 100 in json.dumps(e) for e in tape["events"])
    # at the bound it is no validation problem: the conflict it names is what is missing
    r = _call("POST", f"{server}{path}", json={**body, "reason": "x" * 10_000})
    assert r.status_code == 404, r.text



def test_etag_and_if_match_carry_the_instance_version(server: str) -> None:
    """A client that does conditional requests the HTTP way: the document's ``ETag`` is its version, a
    change with a stale ``If-Match`` is 412 and changes nothing (it was carried out regardless)."""
    started = _call("POST", f"{server}/api/instances", json={"process_id": "expense", "data": {"amount": 5}})
    iid, version = started.json()["instance_id"], started.json()["version"]
    assert started.headers["etag"] == f'"{version}"'
    got = _call("GET", f"{server}/api/instances/{iid}")
    assert got.headers["etag"] == f'"{version}"'
    url = f"{server}/api/instances/{iid}/user-tasks/manager_approval"
    stale = _call("POST", url, json={"data": {"ok": True}}, headers={"If-Match": f'"{version - 1}"'})
    assert stale.status_code == 412, stale.text
    error = stale.json()["error"]
    assert error["kind"] == "precondition_failed" and f"version {version}" in error["message"], error
    assert _call("GET", f"{server}/api/instances/{iid}").json()["version"] == version  # nothing changed
    for bad in ('W/"2"', "2", '"2", "3"', '"x"'):
        r = _call("POST", url, json={"data": {"ok": True}}, headers={"If-Match": bad})
        assert r.status_code == 400 and "If-Match" in r.json()["error"]["message"], (bad, r.text)
    r = _call("POST", url, json={"data": {"ok": True}, "expected_version": version},
              headers={"If-Match": f'"{version + 1}"'})
    assert r.status_code == 400 and "expected_version" in r.json()["error"]["message"], r.text
    done = _call("POST", url, json={"data": {"ok": True}}, headers={"If-Match": f'"{version}"'})
    assert done.status_code == 200, done.text
    assert done.headers["etag"] == f'"{done.json()["version"]}"' and done.json()["version"] > version
    # a governance change takes it too, and `*` asks only that the instance exists
    r = _call("POST", f"{server}/api/context-governance/inject", json={"instance_id": iid, "values": {"memo": 1}},
              headers={"If-Match": f'"{version}"'})
    assert r.status_code == 412 and r.json()["error"]["kind"] == "precondition_failed", r.text
    r = _call("POST", f"{server}/api/context-governance/inject", json={"instance_id": iid, "values": {"memo": 1}},
              headers={"If-Match": "*"})
    assert r.status_code == 200 and r.headers["etag"] == f'"{r.json()["version"]}"', r.text
    # and /openapi.json says so, for a generated client
    operation = local_http.get(f"{server}/openapi.json", timeout=30).json()["paths"][
        "/api/instances/{instance_id}/user-tasks/{task_id}"]["post"]
    assert "ETag" in operation["responses"]["200"]["headers"]
    assert {"name": "if-match", "in": "header"}.items() <= next(
        p for p in operation["parameters"] if p["name"] == "if-match").items()
    assert "412" in operation["responses"]


@pytest.mark.parametrize("route", ["start", "user-task", "cancel", "inject", "answer"])
def test_who_asks_is_bounded_as_a_persons_other_text(server: str, route: str) -> None:
    """``user`` goes on the tape as the actor of every event the request makes: 100 KB of it was taken."""
    doc = _start(server)
    iid = doc["instance_id"]
    path, body = {
        "start": ("/api/instances", {"process_id": "expense", "data": {}}),
        "user-task": (f"/api/instances/{iid}/user-tasks/manager_approval", {"data": {"ok": True}}),
        "cancel": (f"/api/instances/{iid}/cancel", {"reason": "duplicate"}),
        "inject": ("/api/context-governance/inject", {"instance_id": iid, "values": {"memo": 1}}),
        "answer": ("/api/confirmations/nowhere", {"value": 1}),
    }[route]
    before = len(_call("GET", f"{server}/api/instances").json())
    r = _call("POST", f"{server}{path}", json={**body, "user": "u" * 501})
    assert r.status_code == 422, r.text
    assert "body.user" in r.json()["error"]["message"] and "500" in r.json()["error"]["message"], r.text
    assert _call("GET", f"{server}/api/instances/{iid}").json()["version"] == doc["version"]  # nothing changed
    assert len(_call("GET", f"{server}/api/instances").json()) == before  # nothing started
    r = _call("POST", f"{server}{path}", json={**body, "user": "u" * 500})
    assert r.status_code != 422, r.text


def test_the_instance_list_says_how_many_there_are_and_where_the_next_page_starts(server: str) -> None:
    for _ in range(3):
        _start(server)
    everything = _call("GET", f"{server}/api/instances", params={"process_id": "expense"})
    total = int(everything.headers["x-total-count"])
    assert total == len(everything.json()) >= 3 and "link" not in everything.headers
    seen: list[str] = []
    page = _call("GET", f"{server}/api/instances", params={"process_id": "expense", "limit": 2})
    while True:
        assert page.status_code == 200 and int(page.headers["x-total-count"]) == total
        seen += [r["id"] for r in page.json()]
        if "link" not in page.headers:
            break
        link = page.headers["link"]
        assert link.endswith('>; rel="next"') and "process_id=expense" in link and "limit=2" in link, link
        page = _call("GET", f"{server}{link[1:link.index('>')]}")
    assert seen == [r["id"] for r in everything.json()]
