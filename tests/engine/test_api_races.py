"""The REST API beside workers and the CLI on one store, with the interleavings forced.

* An answer to a step of an instance that a worker runs right now (it fired a timer and runs
  the activity after it) waits for the worker's lease and is refused once ``lease_wait`` has
  passed: the API never runs the instance beside the worker, so the worker's save is not
  refused behind its back and its activity does not run a second time.
* A second answer to a confirmation (two people at once, a retry) is 409 ``already_answered``
  naming the first answer, not 404.

``tests/stores/test_stress_races.py`` finds these with real processes; these pin them down.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from context_layers.stores import MemoryStore
from engine import Engine, load_process
from engine.api import create_app
from engine.governance import GovernanceService
from engine_helpers import BPMN_HEAD
from governance_helpers import LOAN_CONFLICT, TOKEN, make_catalog

AUTH = {"Authorization": f"Bearer {TOKEN}"}

# a person's step beside a timer; the activity after the timer is a counted handler
PROCESS = BPMN_HEAD.format(pid="beside_timer") + """
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="fork"/>
    <bpmn:userTask id="approve" name="Approve"/>
    <bpmn:intermediateCatchEvent id="later">
      <bpmn:timerEventDefinition><bpmn:timeDuration>"PT1M"</bpmn:timeDuration></bpmn:timerEventDefinition>
    </bpmn:intermediateCatchEvent>
    <bpmn:serviceTask id="after_timer"/>
    <bpmn:parallelGateway id="join"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="fork"/>
    <bpmn:sequenceFlow id="f2" sourceRef="fork" targetRef="approve"/>
    <bpmn:sequenceFlow id="f3" sourceRef="fork" targetRef="later"/>
    <bpmn:sequenceFlow id="f4" sourceRef="later" targetRef="after_timer"/>
    <bpmn:sequenceFlow id="f5" sourceRef="approve" targetRef="join"/>
    <bpmn:sequenceFlow id="f6" sourceRef="after_timer" targetRef="join"/>
    <bpmn:sequenceFlow id="f7" sourceRef="join" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


class Hooked:
    """The handler of ``after_timer``: counts its runs; the first waits until the test lets it go."""

    def __init__(self) -> None:
        self.runs = 0
        self.started = threading.Event()
        self.go = threading.Event()

    def __call__(self, ctx: Any) -> dict[str, Any]:
        self.runs += 1
        if self.runs == 1:
            self.started.set()
            assert self.go.wait(30), "the test never let the handler go"
        return {"after": "done"}


@pytest.fixture
def setup(tmp_path):
    (tmp_path / "beside_timer.bpmn").write_text(PROCESS, encoding="utf-8")
    store = MemoryStore()
    now = [1000.0]
    handler = Hooked()

    def engine() -> Engine:  # one per party: the worker and the API share only the store
        return Engine(store, {"after_timer": handler}, clock=lambda: now[0])

    instance = engine().run(engine().start(load_process(tmp_path / "beside_timer.bpmn")))
    assert [w["kind"] for w in instance.waiting_for] == ["user_task", "timer"]
    now[0] += 120  # the timer is due
    return store, engine, instance.id, handler


def worker_run(store: MemoryStore, engine: Engine, instance_id: str, outcome: dict[str, Any]) -> None:
    """What a worker woken for the due timer does: lease, load, run (the timer fires), save, release."""
    assert store.acquire_lease(instance_id, "worker-1", 30)
    try:
        outcome["status"] = engine.run(engine.load(instance_id)).status
    except Exception as err:  # noqa: BLE001 - the test looks at it
        outcome["error"] = err
    finally:
        store.release_lease(instance_id, "worker-1")


def test_an_answer_while_a_worker_runs_the_instance_waits_and_never_runs_beside_it(setup):
    store, engine, iid, handler = setup
    service = GovernanceService(engine(), lease_wait=0.3)
    outcome: dict[str, Any] = {}
    worker = threading.Thread(target=worker_run, args=(store, engine(), iid, outcome))
    worker.start()
    try:
        assert handler.started.wait(30)  # the worker fired the timer and runs the activity after it
        version = store.load(iid)[1]
        with TestClient(create_app(service, token=TOKEN)) as client:
            refused = client.post(f"/api/instances/{iid}/user-tasks/approve", json={"data": {"ok": True}},
                                  headers=AUTH)
            assert refused.status_code == 409, refused.text
            error = refused.json()["error"]
            assert error["kind"] == "invalid_state" and "worker-1" in error["message"], error
            assert store.load(iid)[1] == version, "nothing was changed"
            handler.go.set()
            worker.join(timeout=30)
            assert outcome == {"status": "waiting"}, outcome  # the worker's save went through
            done = client.post(f"/api/instances/{iid}/user-tasks/approve", json={"data": {"ok": True}},
                               headers=AUTH)
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        assert handler.runs == 1, "the activity after the timer ran again"
        assert store.lease_owner(iid) is None
    finally:
        handler.go.set()
        worker.join(timeout=30)


