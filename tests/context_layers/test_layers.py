"""Every row of the layer table in DESIGN.md, and the write rule: promotion first,
then the permission check on the effective layer."""

import json

import pytest

from context_layers import (
    ContextKeyError,
    ContextValueError,
    ContextWriteDenied,
    Layer,
    LayeredContext,
)
from context_layers.tape import EventKind


@pytest.fixture
def ctx():
    c = LayeredContext(system={"policy": "dual approval above 100000", "model_limit": 8000})
    c.write(Layer.PROCESS, "application_id", "APP001", actor="submit")
    return c


def test_layer_enum_names():
    assert [str(x) for x in Layer] == ["L0", "L1", "L2", "L3", "L4", "L5"]
    assert Layer.SYSTEM is Layer(0) and Layer.EPHEMERAL is Layer(5)
    assert Layer.parse("L4") is Layer.WORKING and Layer.parse("history") is Layer.HISTORY
    with pytest.raises(ValueError, match="unknown layer 'L9'"):
        Layer.parse("L9")


def test_resolve_first_hit_wins_from_l0(ctx):
    ctx.write(Layer.KNOWLEDGE, "k", "knowledge", actor="rag")
    ctx.write(Layer.EPHEMERAL, "e", 1, actor="a")
    assert ctx.resolve("k") == "knowledge"
    assert ctx.locate("k") is Layer.KNOWLEDGE
    with pytest.raises(KeyError):
        ctx.resolve("missing")
    assert ctx.get("missing", 7) == 7


# --- L0 SYSTEM: never writable by activities --------------------------------------------

@pytest.mark.parametrize("target", list(Layer))
def test_system_key_is_denied_from_every_layer(ctx, target):
    before = ctx.as_dict()["L0"]
    with pytest.raises(ContextWriteDenied) as info:
        ctx.write(target, "policy", "anything goes", actor="rogue")
    err = info.value
    assert err.key == "policy" and err.requested is target and err.effective is Layer.SYSTEM
    assert "SYSTEM" in err.reason
    assert ctx.as_dict()["L0"] == before
    last = ctx.tape[-1]
    assert last.kind == EventKind.DENIED and last.data["key"] == "policy" and last.actor == "rogue"


def test_new_key_to_system_is_denied(ctx):
    with pytest.raises(ContextWriteDenied):
        ctx.write(Layer.SYSTEM, "new", 1, actor="a")
    assert "new" not in ctx.layer(Layer.SYSTEM)


def test_system_delete_denied(ctx):
    with pytest.raises(ContextWriteDenied):
        ctx.delete(Layer.WORKING, "policy", actor="a")
    assert ctx.resolve("policy") == "dual approval above 100000"


# --- L1 PROCESS: append-only ------------------------------------------------------------

def test_process_accepts_new_key_once_and_refuses_change(ctx):
    ctx.write(Layer.PROCESS, "amount", 120000, actor="submit")
    assert ctx.layer(Layer.PROCESS)["amount"] == 120000
    with pytest.raises(ContextWriteDenied) as info:
        ctx.write(Layer.PROCESS, "amount", 1, actor="submit")
    assert info.value.effective is Layer.PROCESS
    with pytest.raises(ContextWriteDenied):
        ctx.write(Layer.WORKING, "amount", 1, actor="risk")  # promoted to PROCESS, denied there
    with pytest.raises(ContextWriteDenied):
        ctx.delete(Layer.PROCESS, "amount", actor="x")
    assert ctx.resolve("amount") == 120000


# --- L2 KNOWLEDGE: read/write ----------------------------------------------------------

