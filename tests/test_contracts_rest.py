"""Black-box checks of the REST contract (DESIGN.md "Interfaces", README "REST API")
against a real ``layerflow serve`` process: bearer auth on everything that changes state
or returns instance data, only catalog processes start, runtime config changes cannot
carry scripts, and the governance operations behave as documented."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import local_http
import pytest

from test_contracts_cli import PAR, SEQ, check_run_document

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "contract-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serving(folder: Path, catalog: Path, token: str = TOKEN, *, store: str | None = None,
            log: Path | None = None, extra: tuple[str, ...] = ()) -> Iterator[str]:
    """A ``layerflow serve`` process on a free port, serving ``catalog`` from a sqlite store in
    ``folder`` (or ``store``) with ``token``: yields its URL once it answers, stops it afterwards.
    ``log``: a file its stderr goes to (line by line: readable while it runs); ``extra``: more options."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LAYERFLOW_API_TOKEN", "LAYERFLOW_MODEL_API_BASE")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["LAYERFLOW_API_TOKEN"] = token
    errors = log.open("w") if log is not None else subprocess.PIPE
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--catalog", str(catalog), "--store", store or f"sqlite:///{folder / 'rest.db'}",
                             "--log-level", "warning", *extra], cwd=folder, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=errors, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):  # readiness by polling, not by timing: the server answers or exits
            if proc.poll() is not None:
                said = proc.stderr.read() if proc.stderr else log.read_text() if log is not None else ""
                raise AssertionError(f"layerflow serve exited: {said}")
            try:
                if local_http.get(f"{url}/api/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise AssertionError("layerflow serve never answered /api/health")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        if log is not None:
            errors.close()  # type: ignore[union-attr]


LOAN_FILES = ("loan_approval.bpmn", "loan_approval.layerflow.yaml", "loan_handlers.py")


def example_catalog(folder: Path, *names: str) -> Path:
    """``folder/catalog`` holding the loan example (process, config, handlers, knowledge documents)
    and the other ``bpmn_examples`` files ``names``."""
    catalog = folder / "catalog"
    catalog.mkdir()
    for name in (*LOAN_FILES, *names):
        shutil.copy(ROOT / "bpmn_examples" / name, catalog / name)
    shutil.copytree(ROOT / "bpmn_examples" / "knowledge", catalog / "knowledge")
    return catalog


def openapi_document(url: str) -> dict[str, Any]:
    """The server's ``/openapi.json``."""
    r = local_http.get(f"{url}/openapi.json", timeout=30)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("rest")
    catalog = folder / "catalog"
    catalog.mkdir()
    (catalog / "par.bpmn").write_text(PAR)
    (catalog / "seq.bpmn").write_text(SEQ)
    (folder / "outside.bpmn").write_text(SEQ.replace("seq_proc", "outside_proc"))
    yield from serving(folder, catalog)


def _post(url: str, path: str, body: dict[str, Any], *, auth: bool = True) -> httpx.Response:
    return local_http.post(f"{url}{path}", json=body, headers=AUTH if auth else {}, timeout=120)


def _post_raw(url: str, path: str, raw: str) -> httpx.Response:
    """A body as written: JSON escapes and NaN that ``json=`` would not send as they are."""
    return local_http.post(f"{url}{path}", content=raw.encode(), headers={**AUTH, "content-type": "application/json"},
                      timeout=120)


def _get(url: str, path: str, *, auth: bool = True) -> httpx.Response:
    return local_http.get(f"{url}{path}", headers=AUTH if auth else {}, timeout=120)


def _start(url: str, process_id: str, **extra: Any) -> dict[str, Any]:
    r = _post(url, "/api/instances", {"process_id": process_id, **extra})
    assert r.status_code in (200, 201), r.text
    doc: dict[str, Any] = r.json()
    check_run_document(doc)
    return doc


GOVERNANCE = ["inspect", "compress", "inject", "resolve", "rollback", "config"]


@pytest.mark.parametrize("op", GOVERNANCE)
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}])
def test_governance_needs_the_bearer_token(server: str, op: str, headers: dict[str, str]) -> None:
    r = local_http.post(f"{server}/api/context-governance/{op}", json={"instance_id": "x"}, headers=headers, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"


def test_instance_data_needs_the_bearer_token(server: str) -> None:
    doc = _start(server, "par_proc")
    iid = doc["instance_id"]
    for path in ["/api/instances", f"/api/instances/{iid}", f"/api/instances/{iid}/tape", "/api/confirmations",
                 f"/api/instances/{iid}/diagram.svg", f"/api/instances/{iid}/replay?context=main&until=3",
                 "/api/instance-summaries", "/api/processes"]:
        r = _get(server, path, auth=False)
        assert r.status_code == 401, path
        assert iid not in r.text
        assert _get(server, path).status_code == 200, path
    for path, body in [("/api/instances", {"process_id": "par_proc"}),
                       (f"/api/instances/{iid}/events", {"name": "x"}),
                       ("/api/confirmations/merge/level", {"value": 5})]:
        assert _post(server, path, body, auth=False).status_code == 401, path
    assert local_http.get(f"{server}/api/health", timeout=30).status_code == 200  # open: no instance data


def test_only_catalog_processes_start(server: str) -> None:
    r = _post(server, "/api/instances", {"process_id": "outside_proc"})
    assert r.status_code == 404 and "outside_proc" in r.json()["error"]["message"]
    r = _post(server, "/api/instances", {"process_id": "../outside"})
    assert r.status_code == 404
    r = _post(server, "/api/instances", {"process_id": "seq_proc", "bpmn": SEQ})
    assert r.status_code == 422 and "bpmn" in r.text  # never BPMN from a request
    listed = {p["id"] for p in _get(server, "/api/processes").json()}
    assert listed == {"par_proc", "seq_proc"}


def test_instance_endpoints_give_the_run_document(server: str) -> None:
    doc = _start(server, "seq_proc", data={"amount": 7})
    assert doc["status"] == "waiting" and doc["layers"]["L1"] == {"amount": 7}
    again = _get(server, f"/api/instances/{doc['instance_id']}").json()
    check_run_document(again)
    assert again["layers"] == doc["layers"] and again["status"] == "waiting"
    tape = _get(server, f"/api/instances/{doc['instance_id']}/tape").json()
    assert tape["events"] and all({"seq", "kind", "time", "actor"} <= set(e) for e in tape["events"])
    # DESIGN "Tape": activity and branch too, null when the event has none
    assert all({"activity", "branch"} <= set(e) for e in tape["events"])
    assert _get(server, "/api/instances/no-such-instance").status_code == 404


def test_inspect_reports_every_layer(server: str) -> None:
    doc = _start(server, "par_proc")
    r = _post(server, "/api/context-governance/inspect",
              {"instance_id": doc["instance_id"], "layers": ["L3", "L4"],
               "metrics": ["token_count", "key_count", "attention_score"]})
    assert r.status_code == 200, r.text
    body = r.json()["layers"]
    assert set(body) == {"L3", "L4"}
    assert body["L3"]["key_count"] == len(doc["layers"]["L3"]) and body["L3"]["token_count"] == doc["tokens"]["L3"]
    for score in body["L3"]["attention_score"].values():
        assert 0.0 <= score <= 1.0
    bad = _post(server, "/api/context-governance/inspect", {"instance_id": doc["instance_id"], "layers": ["L9"]})
    assert bad.status_code == 422 and "L9" in bad.text


def test_resolve_settles_the_conflict_with_the_given_reason(server: str) -> None:
    doc = _start(server, "par_proc")
    iid = doc["instance_id"]
    wrong = _post(server, "/api/context-governance/resolve",
                  {"instance_id": iid, "confirmation_id": "merge/level", "resolution": 42, "reason": "why not"})
    assert wrong.status_code == 400 and wrong.json()["error"]["kind"] == "invalid_answer"
    unchanged = _get(server, f"/api/instances/{iid}").json()
    assert unchanged["status"] == "waiting" and unchanged["tape_length"] == doc["tape_length"]
    stale = _post(server, "/api/context-governance/resolve",
                  {"instance_id": iid, "confirmation_id": "merge/level", "resolution": 5, "reason": "r",
                   "expected_version": 1})
    assert stale.status_code == 409
    r = _post(server, "/api/context-governance/resolve",
              {"instance_id": iid, "conflict_key": "level", "resolution": 5, "reason": "the raise was approved"})
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "completed" and done["layers"]["L3"]["final"] == 5
    resolution = done["conflicts"][0]["resolution"]
    assert resolution["resolver"] == "human" and "the raise was approved" in resolution["reason"]


def test_inject_obeys_the_layer_rules(server: str) -> None:
    doc = _start(server, "seq_proc", data={"amount": 7})
    iid = doc["instance_id"]
    denied = _post(server, "/api/context-governance/inject", {"instance_id": iid, "values": {"amount": 8}})
    assert denied.status_code == 403 and "amount" in denied.json()["error"]["message"]
    after = _get(server, f"/api/instances/{iid}").json()
    assert after["layers"]["L1"] == {"amount": 7}
    assert after["tape_length"] > doc["tape_length"]  # the denied write is on the tape
    ok = _post(server, "/api/context-governance/inject", {"instance_id": iid, "values": {"hint": "check twice"}})
    assert ok.status_code == 200, ok.text
    assert _get(server, f"/api/instances/{iid}").json()["layers"]["L4"]["hint"] == "check twice"


@pytest.mark.parametrize("config", [
    {"handler": "os:system"},
    {"script": "import os"},
    {"compressTokenThreshold": 10, "handler": "loan_handlers.py:risk_assessment"},
    {"llm": {"instructions": "x", "handler": "os:system"}},
    {"conflictPolicy": {"rules": [{"key": "level", "when": "__import__('os').getpid() > 0", "value": 0,
                                   "reason": "x"}]}},
])
def test_runtime_config_cannot_carry_scripts(server: str, config: dict[str, Any]) -> None:
    doc = _start(server, "par_proc")
    target = "merge" if "conflictPolicy" in config else "after"
    r = _post(server, "/api/context-governance/config",
              {"instance_id": doc["instance_id"], "activity_id": target, "config": config})
    assert r.status_code in (400, 403, 422), r.text
    assert r.json()["error"]["kind"] in ("invalid_config", "bad_request", "permission_denied", "validation_error")
    assert _get(server, f"/api/instances/{doc['instance_id']}").json()["tape_length"] == doc["tape_length"]


@pytest.mark.parametrize("name", ["../../secret", "..", "a/b", "/etc", "a\\b", "."])
def test_runtime_config_cannot_read_files_outside_the_knowledge_folder(server: str, name: str) -> None:
    # a knowledge collection is a folder of knowledge/ beside the process; a path would let a
    # runtime config change read any .md/.txt file of the server into the instance's KNOWLEDGE
    doc = _start(server, "par_proc")
    r = _post(server, "/api/context-governance/config",
              {"instance_id": doc["instance_id"], "activity_id": "after",
               "config": {"knowledgeConfig": {"ragCollections": [name]}}})
    assert r.status_code == 422, r.text
    assert "ragCollections" in r.text
    assert _get(server, f"/api/instances/{doc['instance_id']}").json()["tape_length"] == doc["tape_length"]


def test_runtime_config_change_is_validated_and_applied(server: str) -> None:
    doc = _start(server, "par_proc")
    iid = doc["instance_id"]
    bad = _post(server, "/api/context-governance/config",
                {"instance_id": iid, "activity_id": "after", "config": {"compressTokenThreshold": "lots"}})
    assert bad.status_code in (400, 422) and "compressTokenThreshold" in bad.text
    unknown = _post(server, "/api/context-governance/config",
                    {"instance_id": iid, "activity_id": "nosuch", "config": {"compressTokenThreshold": 5}})
    assert unknown.status_code in (400, 404, 422) and "nosuch" in unknown.text
    ok = _post(server, "/api/context-governance/config",
               {"instance_id": iid, "activity_id": "after", "config": {"compressTokenThreshold": 10}})
    assert ok.status_code == 200, ok.text
    assert _get(server, f"/api/instances/{iid}").json()["tape_length"] > doc["tape_length"]  # a config change is an event
    done = _post(server, "/api/context-governance/resolve",
                 {"instance_id": iid, "confirmation_id": "merge/level", "resolution": 0, "reason": "cautious"}).json()
    assert done["status"] == "completed"
    assert [c["activity_id"] for c in done["compressions"]] == ["after"]  # the new threshold took effect


def test_compress_snapshot_rollback(server: str) -> None:
    doc = _start(server, "seq_proc", data={"amount": 7}, answers={"user_tasks": {"approve": {"ok": True}}})
    iid = doc["instance_id"]
    assert doc["status"] == "completed"
    snap = _post(server, "/api/context-governance/snapshot", {"instance_id": iid}).json()["snapshot_id"]
    r = _post(server, "/api/context-governance/compress",
              {"instance_id": iid, "action": "compress", "target_layers": ["L3"], "preserve_keys": ["outcome"],
               "max_tokens": 20})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["tokens_after"] <= body["tokens_before"] and body["snapshot_id"]
    now = _get(server, f"/api/instances/{iid}").json()
    assert now["layers"]["L3"]["outcome"] == "accepted"  # preserved
    back = _post(server, "/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": snap})
    assert back.status_code == 200, back.text
    restored = _get(server, f"/api/instances/{iid}").json()
    assert restored["layers"]["L3"] == doc["layers"]["L3"]
    assert restored["tape_length"] > now["tape_length"]  # a rollback adds an event, deletes nothing
    missing = _post(server, "/api/context-governance/rollback", {"instance_id": iid, "snapshot_id": "nope"})
    assert missing.status_code == 404 and "nope" in missing.text
    # PROCESS named beside HISTORY: refused, not skipped without a word; nothing is written
    fixed = _post(server, "/api/context-governance/rollback",
                  {"instance_id": iid, "snapshot_id": snap, "layers": ["L1", "L3"]})
    assert fixed.status_code in (400, 422) and "never roll back" in fixed.text, fixed.text
    assert _get(server, f"/api/instances/{iid}").json()["tape_length"] == restored["tape_length"]


