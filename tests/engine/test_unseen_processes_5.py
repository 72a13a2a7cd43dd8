"""Unseen processes, round 5: nine small processes of tests/engine/unseen5 driven through a real
``layerflow serve`` (port 0, bearer token) exactly as an outside client would, on every store
backend. Expected outcomes were worked out by hand from DESIGN.md and the README first; each test
also checks that memory://, sqlite:/// and redis:// give the same answers (ids and times aside).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CATALOG = Path(__file__).resolve().parent / "unseen5"
TOKEN = "unseen5-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REDIS = os.environ.get("LAYERFLOW_TEST_REDIS_UNSEEN5", "redis://127.0.0.1:6379/14")
GOV = "/api/context-governance"

# test name -> store -> the transcript (ids and times taken out): every store must agree
TRANSCRIPTS: dict[str, dict[str, Any]] = {}


# This module's own key prefix: the database is shared with other modules that may run at the
# same time on another pytest-xdist worker, so nothing here flushes it.
PREFIX = f"unseen5-{uuid.uuid4().hex[:10]}"


def _redis_ready() -> bool:
    try:
        import redis

        redis.Redis.from_url(REDIS, socket_connect_timeout=1).ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="module", autouse=True)
def _clean_prefix() -> Iterator[None]:
    yield
    if _redis_ready():
        import redis

        client = redis.Redis.from_url(REDIS, socket_connect_timeout=1)
        keys = list(client.scan_iter(match=f"{PREFIX}:*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i:i + 500])


def _store_url(kind: str, folder: Path) -> str:
    if kind == "redis" and not _redis_ready():
        pytest.skip(f"no Redis at {REDIS}")
    return {"memory": "memory://", "sqlite": f"sqlite:///{folder / 'u5.db'}", "redis": f"{REDIS}?prefix={PREFIX}"}[kind]


@contextmanager
def serving(store: str, folder: Path) -> Iterator[str]:
    """``layerflow serve --port 0`` on ``store``; its URL, read from the line it prints."""
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_API_TOKEN", "LAYERFLOW_MODEL", "LAYERFLOW_STORE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["LAYERFLOW_API_TOKEN"] = TOKEN
    log = folder / f"serve-{time.monotonic_ns()}.err"
    with log.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                 "--catalog", str(CATALOG), "--store", store, "--log-level", "warning"],
                                cwd=folder, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None:  # README: the `serving ... on http://HOST:PORT` line on stderr names the port
            assert proc.poll() is None, f"layerflow serve exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"layerflow serve named no address: {log.read_text()}"
            found = re.search(r"serving .* on (http://127\.0\.0\.1:\d+)", log.read_text())
            url = found.group(1) if found else None
            time.sleep(0.05)
        assert local_http.get(f"{url}/api/health", timeout=10).status_code == 200
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="module", params=["memory", "sqlite", "redis"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp(f"serve-{request.param}")
    with serving(_store_url(request.param, folder), folder) as url:
        yield url


def post(url: str, path: str, body: Any, *, headers: dict[str, str] | None = None) -> httpx.Response:
    return local_http.post(f"{url}{path}", json=body, headers=AUTH if headers is None else headers, timeout=60)


def get(url: str, path: str, *, headers: dict[str, str] | None = None) -> httpx.Response:
    return local_http.get(f"{url}{path}", headers=AUTH if headers is None else headers, timeout=60)


def ok(response: httpx.Response, status: int = 200) -> Any:
    assert response.status_code == status, response.text
    return response.json()


def refused(response: httpx.Response, status: int, *named: str) -> dict[str, Any]:
    """A 4xx whose error names every one of ``named``."""
    assert response.status_code == status, response.text
    error: dict[str, Any] = response.json()["error"]
    for word in named:
        assert word in error["message"], (word, error)
    return error


def start(url: str, process_id: str, data: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = ok(post(url, "/api/instances", {"process_id": process_id, "data": data}), 201)
    assert doc["process_id"] == process_id and doc["error"] is None
    listed = ok(get(url, "/api/instances"))
    assert doc["instance_id"] in [row["id"] for row in listed]
    assert ok(get(url, f"/api/instances/{doc['instance_id']}"))["layers"] == doc["layers"]
    return doc


def tape(url: str, iid: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = ok(get(url, f"/api/instances/{iid}/tape"))["events"]
    for context in {e["context"] for e in events}:  # each context (a branch's too) numbers its own tape
        seqs = [e["seq"] for e in events if e["context"] == context]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), context
    return events


def governance_actors(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(operation, actor) of every governance action the tape records."""
    return [((e.get("data") or {}).get("op", "?"), e["actor"]) for e in events
            if (e.get("data") or {}).get("note") in ("governance", "governance_denied")]


