"""Message correlation: a message goes to the one waiting instance whose context holds the match
values (Engine.correlate, `layerflow correlate`, POST /api/messages), or starts a process whose
message start event has its name; several or none are refused naming what waits for what."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from context_layers import thaw
from context_layers.errors import ContextKeyError
from engine import Engine, load_process
from engine.governance import InstanceStateError
from tests import local_http
from tests.engine.engine_helpers import EXAMPLES, ROOT

CLAIM = EXAMPLES / "message_wait.bpmn"  # waits at receive_documents for documents_received
TOKEN = "t39"

# an intake that starts on the message a claim's documents come with, when no claim waits for them
INTAKE = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="t">
  <bpmn:message id="m_docs" name="documents_received"/>
  <bpmn:process id="intake" isExecutable="true">
    <bpmn:startEvent id="docs_arrived"><bpmn:messageEventDefinition messageRef="m_docs"/></bpmn:startEvent>
    <bpmn:scriptTask id="file_docs"><bpmn:script>filed = "filed for " + claim_id</bpmn:script></bpmn:scriptTask>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="docs_arrived" targetRef="file_docs"/>
    <bpmn:sequenceFlow id="f2" sourceRef="file_docs" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


@pytest.fixture(params=["memory", "sqlite"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Engine:
    url = f"memory://c39-{uuid.uuid4().hex}" if request.param == "memory" else f"sqlite:///{tmp_path / 'runs.db'}"
    return Engine(url)


def _claims(engine: Engine, *ids: str) -> dict[str, str]:
    claim = load_process(CLAIM)
    out = {}
    for claim_id in ids:
        instance = engine.run(claim, {"claim_id": claim_id})
        assert instance.status == "waiting"
        out[claim_id] = instance.id
    return out


def _intake(tmp_path: Path) -> Any:
    path = tmp_path / "intake.bpmn"
    path.write_text(INTAKE)
    return load_process(path)


def test_the_message_goes_to_the_instance_whose_context_matches(engine: Engine) -> None:
    ids = _claims(engine, "CL-1", "CL-2", "CL-3")
    reached = engine.correlate("documents_received", {"files": ["report.pdf"]}, match={"claim_id": "CL-2"})
    assert reached.id == ids["CL-2"]
    assert reached.status == "completed"
    assert thaw(reached.main.get("documents")) == {"files": ["report.pdf"]}
    assert reached.main.get("status") == "assessing CL-2 with report.pdf"
    assert {engine.load(ids[c]).status for c in ("CL-1", "CL-3")} == {"waiting"}


def test_no_match_is_refused_naming_what_waits_with_which_values(engine: Engine) -> None:
    ids = _claims(engine, "CL-1", "CL-2")
    versions = {iid: engine.load(iid).version for iid in ids.values()}
    with pytest.raises(ContextKeyError) as err:
        engine.correlate("documents_received", {"files": []}, match={"claim_id": "CL-9"})
    message = str(err.value)
    assert "'documents_received'" in message and "CL-9" in message
    for claim_id, iid in ids.items():
        assert f"{iid} at receive_documents" in message and repr(claim_id) in message
    assert "no process was given" in message
    assert {iid: engine.load(iid).version for iid in ids.values()} == versions  # nothing changed


def test_several_matching_instances_are_refused_naming_them(engine: Engine) -> None:
    ids = _claims(engine, "CL-1", "CL-1", "CL-2")  # no match: every instance waiting for it matches
    first = engine.load(ids["CL-1"])
    with pytest.raises(InstanceStateError) as err:
        engine.correlate("documents_received", {"files": []})
    assert "matches 3 waiting instances" in str(err.value) and ids["CL-2"] in str(err.value)
    twins = [iid for iid in (r["id"] for r in engine.store.list()) if engine.load(iid).main.get("claim_id") == "CL-1"]
    with pytest.raises(InstanceStateError) as err:
        engine.correlate("documents_received", {"files": []}, match={"claim_id": "CL-1"})
    assert all(iid in str(err.value) for iid in twins) and ids["CL-2"] not in str(err.value)
    assert engine.load(first.id).version == first.version


def test_none_waiting_starts_a_process_that_starts_on_the_message(engine: Engine, tmp_path: Path) -> None:
    intake = _intake(tmp_path)
    _claims(engine, "CL-1")
    started = engine.correlate("documents_received", {"claim_id": "CL-7"}, match={"claim_id": "CL-7"},
                               process=[load_process(CLAIM), intake])
    assert started.process_id == "intake" and started.status == "completed"
    assert started.main.get("filed") == "filed for CL-7"
    with pytest.raises(ContextKeyError) as err:
        engine.correlate("documents_received", {}, match={"claim_id": "CL-8"}, process=load_process(CLAIM))
    assert "no process given (message_wait) starts on it" in str(err.value)


def test_a_start_whose_message_is_refused_leaves_no_instance_behind(engine: Engine, tmp_path: Path) -> None:
    """The intake started for the message, then refused its payload (a list, with no messageVariable to
    hold it): the started instance stayed, waiting at its start event, and the error did not name it, so a
    client's corrected retry started a second one. Nothing is created now, and the error says so."""
    from context_layers.errors import LayerflowError

    intake = _intake(tmp_path)
    with pytest.raises(LayerflowError) as err:
        engine.correlate("documents_received", [1, 2], process=intake)
    assert "was not created" in str(err.value), str(err.value)
    assert engine.store.list() == []
    started = engine.correlate("documents_received", {"claim_id": "CL-7"}, process=intake)
    assert started.status == "completed" and [r["id"] for r in engine.store.list()] == [started.id]
    saved = engine.load(started.id)
    assert saved.status == "completed" and saved.main.get("filed") == "filed for CL-7"


