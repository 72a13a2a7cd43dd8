"""Black-box checks of REST promises (DESIGN.md "Interfaces", README "REST API and console") that no
other test held the server to, against a real ``layerflow serve`` and processes of this file's own:
the request shapes the README documents are the ones ``/openapi.json`` describes, and every error a
client can make is the one error shape, naming what is wrong and what to do."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import local_http
import jsonschema
import pytest

from test_contracts_rest import AUTH, _get, _post, serving

pytestmark = pytest.mark.slow

# a claim: a user task, a message, then two branches that disagree on claim_status, asked of a person
CLAIM = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:message id="msg_docs" name="docs_arrived"/>
  <bpmn:process id="claim27" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:scriptTask id="intake"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:script>claim_status = "new"</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="triage"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing></bpmn:userTask>
    <bpmn:intermediateCatchEvent id="wait_docs"><bpmn:incoming>f3</bpmn:incoming><bpmn:outgoing>f4</bpmn:outgoing>
      <bpmn:messageEventDefinition messageRef="msg_docs"/></bpmn:intermediateCatchEvent>
    <bpmn:parallelGateway id="fork"><bpmn:incoming>f4</bpmn:incoming>
      <bpmn:outgoing>fa</bpmn:outgoing><bpmn:outgoing>fb</bpmn:outgoing></bpmn:parallelGateway>
    <bpmn:scriptTask id="finance"><bpmn:incoming>fa</bpmn:incoming><bpmn:outgoing>fa2</bpmn:outgoing>
      <bpmn:script>claim_status = "pay"</bpmn:script></bpmn:scriptTask>
    <bpmn:scriptTask id="fraud"><bpmn:incoming>fb</bpmn:incoming><bpmn:outgoing>fb2</bpmn:outgoing>
      <bpmn:script>claim_status = "hold"</bpmn:script></bpmn:scriptTask>
    <bpmn:parallelGateway id="join"><bpmn:incoming>fa2</bpmn:incoming><bpmn:incoming>fb2</bpmn:incoming>
      <bpmn:outgoing>f5</bpmn:outgoing></bpmn:parallelGateway>
    <bpmn:scriptTask id="close"><bpmn:incoming>f5</bpmn:incoming><bpmn:outgoing>f6</bpmn:outgoing>
      <bpmn:script>closed = claim_status</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e"><bpmn:incoming>f6</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="intake"/>
    <bpmn:sequenceFlow id="f2" sourceRef="intake" targetRef="triage"/>
    <bpmn:sequenceFlow id="f3" sourceRef="triage" targetRef="wait_docs"/>
    <bpmn:sequenceFlow id="f4" sourceRef="wait_docs" targetRef="fork"/>
    <bpmn:sequenceFlow id="fa" sourceRef="fork" targetRef="finance"/>
    <bpmn:sequenceFlow id="fb" sourceRef="fork" targetRef="fraud"/>
    <bpmn:sequenceFlow id="fa2" sourceRef="finance" targetRef="join"/>
    <bpmn:sequenceFlow id="fb2" sourceRef="fraud" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="join" targetRef="close"/>
    <bpmn:sequenceFlow id="f6" sourceRef="close" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""

CLAIM_CONFIG = """\
join:
  humanConfirm: {timeout: 600, default: hold, message: finance and fraud disagree}