def records(layer: dict[str, Any]) -> dict[str, Any]:
    """The data keys of a layer, activity records aside."""
    return {k: v for k, v in layer.items() if not k.startswith("activity:")}


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?")  # a time in a message
_VOLATILE = {"instance_id", "id", "task", "created", "deadline", "due", "updated", "time", "answered_at",
             "last_modified"}


def _normal(value: Any, iid: str) -> Any:
    if isinstance(value, dict):
        return {k: _normal(v, iid) for k, v in sorted(value.items()) if k not in _VOLATILE}
    if isinstance(value, list):
        return [_normal(v, iid) for v in value]
    if isinstance(value, str):
        return _TIME.sub("TIME", _UUID.sub("UUID", value.replace(iid, "IID")))
    return value


def same_on_every_store(request: pytest.FixtureRequest, iid: str, transcript: Any) -> None:
    store = request.node.callspec.params["server"]
    name = request.node.originalname
    seen = TRANSCRIPTS.setdefault(name, {})
    seen[store] = _normal(transcript, iid)
    for other, theirs in seen.items():
        assert theirs == seen[store], f"{name}: {store} answered differently from {other}"


# ------------------------------------------------------------------ the processes


def test_purchase_request_waits_for_the_budget_owner_then_orders(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "purchase_request", {"quantity": 4, "unit_price": 25})
    iid = doc["instance_id"]
    assert doc["status"] == "waiting"
    assert [(w["kind"], w["task_id"]) for w in doc["waiting_for"]] == [("user_task", "budget_review")]
    assert doc["layers"]["L1"] == {"quantity": 4, "unit_price": 25}
    assert records(doc["layers"]["L3"]) == {"total": 100}
    wrong = refused(post(server, f"/api/instances/{iid}/user-tasks/place_order", {"data": {"approved": True}}), 409,
                    "place_order", "budget_review")
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/budget_review",
                   {"data": {"approved": True}, "user": "dana"}))
    assert done["status"] == "completed" and done["waiting_for"] == []
    # DESIGN: the branch the XOR took gets `_branch_id` and `_snapshot_id` in WORKING, so in HISTORY after it
    assert records(done["layers"]["L3"]) == {"total": 100, "approved": True, "_branch_id": "place_order",
                                             "_snapshot_id": "snap:main:11", "order_status": "placed",
                                             "order_ref": "PO-100"}
    assert [k for k in done["layers"]["L3"] if k.startswith("activity:")] == [
        "activity:compute_total", "activity:budget_review", "activity:place_order"]
    inputs = [e for e in tape(server, iid) if (e.get("data") or {}).get("note") == "user_input"]
    assert [(e["actor"], e["data"]["task_id"]) for e in inputs] == [("dana", "budget_review")]
    same_on_every_store(request, iid, [doc, wrong, done])