def test_a_label_or_reason_that_is_no_text_is_bad_input_not_a_server_failure(server: str) -> None:
    # a lone surrogate (valid as a JSON escape, no Unicode text) cannot go on a tape: 400, nothing written
    doc = _start(server, "seq_proc", data={"amount": 7})
    iid = doc["instance_id"]
    raw = '{"instance_id": "%s", "label": "\\ud800"}' % iid
    r = _post_raw(server, "/api/context-governance/snapshot", raw)
    assert r.status_code in (400, 422), r.text
    assert _get(server, f"/api/instances/{iid}").json()["tape_length"] == doc["tape_length"]
    raw = '{"instance_id": "%s", "required_keys": ["\\udfff"]}' % iid  # echoed back, it could not be sent
    r = _post_raw(server, "/api/context-governance/branch-evaluate", raw)
    assert r.status_code in (400, 422), r.text


def test_a_runtime_config_value_that_is_no_json_is_bad_input(server: str) -> None:
    # NaN parses (Python's JSON reader takes it) but is no JSON value: it was stored as null
    doc = _start(server, "seq_proc", data={"amount": 7})
    iid = doc["instance_id"]
    raw = '{"instance_id": "%s", "activity_id": "approve", "config": {"humanConfirm": {"default": NaN}}}' % iid
    r = _post_raw(server, "/api/context-governance/config", raw)
    assert r.status_code in (400, 422), r.text
    assert "humanConfirm.default is nan" in r.text
    assert _get(server, f"/api/instances/{iid}").json()["tape_length"] == doc["tape_length"]


