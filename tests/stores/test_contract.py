"""The Store contract: every test here runs against memory, sqlite and redis (``store``
fixture in conftest.py)."""

from __future__ import annotations

import threading
import time

import pytest

from context_layers import Layer, LayeredContext
from context_layers.errors import ContextKeyError, LayerflowError, VersionConflict
from context_layers.stores import (
    ConfirmationAnswered,
    ConfirmationNotFound,
    InstanceExists,
    InstanceNotFound,
    InvalidAnswer,
    InvalidRecord,
    Store,
    TapeSequenceError,
    load_instance,
    save_instance,
)


def events(first: int, last: int, **data: object) -> list[dict]:
    return [{"seq": s, "kind": "write", "time": 1.5 + s, "actor": "t", **({"data": data} if data else {})}
            for s in range(first, last + 1)]


def state(store: Store, iid: str = "inst-1") -> tuple:
    """Everything an instance holds, to show that a failed call changed nothing."""
    record, version = store.load(iid)
    heads = store.tape_heads(iid)
    tapes = {ctx: store.read_tape(iid, ctx) for ctx in heads}
    snaps = {sid: store.get_snapshot(iid, sid) for sid in store.list_snapshots(iid)}
    confs = store.list_confirmations(iid, pending_only=False)
    return record, version, tapes, snaps, confs, store.blob_stats(iid)


# ------------------------------------------------------------------------------ instances

def test_create_load_save_round_trip(store, record):
    assert isinstance(store, Store), "every backend follows the protocol"
    rec = record(nested={"a": [1, 2.5, None, True, "ü"]}, order={"z": 1, "a": 2})
    assert store.create(rec) == 1
    loaded, version = store.load("inst-1")
    assert (loaded, version) == (rec, 1)
    assert list(loaded["order"]) == ["z", "a"], "dict order is kept"
    loaded["status"] = "mutated"  # a fresh copy: the store is not changed through it
    assert store.load("inst-1")[0]["status"] == "running"
    assert store.save("inst-1", record(status="waiting"), 1) == 2
    assert store.save("inst-1", record(status="completed"), 2) == 3
    assert store.load("inst-1") == (record(status="completed"), 3)


def test_create_twice_and_missing_instances(store, record):
    store.create(record())
    with pytest.raises(InstanceExists, match="inst-1"):
        store.create(record())
    with pytest.raises(InstanceNotFound, match="'nope'") as err:
        store.load("nope")
    assert isinstance(err.value, KeyError) and err.value.kind == "not_found"
    for call in (lambda: store.save("nope", record("nope"), 1), lambda: store.read_tape("nope", "main"),
                 lambda: store.tape_heads("nope"), lambda: store.append_events("nope", "main", events(1, 1)),
                 lambda: store.put_snapshot("nope", "s", {}), lambda: store.list_snapshots("nope"),
                 lambda: store.put_confirmation({"id": "c", "instance_id": "nope"})):
        with pytest.raises(InstanceNotFound):
            call()


@pytest.mark.parametrize("bad, message", [
    ({"process_id": "p", "status": "running"}, "'id'"),
    ({"id": "inst-1", "status": "running"}, "'process_id'"),
    ({"id": "inst-1", "process_id": "p", "status": None}, "'status'"),
    ({"id": "inst-1", "process_id": "p", "status": "running", "x": {1, 2}}, "not JSON-compatible"),
    ({"id": "inst-1", "process_id": "p", "status": "running", "x": float("nan")}, "not JSON-compatible"),
])
def test_invalid_records_are_refused(store, bad, message):
    with pytest.raises(InvalidRecord, match=message):
        store.create(bad)
    assert store.list_instances() == []


def test_save_under_another_id_is_refused(store, record):
    store.create(record())
    with pytest.raises(InvalidRecord, match="does not match"):
        store.save("inst-1", record("other"), 1)


def test_stale_version_raises_and_writes_nothing(store, record):
    store.create(record(), tape_appends={"main": events(1, 2)})
    store.save("inst-1", record(step=1), 1, {"main": events(3, 3)})
    before = state(store)
    with pytest.raises(VersionConflict) as err:
        store.save("inst-1", record(step=99), 1, {"main": events(4, 5), "main/b": events(1, 1)},
                   snapshots={"s": {"L0": {"k": "v" * 300}}}, confirmations=[{"id": "c-stale", "message": "?"}])
    text = str(err.value)
    assert "'inst-1'" in text and "expected version 1" in text and "stored version 2" in text and "reload" in text.lower()
    assert err.value.kind == "version_conflict" and isinstance(err.value, LayerflowError)
    assert state(store) == before
    with pytest.raises(VersionConflict):
        store.append_events("inst-1", "main", events(4, 4), expected_version=1)
    assert state(store) == before


