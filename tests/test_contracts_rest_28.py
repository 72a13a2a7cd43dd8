"""/openapi.json says what the server does (REST round 28), in-process (TestClient):

- the camelCase names the server takes are described in nested request bodies too
  (``filter.keyPrefix`` of inspect) and in the bodies of the instance routes (``processId``,
  ``expectedVersion``), each taken by the server;
- the 5xx answers are listed, with the one error body, where the route gives them: 503 on a store
  outage (a real one: the redis server goes away under a running app) and 500 on an unexpected error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jsonschema
import pytest
import redis
from fastapi.testclient import TestClient

from engine.api import ROUTE_ERRORS, create_app
from engine.runtime import Engine

AUTH = {"Authorization": "Bearer t28"}
PREFIX = "rest28t"
REDIS_URL = f"redis://127.0.0.1:6379/13?prefix={PREFIX}"

SIMPLE = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="simple28" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:scriptTask id="fill"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:script>risk_score = 7
other = 1</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="review"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:userTask>
    <bpmn:endEvent id="e"><bpmn:incoming>f3</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="fill"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fill" targetRef="review"/>
    <bpmn:sequenceFlow id="f3" sourceRef="review" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("rest28")
    (folder / "simple.bpmn").write_text(SIMPLE)
    return folder


@pytest.fixture(scope="module")
def client(catalog: Any) -> Iterator[TestClient]:
    with TestClient(create_app("memory://", catalog, token="t28"), raise_server_exceptions=False) as c:
        yield c


@pytest.fixture(scope="module")
def openapi(client: TestClient) -> dict[str, Any]:
    doc: dict[str, Any] = client.get("/openapi.json").json()
    return doc


def _validator(openapi: dict[str, Any], path: str, method: str = "post") -> jsonschema.protocols.Validator:
    ref = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**ref, "components": openapi["components"]})


def _documented_and_taken(client: TestClient, openapi: dict[str, Any], path: str, body: dict[str, Any],
                          schema_path: str | None = None) -> dict[str, Any]:
    problems = [e.message for e in _validator(openapi, schema_path or path).iter_errors(body)]
    assert not problems, f"{path} {body}: /openapi.json refuses what the server takes: {problems}"
    r = client.post(path, json=body, headers=AUTH)
    assert r.status_code in (200, 201), r.text
    doc: dict[str, Any] = r.json()
    return doc


def _start(client: TestClient) -> str:
    r = client.post("/api/instances", json={"process_id": "simple28"}, headers=AUTH)
    assert r.status_code == 201, r.text
    return str(r.json()["instance_id"])


# ----------------------------------------------------------------------------- camelCase names

def test_inspect_filter_takes_and_documents_its_camelcase_names(client: TestClient, openapi: dict[str, Any]) -> None:
    iid = _start(client)
    path = "/api/context-governance/inspect"
    snake = {"instance_id": iid, "metrics": ["keys"], "filter": {"key_prefix": "risk_", "modified_after": "2000-01-01T00:00:00"}}
    camel = {"instance_id": iid, "metrics": ["keys"], "filter": {"keyPrefix": "risk_", "modifiedAfter": "2000-01-01T00:00:00"}}
    by_snake = _documented_and_taken(client, openapi, path, snake)
    by_camel = _documented_and_taken(client, openapi, path, camel)
    assert by_camel == by_snake
    assert by_camel["L3"]["keys"] == ["risk_score"], by_camel["L3"]  # the filter was applied
    props = openapi["components"]["schemas"]["InspectFilter"]["properties"]
    assert {"keyPrefix", "modifiedAfter"} <= set(props), sorted(props)
    # a name the server does not take is not documented either: the schema still refuses it
    assert list(_validator(openapi, path).iter_errors({"instance_id": iid, "filter": {"keyprefix": "risk_"}}))
    assert client.post(path, json={"instance_id": iid, "filter": {"keyprefix": "r"}}, headers=AUTH).status_code == 422


def test_the_instance_routes_take_and_document_their_camelcase_names(client: TestClient,
                                                                     openapi: dict[str, Any]) -> None:
    started = _documented_and_taken(client, openapi, "/api/instances", {"processId": "simple28"})
    iid, version = started["instance_id"], started["version"]
    done = _documented_and_taken(client, openapi, f"/api/instances/{iid}/user-tasks/review",
                                 {"expectedVersion": version, "data": {}},
                                 "/api/instances/{instance_id}/user-tasks/{task_id}")
    assert done["status"] == "completed", done
    second = _documented_and_taken(client, openapi, "/api/instances", {"processId": "simple28"})
    resumed = _documented_and_taken(client, openapi, f"/api/instances/{second['instance_id']}/resume",
                                    {"expectedVersion": second["version"], "answers": {"userTasks": {"review": {}}}},
                                    "/api/instances/{instance_id}/resume")
    assert resumed["status"] == "completed", resumed
    third = _documented_and_taken(client, openapi, "/api/instances", {"processId": "simple28"})
    cancelled = _documented_and_taken(client, openapi, f"/api/instances/{third['instance_id']}/cancel",
                                      {"expectedVersion": third["version"], "reason": "r28"},
                                      "/api/instances/{instance_id}/cancel")
    assert cancelled["status"] == "cancelled", cancelled
    events = openapi["components"]["schemas"]["SendEventRequest"]["properties"]
    assert "expectedVersion" in events  # taken as the others are (_Args._camel_case)


# ----------------------------------------------------------------------------- 5xx

_NO_STORE = {("get", "/api/context-governance/tools"), ("get", "/api/processes"),
             ("get", "/api/processes/{process_id}"), ("get", "/api/processes/{process_id}/diagram.svg")}


def _api_operations(openapi: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in openapi["paths"].items() for method, op in ops.items()
            if path.startswith("/api/") and path != "/api/health"]


def test_5xx_answers_are_listed_with_the_error_body(openapi: dict[str, Any]) -> None:
    error_body = {"$ref": "#/components/schemas/ErrorBody"}
    for method, path, op in _api_operations(openapi):
        responses = op["responses"]
        assert responses["500"]["content"]["application/json"]["schema"] == error_body, f"{method} {path}"
        if (method, path) in _NO_STORE:
            assert "503" not in responses, f"{method} {path} reads no store: it cannot answer 503"
        else:
            assert responses["503"]["content"]["application/json"]["schema"] == error_body, f"{method} {path}"


def test_an_unexpected_error_answers_500_with_the_error_body(catalog: Any) -> None:
    app = create_app("memory://", catalog, token="t28")

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    app.state.service.instance_page = broken  # what GET /api/instances calls (list_instances before round 33)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.get("/api/instances", headers=AUTH)
    assert r.status_code == 500, r.text
    assert r.json()["error"]["kind"] == "internal_error" and "RuntimeError" in r.json()["error"]["message"]


@pytest.fixture()
def outage(catalog: Any) -> Iterator[tuple[TestClient, str]]:
    direct = redis.Redis.from_url("redis://127.0.0.1:6379/13")
    try:
        direct.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip("no redis on 127.0.0.1:6379")
    engine = Engine(REDIS_URL)
    app = create_app(engine, catalog, token="t28")
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            iid = _start(c)
            pool = engine.store.store.redis.connection_pool  # type: ignore[attr-defined]
            pool.connection_kwargs["port"] = 1  # the server goes away: nothing answers there
            pool.disconnect()
            pool.reset()  # new connections, to the new port
            yield c, iid
    finally:
        for key in direct.scan_iter(f"{PREFIX}:*"):
            direct.delete(key)


def test_a_store_outage_answers_503_on_every_route_that_lists_it(outage: tuple[TestClient, str],
                                                                 openapi: dict[str, Any]) -> None:
    c, _ = outage
    iid = "gone28"  # an instance the app holds no copy of: only the store can say whether it exists
    bodies = {"inject": {"values": {"memo": "x"}}, "resolve": {"confirmation_id": "c", "resolution": "v", "reason": "r"},
              "rollback": {"snapshot_id": "s"}, "config": {"activity_id": "fill", "config": {}},
              "branch-evaluate": {"branch_id": "b", "required_keys": ["k"]}, "compress": {"action": "evaluate"}}
    asked = 0
    for method, path, op in _api_operations(openapi):
        if "503" not in op["responses"]:
            continue
        url = (path.replace("{instance_id}", iid).replace("{task_id}", "review").replace("{name}", "context_inspect")
               .replace("{confirmation_id}", "review/x"))
        body: dict[str, Any] | None = None
        if method == "post":
            op_name = path.rsplit("/", 1)[-1]
            body = {"instance_id": iid, **bodies.get(op_name, {})} if "context-governance" in path else {}
            if path == "/api/instances":
                body = {"process_id": "simple28"}
            elif path.endswith("/cancel"):
                body = {"reason": "r"}
            elif path.endswith("/events") or path == "/api/messages":
                body = {"name": "m"}
            elif path.startswith("/api/confirmations/"):
                body = {"value": "v"}
            elif path.endswith("/{name}"):
                body = {"instance_id": iid, "arguments": {}}
        r = c.request(method, url, json=body, headers=AUTH)
        assert r.status_code == 503, f"{method} {url}: {r.status_code} {r.text}"
        assert r.json()["error"]["kind"] == "store_unavailable", r.text
        asked += 1
    assert asked >= 18


# ----------------------------------------------------------------------------- the table and the answers

def test_an_answer_its_route_does_not_list_is_logged(client: TestClient, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The drift check of engine.api.ROUTE_ERRORS (each route's codes, earned one by one against a real
    server in test_contracts_rest_29): a route whose entry lost a kind it raises still answers it, and
    the server's log names the route, the kind and where to list it."""
    monkeypatch.setitem(ROUTE_ERRORS, "document", ("validation_error",))
    with caplog.at_level("WARNING", logger="layerflow.api"):
        r = client.get("/api/instances/gone28", headers=AUTH)
    assert r.status_code == 404
    assert "answered 404 (not_found)" in caplog.text and "ROUTE_ERRORS['document']" in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="layerflow.api"):
        # a method the path does not take is the path's answer (Allow names the ones it does), no operation's
        r = client.request("PUT", "/api/instances/gone28", headers=AUTH)
    assert r.status_code == 405 and not caplog.text, caplog.text