def test_an_invalid_answer_at_start_names_the_waiting_instance(server: str) -> None:
    r = _post(server, "/api/instances", {"process_id": "par_proc", "answers": {"confirmations": {"merge/level": 42}}})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["kind"] == "invalid_answer" and "42" in error["message"]
    waiting = _get(server, f"/api/instances/{error['instance_id']}").json()
    assert waiting["status"] == "waiting" and waiting["error"] is None


def test_the_seed_tool_arguments_work_over_rest(server: str) -> None:
    """The seed's context_inspect / context_compress examples, sent as the REST bodies."""
    doc = _start(server, "seq_proc", data={"amount": 7}, answers={"user_tasks": {"approve": {"ok": True}}})
    iid = doc["instance_id"]
    r = _post(server, "/api/context-governance/inspect", {
        "instance_id": iid, "layers": ["L3", "L4"],
        "metrics": ["token_count", "key_count", "attention_score", "last_modified", "size_bytes"],
        "filter": {"key_prefix": "risk_*", "modified_after": "2026-07-08T10:00:00Z"}})
    assert r.status_code == 200, r.text
    assert {"token_count", "key_count", "attention_score"} <= set(r.json()["layers"]["L3"])
    r = _post(server, "/api/context-governance/compress", {
        "instance_id": iid, "action": "compress", "target_layers": ["L3"],
        "preserve_keys": ["risk_level", "assessment_id", "risk_factors"],
        "compress_rules": [{"pattern": "tool_call_result", "action": "extract_keys", "extractKeys": ["status", "summary"]},
                           {"pattern": "reasoning_chain", "action": "summarize", "maxTokens": 100}],
        "max_tokens": 20})  # the seed says 2000, for a context far larger than this one
    assert r.status_code == 200, r.text
    assert r.json()["changed"] is True
    snapshot = r.json()["snapshot_id"]
    r = _post(server, "/api/context-governance/compress",
              {"instance_id": iid, "action": "evaluate", "before_snapshot_id": snapshot})
    assert r.status_code == 200, r.text
    r = _post(server, "/api/context-governance/compress", {"instance_id": iid, "action": "decompress",
                                                            "snapshot_id": snapshot})
    assert r.status_code == 200, r.text
    assert _get(server, f"/api/instances/{iid}").json()["layers"]["L3"] == doc["layers"]["L3"]
    r = _post(server, "/api/context-governance/branch-evaluate",
              {"instance_id": iid, "required_keys": ["amount", "approval_status"]})
    assert r.status_code == 200, r.text
    assert "approval_status" in json.dumps(r.json())


