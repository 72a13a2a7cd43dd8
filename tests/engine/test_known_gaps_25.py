"""Gaps closed in round 25.

(a) The join of a branch whose ``count_only`` rule removed old HISTORY entries and a branch whose
    fold removed the same entries brought them back verbatim beside the counter (the xfail of
    ``test_unseen_processes_31``; the merge's examples are in ``tests/gateways/test_gw_split_join.py``,
    ``test_log_lines_compressed_differently_in_two_branches``).
(b) REST ``POST /api/context-governance/rollback`` answered ``layers`` as the list of the restored
    layers' names, while ``layerflow rollback --json`` gives the instance's document (``layers`` the
    map of each layer's contents, as ``GET /api/instances/{id}`` and ``inspect`` give it) with the
    names in ``restored_layers``. DESIGN.md documents no other shape for the REST answer (only the
    endpoint), so REST now answers as the CLI does: the same document, the same fields.
(c) ``resume`` of a completed instance took any ``user_tasks`` key shaped like a task uuid as a
    former ``waiting_for`` id ("not used", exit 0). A uuid no task of the instance ever had is a
    typo: exit 2 / 400 naming it; a real former task id (one inside a sub-process too) is still only
    not used.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from engine import Engine, load_process
from engine.api import RollbackDocument
from engine.cli import main
from engine.governance import InvalidAnswer

from engine_helpers import serving_catalog

HERE = Path(__file__).parent / "gaps25"
APPROVE = HERE / "approve.bpmn"
NESTED = HERE / "nested_review.bpmn"
TOKEN = "gaps25-token"
GOV = "/api/context-governance"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, str]]:
    """A real ``layerflow serve`` on a sqlite store, and that store's URL for the CLI."""
    folder = tmp_path_factory.mktemp("served25")
    store = f"sqlite:///{folder / 'rest.db'}"
    with serving_catalog(HERE, store, folder / "serve.err", TOKEN) as client:
        yield client, store


def cli_json(store: str, *args: str, code: int = 0) -> tuple[dict[str, Any], str]:
    result = CliRunner().invoke(main, [*args, "--store", store, "--json"], catch_exceptions=False)
    assert result.exit_code == code, (result.stdout, result.stderr)
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc, result.stderr


def started(api: httpx.Client, process_id: str) -> dict[str, Any]:
    doc = api.post("/api/instances", json={"process_id": process_id})
    assert doc.status_code == 201, doc.text
    body: dict[str, Any] = doc.json()
    assert body["status"] == "waiting"
    return body


# ===== (b) the REST rollback answer is the CLI's =================================================

def test_rest_rollback_answers_the_instance_document_as_the_cli_does(served: tuple[httpx.Client, str]) -> None:
    api, store = served
    iid = started(api, "approve")["instance_id"]
    snap = api.post(f"{GOV}/snapshot", json={"instance_id": iid}).json()["snapshot_id"]
    assert api.post(f"{GOV}/inject", json={"instance_id": iid, "values": {"extra": 1}}).status_code == 200
    back = api.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": snap, "reason": "undo"})
    assert back.status_code == 200, back.text
    doc = back.json()
    shown = api.get(f"/api/instances/{iid}").json()
    assert set(doc["layers"]) == {"L0", "L1", "L2", "L3", "L4", "L5"}
    assert doc["layers"] == shown["layers"] and "extra" not in json.dumps(doc["layers"])
    assert doc["restored_layers"] == ["L2", "L3", "L4", "L5"]
    assert (doc["snapshot_id"], doc["instance_id"], doc["status"], doc["context"]) == (snap, iid, "waiting", "main")
    assert doc["tokens"] == doc["tokens_after"] and doc["version"] == shown["version"]
    assert doc["event_seq"] >= 1 and doc["tape_length"] == shown["tape_length"]
    # /openapi.json says so
    answers = api.get("/openapi.json").json()["paths"][f"{GOV}/rollback"]["post"]["responses"]
    assert answers["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/RollbackDocument")
    RollbackDocument.model_validate(doc)

    # the CLI's answer to the same rollback has the same fields, the same layers
    assert api.post(f"{GOV}/inject", json={"instance_id": iid, "values": {"extra": 2}}).status_code == 200
    by_cli, _ = cli_json(store, "rollback", iid, snap, "--layers", "L4")
    assert set(by_cli) == set(doc)
    assert by_cli["restored_layers"] == ["L4"] and by_cli["layers"] == api.get(f"/api/instances/{iid}").json()["layers"]
    only = api.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": snap, "layers": ["L3"]}).json()
    assert only["restored_layers"] == ["L3"] and set(only["layers"]) == set(doc["layers"])