def test_knowledge_read_write(ctx):
    ctx.write(Layer.KNOWLEDGE, "rule:1", {"text": "r", "source": "risk_kb/rules.md", "confidence": 0.9}, actor="rag")
    ctx.write(Layer.KNOWLEDGE, "rule:1", {"text": "r2", "source": "risk_kb/rules.md", "confidence": 0.8}, actor="rag")
    # a WORKING write of a KNOWLEDGE key is auto-promoted into KNOWLEDGE, where it is allowed
    assert ctx.write(Layer.WORKING, "rule:1", {"text": "r3"}, actor="a") is Layer.KNOWLEDGE
    assert ctx.layer(Layer.KNOWLEDGE)["rule:1"] == {"text": "r3"}
    assert "rule:1" not in ctx.layer(Layer.WORKING)
    ctx.delete(Layer.KNOWLEDGE, "rule:1", actor="rag")
    assert "rule:1" not in ctx


# --- L3 HISTORY: filled from WORKING at activity end -----------------------------------

def test_history_is_filled_by_completion_not_by_direct_writes(ctx):
    with pytest.raises(ContextWriteDenied, match="WORKING"):
        ctx.write(Layer.HISTORY, "x", 1, actor="a")
    ctx.begin_activity("risk_assessment")
    ctx.write(Layer.WORKING, "risk_level", "medium", actor="risk_assessment")
    ctx.write(Layer.EPHEMERAL, "scratch", [1, 2], actor="risk_assessment")
    record = ctx.complete_activity("risk_assessment", summary="medium risk", preserve_keys=["risk_level"])
    assert ctx.layer(Layer.HISTORY)["risk_level"] == "medium"
    assert dict(ctx.layer(Layer.WORKING)) == {} and dict(ctx.layer(Layer.EPHEMERAL)) == {}
    assert record["summary"] == "medium risk" and record["keys"] == ["risk_level", "scratch"]
    assert ctx.layer(Layer.HISTORY)["activity:risk_assessment"]["activity"] == "risk_assessment"
    assert list(ctx.layer(Layer.HISTORY)) == ["risk_level", "activity:risk_assessment"]
    assert "risk_level" in ctx.preserved


def test_history_data_key_update_is_promoted_records_are_not_writable(ctx):
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "status", "draft", actor="a")
    ctx.complete_activity("a")
    ctx.begin_activity("b")
    # auto-promotion: the key lives in HISTORY, so the update lands there (allowed for data keys)
    assert ctx.write(Layer.WORKING, "status", "final", actor="b") is Layer.HISTORY
    assert ctx.resolve("status") == "final"
    with pytest.raises(ContextWriteDenied, match="engine and the compressor"):
        ctx.write(Layer.WORKING, "activity:a", "forged", actor="b")
    ctx.complete_activity("b")
    assert ctx.layer(Layer.HISTORY)["activity:b"]["keys"] == ["status"]


def test_a_record_counts_the_tokens_of_what_the_activity_wrote_in_history_too(ctx):
    # an update of a key HISTORY holds lands there at once, not in WORKING: the record counted
    # only what moved from WORKING, 0 for a loop body that rewrites its keys each pass
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "status", "draft", actor="a")
    ctx.complete_activity("a")
    ctx.begin_activity("b")
    ctx.write(Layer.WORKING, "status", "final and signed by the reviewer", actor="b")
    ctx.write(Layer.WORKING, "fresh", "new", actor="b")
    record = ctx.complete_activity("b")
    assert record["keys"] == ["status", "fresh"]
    status, fresh = ctx.key_tokens(Layer.HISTORY, "status"), ctx.key_tokens(Layer.HISTORY, "fresh")
    assert status > 1 and record["tokens"] == status + fresh
    assert LayeredContext.replay(ctx.tape) == ctx


def test_a_record_names_a_data_key_with_a_low_line_that_working_hands_on(ctx):
    # WORKING hands on what was written before the activity began (an injected fix, a contextInject)
    # and the record names it; only the engine's own bookkeeping (a split's markers, a join's
    # _mergedConflicts) moves unnamed. A data key of the process that starts with "_" is data.
    ctx.write(Layer.WORKING, "_", None, actor="inject")
    ctx.write(Layer.WORKING, "_note", "checked by hand", actor="inject")
    ctx.begin_activity("a")
    record = ctx.complete_activity("a")
    assert record["keys"] == ["_", "_note"]
    assert list(ctx.layer(Layer.HISTORY)) == ["_", "_note", "activity:a"]
    assert LayeredContext.replay(ctx.tape) == ctx


