"""Stores and save / resume: a waiting instance survives the process that ran it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from context_layers.errors import ContextKeyError, VersionConflict
from engine import Engine, load_process, open_store
from context_layers.stores import InstanceExists, MemoryStore
from engine.store import InstanceRecords

from engine_helpers import EXAMPLES, LOAN, LOAN_CONFLICT, ROOT


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path: Path):
    return open_store("memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'store.db'}")


def _record(i: str = "a", status: str = "running") -> dict[str, Any]:
    return {"format": 1, "id": i, "process_id": "p", "status": status, "updated": 1.0, "payload": [1, 2]}


def test_store_contract(store) -> None:
    assert store.create(_record()) == 1
    assert store.load("a")["payload"] == [1, 2] and store.load("a")["version"] == 1
    assert store.save({**_record(status="waiting"), "payload": [3]}, 1) == 2
    assert store.load("a")["payload"] == [3]
    with pytest.raises(VersionConflict, match="Reload it"):
        store.save(_record(), 1)                 # a stale copy
    with pytest.raises(InstanceExists, match="already exists"):
        store.create(_record())                  # the id exists
    with pytest.raises(ContextKeyError):
        store.load("missing")
    assert [(r["id"], r["status"], r["version"]) for r in store.list()] == [("a", "waiting", 2)]


@pytest.mark.parametrize(("url", "backend"), [("memory://", "MemoryStore"), (None, "MemoryStore"),
                                              ("sqlite:///{tmp}/x.db", "SQLiteStore")])
def test_store_by_url(url, backend, tmp_path: Path) -> None:
    store = open_store(url.format(tmp=tmp_path) if url else url)
    assert isinstance(store, InstanceRecords) and type(store.store).__name__ == backend


def test_a_stale_instance_cannot_overwrite_a_newer_save(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    engine = Engine(url)
    instance = engine.run(engine.start(load_process(LOAN), LOAN_CONFLICT))
    other = Engine(url).load(instance.id)
    Engine(url).answer_confirmation(other, "review_join/approval_status", "approved")
    with pytest.raises(VersionConflict):
        engine.answer_confirmation(instance, "review_join/approval_status", "rejected")


def test_a_resume_with_nothing_to_do_writes_nothing(tmp_path: Path) -> None:
    """A poller resuming a waiting instance (nothing answered, no timer due) must not make
    another client's copy stale: no save, no new version, the same tapes."""
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    engine = Engine(url)
    instance = engine.run(engine.start(load_process(LOAN), LOAN_CONFLICT))
    version, tape = instance.version, instance.tape_length()
    held = Engine(url).load(instance.id)  # a console holding the instance
    for _ in range(2):
        again = Engine(url).resume(Engine(url).load(instance.id))
        assert again.status == "waiting" and again.version == version and again.tape_length() == tape
    assert Engine(url).load(instance.id).version == version
    done = Engine(url).answer_confirmation(held, "review_join/approval_status", "pending_dual_approval")
    assert done.status == "completed" and done.version > version
    final = done.version
    assert Engine(url).resume(Engine(url).load(instance.id)).version == final  # completed: nothing to run
    assert Engine(url).load(instance.id).status == "completed"


def _normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """Contexts and tapes without wall-clock times."""
    out = {}
    for name, ctx in doc.items():
        out[name] = {"state": ctx["state"], "tape": [{k: v for k, v in e.items() if k != "time"} for e in ctx["tape"]]}
    return out


SNAPSHOT = """
import json, sys
from engine import Engine
eng = Engine(sys.argv[1])
inst = eng.load(sys.argv[2])
print(json.dumps({n: {"state": c.state_json(), "tape": c.tape.to_list()} for n, c in inst.contexts.items()}))
"""

START = """
import sys
from engine import Engine, load_process
eng = Engine(sys.argv[1])
inst = eng.run(eng.start(load_process(sys.argv[2]), {"title": "T"}))
print(inst.id, inst.status)
"""

FINISH = """
import sys
from engine import Engine
eng = Engine(sys.argv[1])
inst = eng.load(sys.argv[2])
inst = eng.complete_user_task(inst, "review", {"approved": True, "reviewer": "ann"})
print(inst.status)
"""