def test_rest_rollback_of_a_branch_answers_with_that_context(served: tuple[httpx.Client, str]) -> None:
    """The document's ``layers`` and ``tokens`` are the rolled-back context's, as ``rollback --json
    --context`` gives them; the rest is the instance's."""
    api, store = served
    iid = started(api, "parallel_review")["instance_id"]
    snap = api.post(f"{GOV}/snapshot", json={"instance_id": iid, "context": "legal"})
    assert snap.status_code == 200, snap.text
    written = api.post(f"{GOV}/inject", json={"instance_id": iid, "context": "legal", "values": {"note": "x"}})
    assert written.status_code == 200, written.text
    back = api.post(f"{GOV}/rollback", json={"instance_id": iid, "snapshot_id": snap.json()["snapshot_id"]})
    assert back.status_code == 200, back.text
    doc = back.json()
    legal = snap.json()["context"]
    assert doc["context"] == legal != "main" and doc["layers"]["L4"]["_branch_id"] == "legal"
    assert "note" not in json.dumps(doc["layers"])
    inspected, _ = cli_json(store, "inspect", iid, "--context", "legal")
    assert doc["layers"] == inspected["layers"]
    assert doc["instance_id"] == iid and [w["task_id"] for w in doc["waiting_for"]] == ["legal", "finance"]


# ===== (c) a uuid that never was a task of the instance is a typo ================================

def _done(api: httpx.Client, process_id: str, task: str) -> tuple[str, str]:
    doc = started(api, process_id)
    (waiting,) = doc["waiting_for"]
    assert waiting["task_id"] == task
    done = api.post(f"/api/instances/{doc['instance_id']}/resume",
                    json={"answers": {"user_tasks": {waiting["id"]: {"ok": True}}}})
    assert done.status_code == 200 and done.json()["status"] == "completed", done.text
    return doc["instance_id"], waiting["id"]


@pytest.mark.parametrize(("process_id", "task"), [("approve", "review"), ("nested_review", "inner_review")])
def test_resume_of_a_completed_instance_checks_a_task_uuid_against_its_tasks(
        served: tuple[httpx.Client, str], process_id: str, task: str) -> None:
    api, store = served
    iid, former = _done(api, process_id, task)
    stranger = str(uuid.uuid4())
    # REST: 400 naming the stranger; the former id is only too late
    typo = api.post(f"/api/instances/{iid}/resume", json={"answers": {"user_tasks": {stranger: {"ok": True}}}})
    assert typo.status_code == 400 and stranger in typo.text and iid in typo.text, typo.text
    late = api.post(f"/api/instances/{iid}/resume", json={"answers": {"user_tasks": {former: {"ok": True}}}})
    assert late.status_code == 200 and any(f"{former!r} was not used" in n for n in late.json()["notices"]), late.text
    # CLI: exit 2 naming it, stdout one JSON document; the former id exits 0
    doc, _ = cli_json(store, "resume", iid, "--answer", f'{stranger}={{"ok": true}}', code=2)
    assert stranger in doc["error"]["message"] and doc["error"]["instance_status"] == "completed"
    _, said = cli_json(store, "resume", iid, "--answer", f'{former}={{"ok": true}}')
    assert f"{former!r} was not used" in said
    # nothing of it changed
    assert api.get(f"/api/instances/{iid}").json()["status"] == "completed"


def test_engine_resume_of_a_completed_instance_refuses_a_stranger_uuid(tmp_path: Path) -> None:
    engine = Engine(store=f"sqlite:///{tmp_path / 'e.db'}")
    instance = engine.run(engine.start(load_process(APPROVE)))
    (waiting,) = instance.waiting_for
    instance = engine.resume(instance, answers={"user_tasks": {waiting["id"]: {"ok": True}}})
    assert instance.status == "completed"
    stranger = str(uuid.uuid4())
    with pytest.raises(InvalidAnswer, match=stranger):
        engine.resume(instance.id, answers={"user_tasks": {stranger: {"ok": True}}})
    again = engine.resume(instance.id, answers={"user_tasks": {waiting["id"]: {"ok": True}}})
    assert again.status == "completed" and any(f"{waiting['id']!r} was not used" in n for n in again.notices)