def test_a_message_nobody_waits_for_is_refused_as_such(engine: Engine) -> None:
    _claims(engine, "CL-1")
    with pytest.raises(ContextKeyError, match="'no_such_message'.*no waiting instance waits for it"):
        engine.correlate("no_such_message", {}, match={"claim_id": "CL-1"})


def test_only_the_instances_waiting_for_the_message_are_loaded(engine: Engine) -> None:
    """The search reads record heads; whole records (their tapes) only of instances that wait for it."""
    ids = _claims(engine, "CL-1", "CL-2")
    review = engine.run(load_process(EXAMPLES / "parallel_user_task.bpmn"), {"title": "Q3"})
    assert review.status == "waiting"
    loaded: list[str] = []
    load = engine.store.load

    def spy(instance_id: str) -> dict[str, Any]:
        loaded.append(instance_id)
        return load(instance_id)

    engine.store.load = spy  # type: ignore[method-assign]
    engine.correlate("documents_received", {"files": []}, match={"claim_id": "CL-1"}, run=False)
    assert review.id not in loaded
    assert set(loaded) <= set(ids.values())


def test_a_bad_match_names_the_key(engine: Engine) -> None:
    with pytest.raises(Exception, match="match"):
        engine.correlate("documents_received", {}, match={"k": float("nan")})


