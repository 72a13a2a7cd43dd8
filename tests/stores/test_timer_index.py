"""The timer index: ``Store.due_instances(until)`` on every backend (``store`` / ``backend``
fixtures in conftest.py), kept in the same write as the record, and filled once for a store
written before it existed."""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from context_layers.errors import VersionConflict
from context_layers.stores import InstanceNotFound, InvalidRecord, TapeSequenceError, open_store
from context_layers.stores.base import DUE_AT_ONCE, TIMER_INDEX, timer_due

from .conftest import REDIS_URL, Backend, forget_timer_index, indexed

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)
NOW = T0.timestamp()


def at(minutes: float) -> str:
    """A due time ``minutes`` after T0, as the engine writes it (``datetime.isoformat()``)."""
    return (T0 + timedelta(minutes=minutes)).isoformat()


def waiting(iid: str, *dues: str | None, status: str = "waiting", person: bool = False, **fields: Any) -> dict:
    """An engine-shaped record waiting for a timer per due time (and for a person)."""
    items: list[dict[str, Any]] = [{"kind": "user_task", "id": "u1", "task_id": "review"}] if person else []
    items += [{"kind": "timer", "id": f"t{n}", "task_id": f"timer_{n}", "due": due} for n, due in enumerate(dues)]
    return {"id": iid, "process_id": "p", "status": status, "engine": {"waiting_for": items}, **fields}


def due_ids(store: Any, until: float | datetime) -> list[str]:
    return [s["instance_id"] for s in store.due_instances(until)]


def minutes(m: float) -> float:
    return NOW + m * 60


# ------------------------------------------------------------------------------ the contract

def test_due_instances_lists_waiting_instances_by_their_earliest_due_time(store):
    store.create(waiting("a", at(10)))
    store.create(waiting("c", at(5)))
    store.create(waiting("b", at(30), at(5), person=True))  # earliest of two timers; a person too
    store.create(waiting("d", person=True))                 # no timer
    store.create(waiting("e", at(1), status="running"))     # not waiting (yet): not listed
    store.create(waiting("f", None, ""))                     # timers without a due time, as the engine lists none
    store.create({"id": "g", "process_id": "p", "status": "waiting"})  # not an engine record
    assert store.due_instances(minutes(4.9)) == []
    assert due_ids(store, minutes(5)) == ["b", "c"], "due at `until` counts; ties by id"
    assert due_ids(store, minutes(10)) == due_ids(store, minutes(60)) == ["b", "c", "a"], "earliest due first"
    assert due_ids(store, T0 + timedelta(minutes=10)) == ["b", "c", "a"], "a datetime bound"
    assert due_ids(store, (T0 + timedelta(minutes=7)).replace(tzinfo=None)) == ["b", "c"], "naive: UTC"
    listed = {s["instance_id"]: s for s in store.list_instances()}
    assert store.due_instances(minutes(60)) == [listed[i] for i in ("b", "c", "a")], "the same summaries"


def test_due_times_in_other_zones_and_without_one_are_placed_in_utc(store):
    store.create(waiting("paris", (T0 + timedelta(minutes=2)).astimezone(timezone(timedelta(hours=1))).isoformat()))
    store.create(waiting("naive", (T0 + timedelta(minutes=1)).replace(tzinfo=None).isoformat()))
    store.create(waiting("zulu", "2026-01-05T09:03:00Z"))
    assert due_ids(store, minutes(3)) == ["naive", "paris", "zulu"]
    assert timer_due(waiting("x", "2026-01-05T10:00:00+01:00")) == NOW


def test_a_timer_due_by_the_records_own_time_is_listed_whatever_the_bound(store):
    """An instance's clock never runs behind its record's ``updated``: a clock ahead saved it after
    its timer's due time without firing it (an inject), so it is due for an engine behind too."""
    store.create(waiting("ahead", at(60), created=minutes(0), updated=minutes(90)))
    store.create(waiting("later", at(120), created=minutes(0), updated=minutes(90)))
    store.create(waiting("plain", at(30), created=minutes(0), updated=minutes(0)))
    assert due_ids(store, minutes(-600)) == ["ahead"]
    assert due_ids(store, minutes(30)) == ["ahead", "plain"]
    assert due_ids(store, minutes(120)) == ["ahead", "plain", "later"]
    assert timer_due(waiting("x", at(60), updated=minutes(60))) == DUE_AT_ONCE  # due at the save's time
    assert timer_due(waiting("x", at(60), updated=minutes(59))) == minutes(60)


def change(store, iid: str, record: dict) -> None:
    store.save(iid, record, store.load(iid)[1])


