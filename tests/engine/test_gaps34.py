"""Round 34 gaps: the REST instance documents name who holds an instance's lease (``held_by``) as
`layerflow list` and `inspect --json` do; a mistyped ``tape --activity`` offers the process's ids
(no actors) and the nearest; a ``human_confirm`` with two options of one value is refused; the
``denied`` tape filter lists a split's refused inject."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from engine.api import create_app
from engine.governance import GovernanceService
from engine.leases import lease_store
from engine.process import load_process
from engine.tools import dispatch_tool
from engine.runtime import Engine

from engine_helpers import flow, write_elements
from governance_helpers import EXAMPLES, LOAN_CONFLICT, NOTES, ROOT, TOKEN, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _waiting(client: TestClient) -> str:
    r = client.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}, headers=AUTH)
    assert r.status_code == 201 and r.json()["status"] == "waiting", r.text
    return str(r.json()["instance_id"])


def test_rest_instance_list_and_document_name_the_lease_holder(tmp_path: Path) -> None:
    """A worker holding a waiting instance's lease (its timer or an answer being run) is named in
    GET /api/instances and GET /api/instances/{id}, as `layerflow list --json` names it; the
    OpenAPI schema declares the field."""
    engine = Engine(f"sqlite:///{tmp_path / 'gaps34.db'}")
    with TestClient(create_app(GovernanceService(engine, make_catalog(tmp_path)), token=TOKEN)) as client:
        iid = _waiting(client)
        assert _held(client, iid) == (None, None)
        leases = lease_store(engine.store)
        assert leases is not None and leases.acquire_lease(iid, "worker-7", 30.0)
        assert _held(client, iid) == ("worker-7", "worker-7")
        leases.release_lease(iid, "worker-7")
        assert _held(client, iid) == (None, None)
        schemas = client.get("/openapi.json").json()["components"]["schemas"]
        assert "held_by" in schemas["InstanceView"]["properties"]
        assert "held_by" in schemas["InstanceSummary"]["properties"]
        listing = client.get("/openapi.json").json()["paths"]["/api/instances"]["get"]["responses"]["200"]
        assert listing["content"]["application/json"]["schema"]["items"]["$ref"].endswith("/InstanceSummary")


def _held(client: TestClient, iid: str) -> tuple[Any, Any]:
    (row,) = [r for r in client.get("/api/instances", headers=AUTH).json() if r["id"] == iid]
    doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
    return row["held_by"], doc["held_by"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_tape_activity_typo_lists_only_the_process_ids_and_names_the_nearest(tmp_path: Path) -> None:
    """The loan tape has events by the actors ``engine`` and ``input`` (no activity of the process):
    a mistyped ``--activity`` listed them as "activities and gateways" and gave no hint."""
    store = f"sqlite:///{tmp_path / 'tape.db'}"
    engine = Engine(store)
    instance = engine.run(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_CONFLICT)
    doc = GovernanceService(engine).tape(instance.id, activity="risk_asessment")
    assert doc["count"] == 0
    assert "risk_assessment" in doc["activities"] and "approval_split" in doc["activities"]
    assert not {"engine", "input"} & set(doc["activities"]), doc["activities"]
    assert "did you mean 'risk_assessment'?" in doc["note"], doc["note"]
    result = _cli("tape", instance.id, "--activity", "risk_asessment", "--store", store)
    assert result.returncode == 0 and result.stdout == "", result
    assert result.stderr.strip() == f"layerflow: {doc['note']}"
    listed = result.stderr.split("activities and gateways on this tape: ")[1].strip().split(", ")
    assert listed == doc["activities"]


@pytest.mark.parametrize("options, said", [
    pytest.param([{"label": "approve", "value": "yes"}, {"label": "ship it", "value": "yes"}], '"yes"', id="same-value"),
    pytest.param([{"label": "approve"}, {"label": "reject"}], "null", id="labels-only"),
])
def test_a_human_confirm_tool_call_with_two_options_of_one_value_is_refused(
        tmp_path: Path, options: list[dict[str, Any]], said: str) -> None:
    """An answer is one option's value: two options of one value cannot be told apart, so the
    model is told which value is doubled, and nobody is asked."""
    engine = Engine(f"sqlite:///{tmp_path / 'confirm.db'}")
    instance = engine.run(load_process(EXAMPLES / "loan_approval.bpmn"), LOAN_CONFLICT)
    service = GovernanceService(engine)
    result = dispatch_tool(service, instance.id, "human_confirm", {"message": "ok?", "options": options})
    error = result["error"]
    assert error["kind"] == "validation_error", result
    assert f"the value {said}" in error["message"] and "its own value" in error["message"], error
    assert [p["field"] for p in error["problems"]] == ["options"], error
    assert not [c for c in engine.load(instance.id).confirmations if str(c["id"]).startswith("model:")]


@pytest.mark.parametrize("human_confirm, field", [
    pytest.param("    options: [approved, {label: fine, value: approved}]\n", "humanConfirm.options", id="options"),
    pytest.param("    options: [approved]\n    extraOptions: [{label: again, value: approved}]\n",
                 "humanConfirm.extraOptions", id="extra-options"),
])
def test_validate_names_a_join_s_options_of_one_value(tmp_path: Path, human_confirm: str, field: str) -> None:
    for name in ("loan_approval.bpmn", "loan_handlers.py", "knowledge"):
        (tmp_path / name).symlink_to(EXAMPLES / name)
    text = (EXAMPLES / "loan_approval.layerflow.yaml").read_text()
    assert "  humanConfirm:\n    timeout: 300\n" in text
    config = tmp_path / "loan_approval.layerflow.yaml"
    config.write_text(text.replace("  humanConfirm:\n    timeout: 300\n", "  humanConfirm:\n    timeout: 300\n"
                                   + human_confirm))
    result = _cli("validate", str(tmp_path / "loan_approval.bpmn"))
    assert result.returncode == 2, result
    (line,) = [ln for ln in result.stdout.splitlines() if '"approved"' in ln]
    assert "loan_approval.layerflow.yaml" in line and "review_join" in line and field in line, line


XOR = [
    '<bpmn:startEvent id="start"/>',
    '<bpmn:exclusiveGateway id="pick" default="pick_to_a"/>',
    '<bpmn:scriptTask id="a"><bpmn:script>done = True</bpmn:script></bpmn:scriptTask>',
    '<bpmn:scriptTask id="b"><bpmn:script>done = False</bpmn:script></bpmn:scriptTask>',
    '<bpmn:endEvent id="end"/>',
    flow("start", "pick"), flow("pick", "a"), flow("pick", "b", "False"), flow("a", "end"), flow("b", "end"),
]


@pytest.mark.parametrize("kind", ["denied", "deny", "denied_write"])
def test_tape_kind_denied_lists_a_refused_inject_once(tmp_path: Path, kind: str) -> None:
    """The process's data fixes ``_branch_id`` in PROCESS: the XOR split's inject of its marker is
    refused (an ``inject_refused`` note, no ``denied`` write stands for it), and a user filtering the
    tape for refusals is shown it, once, by REST and by the CLI alike."""
    store = f"sqlite:///{tmp_path / 'denied.db'}"
    engine = Engine(store)
    instance = engine.run(load_process(write_elements(tmp_path, "xor", XOR)), {"_branch_id": "mine"})
    assert instance.status == "completed", instance.error
    refused = [e.seq for e in instance.main.tape if (e.data or {}).get("note") == "inject_refused"]
    assert len(refused) == 1
    doc = GovernanceService(engine).tape(instance.id, kind=kind)
    assert [e["seq"] for e in doc["events"]] == refused, doc
    result = _cli("tape", instance.id, "--kind", kind, "--store", store, "--json")
    assert result.returncode == 0, result
    assert [e["seq"] for e in json.loads(result.stdout)] == refused
