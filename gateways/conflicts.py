"""Three-way merge of one context layer and the conflicts it finds.

``base`` is a layer as it was at the split (the parent's snapshot); each branch is
that layer in the branch when it reached the join. Per key:

* a key of ``base`` missing from a branch means the branch **deleted** it (shown as
  the exported ``DELETED`` marker, never as ``None``: a branch may write ``None``);
* a key absent from ``base`` and from a branch is unchanged by that branch;
* a branch **changed** a key when its result differs from the base: a different
  value, a deletion, or an addition;
* changed by no branch: keep the base; by one branch, or identically by several:
  take that result; by two or more branches to **different** results: a conflict,
  a deletion counting as a result of its own.

Equality is ``canonical_key`` equality (``context_layers.canonical``), decided on
purpose, not inherited from Python:

* numbers compare by value across int and float: ``1 == 1.0`` (JSON has one number
  type, and parsers disagree on whether ``1.0`` comes back as ``1``);
* booleans are not numbers: ``True != 1`` and ``False != 0`` (different JSON types,
  although Python says otherwise);
* objects compare regardless of key order, lists in order, all the way down, so a
  nested object differing in one leaf is a change of the whole key;
* ``None`` is a value (JSON ``null``) and differs from ``DELETED``.

A branch that writes the value the key already had has not changed it. Values that
are the same object as the base value (persistent maps share them) are unchanged
without being serialized, which keeps a join cheap.

Output order is deterministic: conflicts sorted by key, each conflict's values in
branch order. ``three_way_merge`` returns the merged layer with the insertion order
DESIGN.md gives: the base's keys first, in base order, then each branch's new keys in
branch order.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from context_layers.canonical import canonical_key, freeze, thaw
from context_layers.errors import ContextValueError, MergeConflictError
from context_layers.markers import DELETED

__all__ = [
    "DELETED",
    "BranchIds",
    "BranchValues",
    "BRIEF_CHARS",
    "ConflictDetector",
    "conflict_error",
    "KeyOutcome",
    "MergeOutcome",
    "MergedConflict",
    "brief_json",
    "Resolution",
    "jsonable",
    "same_value",
    "three_way_merge",
    "value_key",
]

# canonical_key of DELETED: no JSON text starts with a NUL, so it equals no value.
_DELETED_KEY = "\0DELETED"


def value_key(value: Any) -> str:
    """The equality key of a value or of ``DELETED`` (see the module doc)."""
    return _DELETED_KEY if value is DELETED else canonical_key(value)


def same_value(a: Any, b: Any) -> bool:
    return a is b or value_key(a) == value_key(b)


def jsonable(value: Any) -> Any:
    """``DELETED`` as its JSON form ``{"$deleted": true}``; other values unchanged."""
    return DELETED.to_json() if value is DELETED else value


class BranchValues(dict[str, Any]):
    """Branch id -> its result, in branch order, that also reads as the seed's
    ``conflictingValues``: it equals the list of the distinct results (``== ["approved",
    "rejected"]``), and ``in`` finds a result as well as a branch id. Iterating gives the
    branch ids, as any dict does."""

    def distinct(self) -> list[Any]:
        first: dict[str, Any] = {}
        for value in self.values():
            first.setdefault(value_key(value), value)
        return list(first.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (list, tuple)):
            mine = self.distinct()
            return len(mine) == len(other) and all(same_value(a, b) for a, b in zip(mine, other))
        return dict.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __contains__(self, item: object) -> bool:
        if isinstance(item, str) and dict.__contains__(self, item):
            return True
        try:
            wanted = value_key(item)
        except (TypeError, ValueError):
            return False
        return any(value_key(v) == wanted for v in self.values())

    __hash__ = None


class BranchIds(tuple[str, ...]):
    """Branch ids in branch order; equal to a list of the same ids too (the seed's
    ``sourceBranches`` is a list)."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, list):
            return tuple.__eq__(self, tuple(other))
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = tuple.__hash__


