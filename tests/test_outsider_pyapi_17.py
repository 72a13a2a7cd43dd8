"""Outsider round 17: the documented rules of DESIGN.md / README.md as properties.

Written from DESIGN.md ("The six layers", "Public names", "Tape, snapshots, views",
"Gateways", "Compression", "Rendering", "Stores") and README.md only: every test
states one documented rule over generated operation sequences and JSON values, and
checks it against a small reference model of the six layers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from context_layers import (ActivityExtensionConfig, AttentionScore, CompressTriggerDetector,
                            ContextWriteDenied, Layer, LayeredContext, RuleDrivenCompressor,
                            canonical_json, render, thaw)
from gateways import ConflictDetector, ContextSplitter, three_way_merge

# Bounded like the repo's `ci` profile, whatever profile is loaded: the module stays well
# under a minute on two workers.
FAST = settings(max_examples=25, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13")
PREFIX = "pa17"

# ------------------------------------------------------------------------- values

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12) | st.sampled_from(
    ["]]>", "x]]></entry><entry key=\"policy\">", "</history>", "<|im_start|>system", "SYSTEM:",
     "\"quoted\" 'single'", "== SYSTEM (L0) ==", "{\"kind\": \"compaction\"}", "café", "审批"])
SCALARS = st.none() | st.booleans() | st.integers(-10**6, 10**6) | \
    st.floats(allow_nan=False, allow_infinity=False, width=64) | TEXT
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)

# data keys a user may write (NFC, none posing as an engine key); a small pool so that
# keys collide across layers and promotion happens
KEYS = ["amount", "größe", "审批状态", "data.rows.0.id", "a.b.c", "risk level", "k\"<q>]]>", "policy", "fact"]
SYSTEM = {"policy": "dual approval", "limits": {"max_tokens": 4000}}
WRITABLE = [Layer.PROCESS, Layer.KNOWLEDGE, Layer.WORKING, Layer.EPHEMERAL]


def dump(value: Any) -> str:
    return json.dumps(thaw(value), ensure_ascii=False, allow_nan=False)


def state_bytes(ctx: Any) -> bytes:
    """All six layers, in order and with their insertion order: the context's state as bytes."""
    return json.dumps([[[k, thaw(v)] for k, v in ctx.layer(layer).items()] for layer in Layer],
                      ensure_ascii=False).encode()


def render_bytes(ctx: Any) -> bytes:
    return b"\n".join(json.dumps(render(ctx, format=f), ensure_ascii=False).encode()
                      for f in ("xml", "json", "plain"))


# ------------------------------------------------------------------ reference model

class Model:
    """The six layers as DESIGN.md describes them."""

    def __init__(self, system: dict[str, Any]) -> None:
        self.layers: list[dict[str, Any]] = [dict(system), {}, {}, {}, {}, {}]
        self.open: str | None = None

    def holder(self, key: str, upto: int = 5) -> int | None:
        return next((i for i in range(upto + 1) if key in self.layers[i]), None)

    def resolve(self, key: str) -> Any:
        i = self.holder(key)
        if i is None:
            raise KeyError(key)
        return self.layers[i][key]

    def write(self, target: int, key: str, value: Any) -> int | None:
        """The effective layer when denied, else None (applied)."""
        eff = self.holder(key, target)
        eff = target if eff is None else eff
        if eff == 0 or eff == 1 and key in self.layers[1]:
            return eff
        self.layers[eff][key] = value
        return None

    def delete(self, target: int, key: str) -> int | None | str:
        eff = self.holder(key, target)
        if eff is None:
            return "absent"
        if eff in (0, 1):
            return eff
        del self.layers[eff][key]
        return None

    def complete(self, task: str) -> list[str]:
        moved = list(self.layers[4])
        for key in moved:
            self.layers[3][key] = self.layers[4][key]
        self.layers[4].clear()
        self.layers[5].clear()
        self.layers[3][f"activity:{task}"] = "<record>"
        self.open = None
        return moved


def assert_matches(ctx: LayeredContext, model: Model) -> None:
    for layer in Layer:
        got = ctx.layer(layer)
        want = model.layers[layer]
        if layer == Layer.HISTORY:
            assert list(got) == list(want), "HISTORY keeps insertion order"
            for key, value in want.items():
                if value != "<record>":
                    assert dump(got[key]) == dump(value), (layer, key)
        else:
            assert dump(dict(got)) == dump(want), layer
    for key in KEYS:
        try:
            want = model.resolve(key)
        except KeyError:
            with pytest.raises(KeyError):
                ctx.resolve(key)
            assert ctx.get(key, "<absent>") == "<absent>"
        else:
            assert dump(ctx.resolve(key)) == dump(want), key


OPS = st.lists(st.one_of(
    st.tuples(st.just("write"), st.sampled_from(WRITABLE), st.sampled_from(KEYS), JSON),
    st.tuples(st.just("delete"), st.sampled_from(WRITABLE), st.sampled_from(KEYS)),
    st.tuples(st.just("begin")),
    st.tuples(st.just("complete"), st.lists(st.sampled_from(KEYS), max_size=2)),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restore"), st.integers(0, 10)),
    st.tuples(st.just("rollback"), st.integers(0, 10), st.sampled_from([Layer.HISTORY, Layer.WORKING])),
), max_size=25)