"""

# waits for a signal (or an hour)
SIGNALLED = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:signal id="sig_stop" name="stop_all"/>
  <bpmn:process id="signalled27" isExecutable="true">
    <bpmn:startEvent id="s"><bpmn:outgoing>f1</bpmn:outgoing></bpmn:startEvent>
    <bpmn:intermediateCatchEvent id="wait_sig"><bpmn:incoming>f1</bpmn:incoming><bpmn:outgoing>f2</bpmn:outgoing>
      <bpmn:signalEventDefinition signalRef="sig_stop"/></bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="stopped"><bpmn:incoming>f2</bpmn:incoming><bpmn:outgoing>f3</bpmn:outgoing>
      <bpmn:script>how = "signal"</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="e"><bpmn:incoming>f3</bpmn:incoming></bpmn:endEvent>
    <bpmn:sequenceFlow id="f1" sourceRef="s" targetRef="wait_sig"/>
    <bpmn:sequenceFlow id="f2" sourceRef="wait_sig" targetRef="stopped"/>
    <bpmn:sequenceFlow id="f3" sourceRef="stopped" targetRef="e"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest27")
    catalog = folder / "catalog"
    catalog.mkdir()
    (catalog / "claim.bpmn").write_text(CLAIM)
    (catalog / "claim.layerflow.yaml").write_text(CLAIM_CONFIG)
    (catalog / "signalled.bpmn").write_text(SIGNALLED)
    yield from serving(folder, catalog)


@pytest.fixture(scope="module")
def openapi(server: str) -> dict[str, Any]:
    r = local_http.get(f"{server}/openapi.json", timeout=30)
    assert r.status_code == 200
    doc: dict[str, Any] = r.json()
    return doc


def _start(url: str, process_id: str, **extra: Any) -> dict[str, Any]:
    r = _post(url, "/api/instances", {"process_id": process_id, **extra})
    assert r.status_code == 201, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _at_join(url: str) -> str:
    """A claim waiting for a person at its join (confirmation ``join/claim_status``)."""
    iid = _start(url, "claim27")["instance_id"]
    assert _post(url, f"/api/instances/{iid}/user-tasks/triage", {"data": {"severity": "low"}}).status_code == 200
    r = _post(url, f"/api/instances/{iid}/events", {"name": "docs_arrived", "payload": {"doc": "receipt"}})
    assert r.status_code == 200 and r.json()["waiting_for"][0]["id"] == "join/claim_status", r.text
    return str(iid)


def _request_schema(openapi: dict[str, Any], method: str, path: str) -> jsonschema.protocols.Validator:
    ref = openapi["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**ref, "components": openapi["components"]})


def _error_of(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"]["kind"], str), body
    error: dict[str, Any] = body["error"]
    assert isinstance(error["message"], str) and error["message"]
    return error


# ----------------------------------------------------------------------------- OpenAPI = what is served

def _documented_bodies(iid: str) -> list[tuple[str, dict[str, Any]]]:
    """README: "field names snake_case or camelCase (`preserveKeys`); inject takes `values: {...}` or
    one `key` and `value`; config takes the seed's ActivityExtensionConfig (`activityId` inside
    `config`, or as the body); resolve ... takes `key` and `value` too"; a confirmation is answered
    with `{"value": ...}` (or `"answer"`)."""
    return [
        ("/api/context-governance/inject", {"instance_id": iid, "context": "finance", "key": "memo", "value": "ok"}),
        ("/api/context-governance/inspect", {"instanceId": iid, "layers": ["L3"], "activityId": "close"}),
        ("/api/context-governance/compress", {"instance_id": iid, "context": "finance", "action": "evaluate",
                                              "beforeSnapshotId": "snap:none"}),
        ("/api/context-governance/config", {"instance_id": iid, "config": {"activityId": "close",
                                                                            "compressTokenThreshold": 900}}),
        ("/api/context-governance/config", {"instance_id": iid, "activityId": "close",
                                            "preserveKeys": ["closed"]}),
        ("/api/context-governance/resolve", {"instance_id": iid, "key": "claim_status", "value": "hold",
                                             "reason": "fraud first"}),
    ]


def test_the_documented_request_shapes_are_the_ones_openapi_describes(server: str,
                                                                      openapi: dict[str, Any]) -> None:
    iid = _at_join(server)
    for path, body in _documented_bodies(iid):
        problems = [e.message for e in _request_schema(openapi, "post", path).iter_errors(body)]
        assert not problems, f"{path} {sorted(body)}: /openapi.json refuses what the README documents: {problems}"
        r = _post(server, path, body)
        assert r.status_code != 422, f"{path}: {r.text}"  # and the server takes it (404: no such snapshot)
    answer = {"answer": "hold", "instance_id": iid}
    assert not list(_request_schema(openapi, "post", "/api/confirmations/{confirmation_id}").iter_errors(answer))
    r = _post(server, "/api/confirmations/join/claim_status", answer)
    assert r.status_code == 409 and r.json()["error"]["kind"] == "already_answered", r.text  # resolve took it


@pytest.mark.parametrize("path, body", [
    ("/api/context-governance/inject", {"key": "memo"}),
    ("/api/context-governance/inject", {"layer": "L4"}),
    ("/api/context-governance/resolve", {"key": "claim_status", "reason": "no value"}),
    ("/api/context-governance/resolve", {"resolution": "hold", "reason": "which one?"}),
])
def test_openapi_refuses_what_the_server_refuses(server: str, openapi: dict[str, Any], path: str,
                                                 body: dict[str, Any]) -> None:
    # the alternatives are described as alternatives: half of one, or none, is no valid body
    assert list(_request_schema(openapi, "post", path).iter_errors(body)), f"{path}: {body} passes the schema"
    _error_of(_post(server, path, {"instance_id": "nobody", **body}), 422)


@pytest.mark.parametrize("path, body, names", [
    ("/api/context-governance/inject", {"key": "memo", "value": "ok", "values": {"memo": "ok"}}, ("key", "values")),
    ("/api/context-governance/compress", {"action": "compress", "max_tokens": 5, "maxTokens": 5},
     ("max_tokens", "maxTokens")),
    ("/api/context-governance/resolve", {"value": "hold", "resolution": "hold", "key": "k", "reason": "r"},
     ("resolution", "value")),
])
def test_two_names_of_one_field_are_refused_by_the_server(server: str, path: str, body: dict[str, Any],
                                                          names: tuple[str, str]) -> None:
    # the schema does not say it (a `not` of every pair of names made schemathesis's coverage phase
    # take minutes per body), the server does: 422
    error = _error_of(_post(server, path, {"instance_id": "nobody", **body}), 422)
    assert all(name in error["message"] for name in names), error["message"]


def test_openapi_lists_every_served_api_route_with_its_error_shape(server: str, openapi: dict[str, Any]) -> None:
    documented = {"/api/instances", "/api/instances/{instance_id}", "/api/instances/{instance_id}/tape",
                  "/api/processes", "/api/processes/{process_id}", "/api/instances/{instance_id}/user-tasks/{task_id}",
                  "/api/instances/{instance_id}/cancel", "/api/instances/{instance_id}/resume",
                  "/api/instances/{instance_id}/events", "/api/confirmations", "/api/confirmations/{confirmation_id}",
                  "/api/instances/{instance_id}/diagram.svg", "/api/processes/{process_id}/diagram.svg",
                  "/api/instances/{instance_id}/replay", "/api/instance-summaries", "/api/context-governance/tools",
                  "/api/context-governance/tools/{name}",
                  *(f"/api/context-governance/{op}" for op in ("inspect", "compress", "inject", "resolve", "rollback",
                                                              "config", "snapshot", "branch-evaluate"))}
    assert documented <= set(openapi["paths"])
    assert openapi["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in openapi["paths"].items():
        for method, op in operations.items():
            if path == "/api/health":
                continue
            assert op.get("security"), f"{method} {path}: the bearer token is not in its OpenAPI entry"
            # every error answer with the one error body; 404 only where the route names something
            # that may be unknown (a list route cannot answer it): each route's exact codes are
            # engine.api.ROUTE_ERRORS's, each earned by a request in test_contracts_rest_29
            assert "401" in op["responses"], f"{method} {path}"
            assert all(answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
                       for code, answer in op["responses"].items() if int(code) >= 400), f"{method} {path}"


# ----------------------------------------------------------------------------- errors name what to do

def test_a_body_that_is_no_json_says_where_and_what_to_send(server: str) -> None:
    r = local_http.post(f"{server}/api/instances", content=b'{"process_id": claim27}',
                   headers={**AUTH, "content-type": "application/json"}, timeout=60)
    error = _error_of(r, 422)
    assert error["kind"] == "validation_error"
    message = error["message"]
    assert "not valid JSON" in message and "Expecting value" in message, message  # the parser's own finding
    assert "position 15" in message, message  # where the parser stopped
    assert "JSON object" in message, message  # what to send


def test_a_message_only_a_signal_of_that_name_waits_for_says_to_send_a_signal(server: str) -> None:
    iid = _start(server, "signalled27")["instance_id"]
    error = _error_of(_post(server, f"/api/instances/{iid}/events", {"name": "stop_all"}), 409)
    assert error["kind"] == "invalid_state" and "stop_all" in error["message"]
    assert '"kind": "signal"' in error["message"], error["message"]
    done = _post(server, f"/api/instances/{iid}/events", {"name": "stop_all", "kind": "signal"})
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text


def test_a_tool_call_on_an_unknown_instance_names_the_rest_way_to_list_them(server: str) -> None:
    for path, body in [("/api/context-governance/tools/context_inspect", {"instance_id": "gone27", "arguments": {}}),
                       ("/api/context-governance/inspect", {"instance_id": "gone27"})]:
        error = _error_of(_post(server, path, body), 404)
        assert error["kind"] == "not_found" and "'gone27'" in error["message"]
        assert "GET /api/instances" in error["message"] and "list_instances()" not in error["message"], path


@pytest.mark.parametrize("path", ["/api/instances?status=complete", "/api/instance-summaries?status=done"])
def test_an_unknown_status_filter_is_named_not_an_empty_list(server: str, path: str) -> None:
    _start(server, "signalled27")
    error = _error_of(_get(server, path), 422)
    assert error["kind"] == "validation_error"
    assert "status" in error["message"] and "waiting" in error["message"] and "completed" in error["message"]
    assert _get(server, path.split("=")[0] + "=waiting").status_code == 200


# ----------------------------------------------------------------------------- tape filters over REST

def test_tape_filters_since_key_branch_context_and_limit(server: str) -> None:
    iid = _at_join(server)
    everything = _get(server, f"/api/instances/{iid}/tape").json()["events"]
    assert everything and {"main", "main/finance@"} <= {e["context"].split("@")[0] + ("@" if "@" in e["context"]
                                                                                        else "") for e in everything}
    since = _get(server, f"/api/instances/{iid}/tape?context=main&since=5").json()
    assert since["events"] and all(e["seq"] >= 5 and e["context"] == "main" for e in since["events"])
    assert since["count"] == len([e for e in everything if e["context"] == "main" and e["seq"] >= 5])
    branch = _get(server, f"/api/instances/{iid}/tape?branch=fraud").json()["events"]
    assert branch and all(e["branch"] == "fraud" for e in branch)
    assert _get(server, f"/api/instances/{iid}/tape?context=fraud").json()["events"][0]["context"].startswith(
        "main/fraud@")  # a branch id names its context
    keyed = _get(server, f"/api/instances/{iid}/tape?key=claim_status").json()["events"]
    assert keyed and len(keyed) < len(everything)
    limited = _get(server, f"/api/instances/{iid}/tape?limit=3").json()
    assert limited["count"] == 3 and limited["events"] == everything[:3]
    for bad in ("since=-1", "limit=0", "since=x"):
        error = _error_of(_get(server, f"/api/instances/{iid}/tape?{bad}"), 422)
        assert f"query.{bad.split('=')[0]}" in error["message"]
    error = _error_of(_get(server, f"/api/instances/{iid}/tape?context=nosuch"), 404)
    assert "'nosuch'" in error["message"] and "main" in error["message"]  # names the contexts it has


@pytest.mark.parametrize("method, path, allowed", [
    ("GET", "/api/context-governance/inspect", "POST"),
    ("DELETE", "/api/instances/someone", "GET"),
    ("PUT", "/api/confirmations", "GET"),
])
def test_a_method_the_path_does_not_take_names_the_ones_it_does(server: str, method: str, path: str,
                                                                 allowed: str) -> None:
    r = local_http.request(method, f"{server}{path}", headers=AUTH, timeout=30)
    error = _error_of(r, 405)
    assert error["kind"] == "method_not_allowed"
    assert allowed in r.headers.get("allow", ""), r.headers  # RFC 9110: a 405 carries Allow
    assert path in error["message"] and allowed in error["message"] and "/docs" in error["message"], error


def test_an_unknown_api_path_names_itself_and_where_the_endpoints_are(server: str) -> None:
    error = _error_of(_get(server, "/api/instance/abc"), 404)  # singular: a typo of /api/instances
    assert error["kind"] == "not_found"
    assert "/api/instance/abc" in error["message"] and "/docs" in error["message"], error


# ----------------------------------------------------------------------------- documented, untested before

def test_an_unknown_tape_kind_or_activity_adds_a_note_naming_what_there_is(server: str) -> None:
    iid = _at_join(server)
    kinds = _get(server, f"/api/instances/{iid}/tape?kind=snap").json()
    assert kinds["events"] == [] and "'snap'" in kinds["note"]
    assert {"snapshot", "split", "conflict"} <= set(kinds["kinds"]) and all(k in kinds["note"] for k in kinds["kinds"])
    named = _get(server, f"/api/instances/{iid}/tape?activity=triag").json()
    assert named["events"] == [] and "'triag'" in named["note"]
    assert {"intake", "triage", "finance", "fraud", "join"} <= set(named["activities"])
    found = _get(server, f"/api/instances/{iid}/tape?activity=triage").json()
    assert found["events"] and "note" not in found and "activities" not in found


def test_a_start_without_running_takes_a_config_change_then_a_resume_runs_it(server: str) -> None:
    created = _start(server, "claim27", run=False)
    iid = created["instance_id"]
    assert created["status"] == "running" and created["waiting_for"] == []
    assert "claim_status" not in created["layers"]["L3"]  # not a step ran
    r = _post(server, "/api/context-governance/config", {"instance_id": iid, "activity_id": "intake",
                                                          "config": {"preserveKeys": ["claim_status"]}})
    assert r.status_code == 200, r.text
    assert "claim_status" in r.json()["config"]["preserveKeys"]
    ran = _post(server, f"/api/instances/{iid}/resume", {})
    assert ran.status_code == 200, ran.text
    assert ran.json()["status"] == "waiting" and ran.json()["waiting_for"][0]["task_id"] == "triage"
    inspect = _post(server, "/api/context-governance/inspect", {"instance_id": iid, "layers": ["L3"],
                                                                 "metrics": ["top_keys"]}).json()
    assert {k["key"]: k["preserved"] for k in inspect["layers"]["L3"]["top_keys"]}["claim_status"] is True


def test_a_user_task_by_its_waiting_for_id_and_a_resume_of_a_completed_instance(server: str) -> None:
    started = _start(server, "signalled27")
    iid = started["instance_id"]
    done = _post(server, f"/api/instances/{iid}/events", {"name": "stop_all", "kind": "signal"}).json()
    assert done["status"] == "completed"
    again = _post(server, f"/api/instances/{iid}/resume", {"answers": {"confirmations": {"*": "x"}}})
    assert again.status_code == 200 and again.json()["status"] == "completed", again.text  # as it is
    assert again.json()["tape_length"] == done["tape_length"]  # its answers unused: nothing written
    claim = _start(server, "claim27")
    item = claim["waiting_for"][0]
    r = _post(server, f"/api/instances/{claim['instance_id']}/user-tasks/{item['id']}", {"data": {"sev": "low"}})
    assert r.status_code == 200, r.text
    assert r.json()["completed_user_task"] == {"id": item["id"], "task_id": "triage"}
    assert r.json()["layers"]["L3"]["sev"] == "low"


def test_a_refused_token_says_how_to_send_one(server: str) -> None:
    r = local_http.get(f"{server}/api/instances", timeout=30)
    error = _error_of(r, 401)
    assert error["kind"] == "unauthorized" and "Authorization: Bearer" in error["message"]
    assert r.headers.get("www-authenticate") == "Bearer"  # RFC 6750
    assert local_http.get(f"{server}/api/health", timeout=30).json() == {"status": "ok"}


@pytest.mark.parametrize("path, body, field, hint", [
    ("/api/context-governance/inject", {"instance_id": "x", "valuse": {"a": 1}, "values": {"a": 1}},
     "body.valuse", "did you mean 'values'"),
    ("/api/context-governance/inspect", {"instance_id": "x", "filter": {"key_prefx": "risk_"}},
     "body.filter.key_prefx", "did you mean 'key_prefix'"),
    ("/api/instances", {"process_id": "claim27", "answers": {"usertasks": {}}},
     "body.answers.usertasks", "did you mean 'user_tasks'"),
    ("/api/context-governance/compress", {"instance_id": "x", "action": "compress", "max_tokens": 5, "maxTokens": 5},
     "body.maxTokens", "`max_tokens` too"),
])
def test_an_unknown_field_is_named_with_the_one_meant(server: str, path: str, body: dict[str, Any], field: str,
                                                      hint: str) -> None:
    error = _error_of(_post(server, path, body), 422)
    problem = next(p for p in error["problems"] if p["field"] == field)
    assert hint in problem["message"] and hint in error["message"], error