@dataclass(frozen=True)
class MergedConflict:
    """A key that two or more branches changed to different results.

    ``base_value`` is ``DELETED`` when the key was absent at the split;
    ``conflicting_values`` maps each branch that changed the key to its result
    (``DELETED`` for a deletion), in branch order, and equals the seed's list of the
    distinct results too (see ``BranchValues``); ``source_branches`` are its keys.
    The seed's constructor ``MergedConflict(key, base, [values], [branches])`` pairs the
    values with the branches. The seed's names (``baseValue``, ``conflictingValues``,
    ``sourceBranches``) give its JSON shape; ``resolution`` is ``None`` on a detected
    conflict (a join pairs each conflict with its ``Resolution``).
    """

    key: str
    base_value: Any
    conflicting_values: dict[str, Any]
    source_branches: tuple[str, ...] = ()  # left out: the branches ``conflicting_values`` names
    layer: Any = None
    resolution: "Resolution | None" = None

    def __post_init__(self) -> None:
        values: Any = self.conflicting_values
        branches = BranchIds(self.source_branches if isinstance(self.source_branches, (list, tuple)) else ())
        if not isinstance(values, Mapping):
            listed = list(values)
            names = list(branches) if len(branches) == len(listed) else [f"branch_{i}" for i in range(len(listed))]
            values = dict(zip(names, listed))
        if not branches:
            branches = BranchIds(values)
        object.__setattr__(self, "conflicting_values", BranchValues(values))
        object.__setattr__(self, "source_branches", branches)

    def __hash__(self) -> int:
        return hash((self.key, value_key(self.base_value), tuple(self.source_branches),
                     tuple(value_key(v) for v in self.conflicting_values.values()), self.layer))

    @property
    def values(self) -> dict[str, Any]:
        """Branch id -> its result (a plain dict)."""
        return dict(self.conflicting_values)

    @property
    def baseValue(self) -> Any:  # noqa: N802 - the seed's name
        return jsonable(self.base_value)

    @property
    def conflictingValues(self) -> list[Any]:  # noqa: N802 - the seed's name
        """The distinct results, in branch order, as JSON (a deletion as ``{"$deleted": true}``)."""
        values = self.conflicting_values
        return [jsonable(v) for v in (values.distinct() if isinstance(values, BranchValues) else values.values())]

    @property
    def sourceBranches(self) -> list[str]:  # noqa: N802 - the seed's name
        return list(self.source_branches)

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "layer": None if self.layer is None else str(self.layer),
            "base_value": jsonable(self.base_value),
            "conflicting_values": {b: jsonable(v) for b, v in self.conflicting_values.items()},
            "source_branches": list(self.source_branches),
            **({"resolution": self.resolution.to_dict()} if self.resolution is not None else {}),
        }

    def describe(self) -> str:
        where = f" in {self.layer}" if self.layer is not None else ""
        # values as JSON, as `--set KEY=VALUE` and the answers take them (Python's True would be read as text)
        values = ", ".join(f"{b}={_as_json(v)}" for b, v in self.conflicting_values.items())
        # DELETED as a base means the key was not there: saying "deleted" would send the reader looking for a delete
        base = "not set before the split" if self.base_value is DELETED else f"base {_as_json(self.base_value)}"
        return f"{self.key!r}{where} ({base}): {values}"


def _as_json(value: Any) -> str:
    return brief_json(value)


# A value quoted in a message (a person's question, an error naming every branch's value) is cut
# here: fifty branches of a long text made a question of a megabyte. Records keep values whole.
BRIEF_CHARS = 200


