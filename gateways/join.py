"""Join: three-way merge of the branches' contexts into the parent, then resolution.

``join_contexts`` is read-only: it compares each branch with the split's snapshot and
returns a ``JoinResult`` (the changes for the parent, the conflicts with their
resolutions, the confirmations still pending). ``apply_join`` writes a complete
result to the parent context as one ``join`` event, after ``conflict`` and
``resolution`` events for the tape.

Per layer (DESIGN.md, "Gateways"): PROCESS, KNOWLEDGE, HISTORY and WORKING are merged
key by key (PROCESS only ever gains keys; merging it keeps a branch's additions, which
would otherwise be lost with the branch), EPHEMERAL is cleared, SYSTEM never changes.
Reducer keys are reduced, the remaining conflicts go to the join's ``mergeStrategy``.

Records (``activity:<task id>``, ``event:<id>``, ``compaction:<n>``, ... in HISTORY) are
written by the engine and the compressor, one per activity run, never changed by a
branch. Two branches that ran the same task (a task of a process both call) each add a
record under the same key: those are two records, not a conflict. The first branch's
keeps the key, the others get the next free one (``activity:stamp#2``, as a repeated
activity's record does; ``compaction:<n + 1>``).

Compactions: two branches whose compressions folded the same base HISTORY entries each add a
``compaction:<n>`` record summarising them. Both kept, the model would be sent the same facts
summarised twice and the join would undo what the compressions saved; so of the records that
summarise a base entry one is kept (``_fold_choice``: the one summarising the most base entries,
then branch order), and a branch whose record is dropped merges as if that compression had not
folded: its own entries the record summarised come back as they were before the fold (the
branch's snapshot the record names; a key the branch decided again after it, as it last decided it),
the base entries only it folded stay. What a record
folded is read from the branch's tape (the compress event and the snapshot before it).

Counters: two branches whose ``count_only`` rules counted the same base HISTORY entries each
change ``summary:count:<pattern>``. Kept apart, the same entries would be counted twice (and, as
two compressions of one key keep the base, would come back whole beside both counts); so the
branches' counters of one pattern become one (``_counters``): the base entries any of them
removed counted once and removed, each branch's own removed entries counted, the entries each
kept where they were listed (verbatim, summarized or extracted, once). Which entries a counter removed is read from the branch's tape (each
compress event and the snapshot before it); when it does not tell, the counters stay apart.

A count and a fold (or any compressions) of the same base entries: a base HISTORY entry that no
branch decided a value for, and that some branch's compression removed while its record stands
(a counter, or a fold the join keeps), stays removed (``_removed_by_compressions``), also where
another branch's compression only altered it: it is counted or summarised once, not also brought
back whole beside the record (what "two compressions of one key keep the base" below would do).

An event sub-process merging back into the flow it left is no join, but meets both problems:
it reuses ``single_summaries`` (the flow's records always stay) and ``single_counts``.

Preserved keys: a key one branch's activities preserved stays preserved after the join,
so a compression in another branch, which did not know, may not have changed it there:
that branch's compressed value (or its fold) of a key of the base is not a change.
Nor is it when another branch changed the key too: a compression is not a decision about
the value, so a branch's new value is taken (two compressions of one key keep the base)
instead of a conflict between the value and the fold. What the join reads for a key a
branch's compression folded or altered is the value the branch decided before it
(``_fold_decisions``): the split's when it only compressed the key, so no change; the
injected one when the key came from its ``contextInject`` and it left it so, so no change
either (the split's value stays; the fold summarised the branch's own); its own when it wrote
the key first, so a change, and a conflict when another branch changed it too (new keys
included), as without the compression. A change no other branch contests is taken as the
fold: the branch's summary stands for it, and the ``join`` event names the value it decided
(``folded_values``) for an enclosing join and for later splits to read. Before the split likewise: a key a compression folded
out of the split's HISTORY keeps, for the join, the value it had (``folded_before``, passed as
``base_folded``), so a branch that writes that value again has not changed it. Whether a join
asks a person thus never depends on when a compression's thresholds were crossed.

Branch-scoped keys: what the split injected into a branch's WORKING
(``contextInject``, ``_branch_id``, ``_snapshot_id``) belongs to that branch. A branch
whose injected key still holds the injected value, in WORKING or in HISTORY after an
activity moved it there, has not changed that key; so ``review_type=finance`` in one
branch and ``review_type=risk`` in another never conflict, and injected keys do not
survive the join unless a branch changed them. The markers (``BRANCH_MARKERS``) never survive
it: a split inside a branch (an exclusive gateway's choice, too) rewrites them, which is no
change the branch made to the process's data, so the parent keeps its own.

Cost: only the keys a branch's tape says it touched since the fork are compared (the
fork, writes, deletes, moves, privileged changes all list their keys), so a join costs
O(changed keys), not O(context). A branch that restored a snapshot from another
context, or was not forked from the join's snapshot, is compared key by key in full.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, NamedTuple

from context_layers.attention import segment_history
from context_layers.canonical import canonical_key, thaw
from context_layers.compress_rules import (COUNTER_GONE, COUNTER_IN_PLACE, count_key, counter_gone,
                                           counter_in_place, counter_lists, is_protected_record)
from context_layers.context import MERGED_CONFLICTS_KEY
from context_layers.config import ActivityExtensionConfig, CompressRule, as_config
from context_layers.context import BRANCH_MARKERS, LayeredContext, LayerView, Snapshot, entry_kind, is_record_key
from context_layers.errors import ContextKeyError, LayerflowError
from context_layers.layers import Layer
from context_layers.tape import Event, EventKind

from .arbiter import ConflictArbiter
from .conflicts import DELETED, KeyOutcome, MergedConflict, Resolution, jsonable, merge_keys, same_value, value_key
from .policy import HumanRequest, ResolutionStep, resolve_conflicts
from .splitter import BranchContext
from .strategies import apply_reducer

__all__ = ["MERGED_CONFLICTS_KEY", "MERGED_LAYERS", "JoinResult", "ResolvedConflict", "Unfolded", "apply_join",
           "folded_before", "free_record_key", "join_contexts", "side_counters_told", "single_counts",
           "single_summaries", "written_layer"]

MERGED_LAYERS = (Layer.PROCESS, Layer.KNOWLEDGE, Layer.HISTORY, Layer.WORKING)
COUNT_PREFIX = count_key("")


class _Overlay(Mapping[str, Any]):
    """``base`` with some keys replaced (``DELETED``: removed). O(1) to build."""

    __slots__ = ("_base", "_over")

    def __init__(self, base: Mapping[str, Any], over: Mapping[str, Any]) -> None:
        self._base = base
        self._over = over

    def __getitem__(self, key: str) -> Any:
        if key in self._over:
            value = self._over[key]
            if value is DELETED:
                raise KeyError(key)
            return value
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        if key in self._over:
            return self._over[key] is not DELETED  # type: ignore[index]
        return key in self._base

    def __iter__(self) -> Iterator[str]:
        for key in self._base:
            if key not in self._over or self._over[key] is not DELETED:
                yield key
        for key, value in self._over.items():
            if key not in self._base and value is not DELETED:
                yield key

    def __len__(self) -> int:
        return sum(1 for _ in self)


class _Resolved(Mapping[str, Any]):
    """A read through layers in order, the first holding the key wins (the policy's variables)."""

    __slots__ = ("_layers",)

    def __init__(self, layers: Sequence[Mapping[str, Any]]) -> None:
        self._layers = layers

    def __getitem__(self, key: str) -> Any:
        for m in self._layers:
            if key in m:
                return m[key]
        raise KeyError(key)

    def __contains__(self, key: object) -> bool:
        return any(key in m for m in self._layers)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys(k for m in self._layers for k in m))

    def __len__(self) -> int:
        return sum(1 for _ in self)


class ResolvedConflict(NamedTuple):
    """One conflict of a join with its resolution (``None`` while pending). Unpacks as the
    pair, ``for conflict, resolution in result.conflicts``, and reads as the conflict too
    (``item.key``, ``item.conflicting_values``)."""

    conflict: MergedConflict
    resolution: Resolution | None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.conflict, name)


