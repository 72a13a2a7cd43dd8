"""The join as an outsider calls it after ``ContextSplitter().split``: with the list the split
returned, the parent context or the snapshot id as base, the config as its JSON form, and the
gateway id taken from the split when not given."""

from __future__ import annotations

from typing import Callable

import pytest

from context_layers import ActivityExtensionConfig, Layer, LayeredContext
from gateways import BranchContext, ContextSplitter, JoinResult, apply_join, join_contexts


def _split() -> tuple[LayeredContext, list[BranchContext]]:
    ctx = LayeredContext(system={"policy": "dual approval above 100000"})
    ctx.write(Layer.PROCESS, "amount", 120000)
    branches = ContextSplitter().split(ctx, "review", ["finance", "risk"])
    for branch, verdict in zip(branches, ("approved", "rejected")):
        branch.context.begin_activity(branch.branch_id)
        branch.context.write(Layer.WORKING, "approval_status", verdict)
        branch.context.write(Layer.WORKING, f"{branch.branch_id}_comment", "ok")
        branch.context.complete_activity(branch.branch_id)
    return ctx, branches


LWW = {"mergeStrategy": "LAST_WRITER_WINS"}

CALLS: list[tuple[str, Callable[[LayeredContext, list[BranchContext]], JoinResult]]] = [
    ("documented", lambda ctx, bs: join_contexts(ctx.get_snapshot(bs[0].snapshot_id), {b.branch_id: b.context for b in bs},
                                                 gateway_id="review", config=ActivityExtensionConfig.model_validate(LWW))),
    ("list of BranchContext", lambda ctx, bs: join_contexts(ctx.get_snapshot(bs[0].snapshot_id), bs, gateway_id="review",
                                                            config=ActivityExtensionConfig.model_validate(LWW))),
    ("dict of BranchContext", lambda ctx, bs: join_contexts(ctx.get_snapshot(bs[0].snapshot_id),
                                                            {b.branch_id: b for b in bs}, gateway_id="review",
                                                            config=ActivityExtensionConfig.model_validate(LWW))),
    ("config as JSON", lambda ctx, bs: join_contexts(ctx.get_snapshot(bs[0].snapshot_id), bs, gateway_id="review",
                                                     config=LWW)),
    ("parent as base", lambda ctx, bs: join_contexts(ctx, bs, gateway_id="review", config=LWW)),
    ("snapshot id as base", lambda ctx, bs: join_contexts(bs[0].snapshot_id, bs, gateway_id="review", config=LWW)),
    ("gateway id from the split", lambda ctx, bs: join_contexts(ctx, bs, config=LWW)),
    ("list of contexts", lambda ctx, bs: join_contexts(ctx, [b.context for b in bs], config=LWW)),
]


@pytest.mark.parametrize("call", [c for _, c in CALLS], ids=[n for n, _ in CALLS])
def test_join_takes_what_the_split_returned(call: Callable[[LayeredContext, list[BranchContext]], JoinResult]) -> None:
    ctx, branches = _split()
    result = call(ctx, branches)
    assert result.gateway_id == "review"
    assert result.branches == ("finance", "risk")
    apply_join(ctx, result)
    assert ctx.resolve("approval_status") == "rejected"  # the last branch, by LAST_WRITER_WINS
    assert ctx.resolve("finance_comment") == ctx.resolve("risk_comment") == "ok"
    [entry] = ctx.resolve("_mergedConflicts")
    assert entry["conflictingValues"] == ["approved", "rejected"]


def test_a_snapshot_id_no_branch_was_forked_from_is_refused_by_name() -> None:
    ctx, branches = _split()
    with pytest.raises(KeyError, match="snap:nowhere"):
        join_contexts("snap:nowhere", branches, config=LWW)


def test_splitter_join_merges_into_the_parent() -> None:
    ctx, branches = _split()
    result = ContextSplitter().join(ctx, branches, LWW)
    assert result.complete
    assert ctx.resolve("approval_status") == "rejected"
    assert [e.data.get("note") for e in ctx.tape if e.data.get("note") in ("conflict", "join")] == ["conflict", "join"]


def test_splitter_join_with_a_pending_conflict_changes_nothing() -> None:
    ctx, branches = _split()
    before = ctx.as_dict()
    result = ContextSplitter().join(ctx, branches, {"humanConfirm": {"timeout": 300}}, human_available=True)
    assert not result.complete and result.pending
    assert ctx.as_dict() == before