def test_supplier_onboarding_disagreeing_checks_wait_for_procurement(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "supplier_onboarding", {"supplier": "ACME"})
    iid = doc["instance_id"]
    assert doc["status"] == "waiting"
    assert doc["conflicts"] == [{"gateway_id": "checks_join", "layer": "L4", "key": "supplier_risk",
                                 "base_value": "unknown", "values": {"legal_check": "low", "finance_check": "high"},
                                 "resolution": None, "context": "main"}]
    assert [(w["kind"], w["id"]) for w in doc["waiting_for"]] == [("confirmation", "checks_join/supplier_risk")]
    pending = ok(get(server, f"/api/confirmations?instance_id={iid}"))
    assert [o["value"] for o in pending[0]["options"]] == ["low", "high", "$escalate"]
    # the answer must be one of the offered values; nothing is written when it is not
    bad = refused(post(server, f"{GOV}/resolve", {"instance_id": iid, "confirmation_id": "checks_join/supplier_risk",
                                                    "resolution": "medium", "reason": "split the difference"}),
                  400, "'medium'", "checks_join/supplier_risk")
    assert ok(get(server, f"/api/instances/{iid}"))["tape_length"] == doc["tape_length"]
    done = ok(post(server, f"{GOV}/resolve", {"instance_id": iid, "conflict_key": "supplier_risk", "resolution": "high",
                                               "reason": "finance found unpaid invoices", "user": "procurement-lead"}))
    assert [(w["kind"], w["task_id"]) for w in done["waiting_for"]] == [("user_task", "welcome_call")]
    merged = done["layers"]["L3"].pop("_mergedConflicts")  # DESIGN: every conflict lands there
    assert [(m["key"], m["resolution"]["value"], m["resolution"]["resolver"]) for m in merged] == [
        ("supplier_risk", "high", "human")]
    assert records(done["layers"]["L3"]) == {"supplier_risk": "high", "checks_done": [], "legal_ok": True,
                                             "credit_limit": 5000, "registered_risk": "high"}
    assert done["conflicts"][0]["resolution"]["value"] == "high"
    assert done["conflicts"][0]["resolution"]["resolver"] == "human"
    assert "finance found unpaid invoices" in done["conflicts"][0]["resolution"]["reason"]
    decisions = [e for e in tape(server, iid) if (e.get("data") or {}).get("note") == "human_decision"]
    assert [(e["actor"], e["data"]["value"]) for e in decisions] == [("procurement-lead", "high")]
    again = refused(post(server, f"{GOV}/resolve", {"instance_id": iid, "conflict_key": "supplier_risk",
                                                     "resolution": "low", "reason": "r"}), 409, "procurement-lead")
    # the engine's record of the conflict and its activity records are not data an inject may replace
    # (written to WORKING they were auto-promoted into HISTORY: the resolution vanished from the context)
    before = ok(get(server, f"/api/instances/{iid}"))
    forged = [refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {key: value}, "user": "mallory"}),
                      403, repr(key), "bookkeeping")
              for key, value in [("_mergedConflicts", []), ("_branch_id", "legal_check"),
                                 ("activity:register", {"kind": "activity", "status": "skipped"}),
                                 ("compaction:1", {"kind": "compaction", "summary": "nothing happened"})]]
    assert [(f["requested_layer"], f["effective_layer"]) for f in forged] == [("L4", "L3"), ("L4", "L4"),
                                                                              ("L4", "L3"), ("L4", "L4")]
    after = ok(get(server, f"/api/instances/{iid}"))
    assert after["layers"] == before["layers"]
    assert [(e["actor"], e["data"]["key"]) for e in tape(server, iid)
            if (e.get("data") or {}).get("note") == "governance_denied"] == [
        ("mallory", "_mergedConflicts"), ("mallory", "_branch_id"), ("mallory", "activity:register"),
        ("mallory", "compaction:1")]
    finished = ok(post(server, f"/api/instances/{iid}/user-tasks/welcome_call", {"data": {"called": True}}))
    assert finished["status"] == "completed"
    assert finished["layers"]["L3"]["_mergedConflicts"] == merged
    same_on_every_store(request, iid, [doc, bad, done, again, forged, finished])


