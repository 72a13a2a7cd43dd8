"""Split and join on real LayeredContexts, the loan review scenario, and the O(changes) join."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import gateways
import gateways.join as join_module
from context_layers import Layer, LayeredContext, RuleDrivenCompressor, canonical_json, thaw
from context_layers.compression import HOOK_KEEP_RECENT
from context_layers.config import ActivityExtensionConfig, config_from_dict
from context_layers.errors import LayerflowError, MergeConflictError
from gateways import (
    DELETED,
    MERGED_CONFLICTS_KEY,
    BranchContext,
    ContextSplitter,
    JoinResult,
    apply_join,
    join_contexts,
)
from gateways.conflicts import same_value
from gateways.join import side_counters_told

LOAN_CONFIG = {
    "gatewayId": "review_join",
    "branches": [
        {"id": "finance_review", "contextInject": {"review_type": "finance"}, "reasonKey": "finance_notes"},
        {"id": "risk_review", "contextInject": {"review_type": "risk"}, "reasonKey": "risk_notes"},
    ],
    "conflictPolicy": {"rules": [{
        "key": "approval_status", "when": "risk_level == 'high' and amount > 100000",
        "value": "pending_dual_approval", "reason": "high risk and high amount need dual approval", "confirm": True}]},
    "humanConfirm": {"timeout": 120},
}


def activity(ctx: LayeredContext, task: str, writes: dict[str, Any] | None = None, deletes: tuple[str, ...] = (),
             complete: bool = True) -> None:
    ctx.begin_activity(task)
    for key, value in (writes or {}).items():
        ctx.write(Layer.WORKING, key, value, actor=task)
    for key in deletes:
        ctx.delete(Layer.WORKING, key, actor=task)
    if complete:
        ctx.complete_activity(task)


def loan_parent() -> LayeredContext:
    ctx = LayeredContext(system={"policy": "loans over 100k need review"})
    ctx.write(Layer.PROCESS, "application_id", "APP-1", actor="submit")
    ctx.write(Layer.PROCESS, "amount", 150000, actor="submit")
    activity(ctx, "intake", {"applicant": {"name": "Ada", "income": 90000}, "counter": 1})
    ctx.write(Layer.EPHEMERAL, "scratch", "tmp", actor="engine")
    return ctx


def split(ctx: LayeredContext, ids: list[str], cfg: ActivityExtensionConfig | None = None) -> list[BranchContext]:
    return ContextSplitter().split(ctx, "review_split", ids, cfg)


def join(ctx: LayeredContext, branches: list[BranchContext], cfg: ActivityExtensionConfig | None = None,
         **kw: Any) -> JoinResult:
    snapshot = ctx.get_snapshot(branches[0].snapshot_id)
    return join_contexts(snapshot, {b.branch_id: b.context for b in branches}, config=cfg,
                         gateway_id=kw.pop("gateway_id", "review_join"), clock=lambda: 0.0, **kw)


# ---- split ---------------------------------------------------------------------------

def test_split_snapshots_records_and_forks() -> None:
    ctx = loan_parent()
    cfg = config_from_dict(LOAN_CONFIG)
    before = len(ctx.tape)
    branches = split(ctx, ["finance_review", "risk_review", "legal_review"], cfg)
    snapshot_event, split_event = ctx.tape[before:]
    assert snapshot_event.kind == "snapshot" and snapshot_event.data["label"] == "split:review_split"
    assert split_event.data["note"] == "split" and split_event.data["branches"] == ["finance_review", "risk_review", "legal_review"]
    assert split_event.data["inject"] == {"finance_review": {"review_type": "finance"}, "risk_review": {"review_type": "risk"}}
    snapshot_id = snapshot_event.data["snapshot_id"]
    for b, review_type in zip(branches, ["finance", "risk", None]):
        assert b.snapshot_id == snapshot_id and b.context.branch_id == b.branch_id
        assert b.context.tape[0].kind == "fork" and b.context.name == f"main/{b.branch_id}@{snapshot_event.seq}"
        expected = {"_branch_id": b.branch_id, "_snapshot_id": snapshot_id}
        if review_type:
            expected["review_type"] = review_type
        assert dict(b.context.layer(Layer.WORKING)) == expected == dict(b.injected)
        assert dict(b.context.layer(Layer.EPHEMERAL)) == {}
        for layer in (Layer.SYSTEM, Layer.PROCESS, Layer.KNOWLEDGE, Layer.HISTORY):
            assert dict(b.context.layer(layer)) == dict(ctx.layer(layer))
    assert dict(ctx.layer(Layer.EPHEMERAL)) == {"scratch": "tmp"}  # the parent is untouched


def test_split_rejects_repeated_branch_ids() -> None:
    with pytest.raises(ValueError, match="repeated: \\['a'\\]"):
        split(loan_parent(), ["a", "b", "a"])


# ---- the loan review -------------------------------------------------------------------

def loan_review(answers: dict[str, Any] | None = None,
                human_available: bool = False) -> tuple[LayeredContext, JoinResult, dict[str, LayeredContext]]:
    ctx = loan_parent()
    cfg = config_from_dict(LOAN_CONFIG)
    finance, risk = split(ctx, ["finance_review", "risk_review"], cfg)
    activity(finance.context, "finance_review", {"approval_status": "approved", "finance_notes": "income verified",
                                                 "dti": 0.31})
    activity(risk.context, "risk_review", {"approval_status": "rejected", "risk_level": "high",
                                           "risk_notes": "two defaults in 2023"})
    result = join(ctx, [finance, risk], cfg, answers=answers, human_available=human_available)
    return ctx, result, {"finance_review": finance.context, "risk_review": risk.context}


def test_parallel_review_has_exactly_one_conflict() -> None:
    _, result, _ = loan_review(human_available=True)
    [(conflict, resolution)] = result.conflicts
    assert resolution is None
    assert (conflict.key, conflict.layer, conflict.base_value) == ("approval_status", Layer.WORKING, DELETED)
    assert conflict.conflicting_values == {"finance_review": "approved", "risk_review": "rejected"}
    assert conflict.source_branches == ("finance_review", "risk_review")
    [request] = result.pending
    assert request.id == "review_join/approval_status" and request.suggested == "pending_dual_approval"
    assert "income verified" in request.message and "two defaults in 2023" in request.message
    assert request.timeout == 120
    assert [(s.resolver, s.outcome) for s in result.steps] == [("policy", "suggested"), ("human", "pending")]


def test_parallel_review_resolved_by_policy_and_a_person() -> None:
    ctx, result, branch_contexts = loan_review(answers={"review_join/approval_status": "pending_dual_approval"})
    [(_, resolution)] = result.conflicts
    assert resolution is not None and resolution.value == "pending_dual_approval" and resolution.resolver == "human"
    assert "high risk and high amount need dual approval" in resolution.reason
    event = apply_join(ctx, result, branches=branch_contexts)
    assert event is not None and event.data["note"] == "join"
    for branch in branch_contexts.values():
        assert branch.tape[-1].data == {"note": "joined", "gateway_id": "review_join", "parent": "main",
                                        "parent_seq": event.seq}
    history = ctx.layer(Layer.HISTORY)
    assert history["approval_status"] == "pending_dual_approval"
    assert history["risk_level"] == "high" and history["dti"] == 0.31
    for scoped in ("review_type", "_branch_id", "_snapshot_id"):  # branch-scoped: gone after the join
        assert scoped not in ctx
    assert dict(ctx.layer(Layer.EPHEMERAL)) == {}
    [entry] = ctx.layer(Layer.WORKING)[MERGED_CONFLICTS_KEY]
    assert entry == {
        "gatewayId": "review_join", "layer": "L4", "key": "approval_status", "baseValue": None, "baseAbsent": True,
        "conflictingValues": ["approved", "rejected"],
        "sourceBranches": ["finance_review", "risk_review"],
        "values": {"finance_review": "approved", "risk_review": "rejected"},
        "resolution": {"value": "pending_dual_approval", "resolver": "human",
                       "reason": "a person confirmed the policy suggestion: high risk and high amount need dual approval"},
        "time": "1970-01-01T00:00:00.000Z"}
    notes = [e.data.get("note") for e in ctx.tape if e.kind == "note"]
    assert notes[-4:] == ["split", "conflict", "resolution", "resolution"]
    assert result.conflict_records() == [{
        "gateway_id": "review_join", "layer": "L4", "key": "approval_status", "base_value": None,
        "values": {"finance_review": "approved", "risk_review": "rejected"},
        "resolution": {"value": "pending_dual_approval", "resolver": "human", "reason": entry["resolution"]["reason"]},
        "base_absent": True}]  # absent at the split: null, as the seed's base.get(key); base_absent tells it from null
    assert LayeredContext.replay(ctx.tape) == ctx


def test_pending_join_changes_nothing() -> None:
    ctx, result, _ = loan_review(human_available=True)
    state = ctx.state_json()
    assert apply_join(ctx, result) is None
    assert ctx.state_json() == state
    assert ctx.tape[-1].data["note"] == "confirmation_pending"
    assert ctx.tape[-1].data["confirmations"][0]["id"] == "review_join/approval_status"
    assert result.merged_conflicts[0]["resolution"] is None


def test_unresolvable_join_fails_naming_the_conflict() -> None:
    with pytest.raises(MergeConflictError, match="approval_status") as info:
        loan_review()
    assert 'finance_review="approved"' in str(info.value) and 'risk_review="rejected"' in str(info.value)


# ---- join rules ------------------------------------------------------------------------

Scenario = Callable[[list[LayeredContext]], None]


def scenario_case(cfg: dict[str, Any] | None, scenario: Scenario, expect: Callable[[LayeredContext], None],
                  *, ids: tuple[str, ...] = ("a", "b"), **kw: Any) -> None:
    ctx = loan_parent()
    config = config_from_dict({"gatewayId": "j", **(cfg or {})})
    branches = ContextSplitter().split(ctx, "s", list(ids), config)
    scenario([b.context for b in branches])
    result = join(ctx, branches, config, gateway_id="j", **kw)
    apply_join(ctx, result)
    expect(ctx)
    assert LayeredContext.replay(ctx.tape) == ctx


def hist(ctx: LayeredContext) -> dict[str, Any]:
    return {k: v for k, v in ctx.layer(Layer.HISTORY).items() if not k.startswith("activity:")}


JOIN_CASES: list[tuple[str, dict[str, Any] | None, Scenario, Callable[[LayeredContext], None]]] = [
    ("a delete propagates",
     None, lambda bs: activity(bs[0], "t", deletes=("counter",)),
     lambda ctx: [assert_eq("counter" in ctx, False)]),
    ("identical changes do not conflict",
     None, lambda bs: [activity(b, f"t{i}", {"counter": 2}) for i, b in enumerate(bs)],
     lambda ctx: [assert_eq(ctx.resolve("counter"), 2), assert_eq(MERGED_CONFLICTS_KEY in ctx, False)]),
    ("writing the value it had is no change",
     None, lambda bs: [activity(bs[0], "t0", {"counter": 1.0}), activity(bs[1], "t1", {"counter": 5})],
     lambda ctx: [assert_eq(ctx.resolve("counter"), 5)]),
    ("new keys follow the base, in branch order",
     None, lambda bs: [activity(bs[1], "t1", {"b1": 1, "b2": 2}), activity(bs[0], "t0", {"a1": 1, "b2": 2})],
     lambda ctx: [assert_eq(list(hist(ctx)), ["applicant", "counter", "a1", "b2", "b1"])]),
    ("sum reducer",
     {"reducers": {"counter": "sum"}},
     lambda bs: [activity(bs[0], "t0", {"counter": 3}), activity(bs[1], "t1", {"counter": 4})],
     lambda ctx: [assert_eq(ctx.resolve("counter"), 6)]),
    ("append reducer on a new key",
     {"reducers": {"findings": "append"}},
     lambda bs: [activity(bs[0], "t0", {"findings": ["income ok"]}), activity(bs[1], "t1", {"findings": ["debt"]})],
     lambda ctx: [assert_eq(ctx.resolve("findings"), ["income ok", "debt"])]),
    ("an injected key changed by one branch survives",
     {"branches": [{"id": "a", "contextInject": {"review_type": "finance"}},
                   {"id": "b", "contextInject": {"review_type": "risk"}}]},
     lambda bs: [activity(bs[0], "t0", {"review_type": "finance-done"}), activity(bs[1], "t1", {"x": 1})],
     lambda ctx: [assert_eq(ctx.resolve("review_type"), "finance-done"), assert_eq("_branch_id" in ctx, False)]),
    ("injected keys left in WORKING do not survive",
     {"branches": [{"id": "a", "contextInject": {"review_type": "finance"}},
                   {"id": "b", "contextInject": {"review_type": "risk"}}]},
     lambda bs: [activity(bs[0], "t0", {"x": 1}), bs[1].write(Layer.WORKING, "y", 2, actor="t1")],
     lambda ctx: [assert_eq(ctx.resolve("x"), 1), assert_eq(ctx.resolve("y"), 2),
                  assert_eq("review_type" in ctx, False), assert_eq(dict(ctx.layer(Layer.WORKING)), {"y": 2})]),
    ("EPHEMERAL is cleared, even what a branch wrote",
     None, lambda bs: bs[0].write(Layer.EPHEMERAL, "tmp", 1, actor="t"),
     lambda ctx: [assert_eq(dict(ctx.layer(Layer.EPHEMERAL)), {})]),
    ("PROCESS additions are kept",
     None, lambda bs: [bs[0].write(Layer.PROCESS, "decision_id", "D-1", actor="t"),
                       bs[1].write(Layer.PROCESS, "decision_id", "D-1", actor="t")],
     lambda ctx: [assert_eq(ctx.layer(Layer.PROCESS)["decision_id"], "D-1")]),
    ("KNOWLEDGE is merged key by key",
     None, lambda bs: [bs[0].write(Layer.KNOWLEDGE, "doc:1", {"text": "a", "source": "kb"}, actor="rag"),
                       bs[1].write(Layer.KNOWLEDGE, "doc:2", {"text": "b", "source": "kb"}, actor="rag")],
     lambda ctx: [assert_eq(list(ctx.layer(Layer.KNOWLEDGE)), ["doc:1", "doc:2"])]),
    ("LAST_WRITER_WINS by arrival",
     {"mergeStrategy": "LAST_WRITER_WINS"},
     lambda bs: [activity(bs[0], "t0", {"counter": 3}), activity(bs[1], "t1", {"counter": 4})],
     lambda ctx: [assert_eq(ctx.resolve("counter"), 3),
                  assert_eq(ctx.resolve(MERGED_CONFLICTS_KEY)[0]["resolution"]["resolver"], "strategy")]),
]


def assert_eq(got: Any, want: Any) -> None:
    assert got == want


@pytest.mark.parametrize(("cfg", "scenario", "expect"), [c[1:] for c in JOIN_CASES], ids=[c[0] for c in JOIN_CASES])
def test_join_rules(cfg: dict[str, Any] | None, scenario: Scenario, expect: Callable[[LayeredContext], None]) -> None:
    scenario_case(cfg, scenario, expect, arrival_order=["b", "a"])


def test_injected_key_that_the_parent_holds_in_working() -> None:
    ctx = loan_parent()
    ctx.write(Layer.WORKING, "review_type", "general", actor="engine")
    cfg = config_from_dict({"branches": [{"id": "a", "contextInject": {"review_type": "finance"}},
                                         {"id": "b", "contextInject": {"review_type": "risk"}}]})
    a, b = ContextSplitter().split(ctx, "s", ["a", "b"], cfg)
    activity(a.context, "t0", {"x": 1})  # moves review_type=finance into a's HISTORY
    result = join(ctx, [a, b], cfg)
    assert result.conflicts == []
    apply_join(ctx, result)
    assert ctx.layer(Layer.WORKING)["review_type"] == "general" and "review_type" not in ctx.layer(Layer.HISTORY)


def test_markers_a_split_inside_each_branch_rewrote_are_no_conflict() -> None:
    """An exclusive gateway inside a branch rewrites the branch's ``_branch_id`` and ``_snapshot_id``
    (a split of its own); two such branches once met as a conflict on both markers, which a person
    was asked to decide."""
    ctx = loan_parent()
    ctx.write(Layer.WORKING, "_branch_id", "outer", actor="engine")
    a, b = split(ctx, ["a", "b"])
    for branch, choice in ((a, "a_small"), (b, "b_large")):
        branch.context.write(Layer.WORKING, "_branch_id", choice, actor="xor")
        branch.context.write(Layer.WORKING, "_snapshot_id", f"snap:{choice}", actor="xor")
        activity(branch.context, choice, {"size": choice})  # the markers move into HISTORY with the size
    result = join(ctx, [a, b], answers={"review_join/size": "a_small"})
    assert [c.key for c, _ in result.conflicts] == ["size"]
    apply_join(ctx, result)
    assert ctx.resolve("_branch_id") == "outer" and "_snapshot_id" not in ctx.resolved()


def test_process_conflict_is_resolved_as_an_addition() -> None:
    ctx = loan_parent()
    a, b = split(ctx, ["a", "b"])
    a.context.write(Layer.PROCESS, "decision_id", "D-1", actor="t")
    b.context.write(Layer.PROCESS, "decision_id", "D-2", actor="t")
    result = join(ctx, [a, b], answers={"review_join/decision_id": "D-2"})
    [(conflict, resolution)] = result.conflicts
    assert conflict.layer == Layer.PROCESS and resolution is not None and resolution.value == "D-2"
    apply_join(ctx, result)
    assert ctx.layer(Layer.PROCESS)["decision_id"] == "D-2"


def test_a_key_two_branches_change_in_different_layers_is_a_conflict() -> None:
    ctx = loan_parent()
    a, b, c = split(ctx, ["a", "b", "c"])
    a.context.write(Layer.PROCESS, "decision", "approve", actor="t")  # a fixes it for the process
    activity(b.context, "t1", {"decision": "reject"})  # b's activity: WORKING, then HISTORY
    activity(c.context, "t2", {"decision": "reject", "note": "same as b"})
    result = join(ctx, [a, b, c], answers={"review_join/decision": "reject"})
    [(conflict, resolution)] = result.conflicts
    assert (conflict.key, conflict.layer, conflict.base_value) == ("decision", Layer.PROCESS, DELETED)
    assert conflict.conflicting_values == {"a": "approve", "b": "reject", "c": "reject"}
    assert resolution is not None and resolution.resolver == "human"
    apply_join(ctx, result)
    assert ctx.resolve("decision") == "reject" and ctx.layer(Layer.PROCESS)["decision"] == "reject"
    [entry] = ctx.resolve(MERGED_CONFLICTS_KEY)
    assert (entry["key"], entry["layer"], entry["conflictingValues"]) == ("decision", "L1", ["approve", "reject"])
    assert entry["values"] == {"a": "approve", "b": "reject", "c": "reject"}
    assert LayeredContext.replay(ctx.tape) == ctx


def test_a_key_changed_in_different_layers_to_one_value_is_no_conflict() -> None:
    ctx = loan_parent()
    a, b = split(ctx, ["a", "b"])
    a.context.write(Layer.KNOWLEDGE, "rate", 0.05, actor="rag")
    activity(b.context, "t1", {"rate": 0.05})
    activity(a.context, "t0", {"counter": 1})  # the value it had: no change
    result = join(ctx, [a, b])
    assert result.conflicts == []
    apply_join(ctx, result)
    assert ctx.layer(Layer.KNOWLEDGE)["rate"] == 0.05 and ctx.layer(Layer.HISTORY)["rate"] == 0.05


def test_a_cross_layer_conflict_under_a_strategy() -> None:
    ctx = loan_parent()
    cfg = config_from_dict({"mergeStrategy": "FAIL_ON_CONFLICT"})
    a, b = split(ctx, ["a", "b"], cfg)
    a.context.write(Layer.KNOWLEDGE, "rate", 0.05, actor="rag")
    activity(b.context, "t1", {"rate": 0.07})
    with pytest.raises(MergeConflictError, match=r"'rate' in L2 \(not set before the split\): a=0.05, b=0.07"):
        join(ctx, [a, b], cfg)


def test_records_two_branches_add_under_one_key_are_kept_apart() -> None:
    ctx = loan_parent()
    activity(ctx, "stamp")  # the base already holds activity:stamp
    a, b, c = split(ctx, ["a", "b", "c"])
    for branch, notes in ((a, None), (b, "a longer note " * 5), (c, None)):
        activity(branch.context, "stamp", {"notes": notes} if notes else {})  # activity:stamp#2 in each
        branch.context.apply_changes([(Layer.HISTORY, "compaction:1", {"kind": "compaction",
                                                                        "summary": "b" if notes else "a, c"})],
                                     kind="compress", actor="compressor")
    result = join(ctx, [a, b, c])
    assert result.conflicts == [] and result.complete
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    keys = [k for k in history if k.startswith(("activity:stamp", "compaction:", "notes"))]
    # a and c added the same records (changed identically): one of each; b's are kept apart, in b's order
    assert keys == ["activity:stamp", "activity:stamp#2", "compaction:1", "notes", "activity:stamp#3", "compaction:2"]
    assert "notes" in history["activity:stamp#3"]["keys"] and "notes" not in history["activity:stamp#2"]["keys"]
    assert history["compaction:1"]["summary"] == "a, c" and history["compaction:2"]["summary"] == "b"
    assert LayeredContext.replay(ctx.tape) == ctx


PRE_SPLIT = [f"pre_{i}" for i in range(4)]
PROFILE = {"id": "P-1", "tags": ["a", "b"]}


def _folding_branches() -> tuple[LayeredContext, list[BranchContext], int]:
    """A parent whose HISTORY both branches' compressions fold into a ``compaction:1`` of their own:
    ``a`` after one activity, ``b`` deeper, its first activity too. And the parent's HISTORY tokens."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("facts")
    ctx.write(Layer.WORKING, "profile", PROFILE, actor="facts")
    ctx.complete_activity("facts", preserve_keys=["profile"])
    for i, key in enumerate(PRE_SPLIT):
        activity(ctx, f"pre{i}", {key: f"pre-split fact {i} " * 12})
    tokens = ctx.tokens(Layer.HISTORY)
    a, b = split(ctx, ["a", "b"])
    compressor = RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT)
    activity(a.context, "ta", {"ta_out": "credit review " * 10})
    assert compressor.compress(a.context, {"compressTokenThreshold": 120}).compaction_key == "compaction:1"
    activity(b.context, "tb1", {"tb_note": "fraud note " * 10})
    activity(b.context, "tb2", {"tb_out": "fraud review " * 10})
    done = compressor.compress(b.context, {"compressTokenThreshold": 120}, target_tokens=60)
    assert done.compaction_key == "compaction:1" and {"pre_0", "tb_note"} <= set(done.folded)
    return ctx, [a, b], tokens


