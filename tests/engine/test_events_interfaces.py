"""Sending a message or signal through ``layerflow send`` and ``POST /api/instances/{id}/events``:
exit codes and status codes, the ``--json`` document, what a refusal says."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import local_http
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
                                     "event": "documents_received", "event_kind": "message", "context": "main"}
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
    r = local_http.post(f"{server.base_url}/api/instances/x/events", json={"name": "go"}, timeout=30)
    assert r.status_code == 401
    r = server.post("/api/instances/no-such-id/events", json={"name": "go"})
    assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"


# -- messages and signals that leave the instance ----------------------------------------------------

MESSAGES_OUT = Path(__file__).resolve().parent / "fixtures" / "messages_out"


def test_a_message_nothing_in_the_instance_catches_is_listed_as_sent_out_and_can_be_delivered(cli) -> None:
    """A process that throws a message and a signal that nothing in its instance waits for: before,
    both vanished without a trace (SpiffWorkflow leaves them for the application, and nothing showed
    them). They are on the tape (a ``message_out`` note of the throwing element), in ``run --json``'s
    ``messages_out`` and in the summary, with the `layerflow send` that delivers the message to the
    instance of another process that starts on it."""
    shop = cli("run", str(MESSAGES_OUT / "order_shop.bpmn"), "--data", '{"order_id": "O-9"}', "--json")
    assert shop.exit_code == 0, shop.output
    doc = json.loads(shop.stdout)
    assert doc["status"] == "completed"
    assert [{k: m[k] for k in ("name", "kind", "element_id", "payload", "context")} for m in doc["messages_out"]] == [
        {"name": "order placed", "kind": "message", "element_id": "notify_warehouse",
         "payload": {"id": "O-9", "items": 2}, "context": "main"},
        {"name": "stock changed", "kind": "signal", "element_id": "announce_stock", "payload": None, "context": "main"}]
    seqs = [m["seq"] for m in doc["messages_out"]]
    tape = json.loads(cli("tape", doc["instance_id"], "--kind", "message_out", "--json").stdout)
    assert [e["seq"] for e in tape] == seqs
    assert [e["data"]["element"] for e in tape] == ["notify_warehouse", "announce_stock"]

    text = cli("run", str(MESSAGES_OUT / "order_shop.bpmn"), "--data", '{"order_id": "O-9"}')
    assert ("message 'order placed' thrown at notify_warehouse left the instance (nothing in it waits for it): "
            "`layerflow send OTHER_ID 'order placed' --json-payload '{\"id\": \"O-9\", \"items\": 2}'`") in text.stdout
    assert "`layerflow send OTHER_ID 'stock changed' --signal` delivers it" in text.stdout

    warehouse = json.loads(cli("run", str(MESSAGES_OUT / "warehouse.bpmn"), "--json").stdout)
    assert warehouse["status"] == "waiting" and warehouse["messages_out"] == []
    message = doc["messages_out"][0]
    sent = cli("send", warehouse["instance_id"], message["name"], "--json-payload", json.dumps(message["payload"]),
               "--json")
    assert sent.exit_code == 0, sent.output
    done = json.loads(sent.stdout)
    assert done["status"] == "completed" and done["layers"]["L3"]["picked"] == 2


def test_a_message_caught_in_its_own_instance_is_not_sent_out(tmp_path: Path) -> None:
    """Only what nothing in the instance caught leaves it: a branch that waits for the message
    another branch throws catches it, and ``messages_out`` stays empty; the Python API lists the
    same items as ``run --json``."""
    from engine import load_process
    from engine_helpers import flow, write_elements

    definition = '<bpmn:messageEventDefinition messageRef="ping_msg"/>'
    path = write_elements(tmp_path, "ping_self", [
        '<bpmn:startEvent id="start"/>', '<bpmn:parallelGateway id="split"/>',
        f'<bpmn:intermediateCatchEvent id="wait_ping">{definition}</bpmn:intermediateCatchEvent>',
        '<bpmn:scriptTask id="prepare"><bpmn:script>ready = True</bpmn:script></bpmn:scriptTask>',
        f'<bpmn:intermediateThrowEvent id="ping">{definition}</bpmn:intermediateThrowEvent>',
        '<bpmn:parallelGateway id="join"/>', '<bpmn:endEvent id="end"/>',
        flow("start", "split"), flow("split", "wait_ping"), flow("split", "prepare"), flow("prepare", "ping"),
        flow("wait_ping", "join"), flow("ping", "join"), flow("join", "end")],
        extra='<bpmn:message id="ping_msg" name="ping"/>\n')
    engine = Engine(store="memory://")
    instance = engine.run(engine.start(load_process(path), {}))
    assert instance.status == "completed", instance.error
    assert instance.messages_out() == [] and instance.to_document()["messages_out"] == []

    shop = engine.run(engine.start(load_process(MESSAGES_OUT / "order_shop.bpmn"), {"order_id": "O-1"}))
    assert [m["name"] for m in shop.messages_out()] == ["order placed", "stock changed"]
    assert shop.to_document()["messages_out"] == shop.messages_out()