def test_an_answer_waits_for_a_lease_that_is_given_back_in_time(setup):
    store, engine, iid, handler = setup
    handler.go.set()
    service = GovernanceService(engine(), lease_wait=10)
    assert store.acquire_lease(iid, "worker-1", 30)
    timer = threading.Timer(0.3, store.release_lease, (iid, "worker-1"))
    timer.start()
    with TestClient(create_app(service, token=TOKEN)) as client:
        r = client.post(f"/api/instances/{iid}/user-tasks/approve", json={"data": {"ok": True}}, headers=AUTH)
    timer.join()
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    assert handler.runs == 1 and store.lease_owner(iid) is None


@pytest.mark.parametrize("how", ["confirmation", "resolve"])
def test_a_second_answer_to_a_confirmation_is_409_already_answered(tmp_path, how):
    with TestClient(create_app("memory://", make_catalog(tmp_path), TOKEN)) as client:
        started = client.post("/api/instances", json={"process_id": "loan_approval", "data": LOAN_CONFLICT},
                              headers=AUTH).json()
        iid = started["instance_id"]

        def answer(value: str) -> Any:
            if how == "confirmation":
                return client.post("/api/confirmations/review_join/approval_status", headers=AUTH,
                                   json={"instance_id": iid, "value": value, "user": "ann" if value == "approved"
                                         else "bob"})
            return client.post("/api/context-governance/resolve", headers=AUTH, json={
                "instance_id": iid, "conflict_key": "approval_status", "resolution": value, "reason": "r",
                "user": "ann" if value == "approved" else "bob"})

        first = answer("approved")
        assert first.status_code == 200 and first.json()["status"] == "completed", first.text
        second = answer("rejected")
        assert second.status_code == 409, second.text
        error = second.json()["error"]
        assert error["kind"] == "already_answered", error
        assert '"approved"' in error["message"] and "ann" in error["message"], error
        doc = client.get(f"/api/instances/{iid}", headers=AUTH).json()
        assert doc["layers"]["L3"]["approval_status"] == "approved"


def test_a_started_instance_holds_its_lease_while_the_server_runs_it(tmp_path, monkeypatch):
    """POST /api/instances runs the new instance under its lease, as every other change does:
    a request (or a worker, or `layerflow resume`) that finds the new id while its first
    activities run waits, then gets 409, instead of running beside it."""
    catalog = tmp_path / "catalog"
    catalog.mkdir()
    (catalog / "slow_start.bpmn").write_text(BPMN_HEAD.format(pid="slow_start") + """
    <bpmn:startEvent id="start"/>
    <bpmn:serviceTask id="slow"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="slow"/>
    <bpmn:sequenceFlow id="f2" sourceRef="slow" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
""", encoding="utf-8")
    (catalog / "slow_start.layerflow.yaml").write_text("slow: {handler: slow_start.py:slow}\n")
    (catalog / "slow_start.py").write_text(
        "import os, time\n\n\ndef slow(ctx):\n"
        "    mark = os.environ['SLOW_START_MARK']\n"
        "    open(mark + '.part', 'w').write(ctx.instance_id)\n"
        "    os.replace(mark + '.part', mark)  # the test sees the mark only with the id in it\n"
        "    deadline = time.monotonic() + 30\n"
        "    while not os.path.exists(os.environ['SLOW_START_GO']) and time.monotonic() < deadline:\n"
        "        time.sleep(0.02)\n"
        "    return {'done': True}\n")
    mark, go = tmp_path / "mark", tmp_path / "go"
    monkeypatch.setenv("SLOW_START_MARK", str(mark))
    monkeypatch.setenv("SLOW_START_GO", str(go))
    store = MemoryStore()
    service = GovernanceService(Engine(store), catalog, lease_wait=0.3)
    started: dict[str, Any] = {}
    with TestClient(create_app(service, token=TOKEN)) as client:
        def start() -> None:
            started["response"] = client.post("/api/instances", json={"process_id": "slow_start", "data": {}},
                                              headers=AUTH)

        runner = threading.Thread(target=start)
        runner.start()
        try:
            deadline = time.monotonic() + 30
            while not mark.exists() and time.monotonic() < deadline:
                time.sleep(0.02)
            iid = mark.read_text()
            assert (store.lease_owner(iid) or "").startswith("api-")
            refused = client.post(f"/api/instances/{iid}/cancel", json={"reason": "too early"}, headers=AUTH)
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["kind"] == "invalid_state"
            # refused because the run holds it, not because it completed meanwhile: the request waited
            # lease_wait, not for the whole run (the handler still waits for "go")
            assert "is being run by" in refused.json()["error"]["message"], refused.text
            assert not go.exists() and runner.is_alive()
        finally:
            go.write_text("go")
            runner.join(timeout=30)
    response = started["response"]
    assert response.status_code == 201 and response.json()["status"] == "completed", response.text
    assert store.lease_owner(iid) is None and store.load(iid)[0]["status"] == "completed"