@dataclass(frozen=True)
class JoinResult:
    """What a join does to the parent. ``changes``: per layer, ``(key, value |
    DELETED)`` in application order; ``conflicts``: each with its resolution (``None``
    while pending); ``merged_conflicts``: the entries added to ``_mergedConflicts``."""

    gateway_id: str
    snapshot_id: str
    branches: tuple[str, ...]
    changes: Mapping[Layer, list[tuple[str, Any]]]
    conflicts: list[ResolvedConflict]
    pending: list[HumanRequest] = field(default_factory=list)
    steps: list[ResolutionStep] = field(default_factory=list)
    merged_conflicts: list[dict[str, Any]] = field(default_factory=list)
    # keys a branch's activities marked preserved (preserveKeys) that the base had not:
    # they stay preserved in the parent, so no compression after the join drops them
    preserved: tuple[str, ...] = ()
    # the branches' compaction records dropped as another kept one summarises their base entries
    # (``_fold_choice``): ``{"branch", "key", "restored": [the branch's own entries it had folded]}``
    dropped_compactions: tuple[dict[str, Any], ...] = ()
    # base HISTORY keys the join removes because every branch that removed them folded them (a
    # compression, or a join inside the branch that did so): an enclosing join reads the
    # removal as a compression's, no decision about the value (``_compressed``)
    folded: tuple[str, ...] = ()
    # the values the branches decided for the data keys the join takes as their folds (base keys
    # it removes, ``folded``, and keys new since the split it does not add): an enclosing join,
    # or a later split's ``folded_before``, reads them as the process's values
    folded_values: dict[str, Any] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.pending

    def all_changes(self) -> list[tuple[Layer, str, Any]]:
        return [(layer, key, value) for layer in sorted(self.changes) for key, value in self.changes[layer]]

    def conflict_records(self) -> list[dict[str, Any]]:
        """The CLI's ``--json`` ``conflicts`` entries."""
        return [{"gateway_id": self.gateway_id, "layer": str(c.layer), "key": c.key,
                 "base_value": base_json(c.base_value),
                 "values": {b: jsonable(v) for b, v in c.conflicting_values.items()},
                 "resolution": None if r is None else r.to_dict(),
                 **({"base_absent": True} if c.base_value is DELETED else {})} for c, r in self.conflicts]


def base_json(value: Any) -> Any:
    """A conflict's base value in JSON: ``null`` for a key absent at the split (as the seed's
    ``base.get(key)`` gives it; ``base_absent`` then tells it from a ``null`` value)."""
    return None if value is DELETED or value == DELETED.to_json() else value


def _injected(branch: LayeredContext) -> dict[str, Any]:
    """What the split put into the branch's WORKING, from its ``fork`` event."""
    first = branch.tape[0] if len(branch.tape) else None
    if first is None or first.kind != EventKind.FORK:
        return {}
    return {key: value for layer, key, value in first.changes if layer == Layer.WORKING and value is not DELETED}


def _compressed(branch: LayeredContext, keys: Collection[str]) -> list[str]:
    """Of ``keys``, those whose last HISTORY change in ``branch`` was a compression's (or a join's
    that only brought the folds of the branches inside it: ``JoinResult.folded``)."""
    if not _folds_any(branch.tape):
        return []
    last: dict[str, bool] = {}
    for e in branch.tape:
        for layer, key, _ in e.changes:
            if layer == Layer.HISTORY and key in keys:
                last[key] = _folding(e, key)
    return [key for key, by_compression in last.items() if by_compression]


def _folds_any(events: Iterable[Event]) -> bool:
    """Whether any of ``events`` can fold a key (a compression, or a join that brought its branches'
    folds). Most tapes hold none, and then every fold walk here finds nothing: a join asks this
    first instead of walking each branch's changes several times."""
    for e in events:
        data = e.data
        if data:
            note = data.get("note")
            if note == "compress" or (note == "join" and (data.get("folded") or data.get("folded_values"))):
                return True
    return False


def _folding(e: Event, key: str) -> bool:
    """Whether event ``e``'s change of ``key`` was a compression's (or a join's that only brought
    the folds of the branches inside it: ``JoinResult.folded``)."""
    note = e.data.get("note")
    return note == "compress" or (note == "join" and key in (e.data.get("folded") or ()))


def _walk_folds(events: Iterable[Event]) -> tuple[dict[str, Any], dict[str, bool]]:
    """Per data key, the value of its last change in HISTORY or WORKING that was no fold (the
    fork's injection too), and whether its last HISTORY change was a fold. A join's
    ``folded_values`` are the values its branches decided for the keys it took as folds."""
    decided: dict[str, Any] = {}
    folded: dict[str, bool] = {}
    for e in events:
        # a key one event removes from WORKING and sets in HISTORY (an activity's move, a join's
        # merge) holds the HISTORY value: the removal from WORKING is no decision to delete it
        moved = {key for layer, key, value in e.changes if layer == Layer.HISTORY and value is not DELETED}
        for layer, key, value in e.changes:
            if layer not in (Layer.HISTORY, Layer.WORKING):
                continue
            if layer == Layer.WORKING and value is DELETED and key in moved:
                continue
            if _folding(e, key):
                if layer == Layer.HISTORY:
                    folded[key] = True
                continue
            decided[key] = value
            if layer == Layer.HISTORY:
                folded[key] = False
        if e.data.get("note") == "join":
            for key, value in (e.data.get("folded_values") or {}).items():
                decided[key] = value
                folded[key] = True
    return decided, folded


def _fold_decisions(branch: LayeredContext) -> dict[str, Any]:
    """The HISTORY keys whose last change in ``branch`` was a compression's, each with the value the
    branch decided before it (``_walk_folds``), ``None`` when the branch never changed the key but
    by compressions. A fold is no decision about a value: a join reads the branch's decision."""
    if not _folds_any(branch.tape):
        return {}
    decided, folded = _walk_folds(branch.tape)
    return {key: decided.get(key) for key, by_fold in folded.items() if by_fold}


def folded_before(base: Snapshot, context_of: Callable[[str], LayeredContext | None]) -> dict[str, Any]:
    """Data keys the split's HISTORY lacks because a compression before the split folded them, each
    with the value the process had decided for it before the fold. ``context_of``: the context
    that took a snapshot, by the snapshot's id (``None``: unknown). Read from the tape of the
    split's context up to the snapshot (a compress event, or a join that only brought its
    branches' folds, ``JoinResult.folded``, is no decision: the value before it is the
    process's), then from the context it was forked from, up to the fork. A fold is no decision
    about a value: a branch that writes the value a key had before its fold has not changed it."""
    chain: list[list[Event]] = []  # the events of each context up to its snapshot, the split's first
    sid: str | None = base.id
    seen: set[str] = set()
    while sid is not None and sid not in seen:
        seen.add(sid)
        ctx = context_of(sid)
        if ctx is None:
            break
        try:
            until = ctx.get_snapshot(sid).seq
        except ContextKeyError:
            break
        events = [e for e in ctx.tape if e.seq <= until]
        chain.append(events)
        first = events[0] if events else None
        sid = first.data.get("snapshot_id") if first is not None and first.kind == EventKind.FORK else None
    if not any(_folds_any(events) for events in chain):
        return {}  # nothing was ever folded
    base_h, base_w = base.layer(Layer.HISTORY), base.layer(Layer.WORKING)
    out: dict[str, Any] = {}
    settled: set[str] = set()
    wanted: set[str] = set()
    for events in chain:
        decided, folded = _walk_folds(events)
        for key in [*folded, *wanted]:
            if key in settled or is_record_key(key) or key in BRANCH_MARKERS or not (folded.get(key) or key in wanted):
                continue
            if key in decided:
                value = decided[key]
                if value is not None and value is not DELETED and key not in base_h and key not in base_w:
                    out[key] = value
            else:
                wanted.add(key)  # folded here, decided in the context this one was forked from
        settled.update(decided)  # what a later context decided hides what an earlier one did
    return out


def _scoped_layers(base: Snapshot, branch: LayeredContext, injected: Mapping[str, Any],
                   preserved: frozenset[str] = frozenset(),
                   contested: frozenset[str] = frozenset(),
                   changed_working: frozenset[str] = frozenset(),
                   unfolded: Mapping[str, Any] | None = None,
                   base_folded: Mapping[str, Any] | None = None) -> dict[Layer, Mapping[str, Any]]:
    """The branch's layers with every injected key it left alone put back to the base, so is
    every key of the base's WORKING in ``changed_working`` (another branch changed it), and
    every base HISTORY key that only this branch's compressor changed when the key is in
    ``preserved`` (the join's preserved keys: another branch preserved it) or in
    ``contested`` (another branch changed it too). ``unfolded``: HISTORY keys put back as they
    were before a fold whose compaction record the join drops (``_fold_choice``), and that record
    (``DELETED``)."""
    layers: dict[Layer, Mapping[str, Any]] = {layer: branch.layer(layer) for layer in MERGED_LAYERS}
    working, history = layers[Layer.WORKING], layers[Layer.HISTORY]
    base_w, base_h = base.layer(Layer.WORKING), base.layer(Layer.HISTORY)
    over_w: dict[str, Any] = {}
    over_h: dict[str, Any] = {}
    unknown = {k for k in preserved - branch.preserved if k in base_h} | set(contested)
    if unknown:
        # what the branch decided, not what its compressions made of it: the split's value
        # when it only compressed the key, its own when it wrote it first (a conflict with
        # another branch's value, as without the compression)
        for key, decided in _fold_decisions(branch).items():
            if key in unknown:
                over_h[key] = decided if decided is not None else base_h[key] if key in base_h else DELETED
    for key in BRANCH_MARKERS:
        if key in working or key in base_w:
            over_w[key] = base_w[key] if key in base_w else DELETED
        if key in history or key in base_h:
            over_h[key] = base_h[key] if key in base_h else DELETED
    over_h.update(unfolded or {})
    seen_h: Mapping[str, Any] = _Overlay(history, unfolded) if unfolded else history
    # a branch whose activity only moved a key of WORKING at the split into HISTORY, with the
    # value it had, left it alone; another branch's change of it is then no conflict. An
    # injected key is left alone holding the injected value or the split's (set back to it);
    # either is left alone too when a compression in the branch folded it holding that value: the
    # fold summarised the branch's own value, no decision about the split's (which stays).
    alone: dict[str, list[Any]] = {k: [base_w[k]] for k in changed_working if k in base_w}
    for key, value in injected.items():
        alone.setdefault(key, []).append(value)
    for key, values in alone.items():
        if key in BRANCH_MARKERS:
            continue
        kept_in_history = key in seen_h and any(same_value(seen_h[key], v) for v in values)
        if key not in working and key not in seen_h and key in (folds := _fold_decisions(branch)):
            before = folds[key]
            kept_in_history = before is not None and before is not DELETED and any(same_value(before, v) for v in values)
        if (key in working and any(same_value(working[key], v) for v in values)) or (key not in working and kept_in_history):
            over_w[key] = base_w[key] if key in base_w else DELETED
            # (a join inside the branch that took its branches' folds of the key names the value
            # they decided, ``folded_values``: left alone too when it is the one the branch holds)
            kept_in_history = kept_in_history or (key in over_h and over_h[key] is not DELETED
                                                  and any(same_value(over_h[key], v) for v in values))
        if kept_in_history:
            over_h[key] = base_h[key] if key in base_h else DELETED
    if base_folded:
        # a key a compression folded before the split, which the branch holds with the value it
        # had before the fold: unchanged (``folded_before``)
        view_h: Mapping[str, Any] = _Overlay(history, over_h) if over_h else history
        for key, value in base_folded.items():
            if key in view_h and view_h[key] is not DELETED and same_value(view_h[key], value):
                over_h[key] = DELETED
            if key in working and same_value(working[key], value):
                over_w[key] = DELETED
    if over_w:
        layers[Layer.WORKING] = _Overlay(working, over_w)
    if over_h:
        layers[Layer.HISTORY] = _Overlay(history, over_h)
    return layers


