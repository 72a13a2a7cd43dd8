"""The ``Store`` protocol, its record types, its errors, and what every backend shares.

A store keeps, per instance:

* the **instance record**: a JSON-able dict (``id``, ``process_id``, ``status``, the
  serialized workflow, the context heads, engine bookkeeping) with an integer
  ``version`` for optimistic concurrency. ``create`` gives version 1; ``save`` with
  the version you loaded gives the next one, or raises ``VersionConflict`` when
  someone saved in between (nothing is written then). A part of the record may be
  given as ``JSONText`` (JSON encoded already, e.g. once for many saves); it is
  written as it is and loads back as the value it encodes;
* **tapes**, one per context name: event dicts with gap-free sequence numbers from 1.
  Appends go in with the save they belong to, in one transaction, and every change
  of a tape bumps the instance version, so a writer holding a stale version can never
  append behind another writer's back. Long lists and strings in events are stored in
  content-addressed parts (``tape_parts``), in the same transaction; a read gives every
  event whole, as it was appended;
* **snapshots** by id, content-addressed (see ``split_snapshot``); their parts and the
  tapes' share the instance's blobs;
* **confirmations**: pending human decisions, answered exactly once;
* **leases**: which worker runs an instance right now, with an expiry;
* the **timer index**: per waiting instance, the earliest due time of its pending timers
  (``timer_due``), written in the same transaction as the record, so that ``due_instances``
  finds the instances whose time has come without reading every record.

Errors (all ``LayerflowError``; ``VersionConflict`` and ``ContextKeyError`` live in
``context_layers.errors``)::

    LayerflowError
    ├── VersionConflict                kind="version_conflict"  stale expected_version
    ├── ContextKeyError (KeyError)
    │   ├── InstanceNotFound           kind="not_found"         no instance with that id
    │   └── ConfirmationNotFound       kind="not_found"
    └── StoreError                     kind="store_error"       base of the rest
        ├── StoreUnavailable           kind="store_unavailable" backend down / locked too long
        ├── StoreFormatError           kind="store_format"      stored by a newer layerflow
        ├── InvalidStoreURL (ValueError) kind="invalid_config"  unknown scheme, bad path
        ├── StoreNotFound              kind="not_found"         open_store(create=False) of a missing file
        ├── InvalidRecord (ValueError) kind="invalid_record"    not JSON, missing field
        ├── InstanceExists             kind="already_exists"    create() of a taken id
        ├── TapeSequenceError          kind="tape_sequence"     gap or duplicate seq
        ├── ConfirmationAnswered       kind="already_answered"  second answer
        └── InvalidAnswer (ValueError) kind="invalid_answer"    not one of the options

Backend exceptions (sqlite3, redis) are mapped to these in one place per backend.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from json.encoder import encode_basestring
from typing import Any, Protocol, TypedDict, runtime_checkable
from urllib.parse import quote

from ..canonical import fast_encode, json_equal
from ..errors import ContextKeyError, LayerflowError, VersionConflict
from .tape_parts import PART_BYTES, PartWriter, fetch_parts

__all__ = [
    "STORE_FORMAT",
    "INSTANCE_FORMAT",
    "TIMER_INDEX",
    "DUE_AT_ONCE",
    "BLOB_MIN_BYTES",
    "Store",
    "InstanceSummary",
    "Confirmation",
    "BlobStats",
    "StoreError",
    "StoreUnavailable",
    "StoreFormatError",
    "InvalidStoreURL",
    "StoreNotFound",
    "InvalidRecord",
    "InstanceExists",
    "InstanceNotFound",
    "TapeSequenceError",
    "ConfirmationNotFound",
    "ConfirmationAnswered",
    "InvalidAnswer",
    "VersionConflict",
    "JSONText",
    "json_text",
    "timer_due",
    "split_snapshot",
    "join_snapshot",
]

#: Format of everything a store writes but instance rows (snapshot manifests,
#: confirmations, the store's own meta record). Bump it with a migration.
STORE_FORMAT = 1

#: Format of an instance row (record and tapes). 2: its tapes may hold events stored in
#: parts (``tape_parts``), which a layerflow reading format 1 would take for values; it
#: reads format 1 rows as they are.
INSTANCE_FORMAT = 2

#: Version of the timer index (``timer_due``) a store keeps. A store that does not say it
#: holds this version (one written before the index existed) fills the index from its
#: records, once, on the first ``due_instances``, and then records the version.
TIMER_INDEX = 2  # 2: a timer due by the time the instance has seen is due at once (``timer_due``)

#: The timer index value of a timer due already by the record's own time (``timer_due``): every bound reaches it.
DUE_AT_ONCE = float("-inf")

#: Snapshot parts whose JSON is at least this long are stored once, by hash.
BLOB_MIN_BYTES = 128


# ================================================================================ errors

class StoreError(LayerflowError):
    kind = "store_error"


class StoreUnavailable(StoreError):
    kind = "store_unavailable"


class StoreFormatError(StoreError):
    kind = "store_format"


class InvalidStoreURL(StoreError, ValueError):
    kind = "invalid_config"


class StoreNotFound(StoreError):
    """A store to read from is not there (``open_store(url, create=False)``): nothing was created."""

    kind = "not_found"


class InvalidRecord(StoreError, ValueError):
    kind = "invalid_record"


class InstanceExists(StoreError):
    kind = "already_exists"


class TapeSequenceError(StoreError, ValueError):
    kind = "tape_sequence"


class ConfirmationAnswered(StoreError):
    kind = "already_answered"


class InvalidAnswer(StoreError, ValueError):
    kind = "invalid_answer"


class InstanceNotFound(ContextKeyError):
    kind = "not_found"

    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        super().__init__(f"instance {instance_id!r} is not in the store; list_instances() shows the stored ids")


class ConfirmationNotFound(ContextKeyError):
    kind = "not_found"

    def __init__(self, confirmation_id: str) -> None:
        self.confirmation_id = confirmation_id
        super().__init__(f"confirmation {confirmation_id!r} is not in the store; "
                         "list_confirmations() shows the pending ones")


def version_conflict(instance_id: str, expected: int, actual: int) -> VersionConflict:
    err = VersionConflict(
        f"instance {instance_id!r} was saved by someone else: expected version {expected}, "
        f"stored version {actual}; nothing was written. Reload it (store.load) and retry on the new version")
    err.instance_id = instance_id  # type: ignore[attr-defined]
    err.expected = expected  # type: ignore[attr-defined]
    err.actual = actual  # type: ignore[attr-defined]
    return err


def tape_gap(instance_id: str, context: str, first_seq: int, last_seq: int) -> TapeSequenceError:
    what = "duplicates" if first_seq <= last_seq else "leaves a gap after"
    return TapeSequenceError(
        f"append to tape {context!r} of instance {instance_id!r} starts at seq {first_seq}, which {what} "
        f"the stored last seq {last_seq}; the next event must have seq {last_seq + 1}. Nothing was written; "
        "reload the instance and append only the events after its stored tape")


#: the id a context gives its own snapshots (``LayeredContext.next_snapshot_id``): a split's base,
#: ``layerflow snapshot``, a compression's undo point. They are tape events, never put in the store.
ENGINE_SNAPSHOT_ID = re.compile(r"snap:(?P<context>.+):(?P<seq>\d+)")


def snapshot_not_found(instance_id: str, snapshot_id: str, known: Iterable[str]) -> ContextKeyError:
    names = sorted(known)
    stored = f"(stored: {', '.join(names[-5:]) or 'none'})"
    engine = ENGINE_SNAPSHOT_ID.fullmatch(snapshot_id)
    if engine is None:
        return ContextKeyError(f"snapshot {snapshot_id!r} is not stored for instance {instance_id!r} {stored}; "
                               "list_snapshots() shows them all")
    # asked for the engine's kind of snapshot: say where it is and the command that rebuilds it
    context, seq = engine["context"], int(engine["seq"])
    command = f"layerflow replay {shlex.quote(instance_id)} --until {seq}"
    if context != "main":
        command += f" --context {shlex.quote(context)}"
    return ContextKeyError(
        f"snapshot {snapshot_id!r} of instance {instance_id!r} is an engine snapshot (a split's base, one "
        f"layerflow snapshot took, a compression's undo point): it lives on the tape of context {context!r}, at #{seq}, not among "
        f"the snapshots put_snapshot stores {stored}. Rebuild it from the tape: `{command}` (REST: GET "
        f"/api/instances/{quote(instance_id, safe='')}/replay?context={quote(context, safe='')}&until={seq}; "
        f"Python: engine.load({instance_id!r}).contexts[{context!r}].get_snapshot({snapshot_id!r}))")


def confirmation_answered(stored: Mapping[str, Any]) -> ConfirmationAnswered:
    return ConfirmationAnswered(
        f"confirmation {stored['id']!r} of instance {stored.get('instance_id')!r} was already answered "
        f"{stored.get('answer')!r} by {stored.get('actor')!r}; an answer is final")


def format_error(what: str, found: Any, newest: int = STORE_FORMAT) -> StoreFormatError:
    return StoreFormatError(f"{what} has store format {found!r}; this layerflow reads format {newest}. "
                            "Upgrade layerflow to read it")


# ========================================================================= record types

class InstanceSummary(TypedDict):
    instance_id: str
    process_id: str
    status: str
    version: int
    created: float
    updated: float


class Confirmation(TypedDict, total=False):
    """A pending human decision. ``id`` and ``instance_id`` are required; the store adds
    ``format``, ``status`` (``"pending"`` | ``"answered"``), ``created`` and, when
    answered, ``answer``, ``actor``, ``answered_at``. ``options`` (values, or dicts with
    a ``value``) restrict the answer when present."""

    id: str
    instance_id: str
    format: int
    status: str
    type: str
    message: str
    options: list[Any]
    task_id: str | None
    created: float
    answer: Any
    actor: str
    answered_at: float


@dataclass(frozen=True, slots=True)
class BlobStats:
    count: int
    bytes: int


TapeAppends = Mapping[str, Sequence[Mapping[str, Any]]]


# ============================================================================= protocol

@runtime_checkable
class Store(Protocol):
    """Where instances, their tapes, snapshots, confirmations and leases live.

    ``memory.MemoryStore`` is the reference implementation; ``tests/stores`` runs one
    contract suite against every backend.
    """

    url: str

    # ----- instances ---------------------------------------------------------------
    def create(self, record: Mapping[str, Any], *, tape_appends: TapeAppends | None = None,
               snapshots: Mapping[str, Mapping[str, Any]] | None = None,
               confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        """Store a new instance (``record["id"]``) at version 1, with its first tape events."""
        ...

    def load(self, instance_id: str) -> tuple[dict[str, Any], int]:
        """``(record, version)``; the record is a fresh dict (mutating it changes nothing)."""
        ...

    def save(self, instance_id: str, record: Mapping[str, Any], expected_version: int,
             tape_appends: TapeAppends | None = None, *,
             snapshots: Mapping[str, Mapping[str, Any]] | None = None,
             confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        """Replace the record, append to tapes, put snapshots and confirmations: all or nothing.

        Raises ``VersionConflict`` when the stored version is not ``expected_version``,
        ``TapeSequenceError`` when an append does not continue its tape exactly.
        Returns the new version (``expected_version + 1``).
        """
        ...

    def list_instances(self, status: str | None = None) -> list[InstanceSummary]:
        """Summaries, oldest first."""
        ...

    def due_instances(self, until: float | datetime) -> list[InstanceSummary]:
        """Summaries of the instances with a pending timer due at or before ``until``
        (seconds since the epoch, or a datetime; one without a zone is UTC), earliest due
        first, ties by instance id.

        It reads the timer index, not the records: per instance, ``timer_due(record)`` of
        its last saved record (the earliest ``due`` of the ``engine.waiting_for`` items of
        kind ``timer`` while ``status`` is ``"waiting"``), kept in the same transaction as
        the record, and dropped with it (``delete``) or when a save leaves no such timer
        (fired, completed, error, cancelled). A store written before the index existed is
        indexed from its records, once, by the first call (``TIMER_INDEX``); a stored
        record whose ``due`` is not ISO 8601 text fails that call with ``InvalidRecord``
        naming the instance and the field. A listed instance has a timer due by ``until``;
        which of its timers are due is in its record.
        """
        ...

    def delete(self, instance_id: str) -> bool:
        """Remove the instance with its tapes, snapshots, blobs, confirmations and lease."""
        ...

    # ----- tapes -------------------------------------------------------------------
    def append_events(self, instance_id: str, context_name: str, events: Sequence[Mapping[str, Any]],
                      expected_version: int | None = None) -> int:
        """Append outside a save (bumps the version, like a save); returns the new version."""
        ...

    def read_tape(self, instance_id: str, context_name: str, since_seq: int = 0) -> list[dict[str, Any]]:
        """Events with ``seq > since_seq`` (pass the last seq you hold), in order, each whole as it
        was appended (its long values are stored in parts, ``tape_parts``, and put back here;
        they come back frozen, shared by the events that hold them)."""
        ...

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        """Context name -> last stored seq."""
        ...

    # ----- snapshots ---------------------------------------------------------------
    def put_snapshot(self, instance_id: str, snapshot_id: str, snapshot: Mapping[str, Any]) -> None:
        """Store (or replace) a snapshot. Parts are content-addressed per instance: a value
        that several snapshots hold is stored once (``split_snapshot``)."""
        ...

    def get_snapshot(self, instance_id: str, snapshot_id: str) -> dict[str, Any]: ...

    def list_snapshots(self, instance_id: str) -> list[str]: ...

    def blob_stats(self, instance_id: str) -> BlobStats:
        """How many distinct parts (of snapshots and of tape events) the instance stores, and their bytes."""
        ...

    # ----- confirmations -----------------------------------------------------------
    def put_confirmation(self, confirmation: Mapping[str, Any]) -> Confirmation:
        """Store a pending confirmation; idempotent: an existing id is left as it is
        (answer included) and returned."""
        ...

    def get_confirmation(self, confirmation_id: str) -> Confirmation: ...

    def list_confirmations(self, instance_id: str | None = None, *, pending_only: bool = True) -> list[Confirmation]:
        ...

    def answer_confirmation(self, confirmation_id: str, answer: Any, actor: str) -> Confirmation:
        """Record the answer; a second answer raises ``ConfirmationAnswered``."""
        ...

    # ----- leases ------------------------------------------------------------------
    def acquire_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        """Take (or extend, if ``owner`` holds it) the lease for ``ttl`` seconds; False if
        another owner holds an unexpired lease."""
        ...

    def renew_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        """Extend a lease ``owner`` still holds; False if it expired and someone else took it."""
        ...

    def release_lease(self, instance_id: str, owner: str) -> bool: ...

    def lease_owner(self, instance_id: str) -> str | None: ...

    def close(self) -> None: ...


# ====================================================================== shared helpers

# one encoder for every write: json.dumps would build it anew for each value
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


#: Compact JSON that keeps dict order (records and events are returned as given); the
#: encoder's C part built once (``canonical.fast_encode``)
dumps = fast_encode(_ENCODER)


def dumps_checked(value: Any, what: str) -> str:
    try:
        return dumps(value)
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"{what} is not JSON-compatible: {exc}; store only None, bool, int, float, str, "
                            "list and dict with str keys") from None


@dataclass(frozen=True, slots=True)
class JSONText:
    """A part of a record that is JSON text already: encoded once, written as it is.

    The engine saves an instance after every activity, and most of its record does not
    change from one save to the next (the process, the workflow's spec, the snapshot a
    branch was forked from). Such a part is encoded once, when it changes, and
    ``prepare_record`` splices its text into the record instead of encoding the value
    again. It loads back as the value it encodes; the record keeps its shape.

    It stands as a value of a dict: the record, or a dict in it (at any depth, through
    dicts only). In a list it is an error (``InvalidRecord``), never a string. ``text``
    must be valid JSON: make it with ``json_text`` (which checks the value), or from the
    output of a JSON encoder run with ``allow_nan=False``.
    """

    text: str


def json_text(value: Any, what: str) -> JSONText:
    """``value`` encoded as a record part; ``InvalidRecord`` naming ``what`` when it is not JSON."""
    return JSONText(dumps_checked(value, what))


@dataclass(frozen=True, slots=True)
class PreparedRecord:
    """A record checked and encoded once, for any backend."""

    instance_id: str
    process_id: str
    status: str
    text: str
    due: float | None = None  # the timer index value: timer_due(record)
    # the record's own "created" / "updated" (an engine record's, by the engine's clock): what the store
    # lists; None for a record without them, which the store stamps by its own clock
    created: float | None = None
    updated: float | None = None

    def stamp(self, name: str, now: Callable[[], float]) -> float:
        """The record's ``created`` or ``updated``, else ``now()``."""
        given: float | None = getattr(self, name)
        return given if given is not None else now()


