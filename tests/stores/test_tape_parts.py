"""Long tape values are stored in content-addressed parts (``tape_parts``); nobody outside
the store sees it.

* The stored tape of a loop that appends to a list grows with the passes, not their
  square, on every backend (with values stored whole, ``tape_part_bytes=None``, it
  grows with the square: the same measure shows it).
* A read gives every event exactly as appended, from any ``since_seq``: appends,
  changes in the middle, deletes, lists that shrink, values that change type, strings,
  long values inside others, dicts that look like the stored form.
* Loading shares what the events share: one object per item of a list, not one per
  event that holds it.
* A tape stored before parts (``fixtures/old_tape_agent_loop.json``, written by
  ``fixtures/make_old_tape.py`` with the code of that time) loads, resumes and saves.
* A failed save writes no part; a newer parts format is refused; a missing part says so.
"""

from __future__ import annotations

import json
import sqlite3
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from context_layers import Layer, LayeredContext
from context_layers.canonical import FrozenList
from context_layers.stores import (
    InstanceRecords,
    MemoryStore,
    Store,
    StoreError,
    StoreFormatError,
    TapeSequenceError,
    load_instance,
    open_store,
    save_instance,
)
from context_layers.stores.base import INSTANCE_FORMAT
from context_layers.stores import tape_parts
from context_layers.stores.tape_parts import PART_BYTES, PartWriter, read_events
from stores.conftest import REDIS_URL, Backend

FIXTURES = Path(__file__).with_name("fixtures")
OLD_TAPE = FIXTURES / "old_tape_agent_loop.json"


def stored_bytes(backend: Backend, store: Store, iid: str) -> int:
    """What the instance's tapes take in the store: the stored event texts and the parts."""
    if backend.name == "memory":
        texts = [t for tape in store._instances[iid].tapes.values() for t in tape]  # type: ignore[attr-defined]
    elif backend.name == "sqlite":
        with sqlite3.connect(backend.sqlite_path) as c:
            texts = [r[0] for r in c.execute("SELECT event FROM events WHERE instance_id = ?", (iid,))]
    else:
        texts = [t for ctx in store.tape_heads(iid)
                 for t in store.redis.lrange(store._ik(iid, "t", ctx), 0, -1)]  # type: ignore[attr-defined]
    return sum(len(t.encode()) for t in texts) + store.blob_stats(iid).bytes


def passes_of(ctx: LayeredContext, passes: int) -> Iterator[int]:
    """An agent loop's passes: each writes the list one message longer to WORKING, which moves
    into HISTORY when the pass completes; yields after each."""
    messages: list[Any] = []
    for n in range(passes):
        ctx.begin_activity("step")
        messages = [*messages, {"role": "assistant", "content": f"step {n} ..."}]
        ctx.write(Layer.WORKING, "messages", messages, actor="step")
        ctx.complete_activity("step")
        yield n


def loop(passes: int) -> LayeredContext:
    ctx = LayeredContext(system={"policy": "p"}, name="main")
    for _ in passes_of(ctx, passes):
        pass
    return ctx


def save_passes(store: Store, iid: str, passes: int) -> LayeredContext:
    """``loop(passes)`` saved after every pass, as the engine saves after every activity."""
    ctx = LayeredContext(system={"policy": "p"}, name="main")
    version = save_instance(store, {"id": iid, "process_id": "loop", "status": "running",
                                    "contexts": {"main": ctx.to_dict()}})
    for _ in passes_of(ctx, passes):
        version = save_instance(store, {"id": iid, "process_id": "loop", "status": "running",
                                        "contexts": {"main": ctx.to_dict()}}, version)
    return ctx


# ---------------------------------------------------------------------------- growth

def test_a_loop_that_appends_stores_bytes_linear_in_its_passes(backend: Backend) -> None:
    store = backend.open()
    ctx = save_passes(store, "short", 150)
    save_passes(store, "long", 300)
    short, long = stored_bytes(backend, store, "short"), stored_bytes(backend, store, "long")
    # whole values: ~4x for twice the passes; in parts a little over 2x (a hash per level)
    assert long < 2.4 * short, (short, long)
    final = len(json.dumps(ctx.resolve("messages")))
    assert long < 60 * final, "the tape of 300 passes takes tens of lists' worth, not 300"
    loaded, _ = load_instance(store, "short")
    assert LayeredContext.from_dict(loaded["contexts"]["main"]).state_json() == ctx.state_json()