def _summarised(history: Any, key: str) -> int:
    """How many compaction records of ``history`` name ``key`` or the activity record owning it."""
    owner = f"activity:pre{key[-1]}" if key.startswith("pre_") else key
    return sum(1 for k, v in history.items() if k.startswith("compaction:") and {key, owner} & set(v["covers"]))


def test_a_join_keeps_one_summary_of_the_base_history_both_branches_folded() -> None:
    ctx, (a, b), before = _folding_branches()
    b_before_fold = b.context.get_snapshot(b.context.layer(Layer.HISTORY)["compaction:1"]["snapshot_id"])
    result = join(ctx, [a, b])
    assert result.conflicts == [] and result.complete
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    assert [k for k in history if k.startswith("compaction:")] == ["compaction:1"]
    assert history["compaction:1"] == a.context.layer(Layer.HISTORY)["compaction:1"]  # the first branch's
    for key in PRE_SPLIT:  # each base entry: summarised once, not also kept whole
        assert key not in history and _summarised(history, key) == 1
    assert history["profile"] == PROFILE and "profile" in ctx.preserved
    # b's own entries its dropped record had folded come back as they were; the base first, then
    # each branch's new keys in branch order
    assert history["tb_note"] == b_before_fold.layer(Layer.HISTORY)["tb_note"]
    assert list(history) == ["profile", "ta_out", "activity:ta", "compaction:1",
                             "tb_note", "activity:tb1", "tb_out", "activity:tb2"]
    assert ctx.tokens(Layer.HISTORY) < before
    assert LayeredContext.replay(ctx.tape) == ctx
    assert canonical_json(dict(LayeredContext.replay(ctx.tape).layer(Layer.HISTORY))) == canonical_json(dict(history))


