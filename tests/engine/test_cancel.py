"""Cancelling an instance: an unfinished instance stops for good, with who and why on its
tape; nothing of it runs again (answers, events, timers, resume, governance changes are
refused), its pending confirmations close, and the cancelled state survives a reload.
Through the Python API, the CLI, the REST API (real HTTP) and a worker's view."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from engine import Engine, load_process
from engine.api import create_app
from engine.cli import main
from engine.governance import GovernanceService, InjectArgs, InstanceStateError
from engine.worker import WorkerStats, _run_to_rest
from engine_helpers import script_task, write_process
from governance_helpers import TOKEN
from governance_helpers import LOAN_CONFLICT, NOTES, ServerThread, make_catalog

EXAMPLES = Path(__file__).resolve().parents[2] / "bpmn_examples"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USER_TASK = '<bpmn:userTask id="approve" name="Approve"/>'


def waiting_on_a_user_task(tmp_path: Path, engine: Engine):
    bpmn = write_process(tmp_path, "cancel_me", [script_task("prepare", "prepared = True"), USER_TASK,
                                                 script_task("finish", "done = approved")])
    instance = engine.run(engine.start(load_process(bpmn), {"applicant": "A-1"}))
    assert instance.status == "waiting"
    return instance


def test_a_waiting_instance_is_cancelled_for_good(tmp_path: Path) -> None:
    now = [5000.0]
    engine = Engine("memory://", clock=lambda: now[0])
    instance = waiting_on_a_user_task(tmp_path, engine)
    version = instance.version
    cancelled = engine.cancel(instance, reason="duplicate application", actor="ops:ann")
    assert cancelled.status == "cancelled" and cancelled.waiting_for == [] and cancelled.version > version
    assert cancelled.cancelled == {"by": "ops:ann", "reason": "duplicate application", "time": 5000.0,
                                   "status": "waiting"}
    (note,) = [e for e in cancelled.main.tape if e.data.get("note") == "cancelled"]
    assert note.actor == "ops:ann" and note.data["reason"] == "duplicate application"
    assert note.data["status"] == "waiting" and len(note.data["waiting_for"]) == 1
    assert cancelled.main.resolve("prepared") is True  # nothing is deleted

    loaded = engine.load(instance.id)  # survives a reload, as the same document
    doc = loaded.to_document()
    assert doc["status"] == "cancelled" and doc["cancelled"]["reason"] == "duplicate application"
    assert doc["waiting_for"] == [] and doc["error"] is None
    assert loaded.workflow.is_completed()  # SpiffWorkflow's tasks are cancelled too
    tape = loaded.tape_length()

    refused = [
        lambda i: engine.complete_user_task(i, "approve", {"approved": True}),
        lambda i: engine.resume(i, answers={"user_tasks": {"approve": {"approved": True}}}),
        lambda i: engine.send_event(i, "anything", {}),
        lambda i: engine.cancel(i, reason="again"),
    ]
    for attempt in refused:
        with pytest.raises(InstanceStateError, match="cancel"):
            attempt(engine.load(instance.id))
    again = engine.run(engine.load(instance.id))  # a run (a worker's, a timer's) leaves it as it is
    assert again.status == "cancelled" and again.tape_length() == tape
    assert engine.load(instance.id).version == again.version


def test_only_an_unfinished_instance_with_a_reason_is_cancelled(tmp_path: Path) -> None:
    engine = Engine("memory://")
    bpmn = write_process(tmp_path, "quick", [script_task("only", "x = 1")])
    done = engine.run(engine.start(load_process(bpmn)))
    with pytest.raises(InstanceStateError, match="is completed"):
        engine.cancel(done, reason="too late")
    waiting = waiting_on_a_user_task(tmp_path, engine)
    with pytest.raises(InstanceStateError, match="reason"):
        engine.cancel(waiting, reason="  ")
    assert engine.load(waiting.id).status == "waiting"


def test_a_failed_instance_is_cancelled_and_keeps_what_it_was(tmp_path: Path) -> None:
    engine = Engine("memory://")
    bpmn = write_process(tmp_path, "broken", [script_task("boom", "x = 1 / 0")])
    failed = engine.run(engine.start(load_process(bpmn)))
    assert failed.status == "error"
    cancelled = engine.cancel(failed, reason="the script is being rewritten")
    assert cancelled.cancelled["status"] == "error" and cancelled.to_document()["error"] is None
    with pytest.raises(InstanceStateError, match="cancelled"):
        engine.resume(engine.load(failed.id))


def test_pending_confirmations_close_and_governance_changes_are_refused(tmp_path: Path) -> None:
    service = GovernanceService(Engine("memory://"), make_catalog(tmp_path))
    from engine.governance import StartArgs

    doc = service.start(StartArgs(process_id="loan_approval", data=LOAN_CONFLICT))
    iid = doc["instance_id"]
    assert [c["id"] for c in service.confirmations()] == ["review_join/approval_status"]
    from engine.governance import CancelArgs

    out = service.cancel(iid, CancelArgs(reason="applicant withdrew"), actor="officer")
    assert out["status"] == "cancelled" and service.confirmations() == []
    assert service.confirmations(iid) == []
    (entry,) = out["confirmations"]
    assert entry["cancelled"] is True and entry.get("answer") is None
    # the conflict it asked about was never settled, and says why
    assert [(c["key"], c["resolution"], c.get("cancelled")) for c in out["conflicts"]] == [
        ("approval_status", None, True)]
    with pytest.raises(InstanceStateError, match="cancelled by 'officer'"):
        service.inject(iid, InjectArgs(values={"note": "late"}))
    from engine.governance import AnswerArgs

    with pytest.raises(Exception) as err:
        service.answer("review_join/approval_status", AnswerArgs(value="approved", instance_id=iid))
    assert getattr(err.value, "kind", None) in ("not_found", "invalid_state"), err.value


def test_a_worker_leaves_a_cancelled_instance_at_rest(tmp_path: Path) -> None:
    engine = Engine("memory://")
    instance = engine.cancel(waiting_on_a_user_task(tmp_path, engine), reason="stop")
    stats = WorkerStats("w1")
    _run_to_rest(engine, "1-0", instance.id, stats, wake="timer")
    assert stats.ran == 0 and stats.statuses == {"cancelled": 1}
    assert engine.load(instance.id).version == instance.version


def test_a_cancelled_instance_has_no_due_timer(tmp_path: Path) -> None:
    import time

    now = [float(int(time.time()))]
    engine = Engine("memory://", clock=lambda: now[0])
    instance = engine.run(engine.start(load_process(EXAMPLES / "timer_boundary.bpmn")))
    now[0] += 7200.0
    assert [t["instance_id"] for t in engine.due_timers()] == [instance.id]
    engine.cancel(instance, reason="no longer needed")
    assert engine.due_timers() == []


def test_cancel_from_the_cli(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path / 'cli.db'}"
    engine = Engine(store)
    iid = waiting_on_a_user_task(tmp_path, engine).id
    runner = CliRunner()
    missing = runner.invoke(main, ["cancel", iid, "--store", store])
    assert missing.exit_code == 2 and "--reason" in missing.output
    r = runner.invoke(main, ["cancel", iid, "--reason", "duplicate", "--store", store, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["status"] == "cancelled" and doc["cancelled"]["by"] == "cli"
    again = runner.invoke(main, ["cancel", iid, "--reason", "twice", "--store", store])
    assert again.exit_code == 2 and "is cancelled" in again.output
    resumed = runner.invoke(main, ["resume", iid, "--answer", 'approve={"approved": true}', "--store", store,
                                   "--json"])
    assert resumed.exit_code == 2
    error = json.loads(resumed.stdout)["error"]
    assert error["kind"] == "invalid_state" and "cancelled" in error["message"] and error["instance_id"] == iid
    listed = runner.invoke(main, ["list", "--store", store])
    assert f"{iid}" in listed.output and "cancelled" in listed.output
    unknown = runner.invoke(main, ["cancel", "nosuch", "--reason", "x", "--store", store])
    assert unknown.exit_code == 2 and "no instance 'nosuch'" in unknown.output


def test_cancel_over_http(tmp_path: Path) -> None:
    with ServerThread(create_app("memory://", make_catalog(tmp_path), TOKEN)) as server, \
            httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        doc = c.post("/api/instances", json={"process_id": "notes_review", "data": NOTES}).json()
        iid = doc["instance_id"]
        assert c.post(f"/api/instances/{iid}/cancel", json={"reason": ""}).status_code == 422
        stale = c.post(f"/api/instances/{iid}/cancel", json={"reason": "x", "expected_version": doc["version"] + 1})
        assert stale.status_code == 409 and stale.json()["error"]["kind"] == "version_conflict"
        r = c.post(f"/api/instances/{iid}/cancel", json={"reason": "customer asked", "user": "Ann",
                                                         "expected_version": doc["version"]})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "cancelled" and r.json()["cancelled"]["by"] == "Ann"
        for path, body in ((f"/api/instances/{iid}/cancel", {"reason": "again"}),
                           (f"/api/instances/{iid}/user-tasks/approve", {"data": {"decision": "approved"}}),
                           (f"/api/instances/{iid}/resume", {}),
                           ("/api/context-governance/inject", {"instance_id": iid, "values": {"k": 1}})):
            refused = c.post(path, json=body)
            assert refused.status_code == 409 and refused.json()["error"]["kind"] == "invalid_state", (path, refused.text)
        assert c.get(f"/api/instances/{iid}").json()["status"] == "cancelled"
        assert c.post("/api/instances/nosuch/cancel", json={"reason": "x"}).status_code == 404
        assert c.post(f"/api/instances/{iid}/cancel", json={"reason": "x"}, headers={"Authorization": ""}).status_code == 401
        notes = c.get(f"/api/instances/{iid}/tape", params={"kind": "note"}).json()["events"]
        assert [(e["actor"], e["data"]["reason"]) for e in notes if e["data"].get("note") == "cancelled"] == \
            [("Ann", "customer asked")]