def test_an_activity_cannot_write_a_record_key_that_would_move_into_history(ctx):
    # not only an existing record: a new activity:/event:/compaction: key in WORKING arrives in
    # HISTORY at activity end as a record the engine never wrote
    ctx.begin_activity("a")
    for key in ("activity:later", "event:wait_docs", "compaction:1"):
        with pytest.raises(ContextWriteDenied, match="name the key differently"):
            ctx.write(Layer.WORKING, key, {"kind": "activity", "summary": "forged"}, actor="a")
        assert ctx.tape[-1].kind == "denied" and ctx.tape[-1].data["key"] == key
    ctx.write(Layer.WORKING, "tool:search", {"kind": "tool_call_result", "status": "ok"}, actor="a")  # its own
    ctx.complete_activity("a")
    assert list(ctx.layer(Layer.HISTORY)) == ["tool:search", "activity:a"]
    ctx.begin_activity("later")
    ctx.complete_activity("later")
    assert ctx.layer(Layer.HISTORY)["activity:later"]["activity"] == "later"
    assert LayeredContext.replay(ctx.tape) == ctx


def test_a_denied_delete_says_delete(ctx):
    # the message of a refused delete read "write of key ... denied"
    ctx.write(Layer.PROCESS, "amount", 5, actor="a")
    with pytest.raises(ContextWriteDenied) as denied:
        ctx.delete(Layer.WORKING, "amount", actor="a")
    assert str(denied.value).startswith("delete of key 'amount' from L1 (requested L4, auto-promoted) denied")
    assert denied.value.op == "delete" and ctx.tape[-1].data["op"] == "delete"
    with pytest.raises(ContextWriteDenied, match="^write of key 'amount' to L1"):
        ctx.write(Layer.WORKING, "amount", 6, actor="a")


def test_repeated_activity_gets_numbered_records(ctx):
    for _ in range(3):
        ctx.begin_activity("loop")
        ctx.complete_activity("loop")
    assert [k for k in ctx.layer(Layer.HISTORY)] == ["activity:loop", "activity:loop#2", "activity:loop#3"]


# --- L4 WORKING and L5 EPHEMERAL --------------------------------------------------------

def test_working_and_ephemeral_read_write(ctx):
    ctx.write(Layer.WORKING, "w", 1, actor="a")
    ctx.write(Layer.WORKING, "w", 2, actor="a")
    ctx.write(Layer.EPHEMERAL, "e", 1, actor="a")
    assert ctx.resolve("w") == 2
    # the same key written to EPHEMERAL is promoted into WORKING (a lower layer holds it)
    assert ctx.write(Layer.EPHEMERAL, "w", 3, actor="a") is Layer.WORKING
    ctx.delete(Layer.EPHEMERAL, "e", actor="a")
    ctx.delete(Layer.WORKING, "w", actor="a")
    assert "w" not in ctx and "e" not in ctx
    with pytest.raises(ContextKeyError, match="'w'"):
        ctx.delete(Layer.WORKING, "w", actor="a")


def test_ephemeral_cleared_at_every_activity_end(ctx):
    ctx.begin_activity("a")
    ctx.write(Layer.EPHEMERAL, "token", "secret", actor="a")
    ctx.complete_activity("a")
    assert "token" not in ctx


# --- values ---------------------------------------------------------------------------

@pytest.mark.parametrize("value, fragment", [
    (object(), "type object"),
    ({1: "x"}, "key 1 of type int"),
    ({"a": {"b": {3}}}, "a.b is of type set"),
    (float("nan"), "nan"),
    ([1, b"bytes"], "[1] is of type bytes"),
])
def test_non_json_values_refused_whole(ctx, value, fragment):
    before = ctx.state_json()
    tape_len = len(ctx.tape)
    with pytest.raises(ContextValueError) as info:
        ctx.write(Layer.WORKING, "bad", value, actor="a")
    assert isinstance(info.value, TypeError)
    assert "'bad'" in str(info.value) and fragment in str(info.value)
    assert ctx.state_json() == before and len(ctx.tape) == tape_len