def test_a_join_of_folding_branches_is_the_same_whatever_the_arrival_order() -> None:
    ctx, branches, _ = _folding_branches()
    first = join(ctx, branches, arrival_order=["a", "b"])
    again = join(ctx, branches, arrival_order=["b", "a"])
    def changes(result: JoinResult) -> str:
        return canonical_json([(int(layer), key, DELETED.to_json() if value is DELETED else value)
                               for layer, key, value in result.all_changes()])
    assert changes(first) == changes(again)
    assert first.dropped_compactions == again.dropped_compactions
    assert first.dropped_compactions == ({"branch": "b", "key": "compaction:1", "restored": ["tb_note", "activity:tb1"]},)


@pytest.mark.parametrize(("shape", "kept", "dropped", "order"), [
    # b compressed twice: its second record merged its first (the base's older half and nothing of
    # its own); a tie with a's on the base, a's first in branch order: b's own entries come back
    ("b_twice", "a", {"branch": "b", "key": "compaction:2", "restored": ["tb_note", "activity:tb1"]},
     ["ta_out", "activity:ta", "compaction:1", "tb_note", "activity:tb1", "tb_out", "activity:tb2"]),
    # a folded half of the base, b all of it (and its first activity): b's is kept though b comes
    # second, in b's place
    ("a_shallow", "b", {"branch": "a", "key": "compaction:1", "restored": []},
     ["ta_out", "activity:ta", "tb_out", "activity:tb2", "compaction:1"]),
])
def test_the_join_keeps_the_summary_of_the_most_base_entries(shape: str, kept: str, dropped: dict[str, Any],
                                                              order: list[str]) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    for i, key in enumerate(PRE_SPLIT):
        activity(ctx, f"pre{i}", {key: f"pre-split fact {i} " * 12})
    a, b = split(ctx, ["a", "b"])
    compressor = RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT)
    activity(a.context, "ta", {"ta_out": "credit review " * 10})
    target = a.context.tokens(Layer.HISTORY) - 60 if shape == "a_shallow" else 80
    assert compressor.compress(a.context, {}, target_tokens=target).folded
    activity(b.context, "tb1", {"tb_note": "fraud note " * 10})
    if shape == "b_twice":
        first = compressor.compress(b.context, {}, target_tokens=b.context.tokens(Layer.HISTORY) - 60)
        assert first.folded == ["pre_0", "activity:pre0", "pre_1", "activity:pre1"]
    activity(b.context, "tb2", {"tb_out": "fraud review " * 10})
    assert compressor.compress(b.context, {}, target_tokens=80).folded
    records = {name: branch.context.layer(Layer.HISTORY) for name, branch in (("a", a), ("b", b))}
    result = join(ctx, [a, b])
    assert result.dropped_compactions == (dropped,)
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    assert list(history) == order
    [key] = [k for k in history if k.startswith("compaction:")]
    assert history[key] == next(v for k, v in records[kept].items() if k.startswith("compaction:"))
    assert LayeredContext.replay(ctx.tape) == ctx