def test_stored_whole_the_same_loop_grows_with_the_square(tmp_path: Path) -> None:
    """What the test above guards against: the same measure with values stored whole."""
    sizes = []
    for passes in (150, 300):
        store = open_store(f"sqlite:///{tmp_path}/whole-{passes}.db", tape_part_bytes=None)
        save_passes(store, "i", passes)
        sizes.append(stored_bytes(Backend("sqlite", store.url, []), store, "i"))
        assert store.blob_stats("i").count == 0
        store.close()
    assert sizes[1] > 3.3 * sizes[0], sizes


# ------------------------------------------------------------------------ round trips

def _shapes() -> dict[str, list[Any]]:
    """Per case, the successive values of one key (None: the key is deleted)."""
    msgs = [{"role": "assistant", "content": f"message {i} " + "x" * (i % 7) * 20} for i in range(120)]
    text = "".join(f"token {i}; " for i in range(900))
    return {
        "appends": [msgs[:n] for n in range(0, 120, 3)],
        "changes in the middle": [msgs[:80], [*msgs[:40], {"edited": True}, *msgs[41:80]], list(reversed(msgs[:80])),
                                  [*msgs[:40], *msgs[50:90]]],
        "deletes": [msgs[:60], None, msgs[:61], None, None, msgs[:10]],
        "shrinks": [msgs[:n] for n in range(120, 0, -17)],
        "changes type": [msgs[:90], text, {"messages": msgs[:90], "n": 90}, 90, msgs[:91], None, text[:10], text],
        "strings that grow": [text[:n] for n in range(0, len(text), 700)],
        "long values inside others": [{"history": {"messages": msgs[:n], "log": text[:n * 50]}, "n": n}
                                      for n in range(0, 120, 20)] + [[text, [text, msgs], {"a": text}] * 3],
        "looks like the stored form": [[{"$list": [[], []]}, {"$str": [["ab"], "c"]}, {"$lit": {"$list": 1}},
                                        {"$parts": 1, "event": {}}, {"$node": ["x"]}, {"$blob": "y"}] * 40,
                                       {"$list": msgs[:50]}, {"$lit": text}, {"$str": [msgs[:30], text]},
                                       {"$parts": 1, "event": msgs[:40]}],
        "unicode": [["多语言 ✓ é" * n] * 10 for n in range(0, 200, 40)] + ["ü" * 3000, "\U0001F600" * 1500],
    }


def _apply(ctx: LayeredContext, key: str, values: list[Any]) -> None:
    for n, value in enumerate(values):
        ctx.begin_activity(f"t{n}")
        if value is None:
            if key in ctx.layer(Layer.WORKING):
                ctx.delete(Layer.WORKING, key, actor="t")
        else:
            ctx.write(Layer.WORKING, key, value, actor="t")
            ctx.write(Layer.WORKING, "pass", n, actor="t")
        ctx.complete_activity(f"t{n}")
        if n % 2:
            ctx.apply_changes([(Layer.HISTORY, key, value if value is not None else "gone")], kind="join", actor="gw")


@pytest.mark.parametrize("case", sorted(_shapes()))
def test_every_event_reads_back_as_appended_from_any_seq(store: Store, case: str) -> None:
    ctx = LayeredContext(system={"policy": "p"}, name="main")
    version = save_instance(store, {"id": "i", "process_id": "p", "status": "running", "contexts": {"main": ctx.to_dict()}})
    values = _shapes()[case]
    for i in range(0, len(values), 2):  # two passes per save
        _apply(ctx, case.replace(" ", "_"), values[i:i + 2])
        version = save_instance(store, {"id": "i", "process_id": "p", "status": "running",
                                        "contexts": {"main": ctx.to_dict()}}, version)
    expected = ctx.tape.to_list()
    assert json.dumps(store.read_tape("i", "main")) == json.dumps(expected), "the same events, byte for byte"
    for since in range(0, len(expected) + 1, 5):
        assert store.read_tape("i", "main", since_seq=since) == expected[since:]
    loaded, _ = load_instance(store, "i")
    again = LayeredContext.from_dict(loaded["contexts"]["main"])
    assert again.state_json() == ctx.state_json() and again.tape.to_list() == expected
    assert LayeredContext.replay(store.read_tape("i", "main")).state_json() == ctx.state_json()