def test_incident_triage_compress_evaluate_and_decompress(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "incident_triage", {"incident": "INC-9"})
    iid = doc["instance_id"]
    assert doc["status"] == "waiting"
    history = doc["layers"]["L3"]
    inspected = ok(post(server, f"{GOV}/inspect", {"instance_id": iid, "layers": ["L3"],
                                                    "metrics": ["token_count", "key_count", "attention_score"]}))
    assert inspected["layers"]["L3"]["key_count"] == len(history) == 12  # 10 data keys, 2 activity records
    assert inspected["layers"]["L3"]["token_count"] == doc["tokens"]["L3"]
    assert all(0.0 <= s <= 1.0 for s in inspected["layers"]["L3"]["attention_score"].values())
    squeezed = ok(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "compress", "target_layers": ["L3"],
                                                    "preserve_keys": ["severity"], "max_tokens": 80,
                                                    "user": "sre-bot"}))
    assert squeezed["changed"] is True and squeezed["snapshot_id"]
    assert squeezed["tokens_after"] < squeezed["tokens_before"] == doc["tokens"]["L3"]
    # the oldest activity folds; the latest (correlate) and the preserved key stay as they were
    assert "log_1" in squeezed["folded"] and "activity:collect_logs" in squeezed["folded"]
    now = ok(get(server, f"/api/instances/{iid}"))["layers"]["L3"]
    assert now["severity"] == "sev2" and "log_1" not in now
    assert {k: now[k] for k in ("root_cause", "affected")} == {"root_cause": "upstream timeout in eu-west",
                                                               "affected": ["payments-api", "checkout"]}
    judged = ok(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "evaluate",
                                                  "before_snapshot_id": squeezed["snapshot_id"]}))
    assert (judged["tokens_before"], judged["tokens_after"]) == (squeezed["tokens_before"], squeezed["tokens_after"])
    unknown = refused(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "decompress",
                                                        "snapshot_id": "snap:main:4242"}), 404, "snap:main:4242")
    back = ok(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "decompress",
                                                "snapshot_id": squeezed["snapshot_id"], "user": "sre-bot"}))
    assert ok(get(server, f"/api/instances/{iid}"))["layers"]["L3"] == history
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/engineer_ack", {"data": {"ack": True}}))
    assert done["status"] == "completed" and done["layers"]["L3"]["closed_with"] == "sev2"
    events = tape(server, iid)
    assert [((e.get("data") or {}).get("note") or e["kind"]) for e in events if e["actor"] == "sre-bot"] == [
        "preserve", "snapshot", "compress", "decompress"]
    same_on_every_store(request, iid, [doc, inspected["layers"], squeezed, judged, unknown, back, done])


def test_a_compression_target_out_of_reach_says_why(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "refund_request", {"price": 49.5, "order": "O-1"})
    iid = doc["instance_id"]
    result = ok(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "compress", "max_tokens": 5}))
    # assess is the only finished activity, and the latest is kept whole: nothing to fold
    assert (result["changed"], result["target_met"], result["snapshot_id"]) == (False, False, None)
    assert len(result["notes"]) == 1 and "target of 5 tokens not met" in result["notes"][0]
    assert "(assess) is kept whole" in result["notes"][0] and "compress_rules" in result["notes"][0]
    same_on_every_store(request, iid, result)


def test_contract_renewal_injects_into_each_layer(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "contract_renewal", {"customer": "C-7"})
    iid = doc["instance_id"]
    answers = []
    for layer, values, status in [
        ("L0", {"policy": "anything goes"}, 403),           # SYSTEM: never
        ("L1", {"renewal_term": "24 months"}, 200),         # PROCESS: once
        ("L1", {"renewal_term": "36 months"}, 403),         # ... and never again
        ("L2", {"clause_db": {"indexation": "CPI"}}, 200),  # KNOWLEDGE: read/write
        ("L3", {"note": "x"}, 403),                         # HISTORY: only from WORKING at activity end
        ("L4", {"reviewer_hint": "check indexation"}, 200),
        ("L5", {"scratch": 1}, 200),
        ("L4", {"customer": "C-8"}, 403),                   # auto-promoted to PROCESS, which holds it
    ]:
        r = post(server, f"{GOV}/inject", {"instance_id": iid, "layer": layer, "values": values, "user": "legal-ops"})
        assert r.status_code == status, (layer, values, r.text)
        if status == 403:
            assert r.json()["error"]["key"] == next(iter(values))
        answers.append(r.json())
    assert answers[0]["error"]["effective_layer"] == "L0"
    assert (answers[-1]["error"]["requested_layer"], answers[-1]["error"]["effective_layer"]) == ("L4", "L1")
    seen = ok(get(server, f"/api/instances/{iid}"))["layers"]
    assert seen["L1"] == {"customer": "C-7", "renewal_term": "24 months"}
    assert (seen["L2"], seen["L4"], seen["L5"]) == ({"clause_db": {"indexation": "CPI"}},
                                                    {"reviewer_hint": "check indexation"}, {"scratch": 1})
    notes = [(e["data"]["note"], e["actor"]) for e in tape(server, iid)
             if (e.get("data") or {}).get("note") in ("governance", "governance_denied")]
    assert notes == [("governance_denied", "legal-ops"), ("governance", "legal-ops"), ("governance_denied", "legal-ops"),
                     ("governance", "legal-ops"), ("governance_denied", "legal-ops"), ("governance", "legal-ops"),
                     ("governance", "legal-ops"), ("governance_denied", "legal-ops")]
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/legal_signoff", {"data": {"signed": True}}))
    assert done["status"] == "completed"
    assert done["layers"]["L3"]["summary"] == "24 months / check indexation"
    assert (done["layers"]["L4"], done["layers"]["L5"]) == ({}, {})  # WORKING moved on, EPHEMERAL cleared
    late = refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"x": 1}}), 409, "completed")
    same_on_every_store(request, iid, [answers, seen, done, late])