def test_confirmations_endpoints(server: str) -> None:
    doc = _start(server, "par_proc")
    iid = doc["instance_id"]
    pending = _get(server, f"/api/confirmations?instance_id={iid}").json()
    assert [c["id"] for c in pending] == ["merge/level"] and pending[0]["instance_id"] == iid
    wrong = _post(server, "/api/confirmations/merge/level", {"instance_id": iid, "value": "seven"})
    assert wrong.status_code == 400 and wrong.json()["error"]["kind"] == "invalid_answer"
    nothing = _post(server, f"/api/instances/{iid}/events", {"name": "nobody_waits"})
    assert nothing.status_code == 409 and "merge/level" in nothing.text  # names what it waits for
    assert _get(server, f"/api/instances/{iid}").json()["tape_length"] == doc["tape_length"]
    ok = _post(server, "/api/confirmations/merge/level", {"instance_id": iid, "value": 0, "reason": "cautious"})
    assert ok.status_code == 200, ok.text
    assert ok.json()["status"] == "completed" and ok.json()["layers"]["L3"]["final"] == 0
    assert _get(server, f"/api/confirmations?instance_id={iid}").json() == []
    decisions = [e for e in _get(server, f"/api/instances/{iid}/tape").json()["events"]
                 if "human_decision" in (e["kind"], (e.get("data") or {}).get("note"))]
    assert len(decisions) == 1 and decisions[0]["data"]["value"] == 0  # the refused answer left no trace