def brief_json(value: Any, width: int = BRIEF_CHARS) -> str:
    """``value`` as JSON (keys sorted), cut after ``width`` characters with how long it is in all."""
    if value is DELETED:
        return "(deleted)"
    text = json.dumps(thaw(value), ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= width else f"{text[:width]}… ({len(text)} characters in all)"


def conflict_error(conflicts: Sequence[MergedConflict], *, gateway_id: str | None, why: str,
                   todo: str = "") -> MergeConflictError:
    """One error naming every conflicting key, its branches and their values."""
    where = f"join {gateway_id!r}" if gateway_id else "join"
    lines = "\n  ".join(c.describe() for c in conflicts)
    message = f"{where}: {len(conflicts)} conflict(s) {why}:\n  {lines}"
    if todo:
        message += f"\n{todo}"
    return MergeConflictError(message, conflicts=[c.to_dict() for c in conflicts], gateway_id=gateway_id)


@dataclass(frozen=True)
class Resolution:
    """How a conflict was settled: the value, who decided and why.

    ``needs_human`` marks a suggestion that a person must still confirm (a policy rule
    with ``confirm: true``, or a model answer that escalates).
    """

    value: Any
    resolver: str  # "policy" | "model" | "human" | "strategy"
    reason: str
    needs_human: bool = False
    by: str | None = None  # who answered, when a person did and said who (a REST user, the CLI's user)

    def to_dict(self) -> dict[str, Any]:
        return {"value": jsonable(self.value), "resolver": self.resolver, "reason": self.reason,
                **({"by": self.by} if self.by else {})}


@dataclass(frozen=True)
class KeyOutcome:
    """The merge of one key: ``value`` is the merged result (``DELETED`` = absent)."""

    key: str
    base_value: Any  # DELETED when absent at the split
    value: Any
    changed_by: tuple[str, ...]  # branches whose result differs from the base, branch order
    conflict: MergedConflict | None = None
    results: Mapping[str, Any] = field(default_factory=dict)  # changed branch -> its result


@dataclass(frozen=True)
class MergeOutcome:
    """``merged``: the layer after the merge, conflicting keys still holding their base
    value; ``changes``: ``(key, value | DELETED)`` relative to the base, in merged
    order, conflicting keys excluded (their resolution adds them); ``conflicts``
    sorted by key."""

    merged: dict[str, Any]
    changes: list[tuple[str, Any]]
    conflicts: list[MergedConflict]
    new_keys: tuple[str, ...] = field(default=())


def merge_keys(
    base: Mapping[str, Any],
    branches: Mapping[str, Mapping[str, Any]],
    keys: Iterable[str],
    *,
    layer: Any = None,
) -> list[KeyOutcome]:
    """The outcome of each of ``keys`` (in the order given); the building block of the
    detector and of the join, which passes only the keys a branch touched."""
    outcomes = []
    for key in keys:
        base_value = base[key] if key in base else DELETED
        base_k: str | None = None
        results: dict[str, Any] = {}
        result_keys: dict[str, str] = {}
        for bid, layer_map in branches.items():
            if key in layer_map:
                value = layer_map[key]
                if value is base_value:
                    continue
            elif base_value is DELETED:
                continue
            else:
                value = DELETED
            if (value is DELETED) != (base_value is DELETED):
                # a key added or deleted differs from the base, whatever the value (no JSON text
                # equals _DELETED_KEY): its text is needed only if another branch changed the key too
                results[bid] = value
                continue
            if base_k is None:
                base_k = value_key(base_value)
            vk = value_key(value)
            if vk != base_k:
                results[bid] = value
                result_keys[bid] = vk
        changed_by = tuple(results)
        if len(results) >= 2:
            for bid, value in results.items():
                if bid not in result_keys:
                    result_keys[bid] = value_key(value)
        if len(set(result_keys.values())) >= 2:
            conflict = MergedConflict(key=key, base_value=base_value, conflicting_values=results,
                                      source_branches=changed_by, layer=layer)
            outcomes.append(KeyOutcome(key, base_value, base_value, changed_by, conflict, results))
        elif results:
            outcomes.append(KeyOutcome(key, base_value, results[changed_by[0]], changed_by, None, results))
        else:
            outcomes.append(KeyOutcome(key, base_value, base_value, ()))
    return outcomes


def _all_keys(base: Mapping[str, Any], branches: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Base keys in base order, then each branch's new keys in branch order."""
    seen: dict[str, None] = dict.fromkeys(base)
    for layer_map in branches.values():
        for key in layer_map:
            if key not in seen:
                seen[key] = None
    return list(seen)


def _named(branches: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]]) -> Mapping[str, Mapping[str, Any]]:
    """Branches by id; a list of branch maps is named ``branch_0``, ``branch_1``, ... as
    the seed's detector names them."""
    if isinstance(branches, Mapping):
        return branches
    if isinstance(branches, (str, bytes)) or not isinstance(branches, Sequence):
        raise TypeError(f"branches must map branch ids to their layer maps (or be a list of layer maps), "
                        f"got {type(branches).__name__}")
    for i, b in enumerate(branches):
        if not isinstance(b, Mapping):
            raise TypeError(f"branch {i} must be a mapping of keys to values, got {type(b).__name__}")
    return {f"branch_{i}": b for i, b in enumerate(branches)}


def _check_json(layer_map: Mapping[str, Any], where: str) -> None:
    """Refuse, naming ``where`` and the key, a layer map that no context could hold: the
    comparison of its values would fail with the JSON encoder's bare message, or, for a
    key only one branch changed, pass a set or NaN on as the merged value."""
    if not isinstance(layer_map, Mapping):
        raise TypeError(f"the layer map {where} must map keys to values, got {type(layer_map).__name__}")
    for key, value in layer_map.items():
        if not isinstance(key, str) or not key:
            raise ContextValueError(str(key), f"keys must be non-empty strings, got {type(key).__name__} {key!r}",
                                    where=where)
        if value is not DELETED:
            try:
                freeze(value)
            except (TypeError, ValueError) as exc:
                raise ContextValueError(key, str(exc), where=where) from None