def test_values_are_frozen_copies(ctx):
    src = {"items": [1, 2]}
    ctx.write(Layer.WORKING, "v", src, actor="a")
    src["items"].append(3)
    assert ctx.resolve("v") == {"items": [1, 2]}
    with pytest.raises(TypeError):
        ctx.resolve("v")["items"].append(4)
    assert json.loads(json.dumps(ctx.resolve("v"))) == {"items": [1, 2]}


# --- snapshots, restore, fork -------------------------------------------------------------

def test_snapshot_restore_is_a_tape_event(ctx):
    ctx.write(Layer.WORKING, "a", 1, actor="x")
    snap = ctx.snapshot()
    ctx.write(Layer.WORKING, "a", 2, actor="x")
    ctx.write(Layer.KNOWLEDGE, "b", 1, actor="x")
    ctx.restore(snap)
    assert ctx.as_dict() == snap.as_dict()
    assert ctx.tape[-1].kind == EventKind.RESTORE and ctx.tape[-1].data["snapshot_id"] == snap.id
    with pytest.raises(ContextKeyError, match="snapshot 'nope'"):
        ctx.restore("nope")


def test_fork_shares_and_isolates(ctx):
    ctx.write(Layer.WORKING, "shared", {"n": 1}, actor="x")
    ctx.write(Layer.EPHEMERAL, "temp", 1, actor="x")
    snap = ctx.snapshot()
    a = LayeredContext.fork(snap, name="main/a", branch_id="a", inject={"review_type": "finance"})
    b = LayeredContext.fork(snap, name="main/b", branch_id="b", inject={"review_type": "risk"})
    a.write(Layer.WORKING, "shared", {"n": 2}, actor="a")
    assert b.resolve("shared") == {"n": 1} and ctx.resolve("shared") == {"n": 1}
    assert a.resolve("_branch_id") == "a" and a.resolve("_snapshot_id") == snap.id
    assert "temp" not in a and a.resolve("review_type") == "finance"
    assert a.layer(Layer.SYSTEM)["policy"] == ctx.layer(Layer.SYSTEM)["policy"]


def test_abort_puts_layers_back(ctx):
    ctx.begin_activity("t")
    ctx.write(Layer.WORKING, "x", 1, actor="t")
    before = ctx.snapshot()
    ctx.complete_activity("t")
    ctx.begin_activity("u")
    ctx.write(Layer.WORKING, "y", 1, actor="u")
    ctx.write(Layer.WORKING, "x", 2, actor="u")
    ctx.abort_activity("u", reason="script raised")
    assert ctx.resolve("x") == 1 and "y" not in ctx and ctx.current_activity is None
    assert ctx.layer(Layer.HISTORY)["x"] == 1
    assert before.layer(Layer.WORKING)["x"] == 1


def test_tape_roundtrip_through_json(ctx):
    ctx.begin_activity("t")
    ctx.write(Layer.WORKING, "x", {"deep": [1, None, True]}, actor="t")
    snap = ctx.snapshot("mid")
    ctx.complete_activity("t", preserve_keys=["x"])
    ctx.anchor("handoff")
    ctx.restore(snap, layers=[Layer.HISTORY])
    loaded = LayeredContext.from_dict(json.loads(json.dumps(ctx.to_dict())))
    assert loaded == ctx and loaded.state_json() == ctx.state_json()
    assert loaded.preserved == ctx.preserved
    fork = LayeredContext.fork(ctx.snapshot(), name="main/b", branch_id="b", inject={"t": 1})
    fork.write(Layer.WORKING, "z", 2, actor="b")
    assert LayeredContext.from_dict(json.loads(json.dumps(fork.to_dict()))) == fork