def test_the_conflicts_base_value_is_what_a_read_gave_at_the_split() -> None:
    """The seed's walk-through: ``approval_status`` is ``pending`` in the parent's WORKING at the
    split; each branch's activity writes its verdict, which moves into that branch's HISTORY.
    The conflict (in HISTORY, where the verdicts are) reports the base value a read gave at the
    split, ``pending``, as the seed's ``_mergedConflicts`` does, not "absent"."""
    ctx = LayeredContext(system={"policy": "p"})
    ctx.write(Layer.WORKING, "approval_status", "pending")
    branches = ContextSplitter().split(ctx, "parallel_review", ["branch_finance", "branch_risk"])
    for branch, verdict in zip(branches, ("approved", "rejected")):
        branch.context.begin_activity(branch.branch_id)
        branch.context.write(Layer.WORKING, "approval_status", verdict)
        branch.context.complete_activity(branch.branch_id)
    result = ContextSplitter().join(ctx, branches, LWW)
    [(conflict, resolution)] = result.conflicts
    assert conflict.base_value == "pending" and resolution is not None
    [entry] = ctx.resolve("_mergedConflicts")
    assert (entry["baseValue"], entry["conflictingValues"], entry["sourceBranches"]) == (
        "pending", ["approved", "rejected"], ["branch_finance", "branch_risk"])
    assert ctx.resolve("approval_status") == "rejected"


def test_a_policy_rule_without_a_condition_always_holds() -> None:
    ctx, branches = _split()
    ContextSplitter().join(ctx, branches, {"conflictPolicy": {"rules": [
        {"key": "approval_status", "value": "pending_dual_approval"}]}})
    assert ctx.resolve("approval_status") == "pending_dual_approval"
    [entry] = ctx.resolve("_mergedConflicts")
    assert entry["resolution"]["resolver"] == "policy" and entry["resolution"]["reason"]


def test_each_conflict_of_a_join_reads_as_the_conflict_and_unpacks_with_its_resolution() -> None:
    ctx, branches = _split()
    result = ContextSplitter().join(ctx, branches, LWW)
    [item] = result.conflicts
    conflict, resolution = item
    assert item.key == conflict.key == "approval_status"
    assert item.conflicting_values == ["approved", "rejected"] and item.source_branches == ["finance", "risk"]
    assert item.resolution is resolution and resolution is not None and resolution.value == "rejected"
    assert item.conflict is conflict and item == (conflict, resolution)


def test_a_branch_of_the_split_is_used_as_the_context_it_carries() -> None:
    """The seed's split returns the branch contexts themselves: each BranchContext answers the
    context's calls (write, resolve, layers, activities, tape) and renders as it."""
    from context_layers import render

    ctx = LayeredContext(system={"policy": "p"})
    finance, risk = ContextSplitter().split(ctx, "review", ["finance", "risk"])
    finance.begin_activity("finance")
    finance.write(Layer.WORKING, "approval_status", "approved")
    finance.complete_activity("finance")
    assert finance.resolve("_branch_id") == "finance" and finance.resolve("approval_status") == "approved"
    assert dict(finance.layer(Layer.HISTORY)) == dict(finance.context.layer(Layer.HISTORY))
    assert finance.tape is finance.context.tape and finance.branch_id == "finance"
    assert render(finance) == render(finance.context)
    with pytest.raises(AttributeError):
        finance.no_such_thing  # noqa: B018
    risk.write(Layer.WORKING, "approval_status", "rejected")
    result = ContextSplitter().join(ctx, [finance, risk], LWW)
    assert result.complete and ctx.resolve("approval_status") == "rejected"


def test_a_join_that_fails_on_its_conflicts_leaves_them_on_the_tape() -> None:
    """FAIL_ON_CONFLICT: the error names every conflict, and so does the parent's tape (as the
    engine records it), while its layers stay as they were."""
    from context_layers.errors import MergeConflictError

    ctx, branches = _split()
    before = ctx.as_dict()
    with pytest.raises(MergeConflictError, match="approval_status"):
        ContextSplitter().join(ctx, branches, {"mergeStrategy": "FAIL_ON_CONFLICT"})
    failed = ctx.tape[-1]
    assert failed.data["note"] == "conflict_failed" and failed.data["gateway_id"] == "review"
    assert [c["key"] for c in failed.data["conflicts"]] == ["approval_status"]
    assert ctx.as_dict() == before


def test_a_gateway_config_may_name_its_branches_by_id_only() -> None:
    ctx = LayeredContext(system={"policy": "p"})
    finance, risk = ContextSplitter().split(ctx, {"gatewayId": "review", "type": "AND_SPLIT",
                                                  "branches": ["finance", {"id": "risk", "contextInject": {"t": 1}}]})
    assert (finance.branch_id, risk.branch_id) == ("finance", "risk")
    assert risk.resolve("t") == 1 and "t" not in finance.context