def _written_back(found: list[KeyOutcome], base_folded: Mapping[str, Any], base: Snapshot,
                  raw_layers: Mapping[str, Mapping[str, Any]]) -> list[KeyOutcome]:
    """A key folded before the split that a branch wrote back with the value it had is no change
    (``_scoped_layers``), yet it must not stay folded: the process reads it again after the join.
    Where no branch changed it otherwise, the join brings the value back."""
    changed = {o.key for o in found if o.changed_by}
    added: list[KeyOutcome] = []
    for key, value in base_folded.items():
        if key in changed or any(key in base.layer(layer) for layer in Layer):
            continue
        holders = {b: m[key] for b, m in raw_layers.items() if key in m and same_value(m[key], value)}
        if holders:
            first = next(iter(holders.values()))
            added.append(KeyOutcome(key, DELETED, first, tuple(holders), results=holders))
    if not added:
        return found
    gone = {o.key for o in added}
    return [*(o for o in found if o.key not in gone), *added]


def _left_alone(branch: LayeredContext, key: str, value: Any) -> bool:
    """Whether ``key`` holds ``value`` in the branch's WORKING, or, moved there by an activity, in its HISTORY."""
    working, history = branch.layer(Layer.WORKING), branch.layer(Layer.HISTORY)
    if key in working:
        return same_value(working[key], value)
    return key in history and same_value(history[key], value)


def _changed_working(base: Snapshot, branches: Mapping[str, LayeredContext]) -> frozenset[str]:
    """Keys of the base's WORKING (other than the branch markers) that some branch changed."""
    base_w = base.layer(Layer.WORKING)
    return frozenset(k for k in base_w if k not in BRANCH_MARKERS
                     and any(not _left_alone(ctx, k, base_w[k]) for ctx in branches.values()))


def _contested(base: Snapshot, branches: Mapping[str, LayeredContext],
               touched: Mapping[str, Mapping[Layer, dict[str, None] | None]],
               unfolded: Mapping[str, Mapping[str, Any]]) -> frozenset[str]:
    """HISTORY keys that two or more branches changed: base keys (a compression's fold counts,
    unless the join drops its record: ``unfolded``) and data keys new since the split (one a
    branch wrote and its compression then folded counts too), a new key one branch holds in
    WORKING (an exclusive choice inside it injected it, no activity moved it since) among them."""
    base_h = base.layer(Layer.HISTORY)
    counts: dict[str, int] = {}
    for b, ctx in branches.items():
        history: Mapping[str, Any] = ctx.layer(Layer.HISTORY)
        if unfolded.get(b):
            history = _Overlay(history, unfolded[b])
        keys = touched[b][Layer.HISTORY]
        folds: dict[str, Any] | None = None
        mine: set[str] = set()
        for key in keys if keys is not None else base_h:
            if key in base_h:
                changed = key not in history or not same_value(history[key], base_h[key])
            elif is_record_key(key) or key in BRANCH_MARKERS:
                continue
            elif key in history:
                changed = True
            else:
                folds = _fold_decisions(ctx) if folds is None else folds
                changed = folds.get(key) not in (None, DELETED)
            if changed:
                mine.add(key)
        working, base_w = ctx.layer(Layer.WORKING), base.layer(Layer.WORKING)
        w_keys = touched[b][Layer.WORKING]
        for key in w_keys if w_keys is not None else working:
            if key in base_h or key in mine or is_record_key(key) or key in BRANCH_MARKERS:
                continue
            if key in working and not (key in base_w and same_value(working[key], base_w[key])):
                mine.add(key)
        for key in mine:
            counts[key] = counts.get(key, 0) + 1
    return frozenset(k for k, n in counts.items() if n > 1)


def single_counts(base: Snapshot, contexts: Mapping[str, LayeredContext]) -> dict[str, dict[str, Any]]:
    """``_counters`` for a merge of ``contexts`` (in order) that are no branches of one split: an
    event sub-process back into the flow it left (``engine.scope_steps``). Per context, the
    counters it merges as. A context's changes since ``base`` are those after ``base`` in its
    tape, or all of a context forked from ``base``; a counter of a context whose tape does not
    tell stays as it is."""
    if not all(any(k.startswith(COUNT_PREFIX) for k in ctx.layer(Layer.HISTORY)) for ctx in contexts.values()):
        return {}  # (the tapes are read only when every context holds a counter)
    counted: dict[str, dict[str, _Counted | None]] = {}
    for name, ctx in contexts.items():
        first = ctx.tape[0] if len(ctx.tape) else None
        if base.context == ctx.name:
            since = base.seq
        elif first is not None and first.kind == EventKind.FORK and first.data.get("snapshot_id") == base.id:
            since = -1
        else:
            continue
        keys = {k: None for e in ctx.tape if e.seq > since for layer, k, _ in e.changes if layer == Layer.HISTORY}
        counted[name] = _branch_counts(base, ctx, keys, since)
    return _counters(base, counted, list(contexts), frozenset())[0]


def _counted_only(keys: Collection[str], base: Snapshot, branches: Mapping[str, LayeredContext],
                  counted: Mapping[str, Mapping[str, _Counted | None]]) -> frozenset[str]:
    """Of base HISTORY ``keys``, those every branch that changed them removed with a counter
    (``_counters``): several branches' removals of one entry agree, none is a contest."""
    base_h = base.layer(Layer.HISTORY)
    by = {b: {k for c in counted.get(b, {}).values() if c is not None for k in c.removed} for b in branches}

    def changed(ctx: LayeredContext, key: str) -> bool:
        history = ctx.layer(Layer.HISTORY)
        return key not in history or not same_value(history[key], base_h[key])
    return frozenset(k for k in keys if all(k in by[b] for b, ctx in branches.items() if changed(ctx, k)))


def _removed_by_compressions(keys: Collection[str], base: Snapshot, branches: Mapping[str, LayeredContext],
                             unfolded: Mapping[str, Mapping[str, Any]]) -> tuple[set[str], dict[str, list[str]]]:
    """Of base HISTORY ``keys`` several branches changed, those no branch decided a value for (each
    changed it by compressions alone) and some branch's compression removed: a counter's or a
    fold's whose record the join keeps (``unfolded``: the branch's view once dropped folds are
    undone) counts it or summarises it, so it stays removed, also from the branches whose
    compression only altered it (summarised once, not also kept whole beside the record, nor
    brought back as the base). And per branch, those of them it still holds."""
    base_h = base.layer(Layer.HISTORY)
    views = {b: _Overlay(ctx.layer(Layer.HISTORY), unfolded[b]) if unfolded.get(b) else ctx.layer(Layer.HISTORY)
             for b, ctx in branches.items()}
    decisions: dict[str, dict[str, Any]] = {}
    removed: set[str] = set()
    held: dict[str, list[str]] = {}
    for key in keys:
        if key not in base_h or is_record_key(key):
            continue
        changers = [b for b, view in views.items() if key not in view or not same_value(view[key], base_h[key])]
        if not any(key not in views[b] for b in changers):
            continue
        decided = [decisions.setdefault(b, _fold_decisions(branches[b])) for b in changers]
        if all(key in d and (d[key] is None or same_value(d[key], base_h[key])) for d in decided):
            removed.add(key)
            for b in changers:
                if key in views[b]:
                    held.setdefault(b, []).append(key)
    return removed, held