# what a save (or delete) of instance "a", due at +10, does to the index
LIFECYCLE = [
    ("a later due", lambda s: change(s, "a", waiting("a", at(90))), ["b"], ["b", "a"]),
    ("an earlier due", lambda s: change(s, "a", waiting("a", at(1))), ["a", "b"], ["a", "b"]),
    ("its timer fired", lambda s: change(s, "a", waiting("a", status="running")), ["b"], ["b"]),
    ("now waits for a person", lambda s: change(s, "a", waiting("a", person=True)), ["b"], ["b"]),
    ("completed", lambda s: change(s, "a", waiting("a", at(10), status="completed")), ["b"], ["b"]),
    ("error", lambda s: change(s, "a", waiting("a", status="error", error={"kind": "x"})), ["b"], ["b"]),
    ("cancelled", lambda s: change(s, "a", waiting("a", status="cancelled")), ["b"], ["b"]),
    ("deleted", lambda s: s.delete("a"), ["b"], ["b"]),
    ("tape appended, record unchanged", lambda s: s.append_events("a", "main", [{"seq": 1}]), ["a", "b"],
     ["a", "b"]),
    ("snapshot put, record unchanged", lambda s: s.put_snapshot("a", "s1", {"L0": {}}), ["a", "b"], ["a", "b"]),
]


@pytest.mark.parametrize("what, apply, due_at_15, due_later", LIFECYCLE, ids=[c[0] for c in LIFECYCLE])
def test_every_write_keeps_the_index_of_its_instance(backend, what, apply, due_at_15, due_later):
    store = backend.open()
    store.create(waiting("a", at(10)))
    store.create(waiting("b", at(12)))
    apply(store)
    assert due_ids(store, minutes(15)) == due_at_15
    assert due_ids(store, minutes(120)) == due_later
    assert due_ids(backend.open(), minutes(120)) == due_later, "another handle reads the same index"
    assert indexed(backend) == set(due_later), "no entry left behind"


def test_a_failed_write_leaves_the_index_as_it_was(store):
    store.create(waiting("a", at(10)), tape_appends={"main": [{"seq": 1}]})
    store.save("a", waiting("a", at(20)), 1)
    with pytest.raises(VersionConflict):
        store.save("a", waiting("a", status="completed"), 1)
    with pytest.raises(TapeSequenceError):
        store.save("a", waiting("a", at(1)), 2, {"main": [{"seq": 5}]})
    with pytest.raises(InstanceNotFound):
        store.save("nope", waiting("nope", at(1)), 1)
    assert due_ids(store, minutes(15)) == [] and due_ids(store, minutes(20)) == ["a"]


@pytest.mark.parametrize("bad", ["tomorrow", "2026-13-01T00:00:00", 1767603600, ["2026-01-05"], True])
def test_a_due_time_that_is_not_iso_text_is_refused_naming_the_instance_and_field(store, bad):
    with pytest.raises(InvalidRecord) as err:
        store.create(waiting("inst-bad", at(5), bad))
    text = str(err.value)
    assert "'inst-bad'" in text and "engine.waiting_for[1].due" in text and repr(bad) in text
    assert "isoformat()" in text, "says what to write"
    assert err.value.kind == "invalid_record"
    assert store.list_instances() == [] and store.due_instances(minutes(60)) == []
    store.create(waiting("inst-bad", at(5)))
    with pytest.raises(InvalidRecord, match=r"engine\.waiting_for\[0\]\.due"):
        store.save("inst-bad", waiting("inst-bad", bad), 1)
    assert store.load("inst-bad") == (waiting("inst-bad", at(5)), 1), "nothing was written"
    assert due_ids(store, minutes(5)) == ["inst-bad"]


def test_waiting_for_that_is_not_a_list_is_refused(store):
    with pytest.raises(InvalidRecord, match=r"'odd': engine.waiting_for is a dict"):
        store.create({"id": "odd", "process_id": "p", "status": "waiting", "engine": {"waiting_for": {"due": at(1)}}})


@pytest.mark.parametrize("until", ["soon", None, float("nan"), False])
def test_until_must_be_a_time(store, until):
    with pytest.raises(TypeError, match="seconds since the epoch"):
        store.due_instances(until)


# ---------------------------------------------------- stores written before the index existed

# a memory store holds nothing from before the timer index
on_disk = pytest.mark.parametrize("backend", ["sqlite", "redis"], indirect=True)