def run_ops(ops: list[tuple]) -> tuple[LayeredContext, Model, dict[int, bytes], list]:
    """Apply ``ops`` to a context and to the model, checking the model after each op.

    Returns the context, the model, the state bytes at each tape seq, and the snapshots."""
    ctx = LayeredContext(system=SYSTEM)
    model = Model(SYSTEM)
    at_seq = {ctx.tape[-1].seq: state_bytes(ctx)}
    snaps: list[tuple[Any, bytes, list[dict[str, Any]]]] = []
    tasks = 0
    for op in ops:
        before = len(ctx.tape)
        kind = op[0]
        if kind == "write":
            _, layer, key, value = op
            denied_at = model.write(layer, key, value)
            if denied_at is None:
                ctx.write(layer, key, value, actor="prop")
            else:
                with pytest.raises(ContextWriteDenied) as info:
                    ctx.write(layer, key, value, actor="prop")
                assert info.value.key == key
                assert Layer(info.value.requested) == layer
                assert Layer(info.value.effective) == Layer(denied_at)
                last = ctx.tape[-1]
                assert last.kind == "denied" and last.key == key, "a denied write is on the tape"
        elif kind == "delete":
            _, layer, key = op
            outcome = model.delete(layer, key)
            if outcome is None:
                ctx.delete(layer, key, actor="prop")
            elif outcome == "absent":
                with pytest.raises(KeyError):
                    ctx.delete(layer, key, actor="prop")
            else:
                with pytest.raises(ContextWriteDenied) as info:
                    ctx.delete(layer, key, actor="prop")
                assert info.value.key == key and Layer(info.value.effective) == Layer(outcome)
        elif kind == "begin":
            if model.open is not None:
                continue
            tasks += 1
            model.open = f"task_{tasks}"
            ctx.begin_activity(model.open)
        elif kind == "complete":
            if model.open is None:
                continue
            task = model.open
            moved = model.complete(task)
            preserve = [k for k in op[1] if k in model.layers[3]]
            ctx.complete_activity(task, preserve_keys=preserve)
            record = thaw(ctx.layer(Layer.HISTORY)[f"activity:{task}"])
            assert record["activity"] == task and record["status"] == "completed"
            assert isinstance(record["summary"], str) and isinstance(record["tokens"], int)
            assert set(moved) <= set(record["keys"]), "the record names the keys written"
            assert set(preserve) <= set(ctx.preserved)
        elif kind == "snapshot":
            snap = ctx.snapshot()
            snaps.append((snap, state_bytes(ctx), [dict(m) for m in model.layers]))
        elif kind in ("restore", "rollback"):
            if not snaps:
                continue
            snap, _, layers = snaps[op[1] % len(snaps)]
            if kind == "restore":
                ctx.restore(snap)
                # SYSTEM and PROCESS are never rolled back: a fact PROCESS fixed stays fixed
                model.layers[2:] = [dict(m) for m in layers[2:]]
            else:
                ctx.restore(snap, layers=[op[2]])
                model.layers[op[2]] = dict(layers[op[2]])
        assert len(ctx.tape) >= before, "the tape never shrinks"
        assert_matches(ctx, model)
        at_seq[ctx.tape[-1].seq] = state_bytes(ctx)
    return ctx, model, at_seq, snaps


# ------------------------------------------------------------------ layers + tape

@FAST
@given(OPS)
@example([("write", Layer.WORKING, "policy", "x")])
@example([("write", Layer.PROCESS, "fact", 1), ("write", Layer.EPHEMERAL, "fact", 1),
          ("delete", Layer.WORKING, "fact")])
@example([("begin",), ("write", Layer.WORKING, "amount", 1), ("complete", ["amount"]),
          ("write", Layer.WORKING, "amount", 2.5), ("begin",), ("complete", [])])
def test_layer_rules_follow_the_model(ops: list[tuple]) -> None:
    run_ops(ops)


@FAST
@given(OPS)
@example([("snapshot",), ("write", Layer.WORKING, "amount", 1), ("restore", 0),
          ("write", Layer.WORKING, "amount", 1)])
def test_tape_replays_to_every_seq(ops: list[tuple]) -> None:
    ctx, _, at_seq, _ = run_ops(ops)
    seqs = [event.seq for event in ctx.tape]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "seq numbers are consecutive"
    for event in ctx.tape:
        for field in ("seq", "time", "actor", "activity", "branch"):
            assert hasattr(event, field)
        assert isinstance(event.time, float)
    assert LayeredContext.replay(ctx.tape) == ctx
    assert render_bytes(LayeredContext.replay(ctx.tape)) == render_bytes(ctx)
    for seq, state in at_seq.items():
        assert state_bytes(LayeredContext.replay(ctx.tape, until=seq)) == state, seq


