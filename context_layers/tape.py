"""The tape: an append-only log of everything that happened to a context.

Every event has a sequence number, a time, an actor, the activity and branch it
happened in, the exact state changes it made (``changes``: ``(layer, key, value)``
or ``(layer, key, DELETED)``) and kind-specific ``data``. Replaying the events in
order rebuilds the context exactly; nothing is ever removed from a tape: compression,
rollback and resolution append events of their own. Anchors are named points on the
tape; they mark where a view starts, they delete nothing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, overload

from .canonical import freeze
from .markers import DELETED

if TYPE_CHECKING:
    from .context import Snapshot

__all__ = ["ENGINE_KEY_PREFIXES", "Event", "EventKind", "KIND_ALIASES", "Tape", "TAPE_FORMAT", "kind_names",
           "matches_kind"]

TAPE_FORMAT = 1


class EventKind(StrEnum):
    INIT = "init"
    WRITE = "write"
    DENIED = "denied"
    DELETE = "delete"
    BEGIN = "begin"
    COMPLETE = "complete"
    ABORT = "abort"
    SNAPSHOT = "snapshot"
    RESTORE = "restore"
    FORK = "fork"
    ANCHOR = "anchor"
    CHANGES = "changes"  # privileged engine changes (join results, compression, injections)
    NOTE = "note"  # no state change: split, conflict, resolution, confirmation, llm call, ...


# the names DESIGN gives the tape's events ("a rollback", "a move", "a compression", ...) for the
# kinds and notes they are recorded as: the CLI, the REST API and ``Tape.filter`` take both
KIND_ALIASES: dict[str, tuple[str, ...]] = {
    "rollback": ("restore",), "move": ("complete",), "compression": ("compress", "decompress"),
    "config": ("config_change",), "human": ("human_decision",), "decision": ("human_decision",),
    # a path that no gateway joins (a non-interrupting boundary event's, an event sub-process's) merges
    # back in a ``side_merge``: a join all the same
    "join": ("side_merge",), "merge": ("join", "side_merge"), "resolve": ("resolution",),
    # an operator's refused inject is a ``governance_denied`` note (the write never reached the tape);
    # an XOR split's inject of its marker on a key SYSTEM or PROCESS fixed, an ``inject_refused`` note
    # (no ``denied`` write stands for it: a contextInject the layers refuse is a ``denied`` write, and
    # stops the split before any inject)
    "denied": ("governance_denied", "inject_refused"), "deny": ("denied", "governance_denied", "inject_refused"),
    "denied_write": ("denied", "governance_denied", "inject_refused"),
    # a branch's contextInject is written by its fork; an XOR's by an ``inject`` change; an operator's
    # by writes and a ``governance`` note whose ``op`` is ``inject`` (``matches_kind``)
    "inject": ("fork",),
}


#: the keys only the engine writes: ``_`` bookkeeping (a join's ``_mergedConflicts``, a branch's
#: markers), HISTORY's records, the compressor's ``count_only`` counters (``summary:count:<pattern>``:
#: the compressor and a join take such a value for a real count of removed entries) and KNOWLEDGE's
#: retrieval hits (``kb:``). Nothing from outside the process (a person's or a model's answer, an
#: event's payload, an inject, start data) may write them
ENGINE_KEY_PREFIXES = ("_", "activity:", "event:", "compaction:", "summary:count:", "kb:")
# Notes of an outside write of such a key, refused before it reached the context (no layer rule
# refused it, so no ``denied`` event stands for it): the ``denied`` filter lists them. A layer's
# refusal of an answer is its ``denied`` write; its note, naming the task, would list it twice.
_REFUSED_WRITE_NOTES = frozenset({"answer_refused", "model_answer_refused", "event_refused"})


def kind_names(kind: str | None) -> set[str] | None:
    """The kinds and notes an event filter ``kind`` finds: itself, DESIGN's name for it, its singular."""
    if kind is None:
        return None
    text = kind.strip()
    names = {text, *KIND_ALIASES.get(text, ())}
    if text.endswith("s") and len(text) > 1:  # conflicts, resolutions, writes
        names |= {text[:-1], *KIND_ALIASES.get(text[:-1], ())}
    return names


def matches_kind(event: "Event", kinds: set[str]) -> bool:
    """Whether ``event`` is of one of ``kinds`` (``kind_names``): its kind, its note, or, for ``inject``,
    the ``governance`` note of an operator's inject (its writes are plain writes; the operator's other
    operations have events of their own: a rollback's ``restore``, a compression's ``compress``); for
    ``denied``, the refusal note of an answer's or a payload's engine key (``_REFUSED_WRITE_NOTES``)."""
    data = event.data or {}
    note = data.get("note")
    key = data.get("key")
    return (event.kind in kinds or note in kinds
            or ("inject" in kinds and note == "governance" and data.get("op") == "inject")
            or ("denied" in kinds and note in _REFUSED_WRITE_NOTES and isinstance(key, str)
                and key.startswith(ENGINE_KEY_PREFIXES)))


