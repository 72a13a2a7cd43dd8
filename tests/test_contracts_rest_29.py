"""The REST API's error answers are the ones /openapi.json lists, route by route (REST round 29),
against a real ``layerflow serve`` on a redis-server of this module's own:

- each route lists exactly the codes it can answer (``engine.api.ROUTE_ERRORS``): every code listed
  is answered here by a request that earns it (500, a bug, aside), and no bad request of the many
  below earns a code its route does not list, nor a line in the server's log saying so (that
  check's own test: test_contracts_rest_28);
- 503 on every route that reads the store, with the redis-server gone (then back, data and all);
- a client that knows only DESIGN.md and /openapi.json gets through a whole run: start, a user
  task, a conflict a person settles, inspect, a filtered tape, snapshot, rollback, replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import local_http
import pytest

from stores.test_faults import OwnRedis
from test_contracts_rest import AUTH, serving
from test_contracts_rest_27 import CLAIM, SIGNALLED

pytestmark = pytest.mark.slow

CLAIM_CONFIG = """\
system:
  policy: pay only covered claims
join:
  humanConfirm: {timeout: 600, default: hold, message: finance and fraud disagree}
"""
# a flow to nowhere: the catalog lists the file (it is XML), a start or a look at it is 422
BROKEN = CLAIM.replace("claim27", "broken29").replace('targetRef="close"', 'targetRef="nowhere"')
GONE = "gone29"


@dataclass
class Served:
    url: str
    log: Path
    redis: OwnRedis


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("rest29")
    catalog = folder / "catalog"
    catalog.mkdir()
    (catalog / "claim.bpmn").write_text(CLAIM)
    (catalog / "claim.layerflow.yaml").write_text(CLAIM_CONFIG)
    (catalog / "signalled.bpmn").write_text(SIGNALLED)
    (catalog / "broken.bpmn").write_text(BROKEN)
    redis = OwnRedis(folder)  # durable: killed and started again, it has every instance back
    redis.start()
    log = folder / "serve.log"
    try:
        for url in serving(folder, catalog, store=f"redis://127.0.0.1:{redis.port}/12?prefix=rest29", log=log):
            yield Served(url, log, redis)
    finally:
        redis.stop()


@pytest.fixture(scope="module")
def openapi(served: Served) -> dict[str, Any]:
    doc: dict[str, Any] = local_http.get(f"{served.url}/openapi.json", timeout=30).json()
    return doc


def _operations(openapi: dict[str, Any]) -> list[tuple[str, str, set[int]]]:
    """(method, path, the error codes it lists) of every operation that needs the token."""
    return [(method, path, {int(c) for c in op["responses"] if int(c) >= 400})
            for path, ops in openapi["paths"].items() for method, op in ops.items() if path != "/api/health"]


def call(url: str, method: str, path: str, body: Any = None, *, raw: str | None = None,
         headers: dict[str, str] | None = None) -> httpx.Response:
    """One request; ``raw``: the body as JSON text (what ``json=`` cannot send: a lone surrogate, NaN)."""
    sent: dict[str, Any] = {"headers": {**AUTH, **(headers or {})}, "timeout": 60}
    if raw is not None:
        sent["content"] = raw.encode("utf-8")
        sent["headers"].setdefault("content-type", "application/json")
    elif body is not None:
        sent["json"] = body
    return local_http.request(method.upper(), f"{url}{path}", **sent)


def _started(url: str, process_id: str = "claim27", **extra: Any) -> str:
    r = call(url, "post", "/api/instances", {"process_id": process_id, **extra})
    assert r.status_code == 201, r.text
    return str(r.json()["instance_id"])


@dataclass
class Instances:
    wait: str   # waits at user task triage
    docs: str   # waits for message docs_arrived; two snapshots labelled "twice"
    join: str   # waits at the join for a person (confirmation join/claim_status), its branches open
    ref: str    # waits for message docs_arrived, as docs does; started with {"ref": "m29"} (POST /api/messages)


@pytest.fixture(scope="module")
def instances(served: Served) -> Instances:
    url = served.url
    wait, docs, join = (_started(url) for _ in range(3))
    ref = _started(url, data={"ref": "m29"})
    for iid in (docs, join, ref):
        assert call(url, "post", f"/api/instances/{iid}/user-tasks/triage", {"data": {}}).status_code == 200
    r = call(url, "post", f"/api/instances/{join}/events", {"name": "docs_arrived", "payload": {}})
    assert r.json()["waiting_for"][0]["id"] == "join/claim_status", r.text
    for _ in range(2):  # one label on two snapshots: a rollback to it cannot tell which is meant
        taken = call(url, "post", "/api/context-governance/snapshot", {"instance_id": docs, "label": "twice"})
        assert taken.status_code == 200, taken.text
    return Instances(wait, docs, join, ref)


# ----------------------------------------------------------------------------- each listed code, earned

# (path, body) or (path, None, raw body), or (path, body, None, headers); the method is the route's
Ask = tuple[str, Any] | tuple[str, Any, str] | tuple[str, Any, None, dict[str, str]]
STALE_TAG = {"If-Match": '"999"'}  # the version a change expects, as HTTP asks it: stale -> 412
WEAK_TAG = {"If-Match": 'W/"1"'}  # no entity tag this API gives: 400
SURROGATE = '{"x": {"nested": "\\ud800"}}'  # valid JSON, no text: no context can hold it


def _earning(i: Instances) -> dict[tuple[str, str], dict[int, Ask]]:
    """Per operation, a request earning each error code it lists (401 and 503: for every route, below)."""
    gov = "/api/context-governance"
    stale = {"expected_version": 999}
    return {
        ("post", f"{gov}/inspect"): {404: (f"{gov}/inspect", {"instance_id": GONE}),
                                     422: (f"{gov}/inspect", {"instance_id": i.wait, "layers": ["L9"]})},
        ("post", f"{gov}/compress"): {
            400: (f"{gov}/compress", {"instance_id": i.wait, "action": "compress", "target_layers": ["L4"]}),
            404: (f"{gov}/compress", {"instance_id": i.wait, "action": "evaluate", "before_snapshot_id": "snap:no"}),
            409: (f"{gov}/compress", {"instance_id": i.join, "action": "compress"}),  # its branches are open
            412: (f"{gov}/compress", {"instance_id": i.wait, "action": "compress"}, None, STALE_TAG),
            422: (f"{gov}/compress", {"instance_id": i.wait, "action": "squash"})},
        ("post", f"{gov}/inject"): {
            400: (f"{gov}/inject", None, f'{{"instance_id": "{i.wait}", "values": {SURROGATE}}}'),
            403: (f"{gov}/inject", {"instance_id": i.wait, "key": "policy", "value": "pay all"}),
            404: (f"{gov}/inject", {"instance_id": GONE, "key": "memo", "value": 1}),
            409: (f"{gov}/inject", {"instance_id": i.wait, "key": "memo", "value": 1, **stale}),
            412: (f"{gov}/inject", {"instance_id": i.wait, "key": "memo", "value": 1}, None, STALE_TAG),
            422: (f"{gov}/inject", {"instance_id": i.wait, "key": "memo"})},
        ("post", f"{gov}/resolve"): {
            400: (f"{gov}/resolve", {"instance_id": i.join, "key": "claim_status", "value": "maybe", "reason": "r"}),
            404: (f"{gov}/resolve", {"instance_id": i.wait, "key": "claim_status", "value": "pay", "reason": "r"}),
            409: (f"{gov}/resolve", {"instance_id": i.join, "key": "claim_status", "value": "pay", "reason": "r",
                                     **stale}),
            412: (f"{gov}/resolve", {"instance_id": i.join, "key": "claim_status", "value": "pay", "reason": "r"},
                  None, STALE_TAG),
            422: (f"{gov}/resolve", {"instance_id": i.join, "key": "claim_status", "reason": "no value"})},
        ("post", f"{gov}/rollback"): {
            400: (f"{gov}/rollback", {"instance_id": i.docs, "snapshot_id": "twice"}),  # a label of two snapshots
            404: (f"{gov}/rollback", {"instance_id": i.wait, "snapshot_id": "snap:no"}),
            409: (f"{gov}/rollback", {"instance_id": i.wait, "snapshot_id": "snap:no", **stale}),
            412: (f"{gov}/rollback", {"instance_id": i.wait, "snapshot_id": "snap:no"}, None, STALE_TAG),
            422: (f"{gov}/rollback", {"instance_id": i.wait})},
        ("post", f"{gov}/config"): {
            400: (f"{gov}/config", None, f'{{"instance_id": "{i.wait}", "activity_id": "close", '
                                         '"config": {"compressTokenThreshold": NaN}}'),
            404: (f"{gov}/config", {"instance_id": i.wait, "activity_id": "nowhere", "config": {}}),
            409: (f"{gov}/config", {"instance_id": i.wait, "activity_id": "close", "config": {}, **stale}),
            412: (f"{gov}/config", {"instance_id": i.wait, "activity_id": "close", "config": {}}, None, STALE_TAG),
            422: (f"{gov}/config", {"instance_id": i.wait, "activity_id": "close",
                                    "config": {"compressTokenThreshold": "lots"}})},
        ("post", f"{gov}/snapshot"): {400: (f"{gov}/snapshot", {"instance_id": i.wait}, None, WEAK_TAG),
                                      404: (f"{gov}/snapshot", {"instance_id": GONE}),
                                      409: (f"{gov}/snapshot", {"instance_id": i.wait, **stale}),
                                      412: (f"{gov}/snapshot", {"instance_id": i.wait}, None, STALE_TAG),
                                      422: (f"{gov}/snapshot", {"instance_id": i.wait, "lable": "x"})},
        ("post", f"{gov}/branch-evaluate"): {
            404: (f"{gov}/branch-evaluate", {"instance_id": i.join, "branch_id": "nobranch", "required_keys": ["k"]}),
            422: (f"{gov}/branch-evaluate", {"instance_id": i.join})},
        ("get", f"{gov}/tools"): {422: (f"{gov}/tools?name=context_inspect", None)},  # it takes no query
        ("post", f"{gov}/tools/{{name}}"): {
            400: (f"{gov}/tools/context_inspect", {"instance_id": i.wait, "arguments": {}, "layers": ["L3"]}),
            404: (f"{gov}/tools/context_ask", {"instance_id": i.wait, "arguments": {}}),
            409: (f"{gov}/tools/context_compress", {"instance_id": i.join, "arguments": {"action": "compress"}}),
            422: (f"{gov}/tools/context_inspect", {"instance_id": i.wait, "arguments": {"layers": ["L9"]}})},
        ("get", "/api/processes"): {422: ("/api/processes?process_id=loan", None)},
        ("get", "/api/processes/{process_id}"): {404: ("/api/processes/nope", None),
                                                 422: ("/api/processes/broken29", None)},
        ("get", "/api/instances"): {422: ("/api/instances?status=done", None)},
        ("post", "/api/instances"): {
            400: ("/api/instances", None, f'{{"process_id": "claim27", "data": {SURROGATE}}}'),
            403: ("/api/instances", {"process_id": "claim27", "data": {"policy": "pay all"}}),
            404: ("/api/instances", {"process_id": "nope"}),
            422: ("/api/instances", {"process_id": "broken29"})},
        ("get", "/api/instances/{instance_id}"): {404: (f"/api/instances/{GONE}", None),
                                                  422: ("/api/instances/not%20an%20id", None)},
        ("post", "/api/messages"): {  # docs and ref wait for docs_arrived; ref alone holds "ref"
            400: ("/api/messages", None, f'{{"name": "docs_arrived", "match": {{"ref": "m29"}}, "payload": {SURROGATE}}}'),
            403: ("/api/messages", {"name": "docs_arrived", "match": {"ref": "m29"}, "payload": {"policy": "pay all"}}),
            404: ("/api/messages", {"name": "docs_arrived", "match": {"ref": "none"}, "process_id": "claim27"}),
            409: ("/api/messages", {"name": "docs_arrived"}),  # two instances take it
            422: ("/api/messages", {"name": "docs_arrived", "match": [1]})},
        ("post", "/api/instances/{instance_id}/events"): {
            400: (f"/api/instances/{i.docs}/events", None, f'{{"name": "docs_arrived", "payload": {SURROGATE}}}'),
            403: (f"/api/instances/{i.docs}/events", {"name": "docs_arrived", "payload": {"policy": "pay all"}}),
            404: (f"/api/instances/{GONE}/events", {"name": "docs_arrived"}),
            409: (f"/api/instances/{i.wait}/events", {"name": "docs_arrived"}),  # it waits for triage
            412: (f"/api/instances/{i.docs}/events", {"name": "docs_arrived"}, None, STALE_TAG),
            422: (f"/api/instances/{i.docs}/events", {"name": "docs_arrived", "kind": "telegram"})},
        ("post", "/api/instances/{instance_id}/user-tasks/{task_id}"): {
            400: (f"/api/instances/{i.wait}/user-tasks/triage", None, f'{{"data": {SURROGATE}}}'),
            403: (f"/api/instances/{i.wait}/user-tasks/triage", {"data": {"policy": "pay all"}}),
            404: (f"/api/instances/{GONE}/user-tasks/triage", {"data": {}}),
            409: (f"/api/instances/{i.docs}/user-tasks/triage", {"data": {}}),  # done already
            412: (f"/api/instances/{i.wait}/user-tasks/triage", {"data": {}}, None, STALE_TAG),
            422: (f"/api/instances/{i.wait}/user-tasks/triage", {"data": []})},
        ("post", "/api/instances/{instance_id}/resume"): {
            400: (f"/api/instances/{i.wait}/resume", {"answers": {"user_tasks": {"triag": {}}}}),
            403: (f"/api/instances/{i.wait}/resume", {"answers": {"user_tasks": {"triage": {"policy": "x"}}}}),
            404: (f"/api/instances/{GONE}/resume", {}),
            409: (f"/api/instances/{i.wait}/resume", stale),
            412: (f"/api/instances/{i.wait}/resume", {}, None, STALE_TAG),
            422: (f"/api/instances/{i.wait}/resume", {"answers": {"usertasks": {}}})},
        ("post", "/api/instances/{instance_id}/cancel"): {
            400: (f"/api/instances/{i.wait}/cancel", {"reason": "r"}, None, WEAK_TAG),
            404: (f"/api/instances/{GONE}/cancel", {"reason": "r"}),
            409: (f"/api/instances/{i.wait}/cancel", {"reason": "r", **stale}),
            412: (f"/api/instances/{i.wait}/cancel", {"reason": "r"}, None, STALE_TAG),
            422: (f"/api/instances/{i.wait}/cancel", {})},
        ("get", "/api/instances/{instance_id}/tape"): {404: (f"/api/instances/{i.join}/tape?context=nosuch", None),
                                                       422: (f"/api/instances/{i.join}/tape?limit=0", None)},
        ("get", "/api/confirmations"): {404: (f"/api/confirmations?instance_id={GONE}", None),
                                        422: ("/api/confirmations?instance_id=not%20an%20id", None)},
        ("post", "/api/confirmations/{confirmation_id}"): {
            400: ("/api/confirmations/join/claim_status", {"value": "maybe"}),
            404: ("/api/confirmations/nowhere/nothing", {"value": "pay"}),
            409: ("/api/confirmations/join/claim_status", {"value": "pay", "instance_id": i.join, **stale}),
            412: ("/api/confirmations/join/claim_status", {"value": "pay", "instance_id": i.join}, None, STALE_TAG),
            422: ("/api/confirmations/join/claim_status", {"reason": "no value"})},
        ("get", "/api/instance-summaries"): {422: ("/api/instance-summaries?limit=0", None)},
        ("get", "/api/instances/{instance_id}/diagram.svg"): {404: (f"/api/instances/{GONE}/diagram.svg", None),
                                                             422: ("/api/instances/not%20an%20id/diagram.svg", None)},
        ("get", "/api/processes/{process_id}/diagram.svg"): {404: ("/api/processes/nope/diagram.svg", None),
                                                            422: ("/api/processes/not%20an%20id/diagram.svg", None)},
        ("get", "/api/instances/{instance_id}/replay"): {404: (f"/api/instances/{i.join}/replay?context=nosuch", None),
                                                        422: (f"/api/instances/{i.join}/replay?until=-1", None)},
    }


def _ask(url: str, method: str, ask: Ask, *, headers: dict[str, str] | None = None) -> httpx.Response:
    path, body, *rest = ask
    sent = {**(rest[1] if len(rest) > 1 else {}), **(headers or {})}
    return call(url, method, path, body, raw=rest[0] if rest else None, headers=sent)


def _kinds(openapi: dict[str, Any], method: str, path: str, code: int) -> str:
    return str(openapi["paths"][path][method]["responses"][str(code)]["description"])


def test_each_listed_error_code_is_earned_by_a_request(served: Served, openapi: dict[str, Any],
                                                       instances: Instances) -> None:
    earning = _earning(instances)
    for method, path, listed in _operations(openapi):
        asks = earning[(method, path)]
        assert listed - {401, 413, 500, 503} == set(asks), f"{method} {path}: lists {sorted(listed)}"
        for code, ask in asks.items():
            r = _ask(served.url, method, ask)
            assert r.status_code == code, f"{method} {ask[0]}: {r.status_code} {r.text[:300]}"
            kind = r.json()["error"]["kind"]
            assert f"`{kind}`" in _kinds(openapi, method, path, code), f"{method} {path} {code}: {kind}"
        r = _ask(served.url, method, next(iter(asks.values()), (path, None)), headers={"Authorization": "Bearer no"})
        assert r.status_code == 401 and 401 in listed, f"{method} {path}: {r.status_code}"
        # every route refuses a body over the limit (1 MiB) before reading it, as it refuses a wrong token
        r = _ask(served.url, method, (next(iter(asks.values()), (path, None))[0], None, '"' + "x" * 2**20 + '"'))
        assert r.status_code == 413 and 413 in listed, f"{method} {path}: {r.status_code}"
    assert "does not list" not in served.log.read_text()


def test_the_bodies_of_the_error_answers_are_the_one_error_body(openapi: dict[str, Any]) -> None:
    for method, path, listed in _operations(openapi):
        responses = openapi["paths"][path][method]["responses"]
        assert 401 in listed and 500 in listed, f"{method} {path}"
        assert 502 not in listed, f"{method} {path}: no route calls a model (a failing one is the instance's error)"
        for code in listed:
            body = responses[str(code)]["content"]["application/json"]["schema"]
            assert body == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {code}"
            assert responses[str(code)]["description"].startswith("`"), f"{method} {path} {code}: names no kind"


# ----------------------------------------------------------------------------- no code unlisted

# bodies a client gets wrong: none, no object, no JSON, a field of no route, a stale or impossible
# version, text that is no text, a number no JSON parser keeps, the wrong content type
BAD_BODIES: list[dict[str, Any]] = [
    {"raw": "[]"}, {"raw": '{"instance_id": '}, {"body": {"bogus": 1, "instance_id": "not an id"}},
    {"body": {"instance_id": GONE, "expected_version": 0}, "query": "?instance_id=a"},
    {"raw": '{"instance_id": "\\ud800", "user": "\\udfff", "name": 5}'},
    {"raw": '{"expected_version": 1e400, "value": -Infinity}', "query": "?expected_version=-1"},
    {"raw": '{"process_id": "claim27"}', "headers": {"content-type": "text/plain"}},
]
BAD_QUERIES = ["?instance_id=a&instance_id=b&since=-1&limit=x", "?until=99999999999999999999999&limit=0",
               "?status=%ED%A0%80&context=%00", "?kind=&activity=&branch=&key=%FF"]


def _fill(path: str, real: dict[str, str], weird: str) -> list[str]:
    """``path`` with its parameters: things that exist, then ``weird`` for each."""
    known = path
    for name, value in real.items():
        known = known.replace(f"{{{name}}}", value)
    odd = path
    for name in real:
        odd = odd.replace(f"{{{name}}}", weird)
    return list(dict.fromkeys([known, odd]))


def test_no_bad_request_earns_a_code_its_route_does_not_list(served: Served, openapi: dict[str, Any]) -> None:
    url = served.url
    real = {"instance_id": _started(url), "task_id": "triage", "name": "context_branch", "process_id": "claim27",
            "confirmation_id": "join/claim_status"}
    seen: dict[int, int] = {}
    for method, path, listed in _operations(openapi):
        for filled in _fill(path, real, "%ED%A0%80" if "confirmation" in path else GONE):
            for bad in BAD_BODIES if method == "post" else [{"query": q} for q in BAD_QUERIES]:
                query = bad.get("query", "")
                r = call(url, method, filled + query, bad.get("body"), raw=bad.get("raw"), headers=bad.get("headers"))
                seen[r.status_code] = seen.get(r.status_code, 0) + 1
                assert r.status_code < 300 or r.status_code in listed, (
                    f"{method} {filled}{query} {bad}: {r.status_code} is not listed ({sorted(listed)}): {r.text[:300]}")
        # a method no operation of the path has: the path's 405, naming the methods it takes
        r = call(url, "put", _fill(path, real, GONE)[0])
        assert r.status_code == 405 and method.upper() in r.headers["allow"], f"PUT {path}: {r.status_code}"
    assert {200, 404, 422} <= set(seen), seen
    assert "does not list" not in served.log.read_text()


def test_every_route_that_reads_the_store_answers_503_while_it_is_gone(served: Served, openapi: dict[str, Any],
                                                                      instances: Instances) -> None:
    """The redis-server goes away under the running server (and comes back: nothing is lost)."""
    # a request that gets as far as the store: on an instance that exists (409 and 404 asks, pointed at
    # one), a start (403: the data is checked as it is written), a list (no query)
    asked: dict[tuple[str, str], Ask] = {(m, p): asks.get(409) or asks.get(403) or asks.get(404) or (p, None)
                                         for (m, p), asks in _earning(instances).items()}
    served.redis.kill()
    try:
        for method, path, listed in _operations(openapi):
            if 503 not in listed:
                continue
            path_, body, *raw = asked[(method, path)]
            ask = path_.replace(GONE, instances.wait).replace("/nope", "/claim27")  # what exists, but for the store
            r = call(served.url, method, ask, body, raw=raw[0] if raw else None)
            assert r.status_code == 503 and r.json()["error"]["kind"] == "store_unavailable", (
                f"{method} {ask}: {r.status_code} {r.text[:300]}")
        for method, path, listed in _operations(openapi):
            if 503 not in listed:  # the catalog's routes read no store
                r = call(served.url, method, path.replace("{process_id}", "claim27"))
                assert r.status_code == 200, f"{method} {path}: {r.status_code} {r.text[:300]}"
    finally:
        served.redis.start()
    assert call(served.url, "get", f"/api/instances/{instances.wait}").json()["status"] == "waiting"


@pytest.mark.parametrize("raw", ['{"instance_id": "not an id", "arguments": {}}', '{"instance_id": 29}',
                                 '{"instanceId": "\\ud800", "arguments": {}}'])
def test_a_tool_call_naming_no_valid_instance_id_is_a_422_naming_the_field(served: Served, raw: str) -> None:
    # was a 500: the id was checked outside the request's validation, and its ValidationError escaped
    r = call(served.url, "post", "/api/context-governance/tools/context_inspect", raw=raw)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["problems"][0]["field"] == "body.instance_id", r.text


# ----------------------------------------------------------------------------- a client of the docs alone

class Client:
    """What a client author builds from DESIGN.md and /openapi.json alone: each answer's code is
    one its operation lists, and its body is the schema listed for that code."""

    def __init__(self, url: str, openapi: dict[str, Any]) -> None:
        self.url, self.openapi = url, openapi

    def __call__(self, method: str, template: str, body: Any = None, **params: str) -> Any:
        path = template.format(**params)
        r = call(self.url, method, path, body)
        answers = self.openapi["paths"][template.split("?")[0]][method]["responses"]
        assert str(r.status_code) in answers, f"{method} {path}: {r.status_code} is not listed: {r.text[:300]}"
        schema = answers[str(r.status_code)]["content"]["application/json"]["schema"]
        validator = jsonschema.Draft202012Validator({**schema, "components": self.openapi["components"]})
        problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(r.json())]
        assert not problems, f"{method} {path} {r.status_code}: not the schema /openapi.json lists: {problems[:5]}"
        return r.json()


def test_a_client_of_design_md_and_openapi_json_runs_a_claim_through(served: Served, openapi: dict[str, Any]) -> None:
    api = Client(served.url, openapi)
    assert "claim27" in {p["id"] for p in api("get", "/api/processes")}
    doc = api("post", "/api/instances", {"process_id": "claim27", "data": {"claim_id": "C-29", "amount": 900}})
    iid = doc["instance_id"]
    assert doc["status"] == "waiting" and doc["layers"]["L1"] == {"claim_id": "C-29", "amount": 900}
    task = doc["waiting_for"][0]
    assert (task["kind"], task["task_id"]) == ("user_task", "triage")
    doc = api("post", "/api/instances/{instance_id}/user-tasks/{task_id}", {"data": {"severity": "low"}}, instance_id=iid, task_id=task["id"])
    assert doc["layers"]["L3"]["severity"] == "low" and doc["waiting_for"][0]["kind"] == "event"  # the message

    # a snapshot, a mistaken note, the rollback: the note is gone from the context, not from the tape
    snap = api("post", "/api/context-governance/snapshot", {"instance_id": iid, "label": "before the memo"})
    assert "severity" in snap["layers"]["L3"]
    api("post", "/api/context-governance/inject", {"instance_id": iid, "key": "memo", "value": "pay at once"})
    back = api("post", "/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": snap["snapshot_id"],
                                                             "reason": "the memo was wrong"})
    doc = api("get", "/api/instances/{instance_id}", instance_id=iid)
    assert "memo" not in doc["layers"]["L4"] and doc["version"] == back["version"]

    # the documents arrive, the branches disagree, a person settles it
    doc = api("post", "/api/instances/{instance_id}/events", {"name": "docs_arrived", "payload": {"doc": "receipt"}}, instance_id=iid)
    (conflict,) = doc["conflicts"]
    assert conflict["values"] == {"finance": "pay", "fraud": "hold"} and conflict["resolution"] is None
    (asked,) = api("get", "/api/confirmations?instance_id={instance_id}", instance_id=iid)
    assert {o["value"] for o in asked["options"]} >= {"pay", "hold"}
    inspect = api("post", "/api/context-governance/inspect", {"instance_id": iid, "layers": ["L3"]})
    assert "severity" in inspect["layers"]["L3"]["keys"] and inspect["conflicts"] == [conflict]
    doc = api("post", "/api/confirmations/{confirmation_id}", {"value": "hold", "instance_id": iid, "reason": "fraud first",
                                                    "expected_version": doc["version"]}, confirmation_id=asked["id"])
    assert doc["status"] == "completed" and doc["layers"]["L3"]["closed"] == "hold"
    assert doc["conflicts"][0]["resolution"]["resolver"] == "human"

    # the tape: what happened to claim_status, and the context as it was before the join
    tape = api("get", "/api/instances/{instance_id}/tape?key=claim_status&context=main", instance_id=iid)
    assert tape["count"] == len(tape["events"]) > 0 and all(e["context"] == "main" for e in tape["events"])
    joins = api("get", "/api/instances/{instance_id}/tape?kind=join", instance_id=iid)["events"]
    before = joins[0]["seq"] - 1
    replay = api("get", "/api/instances/{instance_id}/replay?until={seq}", instance_id=iid, seq=str(before))
    shown = {k["key"]: k["value"] for k in replay["layers"]["L3"]["keys"]}
    assert shown["claim_status"] == "new" and "closed" not in shown and "memo" not in shown


@pytest.mark.parametrize("path, takes", [("/api/instances", {"GET", "POST"}), ("/api/tools", {"GET"})])
def test_a_405_names_every_method_the_path_takes(served: Served, path: str, takes: set[str]) -> None:
    # was the first route's only: PUT /api/instances was told it takes GET, not that POST starts one
    r = call(served.url, "put", path)
    assert r.status_code == 405
    assert takes <= set(r.headers["allow"].split(", ")), r.headers["allow"]
    assert all(m in r.json()["error"]["message"] for m in takes), r.text


@pytest.mark.parametrize("raw, said", [('{"data": {"x": ' + "[" * 5000 + "]" * 5000 + "}}", "nested"),
                                       ('{"data": {"x": ' + "9" * 5000 + "}}", "digits")], ids=["deep", "long"])
def test_a_body_json_cannot_be_read_into_is_a_422_saying_why(served: Served, openapi: dict[str, Any], raw: str,
                                                               said: str) -> None:
    # was 400 `http_error` "There was an error parsing the body" (FastAPI's words), on routes that list no 400
    for method, path, listed in _operations(openapi):
        if method != "post":
            continue
        r = call(served.url, method, path.replace("{", "").replace("}", ""), raw=raw)
        assert r.status_code == 422, f"{path}: {r.status_code} {r.text[:300]}"
        error = r.json()["error"]
        assert error["kind"] == "validation_error" and error["problems"][0]["field"] == "body", error
        assert said in error["message"] and "JSON object" in error["message"], error["message"]