COUNT_TOOLS = {"compressRules": [{"pattern": "tool:*", "action": "count_only", "keepLast": 1}]}


def _tool(who: str, i: int) -> dict[str, Any]:
    return {"kind": "tool_result", "out": f"{who} result {i} " * 8}


@pytest.mark.parametrize(("shape", "dropped", "left"), [
    # both count the four base results and one of their own each: 4 + 1 + 1, the base ones gone
    ("fresh", 6, []),
    # a preserves one base result, which b's counter removed: it stays, and no counter counts it
    ("preserved", 5, ["tool:base3"]),
    # the base had counted three already (kept base3): the branches' counts go on from it
    ("counted_before", 6, []),
    # the compressions fold the base's activities too (the join keeps a's record): the results
    # the counters removed were no part of the folds, so b's dropped fold brings none back
    ("folded", 6, []),
])
def test_a_join_keeps_one_count_of_the_base_entries_both_branches_counted(shape: str, dropped: int,
                                                                          left: list[str]) -> None:
    ctx = LayeredContext(system={"policy": "p"})
    ctx.begin_activity("facts")
    ctx.write(Layer.WORKING, "profile", PROFILE, actor="facts")
    ctx.complete_activity("facts", preserve_keys=["profile"])
    for i in range(4):
        activity(ctx, f"pre{i}", {f"tool:base{i}": _tool("base", i)})
    compressor = RuleDrivenCompressor()
    if shape == "counted_before":
        compressor.compress(ctx, COUNT_TOOLS, triggers=[])
        assert ctx.layer(Layer.HISTORY)["summary:count:tool:*"]["dropped"] == 3
    a, b = split(ctx, ["a", "b"])
    if shape == "preserved":
        a.context.begin_activity("keep")
        a.context.complete_activity("keep", preserve_keys=["tool:base3"])
    for name, branch in (("a", a), ("b", b)):
        for j in range(2):
            activity(branch.context, f"t{name}{j}", {f"tool:{name}{j}": _tool(name, j)})
        done = compressor.compress(branch.context, COUNT_TOOLS, triggers=None if shape == "folded" else [])
        assert done.changed and (done.compaction_key is not None) == (shape == "folded")
    result = join(ctx, [a, b])
    assert result.conflicts == [] and result.complete
    assert join(ctx, [a, b], arrival_order=["b", "a"]).all_changes() == result.all_changes()
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    assert [k for k in history if k.startswith("summary:count:")] == ["summary:count:tool:*"]
    assert history["summary:count:tool:*"] == {"kind": "count", "_compressed": "count_only", "pattern": "tool:*",
                                               "count": dropped + 2, "dropped": dropped, "kept": ["tool:a1", "tool:b1"]}
    assert [k for k in history if k.startswith("tool:")] == [*left, "tool:a1", "tool:b1"]
    for key in left:
        assert history[key] == _tool("base", int(key[-1]))
    assert history["profile"] == PROFILE and "profile" in ctx.preserved
    assert LayeredContext.replay(ctx.tape) == ctx
    assert canonical_json(dict(LayeredContext.replay(ctx.tape).layer(Layer.HISTORY))) == canonical_json(dict(history))


