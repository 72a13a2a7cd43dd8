"""Sending a message or signal through ``layerflow send`` and ``POST /api/instances/{id}/events``:
exit codes and status codes, the ``--json`` document, what a refusal says."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from engine.api import create_app
from engine.cli import main
from engine.governance import GovernanceService
from engine.runtime import Engine

from engine_helpers import EXAMPLES
from governance_helpers import TOKEN, ServerThread

CONTRACT = {"instance_id", "process_id", "status", "error", "layers", "tokens", "conflicts", "compressions",
            "confirmations", "waiting_for", "tape_length"}
DOCUMENTS = {"files": ["police_report.pdf", "repair_invoice.pdf"], "sender": "claimant"}
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAYERFLOW_STORE", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)
    return invoke


@pytest.fixture
def claim(cli, tmp_path: Path) -> str:
    data = tmp_path / "claim.json"
    data.write_text(json.dumps({"claim_id": "CL-1042"}))
    result = cli("run", str(EXAMPLES / "message_wait.bpmn"), "--data", str(data), "--json")
    assert result.exit_code == 3, result.stderr
    doc = json.loads(result.stdout)
    assert doc["waiting_for"][1] == {"kind": "event", "id": doc["waiting_for"][1]["id"], "task_id": "receive_documents",
                                     "event": "documents_received", "event_kind": "message"}
    return str(doc["instance_id"])


# ----------------------------------------------------------------------------- CLI

def test_send_with_a_json_payload_completes_and_prints_the_run_document(cli, claim) -> None:
    result = cli("send", claim, "documents_received", "--json-payload", json.dumps(DOCUMENTS), "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # one document and nothing else
    assert CONTRACT <= set(doc) and doc["status"] == "completed" and doc["waiting_for"] == []
    assert doc["layers"]["L3"]["documents"] == DOCUMENTS
    assert doc["layers"]["L3"]["event:receive_documents"]["sent_by"] == "cli"


def test_send_with_a_data_file(cli, claim, tmp_path: Path) -> None:
    payload = tmp_path / "documents.yaml"
    payload.write_text("files: [scan.pdf]\nsender: broker\n")
    result = cli("send", claim, "documents_received", "--data", str(payload))
    assert result.exit_code == 0, result.stderr
    assert "completed" in result.stdout


def test_the_waiting_summary_says_how_to_send(cli, claim) -> None:
    result = cli("resume", claim)
    assert result.exit_code == 3
    assert (f"waiting for message 'documents_received' at receive_documents: `layerflow send {claim} "
            "documents_received --json-payload '{...}'`") in result.stdout


@pytest.mark.parametrize(("args", "kind", "says"), [
    (["nobody_waits"], "invalid_state", "it waits for: timer no_documents"),
    (["documents_received", "--signal"], "invalid_state", "does not wait for signal 'documents_received'"),
    (["documents_received", "--json-payload", "{not json"], "bad_input", "--json-payload is not valid JSON"),
    (["documents_received", "--json-payload", "{}", "--data", "x.json"], "bad_input", "not both"),
])
def test_send_refusals_exit_2_and_leave_the_instance_waiting(cli, claim, args, kind, says) -> None:
    result = cli("send", claim, *args, "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == kind and says in error["message"], error
    assert cli("resume", claim).exit_code == 3


def test_send_a_denied_key_exits_2_and_the_refusal_is_on_the_tape(cli, tmp_path: Path) -> None:
    data = tmp_path / "claim.json"
    data.write_text(json.dumps({"claim_id": "CL-1", "documents": {"files": []}}))  # documents: in PROCESS
    claim = json.loads(cli("run", str(EXAMPLES / "message_wait.bpmn"), "--data", str(data), "--json").stdout)
    result = cli("send", claim["instance_id"], "documents_received", "--json-payload", json.dumps(DOCUMENTS),
                 "--json")
    assert result.exit_code == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "permission_denied" and "'documents'" in error["message"]
    tape = cli("tape", claim["instance_id"], "--kind", "denied", "--json")
    assert [e["data"]["key"] for e in json.loads(tape.stdout)] == ["documents"]
    assert cli("resume", claim["instance_id"]).exit_code == 3


def test_send_to_an_unknown_instance_exits_2(cli) -> None:
    result = cli("send", "no-such-id", "documents_received", "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["error"]["kind"] == "not_found"


# ----------------------------------------------------------------------------- REST over HTTP

SIGNAL_PROCESS = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="defs"
                  targetNamespace="https://layerflow.dev/tests">
  <bpmn:signal id="s_go" name="go"/>
  <bpmn:process id="go_signal" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:intermediateCatchEvent id="wait_go"><bpmn:signalEventDefinition signalRef="s_go"/></bpmn:intermediateCatchEvent>
    <bpmn:scriptTask id="use"><bpmn:script>result = speed * 2</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="wait_go"/>
    <bpmn:sequenceFlow id="f2" sourceRef="wait_go" targetRef="use"/>
    <bpmn:sequenceFlow id="f3" sourceRef="use" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture
def server(tmp_path: Path):
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "message_wait.bpmn").symlink_to(EXAMPLES / "message_wait.bpmn")
    (catalog / "go_signal.bpmn").write_text(SIGNAL_PROCESS)
    app = create_app(GovernanceService(Engine(f"sqlite:///{tmp_path / 'api.db'}"), catalog), token=TOKEN)
    with ServerThread(app) as running, httpx.Client(base_url=running.url, headers=AUTH, timeout=30) as client:
        yield client


def start(client: httpx.Client, process_id: str, data: dict[str, object]) -> dict[str, object]:
    r = client.post("/api/instances", json={"process_id": process_id, "data": data})
    assert r.status_code == 201, r.text
    doc: dict[str, object] = r.json()
    assert doc["status"] == "waiting"
    return doc


def test_rest_delivers_a_message_and_the_instance_runs_on(server) -> None:
    doc = start(server, "message_wait", {"claim_id": "CL-7"})
    r = server.post(f"/api/instances/{doc['instance_id']}/events",
                    json={"name": "documents_received", "payload": DOCUMENTS, "user": "mailroom",
                          "expected_version": doc["version"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "completed" and body["version"] > doc["version"]
    assert body["layers"]["L3"]["event:receive_documents"]["sent_by"] == "mailroom"
    assert body["layers"]["L3"]["status"] == "assessing CL-7 with police_report.pdf, repair_invoice.pdf"


def test_rest_broadcasts_a_signal(server) -> None:
    doc = start(server, "go_signal", {})
    assert doc["waiting_for"][0]["event_kind"] == "signal"  # type: ignore[index]
    r = server.post(f"/api/instances/{doc['instance_id']}/events",
                    json={"name": "go", "kind": "signal", "payload": {"speed": 21}})
    assert r.status_code == 200, r.text
    assert r.json()["layers"]["L3"]["result"] == 42


@pytest.mark.parametrize(("body", "status", "kind"), [
    ({"name": "nobody_waits"}, 409, "invalid_state"),
    ({"name": "documents_received", "kind": "signal"}, 409, "invalid_state"),
    ({"name": "documents_received", "expected_version": 99}, 409, "version_conflict"),
    ({"name": "documents_received", "kind": "email"}, 422, "validation_error"),
    ({"name": ""}, 422, "validation_error"),
    ({"payload": {}}, 422, "validation_error"),
])
def test_rest_refusals(server, body, status, kind) -> None:
    doc = start(server, "message_wait", {"claim_id": "CL-8"})
    r = server.post(f"/api/instances/{doc['instance_id']}/events", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["kind"] == kind
    after = server.get(f"/api/instances/{doc['instance_id']}").json()
    assert after["status"] == "waiting" and after["version"] == doc["version"]


def test_rest_a_denied_payload_key_is_403_and_recorded(server) -> None:
    doc = start(server, "go_signal", {"speed": 1})  # speed is in PROCESS: append-only
    r = server.post(f"/api/instances/{doc['instance_id']}/events",
                    json={"name": "go", "kind": "signal", "payload": {"speed": 2}})
    error = r.json()["error"]
    assert r.status_code == 403 and error["kind"] == "permission_denied" and error["key"] == "speed"
    after = server.get(f"/api/instances/{doc['instance_id']}").json()
    assert after["status"] == "waiting" and after["layers"]["L1"]["speed"] == 1
    denied = server.get(f"/api/instances/{doc['instance_id']}/tape", params={"kind": "denied"}).json()
    assert [e["data"]["key"] for e in denied["events"]] == ["speed"]


def test_rest_needs_the_token_and_a_known_instance(server) -> None:
    r = httpx.post(f"{server.base_url}/api/instances/x/events", json={"name": "go"}, timeout=30)
    assert r.status_code == 401
    r = server.post("/api/instances/no-such-id/events", json={"name": "go"})
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"