_keys = st.sampled_from(["$list", "$str", "$lit", "$parts", "event", "$node", "seq", "a", ""])
_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=12) | st.dictionaries(_keys | st.text(max_size=3),
                                                                                            inner, max_size=4),
                     max_leaves=60)


@settings(max_examples=300, deadline=None)
@given(st.lists(_json, min_size=1, max_size=6), st.sampled_from([8, 16, 64]))
def test_any_json_round_trips_through_parts(values: list[Any], part_bytes: int) -> None:
    """Small parts, so that cuts happen at every depth; dicts shaped like the stored form."""
    events = [{"seq": n + 1, "kind": "write", "changes": [[4, "k", v]], "data": {"v": v}} for n, v in enumerate(values)]
    writer = PartWriter(part_bytes)
    texts = [writer.text(e) for e in events]

    def fetch(hashes: Any) -> dict[str, str]:
        return {h: writer.parts[h] for h in hashes}

    assert json.dumps(read_events(texts, fetch, "t")) == json.dumps(events)
    assert json.dumps(read_events(texts[1:], fetch, "t")) == json.dumps(events[1:])


# ------------------------------------------------------------------------- sharing

def test_loading_shares_the_items_the_events_share() -> None:
    store = MemoryStore()
    ctx = save_passes(store, "i", 120)
    ctx.begin_activity("copy")
    ctx.write(Layer.WORKING, "copy", ctx.resolve("messages"), actor="copy")
    ctx.complete_activity("copy")  # moves "copy" into HISTORY: the move carries the list again
    save_instance(store, {"id": "i", "process_id": "loop", "status": "running", "contexts": {"main": ctx.to_dict()}},
                  store.load("i")[1])
    tape = store.read_tape("i", "main")
    lists = [c[2] for e in tape for c in e.get("changes", ()) if len(c) == 3 and c[1] in ("messages", "copy")]
    assert len(lists) == 1 + 120 + 2, "the first write and its move, a write per pass (into HISTORY), the copy"
    assert all(isinstance(v, FrozenList) for v in lists[-60:]), "long lists come back frozen: they share items"
    assert len({id(v[0]) for v in lists[-60:]}) == 1, "the first message is one object in every list that holds it"
    assert lists[-1] is lists[-2] and lists[-1] == ctx.resolve("messages"), "a value and its move are one object"
    assert LayeredContext.replay(tape).state_json() == ctx.state_json()


def _load_bytes(store: Store) -> int:
    tracemalloc.start()
    try:
        tape = store.read_tape("i", "main")
        LayeredContext.replay(tape)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_loading_a_tape_in_parts_takes_a_fraction_of_the_memory_of_whole_values() -> None:
    sizes = []
    for part_bytes in (None, PART_BYTES):
        store = MemoryStore(tape_part_bytes=part_bytes)
        save_passes(store, "i", 200)
        sizes.append(_load_bytes(store))
    whole, parts = sizes
    assert parts < whole / 3, sizes


# ------------------------------------------------------------------ tapes stored whole

def _put_old(backend: Backend, store: Store, old: dict[str, Any]) -> None:
    """The fixture's rows, put into the backend as the code of that time wrote them."""
    iid = old["instance_id"]
    if backend.name == "memory":
        from context_layers.stores.memory import _Instance

        store._instances[iid] = _Instance(old["record"], old["process_id"], old["status"],  # type: ignore[attr-defined]
                                          old["version"], 1.0, 1.0, format=old["format"], tapes=old["events"])
    elif backend.name == "sqlite":
        with sqlite3.connect(backend.sqlite_path) as c:
            c.execute("INSERT INTO instances (id, format, version, process_id, status, record, created, updated) "
                      "VALUES (?, ?, ?, ?, ?, ?, 1.0, 1.0)",
                      (iid, old["format"], old["version"], old["process_id"], old["status"], old["record"]))
            c.executemany("INSERT INTO events (instance_id, context, seq, event) VALUES (?, ?, ?, ?)",
                          [(iid, ctx, n + 1, t) for ctx, texts in old["events"].items() for n, t in enumerate(texts)])
    else:
        import redis

        client = redis.Redis.from_url(REDIS_URL)
        ik = f"{backend.redis_prefix}:i:{{{iid}}}"
        client.hset(ik, mapping={"record": old["record"], "version": old["version"], "format": old["format"],
                                 "process_id": old["process_id"], "status": old["status"], "created": 1.0,
                                 "updated": 1.0})
        client.zadd(f"{backend.redis_prefix}:index", {iid: 1.0})
        for ctx, texts in old["events"].items():
            client.rpush(f"{ik}:t:{ctx}", *texts)
            client.hset(f"{ik}:heads", ctx, len(texts))
        client.close()