LOG_LINES = {f"log_line_{i:02d}": f"09:{i:02d} pager: p99 latency {400 + 37 * i} ms on db-{i % 3}, retrying health "
             f"check #{i} after the pool saturated" for i in range(12)}
COUNT_LOGS = {"pattern": "log_line", "action": "count_only", "keepLast": 2}
SUMMARIZE_LOGS = {"pattern": "log_line", "action": "summarize", "maxTokens": 6}
# how a branch compresses the timeline's log lines (rules alone: no fold; a threshold: a fold too)
LOG_COMPRESSIONS: dict[str, tuple[dict[str, Any], list[str] | None]] = {
    "count": ({"compressRules": [COUNT_LOGS]}, []),
    "count_fold": ({"compressRules": [COUNT_LOGS], "compressTokenThreshold": 100}, None),
    "fold": ({"compressTokenThreshold": 100}, None),
    "summarize": ({"compressRules": [SUMMARIZE_LOGS]}, []),
    "summarize_short": ({"compressRules": [{**SUMMARIZE_LOGS, "maxTokens": 3}]}, []),
}


def _timeline_branches(how_a: str, how_b: str) -> tuple[LayeredContext, list[BranchContext], dict[str, str]]:
    """Twelve base log lines; each branch runs an activity, then compresses as ``how_*`` says
    (``none``: not at all). And each compressing branch's compression snapshot."""
    ctx = LayeredContext(system={"policy": "p"})
    activity(ctx, "timeline", LOG_LINES)
    a, b = split(ctx, ["a", "b"])
    compressor = RuleDrivenCompressor(keep_recent=HOOK_KEEP_RECENT)
    snapshots = {}
    for branch, how in ((a, how_a), (b, how_b)):
        activity(branch.context, f"t{branch.branch_id}", {f"{branch.branch_id}_out": f"{branch.branch_id} finding " * 6})
        if how != "none":
            config, triggers = LOG_COMPRESSIONS[how]
            done = compressor.compress(branch.context, config, triggers=triggers)
            assert done.changed and (done.compaction_key is not None) == ("fold" in how), how
            snapshots[branch.branch_id] = done.snapshot_id
    return ctx, [a, b], snapshots