def _touched(base: Snapshot, branch: LayeredContext) -> dict[Layer, dict[str, None] | None]:
    """Per layer, the keys the branch's tape changed since its fork (``None``: compare all)."""
    events = list(branch.tape)
    if not events or events[0].kind != EventKind.FORK or events[0].data.get("snapshot_id") != base.id:
        return {layer: None for layer in MERGED_LAYERS}
    touched: dict[Layer, dict[str, None] | None] = {layer: {} for layer in MERGED_LAYERS}
    for e in events:
        if e.kind in (EventKind.RESTORE, EventKind.ABORT) and e.snapshot is not None and e.snapshot.context != branch.name:
            for i in e.data.get("layers") or [int(x) for x in MERGED_LAYERS]:
                if Layer(i) in touched:
                    touched[Layer(i)] = None
        for layer, key, _ in e.changes:
            keys = touched.get(Layer(layer))
            if keys is not None:
                keys.setdefault(key, None)
        history = touched[Layer.HISTORY]
        if history is not None and e.data.get("note") == "join":
            for key in e.data.get("folded_values") or ():  # (decided inside, folded: ``_walk_folds``)
                history.setdefault(key, None)
    return touched


class _Fold(NamedTuple):
    """A compaction record a branch added since the split."""

    branch: str
    key: str
    order: int  # its place in the branch's HISTORY
    base_keys: frozenset[str]  # the base HISTORY keys it summarises, through the records it merged too
    # the keys it folded that the branch's HISTORY no longer holds -> (value, place) before the
    # fold; None when the branch's tape does not tell (a record a join inside the branch brought)
    undo: dict[str, tuple[Any, int]] | None


def _branch_folds(base: Snapshot, branch_id: str, branch: LayeredContext,
                  keys: Iterable[str] | None) -> list[_Fold]:
    """The compaction records ``branch`` added to HISTORY since the split (of ``keys``, the
    HISTORY keys its tape touched; ``None``: all)."""
    base_h, history = base.layer(Layer.HISTORY), branch.layer(Layer.HISTORY)
    new = [k for k in (keys if keys is not None else history) if k.startswith("compaction:") and k in history
           and not (k in base_h and same_value(history[k], base_h[k]))]
    if not new:
        return []
    made = {(e.data["compaction_key"], e.data.get("snapshot_id")): e for e in branch.tape
            if e.data.get("note") == "compress" and e.data.get("compaction_key")}
    folds = []
    # a key the branch decided again after a record folded it (a join inside the branch took a
    # value its branches decided, and a later fold, one the tape may not unfold, took that) comes
    # back with the branch's last decision, not the value the record found
    decided = {k: v for k, v in _fold_decisions(branch).items()
               if v is not None and v is not DELETED and not is_record_key(k) and k not in BRANCH_MARKERS}
    for key in new:
        base_keys: set[str] = set()
        undo: dict[str, tuple[Any, int]] = {}
        known = _unfold(key, history[key], branch, base_h, made, base_keys, undo)
        for k, (old, at) in list(undo.items()):
            if k in decided:
                undo[k] = (decided[k], at)
        folds.append(_Fold(branch_id, key, history.order_of(key), frozenset(base_keys),
                           {k: v for k, v in undo.items() if k not in history} if known else None))
    return folds


def _unfold(key: str, record: Any, branch: LayeredContext, base_h: LayerView,
            made: Mapping[tuple[str, Any], Event], base_keys: set[str], undo: dict[str, tuple[Any, int]]) -> bool:
    """Add what compaction record ``key`` folded to ``base_keys`` (the base's keys) and ``undo``
    (each folded key's value and place before the fold; a record of the branch's it merged is
    unfolded in turn). False when the branch's tape does not tell, for it or a record it merged;
    ``base_keys`` then gets the base keys its ``covers`` names too."""
    value = thaw(record) if isinstance(record, Mapping) else {}
    covers = {k for k in value.get("covers") or () if isinstance(k, str)}
    event = made.get((key, value.get("snapshot_id")))
    try:
        before = branch.get_snapshot(str(value.get("snapshot_id"))).layer(Layer.HISTORY) if event else None
    except ContextKeyError:
        before = None
    if event is None or before is None:
        base_keys.update(k for k in covers if k in base_h)
        return False
    # ``covers`` names an activity folded whole by its record alone; a key a rule of the same
    # compression removed (count_only), even one of such an activity, is no part of the fold
    owner = segment_history(list(before.items())).owner
    counted = {k for found in _removed_by_counters(event, before).values() for k in found}
    known = True
    # a key an earlier record folded, which the branch then wrote again before this record folded
    # it, comes back as this record found it: the records it merged only fill in the rest
    merged: dict[str, tuple[Any, int]] = {}
    for layer, k, new in event.changes:
        if layer != Layer.HISTORY or new is not DELETED or k not in before or k in counted or (
                k not in covers and owner.get(k) not in covers):
            continue
        old = before[k]
        if k.startswith("compaction:") and not (k in base_h and same_value(base_h[k], old)):
            known = _unfold(k, old, branch, base_h, made, base_keys, merged) and known
            continue
        if k in base_h:
            base_keys.add(k)
        undo[k] = (old, before.order_of(k))
    for k, older in merged.items():
        undo.setdefault(k, older)
    return known


def _fold_choice(folds: Iterable[_Fold], rank: Mapping[str, int]) -> list[_Fold]:
    """The branches' compaction records a join drops so that each base HISTORY entry is summarised
    at most once. Records that summarise base entries are kept in this order unless a kept one
    summarises one of their base entries too: those the tape cannot unfold (kept always), then the
    one summarising the most base entries (the deepest fold; a cliff folds oldest first, so the
    others' base entries are mostly among its own), then branch order and the branch's HISTORY
    order. Nothing here depends on the order the branches arrived in."""
    summarised: set[str] = set()
    dropped: list[_Fold] = []
    for fold in sorted((f for f in folds if f.base_keys),
                       key=lambda f: (f.undo is not None, -len(f.base_keys), rank[f.branch], f.order)):
        if fold.undo is not None and fold.base_keys & summarised:
            dropped.append(fold)
        else:
            summarised |= fold.base_keys
    return dropped


class _Counted(NamedTuple):
    """What one branch's ``count_only`` counter of a pattern removed since the split."""

    record: Mapping[str, Any]  # the branch's counter as it stands
    removed: frozenset[str]  # the HISTORY keys its rule removed


def _removed_by_counters(event: Event, before: Mapping[str, Any]) -> dict[str, set[str]]:
    """Per ``summary:count:*`` counter a compress event wrote, the HISTORY keys its ``count_only``
    rule removed: those of its pattern the event removed, but for the ones the counter kept. (The
    rules run before the fold, so a key they removed is no part of the fold, whoever owned it.)"""
    changed = {k: v for layer, k, v in event.changes if layer == Layer.HISTORY}
    out: dict[str, set[str]] = {}
    for key, value in changed.items():
        record = thaw(value) if key.startswith(COUNT_PREFIX) and value is not DELETED else None
        if not isinstance(record, Mapping) or not is_protected_record(key, record):
            continue
        rule = CompressRule(pattern=str(record.get("pattern") or key[len(COUNT_PREFIX):]), action="count_only")
        kept = set(counter_in_place(record))
        out[key] = {k for k, v in changed.items() if v is DELETED and k in before and k not in kept
                    and rule.matches(entry_kind(k, thaw(before[k])), k)}
    return out


def _branch_counts(base: Snapshot, branch: LayeredContext, keys: Iterable[str] | None,
                   since: int = -1) -> dict[str, _Counted | None]:
    """The ``summary:count:*`` counters ``branch`` changed since the split (of ``keys``, the HISTORY
    keys its tape touched; ``None``: all), each with what its rule removed (``None``: the tape does
    not tell); ``since``: the seq in its tape where the split is (a context that was not forked)."""
    base_h, history = base.layer(Layer.HISTORY), branch.layer(Layer.HISTORY)
    counters = [k for k in (keys if keys is not None else history) if k.startswith(COUNT_PREFIX) and k in history
                and is_protected_record(k, thaw(history[k])) and not (k in base_h and same_value(history[k], base_h[k]))]
    if not counters:
        return {}
    if keys is None:  # not forked from the join's snapshot: its tape may hold removals from before
        return dict.fromkeys(counters)
    removed: dict[str, set[str] | None] = {k: set() for k in counters}
    for e in branch.tape:
        if e.seq <= since or e.data.get("note") != "compress":
            continue
        mine = [k for layer, k, _ in e.changes if layer == Layer.HISTORY and k in removed]
        if not mine:
            continue
        try:
            before = branch.get_snapshot(str(e.data.get("snapshot_id"))).layer(Layer.HISTORY)
        except ContextKeyError:
            removed.update(dict.fromkeys(mine))
            continue
        by_counter = _removed_by_counters(e, before)
        for key in mine:
            found = removed[key]
            if found is not None:
                found.update(by_counter.get(key, ()))
    return {k: None if found is None else _Counted(history[k], frozenset(found)) for k, found in removed.items()}