def _cli(store: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args, "--store", store], cwd=ROOT,
                          capture_output=True, text=True, env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_cli_correlate_sends_and_refuses_as_send_does(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    ids = _claims(Engine(store), "CL-1", "CL-2")
    done = _cli(store, "correlate", "documents_received", "--match", "claim_id=CL-2",
                "--json-payload", '{"files": ["a.pdf"]}', "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["instance_id"] == ids["CL-2"] and doc["status"] == "completed"
    missing = _cli(store, "correlate", "documents_received", "--match", "claim_id=CL-2", "--json")
    assert missing.returncode == 2
    error = json.loads(missing.stdout)["error"]
    assert error["kind"] == "not_found" and ids["CL-1"] in error["message"]
    intake = tmp_path / "intake.bpmn"
    intake.write_text(INTAKE)
    started = _cli(store, "correlate", "documents_received", "--match", "claim_id=CL-5", "--json-payload",
                   '{"claim_id": "CL-5"}', "--process", str(intake), "--json")
    assert started.returncode == 0, started.stderr
    assert json.loads(started.stdout)["process_id"] == "intake"
    assert _cli(store, "correlate", "documents_received", "--match", "nokey").returncode == 2


def test_rest_messages(tmp_path: Path) -> None:
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    shutil.copy(CLAIM, catalog / CLAIM.name)
    (catalog / "intake.bpmn").write_text(INTAKE)
    db = tmp_path / "rest.db"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with local_http.serving(catalog, db, TOKEN) as url:
        started = [local_http.post(f"{url}/api/instances", headers=auth, json={
            "process_id": "message_wait", "data": {"claim_id": c}}).json()["instance_id"] for c in ("CL-1", "CL-2")]
        body = {"name": "documents_received", "payload": {"files": ["x.pdf"]}, "match": {"claim_id": "CL-2"}}
        sent = local_http.post(f"{url}/api/messages", headers=auth, json=body)
        assert sent.status_code == 200, sent.text
        assert sent.json()["instance_id"] == started[1] and sent.json()["started"] is False
        last = local_http.post(f"{url}/api/messages", headers=auth, json={"name": "documents_received",
                                                                          "match": {}, "process_id": "intake"})
        assert last.status_code == 200  # one claim waits still: CL-1 takes it (match is empty), none is started
        assert last.json()["instance_id"] == started[0] and last.json()["started"] is False
        new = local_http.post(f"{url}/api/messages", headers=auth, json={
            "name": "documents_received", "payload": {"claim_id": "CL-3"}, "process_id": "intake"})
        assert new.status_code == 200 and new.json()["started"] is True
        assert new.json()["process_id"] == "intake"
        count = len(local_http.get(f"{url}/api/instances", headers=auth).json())
        refused = local_http.post(f"{url}/api/messages", headers=auth, json={
            "name": "documents_received", "payload": [1, 2], "process_id": "intake"})  # no variable holds a list
        assert refused.status_code == 400 and "was not created" in refused.json()["error"]["message"], refused.text
        assert len(local_http.get(f"{url}/api/instances", headers=auth).json()) == count  # nothing left behind
        none = local_http.post(f"{url}/api/messages", headers=auth, json={
            "name": "documents_received", "process_id": "message_wait"})
        assert none.status_code == 404 and none.json()["error"]["kind"] == "not_found"
        bad = local_http.post(f"{url}/api/messages", headers=auth, json={"name": "x", "match": [1]})
        assert bad.status_code == 422
        spec = local_http.get(f"{url}/openapi.json").json()["paths"]["/api/messages"]["post"]["responses"]
        assert {"200", "404", "409", "422"} <= set(spec)


def test_bpmn_correlation_properties_pick_the_instance_without_match(engine: Engine, tmp_path: Path) -> None:
    """SpiffWorkflow's correlation keys, fixed by each instance's first message, decide too: the second
    message carrying CL-2 goes to the instance whose first one carried CL-2."""
    from tests.engine.test_events import CORRELATED

    path = tmp_path / "correlated.bpmn"
    path.write_text(CORRELATED)
    process = load_process(path)
    ids = {}
    for claim_id in ("CL-1", "CL-2"):
        instance = engine.run(engine.start(process))
        ids[claim_id] = engine.send_event(instance, "documents_received", {"claim_id": claim_id, "n": 1}).id
    done = engine.correlate("documents_received", {"claim_id": "CL-2", "n": 2})
    assert done.id == ids["CL-2"] and done.status == "completed"
    assert engine.load(ids["CL-1"]).status == "waiting"
    with pytest.raises(ContextKeyError, match="its correlation keys refuse this payload"):
        engine.correlate("documents_received", {"claim_id": "CL-2", "n": 3})
