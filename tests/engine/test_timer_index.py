"""``Engine.due_timers`` on the stores' timer index (``Store.due_instances``), on memory, sqlite
and redis: it reads the record heads of only the instances whose time has come, returns what
the full scan returns (items, order, skips), and follows each instance through its life."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from context_layers.stores import InstanceRecords
from engine import Engine, load_process
from stores.conftest import backend, forget_timer_index, indexed  # noqa: F401 - the backend fixture
from test_due_timers import HOUR, Clock, person_process, timer_process


class CountingRecords(InstanceRecords):
    """The engine's record view, counting the record heads it reads."""

    heads_read = 0

    def load_head(self, instance_id: str) -> dict[str, Any]:
        self.heads_read += 1
        return super().load_head(instance_id)


class ScanOnly:
    """An engine store without a timer index: ``due_timers`` scans it, as it did before the index."""

    def __init__(self, records: InstanceRecords) -> None:
        self.records = records

    def create(self, record: Any) -> int:
        return self.records.create(record)

    def load(self, instance_id: str) -> dict[str, Any]:
        return self.records.load(instance_id)

    def save(self, record: Any, expected_version: int) -> int:
        return self.records.save(record, expected_version)

    def list(self) -> list[dict[str, Any]]:
        return self.records.list()


def failing_timer_process(tmp_path: Path) -> Path:
    """Waits an hour, then fails: its instance goes to status error when the timer fires."""
    path = timer_process(tmp_path, "fails_later")
    path.write_text(path.read_text(encoding="utf-8").replace("done = True", "broken = 1 / 0"), encoding="utf-8")
    return path


@pytest.fixture
def clock() -> Clock:
    return Clock(float(int(time.time())))  # SpiffWorkflow compares timers with the wall clock too


def test_due_timers_reads_only_the_due_instances_and_returns_what_the_scan_returns(backend, tmp_path, clock):
    records = CountingRecords(backend.open())
    engine = Engine(records, clock=clock)
    scan = Engine(ScanOnly(InstanceRecords(backend.open())), clock=clock)
    hour, person = load_process(timer_process(tmp_path)), load_process(person_process(tmp_path))
    early = [engine.run(engine.start(hour, {})) for _ in range(3)]  # the same due time: ties
    clock.now += HOUR / 2
    late = [engine.run(engine.start(hour, {})) for _ in range(12)]
    people = [engine.run(engine.start(person, {})) for _ in range(3)]
    assert {i.status for i in early + late + people} == {"waiting"}

    records.heads_read = 0
    assert engine.due_timers() == [] and records.heads_read == 0, "nothing due: no record read"
    clock.now += HOUR / 2 + 1
    due = engine.due_timers()
    assert sorted(d["instance_id"] for d in due) == sorted(i.id for i in early)
    assert records.heads_read == 3, "the heads of the 3 due instances, of 18 waiting"
    assert due == scan.due_timers(), "items, versions and order as the full scan gives them"
    records.heads_read = 0
    assert engine.due_timers() == due and records.heads_read == 0, "unchanged since: no head read again"

    clock.now += HOUR
    assert engine.due_timers() == scan.due_timers() and len(engine.due_timers()) == 15


def test_the_index_follows_each_instance_through_its_life(backend, tmp_path, clock):
    store = backend.open()
    engine = Engine(store, clock=clock)
    hour = load_process(timer_process(tmp_path))
    fired, cancelled, deleted = (engine.run(engine.start(hour, {})) for _ in range(3))
    fails = engine.run(engine.start(load_process(failing_timer_process(tmp_path)), {}))
    person = engine.run(engine.start(load_process(person_process(tmp_path)), {}))
    assert indexed(backend) == {fired.id, cancelled.id, deleted.id, fails.id}, "a person's wait is not indexed"

    engine.cancel(cancelled, reason="customer withdrew")
    assert store.delete(deleted.id)
    assert indexed(backend) == {fired.id, fails.id}
    clock.now += HOUR + 1
    assert {d["instance_id"] for d in engine.due_timers()} == {fired.id, fails.id}
    assert engine.resume(engine.load(fired.id)).status == "completed"
    assert engine.resume(engine.load(fails.id)).status == "error"
    assert indexed(backend) == set() and engine.due_timers() == []
    assert engine.load(person.id).status == "waiting"


@pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)  # memory holds nothing older
def test_timers_saved_before_the_index_existed_are_found(backend, tmp_path, clock):
    engine = Engine(backend.open(), clock=clock)
    hour = load_process(timer_process(tmp_path))
    waiting = [engine.run(engine.start(hour, {})) for _ in range(2)]
    clock.now += HOUR / 2
    not_yet = engine.run(engine.start(hour, {}))
    forget_timer_index(backend)
    clock.now += HOUR / 2 + 1
    later = Engine(backend.open(), clock=clock)  # another process, after the upgrade
    assert sorted(d["instance_id"] for d in later.due_timers()) == sorted(i.id for i in waiting)
    assert indexed(backend) == {i.id for i in (*waiting, not_yet)}
