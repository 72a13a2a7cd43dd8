"""LayeredContext: six governed layers, an append-only tape, O(1) snapshots.

State is held in persistent maps (``immutables.Map``, a HAMT): a snapshot is a
reference to the current state, a branch is a new context that starts from one, and
both cost O(1) whatever the size of the context. Every change goes through one
function (``_apply``) that both the live context and ``replay`` use, so replaying
the tape rebuilds exactly what produced it.

Write rule (DESIGN.md): find the layer that already holds the key (a lower number
than the target wins: auto-promotion), then check the permission on that effective
layer. A denied write raises ``ContextWriteDenied`` and is recorded on the tape.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, NamedTuple

import immutables

from .canonical import FrozenDict, FrozenList, canonical_json, freeze, key_problem, thaw
from .errors import ContextKeyError, ContextValueError, ContextWriteDenied, LayerflowError
from .layers import Layer
from .markers import DELETED
from .tape import TAPE_FORMAT, Change, Event, EventKind, Tape, new_event
from .tokens import DEFAULT_ENCODING, count_value

__all__ = ["BRANCH_MARKERS", "MERGED_CONFLICTS_KEY", "LayeredContext", "Snapshot", "Entry", "View", "RECORD_PREFIXES", "entry_kind",
           "is_record_key"]

LAYERS = tuple(Layer)
# What a split writes into each branch's WORKING besides its contextInject: the branch's own
# bookkeeping, never a value the process decided (a join keeps the parent's, see gateways.join).
BRANCH_MARKERS = ("_branch_id", "_snapshot_id")
# The log of a join's conflicts and their resolutions (gateways.join writes it; attention reads it).
MERGED_CONFLICTS_KEY = "_mergedConflicts"
# The engine's own bookkeeping in WORKING: it moves into HISTORY with an activity that did not write it.
_BOOKKEEPING = frozenset({*BRANCH_MARKERS, MERGED_CONFLICTS_KEY})
# HISTORY keys that only the engine and the compressor write (records, not data).
RECORD_PREFIXES = ("activity:", "summary:", "compaction:", "tool:", "event:")
# ... of those, the ones only they create: an activity may not write them even to WORKING (which moves
# into HISTORY), while its tool results (``tool:``) and summaries of its own arrive there as it wrote them
ENGINE_RECORD_PREFIXES = ("activity:", "event:", "compaction:")


def is_record_key(key: str) -> bool:
    return key.startswith(RECORD_PREFIXES)


TOOL_RESULT_KINDS = frozenset({"tool_call_result", "tool_result"})
_KEY_SEPARATORS = frozenset("_:.-#/@")


def key_begins(key: str, word: str) -> bool:
    """Whether ``key`` begins with ``word`` up to a separator (``tool_call_result_1`` and
    ``tool_call_result:search`` begin with ``tool_call_result``; ``tool_call_results`` does not)."""
    return len(key) > len(word) and key[len(word)] in _KEY_SEPARATORS and key.startswith(word)


def names_tool_result(key: str) -> bool:
    """Whether a key says its entry is a tool's result: a ``tool:`` record (DESIGN.md's HISTORY
    records), or a key that is, or begins up to a separator, ``tool_call_result``/``tool_result``
    (as a compress rule's plain-word pattern matches it: ``tool_call_result_1``)."""
    if not key.startswith("tool"):  # every name it may be (``tool:``, TOOL_RESULT_KINDS) begins so
        return False
    if key.startswith("tool:"):
        return True
    return any(key == name or key_begins(key, name) for name in TOOL_RESULT_KINDS)


def entry_kind(key: str, value: Any) -> str:
    """The kind of a HISTORY entry: a dict value's ``kind`` field, else ``"data"``."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if isinstance(kind, str):
            return kind
    return "data"


def _check_task_id(task_id: object, op: str) -> None:
    """An activity is named by its task's id: its record is ``activity:<task id>``, its events carry it
    (a caller's programming slip: a plain TypeError, as ``Engine.start`` raises for its data)."""
    if not isinstance(task_id, str) or not task_id.strip():
        raise TypeError(f"{op}: an activity needs its task id (a non-empty str, the BPMN id of the task), "
                        f"got {task_id!r}")


# A slot is (order, seq, value): insertion order within the layer, the tape seq of
# the last change, the frozen value.
Slot = tuple[int, int, Any]
_EMPTY: immutables.Map[str, Any] = immutables.Map()
_NO_DATA = FrozenDict()
# kinds tested on every event, as sets (a tuple of enum members is built anew at each test)
_TAKES_SNAPSHOT = frozenset((EventKind.SNAPSHOT, EventKind.BEGIN))
_ONE_KEY = frozenset((EventKind.WRITE, EventKind.DELETE))


class _State(NamedTuple):
    """One point of a context (immutable; ``_replace`` gives the next one, sharing the rest)."""

    layers: tuple[immutables.Map[str, Slot], ...]
    tokens: tuple[immutables.Map[str, int], ...]
    totals: tuple[int, ...]
    preserved: immutables.Map[str, bool] = _EMPTY
    counter: int = 0
    activity: str | None = None
    activity_keys: immutables.Map[str, int] = _EMPTY  # keys the open activity wrote -> write order
    begin_snapshot: str | None = None
    iterations: immutables.Map[str, int] = _EMPTY

    @staticmethod
    def empty() -> "_State":
        return _State(layers=(_EMPTY,) * 6, tokens=(_EMPTY,) * 6, totals=(0,) * 6)

    def get(self, key: str, default: Any = None) -> Any:
        """The value a read of ``key`` gives: the lowest layer holding it wins."""
        for layer in LAYERS:
            slot = self.layers[layer].get(key)
            if slot is not None:
                return slot[2]
        return default


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All six layers at one point of a context's tape (O(1): shares structure)."""

    id: str
    context: str
    seq: int
    state: _State = field(repr=False, compare=False)
    label: str | None = None

    def layer(self, layer: Layer | int | str) -> "LayerView":
        layer = Layer.parse(layer)
        return LayerView(self.state.layers[layer], layer)

    @property
    def snapshot_id(self) -> str:
        """``id``, by the seed's name (``snapshotId``)."""
        return self.id

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {str(layer): dict(self.layer(layer)) for layer in LAYERS}

    def get(self, key: str, default: Any = None) -> Any:
        """The value a read of ``key`` gave at this snapshot (as ``LayeredContext.get``)."""
        return self.state.get(key, default)

    @property
    def preserved(self) -> frozenset[str]:
        return frozenset(self.state.preserved.keys())

    def to_dict(self, *, copy: bool = True) -> dict[str, Any]:
        """JSON-able record of all six layers (with insertion order and seqs). ``copy=False``:
        the values as the snapshot holds them (immutable; the same JSON), for a caller that
        only encodes the record."""
        return _dump_snapshot(self, copy=copy)

    @classmethod
    def from_dict(cls, snapshot_id: str, data: Mapping[str, Any]) -> "Snapshot":
        return _load_snapshot(snapshot_id, data)

    def tokens(self, layer: Layer | int | str | None = None) -> int:
        if layer is None:
            return sum(self.state.totals)
        return self.state.totals[Layer.parse(layer)]

    def key_tokens(self, layer: Layer | int | str, key: str) -> int:
        return self.state.tokens[Layer.parse(layer)][key]


_SNAPSHOT_SLOTS = tuple(Snapshot.__dict__[f].__set__ for f in ("id", "context", "seq", "state", "label"))


def _new_snapshot(sid: str, context: str, seq: int, state: _State, label: str | None) -> Snapshot:
    """``Snapshot(...)`` built by setting its slots (see ``tape.new_event``): every activity takes one."""
    snap = object.__new__(Snapshot)
    s_id, s_context, s_seq, s_state, s_label = _SNAPSHOT_SLOTS
    s_id(snap, sid)
    s_context(snap, context)
    s_seq(snap, seq)
    s_state(snap, state)
    s_label(snap, label)
    return snap


class LayerView(Mapping[str, Any]):
    """A read-only, insertion-ordered view of one layer."""

    __slots__ = ("_map", "_layer", "_order")

    def __init__(self, m: immutables.Map[str, Slot], layer: Layer) -> None:
        self._map = m
        self._layer = layer
        self._order: list[str] | None = None

    def __getitem__(self, key: str) -> Any:
        return self._map[key][2]

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __len__(self) -> int:
        return len(self._map)

    def __iter__(self) -> Iterator[str]:
        if self._order is None:
            self._order = [k for k, _ in sorted(self._map.items(), key=lambda kv: kv[1][0])]
        return iter(self._order)

    def seq_of(self, key: str) -> int:
        """Tape seq of the last change of ``key``."""
        return self._map[key][1]

    def order_of(self, key: str) -> int:
        return self._map[key][0]

    def __repr__(self) -> str:
        return f"<{self._layer.name} {dict(self)!r}>"


@dataclass(frozen=True, slots=True)
class Entry:
    """One key of one layer, as a view and select hooks see it."""

    layer: Layer
    key: str
    value: Any
    order: int
    seq: int

    @property
    def kind(self) -> str:
        return entry_kind(self.key, self.value)


SelectHook = Callable[[list[Entry]], list[Entry]]


def run_hooks(entries: Iterable[Entry], hooks: Iterable[SelectHook]) -> list[Entry]:
    """Apply select hooks in order. A hook is user code: one that gives back anything but
    entries with JSON values is named, with what a hook must return, rather than failing
    later deep in rendering (``'dict' object has no attribute 'layer'``)."""
    out = list(entries)
    for hook in hooks:
        name = getattr(hook, "__name__", None) or repr(hook)
        what = ("a select hook takes the list of Entry it is shown and returns the entries to show "
                "(dataclasses.replace(entry, value=...) changes one)")
        given = {id(e) for e in out}
        got = hook(out)
        if got is None or isinstance(got, (str, bytes, Mapping)) or not isinstance(got, Iterable):
            raise TypeError(f"select hook {name!r} returned {type(got).__name__}; {what}")
        checked: list[Entry] = []
        for e in got:
            if not isinstance(e, Entry):
                raise TypeError(f"select hook {name!r} returned a {type(e).__name__} among its entries; {what}")
            if id(e) not in given:
                try:
                    e = replace(e, value=freeze(e.value))
                except (TypeError, ValueError) as err:
                    raise TypeError(f"select hook {name!r} gave key {e.key!r} ({e.layer}) a value that is not "
                                    f"JSON: {err}; {what}") from None
            checked.append(e)
        out = checked
    return out


class LayeredContext:
    """The governed context of one activity path (the main path or one branch)."""

    def __init__(self, system: Mapping[str, Any] | None = None, *, process: Mapping[str, Any] | None = None,
                 name: str = "main", branch_id: str | None = None, encoding: str = DEFAULT_ENCODING,
                 actor: str = "engine", clock: Callable[[], float] | None = None, _empty: bool = False) -> None:
        self.name = name
        self.branch_id = branch_id
        self.encoding = encoding
        # what stamps this context's tape events (seconds since the epoch): the engine gives every
        # context it starts or loads its own clock (``Engine(clock=...)``), a branch takes its parent's
        self.clock: Callable[[], float] = clock if clock is not None else time.time
        self._state = _State.empty()
        self._tape = Tape()
        self._snapshots: dict[str, Snapshot] = {}
        self._base: Snapshot | None = None
        if _empty:
            return
        changes: list[Change] = []
        for key, value in (system or {}).items():
            changes.append((Layer.SYSTEM, self._check_key(key, Layer.SYSTEM), self._freeze(key, value, Layer.SYSTEM)))
        self._emit(EventKind.INIT, actor, changes=changes, data={"name": name, "encoding": encoding})
        # the facts the process starts with (as the engine's start data): writes like any other,
        # each on the tape, refused where SYSTEM holds the key
        for key, value in (process or {}).items():
            self.write(Layer.PROCESS, key, value, actor=actor)

    # ----- reading -------------------------------------------------------------------

    def runs(self, task_id: str) -> int:
        """How many times activity ``task_id`` has completed in this context (its ``activity:`` records,
        ``#2``...; counted here, so compressions folding the records do not change it)."""
        return self._state.iterations.get(task_id, 0)

    def layer(self, layer: Layer | int | str) -> LayerView:
        layer = Layer.parse(layer)
        return LayerView(self._state.layers[layer], layer)

    def locate(self, key: str) -> Layer | None:
        """The layer a read of ``key`` resolves to (lowest number holding it)."""
        for layer in LAYERS:
            if key in self._state.layers[layer]:
                return layer
        return None

    def resolve(self, key: str) -> Any:
        for layer in LAYERS:
            slot = self._state.layers[layer].get(key)
            if slot is not None:
                return slot[2]
        err = ContextKeyError(f"key {key!r} is in no layer")
        err.key = key  # an activity that read it is told where to give it (engine.runtime._activity_error)
        raise err

    def get(self, key: str, default: Any = None) -> Any:
        return self._state.get(key, default)

    # the seed's names: resolveKey (null when absent), findExistingLayer
    def resolve_key(self, key: str) -> Any:
        """``get(key)``: the value a read gives, ``None`` when no layer holds the key."""
        return self.get(key)

    def find_existing_layer(self, key: str) -> Layer | None:
        return self.locate(key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.locate(key) is not None

    def __getitem__(self, key: str) -> Any:
        """``ctx[key]`` is ``resolve(key)``: beside ``key in ctx``, the read a Python user tries first."""
        return self.resolve(key)

    def __iter__(self) -> Iterator[str]:
        """The keys (``keys()``); without it, ``__getitem__`` would make Python iterate ``ctx[0]``, ``ctx[1]``."""
        return iter(self.keys())

    def keys(self) -> list[str]:
        """Every key, once, in resolution order (L0 first, insertion order within a layer)."""
        seen: dict[str, None] = {}
        for layer in LAYERS:
            for key in self.layer(layer):
                seen.setdefault(key, None)
        return list(seen)

    def resolved(self) -> dict[str, Any]:
        """Every key with the value a read would give."""
        return {key: self.resolve(key) for key in self.keys()}

    def as_dict(self) -> dict[str, dict[str, Any]]:
        """``{"L0": {...}, ..., "L5": {...}}`` with values as plain JSON (mutable copies)."""
        return {str(layer): {k: thaw(v) for k, v in self.layer(layer).items()} for layer in LAYERS}

    def entries(self) -> list[Entry]:
        out = []
        for layer in LAYERS:
            view = self._state.layers[layer]
            for key, (order, seq, value) in sorted(view.items(), key=lambda kv: kv[1][0]):
                out.append(Entry(layer, key, value, order, seq))
        return out

    @property
    def tape(self) -> Tape:
        return self._tape

    @property
    def preserved(self) -> frozenset[str]:
        return frozenset(self._state.preserved.keys())

    @property
    def fork_snapshot(self) -> Snapshot | None:
        """The parent's snapshot this branch was forked from (``None`` for a context that was not)."""
        return self._base

    @property
    def current_activity(self) -> str | None:
        return self._state.activity

    @property
    def activity_writes(self) -> tuple[str, ...]:
        """The keys the open activity wrote so far, in write order (empty when none is open)."""
        keys = self._state.activity_keys
        return tuple(sorted(keys, key=keys.__getitem__))

    @property
    def next_snapshot_id(self) -> str:
        """The id the next ``snapshot()`` will get (ids are deterministic: name and tape seq)."""
        return f"snap:{self.name}:{self._tape.next_seq}"

    @property
    def snapshots(self) -> Mapping[str, Snapshot]:
        return dict(self._snapshots)

    def tokens(self, layer: Layer | int | str | None = None) -> int:
        if layer is None:
            return sum(self._state.totals)
        return self._state.totals[Layer.parse(layer)]

    def key_tokens(self, layer: Layer | int | str, key: str) -> int:
        return self._state.tokens[Layer.parse(layer)][key]

    # the seed's names: context.getLayer(L3), getTokenCount(L3), getMessageCount(L3)
    def get_layer(self, layer: Layer | int | str) -> LayerView:
        return self.layer(layer)

    def get_token_count(self, layer: Layer | int | str | None = None) -> int:
        return self.tokens(layer)

    def get_message_count(self, layer: Layer | int | str = Layer.HISTORY) -> int:
        """Entries of ``layer`` (HISTORY: data keys and records alike)."""
        return len(self._state.layers[Layer.parse(layer)])

    def token_report(self) -> dict[str, int]:
        report = {str(layer): self._state.totals[layer] for layer in LAYERS}
        report["total"] = sum(self._state.totals)
        return report

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LayeredContext):
            return NotImplemented
        return self.state_json() == other.state_json()

    def state_json(self) -> str:
        """Canonical text of the layers (in order) and preserved keys: equal exactly when contexts are."""
        layers = [[[k, v] for k, v in self.layer(layer).items()] for layer in LAYERS]
        return canonical_json({"layers": layers, "preserved": sorted(self.preserved)})

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        sizes = ", ".join(f"{layer}={len(self._state.layers[layer])}" for layer in LAYERS)
        return f"<LayeredContext {self.name!r} {sizes} tape={len(self._tape)}>"

    # ----- writing -------------------------------------------------------------------

    def write(self, layer: Layer | int | str, key: str, value: Any, actor: str | None = None) -> Layer:
        """Write ``key`` (auto-promoted to the lowest layer holding it), or raise ``ContextWriteDenied``."""
        actor = self._actor_of(actor)
        requested = Layer.parse(layer)
        self._check_key(key, requested)
        frozen = self._freeze(key, value, requested)
        existing = self.locate(key)
        effective = requested if existing is None or existing > requested else existing
        reason = self._write_denial(requested, effective, key, exists=existing == effective)
        if reason is not None:
            self._deny("write", key, requested, effective, reason, actor)
        self._emit(EventKind.WRITE, actor, changes=[(effective, key, frozen)],
                   data={"requested": int(requested)} if requested != effective else {})
        return effective

    def check_write(self, layer: Layer | int | str, key: str) -> tuple[Layer, str | None]:
        """Where a write of ``key`` to ``layer`` would land, and why it would be denied (None: allowed)."""
        requested = Layer.parse(layer)
        existing = self.locate(key)
        effective = requested if existing is None or existing > requested else existing
        return effective, self._write_denial(requested, effective, key, exists=existing == effective)

    def write_many(self, layer: Layer | int | str, values: Mapping[str, Any], *, actor: str | None = None) -> dict[str, Layer]:
        """Write several keys all or nothing: every value and permission is checked before
        the first write, so a denied or invalid key leaves the context as it was."""
        actor = self._actor_of(actor)
        requested = Layer.parse(layer)
        frozen = {self._check_key(key, requested): self._freeze(key, value, requested) for key, value in values.items()}
        plan = {}
        for key in frozen:
            effective, reason = self.check_write(requested, key)
            if reason is not None:
                self._deny("write", key, requested, effective, reason, actor)
            plan[key] = effective
        for key, value in frozen.items():
            self._emit(EventKind.WRITE, actor, changes=[(plan[key], key, value)],
                       data={"requested": int(requested)} if requested != plan[key] else {})
        return plan

    def delete(self, layer: Layer | int | str, key: str, actor: str | None = None) -> Layer:
        actor = self._actor_of(actor)
        requested = Layer.parse(layer)
        effective = self.locate(key)
        if effective is None or effective > requested:
            raise ContextKeyError(f"cannot delete key {key!r}: it is not in {requested} {requested.name} or a lower layer")
        reason = self._delete_denial(effective, key)
        if reason is not None:
            self._deny("delete", key, requested, effective, reason, actor)
        self._emit(EventKind.DELETE, actor, changes=[(effective, key, DELETED)],
                   data={"requested": int(requested)} if requested != effective else {})
        return effective

    def _actor_of(self, actor: str | None) -> str:
        """Who the tape names for a change: ``actor``, else the open activity, else ``anonymous``."""
        return actor or self._state.activity or "anonymous"

    @staticmethod
    def _write_denial(requested: Layer, effective: Layer, key: str, *, exists: bool) -> str | None:
        if effective == Layer.SYSTEM:
            return "L0 SYSTEM is fixed by the engine at instance start; write a different key to WORKING"
        if effective == Layer.PROCESS and exists:
            return "L1 PROCESS is append-only and already holds this key; write a different key to WORKING"
        if effective == Layer.HISTORY:
            if is_record_key(key):
                return "HISTORY records are written by the engine and the compressor only"
            if not exists or requested == Layer.HISTORY:
                # a WORKING write of a key HISTORY holds is auto-promoted and updates it there
                return "keys arrive in L3 HISTORY from WORKING at activity end; write to WORKING"
        if effective == Layer.WORKING and key.startswith(ENGINE_RECORD_PREFIXES):
            # WORKING moves into HISTORY at activity end: such a key would arrive there as a record the
            # engine never wrote (and take the key of a later activity's own record)
            return (f"keys starting with {', '.join(ENGINE_RECORD_PREFIXES)} name the records the engine and the "
                    "compressor write into HISTORY; name the key differently")
        return None

    @staticmethod
    def _delete_denial(effective: Layer, key: str) -> str | None:
        if effective == Layer.SYSTEM:
            return "L0 SYSTEM is fixed by the engine at instance start"
        if effective == Layer.PROCESS:
            return "L1 PROCESS is append-only: its keys are never removed"
        if effective == Layer.HISTORY and is_record_key(key):
            return "HISTORY records are removed by the compressor only"
        return None

    def _deny(self, op: str, key: str, requested: Layer, effective: Layer, reason: str, actor: str) -> None:
        self._emit(EventKind.DENIED, actor, data={
            "op": op, "key": key, "requested": int(requested), "effective": int(effective), "reason": reason})
        raise ContextWriteDenied(key, requested, effective, reason, op="delete" if op == "delete" else "write")

    def _check_key(self, key: Any, layer: Layer | None = None) -> str:
        if not isinstance(key, str) or not key:
            raise ContextValueError(str(key), f"keys must be non-empty strings, got {type(key).__name__} {key!r}",
                                    layer=layer)
        problem = key_problem(key)
        if problem is not None:
            raise ContextValueError(key, problem, of_key=True, layer=layer)
        return key

    def _freeze(self, key: str, value: Any, layer: Layer | None = None) -> Any:
        """``value`` frozen; ``layer``: the layer a write asked for, which the error names."""
        try:
            return freeze(value)
        except (TypeError, ValueError) as exc:
            raise ContextValueError(key, str(exc), layer=layer) from None

    # ----- privileged operations (engine, gateways, compressor) -------------------------

    def apply_changes(self, changes: Iterable[tuple[Layer | int, str, Any]], *, kind: str, actor: str,
                      data: Mapping[str, Any] | None = None, tokens: Mapping[int, int] | None = None) -> Event:
        """Apply engine changes without permission checks (join results, compression).

        SYSTEM can never change; PROCESS only gains keys. Values are validated first:
        nothing is applied if one of them is not JSON-compatible. ``tokens``: token counts
        the caller knows already, by ``id`` of the (frozen) values it passes, which stay alive
        in ``changes`` for the call (the compressor counted every value it made); a value
        not in it is counted here.
        """
        checked: list[Change] = []
        for layer, key, value in changes:
            layer = Layer.parse(layer)
            self._check_key(key, layer)
            if layer == Layer.SYSTEM:
                raise ContextWriteDenied(key, layer, layer, "L0 SYSTEM never changes after instance start")
            if layer == Layer.PROCESS and (value is DELETED or key in self._state.layers[Layer.PROCESS]):
                raise ContextWriteDenied(key, layer, layer, "L1 PROCESS is append-only")
            checked.append((layer, key, value if value is DELETED else self._freeze(key, value, layer)))
        return self._emit(EventKind.CHANGES, actor, changes=checked, data={"note": kind, **(data or {})}, tokens=tokens)

    def record(self, kind: str, *, actor: str, data: Mapping[str, Any] | None = None) -> Event:
        """Append an event that changes no state (split, conflict, resolution, model call, ...)."""
        return self._emit(EventKind.NOTE, actor, data={"note": kind, **(data or {})})

    def mark_preserved(self, keys: Iterable[str], *, actor: str) -> None:
        keys = [k for k in keys if k not in self._state.preserved]
        if keys:
            self._emit(EventKind.NOTE, actor, data={"note": "preserve", "preserve": keys})

    # ----- activities ----------------------------------------------------------------

    def begin_activity(self, task_id: str, *, actor: str | None = None) -> None:
        _check_task_id(task_id, "begin_activity")
        if self._state.activity is not None:
            raise LayerflowError(f"activity {self._state.activity!r} is still open in context {self.name!r}; "
                                 f"complete or abort it before beginning {task_id!r}")
        self._emit(EventKind.BEGIN, actor or task_id, data={"task_id": task_id}, activity=task_id)

    def complete_activity(self, task_id: str, summary: str | None = None, *, status: str = "completed",
                          preserve_keys: Iterable[str] = (), actor: str | None = None,
                          record_kind: str = "activity", details: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Move WORKING into HISTORY, append the ``activity:<task id>`` record, clear EPHEMERAL.

        ``record_kind`` is the record's kind and key prefix (the engine closes a caught message
        or signal with an ``event:<id>`` record); ``details`` are further fields of the record."""
        _check_task_id(task_id, "complete_activity")
        if self._state.activity not in (None, task_id):
            raise LayerflowError(f"cannot complete {task_id!r}: activity {self._state.activity!r} is open in {self.name!r}")
        if f"{record_kind}:" not in RECORD_PREFIXES:
            raise ValueError(f"record_kind {record_kind!r}: use 'activity' or 'event' (a HISTORY record prefix)")
        s = self._state
        working = self.layer(Layer.WORKING)
        changes: list[Change] = []
        for key in working:
            changes.append((Layer.WORKING, key, DELETED))
            changes.append((Layer.HISTORY, key, working[key]))
        for key in self.layer(Layer.EPHEMERAL):
            changes.append((Layer.EPHEMERAL, key, DELETED))
        # the keys the activity wrote, then the other data keys WORKING hands on with it (a branch's
        # contextInject, an injected fix, a key of the process's own that starts with "_"); the engine's
        # own bookkeeping there (a split's _branch_id and _snapshot_id, a join's _mergedConflicts) moves
        # too, but the activity did not write it
        written = list(dict.fromkeys([*sorted(s.activity_keys, key=s.activity_keys.__getitem__),
                                      *(k for k in working if k not in _BOOKKEEPING)]))
        # what the activity wrote, wherever it landed: an update of a key HISTORY already holds is
        # auto-promoted there at once and never passes through WORKING (a loop body's keys)
        written_tokens = sum(self._written_tokens(key) for key in written)
        # HISTORY itself decides the record key: a branch merged back at a join carries
        # its records but not its counters, and a record is never overwritten.
        history = s.layers[Layer.HISTORY]
        n = s.iterations.get(task_id, 0) + 1
        record_key = f"{record_kind}:{task_id}" if n == 1 else f"{record_kind}:{task_id}#{n}"
        while record_key in history:
            n += 1
            record_key = f"{record_kind}:{task_id}#{n}"
        fields = {
            "kind": record_kind,
            "activity": task_id,
            "status": status,
            "summary": summary if summary is not None else _default_summary(task_id, status, written),
            "keys": written,
            "tokens": written_tokens,
        }
        if details or not all(isinstance(v, str) and v.isascii() for v in (task_id, status, fields["summary"])):
            record = freeze({**fields, **(details or {})})
        else:  # what freeze gives: ASCII text, an int and checked keys need no check (the common case)
            fields["keys"] = FrozenList(written)
            record = FrozenDict(fields)
        changes.append((Layer.HISTORY, record_key, record))
        preserve = [k for k in dict.fromkeys(preserve_keys) if k not in s.preserved]
        self._emit(EventKind.COMPLETE, actor or task_id, changes=changes, activity=task_id,
                   data={"task_id": task_id, "record_key": record_key, "status": status, "preserve": preserve})
        # thaw(record), without a call for each of its scalars (the keys are strings)
        return {k: thaw(v) if isinstance(v, (dict, list)) else v for k, v in record.items()}

    def _written_tokens(self, key: str) -> int:
        """Tokens of ``key``'s value as an activity leaves it: WORKING's, which moves into HISTORY,
        else the layer a read resolves it to; 0 for a key the activity deleted or left in
        EPHEMERAL, which its completion clears."""
        tokens = self._state.tokens
        if key in tokens[Layer.WORKING]:
            return tokens[Layer.WORKING][key]
        layer = self.locate(key)
        return 0 if layer is None or layer == Layer.EPHEMERAL else tokens[layer][key]

    def abort_activity(self, task_id: str, *, reason: str, actor: str | None = None) -> None:
        """Put every layer back as it was at ``begin_activity`` (the failed writes stay on the tape)."""
        if self._state.activity != task_id:
            raise LayerflowError(f"cannot abort {task_id!r}: the open activity in {self.name!r} is {self._state.activity!r}")
        snap = self._snapshots[self._state.begin_snapshot] if self._state.begin_snapshot else None
        self._emit(EventKind.ABORT, actor or task_id, activity=task_id, snapshot=snap,
                   data={"task_id": task_id, "reason": reason, "snapshot_id": snap.id if snap else None})

    # ----- snapshots, anchors, views -------------------------------------------------

    def snapshot(self, label: str | None = None, *, actor: str = "engine") -> Snapshot:
        event = self._emit(EventKind.SNAPSHOT, actor, data={"label": label} if label else {})
        return self._snapshots[event.data["snapshot_id"]]

    def get_snapshot(self, snapshot_id: str) -> Snapshot:
        try:
            return self._snapshots[snapshot_id]
        except KeyError:
            known = ", ".join(list(self._snapshots)[-5:]) or "none"
            raise ContextKeyError(f"snapshot {snapshot_id!r} was not taken in context {self.name!r} "
                                  f"(latest: {known})") from None

    def restore(self, snapshot: Snapshot | str, *, layers: Iterable[Layer | int | str] | None = None,
                actor: str = "engine", note: str | None = None, reason: str | None = None) -> Event:
        """Set KNOWLEDGE .. EPHEMERAL (or the given subset) exactly as they were in ``snapshot``.

        SYSTEM and PROCESS are never rolled back: SYSTEM never changes, and a fact
        PROCESS fixed stays fixed (were it unfixed, a later write could change it).
        Naming them in ``layers`` is allowed and leaves them as they are. ``note`` says
        what the restore is (``decompress``), as the tape's filters read it; ``reason`` why,
        on the event that a filter for DESIGN's ``rollback`` finds.
        """
        snap = self.get_snapshot(snapshot) if isinstance(snapshot, str) else snapshot
        chosen = sorted({Layer.parse(x) for x in layers}) if layers is not None else list(LAYERS)
        chosen = [x for x in chosen if x >= Layer.KNOWLEDGE]
        self._snapshots.setdefault(snap.id, snap)
        data: dict[str, Any] = {"snapshot_id": snap.id, "layers": [int(x) for x in chosen]}
        if note is not None:
            data["note"] = note
        if reason:
            data["reason"] = reason
        return self._emit(EventKind.RESTORE, actor, snapshot=snap, data=data)

    def rollback(self, snapshot: Snapshot | str, *, layers: Iterable[Layer | int | str] | None = None,
                 actor: str = "engine", reason: str | None = None) -> Event:
        """``restore``, by the name the CLI, the REST API and the tape's events give it."""
        return self.restore(snapshot, layers=layers, actor=actor, reason=reason)

    def anchor(self, name: str, *, actor: str = "engine", data: Mapping[str, Any] | None = None) -> Event:
        """A named point on the tape: views can start here. Deletes nothing."""
        return self._emit(EventKind.ANCHOR, actor, data={"name": name, "order": self._state.counter, **(data or {})})

    def view(self, anchor: str | None = None, hooks: Iterable[SelectHook] = ()) -> "View":
        return View(self, anchor=anchor, hooks=tuple(hooks))

    @classmethod
    def fork(cls, snapshot: Snapshot, *, name: str, branch_id: str, inject: Mapping[str, Any] | None = None,
             actor: str = "engine", encoding: str | None = None,
             clock: Callable[[], float] | None = None) -> "LayeredContext":
        """A branch context: every layer from ``snapshot`` (shared, O(1)), EPHEMERAL cleared,
        WORKING plus ``inject``, ``_branch_id`` and ``_snapshot_id``. ``clock`` stamps its events
        (pass the parent's; default the wall clock)."""
        ctx = cls(name=name, branch_id=branch_id, encoding=encoding or DEFAULT_ENCODING, clock=clock, _empty=True)
        ctx._base = snapshot
        changes: list[Change] = []  # EPHEMERAL is emptied by the fork itself, in O(1)
        layers = snapshot.state.layers
        markers = {"_branch_id": branch_id, "_snapshot_id": snapshot.id}
        fixed: list[str] = []
        for key, value in {**(inject or {}), **markers}.items():
            # the write rule holds for injections too: a key already in KNOWLEDGE or
            # HISTORY (e.g. ``_branch_id`` of an earlier split) is updated where reads find it
            where = next((layer for layer in LAYERS[:Layer.WORKING] if key in layers[layer]), Layer.WORKING)
            if where <= Layer.PROCESS and key in markers and (inject is None or key not in inject):
                # an engine marker the process itself fixed (initial data, the config's system:)
                # stays as it is, as at an XOR split; the branch is known by its context's name
                fixed.append(key)
                continue
            if where <= Layer.PROCESS:
                raise ContextWriteDenied(key, Layer.WORKING, where,
                                         f"contextInject of branch {branch_id!r} may not change a key that "
                                         f"{where.name} fixed; inject a different key")
            changes.append((where, ctx._check_key(key, where), ctx._freeze(key, value, where)))
        ctx._emit(EventKind.FORK, actor, changes=changes, snapshot=snapshot,
                  data={"snapshot_id": snapshot.id, "parent": snapshot.context, "name": name,
                        "branch_id": branch_id, "inject": thaw(dict(inject or {})), "encoding": ctx.encoding,
                        **({"markers_fixed": fixed} if fixed else {})})
        return ctx

    # ----- the one state transition ------------------------------------------------------

    def _emit(self, kind: EventKind, actor: str, *, changes: Iterable[Change] = (), data: Mapping[str, Any] | None = None,
              activity: str | None = None, snapshot: Snapshot | None = None,
              tokens: Mapping[int, int] | None = None) -> Event:
        seq = self._tape.next_seq
        if kind in _TAKES_SNAPSHOT:
            data = {**(data or {}), "snapshot_id": self.next_snapshot_id}
        if not data:
            frozen = _NO_DATA  # most writes carry none: one frozen empty dict for all of them
        else:
            try:
                frozen = freeze(data if type(data) is dict else dict(data))
            except ValueError as err:  # a label, reason or note that no tape can carry (NaN, a lone surrogate)
                raise ContextValueError(f"{kind.value} event data", str(err)) from None
        event = new_event(seq, kind, self.clock(), actor, activity if activity is not None else self._state.activity,
                          self.branch_id, tuple(changes), frozen, snapshot)
        self._state = self._apply(self._state, event, tokens)
        self._tape._append(event)
        return event

    def _apply(self, s: _State, e: Event, counted: Mapping[int, int] | None = None) -> _State:
        if e.kind == EventKind.FORK:
            base = e.snapshot.state if e.snapshot is not None else _State.empty()
            s = _State((*base.layers[:5], _EMPTY), (*base.tokens[:5], _EMPTY), (*base.totals[:5], 0), base.preserved,
                       max(base.counter, s.counter), None, _EMPTY, None, base.iterations)
        elif e.kind in (EventKind.RESTORE, EventKind.ABORT) and e.snapshot is not None:
            # an abort undoes the failed activity in every layer but SYSTEM (it fixed nothing);
            # a restore names its layers (never SYSTEM or PROCESS)
            chosen = e.data["layers"] if e.kind == EventKind.RESTORE else [int(x) for x in LAYERS[1:]]
            layers, tokens, totals = list(s.layers), list(s.tokens), list(s.totals)
            for i in chosen:
                layers[i], tokens[i], totals[i] = e.snapshot.state.layers[i], e.snapshot.state.tokens[i], e.snapshot.state.totals[i]
            s = s._replace(layers=tuple(layers), tokens=tuple(tokens), totals=tuple(totals))
            was = e.snapshot.state
            if e.kind == EventKind.RESTORE and s.activity is not None and \
                    (was.activity, was.begin_snapshot) == (s.activity, s.begin_snapshot):
                # back to a point inside the open activity: what it wrote since goes with the values,
                # so its record at completion names only the keys it still holds
                s = s._replace(activity_keys=was.activity_keys)
        if e.changes:
            s = self._apply_changes(s, e.changes, e.seq, counted)
        # _State(...) rather than s._replace(...) below: NamedTuple's _replace costs more than the rest
        if e.kind == EventKind.BEGIN:
            s = _State(s.layers, s.tokens, s.totals, s.preserved, s.counter, e.data["task_id"], _EMPTY,
                       e.data["snapshot_id"], s.iterations)
        elif e.kind in _ONE_KEY and s.activity is not None:
            key = e.changes[0][1]
            if key not in s.activity_keys:
                s = _State(s.layers, s.tokens, s.totals, s.preserved, s.counter, s.activity,
                           s.activity_keys.set(key, len(s.activity_keys)), s.begin_snapshot, s.iterations)
        elif e.kind == EventKind.COMPLETE:
            task_id = e.data["task_id"]
            record_key = e.data["record_key"]
            n = int(record_key.rsplit("#", 1)[1]) if "#" in record_key else 1
            s = _State(s.layers, s.tokens, s.totals, s.preserved, s.counter, None, _EMPTY, None,
                       s.iterations.set(task_id, n))
        elif e.kind == EventKind.ABORT:
            s = s._replace(activity=None, activity_keys=_EMPTY, begin_snapshot=None)
        preserve = e.data.get("preserve") if e.data else None
        if preserve:
            with s.preserved.mutate() as m:
                for k in preserve:
                    m[k] = True
                s = _State(s.layers, s.tokens, s.totals, m.finish(), s.counter, s.activity, s.activity_keys,
                           s.begin_snapshot, s.iterations)
        if e.kind in _TAKES_SNAPSHOT:
            sid = e.data["snapshot_id"]
            self._snapshots[sid] = _new_snapshot(sid, self.name, e.seq, s, e.data.get("label"))
        return s

    def _apply_changes(self, s: _State, changes: Iterable[Change], seq: int,
                       counted: Mapping[int, int] | None = None) -> _State:
        if type(changes) is tuple and len(changes) == 1 and changes[0][2] is not DELETED and not counted:
            return self._apply_one(s, changes[0], seq)
        layers, tokens, totals = list(s.layers), list(s.tokens), list(s.totals)
        counter = s.counter
        touched: dict[int, tuple[Any, Any]] = {}
        # a value moved between layers (WORKING -> HISTORY) is the same frozen object:
        # its token count is known, keyed by identity while both are alive in this call
        known: dict[int, int] = dict(counted) if counted else {}
        for layer, key, value in changes:
            if layer not in touched:
                touched[layer] = (layers[layer].mutate(), tokens[layer].mutate())
            m, t = touched[layer]
            old = m.get(key)
            if value is DELETED:
                if old is not None:
                    known[id(old[2])] = t[key]
                    del m[key]
                    totals[layer] -= t[key]
                    del t[key]
                continue
            if old is None:
                counter += 1
                order = counter
            else:
                order = old[0]
                totals[layer] -= t[key]
            n = known.get(id(value))
            if n is None:
                n = count_value(value, self.encoding)
            m[key] = (order, seq, value)
            t[key] = n
            totals[layer] += n
        for layer, (m, t) in touched.items():
            layers[layer], tokens[layer] = m.finish(), t.finish()
        # _State(...) rather than s._replace(...): this runs for every change, and NamedTuple's
        # _replace costs more than the rest of a one-key write
        return _State(tuple(layers), tuple(tokens), tuple(totals), s.preserved, counter, s.activity, s.activity_keys,
                      s.begin_snapshot, s.iterations)

    def _apply_one(self, s: _State, change: Change, seq: int) -> _State:
        """``_apply_changes`` of one set (a write): two ``Map.set`` instead of two mutations."""
        layer, key, value = change
        m, t = s.layers[layer], s.tokens[layer]
        old = m.get(key)
        counter = s.counter
        total = s.totals[layer]
        if old is None:
            counter += 1
            order = counter
        else:
            order = old[0]
            total -= t[key]
        n = count_value(value, self.encoding)
        layers, tokens, totals = list(s.layers), list(s.tokens), list(s.totals)
        layers[layer] = m.set(key, (order, seq, value))
        tokens[layer] = t.set(key, n)
        totals[layer] = total + n
        return _State(tuple(layers), tuple(tokens), tuple(totals), s.preserved, counter, s.activity, s.activity_keys,
                      s.begin_snapshot, s.iterations)

    # ----- replay and persistence -----------------------------------------------------

    @classmethod
    def replay(cls, events: Iterable[Event | Mapping[str, Any]], *, until: int | None = None, name: str | None = None,
               encoding: str | None = None) -> "LayeredContext":
        """Rebuild a context from its tape (up to sequence number ``until``). The events may
        also be the tape as JSON gives it (``Event.to_dict()`` dicts, extra keys ignored),
        or an instance's whole tape as ``layerflow tape --json`` and the REST API give it:
        every context's events, each naming its ``context``. Then ``name`` picks the context
        to rebuild (its name or its branch id; default: the first event's, ``main``),
        ``until`` is a sequence number of that context, and a branch takes the parent
        snapshot it was forked from by replaying the parent's events of the same tape."""
        items = list(events)
        contexts = _events_by_context(items)
        if contexts is not None and (len(contexts) > 1 or (name is not None and name in contexts)):
            return cls._replay_context(contexts, name if name is not None else next(iter(contexts)), until,
                                       encoding, frozenset())
        return cls._replay_events(items, until, name, encoding, None)

    @classmethod
    def _replay_context(cls, contexts: Mapping[str, list[Mapping[str, Any]]], name: str, until: int | None,
                        encoding: str | None, visiting: frozenset[str]) -> "LayeredContext":
        """Context ``name`` (or the one branch of that id) of an instance's tape; a snapshot of
        another context it needs is rebuilt from that context's events, up to its sequence number."""
        if name not in contexts:
            named = [c for c, events in contexts.items() if events and events[0].get("branch") == name]
            if len(named) != 1:
                several = f"; branch {name!r} ran in {', '.join(named)}: name one" if named else ""
                raise ContextKeyError(f"the tape holds no events of context {name!r}; it holds "
                                      f"{', '.join(contexts)}{several}")
            name = named[0]
        seqs = [e.get("seq") for e in contexts[name]]
        if seqs != list(range(1, len(seqs) + 1)):
            gap = next(n for n, seq in enumerate(seqs, 1) if seq != n)
            raise ValueError(f"the tape of context {name!r} is not whole: event {gap} is missing or out of place "
                             "(a filtered tape, `--kind`, `--since`, `limit`?); replay the whole tape")
        visiting = visiting | {name}

        def snapshot_of(snapshot_id: str) -> Snapshot | None:
            owner, _, seq = snapshot_id.removeprefix("snap:").rpartition(":")
            if owner in visiting or owner not in contexts or not seq.isdigit():
                return None
            return cls._replay_context(contexts, owner, int(seq), None, visiting)._snapshots.get(snapshot_id)

        return cls._replay_events(contexts[name], until, name, encoding, snapshot_of)

    @classmethod
    def _replay_events(cls, events: Iterable[Event | Mapping[str, Any]], until: int | None, name: str | None,
                       encoding: str | None, snapshot_of: Callable[[str], Snapshot | None] | None) -> "LayeredContext":
        tape: list[Event] = [_event_of(e, i) if isinstance(e, Mapping) else e for i, e in enumerate(events)]
        if tape and tape[0].kind == EventKind.INIT:
            name = name or tape[0].data.get("name", "main")
            encoding = encoding or tape[0].data.get("encoding")
        elif tape and tape[0].kind == EventKind.FORK:
            name = name or tape[0].data.get("name")
            encoding = encoding or tape[0].data.get("encoding")
        ctx = cls(name=name or "main", branch_id=tape[0].branch if tape else None,
                  encoding=encoding or DEFAULT_ENCODING, _empty=True)
        for e in tape:
            if until is not None and e.seq > until:
                break
            if e.kind == EventKind.FORK:
                if e.snapshot is None:  # a branch's tape as JSON: the parent's snapshot is not in it
                    sid = e.data.get("snapshot_id")
                    found = snapshot_of(sid) if snapshot_of is not None and isinstance(sid, str) else None
                    if found is None:
                        raise ContextKeyError(
                            f"event {e.seq} of {ctx.name!r} forks the branch from snapshot {sid!r}, which the "
                            "events do not carry; replay a branch from its context's tape (ctx.tape), its record "
                            "(from_dict), or the instance's whole tape (`layerflow tape ID --json`: every "
                            "context's events) with name= the branch's context")
                    e = replace(e, snapshot=found)
                ctx._base = e.snapshot
            if e.kind in (EventKind.RESTORE, EventKind.ABORT) and e.data.get("snapshot_id"):
                # snapshots taken in this context are re-created by the replay itself
                sid = e.data["snapshot_id"]
                snap = ctx._snapshots.get(sid, e.snapshot)
                if snap is None and snapshot_of is not None:
                    snap = snapshot_of(sid)
                if snap is None:
                    raise ContextKeyError(f"event {e.seq} of {ctx.name!r} restores snapshot "
                                          f"{sid!r}, which the record does not hold")
                ctx._snapshots.setdefault(snap.id, snap)
                e = replace(e, snapshot=snap)
            ctx._state = ctx._apply(ctx._state, e)
            ctx._tape._append(e)
        return ctx

    def to_dict(self) -> dict[str, Any]:
        """JSON-able record: the tape, plus the base a branch was forked from and any
        snapshot from another context that a restore used."""
        foreign = {}
        for e in self._tape:
            if e.snapshot is not None and e.snapshot.context != self.name:
                foreign[e.snapshot.id] = _dump_snapshot(e.snapshot)
        return {"format": TAPE_FORMAT, "name": self.name, "branch_id": self.branch_id, "encoding": self.encoding,
                "snapshots": foreign, "tape": self._tape.to_list()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LayeredContext":
        fmt = data.get("format")
        if fmt != TAPE_FORMAT:
            raise LayerflowError(f"context record {data.get('name')!r} has format {fmt!r}; this layerflow reads format {TAPE_FORMAT}")
        # counted in this context's encoding, as the snapshot a branch is forked from was (the engine
        # forks a branch in its parent's encoding)
        encoding = data.get("encoding") or DEFAULT_ENCODING
        foreign = {sid: _load_snapshot(sid, d, encoding) for sid, d in data.get("snapshots", {}).items()}
        events = [Event.from_dict(d, snapshot=foreign.get((d.get("data") or {}).get("snapshot_id")))
                  for d in data["tape"]]
        return cls.replay(events, name=data["name"], encoding=encoding)


def layer_items(source: "LayeredContext | Snapshot", layer: Layer) -> list[tuple[str, Any, int]]:
    """``(key, value, tokens)`` of one layer of a context or snapshot, in insertion order: what
    ``layer(...)`` and ``key_tokens`` give key by key, read from the state in one pass (the
    attention scope is built from it after every activity)."""
    state = source._state if isinstance(source, LayeredContext) else source.state
    tokens = state.tokens[layer]
    return [(key, slot[2], tokens[key]) for key, slot in sorted(state.layers[layer].items(), key=_slot_order)]


def _slot_order(item: tuple[str, Slot]) -> int:
    return item[1][0]


def _default_summary(task_id: str, status: str, keys: list[str]) -> str:
    # the record lists the keys already; repeating them here costs tokens in every prompt
    return f"{task_id} {status}" if keys else f"{task_id} {status}; no keys written"


def _dump_snapshot(snap: Snapshot, *, copy: bool = True) -> dict[str, Any]:
    s = snap.state
    value = thaw if copy else _same
    return {
        "context": snap.context,
        "seq": snap.seq,
        "counter": s.counter,
        "layers": [[[k, o, q, value(v)] for k, (o, q, v) in sorted(m.items(), key=lambda kv: kv[1][0])] for m in s.layers],
        "preserved": sorted(s.preserved.keys()),
        "iterations": dict(sorted(s.iterations.items())),  # immutables.Map iterates in hash order
    }


def _same(value: Any) -> Any:
    return value


def _load_snapshot(sid: str, d: Mapping[str, Any], encoding: str = DEFAULT_ENCODING) -> Snapshot:
    from .tokens import count_value as cv

    layers, tokens, totals = [], [], []
    for items in d["layers"]:
        m: dict[str, Slot] = {}
        t: dict[str, int] = {}
        for key, order, seq, value in items:
            fv = freeze(value)
            m[key] = (order, seq, fv)
            t[key] = cv(fv, encoding)
        layers.append(immutables.Map(m))
        tokens.append(immutables.Map(t))
        totals.append(sum(t.values()))
    state = _State(layers=tuple(layers), tokens=tuple(tokens), totals=tuple(totals),
                   preserved=immutables.Map({k: True for k in d.get("preserved", [])}),
                   counter=int(d.get("counter", 0)), iterations=immutables.Map(d.get("iterations", {})))
    return Snapshot(id=sid, context=d["context"], seq=int(d["seq"]), state=state)


class View:
    """What a model is shown: the context from an anchor on, through select hooks.

    A view never changes the context or its tape (audit mode and token mode are two
    views of one tape). The anchor hides HISTORY entries from before it: those inserted
    before it, unless written again after it (then their values since the anchor show;
    a compression's rewrite alone does not count, it is no new content). Hooks are plain,
    deterministic functions from entries to entries, applied in order.
    """

    def __init__(self, ctx: LayeredContext, anchor: str | None = None, hooks: Iterable[SelectHook] = ()) -> None:
        self.context = ctx
        self.anchor = anchor
        self.hooks = tuple(hooks)
        self._start = 0
        self._changed: frozenset[tuple[str, int]] = frozenset()  # (HISTORY key, seq) written after the anchor
        self._touched: frozenset[str] = frozenset()  # ... of those, keys written by more than a compression
        if anchor is not None:
            anchors = ctx.tape.anchors
            if anchor not in anchors:
                raise ContextKeyError(f"anchor {anchor!r} was not found on the tape of {ctx.name!r} "
                                      f"(anchors: {', '.join(anchors) or 'none'}); set it where the view is to "
                                      f"start with ctx.anchor({anchor!r}), or name one of those")
            event = anchors[anchor]
            self._start = int(event.data["order"])
            changed = [(key, e) for e in ctx.tape.since(event.seq + 1)
                       for layer, key, value in e.changes if layer == Layer.HISTORY and value is not DELETED]
            self._changed = frozenset((key, e.seq) for key, e in changed)
            self._touched = frozenset(key for key, e in changed if e.data.get("note") != "compress")

    def shows(self, entry: Entry) -> bool:
        """Whether the anchor leaves ``entry`` (a current value, or an earlier one at its seq) visible."""
        if entry.layer != Layer.HISTORY or entry.order > self._start:
            return True
        return entry.key in self._touched and (entry.key, entry.seq) in self._changed

    def entries(self) -> list[Entry]:
        return run_hooks((e for e in self.context.entries() if self.shows(e)), self.hooks)

    def layer(self, layer: Layer | int | str) -> dict[str, Any]:
        layer = Layer.parse(layer)
        return {e.key: e.value for e in self.entries() if e.layer == layer}

    def as_dict(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {str(layer): {} for layer in LAYERS}
        for e in self.entries():
            out[str(e.layer)][e.key] = e.value
        return out


def _events_by_context(events: list[Any]) -> dict[str, list[Mapping[str, Any]]] | None:
    """An instance's JSON tape grouped by context, in the order the contexts first appear;
    None unless every event is a mapping that names its ``context``."""
    grouped: dict[str, list[Mapping[str, Any]]] = {}
    for e in events:
        if not isinstance(e, Mapping) or not isinstance(e.get("context"), str):
            return None
        grouped.setdefault(e["context"], []).append(e)
    return grouped


def _event_of(d: Mapping[str, Any], index: int) -> Event:
    """A tape event from its JSON form; a clear error when it is not one."""
    try:
        return Event.from_dict(d)
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise ValueError(f"tape event #{index + 1} is not an event as Event.to_dict() writes it "
                         f"(seq, kind, time, actor, ...): {type(err).__name__}: {err}") from err