def test_a_branch_in_another_encoding_loads_and_replays_with_its_token_counts():
    """A branch's base snapshot, loaded from its record, was counted again in the default
    encoding, and a replay of a branch's tape counted its writes in the default encoding."""
    text = "Darlehen über 50 000 € brauchen zwei Freigaben; 融资审批需要两名审核人. " * 4
    main = LayeredContext(system={"policy": text}, encoding="o200k_base")
    main.write(Layer.WORKING, "note", text, actor="a")
    branch = LayeredContext.fork(main.snapshot(), name="main/b", branch_id="b", encoding="o200k_base")
    branch.write(Layer.WORKING, "reply", text[:80], actor="b")
    loaded = LayeredContext.from_dict(json.loads(json.dumps(branch.to_dict())))
    replayed = LayeredContext.replay(branch.tape)
    for rebuilt in (loaded, replayed):
        assert rebuilt.encoding == "o200k_base" and rebuilt.token_report() == branch.token_report()
        assert rebuilt.key_tokens(Layer.WORKING, "reply") == branch.key_tokens(Layer.WORKING, "reply")


def test_anchor_and_view(ctx):
    ctx.begin_activity("a")
    ctx.write(Layer.WORKING, "old", 1, actor="a")
    ctx.complete_activity("a")
    ctx.anchor("handoff")
    ctx.begin_activity("b")
    ctx.write(Layer.WORKING, "new", 2, actor="b")
    ctx.complete_activity("b")
    tape_len = len(ctx.tape)
    view = ctx.view(anchor="handoff")
    assert list(view.layer(Layer.HISTORY)) == ["new", "activity:b"]
    assert list(ctx.layer(Layer.HISTORY)) == ["old", "activity:a", "new", "activity:b"]

    def drop_records(entries):
        return [e for e in entries if e.kind != "activity"]

    assert list(ctx.view(hooks=[drop_records]).layer(Layer.HISTORY)) == ["old", "new"]
    assert len(ctx.tape) == tape_len  # views never change the tape
    with pytest.raises(ContextKeyError, match="anchor 'nope' was not found"):
        ctx.view(anchor="nope")


def test_record_keys_never_overwrite_history_merged_from_a_branch(ctx):
    ctx.begin_activity("review")
    ctx.complete_activity("review")
    branch = LayeredContext.fork(ctx.snapshot(), name="main/b", branch_id="b")
    branch.begin_activity("check")
    branch.complete_activity("check")
    # the join brings the branch's record back, but not its counter
    ctx.apply_changes([(Layer.HISTORY, "activity:check", branch.layer(Layer.HISTORY)["activity:check"])],
                      kind="join", actor="join")
    ctx.begin_activity("check")
    ctx.complete_activity("check", summary="second pass")
    history = ctx.layer(Layer.HISTORY)
    assert history["activity:check"]["summary"] != "second pass"
    assert history["activity:check#2"]["summary"] == "second pass"
    assert LayeredContext.replay(ctx.tape) == ctx


def test_fork_injection_follows_the_write_rule(ctx):
    branch = LayeredContext.fork(ctx.snapshot(), name="main/x", branch_id="x", inject={"track": "full"})
    branch.begin_activity("t")
    branch.complete_activity("t")  # `_branch_id` and `track` move to HISTORY
    inner = LayeredContext.fork(branch.snapshot(), name="main/x/y", branch_id="y", inject={"track": "fast"})
    assert inner.resolve("_branch_id") == "y" and inner.resolve("track") == "fast"
    assert inner.locate("track") is Layer.HISTORY
    with pytest.raises(ContextWriteDenied, match="contextInject of branch 'z'"):
        LayeredContext.fork(ctx.snapshot(), name="main/z", branch_id="z", inject={"application_id": "forged"})