def _contexts_given(base: Any, branches: Any) -> bool:
    """Whether ``detect_conflicts`` was handed a split (contexts, snapshots) rather than layer maps."""
    from context_layers.context import LayeredContext, Snapshot

    from .splitter import BranchContext

    if isinstance(base, (LayeredContext, Snapshot, str)):
        return True
    values = branches.values() if isinstance(branches, Mapping) else branches if isinstance(branches, Sequence) else ()
    return any(isinstance(b, (LayeredContext, BranchContext)) for b in values)


class ConflictDetector:
    """``detect_conflicts(base, branches)``: every key two or more branches changed to
    different results, sorted by key (see the module doc for the rules). ``branches`` maps
    branch ids to their maps, or is a list of maps (``branch_0``, ``branch_1``, ...).

    Given a split instead (``base`` the split's snapshot, its id or the parent context;
    ``branches`` the branch contexts by id, or the list ``ContextSplitter.split`` returned),
    it finds what the join would, in every layer (each conflict names its ``layer``), and
    changes nothing: ``config`` is the join's (its ``reducers`` settle keys without a conflict)."""

    def detect_conflicts(
        self,
        base: Any,
        branches: Any,
        *,
        layer: Any = None,
        config: Any = None,
    ) -> list[MergedConflict]:
        if _contexts_given(base, branches):
            return self._split_conflicts(base, branches, layer=layer, config=config)
        if config is not None:
            raise TypeError("detect_conflicts: config= is the join's config, for a split's contexts; "
                            "layer maps are compared as they are")
        branches = _named(branches)
        _check_json(base, "in the base")
        for bid, layer_map in branches.items():
            _check_json(layer_map, f"in branch {bid!r}")
        outcomes = merge_keys(base, branches, _all_keys(base, branches), layer=layer)
        return sorted((o.conflict for o in outcomes if o.conflict is not None), key=lambda c: c.key)

    @staticmethod
    def _split_conflicts(base: Any, branches: Any, *, layer: Any, config: Any) -> list[MergedConflict]:
        from context_layers.layers import Layer

        from .join import _branch_contexts, _join_base, join_contexts  # join builds on this module

        named = _branch_contexts(branches)
        snapshot = _join_base(base, named)
        label = snapshot.label or ""
        gateway = label[len("split:"):] if label.startswith("split:") else "detect_conflicts"
        # a person "is available": nothing is decided or raised, every open conflict stays pending
        result = join_contexts(snapshot, named, config=config, gateway_id=gateway, human_available=True)
        found = [item.conflict for item in result.conflicts]
        if layer is not None:
            wanted = Layer.parse(layer)
            found = [c for c in found if c.layer == wanted]
        return found


def three_way_merge(
    base: Mapping[str, Any],
    branches: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    *,
    branch_order: Sequence[str] | None = None,
    layer: Any = None,
) -> MergeOutcome:
    """Merge every key of ``base`` and ``branches`` (as for ``ConflictDetector``);
    ``branch_order`` (default: the order of ``branches``) decides the order of new keys
    and of conflicting values."""
    branches = _named(branches)
    if branch_order is not None:
        missing = [b for b in branch_order if b not in branches]
        extra = [b for b in branches if b not in branch_order]
        if missing or extra:
            raise ValueError(f"branch_order {list(branch_order)} must name exactly the branches {list(branches)}")
        branches = {b: branches[b] for b in branch_order}
    outcomes = merge_keys(base, branches, _all_keys(base, branches), layer=layer)
    merged: dict[str, Any] = {}
    changes: list[tuple[str, Any]] = []
    new_keys: list[str] = []
    for o in outcomes:
        if o.value is not DELETED:
            merged[o.key] = o.value
            if o.base_value is DELETED:
                new_keys.append(o.key)
        if o.changed_by and o.conflict is None:
            changes.append((o.key, o.value))
    conflicts = sorted((o.conflict for o in outcomes if o.conflict is not None), key=lambda c: c.key)
    return MergeOutcome(merged=merged, changes=changes, conflicts=conflicts, new_keys=tuple(new_keys))