def test_refund_request_rolls_back_to_a_snapshot(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "refund_request", {"price": 49.5, "order": "O-1"})
    iid = doc["instance_id"]
    snap = ok(post(server, f"{GOV}/snapshot", {"instance_id": iid, "label": "before override", "user": "supervisor"}))
    ok(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"override_note": "VIP"}}))
    ok(post(server, f"{GOV}/inject", {"instance_id": iid, "layer": "PROCESS", "values": {"vip_source": "crm"}}))
    back = ok(post(server, f"{GOV}/rollback", {"instance_id": iid, "snapshot_id": snap["snapshot_id"],
                                                "user": "supervisor", "reason": "the note was for another order"}))
    assert back["restored_layers"] == ["L2", "L3", "L4", "L5"]  # SYSTEM and PROCESS never roll back
    now = ok(get(server, f"/api/instances/{iid}"))["layers"]
    assert now["L4"] == {} and now["L3"] == doc["layers"]["L3"]
    assert now["L1"] == {"price": 49.5, "order": "O-1", "vip_source": "crm"}
    missing = refused(post(server, f"{GOV}/rollback", {"instance_id": iid, "snapshot_id": "snap:main:999"}),
                      404, "snap:main:999")
    events = tape(server, iid)
    assert [(e["kind"], e["actor"]) for e in events if e["kind"] in ("snapshot", "restore")] == [
        ("snapshot", "supervisor"), ("restore", "supervisor")]
    assert governance_actors(events) == [("inject", "api"), ("inject", "api"), ("rollback", "supervisor")]
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/agent_review", {"data": {"agent_ok": True}}))
    assert done["status"] == "completed" and done["layers"]["L3"]["paid"] == 49.5
    same_on_every_store(request, iid, [snap, back, now, missing, done])


@pytest.mark.parametrize("config", [{"script": "escalated = True"}, {"handler": "os:system"},
                                    {"preScript": "escalated = True"}])
def test_shipment_delay_refuses_a_runtime_config_with_code(server: str, config: dict[str, Any]) -> None:
    doc = start(server, "shipment_delay", {"eta_hours": 60, "promised_hours": 24})
    r = post(server, f"{GOV}/config", {"instance_id": doc["instance_id"], "activity_id": "escalate", "config": config})
    assert r.status_code in (400, 403, 422), r.text
    assert next(iter(config)) in r.text
    assert ok(get(server, f"/api/instances/{doc['instance_id']}"))["tape_length"] == doc["tape_length"]