def _log_lines(history: Any) -> dict[str, str]:
    """The log lines ``history`` holds, each as ``base`` (verbatim) or the action that changed it."""
    return {k: "base" if v == LOG_LINES[k] else v["_compressed"] for k, v in history.items() if k in LOG_LINES}


BASE = "base"
LAST_TWO = {"log_line_10": BASE, "log_line_11": BASE}


@pytest.mark.parametrize(("how_a", "how_b", "left", "counted"), [
    # one branch counts the old lines, the other folds them all: removed, counted once, summarised
    # once; the last two the counter kept verbatim the other branch folded: gone too
    ("count", "fold", {}, 12),
    ("fold", "count", {}, 12),
    # the counting branch folded too (its own activity; the lines its counter kept stay out of its
    # fold): the other branch's deeper fold is kept, the counted lines stay removed
    ("count_fold", "fold", {}, 12),
    # one branch counts, the other leaves them alone: the count stands
    ("count", "none", LAST_TWO, 12),
    # one branch folds, the other summarises each line: the fold summarises them, once
    ("fold", "summarize", {}, None),
    # counted in one branch and summarised in the other: the counted ones stay removed, the two
    # the counter kept are taken as summarised
    ("summarize", "count", {"log_line_10": "summarize", "log_line_11": "summarize"}, 12),
    # summarised in both, differently: neither is a decision, the base stays (DESIGN: two
    # compressions of one key keep the base)
    ("summarize", "summarize_short", dict.fromkeys(LOG_LINES, BASE), None),
    ("summarize", "none", dict.fromkeys(LOG_LINES, "summarize"), None),
])
def test_log_lines_compressed_differently_in_two_branches(how_a: str, how_b: str, left: dict[str, str],
                                                          counted: int | None) -> None:
    ctx, branches, snapshots = _timeline_branches(how_a, how_b)
    result = join(ctx, branches)
    assert result.conflicts == [] and result.complete
    assert join(ctx, branches, arrival_order=["b", "a"]).all_changes() == result.all_changes()
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    assert _log_lines(history) == left
    if counted is None:
        assert "summary:count:log_line" not in history
    else:
        counter = history["summary:count:log_line"]
        assert counter["count"] == counted
        # the counter says exactly what became of the lines it counted: each it lists as kept is
        # in HISTORY, and those another branch's fold took are named as folded, not as kept
        assert [k for k in counter["kept"] if k in history] == counter["kept"]
        gone = [k for k in ("log_line_10", "log_line_11") if k not in history]
        assert counter.get("folded", []) == gone
        assert counter["count"] == counter["dropped"] + len(counter["kept"]) + len(gone)
    # no line is kept verbatim beside the compaction record that summarises it
    for key, record in history.items():
        if key.startswith("compaction:"):
            assert not {k for k in left if left[k] == BASE} & set(record["covers"]), key
    assert canonical_json(dict(LayeredContext.replay(ctx.tape).layer(Layer.HISTORY))) == canonical_json(dict(history))
    # every compression can be undone (DESIGN), in the context the branches merged into too
    compressor = RuleDrivenCompressor()
    for branch in branches:
        if branch.branch_id in snapshots:
            compressor.decompress(ctx, snapshots[branch.branch_id], source=branch.context)
    history = ctx.layer(Layer.HISTORY)
    assert _log_lines(history) == dict.fromkeys(LOG_LINES, BASE)
    assert [k for k in history if k.startswith(("compaction:", "summary:count:"))] == []
    assert history["a_out"] == "a finding " * 6 and history["b_out"] == "b finding " * 6


