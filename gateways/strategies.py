"""Merge strategies of a join: per-key reducers and the whole-join strategies.

**Reducers** (``reducers: {key: name}`` in the join's config) settle a key *before*
conflict detection, so a reducer key never conflicts. Each combines the results of
the branches that changed the key (see ``conflicts``) with the base value at the
split; a branch that left the key alone contributes nothing (for ``max``/``min``: the
base value). A key nobody changed keeps its base value.

* ``sum``: ``base + sum(branch - base for each changing branch)``. Numbers only
  (int or float, never bool); an absent base counts as ``0``. Integers stay integers.
* ``append``: ``base + each changing branch's appended items``, in branch order. A
  branch's list must start with the base list (compared by canonical JSON); a branch
  that removed or reordered base items raises. An absent base counts as ``[]``.
* ``union``: the base items, then each branch's items not yet present, in branch
  order, duplicates (by canonical JSON) dropped. A union never removes: an item a
  branch dropped from the base stays. An absent base counts as ``[]``.
* ``max`` / ``min``: of every branch's final value (a branch that did not change the
  key holds the base value). Numbers, or strings, not mixed.
* ``merge``: objects, entry by entry: the base object with every entry a branch added,
  changed or removed against it (the same three-way rule as the join's, one level down,
  and further down where the entries are objects too). Branches that each set their own
  entry of one object (``approvals: {finance: ..., risk: ...}``) merge without a
  conflict. Two branches that change one entry differently cannot be merged: the key
  stays a conflict (``apply_reducer``) and is resolved as any conflict is, with the
  branches' whole objects as its values (``BRANCH_PRIORITY`` and ``LAST_WRITER_WINS``
  then decide the colliding entries only, by their order, and keep the merged rest);
  ``reduce_values`` raises ``ReducerError`` naming the entry. An absent base counts as ``{}``.

Deletions: when every changing branch deleted the key, it is deleted (they agree).
A deletion next to a value cannot be combined and raises ``ReducerError`` naming the
key and the branches, as does a value of the wrong type (naming the branch and type).

**Strategies** (``mergeStrategy``) for the conflicts that remain:
``LAST_WRITER_WINS`` takes the result of the conflicting branch that reached the join
last (``arrival_order``); ``BRANCH_PRIORITY`` the result of the first branch in
``branchPriority`` among those that changed the key (a deletion is that branch's
result); ``FAIL_ON_CONFLICT`` raises ``MergeConflictError`` naming every conflict.
``MERGE_WITH_CONFLICT_DETECT`` goes to the resolution chain (``policy``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from context_layers.config import ActivityExtensionConfig, as_config
from context_layers.errors import MergeConflictError

from .conflicts import DELETED, KeyOutcome, MergedConflict, Resolution, conflict_error, value_key

__all__ = ["REDUCERS", "ReducerError", "apply_reducer", "reduce_values", "resolve_by_strategy"]


class ReducerError(MergeConflictError):
    """A reducer could not combine the branches' values of a key."""


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def json_type(v: Any) -> str:
    """The JSON name of a value's type (a message names what the user wrote, not our frozen classes)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if _is_number(v):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, Mapping):
        return "object"
    if isinstance(v, (list, tuple)):
        return "array"
    return type(v).__name__


def _need_numbers(name: str, key: str, values: Mapping[str, Any]) -> None:
    for who, v in values.items():
        if not _is_number(v):
            raise ReducerError(f"reducer {name!r} for key {key!r}: {who} holds {v!r} ({json_type(v)}), "
                               "not a number; write numbers to this key or change its reducer")


def _need_lists(name: str, key: str, values: Mapping[str, Any]) -> None:
    for who, v in values.items():
        if not isinstance(v, list):
            raise ReducerError(f"reducer {name!r} for key {key!r}: {who} holds {v!r} ({json_type(v)}), "
                               "not a list; write lists to this key or change its reducer")


def _sum(key: str, base: Any, changed: Mapping[str, Any], unchanged: int) -> Any:
    start = 0 if base is DELETED else base
    _need_numbers("sum", key, {"the base": start, **{f"branch {b!r}": v for b, v in changed.items()}})
    total = start
    for v in changed.values():
        total += v - start
    return total


def _append(key: str, base: Any, changed: Mapping[str, Any], unchanged: int) -> Any:
    start = [] if base is DELETED else base
    _need_lists("append", key, {"the base": start, **{f"branch {b!r}": v for b, v in changed.items()}})
    prefix = [value_key(x) for x in start]
    out = list(start)
    for b, v in changed.items():
        if len(v) < len(start) or [value_key(x) for x in v[: len(start)]] != prefix:
            raise ReducerError(f"reducer 'append' for key {key!r}: branch {b!r} removed or reordered items of the "
                               f"base list {start!r} (it holds {v!r}); an append key may only grow at its end")
        out.extend(v[len(start):])
    return out


def _union(key: str, base: Any, changed: Mapping[str, Any], unchanged: int) -> Any:
    start = [] if base is DELETED else base
    _need_lists("union", key, {"the base": start, **{f"branch {b!r}": v for b, v in changed.items()}})
    out = list(start)
    seen = {value_key(x) for x in start}
    for v in changed.values():
        for x in v:
            k = value_key(x)
            if k not in seen:
                seen.add(k)
                out.append(x)
    return out


def _extreme(name: str, pick: Any) -> Any:
    def reduce(key: str, base: Any, changed: Mapping[str, Any], unchanged: int) -> Any:
        values = {f"branch {b!r}": v for b, v in changed.items()}
        if unchanged and base is not DELETED:
            values["the base"] = base
        if not all(isinstance(v, str) for v in values.values()):
            _need_numbers(name, key, values)
        return pick(values.values())
    return reduce


class _EntryCollision(ReducerError):
    """``merge``: two branches changed one entry of an object differently."""


def _need_objects(key: str, values: Mapping[str, Any]) -> None:
    for who, v in values.items():
        if not isinstance(v, Mapping):
            raise ReducerError(f"reducer 'merge' for key {key!r}: {who} holds {v!r} ({json_type(v)}), not an "
                               "object; write objects to this key or change its reducer")


def _merge_objects(path: str, base: Mapping[str, Any], changed: Mapping[str, Mapping[str, Any]],
                   prefer: Sequence[str] = (), taken: list[str] | None = None) -> dict[str, Any]:
    """``prefer``: branches, first first, whose entry a collision takes (a strategy's order), each
    entry so decided named in ``taken``; without it a collision raises ``_EntryCollision``."""
    out = dict(base)
    entries = list(dict.fromkeys([*base, *(e for v in changed.values() for e in v)]))
    for entry in entries:
        old = base.get(entry, DELETED)
        news = {b: v.get(entry, DELETED) for b, v in changed.items()}
        moved = {b: n for b, n in news.items() if value_key(n) != value_key(old)}
        if not moved:
            continue
        if len({value_key(n) for n in moved.values()}) == 1:
            new = next(iter(moved.values()))
        elif all(isinstance(n, Mapping) for n in moved.values()) and (old is DELETED or isinstance(old, Mapping)):
            new = _merge_objects(f"{path}.{entry}", old if isinstance(old, Mapping) else {}, moved, prefer, taken)
        elif (winner := next((b for b in prefer if b in moved), None)) is not None:
            new = moved[winner]
            if taken is not None:
                taken.append(f"{path.partition('.')[2] + '.' if '.' in path else ''}{entry}")
        else:
            shown = ", ".join(f"{b!r}: {'(deleted)' if n is DELETED else repr(n)}" for b, n in moved.items())
            raise _EntryCollision(f"reducer 'merge' for key {path.split('.', 1)[0]!r}: branches changed the entry "
                                  f"{path.partition('.')[2] + '.' if '.' in path else ''}{entry} differently "
                                  f"({shown}); give each branch its own entry, or resolve the key as a conflict")
        if new is DELETED:
            out.pop(entry, None)
        else:
            out[entry] = new
    return out


def _merge(key: str, base: Any, changed: Mapping[str, Any], unchanged: int) -> Any:
    start = {} if base is DELETED else base
    _need_objects(key, {"the base": start, **{f"branch {b!r}": v for b, v in changed.items()}})
    return _merge_objects(key, start, changed)


_REDUCERS = {"sum": _sum, "append": _append, "union": _union, "max": _extreme("max", max), "min": _extreme("min", min),
             "merge": _merge}
REDUCERS = tuple(_REDUCERS)


def reduce_values(name: str, key: str, base: Any, changed: Mapping[str, Any], *, unchanged: int = 0) -> Any:
    """Combine the ``changed`` results (branch -> value | DELETED, branch order) of
    ``key`` with its ``base`` value (``DELETED`` when absent); ``unchanged`` is how many
    branches left the key alone. Returns the value, or ``DELETED``."""
    try:
        reducer = _REDUCERS[name]
    except KeyError:
        raise ReducerError(f"unknown reducer {name!r} for key {key!r}; use one of {', '.join(REDUCERS)}") from None
    if not changed:
        return base
    deleted = [b for b, v in changed.items() if v is DELETED]
    if len(deleted) == len(changed):
        return DELETED
    if deleted:
        raise ReducerError(f"reducer {name!r} for key {key!r}: branch(es) {deleted} deleted the key while "
                           f"{[b for b in changed if b not in deleted]} wrote values; a reducer cannot combine "
                           "a deletion with values, so do not delete this key in a parallel branch")
    return reducer(key, base, changed, unchanged)


def apply_reducer(name: str, outcome: KeyOutcome, *, branch_count: int) -> KeyOutcome:
    """The outcome of a reducer key: its reduced value, and no conflict, but for ``merge``
    meeting two branches that changed one entry differently: then the key's conflict stays,
    for the strategy or the resolution chain."""
    if not outcome.changed_by:
        return outcome
    try:
        value = reduce_values(name, outcome.key, outcome.base_value, outcome.results,
                              unchanged=branch_count - len(outcome.changed_by))
    except _EntryCollision:
        return outcome
    return replace(outcome, value=value, conflict=None)


def resolve_by_strategy(
    conflicts: Sequence[MergedConflict],
    config: ActivityExtensionConfig | Mapping[str, Any],
    *,
    arrival_order: Sequence[str] = (),
    gateway_id: str | None = None,
) -> list[tuple[MergedConflict, Resolution]]:
    """Settle ``conflicts`` with ``LAST_WRITER_WINS``, ``BRANCH_PRIORITY`` or
    ``FAIL_ON_CONFLICT`` (raises). ``MERGE_WITH_CONFLICT_DETECT`` is not a strategy
    of this kind: use ``policy.resolve_conflicts``. ``config`` may be its JSON; without an
    ``arrival_order``, the branches' order stands for it (the last branch arrived last)."""
    config = as_config(config, source="resolve_by_strategy")
    branches = list(arrival_order)  # every branch that reached the join, when the caller says
    if not arrival_order:
        arrival_order = list(dict.fromkeys(b for c in conflicts for b in c.source_branches))
    strategy = config.merge_strategy
    if not conflicts:
        return []
    if strategy == "FAIL_ON_CONFLICT":
        raise conflict_error(conflicts, gateway_id=gateway_id, why="and mergeStrategy is FAIL_ON_CONFLICT",
                             todo="Make the branches write different keys, declare a reducer, or choose another mergeStrategy.")
    out = []

    def settled(c: MergedConflict, first: str, order: Sequence[str]) -> tuple[Any, str]:
        # a ``merge`` key: the strategy decides the entries that collide, the rest stays merged
        values = c.conflicting_values
        if config.reducers.get(c.key) != "merge" or not all(isinstance(v, Mapping) for v in values.values()) or not (
                c.base_value is DELETED or isinstance(c.base_value, Mapping)):
            return values[first], ""
        taken: list[str] = []
        base = c.base_value if isinstance(c.base_value, Mapping) else {}
        merged = _merge_objects(c.key, base, values, order, taken)
        return merged, (f"; reducer 'merge' kept every branch's other entries, the strategy decided "
                        f"{', '.join(taken)}")

    if strategy == "LAST_WRITER_WINS":
        rank = {b: i for i, b in enumerate(arrival_order)}
        for c in conflicts:
            unknown = [b for b in c.source_branches if b not in rank]
            if unknown:
                raise ValueError(f"LAST_WRITER_WINS for key {c.key!r}: branches {unknown} are missing from "
                                 f"arrival_order {list(arrival_order)}")
            last = max(c.source_branches, key=rank.__getitem__)
            value, why = settled(c, last, sorted(c.source_branches, key=rank.__getitem__, reverse=True))
            out.append((c, Resolution(value, "strategy", f"LAST_WRITER_WINS: branch {last!r} reached the join last{why}")))
        return out
    if strategy == "BRANCH_PRIORITY":
        unresolved = []
        for c in conflicts:
            first = next((b for b in config.branch_priority if b in c.source_branches), None)
            if first is None:
                unresolved.append(c)
                continue
            ranking = list(config.branch_priority)
            # a branch ranked above it that did not change the key (or never ran) must not be hidden
            where = "" if first == ranking[0] else (
                " of the branches that changed the key ("
                + ", ".join(b for b in ranking if b in c.source_branches) + ")")
            value, why = settled(c, first, [b for b in ranking if b in c.source_branches])
            out.append((c, Resolution(value, "strategy",
                                      f"BRANCH_PRIORITY: branch {first!r} ranks first{where} in {ranking}{why}")))
        if unresolved:
            missing = list(dict.fromkeys(b for c in unresolved for b in c.source_branches))
            todo = (f"List every branch of the gateway in branchPriority: add {', '.join(map(repr, missing))} "
                    "to branchPriority (a branch is named by its first element).")
            strangers = [b for b in config.branch_priority if branches and b not in branches]
            if strangers:
                todo += (f" {', '.join(map(repr, strangers))} {'is' if len(strangers) == 1 else 'are'} no branch that "
                         f"reached this join (the ones that did: {', '.join(map(repr, branches))}).")
            raise conflict_error(unresolved, gateway_id=gateway_id,
                                 why=f"changed by no branch listed in branchPriority {list(config.branch_priority)}",
                                 todo=todo)
        return out
    raise ValueError(f"mergeStrategy {strategy!r} is resolved by the conflict-resolution chain, not by a strategy")