def test_shipment_delay_takes_a_runtime_config_change(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "shipment_delay", {"eta_hours": 60, "promised_hours": 24})
    iid = doc["instance_id"]
    assert records(doc["layers"]["L3"]) == {"delay_hours": 36}
    unknown = refused(post(server, f"{GOV}/config", {"instance_id": iid, "activity_id": "no_such_step",
                                                      "config": {"compressTokenThreshold": 5}}), 404, "no_such_step")
    bad = post(server, f"{GOV}/config", {"instance_id": iid, "activity_id": "escalate",
                                          "config": {"compressTokenThreshold": "soon"}})
    assert bad.status_code == 422 and "compressTokenThreshold" in bad.text
    changed = ok(post(server, f"{GOV}/config", {"instance_id": iid, "activity_id": "escalate", "user": "ops-lead",
                                                 "config": {"compressTokenThreshold": 10}, "reason": "tight budget"}))
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/notify_customer", {"data": {"notified": True}}))
    assert done["status"] == "completed" and done["layers"]["L3"]["escalated"] is True
    assert done["layers"]["L3"]["delay_hours"] == 36  # preserved by the file's config, which still holds
    assert [c["activity_id"] for c in done["compressions"]] == ["escalate"]  # the new threshold took effect
    changes = [e for e in tape(server, iid) if (e.get("data") or {}).get("note") == "config_change"]
    assert [(e["actor"], e["data"]["activity_id"], e["data"]["change"]) for e in changes] == [
        ("ops-lead", "escalate", {"compressTokenThreshold": 10})]
    same_on_every_store(request, iid, [unknown, bad.json(), changed, done])


def test_access_review_asks_a_person_through_the_model_tools(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "access_review", {"employee": "E-42"})
    iid = doc["instance_id"]
    schemas = ok(get(server, f"{GOV}/tools"))
    assert [s["function"]["name"] for s in schemas] == ["context_inspect", "context_compress", "context_branch",
                                                         "human_confirm"]
    asked = ok(post(server, f"{GOV}/tools/human_confirm", {
        "instance_id": iid, "user": "review-bot",
        "arguments": {"message": "Grant admin to a contractor?",
                      "options": [{"label": "Grant", "value": "grant"}, {"label": "Deny", "value": "deny"}]}}))
    cid = asked["confirmation_id"]
    assert asked["status"] == "pending"
    empty = refused(post(server, f"{GOV}/tools/human_confirm", {"instance_id": iid, "arguments": {
        "message": "x", "options": []}}), 422, "options")
    nameless = refused(post(server, f"{GOV}/tools/no_tool", {"instance_id": iid, "arguments": {}}), 404, "no_tool")
    branch = ok(post(server, f"{GOV}/tools/context_branch", {"instance_id": iid, "arguments": {
        "action": "evaluate", "required_keys": ["requested_role", "employee", "manager"]}}))
    assert (branch["ok"], branch["present"], branch["missing"]) == (False, {"requested_role": "L3", "employee": "L1"},
                                                                    ["manager"])
    looked = ok(post(server, f"{GOV}/tools/context_inspect", {"instance_id": iid, "arguments": {
        "layers": ["L1"], "metrics": ["key_count"]}}))
    assert looked["layers"] == {"L1": {"key_count": 1, "keys": ["employee"]}}
    wrong = refused(post(server, f"/api/confirmations/{cid}", {"instance_id": iid, "value": "maybe"}), 400, "'maybe'")
    answered = ok(post(server, f"/api/confirmations/{cid}", {"instance_id": iid, "value": "deny", "user": "ciso",
                                                             "reason": "contractors never get admin"}))
    assert [(c["answer"], c["answered_by"]) for c in answered["confirmations"]] == [("deny", "ciso")]
    twice = refused(post(server, f"/api/confirmations/{cid}", {"instance_id": iid, "value": "grant"}), 409, "ciso")
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/quarterly_review",
                   {"data": {"reviewer_decision": "deny"}, "user": "ciso"}))
    assert done["status"] == "completed" and done["layers"]["L3"]["granted"] is False
    notes = [((e.get("data") or {}).get("note"), e["actor"]) for e in tape(server, iid)
             if (e.get("data") or {}).get("note") in ("confirmation_requested", "human_decision")]
    assert notes == [("confirmation_requested", "review-bot"), ("human_decision", "ciso")]
    same_on_every_store(request, iid, [asked, empty, nameless, branch, looked, wrong, answered, twice, done])