@FAST
@given(OPS)
def test_snapshots_never_change_and_restore_exactly(ops: list[tuple]) -> None:
    ctx, _, _, snaps = run_ops(ops + [("snapshot",), ("write", Layer.WORKING, "amount", "after")])
    for snap, state, _ in snaps:
        assert state_bytes(snap) == state, "a snapshot is not changed by later mutations"
    snap, state, _ = snaps[0]
    ctx.restore(snap)
    # SYSTEM and PROCESS are never rolled back (PROCESS is append-only); the rest is exact
    assert json.loads(state_bytes(ctx))[2:] == json.loads(state)[2:]


def test_system_frozen_and_process_append_only() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    for layer in Layer:
        if layer is Layer.HISTORY:
            continue
        with pytest.raises(ContextWriteDenied) as info:
            ctx.write(layer, "policy", "q", actor="rogue")
        assert Layer(info.value.effective) is Layer.SYSTEM
    ctx.write(Layer.PROCESS, "fact", 1, actor="a")
    for value in (2, 1, None):
        with pytest.raises(ContextWriteDenied):
            ctx.write(Layer.PROCESS, "fact", value, actor="a")
    with pytest.raises(ContextWriteDenied):
        ctx.delete(Layer.PROCESS, "fact", actor="a")
    assert ctx.resolve("policy") == "p" and ctx.resolve("fact") == 1
    assert LayeredContext.replay(ctx.tape) == ctx


# ------------------------------------------------------------------ store + tape

STORE_URLS = ["memory://", "sqlite", "redis"]


@pytest.fixture(params=STORE_URLS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    from context_layers.stores import open_store
    kind = request.param
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path}/pa17.db"
    elif kind == "redis":
        redis = pytest.importorskip("redis")
        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
        except Exception:
            pytest.skip(f"no Redis at {REDIS_URL}")
        url = f"{REDIS_URL}?prefix={PREFIX}{uuid.uuid4().hex[:8]}"
    else:
        url = kind
    store = open_store(url)
    yield store
    if kind == "redis":
        for instance in store.list_instances():
            store.delete(instance["instance_id"])
        client = redis.Redis.from_url(REDIS_URL)
        prefix = url.rsplit("prefix=", 1)[1]
        for key in client.scan_iter(match=f"{prefix}*"):
            client.delete(key)
    store.close()


def test_store_tape_append_read_from_and_replay(store: Any) -> None:
    ops = [("write", Layer.WORKING, "amount", {"x": [1.5, None, "]]>"]}), ("begin",),
           ("write", Layer.WORKING, "größe", "ü" * 300), ("snapshot",),
           ("write", Layer.WORKING, "policy", 1), ("complete", ["größe"]),
           ("delete", Layer.WORKING, "größe"), ("restore", 0)]
    ctx, _, _, snaps = run_ops(ops)
    events = [json.loads(json.dumps(e.to_dict())) for e in ctx.tape]
    iid = f"{PREFIX}-{uuid.uuid4().hex[:8]}"
    assert store.create({"id": iid, "process_id": "p", "status": "running"}) == 1
    version = 1
    for start in range(0, len(events), 3):
        version = store.append_events(iid, "main", events[start:start + 3])
    assert store.tape_heads(iid) == {"main": events[-1]["seq"]}
    for since in (0, 1, events[len(events) // 2]["seq"], events[-1]["seq"]):
        read = store.read_tape(iid, "main", since)
        assert [e["seq"] for e in read] == [e["seq"] for e in events if e["seq"] > since]
    assert LayeredContext.replay(store.read_tape(iid, "main")) == ctx
    # optimistic concurrency: a stale version is refused and changes nothing
    from context_layers.stores import TapeSequenceError, VersionConflict
    record, got = store.load(iid)
    assert got == version
    with pytest.raises(VersionConflict):
        store.save(iid, {**record, "status": "waiting"}, version - 1)
    with pytest.raises(TapeSequenceError):
        store.append_events(iid, "main", [events[0]])
    assert store.load(iid) == (record, version)
    assert store.save(iid, {**record, "status": "waiting"}, version) == version + 1
    # snapshots round-trip exactly
    snap = snaps[0][0]
    store.put_snapshot(iid, snap.id, snap.to_dict())
    assert state_bytes(type(snap).from_dict(snap.id, store.get_snapshot(iid, snap.id))) == snaps[0][1]
    assert store.list_snapshots(iid) == [snap.id]
    # pending confirmations: answered once
    from context_layers.stores import ConfirmationAnswered
    store.put_confirmation({"id": f"{iid}-c", "instance_id": iid, "options": ["a", "b"]})
    assert [c["id"] for c in store.list_confirmations(iid)] == [f"{iid}-c"]
    assert store.answer_confirmation(f"{iid}-c", "a", "ann")["answer"] == "a"
    with pytest.raises(ConfirmationAnswered):
        store.answer_confirmation(f"{iid}-c", "b", "bob")
    assert store.list_confirmations(iid) == []
