"""The REST API as a client that knows only DESIGN.md, the README and /openapi.json meets it (REST
round 30), against a real ``layerflow serve`` on the loan example of ``bpmn_examples/``:

- a ``resolve`` that names a confirmation and, with it, another conflict key is refused (400,
  naming both), not settled as if the key had not been sent;
- a body sent without ``Content-Type: application/json`` (curl's ``-d`` sends a form type; no type at
  all is not read as JSON either) is told so and what header to send, not that a JSON object "should be a valid dictionary";
- nothing of a refused request is written: the instance's version and tape stay as they were;
- a tape filter by a ``key`` or ``branch`` that no event has adds a ``note`` and what the tape has
  (``keys``, ``branches``), as ``kind`` and ``activity`` do and as ``layerflow tape`` says on stderr;
- the answers a client reads are those /openapi.json declares for the route (``inject``, ``snapshot``
  and the tape declare their fields, not a free object), and each kind of
  ``waiting_for`` item the server answers (DESIGN's ``user_task`` and ``confirmation``, extended with
  ``timer`` and ``event``) is one the ``WaitingItem`` schema names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import local_http
import pytest

from test_contracts_rest import AUTH, example_catalog, openapi_document, serving

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GOV = "/api/context-governance"
LOAN = {"amount": 200000, "applicant_id": "APP010", "purpose": "equipment"}  # risk and finance disagree
QUESTION = "review_join/approval_status"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest30")
    yield from serving(folder, example_catalog(folder, "message_wait.bpmn", "timer_boundary.bpmn"))


@pytest.fixture(scope="module")
def openapi(server: str) -> dict[str, Any]:
    return openapi_document(server)


def _call(server: str, method: str, path: str, body: Any = None, **kwargs: Any) -> httpx.Response:
    headers = {**AUTH, **kwargs.pop("headers", {})}
    if body is not None:
        kwargs["json"] = body
    return local_http.request(method, f"{server}{path}", headers=headers, timeout=60, **kwargs)


def _check(openapi: dict[str, Any], method: str, path: str, r: httpx.Response) -> None:
    """The answer is one /openapi.json lists for the route, with the body its schema declares."""
    responses = openapi["paths"][path][method]["responses"]
    assert str(r.status_code) in responses, f"{method} {path}: {r.status_code} is not listed: {r.text[:300]}"
    schema = responses[str(r.status_code)]["content"]["application/json"]["schema"]
    validator = jsonschema.Draft202012Validator({**schema, "components": openapi["components"]})
    problems = [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(r.json())]
    assert not problems, f"{method} {path} {r.status_code}: the answer is not the declared schema: {problems}"


def _waiting(server: str, openapi: dict[str, Any]) -> dict[str, Any]:
    r = _call(server, "POST", "/api/instances", {"process_id": "loan_approval", "data": LOAN})
    _check(openapi, "post", "/api/instances", r)
    doc: dict[str, Any] = r.json()
    assert doc["status"] == "waiting" and doc["waiting_for"][0]["id"] == QUESTION, doc["waiting_for"]
    return doc


def _state(server: str, iid: str) -> tuple[int, int, list[Any]]:
    doc = _call(server, "GET", f"/api/instances/{iid}").json()
    tape = _call(server, "GET", f"/api/instances/{iid}/tape").json()["events"]
    return doc["version"], doc["tape_length"], tape


@pytest.mark.parametrize("names", [
    {"confirmation_id": QUESTION, "conflict_key": "risk_level"},
    {"confirmation_id": QUESTION, "key": "loan_terms"},
    {"confirmationId": QUESTION, "conflictKey": "no_such_key"},
])
def test_a_resolve_naming_a_confirmation_and_another_key_is_refused(server: str, openapi: dict[str, Any],
                                                                    names: dict[str, str]) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    before = _state(server, iid)
    r = _call(server, "POST", f"{GOV}/resolve", {"instance_id": iid, **names, "resolution": "approved",
                                                  "reason": "finance signed off"})
    assert r.status_code == 400, r.text  # was 200: the key was dropped and the confirmation answered
    _check(openapi, "post", f"{GOV}/resolve", r)
    error = r.json()["error"]
    key = names.get("conflict_key") or names.get("key") or names["conflictKey"]
    assert error["kind"] == "bad_request"
    assert QUESTION in error["message"] and repr(key) in error["message"] and "'approval_status'" in error["message"]
    assert _state(server, iid) == before  # nothing answered, nothing on the tape
    pending = _call(server, "GET", "/api/confirmations", params={"instance_id": iid}).json()
    assert [c["id"] for c in pending] == [QUESTION]


def test_a_resolve_naming_a_confirmation_and_its_own_key_settles_it(server: str, openapi: dict[str, Any]) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    r = _call(server, "POST", f"{GOV}/resolve", {"instance_id": iid, "confirmation_id": QUESTION,
                                                  "conflict_key": "approval_status", "resolution": "approved",
                                                  "reason": "finance signed off"})
    assert r.status_code == 200, r.text
    _check(openapi, "post", f"{GOV}/resolve", r)
    assert r.json()["status"] == "completed" and r.json()["layers"]["L3"]["approval_status"] == "approved"


@pytest.mark.parametrize("content_type", ["application/x-www-form-urlencoded", "text/plain", None])
@pytest.mark.parametrize("op", ["inspect", "inject"])
def test_a_body_not_sent_as_json_says_which_header_to_send(server: str, openapi: dict[str, Any], op: str,
                                                           content_type: str | None) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    before = _state(server, iid)
    body = f'{{"instance_id": "{iid}", "context": "finance_review", "values": {{"memo": "x"}}}}'
    headers = {"content-type": content_type} if content_type else {}
    r = _call(server, "POST", f"{GOV}/{op}", content=body.encode(), headers=headers)
    assert r.status_code == 422, r.text
    _check(openapi, "post", f"{GOV}/{op}", r)
    message = r.json()["error"]["message"]
    # was: "body: Input should be a valid dictionary or object to extract fields from"
    sent = content_type or "no Content-Type"
    assert sent in message and "Content-Type: application/json" in message, message
    assert r.json()["error"]["problems"][0]["field"] == "body"
    assert _state(server, iid) == before


def test_the_answers_of_a_run_through_are_the_declared_ones(server: str, openapi: dict[str, Any]) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    steps = [("get", f"/api/instances/{iid}", None), ("post", f"{GOV}/inspect", {"instance_id": iid}),
             ("post", f"{GOV}/snapshot", {"instance_id": iid, "context": "finance_review"}),
             ("get", f"/api/instances/{iid}/tape", None), ("get", "/api/confirmations", None),
             ("post", f"{GOV}/inject", {"instance_id": iid, "context": "finance_review", "values": {"memo": "x"}}),
             ("post", f"{GOV}/inject", {"instance_id": iid, "context": "finance_review", "key": "policy",
                                        "value": "y"}),
             ("post", f"{GOV}/rollback", {"instance_id": iid, "snapshot_id": "snap:nope"}),
             ("post", f"/api/confirmations/{QUESTION}", {"instance_id": iid, "value": "rejected"}),
             ("post", f"{GOV}/resolve", {"instance_id": iid, "key": "approval_status", "value": "approved",
                                         "reason": "late"})]
    codes = []
    for method, path, body in steps:
        r = _call(server, method.upper(), path, body)
        template = path.replace(iid, "{instance_id}").replace(f"confirmations/{QUESTION}",
                                                              "confirmations/{confirmation_id}")
        _check(openapi, method, template, r)
        codes.append(r.status_code)
    assert codes == [200, 200, 200, 200, 200, 200, 403, 404, 200, 409], codes


def test_every_kind_of_waiting_item_is_one_the_schema_names(server: str, openapi: dict[str, Any]) -> None:
    seen: set[str] = set()
    for process_id, data in (("loan_approval", LOAN), ("message_wait", {}), ("timer_boundary", {})):
        r = _call(server, "POST", "/api/instances", {"process_id": process_id, "data": data})
        _check(openapi, "post", "/api/instances", r)
        seen |= {w["kind"] for w in r.json()["waiting_for"]}
    assert seen == {"user_task", "confirmation", "timer", "event"}, seen
    kind = openapi["components"]["schemas"]["WaitingItem"]["properties"]["kind"]
    # was a free string whose description made a timer an `event` with `event_kind` "timer"
    assert set(kind.get("enum", ())) == seen, kind
    assert "timer" in kind["description"] and "`event_kind`" in kind["description"], kind


def test_the_context_branch_tool_refuses_a_confirmation_with_another_key_too(server: str,
                                                                            openapi: dict[str, Any]) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    before = _state(server, iid)
    r = _call(server, "POST", f"{GOV}/tools/context_branch", {"instance_id": iid, "arguments": {
        "action": "resolve_conflict", "confirmation_id": QUESTION, "conflict_key": "risk_level",
        "resolution": "approved", "reason": "finance signed off"}})
    assert r.status_code == 400 and r.json()["error"]["kind"] == "bad_request", r.text
    _check(openapi, "post", f"{GOV}/tools/{{name}}", r)
    assert _state(server, iid) == before


@pytest.mark.parametrize("query, note, listed, expected", [
    ({"key": "approval_statu"}, "no event of key 'approval_statu'", "keys", "approval_status"),
    ({"branch": "fraud_check"}, "no event of branch 'fraud_check'", "branches", "finance_review"),
    ({"key": "approval_statu", "context": "finance_review"}, "'approval_status'", "keys", "approval_status"),
])
def test_a_tape_filter_no_event_matches_says_what_the_tape_has(server: str, openapi: dict[str, Any],
                                                               query: dict[str, str], note: str, listed: str,
                                                               expected: str) -> None:
    iid = _waiting(server, openapi)["instance_id"]
    r = _call(server, "GET", f"/api/instances/{iid}/tape", params=query)
    assert r.status_code == 200, r.text
    _check(openapi, "get", "/api/instances/{instance_id}/tape", r)
    doc = r.json()
    assert doc["count"] == 0 and note in doc.get("note", ""), doc  # was: no note, only `"count": 0`
    assert expected in doc[listed], doc
    found = _call(server, "GET", f"/api/instances/{iid}/tape", params={listed[:-1] if listed == "keys" else "branch":
                                                                      expected}).json()
    assert found["count"] > 0 and "note" not in found, found


@pytest.mark.parametrize("method, path, schema, fields", [
    ("post", f"{GOV}/inject", "InjectResult", {"instance_id", "version", "context", "written", "tape_seq"}),
    ("post", f"{GOV}/snapshot", "SnapshotResult", {"instance_id", "version", "context", "snapshot_id", "seq",
                                                    "label", "layers"}),
    ("get", "/api/instances/{instance_id}/tape", "TapeDocument", {"instance_id", "version", "count", "events",
                                                                      "total", "next_offset"}),  # round 48: pages
])
def test_the_governance_answers_declare_their_fields(openapi: dict[str, Any], method: str, path: str, schema: str,
                                                     fields: set[str]) -> None:
    declared = openapi["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
    # was {"type": "object", "additionalProperties": true}: a client learnt nothing of the answer
    assert declared == {"$ref": f"#/components/schemas/{schema}"}, declared
    model = openapi["components"]["schemas"][schema]
    assert set(model["required"]) == fields, model["required"]
    if schema == "TapeDocument":
        event = openapi["components"]["schemas"]["TapeEvent"]
        assert {"context", "seq", "kind", "time", "actor", "activity", "branch"} <= set(event["properties"])