def test_travel_booking_refuses_a_stale_version(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "travel_booking", {"nights": 3, "rate": 120})
    iid = doc["instance_id"]
    version = doc["version"]
    assert records(doc["layers"]["L3"]) == {"cost": 360}
    stale = refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"seat": "aisle"},
                                                    "expected_version": version - 1}), 409, str(version), iid)
    assert ok(get(server, f"/api/instances/{iid}"))["version"] == version  # nothing written
    written = ok(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"seat": "aisle"},
                                                 "expected_version": version, "user": "travel-desk"}))
    assert written["version"] > version
    lost = refused(post(server, f"/api/instances/{iid}/user-tasks/traveler_confirm",
                        {"data": {"confirmed": True}, "expected_version": version}), 409, str(version))
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/traveler_confirm",
                   {"data": {"confirmed": True}, "expected_version": written["version"]}))
    assert done["status"] == "completed" and done["layers"]["L3"]["booking"] == "BK-360"
    assert done["layers"]["L3"]["seat"] == "aisle"
    same_on_every_store(request, iid, [stale, written, lost, done])


def test_hiring_panel_changes_branches_and_the_join_at_runtime(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "hiring_panel", {"candidate": "K-1"})
    iid = doc["instance_id"]
    assert sorted(w["task_id"] for w in doc["waiting_for"]) == ["culture_interview", "tech_interview"]
    # the main context has open branches: changes go to a branch (named by its first element's id)
    main = refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"hint": "x"}}), 409,
                   "culture_interview", "tech_interview")
    squeeze = refused(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "compress"}), 409, "branch")
    branch = ok(post(server, f"{GOV}/inject", {"instance_id": iid, "context": "tech_interview",
                                                "values": {"focus": "system design"}, "user": "hr"}))
    nobranch = refused(post(server, f"{GOV}/inject", {"instance_id": iid, "context": "ceo_interview",
                                                       "values": {"focus": "x"}}), 404, "ceo_interview")
    unknown = refused(post(server, f"{GOV}/config", {"instance_id": iid, "activity_id": "panel_join", "config": {
        "mergeStrategy": "BRANCH_PRIORITY", "branchPriority": ["ceo_interview"]}}), 422, "ceo_interview",
        "branchPriority")
    ok(post(server, f"{GOV}/config", {"instance_id": iid, "activity_id": "panel_join", "user": "hr", "config": {
        "mergeStrategy": "BRANCH_PRIORITY", "branchPriority": ["tech_interview", "culture_interview"]}}))
    assert ok(post(server, f"/api/instances/{iid}/user-tasks/tech_interview",
                   {"data": {"recommendation": "hire"}}))["status"] == "waiting"
    done = ok(post(server, f"/api/instances/{iid}/user-tasks/culture_interview", {"data": {"recommendation": "no_hire"}}))
    assert done["status"] == "completed"
    assert [(c["key"], c["values"], c["resolution"]["value"], c["resolution"]["resolver"]) for c in done["conflicts"]] == [
        ("recommendation", {"tech_interview": "hire", "culture_interview": "no_hire"}, "hire", "strategy")]
    history = records(done["layers"]["L3"])
    history.pop("_mergedConflicts")
    assert history == {"recommendation": "hire", "salary_band": "B2", "focus": "system design", "offer_made": True}
    # FAIL_ON_CONFLICT set at runtime: the join stops the instance naming the conflict
    other = start(server, "hiring_panel", {"candidate": "K-2"})["instance_id"]
    ok(post(server, f"{GOV}/config", {"instance_id": other, "activity_id": "panel_join",
                                       "config": {"mergeStrategy": "FAIL_ON_CONFLICT"}}))
    ok(post(server, f"/api/instances/{other}/user-tasks/tech_interview", {"data": {"recommendation": "hire"}}))
    failed = ok(post(server, f"/api/instances/{other}/user-tasks/culture_interview",
                     {"data": {"recommendation": "no_hire"}}))
    assert failed["status"] == "error" and failed["error"]["kind"] == "merge_conflict"
    assert failed["error"]["task_id"] == "panel_join" and "'recommendation'" in failed["error"]["message"]
    same_on_every_store(request, iid, [main, squeeze, branch, nobranch, unknown, done,
                                       _normal(failed, other)])


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}],
                         ids=["missing", "wrong", "not-bearer"])
