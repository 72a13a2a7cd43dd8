"""Split: one context per outgoing branch of a gateway, from one snapshot of the parent.

The per-layer rules are DESIGN.md's: the branch starts from the parent's snapshot
(persistent maps, so a split of N branches costs O(N) whatever the context's size);
SYSTEM and PROCESS are the parent's, KNOWLEDGE, HISTORY and WORKING start as the
parent's and the branch's changes are its own; WORKING gains the branch's
``contextInject`` plus ``_branch_id`` and ``_snapshot_id``; EPHEMERAL is cleared.

The parent's tape gets a snapshot and a ``split`` event, each branch's tape starts
with a ``fork`` event. Keep the returned ``BranchContext`` list (or at least the
snapshot id): the join needs the snapshot.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from context_layers.canonical import thaw
from context_layers.config import ActivityExtensionConfig, BranchConfig, as_config
from context_layers.context import LayeredContext, Snapshot
from context_layers.errors import ContextWriteDenied, MergeConflictError
from context_layers.layers import Layer

if TYPE_CHECKING:
    from .arbiter import ConflictArbiter
    from .join import JoinResult

__all__ = ["BranchContext", "ContextSplitter", "branch_context_name", "check_inject"]


@dataclass(frozen=True)
class BranchContext:
    """One branch of a split: its id (the BPMN id of the branch's first element), its
    context, the parent snapshot it started from and what the split put into WORKING."""

    branch_id: str
    context: LayeredContext
    snapshot_id: str
    injected: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        """The branch's context answers what the branch does not (``branch.write(...)``,
        ``branch.resolve(...)``): the seed's split returns the contexts themselves."""
        if name.startswith("__") or name == "context":
            raise AttributeError(name)
        return getattr(self.context, name)


def branch_context_name(parent: str, branch_id: str, split_seq: int) -> str:
    """``main/finance@12``: unique per split, so snapshot ids of two passes through a
    loop never collide."""
    return f"{parent}/{branch_id}@{split_seq}"


def check_inject(ctx: LayeredContext, gateway_id: str, branch_id: str, inject: Mapping[str, Any], *,
                 actor: str = "engine") -> None:
    """Refuse a branch's ``contextInject`` that the write rule refuses (a key SYSTEM or
    PROCESS fixed): an injection is a write to the branch's WORKING. The denial goes on
    ``ctx``'s tape, naming gateway and branch, before anything is split; every split type
    (XOR, AND, inclusive) checks the same way."""
    for key in inject:
        effective, reason = ctx.check_write(Layer.WORKING, key)
        if reason is not None:
            reason = f"contextInject of branch {branch_id!r} at {gateway_id!r}: {reason}"
            ctx.record("denied", actor=actor, data={
                "op": "inject", "key": key, "requested": int(Layer.WORKING), "effective": int(effective),
                "reason": reason, "gateway_id": gateway_id, "branch_id": branch_id})
            raise ContextWriteDenied(key, Layer.WORKING, effective, reason)


def _with_branches(config: ActivityExtensionConfig | None, gateway_id: str,
                   given: Sequence[str | BranchConfig | Mapping[str, Any]]) -> ActivityExtensionConfig:
    """``config`` whose branches are ``given`` (in that order; a plain id keeps the branch config the
    gateway's config has for it), validated as any gateway config: an error names the field."""
    items: list[Any] = []
    for b in given:
        if isinstance(b, str):
            known = config.branch(b) if config is not None else None
            items.append(known.model_dump(by_alias=True) if known is not None else {"id": b})
        elif isinstance(b, BranchConfig):
            items.append(b.model_dump(by_alias=True))
        elif isinstance(b, Mapping):
            items.append(dict(b))
        else:
            raise TypeError(f"split {gateway_id!r}: a branch is an id or a branch config "
                            f"({{'id': ..., 'contextInject': {{...}}}}), got {type(b).__name__}")
    checked = as_config({"gatewayId": gateway_id, "branches": items}, source=f"split {gateway_id!r}")
    if config is None:
        return checked
    return config.model_copy(update={"branches": checked.branches})