def test_tape_append_is_atomic_with_the_save(store, record):
    store.create(record(), tape_appends={"main": events(1, 3), "side": events(1, 1)})
    before = state(store)
    # "main" continues correctly, "side" leaves a gap: the whole save fails
    with pytest.raises(TapeSequenceError):
        store.save("inst-1", record(step=1), 1, {"main": events(4, 6), "side": events(3, 3)},
                   snapshots={"s": {"doc": "d" * 400}}, confirmations=[{"id": "c-1"}])
    assert state(store) == before
    assert store.save("inst-1", record(step=1), 1, {"main": events(4, 6), "side": events(2, 2)}) == 2
    assert store.tape_heads("inst-1") == {"main": 6, "side": 2}
    assert [e["seq"] for e in store.read_tape("inst-1", "main")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("first, last, what", [
    (3, 3, "duplicates"),      # last stored seq is 3
    (1, 2, "duplicates"),
    (5, 6, "leaves a gap"),
    (10, 10, "leaves a gap"),
])
def test_gaps_and_duplicates_are_rejected(store, record, first, last, what):
    store.create(record(), tape_appends={"main": events(1, 3)})
    before = state(store)
    for call in (lambda: store.save("inst-1", record(), 1, {"main": events(first, last)}),
                 lambda: store.append_events("inst-1", "main", events(first, last))):
        with pytest.raises(TapeSequenceError, match=what) as err:
            call()
        assert "seq 4" in str(err.value) and "'main'" in str(err.value)
        assert state(store) == before


@pytest.mark.parametrize("batch, message", [
    ([{"seq": 1}, {"seq": 3}], "consecutive"),
    ([{"seq": 2}, {"seq": 1}], "consecutive"),
    ([{"seq": 1}, {"seq": 1}], "consecutive"),
    ([{"seq": 0}], "seq"),
    ([{"seq": "1"}], "seq"),
    ([{"kind": "write"}], "seq"),
])
def test_malformed_batches_are_rejected(store, record, batch, message):
    store.create(record())
    with pytest.raises((TapeSequenceError, InvalidRecord), match=message):
        store.append_events("inst-1", "main", batch)
    assert store.tape_heads("inst-1") == {} and store.load("inst-1")[1] == 1


def test_a_new_tape_starts_at_seq_1(store, record):
    store.create(record())
    with pytest.raises(TapeSequenceError, match="seq 1"):
        store.append_events("inst-1", "main", events(2, 3))
    assert store.append_events("inst-1", "main", events(1, 2)) == 2, "a standalone append bumps the version"
    assert store.append_events("inst-1", "main", [], expected_version=2) == 3


@pytest.mark.parametrize("since, expected", [(0, [1, 2, 3, 4, 5]), (2, [3, 4, 5]), (4, [5]), (5, []), (99, [])])
def test_read_tape_since(store, record, since, expected):
    store.create(record(), tape_appends={"main": events(1, 5)})
    assert [e["seq"] for e in store.read_tape("inst-1", "main", since_seq=since)] == expected
    assert store.read_tape("inst-1", "unknown-context") == []


def test_events_round_trip_exactly(store, record):
    evs = [{"seq": 1, "kind": "init", "time": 1712345678.123456, "actor": "engine",
            "changes": [[0, "policy", {"text": "多语言 ✓", "n": 10 ** 18, "f": 0.1}]], "data": {"z": 1, "a": [None]}}]
    store.create(record(), tape_appends={"main": evs})
    assert store.read_tape("inst-1", "main") == evs


def test_list_instances_and_status_filter(store, record):
    for i, status in enumerate(["running", "waiting", "completed", "waiting"]):
        store.create(record(f"inst-{i}", status=status))
    store.save("inst-0", record("inst-0", status="waiting"), 1)
    listed = store.list_instances()
    assert [s["instance_id"] for s in listed] == ["inst-0", "inst-1", "inst-2", "inst-3"]
    assert listed[0] == {**listed[0], "process_id": "loan_approval", "status": "waiting", "version": 2}
    assert [s["instance_id"] for s in store.list_instances("waiting")] == ["inst-0", "inst-1", "inst-3"]
    assert store.list_instances("error") == []


def test_delete_removes_everything(store, record):
    store.create(record(), tape_appends={"main": events(1, 3)}, snapshots={"s": {"doc": "x" * 500}},
                 confirmations=[{"id": "c-1"}])
    store.create(record("inst-2"))
    store.acquire_lease("inst-1", "w1", 30)
    assert store.delete("inst-1") is True
    assert store.delete("inst-1") is False
    with pytest.raises(InstanceNotFound):
        store.load("inst-1")
    with pytest.raises(ConfirmationNotFound):
        store.get_confirmation("c-1")
    assert store.lease_owner("inst-1") is None
    assert [s["instance_id"] for s in store.list_instances()] == ["inst-2"]
    store.create(record())  # the id can be used again, from an empty tape
    assert store.tape_heads("inst-1") == {} and store.list_snapshots("inst-1") == []
    assert store.blob_stats("inst-1").count == 0


# ------------------------------------------------------------------------------ snapshots

def test_snapshot_round_trip(store, record):
    store.create(record())
    snap = {"context": "main", "seq": 7,
            "layers": {"L0": {"policy": "p" * 300}, "L1": {"amount": 120000, "ratio": 0.25},
                       "L3": {"activity:a": {"kind": "activity", "keys": ["x"] * 50}, "z": None, "a": True}},
            "looks_like_a_ref": {"$blob": "not-a-hash"}, "escaped": {"$lit": {"$blob": "x"}},
            "big_ref_lookalike": {"$blob": "y" * 400}, "list": [[1, 2], {"k": "ü" * 100}], "empty": {}}
    store.put_snapshot("inst-1", "snap:main:7", snap)
    got = store.get_snapshot("inst-1", "snap:main:7")
    assert got == snap
    assert list(got["layers"]["L3"]) == ["activity:a", "z", "a"], "key order is kept"
    assert store.list_snapshots("inst-1") == ["snap:main:7"]
    with pytest.raises(ContextKeyError, match="snap:main:8"):
        store.get_snapshot("inst-1", "snap:main:8")
    store.put_snapshot("inst-1", "snap:main:7", {"replaced": True})  # a re-run activity re-takes its snapshot
    assert store.get_snapshot("inst-1", "snap:main:7") == {"replaced": True}


def test_snapshot_values_are_stored_once(store, record):
    store.create(record())
    doc = "a long contract text " * 500          # ~10 KB
    kb = [{"source": f"doc{i}", "text": f"passage {i} " * 40} for i in range(3)]
    base = {"L2": {"contract": doc, "kb": kb}, "L4": {"step": 1}}
    store.put_snapshot("inst-1", "s1", base)
    first = store.blob_stats("inst-1")
    # the doc, each kb passage, the kb list, the L2 map: 6 parts
    assert first.count == 6
    store.put_snapshot("inst-1", "s1-again", base)
    assert store.blob_stats("inst-1") == first, "the same snapshot again stores nothing new"
    store.put_snapshot("inst-1", "s2", {**base, "L4": {"step": 2}})
    assert store.blob_stats("inst-1") == first, "a small change outside the large values stores no part again"
    changed_kb = [*kb[:2], {"source": "doc2", "text": "changed " * 40}]
    store.put_snapshot("inst-1", "s3", {"L2": {"contract": doc, "kb": changed_kb}, "L4": {"step": 3}})
    after = store.blob_stats("inst-1")
    # new: the changed passage, the kb list that holds its hash, the L2 map that holds the list's hash
    assert after.count == first.count + 3
    assert after.bytes - first.bytes < len(doc) / 5, "the 10 KB document was not stored again"
    assert store.get_snapshot("inst-1", "s3")["L2"]["kb"] == changed_kb
    assert store.get_snapshot("inst-1", "s1") == base


def test_snapshots_commit_with_the_save(store, record):
    store.create(record())
    store.save("inst-1", record(step=1), 1, snapshots={"snap:main:3": {"L4": {"x": "v" * 200}}})
    assert store.get_snapshot("inst-1", "snap:main:3") == {"L4": {"x": "v" * 200}}


# -------------------------------------------------------------------------- confirmations

def test_confirmations(store, record):
    store.create(record())
    store.create(record("inst-2"))
    conf = {"id": "c-1", "instance_id": "inst-1", "type": "conflict", "message": "which amount?",
            "options": [{"value": 100, "label": "branch a"}, {"value": 120, "label": "branch b"}], "task_id": "join_1"}
    stored = store.put_confirmation(conf)
    assert stored == {**conf, "format": 1, "status": "pending", "created": stored["created"]}
    assert store.put_confirmation({**conf, "message": "changed"}) == stored, "put is idempotent"
    store.save("inst-2", record("inst-2"), 1, confirmations=[{"id": "c-2", "options": ["yes", "no"]}])
    assert [c["id"] for c in store.list_confirmations()] == ["c-1", "c-2"]
    assert [c["id"] for c in store.list_confirmations("inst-2")] == ["c-2"]
    assert store.get_confirmation("c-2")["instance_id"] == "inst-2"

    with pytest.raises(InvalidAnswer, match="100, 120"):
        store.answer_confirmation("c-1", 110, "alice")
    done = store.answer_confirmation("c-1", 120.0, "alice")
    assert done["status"] == "answered" and done["answer"] == 120 and done["actor"] == "alice"
    assert store.get_confirmation("c-1") == done
    with pytest.raises(ConfirmationAnswered, match="already answered") as err:
        store.answer_confirmation("c-1", 100, "bob")
    assert "alice" in str(err.value)
    assert store.get_confirmation("c-1")["answer"] == 120
    assert store.put_confirmation(conf)["status"] == "answered", "a re-put never undoes an answer"
    assert [c["id"] for c in store.list_confirmations()] == ["c-2"]
    assert [c["id"] for c in store.list_confirmations(pending_only=False)] == ["c-1", "c-2"]
    with pytest.raises(ConfirmationNotFound):
        store.answer_confirmation("nope", "yes", "bob")
    with pytest.raises(InvalidRecord):
        store.save("inst-2", record("inst-2"), 2, confirmations=[{"id": "c-3", "instance_id": "inst-1"}])


def test_a_confirmation_is_answered_once_under_races(store, record):
    store.create(record())
    store.put_confirmation({"id": "c-1", "instance_id": "inst-1", "options": ["yes", "no"]})
    results: list[str] = []
    barrier = threading.Barrier(6)

    def answer(i: int) -> None:
        barrier.wait()
        try:
            store.answer_confirmation("c-1", "yes" if i % 2 else "no", f"user{i}")
            results.append("won")
        except ConfirmationAnswered:
            results.append("lost")

    threads = [threading.Thread(target=answer, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == ["lost"] * 5 + ["won"]


# --------------------------------------------------------------------------------- leases

def test_leases(store, record):
    store.create(record())
    assert store.acquire_lease("inst-1", "w1", 30)
    assert store.lease_owner("inst-1") == "w1"
    assert not store.acquire_lease("inst-1", "w2", 30)
    assert store.acquire_lease("inst-1", "w1", 30), "the owner may take it again (extends it)"
    assert store.renew_lease("inst-1", "w1", 30)
    assert not store.renew_lease("inst-1", "w2", 30)
    assert not store.release_lease("inst-1", "w2")
    assert store.lease_owner("inst-1") == "w1"
    assert store.release_lease("inst-1", "w1")
    assert store.lease_owner("inst-1") is None
    assert store.acquire_lease("inst-1", "w2", 30)
    with pytest.raises(InvalidRecord, match="ttl"):
        store.acquire_lease("inst-1", "w2", 0)


def test_leases_expire(store, record):
    store.create(record())
    assert store.acquire_lease("inst-1", "w1", 0.2)
    assert not store.acquire_lease("inst-1", "w2", 0.2)
    time.sleep(0.35)
    assert store.lease_owner("inst-1") is None
    assert not store.renew_lease("inst-1", "w1", 5), "an expired lease cannot be renewed"
    assert store.acquire_lease("inst-1", "w2", 5)
    assert not store.release_lease("inst-1", "w1")
    assert store.lease_owner("inst-1") == "w2"


# ---------------------------------------------------------------------------- concurrency

def test_exactly_one_save_wins_per_version(backend, record):
    """Eight writers (each with its own handle, like eight processes) save on the same version."""
    stores = [backend.open() for _ in range(8)]
    stores[0].create(record(), tape_appends={"main": events(1, 1)})
    barrier = threading.Barrier(len(stores))
    outcome: dict[int, str] = {}

    def save(i: int) -> None:
        barrier.wait()
        try:
            stores[i].save("inst-1", record(writer=i), 1, {"main": events(2, 2, writer=i)})
            outcome[i] = "won"
        except VersionConflict:
            outcome[i] = "conflict"

    threads = [threading.Thread(target=save, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [i for i, o in outcome.items() if o == "won"]
    assert len(winners) == 1 and len(outcome) == len(stores)
    rec, version = stores[0].load("inst-1")
    assert version == 2 and rec["writer"] == winners[0]
    tape = stores[0].read_tape("inst-1", "main")
    assert [e["seq"] for e in tape] == [1, 2] and tape[1]["data"]["writer"] == winners[0]


def test_no_lost_update_under_concurrent_read_modify_write(backend, record):
    stores = [backend.open() for _ in range(4)]
    stores[0].create(record(counter=0))
    per_writer, conflicts = 15, []

    def work(store: Store) -> None:
        for _ in range(per_writer):
            while True:
                rec, version = store.load("inst-1")
                seq = store.tape_heads("inst-1").get("main", 0) + 1
                rec["counter"] += 1
                try:
                    store.save("inst-1", rec, version, {"main": events(seq, seq)})
                    break
                except VersionConflict:
                    conflicts.append(1)

    threads = [threading.Thread(target=work, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = per_writer * len(stores)
    rec, version = stores[0].load("inst-1")
    assert rec["counter"] == total and version == total + 1
    assert [e["seq"] for e in stores[0].read_tape("inst-1", "main")] == list(range(1, total + 1))


# ------------------------------------------------------------- a real context through the store

def _context() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "dual approval over 100k"}, name="main")
    ctx.write(Layer.PROCESS, "amount", 120000, actor="input")
    ctx.begin_activity("risk")
    ctx.write(Layer.WORKING, "risk", {"level": "medium", "factors": ["income", "history"]}, actor="risk")
    ctx.complete_activity("risk", preserve_keys=["risk"])
    return ctx


def test_layered_context_round_trips_through_the_store(store):
    main = _context()
    branch = LayeredContext.fork(main.snapshot("split"), name="main/b", branch_id="b", inject={"review": "legal"})
    branch.write(Layer.WORKING, "legal_ok", True, actor="legal")

    def rec() -> dict:
        return {"id": "inst-1", "process_id": "loan", "status": "running",
                "contexts": {"main": main.to_dict(), "main/b": branch.to_dict()}}

    version = save_instance(store, rec())
    assert store.tape_heads("inst-1") == {"main": len(main.tape), "main/b": len(branch.tape)}
    assert "tape" not in store.load("inst-1")[0]["contexts"]["main"], "tapes are not stored twice"
    loaded, v = load_instance(store, "inst-1")
    assert v == version == 1
    assert LayeredContext.from_dict(loaded["contexts"]["main"]) == main
    assert LayeredContext.from_dict(loaded["contexts"]["main/b"]) == branch
    assert loaded["contexts"]["main"] == main.to_dict()

    # incremental: only the new events are appended
    n = len(main.tape)
    main.write(Layer.WORKING, "decision", "approve", actor="approve")
    version = save_instance(store, rec(), version)
    assert store.tape_heads("inst-1")["main"] == n + 1
    loaded, _ = load_instance(store, "inst-1")
    again = LayeredContext.from_dict(loaded["contexts"]["main"])
    assert again == main and again.tape.to_list() == main.tape.to_list()
    with pytest.raises(VersionConflict):
        save_instance(store, rec(), version - 1)


def test_load_instance_cuts_tapes_at_the_record(store):
    """A save landing between load's two reads must not leak newer events into an older record."""
    main = _context()
    rec = {"id": "inst-1", "process_id": "loan", "status": "running", "contexts": {"main": main.to_dict()}}
    save_instance(store, rec)
    stale_record, _ = store.load("inst-1")
    main.write(Layer.WORKING, "late", 1, actor="x")
    save_instance(store, {**rec, "contexts": {"main": main.to_dict()}}, 1)
    # what load_instance would have seen had the second save come between its reads
    length = stale_record["contexts"]["main"]["tape_length"]
    assert length == len(main.tape) - 1
    cut = [e for e in store.read_tape("inst-1", "main") if e["seq"] <= length]
    assert LayeredContext.from_dict({**stale_record["contexts"]["main"], "tape": cut}) == _context()