def test_every_api_read_and_change_needs_the_token(server: str, headers: dict[str, str]) -> None:
    doc = start(server, "travel_booking", {"nights": 1, "rate": 80})
    iid = doc["instance_id"]
    for path in ["/api/instances", f"/api/instances/{iid}", f"/api/instances/{iid}/tape", "/api/processes",
                 "/api/confirmations", f"{GOV}/tools"]:
        assert get(server, path, headers=headers).status_code == 401, path
    for path in [f"{GOV}/inspect", f"{GOV}/inject", f"{GOV}/compress", f"{GOV}/resolve", f"{GOV}/rollback",
                 f"{GOV}/config", "/api/instances", f"{GOV}/tools/context_inspect"]:
        assert post(server, path, {"instance_id": iid}, headers=headers).status_code == 401, path
    # open: the health check, the docs and the console
    for path in ["/api/health", "/openapi.json", "/"]:
        assert get(server, path, headers=headers).status_code == 200, path
    assert ok(get(server, f"/api/instances/{iid}"))["tape_length"] == doc["tape_length"]


def test_unknown_and_malformed_requests_name_the_field(server: str, request: pytest.FixtureRequest) -> None:
    doc = start(server, "travel_booking", {"nights": 2, "rate": 99})
    iid = doc["instance_id"]
    answers = [
        refused(get(server, "/api/instances/no-such-instance"), 404, "no-such-instance"),
        refused(post(server, f"{GOV}/inspect", {"instance_id": "no-such-instance"}), 404, "no-such-instance"),
        refused(post(server, "/api/instances", {"process_id": "payroll_run"}), 404, "payroll_run"),
        refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": "seat=aisle"}), 422, "values"),
        refused(post(server, f"{GOV}/inject", {"instance_id": iid, "layer": "L9", "values": {"a": 1}}), 422, "L9"),
        refused(post(server, f"{GOV}/rollback", {"instance_id": iid}), 422, "snapshot_id"),
        refused(post(server, f"{GOV}/compress", {"instance_id": iid, "action": "squash"}), 422, "action"),
        refused(post(server, f"{GOV}/inspect", {"layers": ["L1"]}), 422, "instance_id"),
        refused(post(server, f"{GOV}/inject", {"instance_id": iid, "values": {"a": 1}, "expected_version": 0}),
                422, "expected_version"),
        refused(post(server, f"/api/instances/{iid}/user-tasks/traveler_confirm", {"data": [1, 2]}), 422, "data"),
    ]
    raw = local_http.post(f"{server}{GOV}/inject", content=b"{not json", timeout=30,
                     headers={**AUTH, "content-type": "application/json"})
    assert raw.status_code in (400, 422), raw.text
    assert ok(get(server, f"/api/instances/{iid}"))["tape_length"] == doc["tape_length"]  # nothing was written
    same_on_every_store(request, iid, answers)


@pytest.mark.parametrize("kind", ["sqlite", "redis"])
def test_a_waiting_instance_outlives_its_server(kind: str, tmp_path: Path) -> None:
    # a store that outlives the process: another server on it answers the user task and sees the tape
    store = _store_url(kind, tmp_path)
    with serving(store, tmp_path) as first:
        doc = start(first, "purchase_request", {"quantity": 2, "unit_price": 40})
        iid = doc["instance_id"]
        ok(post(first, f"{GOV}/inject", {"instance_id": iid, "values": {"cost_center": "CC-7"}, "user": "finance"}))
        before = ok(get(first, f"/api/instances/{iid}"))
    with serving(store, tmp_path) as second:
        again = ok(get(second, f"/api/instances/{iid}"))
        assert (again["status"], again["layers"], again["version"]) == ("waiting", before["layers"], before["version"])
        stale = refused(post(second, f"/api/instances/{iid}/user-tasks/budget_review",
                             {"data": {"approved": False}, "expected_version": doc["version"]}), 409)
        assert "version" in stale["message"]
        done = ok(post(second, f"/api/instances/{iid}/user-tasks/budget_review",
                       {"data": {"approved": False}, "expected_version": before["version"]}))
        assert done["status"] == "completed" and done["layers"]["L3"]["order_status"] == "declined"
        assert done["layers"]["L3"]["cost_center"] == "CC-7"
        assert [e["actor"] for e in tape(second, iid) if (e.get("data") or {}).get("op") == "inject"] == ["finance"]