@on_disk
def test_an_older_store_is_indexed_from_its_records_on_the_first_call(backend):
    store = backend.open()
    assert _marker(backend) == str(TIMER_INDEX), "a new store has nothing to fill: it is marked filled at once"
    store.create(waiting("old-due", at(5)))
    store.create(waiting("old-later", at(50)))
    store.create(waiting("old-done", at(1), status="completed"))
    forget_timer_index(backend)
    old = backend.open()
    assert due_ids(old, minutes(10)) == ["old-due"]
    assert due_ids(old, minutes(60)) == ["old-due", "old-later"]
    assert _marker(backend) == str(TIMER_INDEX), "filled once: the next handle reads the index as it is"
    old.save("old-due", waiting("old-due", status="completed"), 1)
    assert due_ids(backend.open(), minutes(60)) == ["old-later"]


def test_a_sqlite_file_from_before_the_index_gets_the_column_and_its_values(tmp_path):
    """A file as the previous layerflow wrote it: no ``due`` column, no marker."""
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as c:
        c.executescript("""
            CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            INSERT INTO meta VALUES ('format', '1');
            CREATE TABLE instances (
                id TEXT PRIMARY KEY, format INTEGER NOT NULL, version INTEGER NOT NULL,
                process_id TEXT NOT NULL, status TEXT NOT NULL, record TEXT NOT NULL,
                created REAL NOT NULL, updated REAL NOT NULL);
            CREATE INDEX instances_by_status ON instances (status, created);""")
        for n, rec in enumerate([waiting("w1", at(20)), waiting("w2", at(3), person=True),
                                 waiting("done", status="completed")]):
            c.execute("INSERT INTO instances VALUES (?, 1, 4, 'p', ?, ?, ?, ?)",
                      (rec["id"], rec["status"], json.dumps(rec), 100.0 + n, 100.0 + n))
    store = open_store(f"sqlite:///{path}")
    try:
        assert due_ids(store, minutes(30)) == ["w2", "w1"]
        assert store.load("w1") == (waiting("w1", at(20)), 4), "records are read as before"
        assert store.save("w1", waiting("w1", at(1)), 4) == 5
        assert due_ids(store, minutes(2)) == ["w1"]
    finally:
        store.close()


def _put_raw_record(backend: Backend, record: dict) -> None:
    """Write a record the way an older layerflow could have, without today's checks."""
    text = json.dumps(record)
    if backend.name == "sqlite":
        with sqlite3.connect(backend.sqlite_path) as c:
            c.execute("UPDATE instances SET record = ?, status = ? WHERE id = ?", (text, record["status"], record["id"]))
        return
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    client.hset(f"{backend.redis_prefix}:i:{{{record['id']}}}", mapping={"record": text, "status": record["status"]})
    client.close()


def _marker(backend: Backend) -> str | None:
    if backend.name == "sqlite":
        with sqlite3.connect(backend.sqlite_path) as c:
            row = c.execute("SELECT value FROM meta WHERE key = 'timer_index'").fetchone()
        return row[0] if row else None
    import redis

    client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return client.hget(f"{backend.redis_prefix}:meta", "timer_index")  # type: ignore[no-any-return]
    finally:
        client.close()


@on_disk
def test_an_older_record_with_a_bad_due_time_stops_the_filling_naming_it(backend):
    """Deliberate: the index is not marked filled with a timer left out (it would never fire);
    the error names the instance, the field, and what to do, and the next call tries again."""
    store = backend.open()
    store.create(waiting("fine", at(5)))
    store.create(waiting("broken", at(5)))
    _put_raw_record(backend, waiting("broken", "next tuesday"))
    forget_timer_index(backend)
    old = backend.open()
    with pytest.raises(InvalidRecord) as err:
        old.due_instances(minutes(10))
    text = str(err.value)
    assert "'broken'" in text and "engine.waiting_for[0].due" in text and "'next tuesday'" in text
    assert "layerflow cancel" in text and "delete" in text
    assert _marker(backend) is None
    old.delete("broken")
    assert due_ids(old, minutes(10)) == ["fine"] and indexed(backend) == {"fine"}
    assert _marker(backend) == str(TIMER_INDEX)


@pytest.mark.parametrize("backend", ["redis"], indirect=True)  # sqlite fills in one write transaction
def test_redis_filling_never_overwrites_what_a_save_in_between_indexed(backend, monkeypatch):
    """The records are read outside any transaction; a save between the read and the index write
    (which indexed the instance itself) wins."""
    import context_layers.stores.redis as redis_store

    store = backend.open()
    store.create(waiting("raced", at(5)))
    store.create(waiting("quiet", at(6)))
    forget_timer_index(backend)
    writer, old = backend.open(), backend.open()
    real = redis_store.timer_due

    def save_meanwhile(record: dict, *args: Any) -> float | None:
        if record["id"] == "raced":
            writer.save("raced", waiting("raced", status="completed"), 1)  # fired by a worker meanwhile
        return real(record, *args)

    monkeypatch.setattr(redis_store, "timer_due", save_meanwhile)
    assert due_ids(old, minutes(60)) == ["quiet"]
