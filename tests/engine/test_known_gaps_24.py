"""Gaps closed in round 24.

(a) ``layerflow rollback ID SNAP --json`` gave ``layers`` as the list of the restored layers' names,
    while README says every command's ``--json`` has the shape of DESIGN.md "Interfaces" (``layers``
    a map of each layer's contents, as ``run``, ``resume`` and ``inspect`` give it). It now gives
    the instance's document for the context rolled back (``layers`` its contents after the
    rollback), the restored layers' names under ``restored_layers``; the other rollback fields
    (``snapshot_id``, ``event_seq``, ``tokens_before``, ``tokens_after``, ...) are as before. The
    REST and model-tool rollback answers are unchanged (not a ``--json`` document).
(b) A top-level conditional start event whose condition reads a name nothing in the process sets got
    ``condition_name_never_set`` from validate, whose advice ("set it in a script or form before the
    event") cannot be followed: nothing runs before a process's start. Its condition is fed by the
    start data by design, and ``run`` says at once that the instance waits at the start for it, so
    the warning was noise; README listed only catch, boundary and event-sub-process starts. It is
    no longer given for the start of a process (an event sub-process's start still gets it).
(c) ``layerflow resume`` of a completed instance with a user-task answer keyed by a name that is no
    user task of the process (a typo) exited 0 with a "not used" note. README's typo rule (exit 2,
    naming it and the process's user tasks) now applies there too; an answer for a user task the
    process has (an answers file reused for several instances) is still "not used", exit 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine import Engine, load_process
from engine.governance import InvalidAnswer
from engine.validate import validate_process

from engine_helpers import cli_in_a_tmp_store, run_json

cli = cli_in_a_tmp_store

HERE = Path(__file__).parent / "gaps24"
APPROVE = HERE / "approve.bpmn"


def test_rollback_json_layers_is_the_map_of_layer_contents(cli: Any) -> None:
    waiting = run_json(cli, "run", str(APPROVE), code=3)
    iid = waiting["instance_id"]
    snap = run_json(cli, "snapshot", iid)["snapshot_id"]
    run_json(cli, "resume", iid, "--set", "extra=1", code=3)
    assert "extra" in json.dumps(run_json(cli, "inspect", iid)["layers"])
    back = run_json(cli, "rollback", iid, snap)
    assert set(back["layers"]) == {"L0", "L1", "L2", "L3", "L4", "L5"}
    assert back["layers"] == run_json(cli, "inspect", iid)["layers"]
    assert "extra" not in json.dumps(back["layers"])
    assert back["restored_layers"] == ["L2", "L3", "L4", "L5"]
    assert back["snapshot_id"] == snap and back["instance_id"] == iid and back["status"] == "waiting"
    assert back["tokens"] == back["tokens_after"]
    only = run_json(cli, "rollback", iid, snap, "--layers", "L3")
    assert only["restored_layers"] == ["L3"] and set(only["layers"]) == set(back["layers"])


def _never_set(path: Path) -> list[Any]:
    return [p for p in validate_process([str(path)], None).problems if p.code == "condition_name_never_set"]


def test_top_level_conditional_start_gets_no_condition_name_never_set(tmp_path: Path) -> None:
    assert _never_set(HERE / "cond_start.bpmn") == []
    # the same condition on an event sub-process's start still warns
    text = (HERE / "cond_start.bpmn").read_text().replace(
        '<bpmn:endEvent id="end"/>',
        '<bpmn:endEvent id="end"/><bpmn:subProcess id="esp" triggeredByEvent="true"><bpmn:startEvent id="esp_start">'
        '<bpmn:conditionalEventDefinition id="c2"><bpmn:condition>alarm == True</bpmn:condition>'
        '</bpmn:conditionalEventDefinition></bpmn:startEvent><bpmn:sequenceFlow id="e1" sourceRef="esp_start" '
        'targetRef="esp_end"/><bpmn:endEvent id="esp_end"/></bpmn:subProcess>')
    path = tmp_path / "cond_start_esp.bpmn"
    path.write_text(text)
    assert [p.element_id for p in _never_set(path)] == ["esp_start"]


@pytest.fixture
def done(cli: Any) -> tuple[str, str]:
    waiting = run_json(cli, "run", str(APPROVE), code=3)
    iid, wait_id = waiting["instance_id"], waiting["waiting_for"][0]["id"]
    run_json(cli, "resume", iid, "--answer", 'review={"ok": true}')
    return iid, wait_id


def test_resume_of_a_completed_instance_refuses_a_user_task_typo(cli: Any, done: tuple[str, str],
                                                                 tmp_path: Path) -> None:
    done, wait_id = done
    typo = cli("resume", done, "--answer", 'reveiw={"ok": true}')
    assert typo.exit_code == 2, (typo.stdout, typo.stderr)
    assert "reveiw" in typo.stderr and "'review'" in typo.stderr
    answers = tmp_path / "answers.json"
    answers.write_text(json.dumps({"user_tasks": {"reveiw": {"ok": True}}}))
    doc = run_json(cli, "resume", done, "--answers", str(answers), code=2)
    assert "reveiw" in doc["error"]["message"] and doc["error"]["instance_status"] == "completed"
    # a real task's answer (a file reused for several instances) is only not used
    answers.write_text(json.dumps({"user_tasks": {"review": {"ok": True}}}))
    kept = cli("resume", done, "--answers", str(answers))
    assert kept.exit_code == 0 and "'review' was not used" in kept.stderr
    # so is one keyed by the waiting_for id the task had (a retried request): too late, not a typo
    late = cli("resume", done, "--answer", f'{wait_id}={{"ok": true}}')
    assert late.exit_code == 0 and f"{wait_id!r} was not used" in late.stderr, late.stderr


def test_engine_resume_of_a_completed_instance_refuses_a_user_task_typo(tmp_path: Path) -> None:
    engine = Engine(store=f"sqlite:///{tmp_path / 'e.db'}")
    instance = engine.start(load_process(APPROVE))
    instance = engine.run(instance)
    instance = engine.resume(instance, answers={"user_tasks": {"review": {"ok": True}}})
    assert instance.status == "completed"
    with pytest.raises(InvalidAnswer, match="reveiw"):
        engine.resume(instance.id, answers={"user_tasks": {"reveiw": {"ok": True}}})
    again = engine.resume(instance.id, answers={"user_tasks": {"review": {"ok": True}}})
    assert again.status == "completed" and any("'review' was not used" in n for n in again.notices)


def test_rest_resume_of_a_completed_instance_refuses_a_user_task_typo(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from engine.api import create_app

    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "approve.bpmn").write_text(APPROVE.read_text())
    auth = {"Authorization": "Bearer gaps24-token"}
    with TestClient(create_app("memory://", catalog, "gaps24-token")) as client:
        iid = client.post("/api/instances", json={"process_id": "approve"}, headers=auth).json()["instance_id"]
        done = client.post(f"/api/instances/{iid}/resume", headers=auth,
                           json={"answers": {"user_tasks": {"review": {"ok": True}}}})
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        typo = client.post(f"/api/instances/{iid}/resume", headers=auth,
                           json={"answers": {"user_tasks": {"reveiw": {"ok": True}}}})
        assert typo.status_code == 400 and "reveiw" in typo.text and "'review'" in typo.text, typo.text
        again = client.post(f"/api/instances/{iid}/resume", headers=auth,
                            json={"answers": {"user_tasks": {"review": {"ok": True}}}})
        assert again.status_code == 200 and any("'review' was not used" in n for n in again.json()["notices"])