def test_a_counter_does_not_list_as_kept_an_entry_another_branch_deleted() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    activity(ctx, "timeline", LOG_LINES)
    a, b = split(ctx, ["a", "b"])
    activity(a.context, "ta", {"a_out": "a"})
    assert RuleDrivenCompressor().compress(a.context, {"compressRules": [COUNT_LOGS]}, triggers=[]).changed
    activity(b.context, "tb", {"b_out": "b"}, deletes=("log_line_11",))  # a decision, not a compression
    result = join(ctx, [a, b])
    assert result.conflicts == [] and result.complete
    apply_join(ctx, result)
    history = ctx.layer(Layer.HISTORY)
    assert [k for k in history if k in LOG_LINES] == ["log_line_10"]
    assert history["summary:count:log_line"] == {"kind": "count", "_compressed": "count_only", "pattern": "log_line",
                                                 "count": 12, "dropped": 10, "kept": ["log_line_10"],
                                                 "deleted": ["log_line_11"]}
    assert LayeredContext.replay(ctx.tape) == ctx
    # a later count goes on from it: the entries it counted stay counted
    activity(ctx, "more", {"log_line_12": "09:12 pager: one more", "log_line_13": "09:13 pager: and one more",
                           "log_line_14": "09:14 pager: the last"})
    assert RuleDrivenCompressor().compress(ctx, {"compressRules": [COUNT_LOGS]}, triggers=[]).changed
    counter = ctx.layer(Layer.HISTORY)["summary:count:log_line"]
    assert counter == {"kind": "count", "_compressed": "count_only", "pattern": "log_line", "count": 15,
                       "dropped": 12, "kept": ["log_line_13", "log_line_14"], "deleted": ["log_line_11"]}


def test_merged_conflicts_accumulate_over_joins() -> None:
    ctx = loan_parent()
    cfg = config_from_dict({"mergeStrategy": "LAST_WRITER_WINS"})
    for round_ in range(2):
        a, b = split(ctx, ["a", "b"], cfg)
        activity(a.context, "t0", {"counter": 10 + round_})
        activity(b.context, "t1", {"counter": 20 + round_})
        apply_join(ctx, join(ctx, [a, b], cfg))
        if round_ == 0:
            activity(ctx, "between")  # moves _mergedConflicts into HISTORY
    log = ctx.resolve(MERGED_CONFLICTS_KEY)
    assert [e["resolution"]["value"] for e in log] == [20, 21]


def test_fail_on_conflict_join() -> None:
    ctx = loan_parent()
    cfg = config_from_dict({"mergeStrategy": "FAIL_ON_CONFLICT"})
    a, b = split(ctx, ["a", "b"], cfg)
    activity(a.context, "t0", {"counter": 2, "x": 1})
    activity(b.context, "t1", {"counter": 3, "x": 2})
    with pytest.raises(MergeConflictError, match="'counter' in L4.*\n.*'x' in L4"):
        join(ctx, [a, b], cfg)


def test_join_refuses_a_parent_that_changed_after_the_split() -> None:
    ctx = loan_parent()
    a, b = split(ctx, ["a", "b"])
    result = join(ctx, [a, b])
    ctx.write(Layer.WORKING, "late", 1, actor="x")
    with pytest.raises(LayerflowError, match="changed after the split"):
        apply_join(ctx, result)


def test_restore_of_a_foreign_snapshot_is_compared_in_full() -> None:
    ctx = loan_parent()
    a, b = split(ctx, ["a", "b"])
    a.context.write(Layer.WORKING, "y", 1, actor="t")
    shared = a.context.snapshot()
    a.context.write(Layer.WORKING, "y", 2, actor="t")
    b.context.restore(shared)  # b now holds y=1 and a's _branch_id, none of it on b's own tape
    result = join(ctx, [a, b], human_available=True)
    assert [(c.key, c.conflicting_values) for c, _ in result.conflicts] == [("y", {"a": 2, "b": 1})]


# ---- the O(changes) join equals a full comparison --------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["write", "delete", "complete", "knowledge"]),
                         st.sampled_from(["applicant", "counter", "k1", "k2", "k3", "review_type"]),
                         st.sampled_from([None, 0, 1, 2.0, "x", [1], {"a": 1}])), max_size=8)


def run_ops(ctx: LayeredContext, ops: list[tuple[str, str, Any]]) -> None:
    for n, (op, key, value) in enumerate(ops):
        if ctx.current_activity is None:
            ctx.begin_activity(f"t{n}")
        if op == "write":
            ctx.write(Layer.WORKING, key, value, actor="t")
        elif op == "knowledge":
            ctx.write(Layer.KNOWLEDGE, key, value, actor="rag")
        elif op == "delete" and ctx.locate(key) in (Layer.HISTORY, Layer.WORKING, Layer.KNOWLEDGE):
            ctx.delete(Layer.WORKING, key, actor="t")
        elif op == "complete":
            ctx.complete_activity(ctx.current_activity or "t")


@given(st.lists(OPS, min_size=1, max_size=3))
def test_join_by_touched_keys_equals_full_comparison(branch_ops: list[list[tuple[str, str, Any]]]) -> None:
    ctx = loan_parent()
    ids = ["a", "b", "c"][: len(branch_ops)]
    cfg = config_from_dict({"branches": [{"id": b, "contextInject": {"review_type": b}} for b in ids]})
    branches = ContextSplitter().split(ctx, "s", ids, cfg)
    for b, ops in zip(branches, branch_ops):
        run_ops(b.context, ops)
    fast = join(ctx, branches, cfg, human_available=True)
    with mock.patch.object(join_module, "_touched", lambda base, branch: dict.fromkeys(join_module.MERGED_LAYERS)):
        full = join(ctx, branches, cfg, human_available=True)
    assert fast.changes == full.changes
    assert [c for c, _ in fast.conflicts] == [c for c, _ in full.conflicts]
    # and both agree with the plain three-way merge of each layer, where nothing was injected,
    # but for keys branches changed to different values in different layers: conflicts too
    snapshot = ctx.get_snapshot(branches[0].snapshot_id)
    for layer in (Layer.KNOWLEDGE,):
        base_layer = dict(snapshot.layer(layer))
        plain = gateways.three_way_merge(base_layer, {b.branch_id: dict(b.context.layer(layer)) for b in branches})
        across = {c.key for c, _ in fast.conflicts if c.layer == layer} - {c.key for c in plain.conflicts}
        for key in across:
            [conflict] = [c for c, _ in fast.conflicts if c.key == key]
            in_layer = {b.branch_id for b in branches
                        if not same_value(b.context.layer(layer).get(key, DELETED), base_layer.get(key, DELETED))}
            assert set(conflict.source_branches) - in_layer, key  # a branch that changed it elsewhere
        assert [(k, v) for k, v in fast.changes.get(layer, [])] == [(k, v) for k, v in plain.changes if k not in across]
        assert [c.key for c, _ in fast.conflicts if c.layer == layer and c.key not in across] == \
            [c.key for c in plain.conflicts]