@dataclass(frozen=True, slots=True)
class PreparedAppend:
    context: str
    first_seq: int
    events: tuple[str, ...]  # stored JSON text (tape_parts), seq first_seq, first_seq + 1, ...
    parts: Mapping[str, str] = field(default_factory=dict)  # sha256 -> JSON: the parts the events name

    @property
    def last_seq(self) -> int:
        return self.first_seq + len(self.events) - 1


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    snapshot_id: str
    manifest: str
    blobs: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class PreparedWrite:
    """Everything one create/save/append writes, checked before any backend is touched."""

    record: PreparedRecord | None
    appends: tuple[PreparedAppend, ...]
    snapshots: tuple[PreparedSnapshot, ...]
    confirmations: tuple[tuple[str, str], ...]  # (id, JSON text)


def prepare_record(record: Mapping[str, Any], instance_id: str | None = None) -> PreparedRecord:
    if not isinstance(record, Mapping):
        raise InvalidRecord(f"an instance record is a dict, got {type(record).__name__}")
    rid = record.get("id")
    if not isinstance(rid, str) or not rid:
        raise InvalidRecord(f"an instance record needs a non-empty str 'id', got {rid!r}")
    if instance_id is not None and rid != instance_id:
        raise InvalidRecord(f"record id {rid!r} does not match the instance id {instance_id!r} it is saved as")
    fields = {}
    for name in ("process_id", "status"):
        value = record.get(name)
        if not isinstance(value, str):
            raise InvalidRecord(f"instance record {rid!r} needs a str {name!r}, got {value!r}")
        fields[name] = value
    text = encode_record(record, f"instance record {rid!r}")
    return PreparedRecord(rid, fields["process_id"], fields["status"], text,
                          timer_due(record, "write each due time as datetime.isoformat() text"),
                          _moment(record.get("created")), _moment(record.get("updated")))


