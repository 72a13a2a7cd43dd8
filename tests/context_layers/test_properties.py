"""Random sequences of operations against random layers keep the layer invariants."""

import json

from hypothesis import example, given
from hypothesis import strategies as st

from context_layers import ContextKeyError, ContextWriteDenied, Layer, LayeredContext, LayerflowError

KEYS = st.sampled_from(["policy", "amount", "a", "b", "c", "risk_level", "activity:x"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
LAYERS = st.sampled_from(list(Layer))

OPS = st.one_of(
    st.tuples(st.just("write"), LAYERS, KEYS, JSON),
    st.tuples(st.just("delete"), LAYERS, KEYS),
    st.tuples(st.just("begin"), st.sampled_from(["t1", "t2"])),
    st.tuples(st.just("complete"), st.sampled_from(["t1", "t2"]), st.lists(KEYS, max_size=2)),
    st.tuples(st.just("abort")),
    st.tuples(st.just("snapshot")),
    st.tuples(st.just("restore"), st.integers(0, 10)),
)


@given(st.lists(OPS, max_size=40))
# a snapshot inside an activity that is then aborted holds a PROCESS fact the abort undid
@example([("begin", "t1"), ("write", Layer.PROCESS, "amount", None), ("snapshot",), ("abort",), ("restore", 0)])
def test_random_operations_keep_invariants(ops):
    ctx = LayeredContext(system={"policy": "fixed"})
    system = dict(ctx.layer(Layer.SYSTEM))
    process_seen: dict[str, str] = {}
    snaps = []
    process_at_begin: dict[str, str] = {}
    for op in ops:
        try:
            if op[0] == "write":
                ctx.write(op[1], op[2], op[3], actor="p")
            elif op[0] == "delete":
                ctx.delete(op[1], op[2], actor="p")
            elif op[0] == "begin":
                ctx.begin_activity(op[1])
                process_at_begin = dict(process_seen)
            elif op[0] == "complete":
                ctx.complete_activity(ctx.current_activity or op[1], preserve_keys=op[2])
            elif op[0] == "abort":
                if ctx.current_activity:
                    ctx.abort_activity(ctx.current_activity, reason="test")
                    # a failed activity committed nothing, PROCESS facts included
                    process_seen = dict(process_at_begin)
            elif op[0] == "snapshot":
                snaps.append((ctx.snapshot(), ctx.as_dict()))
            elif op[0] == "restore" and snaps:
                snap, layers_then = snaps[op[1] % len(snaps)]
                process_before = ctx.as_dict()["L1"]
                ctx.restore(snap, layers=list(Layer))
                # (d) exactly the layers at snapshot time; SYSTEM and PROCESS are never rolled
                # back, nor forward: a PROCESS fact of an activity aborted after the snapshot
                # stays undone (the abort committed nothing)
                now = ctx.as_dict()
                assert {k: v for k, v in now.items() if k not in ("L0", "L1")} == \
                    {k: v for k, v in layers_then.items() if k not in ("L0", "L1")}
                assert now["L1"] == process_before
        except (ContextWriteDenied, ContextKeyError):
            pass
        except LayerflowError as e:  # begin while open / complete a different one
            assert "open" in str(e)
        # (a) SYSTEM never changes
        assert dict(ctx.layer(Layer.SYSTEM)) == system
        # (b) no PROCESS key ever changes value (or disappears)
        for key, value in ctx.layer(Layer.PROCESS).items():
            text = json.dumps(value, sort_keys=True)
            assert process_seen.setdefault(key, text) == text
        assert set(process_seen) == set(ctx.layer(Layer.PROCESS))
    # (c) replaying the tape gives an equal context, through JSON too
    assert LayeredContext.replay(ctx.tape) == ctx
    assert LayeredContext.from_dict(json.loads(json.dumps(ctx.to_dict()))).state_json() == ctx.state_json()


@given(st.lists(OPS, max_size=30), st.data())
def test_replay_until_any_seq_matches_the_state_then(ops, data):
    ctx = LayeredContext(system={"policy": "fixed"})
    states = {ctx.tape[-1].seq: ctx.state_json()}
    for op in ops:
        try:
            if op[0] == "write":
                ctx.write(op[1], op[2], op[3], actor="p")
            elif op[0] == "delete":
                ctx.delete(op[1], op[2], actor="p")
            elif op[0] == "begin":
                ctx.begin_activity(op[1])
            elif op[0] == "complete" and ctx.current_activity:
                ctx.complete_activity(ctx.current_activity)
        except LayerflowError:
            pass
        states[ctx.tape[-1].seq] = ctx.state_json()
    seq = data.draw(st.sampled_from(sorted(states)))
    assert LayeredContext.replay(ctx.tape, until=seq).state_json() == states[seq]