# ---- package contract --------------------------------------------------------------------

def test_public_names() -> None:
    for name in gateways.__all__:
        assert hasattr(gateways, name), name
    for name in ("ContextSplitter", "ConflictDetector", "MergedConflict", "DELETED", "BranchContext"):
        assert name in gateways.__all__
    from context_layers import DELETED as core_deleted
    assert gateways.DELETED is core_deleted


def test_gateways_imports_no_engine_web_or_model_client() -> None:
    code = ("import sys, gateways; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('SpiffWorkflow', 'litellm', 'fastapi', 'engine', 'uvicorn')]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_an_activity_record_lists_the_keys_it_wrote_not_the_engine_s_markers() -> None:
    # a branch's first activity listed the split's _branch_id / _snapshot_id as keys it wrote, the
    # activity after a join the join's _mergedConflicts (they move to HISTORY with WORKING all the same)
    ctx = LayeredContext(system={"policy": "p"})
    config = config_from_dict({"branches": [{"id": "a", "contextInject": {"role": "legal"}}, {"id": "b"}]})
    branches = {b.branch_id: b.context for b in ContextSplitter().split(ctx, "fork", ["a", "b"], config)}
    for bid, verdict in (("a", "accept"), ("b", "reject")):
        branches[bid].begin_activity(bid)
        branches[bid].write(Layer.WORKING, "verdict", verdict, actor=bid)
        record = branches[bid].complete_activity(bid)
        assert record["keys"] == (["verdict", "role"] if bid == "a" else ["verdict"])
        assert "_branch_id" in branches[bid].layer(Layer.HISTORY)  # moved all the same
    snapshot = ctx.get_snapshot(branches["a"].tape[0].data["snapshot_id"])
    result = join_contexts(snapshot, branches, gateway_id="merge", answers={"merge/verdict": "reject"})
    apply_join(ctx, result, branches=branches)
    assert MERGED_CONFLICTS_KEY in ctx.layer(Layer.WORKING)
    ctx.begin_activity("publish")
    ctx.write(Layer.WORKING, "published", False, actor="publish")
    record = ctx.complete_activity("publish")
    assert record["keys"] == ["published"] and MERGED_CONFLICTS_KEY in ctx.layer(Layer.HISTORY)
    assert LayeredContext.replay(ctx.tape) == ctx


def test_the_gateway_s_config_stands_in_for_its_id_and_branches() -> None:
    ctx = loan_parent()
    by_config = ContextSplitter().split(ctx, config_from_dict(LOAN_CONFIG))  # the seed's split(source, gateway)
    assert [(b.branch_id, b.context.resolve("review_type")) for b in by_config] == [
        ("finance_review", "finance"), ("risk_review", "risk")]
    assert ctx.tape[-1].data["gateway_id"] == "review_join"
    by_json = ContextSplitter().split(ctx, {"gatewayId": "g2", "branches": [{"id": "a"}, {"id": "b"}]})
    assert [b.branch_id for b in by_json] == ["a", "b"] and ctx.tape[-1].data["gateway_id"] == "g2"
    as_json = ContextSplitter().split(ctx, "g4", ["a", "b"], {"branches": [{"id": "a", "contextInject": {"t": 1}}]})
    assert as_json[0].context.resolve("t") == 1 and "t" not in as_json[1].context
    with pytest.raises(ValueError, match="no gatewayId"):
        ContextSplitter().split(ctx, {"branches": [{"id": "a"}]})
    with pytest.raises(ValueError, match="'g3': no branches"):
        ContextSplitter().split(ctx, "g3")


def _side_history_changes(base: Any, side: LayeredContext) -> list[tuple[str, Any]]:
    """The HISTORY changes ``side`` brings since ``base``, as an event sub-process merging back does."""
    before, after = base.layer(Layer.HISTORY), side.layer(Layer.HISTORY)
    return [*((k, DELETED) for k in before if k not in after),
            *((k, v) for k, v in after.items() if not k.startswith("_") and (k not in before or before[k] != v))]


@pytest.mark.parametrize(("side_does", "told"), [
    # the side's fold takes the two lines the flow's counter kept: folded, still counted
    ("fold", {"kept": [], "folded": ["log_line_10", "log_line_11"]}),
    # a decision of the side's removes one: deleted, still counted; the other stays kept
    ("delete", {"kept": ["log_line_10"], "deleted": ["log_line_11"]}),
])
def test_a_flow_counter_is_told_what_an_event_sub_process_took_of_what_it_kept(side_does: str,
                                                                              told: dict[str, Any]) -> None:
    ctx, [flow, side], _ = _timeline_branches("count", "fold" if side_does == "fold" else "none")
    if side_does == "delete":
        activity(side.context, "decide", deletes=("log_line_11",))
    base = ctx.get_snapshot(flow.snapshot_id)
    counter = flow.context.layer(Layer.HISTORY)["summary:count:log_line"]
    assert counter["kept"] == ["log_line_10", "log_line_11"]
    changes = _side_history_changes(base, side.context)
    out = side_counters_told(flow.context, side.context, changes)
    assert out[:len(changes)] == changes
    assert out[len(changes):] == [("summary:count:log_line", {**thaw(counter), **told})]