def _moment(value: Any) -> float | None:
    """A record's time field as seconds since the epoch, or None when it holds no finite number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def timer_due(record: Mapping[str, Any], fix: str = "cancel the instance (layerflow cancel ID --reason ...) "
              "or delete it") -> float | None:
    """The timer index value of an instance record: the earliest ``due`` (ISO 8601 text; one
    without a zone is UTC) of its ``engine.waiting_for`` items of kind ``timer`` (and ``confirmation``:
    a timeout), in seconds
    since the epoch; None while the record's ``status`` is not ``"waiting"`` or it waits
    for no timer with a due time. This is the one place the stores read the engine's part
    of a record (a mapping here: nothing of the engine is imported).

    A due time that is not ISO 8601 text raises ``InvalidRecord`` naming the instance and
    the field, and saying what to do (``fix``): a timer the index cannot place would never
    be found, so a save refuses it rather than keep it silently.

    An instance's clock never runs behind the latest time it has seen, its record's ``created``
    and ``updated``: a timer due by then is due whatever the clock of whoever asks (an engine
    whose clock is behind the one that saved the record), so it is indexed ``DUE_AT_ONCE``.
    """
    if record.get("status") != "waiting":
        return None
    engine = record.get("engine")
    if isinstance(engine, JSONText):
        engine = json.loads(engine.text)
    waiting = engine.get("waiting_for") if isinstance(engine, Mapping) else None
    if not waiting:
        return None
    rid = record.get("id")
    if not isinstance(waiting, (list, tuple)):
        raise InvalidRecord(f"instance record {rid!r}: engine.waiting_for is a {type(waiting).__name__}, not a "
                            f"list of items; {fix}")
    earliest: float | None = None
    for n, item in enumerate(waiting):
        if not isinstance(item, Mapping) or item.get("kind") not in ("timer", "confirmation") or not item.get("due"):
            continue  # no due time (SpiffWorkflow could not tell one): nothing to index, as nothing is listed
        when = _seconds(item["due"])
        if when is None:
            raise InvalidRecord(f"instance record {rid!r}: engine.waiting_for[{n}].due is {item['due']!r}, not an "
                                "ISO 8601 time such as '2026-01-05T09:00:00+00:00', so the timer index cannot place "
                                f"its timer; {fix}")
        earliest = when if earliest is None else min(earliest, when)
    seen = max((t for t in (_moment(record.get("created")), _moment(record.get("updated"))) if t is not None),
               default=None)
    if earliest is not None and seen is not None and earliest <= seen:
        return DUE_AT_ONCE
    return earliest


def _seconds(due: Any) -> float | None:
    """ISO 8601 text (no zone: UTC) -> seconds since the epoch; None when it is not that."""
    if not isinstance(due, str):
        return None
    try:
        when = datetime.fromisoformat(due)
        return (when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)).timestamp()
    except (ValueError, OverflowError):
        return None


def until_seconds(until: float | datetime) -> float:
    """``due_instances``' bound as seconds since the epoch (a datetime without a zone is UTC)."""
    if isinstance(until, datetime):
        return (until if until.tzinfo is not None else until.replace(tzinfo=timezone.utc)).timestamp()
    if isinstance(until, bool) or not isinstance(until, (int, float)) or math.isnan(until):
        raise TypeError(f"due_instances(until={until!r}): give seconds since the epoch (time.time()) or a datetime")
    return float(until)