def _counters(base: Snapshot, counted: Mapping[str, Mapping[str, _Counted | None]], order: Sequence[str],
              pinned: Collection[str]) -> tuple[dict[str, dict[str, Any]], frozenset[str]]:
    """One counter per pattern that several branches counted (see the module doc): per branch, the
    counters to merge as (the same value in each branch that counted), and the base entries some
    counter removed (each branch that changed one removed it: no branch's compression keeps it)."""
    base_h = base.layer(Layer.HISTORY)
    over: dict[str, dict[str, Any]] = {}
    gone: set[str] = set()
    for key in dict.fromkeys(k for b in order for k in counted.get(b, {})):
        found = {b: counted[b][key] for b in order if key in counted.get(b, {})}
        known = {b: c for b, c in found.items() if c is not None}
        if len(found) < 2 or len(known) < len(found):
            continue
        # a key another branch preserved comes back (``_scoped_layers``): not removed, not counted
        base_removed = {k for c in known.values() for k in c.removed if k in base_h and k not in pinned}
        own = sum(len([k for k in c.removed if k not in base_h]) for c in known.values())
        before = thaw(base_h[key]) if key in base_h else {}
        dropped = int(before.get("dropped", 0) if isinstance(before, Mapping) else 0) + len(base_removed) + own
        # what the counters kept where it was, each entry once, listed as the first branch that lists it does
        kept: dict[str, list[str]] = {"kept": []}
        listed: set[str] = set()
        for c in known.values():
            for how, keys in counter_lists(thaw(c.record)).items():
                for k in keys:
                    if k not in base_removed and k not in listed:
                        listed.add(k)
                        kept.setdefault(how, []).append(k)
        # the kept entries an earlier join took away from a counter (``_counters_told``) stay counted
        away = {how: list(dict.fromkeys(k for c in known.values() for k in counter_gone(c.record).get(how, ())))
                for how in COUNTER_GONE}
        away = {how: keys for how, keys in away.items() if keys}
        record = {**{k: v for k, v in thaw(next(iter(known.values())).record).items()
                     if k not in COUNTER_GONE and k not in COUNTER_IN_PLACE},
                  "count": dropped + len(listed) + sum(map(len, away.values())), "dropped": dropped, **kept,
                  **away}
        for b in known:
            over.setdefault(b, {})[key] = record
        gone |= base_removed
    return over, frozenset(gone)


def _counters_told(history: Mapping[str, Any], changes: list[tuple[str, Any]], folded: Callable[[str], bool],
                   held: Iterable[str] = ()) -> list[tuple[str, Any]]:
    """``changes`` (HISTORY changes to ``history``) with each ``count_only`` counter they bring
    saying what became of the entries it lists as kept: one the merge removes (a fold took it,
    ``folded``; or a decision removed it) is no longer kept, so it moves from ``kept`` to
    ``folded`` (``deleted``), still counted. ``held``: counters ``history`` holds to tell as well,
    added as changes when told. (At a join a counter of the base needs no telling: each branch's
    folds leave the entries it keeps, as the compressor does.) O(changes + held)."""
    if not any(value is DELETED for _, value in changes):
        return changes
    merged = _Overlay(history, dict(changes))
    told: dict[str, Any] = {}
    brought = {k for k, _ in changes}
    for key, value in [*changes, *((k, history[k]) for k in held if k in history and k not in brought)]:
        if not key.startswith(COUNT_PREFIX) or value is DELETED:
            continue
        record = thaw(value)
        if not isinstance(record, Mapping) or not is_protected_record(key, record):
            continue
        lists = counter_lists(record)
        away = [k for keys in lists.values() for k in keys if k not in merged]
        if not away:
            continue
        gone = counter_gone(record)
        for k in away:
            gone.setdefault("folded" if folded(k) else "deleted", []).append(k)
        still = {how: [k for k in keys if k in merged] for how, keys in lists.items()}
        told[key] = {**{k: still[k] if k in still else v for k, v in record.items()
                        if k not in still or still[k] or k == "kept"}, **gone}
    if not told:
        return changes
    return [*((k, told.pop(k) if k in told else v) for k, v in changes), *told.items()]