class ContextSplitter:
    def split(
        self,
        ctx: LayeredContext,
        gateway_id: str | ActivityExtensionConfig | Mapping[str, Any],
        branch_ids: Sequence[str | BranchConfig | Mapping[str, Any]] | None = None,
        config: ActivityExtensionConfig | Mapping[str, Any] | None = None,
        *,
        branches: Sequence[str | BranchConfig | Mapping[str, Any]] | None = None,
        actor: str = "engine",
        gateway_type: str | None = None,
        at: Snapshot | None = None,
    ) -> list[BranchContext]:
        """Snapshot ``ctx``, record the split on it, and fork one context per branch, in
        the order of ``branch_ids``. As in the seed, the gateway's config may stand in for
        the id and the branches: ``split(ctx, config)`` splits into ``config.branches``
        (an ``ActivityExtensionConfig`` or its JSON form, with ``gatewayId``).
        ``branches=`` is another name for ``branch_ids``; either may list branch configs
        (``{"id": ..., "contextInject": {...}}``) beside plain ids. ``at``: a snapshot of ``ctx``
        taken earlier, where the branches fork instead (an event caught before its path could
        start: the path begins where the event came, whatever ``ctx`` did since)."""
        if not isinstance(ctx, LayeredContext):
            raise TypeError(f"split: the first argument is the parent LayeredContext to split, got {type(ctx).__name__}")
        if branches is not None:
            if branch_ids is not None:
                raise TypeError("split: pass the branches once, as branch_ids or as branches= (ids, or "
                                "{'id': ..., 'contextInject': {...}} configs)")
            branch_ids = branches
        if isinstance(branch_ids, (str, bytes)):
            raise TypeError(f"split: branches must be a list of branch ids, got the string {branch_ids!r}; "
                            f"write [{branch_ids!r}]")
        if config is not None:
            config = as_config(config, source="split")
        if not isinstance(gateway_id, str):
            if config is not None:
                raise TypeError("split: pass the gateway's config once, as the second argument or as config=")
            config = as_config(gateway_id, source="split")
            if not config.gateway_id:
                raise ValueError("split: the gateway's config has no gatewayId; write it, or call "
                                 "split(ctx, gateway_id, branch_ids, config)")
            gateway_id = config.gateway_id
        ids: list[str]
        if branch_ids is None:
            ids = [b.id for b in config.branches] if config is not None else []
            if not ids:
                raise ValueError(f"split {gateway_id!r}: no branches: pass branch_ids, or a config whose "
                                 "branches name them")
        elif all(isinstance(b, str) for b in branch_ids):
            ids = [str(b) for b in branch_ids]
        else:
            config = _with_branches(config, gateway_id, branch_ids)
            ids = [b.id for b in config.branches]
        repeated = sorted({b for b in ids if ids.count(b) > 1})
        if repeated:
            raise ValueError(f"split {gateway_id!r}: branch ids must be unique, repeated: {repeated}")
        if at is not None and at.context != ctx.name:
            raise ValueError(f"split {gateway_id!r}: the snapshot {at.id!r} was taken in context {at.context!r}, "
                             f"not in {ctx.name!r}; split the context the snapshot is of")
        injects: dict[str, dict[str, Any]] = {}
        for branch_id in ids:
            branch_config = config.branch(branch_id) if config is not None else None
            injects[branch_id] = dict(branch_config.context_inject) if branch_config is not None else {}
            check_inject(ctx, gateway_id, branch_id, injects[branch_id], actor=actor)
        snapshot: Snapshot = at if at is not None else ctx.snapshot(label=f"split:{gateway_id}", actor=actor)
        data: dict[str, Any] = {"gateway_id": gateway_id, "snapshot_id": snapshot.id, "branches": ids,
                                "inject": {b: thaw(v) for b, v in injects.items() if v}}
        if gateway_type:
            data["gateway_type"] = gateway_type
        ctx.record("split", actor=actor, data=data)
        out = []
        for branch_id in ids:
            branch = LayeredContext.fork(snapshot, name=branch_context_name(ctx.name, branch_id, snapshot.seq),
                                         branch_id=branch_id, inject=injects[branch_id], actor=actor,
                                         encoding=ctx.encoding, clock=ctx.clock)
            injected = {**injects[branch_id], "_branch_id": branch_id, "_snapshot_id": snapshot.id}
            out.append(BranchContext(branch_id, branch, snapshot.id, injected))
        return out

    def join(
        self,
        ctx: LayeredContext,
        branches: "Mapping[str, LayeredContext | BranchContext] | Sequence[LayeredContext | BranchContext]",
        config: ActivityExtensionConfig | Mapping[str, Any] | None = None,
        *,
        gateway_id: str | None = None,
        answers: Mapping[str, Any] | None = None,
        arbiter: "ConflictArbiter | None" = None,
        human_available: bool = False,
        actor: str = "engine",
    ) -> "JoinResult":
        """The other half of ``split``: merge ``branches`` (what ``split`` returned) back into
        ``ctx`` against the split's snapshot, resolve the conflicts by the join's ``config``
        and apply the result (``gateways.join_contexts`` then ``apply_join``). With a conflict
        still waiting for a person, nothing changes but the tape: answer it and join again."""
        from .join import _branch_contexts, apply_join, join_contexts

        named = _branch_contexts(branches)
        try:
            result = join_contexts(ctx, named, config=config, gateway_id=gateway_id, answers=answers,
                                   arbiter=arbiter, human_available=human_available, clock=ctx.clock)
        except MergeConflictError as err:  # the conflicts go on the tape, as the engine records them
            ctx.record("conflict_failed", actor=actor, data={
                "gateway_id": err.gateway_id, "message": str(err)[:2000], "conflicts": list(err.conflicts)})
            raise
        apply_join(ctx, result, actor=actor, branches=named)
        return result