def encode_record(record: Mapping[str, Any], what: str) -> str:
    """The JSON text of ``record``, with its ``JSONText`` parts spliced in as they are."""
    if not isinstance(record, dict):
        return dumps_checked(record, what)
    out: list[str] = []
    _encode_into(out, record, what, ())
    return "".join(out)  # the one copy of the parts' text


def _encode_into(out: list[str], value: dict[Any, Any], what: str, path: tuple[Any, ...]) -> None:
    """Append the JSON text of ``value`` to ``out``: ``JSONText`` parts as they are, dicts that
    hold some the same way, strings, ints, bools and None (a context head's fields) written
    here, each run of other items in one encoder call, in order."""
    out.append("{")
    sep = ""
    plain: dict[Any, Any] = {}
    scalars = _SCALAR_JSON
    for key, item in value.items():
        kind = type(item)
        if kind is not JSONText and not (kind is dict and _holds_text(item)):
            scalar = scalars.get(kind) if type(key) is str and not plain else None
            if scalar is None:
                plain[key] = item  # for a few of them an encoder call costs more than the items
            else:
                out += (sep, encode_basestring(key), ":", scalar(item))
                sep = ","
            continue
        if not isinstance(key, str):
            raise InvalidRecord(f"{_part(what, path)} has the key {key!r} before a JSON text part; keys are str")
        if plain:
            out += (sep, _plain_items(plain, what, path), ",")
            plain = {}
        else:
            out.append(sep)
        out += (encode_basestring(key), ":")
        sep = ","
        if kind is JSONText:
            out.append(item.text)
        else:
            _encode_into(out, item, what, (*path, key))
    if plain:
        out += (sep, _plain_items(plain, what, path))
    out.append("}")