def side_counters_told(flow: LayeredContext, side: LayeredContext,
                       changes: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """``_counters_told`` for the HISTORY ``changes`` an event sub-process ``side`` brings back into
    the ``flow`` it left (``engine.scope_steps``): the flow's own counters are told too (the side's
    fold may take an entry one of them kept), and an entry is folded when the last change that
    removed it, in the context that removed it, was a compression's."""
    if not any(value is DELETED for _, value in changes):
        return changes
    history = flow.layer(Layer.HISTORY)
    removed = {k for k, value in changes if value is DELETED}
    return _counters_told(history, changes,
                          lambda k: bool(_compressed(side if k in removed else flow, (k,))),
                          [k for k in history if k.startswith(COUNT_PREFIX)])


class Unfolded(NamedTuple):
    """The compaction records a merge drops so that each base HISTORY entry is summarised once
    (``single_summaries``), and what each branch merges as instead."""

    dropped: list[_Fold]  # branch order, then the branch's HISTORY order
    # per branch: the HISTORY keys put back as they were before a dropped fold, and the dropped
    # record itself (its base value, or ``DELETED``)
    values: dict[str, dict[str, Any]]
    # per branch: where each key put back stood in its HISTORY (``None``: a dropped record)
    places: dict[str, dict[str, int | None]]


def single_summaries(base: Snapshot, branches: Mapping[str, LayeredContext],
                     keys: Mapping[str, Iterable[str] | None], *, kept: Collection[str] = ()) -> Unfolded:
    """Of the compaction records ``branches`` (in branch order) added since ``base``, those to drop
    so that no base HISTORY entry is summarised twice (``_fold_choice``); ``keys``: per branch, the
    HISTORY keys its tape touched (``None``: all). The records of the branches in ``kept`` stay
    whatever they summarise: an event sub-process merging back beside the flow it left never
    takes the flow's summary away (``engine.scope_steps``)."""
    rank = {b: i for i, b in enumerate(branches)}
    dropped = _fold_choice((f._replace(undo=None) if b in kept else f for b, ctx in branches.items()
                            for f in _branch_folds(base, b, ctx, keys.get(b))), rank)
    base_h = base.layer(Layer.HISTORY)
    values: dict[str, dict[str, Any]] = {}
    places: dict[str, dict[str, int | None]] = {}
    dropped.sort(key=lambda f: (rank[f.branch], f.order))
    for fold in dropped:
        undo = fold.undo or {}
        values.setdefault(fold.branch, {})[fold.key] = base_h[fold.key] if fold.key in base_h else DELETED
        values[fold.branch].update({k: value for k, (value, _) in undo.items()})
        places.setdefault(fold.branch, {})[fold.key] = None
        places[fold.branch].update({k: at for k, (_, at) in undo.items()})
    return Unfolded(dropped, values, places)


def _records_apart(outcomes: list[KeyOutcome], taken: list[Mapping[str, Any]]
                   ) -> tuple[list[KeyOutcome], dict[str, tuple[str, str]]]:
    """Outcomes in which records that several branches added under one key with different
    values are kept apart (see the module doc); and each new key's (branch, key in branch)."""
    out: list[KeyOutcome] = []
    aliases: dict[str, tuple[str, str]] = {}
    for o in outcomes:
        if o.conflict is None or o.base_value is not DELETED or not is_record_key(o.key):
            out.append(o)
            continue
        groups: dict[str, list[str]] = {}  # the value's key -> branches that added it, branch order
        for b, value in o.results.items():
            groups.setdefault(value_key(value), []).append(b)
        for n, members in enumerate(groups.values()):
            key = o.key
            if n:
                key = free_record_key(o.key, [*taken, aliases])
                aliases[key] = (members[0], o.key)
            value = o.results[members[0]]
            out.append(KeyOutcome(key, DELETED, value, tuple(members), None, {b: value for b in members}))
    return out, aliases


def free_record_key(key: str, taken: list[Mapping[str, Any]]) -> str:
    """The next key of ``key``'s series that none of ``taken`` holds."""
    prefix, _, tail = key.partition(":")
    if prefix == "compaction" and tail.isdigit():
        stem, n, sep = "compaction:", int(tail) + 1, ""
    else:
        head, sep, number = key.rpartition("#")
        stem, n, sep = (head, int(number) + 1, "#") if sep and number.isdigit() else (key, 2, "#")
    while any(f"{stem}{sep}{n}" in m for m in taken):
        n += 1
    return f"{stem}{sep}{n}"


def _conflicts_across_layers(outcomes: dict[Layer, list[KeyOutcome]], base: Snapshot,
                             scoped: Mapping[str, Mapping[Layer, Mapping[str, Any]]],
                             skip: Collection[str] = ()) -> None:
    """Make a conflict of a key that branches changed to different values in different layers.

    One branch may add ``decision`` to PROCESS while another's activity writes it to WORKING
    (HISTORY by the join): each layer alone has one change and no conflict, but a read after
    the join would silently give the first branch's value. Such a key is compared as a read
    sees it: each branch's value is the one its first layer holding the key gives. Two
    branches with different values make a conflict in the lowest layer involved, whose
    resolution a read then sees; the key's other layers keep their merged values, but for WORKING,
    which drops it (it would move over the resolution when the next activity completes). A key with
    a conflict within one layer already is left to it, reducer keys (``skip``) to their reducer."""
    layers_of: dict[str, list[Layer]] = {}
    for layer in MERGED_LAYERS:
        for o in outcomes[layer]:
            if o.changed_by and not is_record_key(o.key) and o.key not in BRANCH_MARKERS \
                    and o.key != MERGED_CONFLICTS_KEY and o.key not in skip:
                layers_of.setdefault(o.key, []).append(layer)
    for key, layers in layers_of.items():
        if len(layers) < 2:
            continue
        within = [(layer, o) for layer in layers for o in outcomes[layer] if o.key == key and o.conflict is not None]
        if within and (len(within) > 1 or within[0][0] != layers[0]):
            continue  # left to the layers' own conflicts
        base_k = value_key(next((base.layer(layer)[key] for layer in MERGED_LAYERS if key in base.layer(layer)),
                                DELETED))
        results: dict[str, Any] = {}
        for b, branch_layers in scoped.items():
            value = next((branch_layers[layer][key] for layer in MERGED_LAYERS if key in branch_layers[layer]), DELETED)
            if value_key(value) != base_k:
                results[b] = value
        if len({value_key(v) for v in results.values()}) < 2:
            continue
        lowest = layers[0]
        if lowest != Layer.WORKING and Layer.WORKING in layers:
            # the resolution in the lowest layer stands for the key: a branch's value left in
            # WORKING would move over it into HISTORY when the next activity completes
            outcomes[Layer.WORKING] = [replace(o, value=DELETED, conflict=None) if o.key == key else o
                                       for o in outcomes[Layer.WORKING]]
        if within:
            # a conflict in the lowest layer already: it names every branch a read would see
            # changed (one that deleted the key from WORKING, beside writes moved into HISTORY)
            o = within[0][1]
            assert o.conflict is not None
            if set(results) != set(o.conflict.conflicting_values):
                conflict = replace(o.conflict, conflicting_values=results, source_branches=tuple(results))
                outcomes[lowest] = [KeyOutcome(key, o.base_value, o.value, tuple(results), conflict, results)
                                    if x is o else x for x in outcomes[lowest]]
            continue
        held = base.layer(lowest)[key] if key in base.layer(lowest) else DELETED
        # (its base value, when the lowest layer held none, is what a read gave: ``_read_base``)
        conflict = MergedConflict(key=key, base_value=held, conflicting_values=results,
                                  source_branches=tuple(results), layer=lowest)
        outcomes[lowest] = [KeyOutcome(key, held, held, tuple(results), conflict, results) if o.key == key else o
                            for o in outcomes[lowest]]


def _one_log(outcomes: dict[Layer, list[KeyOutcome]], base: Snapshot,
             scoped: Mapping[str, Mapping[Layer, Mapping[str, Any]]]) -> None:
    """``_mergedConflicts`` in one layer. A branch whose last step was a join inside it brings
    that join's log in WORKING, a branch whose activity ran after its inner join brings its
    log in HISTORY: merged layer by layer, HISTORY's log would hide WORKING's from a read, and
    the next activity's move of WORKING would overwrite it. So the log is merged as a read
    sees it: the split's log, then each branch's new entries in branch order, kept in
    HISTORY (where a move brings it anyway) when anyone held it there, else in WORKING."""
    key = MERGED_CONFLICTS_KEY
    layers = (Layer.HISTORY, Layer.WORKING)
    held = {layer for layer in layers if key in base.layer(layer)}
    held |= {layer for b in scoped.values() for layer in layers if key in b[layer]}
    if len(held) < 2:
        return  # one layer: the append reducer did it

    def read(layered: Mapping[Layer, Mapping[str, Any]]) -> list[Any]:
        value = next((layered[layer][key] for layer in layers if key in layered[layer]), None)
        return list(thaw(value)) if isinstance(thaw(value), list) else []

    start = read({layer: base.layer(layer) for layer in layers})
    seen = [value_key(e) for e in start]
    log, changed = list(start), []
    for b, layered in scoped.items():
        entries = read(layered)
        new = entries[len(start):] if [value_key(e) for e in entries[:len(start)]] == seen else \
            [e for e in entries if value_key(e) not in seen]
        if new:
            log.extend(new)
            changed.append(b)
    place = Layer.HISTORY
    for layer in layers:
        base_value = base.layer(layer)[key] if key in base.layer(layer) else DELETED
        value = log if layer == place else DELETED
        if value is DELETED and base_value is DELETED:
            merged = None
        else:
            merged = KeyOutcome(key, base_value, value, tuple(changed) or tuple(scoped), None,
                                {b: value for b in (changed or scoped)})
        rest = [o for o in outcomes[layer] if o.key != key]
        at = next((i for i, o in enumerate(outcomes[layer]) if o.key == key), len(rest))
        outcomes[layer] = rest[:at] + ([merged] if merged is not None else []) + rest[at:]


def _one_hit(outcome: KeyOutcome) -> KeyOutcome:
    """Two branches that retrieved the same passage (one ``kb:`` key: same source, same text) have
    found one fact, not disagreed about one: each retrieval scores it against its own query, so
    their confidences differ. The hit with the highest confidence is kept (the first branch's on
    a tie), no person is asked to choose between two copies of one passage. Hits whose texts
    differ (the document changed between the retrievals) stay a conflict."""
    if outcome.conflict is None:
        return outcome
    hits = [thaw(v) for v in outcome.results.values()]
    if not all(isinstance(h, dict) and h.get("kind") == "knowledge" for h in hits):
        return outcome
    if len({(value_key(h.get("source")), value_key(h.get("text"))) for h in hits}) != 1:
        return outcome
    best = max(outcome.results.values(), key=lambda v: float(thaw(v).get("confidence") or 0.0))
    return replace(outcome, value=best, conflict=None)


def _reduce(name: str, outcome: KeyOutcome, base: Snapshot, layer: Layer, *, branch_count: int,
            base_folded: Mapping[str, Any] | None = None) -> KeyOutcome:
    """A reducer key's outcome in ``layer``. A key the base held in WORKING that the branches'
    activities moved into HISTORY is new to HISTORY, but not new to the process: its reduction
    starts from the value a read gave at the split (as ``_read_base`` does for a conflict), so
    a ``sum`` adds each branch's delta to it once and an ``append`` log (``_mergedConflicts``
    too) is not repeated once per branch that carried it. The key still counts as changed in
    HISTORY (it arrives there), and WORKING's outcome (moved away by all) deletes it there. So does
    a key a compression folded before the split, from the value it had (``folded_before``)."""
    folded = base_folded or {}
    if layer != Layer.HISTORY or outcome.base_value is not DELETED or (
            outcome.key not in base.layer(Layer.WORKING) and outcome.key not in folded):
        return apply_reducer(name, outcome, branch_count=branch_count)
    working = base.layer(Layer.WORKING)
    read = working[outcome.key] if outcome.key in working else folded[outcome.key]
    changed = {b: v for b, v in outcome.results.items() if v is DELETED or not same_value(v, read)}
    rebased = replace(outcome, base_value=read, changed_by=tuple(changed), results=changed)
    if not changed:
        return replace(outcome, value=read, conflict=None)
    reduced = apply_reducer(name, rebased, branch_count=branch_count)  # a ``merge`` collision stays a conflict
    return replace(outcome, value=reduced.value, conflict=reduced.conflict)


def written_layer(layer: Layer, key: str) -> Layer:
    """The layer a conflict on ``key``, met in ``layer``, names: the one the branches wrote it to.
    By a join a finished activity's WORKING has moved into HISTORY, where the merge finds the
    key and the resolution goes, but the activities wrote WORKING (the layer of ``run --json``'s
    conflicts in DESIGN.md). HISTORY's own entries (activity and compaction records) stay HISTORY."""
    return Layer.WORKING if layer == Layer.HISTORY and not is_record_key(key) else layer


def _as_written(conflict: MergedConflict) -> MergedConflict:
    layer = written_layer(conflict.layer, conflict.key)
    return conflict if layer == conflict.layer else replace(conflict, layer=layer)


def _read_base(conflict: MergedConflict, base: Snapshot, base_folded: Mapping[str, Any] | None = None) -> MergedConflict:
    """The conflict with the base value a read gave at the split: a key the base held in WORKING
    and the branches' activities moved into HISTORY conflicts there, where the base had no value,
    but it was not unset at the split (the seed's ``_mergedConflicts`` shows ``pending``); and a
    key a compression folded before the split had the value it had before (``folded_before``)."""
    if conflict.base_value is not DELETED:
        return conflict
    read = next((base.layer(layer)[conflict.key] for layer in Layer if conflict.key in base.layer(layer)),
                (base_folded or {}).get(conflict.key, DELETED))
    return conflict if read is DELETED else replace(conflict, base_value=read)


def _ordered(outcomes: list[KeyOutcome], base_layer: Any, branch_layers: Mapping[str, Any],
             aliases: Mapping[str, tuple[str, str]] | None = None,
             places: Mapping[str, Mapping[str, int | None]] | None = None) -> list[KeyOutcome]:
    """Base keys in base order, then new keys in branch order (each branch's insertion order;
    ``places``: per branch, that of keys its HISTORY held before a fold the join undoes, and
    ``None`` for the compaction records the join drops, which place no key)."""
    existing = [o for o in outcomes if o.base_value is not DELETED]
    existing.sort(key=lambda o: base_layer.order_of(o.key))
    rank = {b: i for i, b in enumerate(branch_layers)}
    places = places or {}

    def place(b: str, key: str) -> int | None:
        if b in places and key in places[b]:
            return places[b][key]
        return int(branch_layers[b].order_of(key)) if key in branch_layers[b] else None

    def new_key_order(o: KeyOutcome) -> tuple[int, int]:
        if aliases and o.key in aliases:
            b, key = aliases[o.key]
            at = place(b, key)
            return rank[b], at if at is not None else 0
        for b in branch_layers:
            at = place(b, o.key)
            if at is not None:
                return rank[b], at
        return len(rank), 0

    new = [o for o in outcomes if o.base_value is DELETED]
    new.sort(key=new_key_order)
    return existing + new


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


BranchesArg = Mapping[str, "LayeredContext | BranchContext"] | Sequence["LayeredContext | BranchContext"]


def _branch_contexts(branches: BranchesArg) -> dict[str, LayeredContext]:
    """Branch id -> context, from a mapping or from the list ``ContextSplitter.split`` returned
    (``BranchContext`` items, or bare branch contexts, named by their ``branch_id``)."""
    items: list[tuple[str | None, Any]]
    if isinstance(branches, Mapping):
        items = list(branches.items())
    elif isinstance(branches, (str, bytes)) or not isinstance(branches, Sequence):
        raise TypeError(f"join: branches must map branch ids to their contexts, or be the list "
                        f"ContextSplitter.split returned; got {type(branches).__name__}")
    else:
        items = [(None, b) for b in branches]
    out: dict[str, LayeredContext] = {}
    for bid, b in items:
        ctx = b.context if isinstance(b, BranchContext) else b
        if not isinstance(ctx, LayeredContext):
            raise TypeError(f"join: branch {bid or len(out)} must be a LayeredContext or a BranchContext, "
                            f"got {type(b).__name__}")
        name = bid if bid is not None else (b.branch_id if isinstance(b, BranchContext) else ctx.branch_id)
        if not name:
            raise ValueError(f"join: branch context {ctx.name!r} has no branch_id; pass a mapping branch id -> context")
        if name in out:
            raise ValueError(f"join: branch {name!r} is given twice")
        out[name] = ctx
    return out


def _join_base(base: "Snapshot | LayeredContext | str", branches: Mapping[str, LayeredContext]) -> Snapshot:
    """The split's snapshot: as given, or the one the branches were forked from (``base`` the
    parent context or the snapshot's id)."""
    if isinstance(base, Snapshot):
        return base
    forked = {ctx.fork_snapshot.id: ctx.fork_snapshot for ctx in branches.values() if ctx.fork_snapshot is not None}
    if isinstance(base, str):
        if base in forked:
            return forked[base]
        raise ContextKeyError(f"join: no branch was forked from snapshot {base!r} (branches forked from: "
                              f"{', '.join(sorted(forked)) or 'none'}); pass the split's snapshot or its parent context")
    if isinstance(base, LayeredContext):
        if len(forked) != 1:
            raise ValueError(f"join: the branches were forked from {len(forked)} snapshots "
                             f"({', '.join(sorted(forked)) or 'none'}); pass the split's snapshot as base")
        [sid] = forked
        try:
            return base.get_snapshot(sid)
        except ContextKeyError:
            raise ContextKeyError(f"join: the branches were forked from snapshot {sid!r}, which context "
                                  f"{base.name!r} did not take; join into the context the split was taken from") from None
    raise TypeError(f"join: base must be the split's Snapshot, its id or the parent context, got {type(base).__name__}")


def _gateway_of(base: Snapshot) -> str:
    """The gateway id the split wrote into its snapshot's label (``split:<gateway id>``)."""
    if base.label and base.label.startswith("split:"):
        return base.label[len("split:"):]
    raise ValueError(f"join: snapshot {base.id!r} was not taken by a split; pass gateway_id=")


def join_contexts(
    base: "Snapshot | LayeredContext | str",
    branches: BranchesArg,
    *,
    config: ActivityExtensionConfig | Mapping[str, Any] | None = None,
    gateway_id: str | None = None,
    arrival_order: Sequence[str] | None = None,
    answers: Mapping[str, Any] | None = None,
    arbiter: ConflictArbiter | None = None,
    human_available: bool = False,
    injected: Mapping[str, Mapping[str, Any]] | None = None,
    clock: Callable[[], float] = time.time,
    asked: Mapping[str, Mapping[str, Any]] | None = None,
    decided: Mapping[str, Mapping[str, Any]] | None = None,
    base_folded: Mapping[str, Any] | None = None,
) -> JoinResult:
    """Merge ``branches`` (branch id -> its context at the join, in branch order) against
    ``base``, the split's snapshot. Raises ``MergeConflictError`` when conflicts cannot
    be resolved (see ``policy.resolve_conflicts``, which also explains ``asked``).

    As an outsider calls it after ``ContextSplitter.split``: ``base`` may also be the parent
    context or the snapshot's id, ``branches`` the list the split returned, ``config`` the
    join's JSON config, and ``gateway_id`` is the split's when not given."""
    branches = _branch_contexts(branches)
    base = _join_base(base, branches)
    if gateway_id is None:
        gateway_id = _gateway_of(base)
    config = as_config(config, source=f"join {gateway_id!r}")
    order = list(branches)
    # keys a branch's activities preserved stay preserved after the join (see ``preserved`` below):
    # no compression in another branch may have altered or dropped them
    pinned = frozenset(k for ctx in branches.values() for k in ctx.preserved)
    touched = {b: _touched(base, ctx) for b, ctx in branches.items()}
    # two branches' summaries of the same base entries: one is kept (see the module doc)
    dropped, unfolded, places = single_summaries(base, branches, {b: touched[b][Layer.HISTORY] for b in order})
    base_h = base.layer(Layer.HISTORY)
    counted = {b: _branch_counts(base, ctx, touched[b][Layer.HISTORY]) for b, ctx in branches.items()}
    counters, counted_away = _counters(base, counted, order, pinned)
    for b, records in counters.items():
        unfolded.setdefault(b, {}).update(records)
    contested = _contested(base, branches, touched, unfolded) - _counted_only(counted_away, base, branches, counted)
    removed, held = _removed_by_compressions(contested - pinned, base, branches, unfolded)
    for b, gone in held.items():
        unfolded.setdefault(b, {}).update(dict.fromkeys(gone, DELETED))
    contested -= removed
    # a reducer reads every branch's value (``min`` of a branch that changed the key and one that
    # did not is the unchanged one), so what each branch decided, not what its compression made of it
    contested |= frozenset(k for k in config.reducers if k != MERGED_CONFLICTS_KEY)
    changed_working = _changed_working(base, branches)
    scoped = {b: _scoped_layers(base, ctx, injected[b] if injected and b in injected else _injected(ctx), pinned,
                                contested, changed_working, unfolded.get(b), base_folded)
              for b, ctx in branches.items()}

    outcomes: dict[Layer, list[KeyOutcome]] = {}
    for layer in MERGED_LAYERS:
        base_layer = base.layer(layer)
        branch_layers = {b: scoped[b][layer] for b in order}
        if any(touched[b][layer] is None for b in order):
            keys: dict[str, None] = dict.fromkeys(base_layer)
            for m in branch_layers.values():
                keys.update(dict.fromkeys(m))
        else:
            keys = {}
            for b in order:
                keys.update(touched[b][layer] or {})
        found = merge_keys(base_layer, branch_layers, keys, layer=layer)
        found = [_reduce(config.reducers[o.key], o, base, layer, branch_count=len(order), base_folded=base_folded)
                 if o.key in config.reducers else o for o in found]
        if layer == Layer.KNOWLEDGE:
            found = [_one_hit(o) for o in found]
        raw_layers = {b: branches[b].layer(layer) for b in order}
        if base_folded and layer in (Layer.WORKING, Layer.HISTORY):
            found = _written_back(found, base_folded, base, raw_layers)
        aliases: dict[str, tuple[str, str]] = {}
        if layer == Layer.HISTORY:
            found, aliases = _records_apart(found, [base_layer, *raw_layers.values()])
        outcomes[layer] = _ordered([o for o in found if o.changed_by], base_layer, raw_layers, aliases,
                                   places if layer == Layer.HISTORY else None)
    if config.reducers.get(MERGED_CONFLICTS_KEY) == "append":
        _one_log(outcomes, base, {b: scoped[b] for b in order})
    _conflicts_across_layers(outcomes, base, scoped, skip=config.reducers)

    conflicts = sorted((_as_written(_read_base(o.conflict, base, base_folded)) for layer in MERGED_LAYERS
                        for o in outcomes[layer] if o.conflict is not None), key=lambda c: (c.key, int(c.layer)))

    def merged_view(layer: Layer) -> Mapping[str, Any]:
        over = {o.key: o.value for o in outcomes[layer] if o.conflict is None}
        return _Overlay(base.layer(layer), over) if over else base.layer(layer)

    variables = _Resolved([base.layer(Layer.SYSTEM), *(merged_view(layer) for layer in MERGED_LAYERS)])
    reasons: dict[str, str | None] = {}
    for b in order:
        branch_config = config.branch(b)
        if branch_config is not None and branch_config.reason_key:
            reason = branches[b].get(branch_config.reason_key)
            reasons[b] = None if reason is None else str(reason)
    # what the model is shown beside the keys the policy's rules name: the facts the
    # process fixed (PROCESS), as the seed's conflict prompt shows the amount
    facts = {k: v for k, v in merged_view(Layer.PROCESS).items() if not k.startswith("_")} if arbiter else None
    outcome = resolve_conflicts(
        conflicts, config=config, variables=variables, gateway_id=gateway_id, arbiter=arbiter, answers=answers,
        human_available=human_available, reasons=reasons, related=facts, arrival_order=list(arrival_order or order),
        asked=asked, decided=decided)
    resolutions = {(int(c.layer), c.key): r for c, r in outcome.resolved}

    changes: dict[Layer, list[tuple[str, Any]]] = {}
    for layer in MERGED_LAYERS:
        for o in outcomes[layer]:
            value = o.value
            if o.conflict is not None:
                resolution = resolutions.get((int(_as_written(o.conflict).layer), o.key))
                if resolution is None:
                    continue
                value = resolution.value
            if value is DELETED and o.base_value is DELETED:
                continue
            if value is not DELETED and o.base_value is not DELETED and same_value(value, o.base_value):
                continue
            changes.setdefault(layer, []).append((o.key, value))
    ephemeral = [(key, DELETED) for key in base.layer(Layer.EPHEMERAL)]
    if ephemeral:
        changes[Layer.EPHEMERAL] = ephemeral

    pending = list({r.id: r for r in outcome.pending}.values())
    # the clock is read at every join (an engine's clock may count its reads), the time written only
    # when there are conflicts to stamp with it
    now = clock()
    stamp = _stamp(now) if conflicts else ""
    entries = [{"gatewayId": gateway_id, "layer": str(c.layer), "key": c.key, "baseValue": base_json(c.base_value),
                **({"baseAbsent": True} if c.base_value is DELETED else {}),
                # the seed's shape: the distinct values, in branch order; ``values`` says whose
                "conflictingValues": _distinct(jsonable(v) for v in c.conflicting_values.values()),
                "values": {b: jsonable(v) for b, v in c.conflicting_values.items()},
                "sourceBranches": list(c.source_branches),
                "resolution": None if (r := resolutions.get((int(c.layer), c.key))) is None else r.to_dict(),
                "time": stamp} for c in conflicts]
    if conflicts and not pending:
        # The log is appended where it lives now (as a write to WORKING is auto-promoted),
        # so a read of the key sees every join's entries.
        target = next((layer for layer in (Layer.HISTORY, Layer.WORKING) if MERGED_CONFLICTS_KEY in merged_view(layer)),
                      Layer.WORKING)
        before = merged_view(target).get(MERGED_CONFLICTS_KEY)
        log = [*(thaw(before) if isinstance(before, list) else []), *entries]
        kept = [(k, v) for k, v in changes.get(target, []) if k != MERGED_CONFLICTS_KEY]
        changes[target] = [*kept, (MERGED_CONFLICTS_KEY, log)]
    preserved = tuple(sorted({k for b in order for k in branches[b].preserved} - base.preserved))
    folded = tuple(o.key for o in outcomes[Layer.HISTORY] if o.conflict is None and o.value is DELETED
                   and o.key in base_h and o.changed_by
                   and all(_compressed(branches[b], (o.key,)) for b in o.changed_by))
    if not pending and Layer.HISTORY in changes:
        changes[Layer.HISTORY] = _counters_told(base_h, changes[Layer.HISTORY], set(folded).__contains__)
    taken = {o.key for layer in MERGED_LAYERS for o in outcomes[layer] if o.conflict is not None or o.value is not DELETED}
    folded_values: dict[str, Any] = {}
    # a branch that decided a value names it before one that only compressed the key (whose fold
    # the join may even have undone: ``_fold_choice``), whatever their order
    decisions = {b: _fold_decisions(branches[b]) for b in order}
    for b, key, value in sorted(((b, key, value) for b in order for key, value in decisions[b].items()),
                                key=lambda item: item[2] is None):
        if (key in folded or (key not in taken and key not in base_h)) \
                and not is_record_key(key) and key not in BRANCH_MARKERS and key not in folded_values:
            if value is None and key in base_h:
                value = base_h[key]
            if value is not None and value is not DELETED and not (
                    key in (injected or {}).get(b, {}) and same_value(value, (injected or {})[b][key])):
                folded_values[key] = jsonable(value)
    return JoinResult(folded=folded, folded_values=folded_values, gateway_id=gateway_id, snapshot_id=base.id, branches=tuple(order), changes=changes,
                      conflicts=[ResolvedConflict(c, resolutions.get((int(c.layer), c.key))) for c in conflicts],
                      pending=pending, steps=outcome.steps, merged_conflicts=entries, preserved=preserved,
                      dropped_compactions=tuple({"branch": f.branch, "key": f.key,
                                                 "restored": [k for k in f.undo or {} if k not in base_h]}
                                                for f in dropped))


def apply_join(ctx: LayeredContext, result: JoinResult, *, actor: str = "engine",
               branches: Mapping[str, LayeredContext] | None = None) -> Event | None:
    """Record the join's conflicts and resolution steps on ``ctx`` (the parent) and, if
    nothing is pending, apply its changes as one ``join`` event (returned), noting on
    each of ``branches`` that it was joined. With pending confirmations nothing
    changes: answer them and join again."""
    snapshot = ctx.get_snapshot(result.snapshot_id)
    moved = [e.seq for e in ctx.tape.since(snapshot.seq + 1)
             if e.changes or e.kind in (EventKind.RESTORE, EventKind.ABORT)]
    if moved:
        raise LayerflowError(f"join {result.gateway_id!r}: context {ctx.name!r} changed after the split's snapshot "
                             f"{result.snapshot_id!r} (events {moved}); the parent must stay untouched while its "
                             "branches run, so join into the context the split was taken from")
    # a join that waited for a person runs again once answered: its conflicts are on the tape already
    noted = {canonical_key(_without_note(e.data)) for e in ctx.tape.since(snapshot.seq + 1)
             if e.kind == EventKind.NOTE and e.data.get("note") == "conflict"
             and e.data.get("gateway_id") == result.gateway_id}
    for conflict, _ in result.conflicts:
        old_form = {"gateway_id": result.gateway_id, **conflict.to_dict()}
        # a key absent at the split is noted as `run --json` and `_mergedConflicts` show it: a null base with
        # `base_absent`, not `{"$deleted": true}` (a branch's deletion); tapes noted before keep their form
        data = ({**old_form, "base_value": None, "base_absent": True} if conflict.base_value is DELETED
                else old_form)
        if canonical_key(data) not in noted and canonical_key(old_form) not in noted:
            ctx.record("conflict", actor=actor, data=data)
    for step in result.steps:
        ctx.record("resolution", actor=actor, data={"gateway_id": result.gateway_id, **step.to_dict()})
    if result.pending:
        ctx.record("confirmation_pending", actor=actor,
                   data={"gateway_id": result.gateway_id, "confirmations": [r.to_dict() for r in result.pending]})
        return None
    event = ctx.apply_changes(result.all_changes(), kind="join", actor=actor, data={
        "gateway_id": result.gateway_id, "snapshot_id": result.snapshot_id, "branches": list(result.branches),
        "conflicts": len(result.conflicts), **({"preserve": list(result.preserved)} if result.preserved else {}),
        **({"dropped_compactions": [dict(d) for d in result.dropped_compactions]} if result.dropped_compactions else {}),
        **({"folded": list(result.folded)} if result.folded else {}),
        **({"folded_values": dict(result.folded_values)} if result.folded_values else {})})
    for branch in (branches or {}).values():
        branch.record("joined", actor=actor, data={"gateway_id": result.gateway_id, "parent": ctx.name,
                                                   "parent_seq": event.seq})
    return event


def _distinct(values: Iterable[Any]) -> list[Any]:
    first: dict[str, Any] = {}
    for value in values:
        first.setdefault(canonical_key(value), value)
    return list(first.values())


def _without_note(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k != "note"}