def test_a_tape_stored_whole_before_parts_loads_resumes_and_saves(backend: Backend,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import Engine

    # the fixture's lists are short (30 messages): every event that holds a part's worth is searched
    monkeypatch.setattr(tape_parts, "WALK_PARTS", 1)

    old = json.loads(OLD_TAPE.read_text())
    assert old["format"] == 1
    store = backend.open()
    _put_old(backend, store, old)
    iid = old["instance_id"]
    whole = {ctx: [json.loads(t) for t in texts] for ctx, texts in old["events"].items()}
    assert {ctx: store.read_tape(iid, ctx) for ctx in whole} == whole
    assert store.read_tape(iid, "main", since_seq=100) == whole["main"][100:]
    assert max(len(t) for t in old["events"]["main"]) > 1024, "the fixture has values that parts would cut"

    engine = Engine(InstanceRecords(store))
    instance = engine.load(iid)
    assert instance.status == "waiting"
    assert instance.main.tape.to_list() == whole["main"]
    messages = instance.main.resolve("messages")
    assert len(messages) == 30 and instance.main.resolve("log").count("pass") == 30
    done = engine.resume(instance, answers={"user_tasks": {"review": {"reviewer": "ann"}}})
    assert done.status == "completed", done.error
    assert done.main.resolve("messages")[-1] == {"role": "user", "content": "reviewed by ann"}

    assert store.read_tape(iid, "main")[:len(whole["main"])] == whole["main"], "the old events are as they were"
    again = Engine(InstanceRecords(store)).load(iid)
    assert again.main.tape.to_list() == done.main.tape.to_list()
    assert again.main.state_json() == done.main.state_json()
    assert store.blob_stats(iid).count > 0, "the new events' long values went into parts"
    if backend.name == "sqlite":
        with sqlite3.connect(backend.sqlite_path) as c:
            assert c.execute("SELECT format FROM instances WHERE id = ?", (iid,)).fetchone()[0] == INSTANCE_FORMAT


# --------------------------------------------------------------------- the store's care

def test_a_failed_save_writes_no_part(store: Store) -> None:
    ctx = loop(100)  # its last lists reach WALK_PARTS parts
    version = save_instance(store, {"id": "i", "process_id": "p", "status": "running", "contexts": {}})
    before = store.blob_stats("i")
    with pytest.raises(TapeSequenceError):
        store.save("i", {"id": "i", "process_id": "p", "status": "running"}, version,
                   {"main": ctx.tape.to_list(), "side": [{"seq": 2, "kind": "x", "time": 1.0, "actor": "a"}]})
    assert store.blob_stats("i") == before and store.tape_heads("i") == {}
    store.save("i", {"id": "i", "process_id": "p", "status": "running"}, version, {"main": ctx.tape.to_list()})
    assert store.blob_stats("i").count > before.count
    assert store.read_tape("i", "main") == ctx.tape.to_list()


def test_a_newer_parts_format_and_a_missing_part_are_refused() -> None:
    store = MemoryStore()
    ctx = loop(100)  # its last lists reach WALK_PARTS parts
    store.create({"id": "i", "process_id": "p", "status": "running"}, tape_appends={"main": ctx.tape.to_list()})
    inst = store._instances["i"]
    stored = inst.tapes["main"]
    n = next(i for i, t in enumerate(stored) if t.startswith('{"$parts":1,'))
    inst.tapes["main"] = [*stored[:n], stored[n].replace('{"$parts":1,', '{"$parts":2,', 1), *stored[n + 1:]]
    with pytest.raises(StoreFormatError, match="parts format 2.*Upgrade layerflow"):
        store.read_tape("i", "main")
    inst.tapes["main"] = stored
    assert store.read_tape("i", "main") == ctx.tape.to_list()
    inst.blobs.pop(next(iter(inst.blobs)))
    with pytest.raises(StoreError, match="missing part.*damaged"):
        store.read_tape("i", "main")