def _holds_text(value: dict[Any, Any]) -> bool:
    for item in value.values():
        if type(item) is JSONText or (type(item) is dict and _holds_text(item)):
            return True
    return False


_SCALAR_JSON: dict[type, Callable[[Any], str]] = {
    str: encode_basestring, int: int.__repr__, bool: lambda v: "true" if v else "false", type(None): lambda v: "null"}


def _plain_items(items: dict[Any, Any], what: str, path: tuple[Any, ...]) -> str:
    """``"k":v,...`` for a run of items, or ``InvalidRecord`` naming where they are."""
    try:
        return dumps(items)[1:-1]
    except (TypeError, ValueError):
        return dumps_checked(items, _part(what, path))[1:-1]  # raises, with the message


def _part(what: str, path: tuple[Any, ...]) -> str:
    return what + "".join(f"[{key!r}]" for key in path)


def prepare_append(instance_id: str, context: str, events: Sequence[Mapping[str, Any]],
                   part_bytes: int | None = PART_BYTES) -> PreparedAppend | None:
    """The events checked and encoded as stored (``tape_parts``; ``part_bytes=None``: every
    value whole)."""
    if not isinstance(context, str) or not context:
        raise InvalidRecord(f"tape appends of instance {instance_id!r} need a non-empty str context name, got {context!r}")
    if not events:
        return None
    seqs = []
    for event in events:
        if not isinstance(event, Mapping):
            raise InvalidRecord(f"events appended to tape {context!r} of instance {instance_id!r} are JSON objects, "
                                f"got {type(event).__name__}; pass Event.to_dict() of each (ctx.tape.to_list())")
        seq = event.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
            raise InvalidRecord(f"every event appended to tape {context!r} of instance {instance_id!r} needs an int "
                                f"'seq' >= 1, got {seq!r}")
        seqs.append(seq)
    for prev, seq in zip(seqs, seqs[1:]):
        if seq != prev + 1:
            raise TapeSequenceError(f"events appended to tape {context!r} of instance {instance_id!r} must have "
                                    f"consecutive seqs; {seq} follows {prev}. Nothing was written")
    writer = PartWriter(part_bytes)
    try:
        texts = tuple(map(writer.text, events))
    except (TypeError, ValueError):
        for e in events:  # which one
            dumps_checked(e, f"event {e['seq']} of tape {context!r}")
        raise
    return PreparedAppend(context, seqs[0], texts, writer.parts)