def _py(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.slow
def test_save_wait_exit_resume_in_a_new_process_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    bpmn = str(EXAMPLES / "parallel_user_task.bpmn")
    instance_id, status = _py(START, url, bpmn).split()
    assert status == "waiting"
    assert _py(FINISH, url, instance_id) == "completed"
    resumed = _normalized(json.loads(_py(SNAPSHOT, url, instance_id)))

    engine = Engine()
    straight = engine.run(engine.start(load_process(bpmn), {"title": "T"}),
                          answers={"user_tasks": {"review": {"approved": True, "reviewer": "ann"}}})
    assert straight.status == "completed"
    uninterrupted = _normalized({n: {"state": c.state_json(), "tape": c.tape.to_list()}
                                 for n, c in straight.contexts.items()})
    assert resumed == uninterrupted


def test_every_activity_is_saved(tmp_path: Path) -> None:
    class Counting(InstanceRecords):
        saves: list[str] = []

        def save(self, record, expected_version):  # type: ignore[override]
            self.saves.append(record["status"])
            return super().save(record, expected_version)

    store = Counting(MemoryStore())
    engine = Engine(store)
    instance = engine.run(engine.start(load_process(EXAMPLES / "nested_parallel.bpmn")))
    activities = [k for k in instance.main.layer("L3") if k.startswith("activity:")]
    assert len(store.saves) >= len(activities) + 1  # one per activity, one at the end
    loaded = engine.load(instance.id)
    assert loaded.main == instance.main and set(loaded.contexts) == set(instance.contexts)
    assert loaded.status == "completed"


def test_a_loaded_waiting_instance_answers_like_the_original(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lf.db'}"
    engine = Engine(url)
    instance = engine.run(engine.start(load_process(LOAN), LOAN_CONFLICT))
    assert instance.status == "waiting"
    loaded = Engine(url).load(instance.id)
    assert loaded.waiting_for == instance.waiting_for and loaded.conflicts == instance.conflicts
    done = Engine(url).answer_confirmation(loaded, "review_join/approval_status", "pending_dual_approval")
    assert done.status == "completed"
    assert done.main.resolve("disbursement") == "hold_for_second_approval"


def test_start_can_choose_the_store(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chosen.db'}"
    engine = Engine("memory://")
    instance = engine.run(engine.start(load_process(LOAN), LOAN_CONFLICT, store=url))
    assert instance.status == "waiting"
    stored = Engine(url).load(instance.id)        # it lives in the chosen store, saved after every step
    assert stored.status == "waiting" and stored.main == instance.main
    with pytest.raises(ContextKeyError):
        engine.load(instance.id)                  # not in the engine's own store


FAIL_BESIDE_A_PERSON = """<?xml version="1.0" encoding="UTF-8"?>
<bpmn:definitions xmlns:bpmn="http://www.omg.org/spec/BPMN/20100524/MODEL" id="d" targetNamespace="x">
  <bpmn:process id="beside" isExecutable="true">
    <bpmn:startEvent id="start"/>
    <bpmn:parallelGateway id="split"/>
    <bpmn:scriptTask id="bad"><bpmn:script>y = 1 / x</bpmn:script></bpmn:scriptTask>
    <bpmn:userTask id="ask"/>
    <bpmn:parallelGateway id="join"/>
    <bpmn:endEvent id="end"/>
    <bpmn:sequenceFlow id="f1" sourceRef="start" targetRef="split"/>
    <bpmn:sequenceFlow id="f2" sourceRef="split" targetRef="bad"/>
    <bpmn:sequenceFlow id="f3" sourceRef="split" targetRef="ask"/>
    <bpmn:sequenceFlow id="f4" sourceRef="bad" targetRef="join"/>
    <bpmn:sequenceFlow id="f5" sourceRef="ask" targetRef="join"/>
    <bpmn:sequenceFlow id="f6" sourceRef="join" targetRef="end"/>
  </bpmn:process>
</bpmn:definitions>
"""


def test_a_failed_instance_takes_no_answer_until_resumed(tmp_path: Path) -> None:
    """A user task beside a failed activity was completed, the run went on to the join that
    can never fire, and the activity's error was replaced by 'neither completed nor waits'."""
    from engine import Engine, load_process
    from engine.governance import InstanceStateError

    path = tmp_path / "beside.bpmn"
    path.write_text(FAIL_BESIDE_A_PERSON, encoding="utf-8")
    engine = Engine("memory://")
    failed = engine.run(engine.start(load_process(path), {}))
    assert failed.status == "error" and "NameError" in failed.error["message"]
    version, tape = failed.version, failed.tape_length()
    with pytest.raises(InstanceStateError, match=r"is in error \(activity 'bad' .*resume it first.*complete 'ask'"):
        engine.complete_user_task(failed, "ask", {"ok": True})
    assert failed.status == "error" and "NameError" in failed.error["message"]
    assert (failed.version, failed.tape_length()) == (version, tape)  # nothing ran, nothing saved
    engine.inject(failed, {"x": 2})  # into the failed task's context
    done = engine.resume(failed, answers={"user_tasks": {"ask": {"ok": True}}})
    assert done.status == "completed" and done.error is None
    assert done.main.get("y") == 0.5 and done.main.get("ok") is True


class _Blip(MemoryStore):
    """A store whose ``nth`` save does not answer (a dropped connection), and then answers again."""

    def __init__(self, nth: int) -> None:
        super().__init__()
        self.saves, self.nth = 0, nth

    def save(self, *args: Any, **kwargs: Any) -> int:
        self.saves += 1
        if self.saves == self.nth:
            from context_layers.stores import StoreUnavailable

            raise StoreUnavailable("the store did not answer (scripted)")
        return super().save(*args, **kwargs)  # type: ignore[no-any-return]


def test_a_store_that_misses_one_save_mid_run_leaves_the_instance_to_retry_not_in_error() -> None:
    """A save between two activities that the store does not answer ends the run with the store's
    error (a worker leaves its entry pending and retries); the instance stays as last committed.
    It used to become the instance's own error, saved as one by the run's last save: a blip of
    Redis put a healthy instance in status ``error`` until someone resumed it by hand."""
    from context_layers.stores import StoreUnavailable

    blip = _Blip(nth=2)
    engine = Engine(blip)
    process = load_process(ROOT / "tests" / "stores" / "fixtures" / "slow_process.bpmn")
    instance = engine.start(process, {"amount": 3})
    with pytest.raises(StoreUnavailable, match="scripted"):
        engine.run(instance)
    record, version = blip.load(instance.id)
    assert (record["status"], version) == ("running", 2), "only what was committed before the blip stands"
    retried = engine.run(engine.load(instance.id))
    assert retried.status == "completed" and retried.error is None
    plain = Engine("memory://")
    reference = plain.run(plain.start(process, {"amount": 3}))
    assert retried.main == reference.main