Change = tuple[int, str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    seq: int
    kind: str
    time: float
    actor: str
    activity: str | None = None
    branch: str | None = None
    changes: tuple[Change, ...] = ()
    data: Mapping[str, Any] = field(default_factory=dict)
    # the snapshot a fork/restore/abort started from; persisted apart from the event
    snapshot: "Snapshot | None" = field(default=None, compare=False, repr=False)

    @property
    def keys(self) -> tuple[str, ...]:
        """The context keys the event is about: those it changed, else the one its ``data``
        names (a denied write's, a conflict's), in order, once each."""
        found = dict.fromkeys(key for _, key, _ in self.changes)
        named = self.data.get("key") if self.data else None
        if not found and isinstance(named, str):
            found[named] = None
        return tuple(found)

    @property
    def key(self) -> str | None:
        """The one key the event is about (a write, a delete, a denied write, a conflict);
        ``None`` for an event about no key or several (``keys`` lists them)."""
        keys = self.keys
        return keys[0] if len(keys) == 1 else None

    def to_dict(self) -> dict[str, Any]:
        # frozen values are dict/list subclasses: JSON-encodable as they are, no copy needed
        changes = [[layer, key] if value is DELETED else [layer, key, value] for layer, key, value in self.changes]
        out: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "time": self.time, "actor": self.actor}
        if self.activity is not None:
            out["activity"] = self.activity
        if self.branch is not None:
            out["branch"] = self.branch
        if changes:
            out["changes"] = changes
        if self.data:
            out["data"] = self.data
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], snapshot: "Snapshot | None" = None) -> "Event":
        changes = tuple((int(c[0]), str(c[1]), DELETED if len(c) == 2 else freeze(c[2])) for c in d.get("changes", ()))
        return cls(seq=int(d["seq"]), kind=str(d["kind"]), time=float(d["time"]), actor=str(d["actor"]),
                   activity=d.get("activity"), branch=d.get("branch"), changes=changes,
                   data=freeze(d.get("data", {})), snapshot=snapshot)


_NEW = object.__new__
_EVENT_SLOTS = tuple(Event.__dict__[f].__set__ for f in
                     ("seq", "kind", "time", "actor", "activity", "branch", "changes", "data", "snapshot"))


def new_event(seq: int, kind: str, time: float, actor: str, activity: str | None, branch: str | None,
              changes: tuple[Change, ...], data: Mapping[str, Any], snapshot: "Snapshot | None") -> Event:
    """``Event(...)`` with every field given, built by setting its slots: a context appends an
    event for every change, and the frozen dataclass's ``__init__`` (one ``object.__setattr__``
    per field) cost more than the rest of a write. The same object ``Event(...)`` builds."""
    e = _NEW(Event)
    s_seq, s_kind, s_time, s_actor, s_activity, s_branch, s_changes, s_data, s_snapshot = _EVENT_SLOTS
    s_seq(e, seq)
    s_kind(e, kind)
    s_time(e, time)
    s_actor(e, actor)
    s_activity(e, activity)
    s_branch(e, branch)
    s_changes(e, changes)
    s_data(e, data)
    s_snapshot(e, snapshot)
    return e


class Tape(Sequence[Event]):
    """Read-only to everyone but the context that owns it."""

    __slots__ = ("_events",)

    def __init__(self, events: Sequence[Event] = ()) -> None:
        self._events: list[Event] = list(events)

    def _append(self, event: Event) -> None:
        self._events.append(event)

    @overload
    def __getitem__(self, i: int) -> Event: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Event]: ...
    def __getitem__(self, i: int | slice) -> Event | Sequence[Event]:
        return self._events[i]

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events)

    def __repr__(self) -> str:
        return f"Tape({len(self._events)} events)"

    def __eq__(self, other: object) -> bool:
        """Equal to a tape (or a list of events) with the same events in the same order."""
        if isinstance(other, Tape):
            return self._events == other._events
        if isinstance(other, (list, tuple)):
            return self._events == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # it grows

    @property
    def next_seq(self) -> int:
        return self._events[-1].seq + 1 if self._events else 1

    def since(self, seq: int) -> list[Event]:
        """Events with a sequence number >= ``seq``."""
        return [e for e in self._events if e.seq >= seq]

    def until(self, seq: int) -> list[Event]:
        return [e for e in self._events if e.seq <= seq]

    def filter(self, *, kind: str | None = None, activity: str | None = None, branch: str | None = None,
               key: str | None = None) -> list[Event]:
        kinds = kind_names(kind)

        def keep(e: Event) -> bool:
            if kinds is not None and not matches_kind(e, kinds):
                return False
            # a gateway's events (split, join, conflict, resolution) happen between activities: they
            # name the gateway as gateway_id, and filtering by its BPMN id finds them too; so do the
            # events the engine makes for an activity once it has closed (the snapshot and the
            # compression after it, a model's summary for it): their actor is the activity
            if activity is not None and e.activity != activity and not (
                    e.activity is None and activity in (e.data.get("gateway_id"), e.actor)):
                return False
            if branch is not None and e.branch != branch:
                return False
            if key is not None and not (any(c[1] == key for c in e.changes) or e.data.get("key") == key):
                return False
            return True
        return [e for e in self._events if keep(e)]

    @property
    def anchors(self) -> dict[str, Event]:
        """Anchor name -> its (latest) anchor event."""
        return {e.data["name"]: e for e in self._events if e.kind == EventKind.ANCHOR}

    def to_list(self) -> list[dict[str, Any]]:
        return [e.to_dict() for e in self._events]