def prepare_confirmation(confirmation: Mapping[str, Any], instance_id: str | None = None,
                         now: float | None = None) -> tuple[str, str]:
    cid = confirmation.get("id") if isinstance(confirmation, Mapping) else None
    if not isinstance(cid, str) or not cid:
        raise InvalidRecord(f"a confirmation needs a non-empty str 'id', got {cid!r}")
    iid = confirmation.get("instance_id", instance_id)
    if not isinstance(iid, str) or (instance_id is not None and iid != instance_id):
        raise InvalidRecord(f"confirmation {cid!r} needs 'instance_id' {instance_id or 'of its instance'!r}, got {iid!r}")
    stored = {**confirmation, "instance_id": iid, "format": STORE_FORMAT, "status": "pending",
              "created": confirmation.get("created", now if now is not None else time.time())}
    for key in ("answer", "actor", "answered_at"):
        stored.pop(key, None)
    return cid, dumps_checked(stored, f"confirmation {cid!r}")


def prepare_write(instance_id: str | None, record: Mapping[str, Any] | None, tape_appends: TapeAppends | None,
                  snapshots: Mapping[str, Mapping[str, Any]] | None,
                  confirmations: Sequence[Mapping[str, Any]], part_bytes: int | None = PART_BYTES) -> PreparedWrite:
    prepared = prepare_record(record, instance_id) if record is not None else None
    iid = instance_id if instance_id is not None else prepared.instance_id  # type: ignore[union-attr]
    appends = tuple(a for a in (prepare_append(iid, ctx, evs, part_bytes) for ctx, evs in (tape_appends or {}).items())
                    if a)
    snaps = tuple(PreparedSnapshot(sid, *split_snapshot(s)) for sid, s in (snapshots or {}).items())
    now = time.time()
    confs = tuple(prepare_confirmation(c, iid, now) for c in confirmations)
    return PreparedWrite(prepared, appends, snaps, confs)