def test_write_many_is_all_or_nothing(ctx):
    before = ctx.state_json()
    with pytest.raises(ContextWriteDenied) as info:
        ctx.write_many(Layer.WORKING, {"ok": 1, "policy": "override", "also_ok": 2}, actor="model")
    assert info.value.key == "policy"
    assert ctx.state_json() == before and ctx.tape[-1].kind == EventKind.DENIED
    with pytest.raises(ContextValueError):
        ctx.write_many(Layer.WORKING, {"ok": 1, "bad": {1, 2}}, actor="model")
    assert ctx.state_json() == before
    assert ctx.write_many(Layer.WORKING, {"ok": 1, "application_id2": "x"}, actor="model") == {
        "ok": Layer.WORKING, "application_id2": Layer.WORKING}
    assert ctx.check_write(Layer.WORKING, "application_id") == (Layer.PROCESS, ctx.check_write(Layer.WORKING, "application_id")[1])
    assert ctx.check_write(Layer.WORKING, "application_id")[1] is not None


def test_a_write_in_a_long_activity_does_not_copy_what_the_activity_wrote_before():
    """The keys an open activity wrote are kept in a persistent map: a write after 10,000
    others allocates about what the first ones did (a tuple copy per write made 50,000
    writes in one activity quadratic). Measured in allocated bytes, not time."""
    import statistics
    import tracemalloc

    def median_peak(ctx, start, n=41):
        peaks = []
        for i in range(start, start + n):
            tracemalloc.reset_peak()
            before = tracemalloc.get_traced_memory()[0]
            ctx.write(Layer.WORKING, f"k{i}", i, actor="t")
            peaks.append(tracemalloc.get_traced_memory()[1] - before)
        return statistics.median(peaks)

    ctx = LayeredContext()
    ctx.begin_activity("t")
    tracemalloc.start()
    try:
        early = median_peak(ctx, 0)
        for i in range(41, 10_000):
            ctx.write(Layer.WORKING, f"k{i}", i, actor="t")
        late = median_peak(ctx, 10_000)
    finally:
        tracemalloc.stop()
    assert late < early + 8_000, (early, late)  # a copy of 10,000 keys is 80,000 bytes
    keys = ctx.complete_activity("t")["keys"]  # in write order, each once
    assert keys[:3] == ["k0", "k1", "k2"] and keys[-1] == "k10040" and len(keys) == len(set(keys)) == 10_041


def test_a_change_without_an_actor_is_the_open_activity_s() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.PROCESS, "amount", 1)  # as the seed's sketch writes: no actor
    ctx.begin_activity("review")
    ctx.write(Layer.WORKING, "note", "ok")
    ctx.write_many(Layer.WORKING, {"a": 1})
    ctx.delete(Layer.WORKING, "a")
    with pytest.raises(ContextWriteDenied):
        ctx.write(Layer.WORKING, "policy", "x")
    ctx.complete_activity("review")
    assert [(e.kind, e.actor) for e in ctx.tape][1:5] == [("write", "anonymous"), ("begin", "review"),
                                                          ("write", "review"), ("write", "review")]
    assert [e.actor for e in ctx.tape if e.kind in ("delete", "denied")] == ["review", "review"]
    assert LayeredContext.replay(ctx.tape) == ctx


def test_a_stored_snapshot_does_not_depend_on_the_hash_seed() -> None:
    """Two processes store the same snapshot as the same text (persistent maps iterate in hash order)."""
    import subprocess
    import sys

    code = ("import json\nfrom context_layers import LayeredContext, Layer\n"
            "from context_layers.context import _dump_snapshot\n"
            "c = LayeredContext(system={'a': 1})\n"
            "for i in range(3):\n"
            "    for t in ('alpha', 'beta', 'gamma', 'delta', 'epsilon', 'zeta'):\n"
            "        c.begin_activity(t); c.write(Layer.WORKING, t + str(i), i)\n"
            "        c.complete_activity(t, preserve_keys=[t + str(i)])\n"
            "print(json.dumps(_dump_snapshot(c.snapshot())))\n")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2", "3")}
    assert len(outs) == 1