def answered(stored: Mapping[str, Any], answer: Any, actor: str) -> dict[str, Any]:
    """The answered form of a pending confirmation, or the error a second answer / a
    value outside ``options`` raises."""
    if stored.get("status") == "answered":
        raise confirmation_answered(stored)
    options = stored.get("options") or []
    allowed = [o.get("value", o.get("id")) if isinstance(o, Mapping) else o for o in options]
    if allowed and not any(json_equal(answer, a) for a in allowed):
        raise InvalidAnswer(f"answer {answer!r} to confirmation {stored['id']!r} is not one of its options "
                            f"{allowed!r}; answer one of them")
    dumps_checked(answer, f"answer to confirmation {stored['id']!r}")
    return {**stored, "status": "answered", "answer": answer, "actor": actor, "answered_at": time.time()}


def record_json(text: str | bytes, instance_id: str, where: str) -> dict[str, Any]:
    """The saved record of ``instance_id`` read from ``text``; ``InvalidRecord`` naming the
    instance and ``where`` (the store, the key) when it is not a JSON object: something else wrote
    over it (a hand edit, another program on the same Redis), and nothing can run it from that."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        why = f"is not valid JSON ({exc})"
    else:
        if isinstance(doc, dict):
            return doc
        why = f"is a JSON {type(doc).__name__}, not an object"
    raise InvalidRecord(f"the saved record of instance {instance_id!r} in {where} {why}: it was written over by "
                           "something other than layerflow and cannot be loaded; restore the instance from a backup of "
                           "the store (layerflow never writes a record partly)")


def check_format(what: str, found: Any, newest: int = STORE_FORMAT) -> None:
    if found is not None and int(found) > newest:
        raise format_error(what, found, newest)


# ================================================================ content addressing

_REF, _LIT = "$blob", "$lit"


def split_snapshot(snapshot: Mapping[str, Any], min_bytes: int = BLOB_MIN_BYTES) -> tuple[str, dict[str, str]]:
    """``(manifest JSON, {sha256: part JSON})``: a Merkle DAG of the snapshot.

    Bottom-up, every part (a string, list or dict, anywhere in the snapshot) whose JSON
    is at least ``min_bytes`` long is replaced by ``{"$blob": sha256}`` and stored once
    per instance under that hash. Two snapshots that hold the same large value (the same
    document in KNOWLEDGE, the same HISTORY entry) therefore share its one stored copy,
    and a snapshot that changes one key stores only that value and the small parts
    (lists / maps of hashes) on its path to the root. Small values stay inline. A user
    dict that looks like a reference (``{"$blob": ...}``, ``{"$lit": ...}``) is escaped
    as ``{"$lit": dict}``. Parts keep their key order, so a snapshot round-trips exactly.
    """
    blobs: dict[str, str] = {}

    def split(value: Any) -> Any:
        if isinstance(value, Mapping):
            node: Any = {k: split(v) for k, v in value.items()}
            if len(value) == 1 and (_REF in value or _LIT in value):
                node = {_LIT: node}
        elif isinstance(value, (list, tuple)):
            node = [split(v) for v in value]
        elif isinstance(value, str):
            node = value
        else:
            return value
        text = dumps(node)
        if len(text) < min_bytes:
            return node
        digest = hashlib.sha256(text.encode()).hexdigest()
        blobs[digest] = text
        return {_REF: digest}

    if not isinstance(snapshot, Mapping):
        raise InvalidRecord(f"a snapshot is a dict, got {type(snapshot).__name__}")
    try:
        root = split(snapshot)
    except (TypeError, ValueError) as exc:
        raise InvalidRecord(f"snapshot is not JSON-compatible: {exc}") from None
    return dumps({"format": STORE_FORMAT, "root": root}), blobs


def _refs(node: Any, out: set[str]) -> None:
    if isinstance(node, dict):
        if len(node) == 1 and _REF in node:
            out.add(node[_REF])
            return
        if len(node) == 1 and _LIT in node:
            node = node[_LIT]  # an escaped user dict: its values may hold refs, it is none itself
        for v in node.values():
            _refs(v, out)
    elif isinstance(node, list):
        for v in node:
            _refs(v, out)


def join_snapshot(manifest: str, fetch: Callable[[Iterable[str]], Mapping[str, str]], what: str) -> dict[str, Any]:
    """Rebuild a snapshot from its manifest; ``fetch(hashes)`` returns the blob texts
    (one round trip per level of the DAG)."""
    doc = json.loads(manifest)
    check_format(what, doc.get("format"))
    parts: dict[str, Any] = {}
    wanted: set[str] = set()
    _refs(doc["root"], wanted)
    fetch_parts(fetch, wanted, _refs, parts, what)

    def join(node: Any) -> Any:
        if isinstance(node, dict):
            if len(node) == 1 and _REF in node:
                return join(parts[node[_REF]])
            if len(node) == 1 and _LIT in node:
                return {k: join(v) for k, v in node[_LIT].items()}
            return {k: join(v) for k, v in node.items()}
        if isinstance(node, list):
            return [join(v) for v in node]
        return node

    result = join(doc["root"])
    if not isinstance(result, dict):
        raise StoreError(f"{what} does not hold a dict; the store is damaged")
    return result


def summary(instance_id: str, process_id: str, status: str, version: int, created: float,
            updated: float) -> InstanceSummary:
    return InstanceSummary(instance_id=instance_id, process_id=process_id, status=status, version=version,
                           created=created, updated=updated)


def check_ttl(ttl: float) -> float:
    if not ttl > 0:
        raise InvalidRecord(f"a lease ttl is a positive number of seconds, got {ttl!r}")
    return float(ttl)
