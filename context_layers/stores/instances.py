"""Saving an engine record whose contexts carry their whole tapes, incrementally.

The engine's record holds ``contexts: {name: LayeredContext.to_dict()}``, each with
its full ``tape``. Storing that on every save would rewrite every event every time.
``save_instance`` stores each context without its tape (plus ``tape_length``, the cut
this record was taken at) and appends only the events after the stored tape heads, in
the same atomic save. ``load_instance`` puts the tapes back, cut at ``tape_length``, so
a record and its tapes always come from the same version even while others save.
"""

from __future__ import annotations

import builtins
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .base import Confirmation, InstanceSummary, Store, TapeSequenceError, version_conflict

__all__ = ["InstanceRecords", "save_instance", "load_instance", "split_tapes"]


def split_tapes(record: Mapping[str, Any], heads: Mapping[str, int]) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """``(record without tapes, {context: events after heads[context]})``."""
    contexts: dict[str, Any] = {}
    appends: dict[str, list[Any]] = {}
    for name, ctx in (record.get("contexts") or {}).items():
        tape = ctx.get("tape", ())
        if not isinstance(tape, (list, tuple)):
            tape = list(tape)
        last = tape[-1]["seq"] if tape else 0
        stored = heads.get(name, 0)
        if last < stored:
            raise TapeSequenceError(
                f"context {name!r} of instance {record.get('id')!r} holds events up to seq {last}, but the store "
                f"already has {stored}; this record was built from an older load. Reload the instance and retry")
        # seqs run 1, 2, ... so the new events are a slice; filter only if a tape is odd
        new = tape[stored:]
        if new and new[0]["seq"] != stored + 1:
            new = [e for e in tape if e["seq"] > stored]
        appends[name] = new
        contexts[name] = {**{k: v for k, v in ctx.items() if k != "tape"}, "tape_length": last}
    return {**record, "contexts": contexts}, {k: v for k, v in appends.items() if v}


def save_instance(store: Store, record: Mapping[str, Any], expected_version: int = 0, **kwargs: Any) -> int:
    """Create (``expected_version=0``) or save ``record``; returns the new version.

    ``kwargs`` (``snapshots=``, ``confirmations=``) go to ``create`` / ``save`` and
    commit with it. Raises ``VersionConflict`` as ``save`` does.
    """
    return _save(store, record, expected_version, None, **kwargs)[0]


def _save(store: Store, record: Mapping[str, Any], expected_version: int, heads: Mapping[str, int] | None,
          **kwargs: Any) -> tuple[int, dict[str, int]]:
    """``save_instance`` given the stored tape heads at ``expected_version`` when the caller
    knows them (None: read them); returns the new version and the heads at it."""
    if expected_version == 0:
        head, appends = split_tapes(record, {})
        version = store.create(head, tape_appends=appends, **kwargs)
        return version, _after({}, appends)
    iid = record["id"]
    # Heads read outside the save are safe: every tape change bumps the version, so if
    # they moved since ``expected_version`` the save below raises VersionConflict.
    if heads is None:
        heads = store.tape_heads(iid)
    try:
        head, appends = split_tapes(record, heads)
    except TapeSequenceError:
        # the stored tapes are ahead of this record: normally because someone saved since
        # it was loaded, which is a version conflict, not a broken tape
        actual = store.load(iid)[1]
        if actual != expected_version:
            raise version_conflict(iid, expected_version, actual) from None
        raise
    version = store.save(iid, head, expected_version, appends, **kwargs)
    return version, _after(heads, appends)


def _after(heads: Mapping[str, int], appends: Mapping[str, list[Any]]) -> dict[str, int]:
    """The tape heads once ``appends`` went in on top of ``heads``."""
    return {**heads, **{name: events[-1]["seq"] for name, events in appends.items()}}


def load_instance(store: Store, instance_id: str) -> tuple[dict[str, Any], int]:
    """``(record with full tapes, version)``, the inverse of ``save_instance``."""
    record, version = store.load(instance_id)
    for name, ctx in (record.get("contexts") or {}).items():
        length = ctx.pop("tape_length", None)
        if length is None:  # saved with its tape inline (plain store.save)
            continue
        ctx["tape"] = [e for e in store.read_tape(instance_id, name) if e["seq"] <= length]
    return record, version


class InstanceRecords:
    """The engine's record-at-a-time view of a ``Store``: ``create(record)``, ``load(id)``
    (the record with its ``version`` inside), ``save(record, expected_version)``, ``list()``;
    tapes go in incrementally (``save_instance``) and come back whole (``load_instance``).

    It remembers the tape heads its own last write left, per instance (the most recent
    ``HEADS_KEPT``): a save on the version that write returned uses them instead of asking
    the store (a round trip to Redis). They are exact: only a write bumps the version, so
    the store holds these heads as long as it holds that version, and a save on it fails
    with ``VersionConflict`` once someone else wrote.
    """

    HEADS_KEPT = 256

    def __init__(self, store: Store) -> None:
        self.store = store
        self.url = store.url
        self._heads: dict[str, tuple[int, dict[str, int]]] = {}  # id -> (version, tape heads at it)
        self._heads_lock = threading.Lock()

    def create(self, record: Mapping[str, Any]) -> int:
        version, heads = _save(self.store, _without_version(record), 0, None)
        self._remember(record["id"], version, heads)
        return version

    def load(self, instance_id: str) -> dict[str, Any]:
        record, version = load_instance(self.store, instance_id)
        record["version"] = version
        return record

    def load_head(self, instance_id: str) -> dict[str, Any]:
        """The record without its tapes (``version`` inside): what a listing reads; no tape is read."""
        record, version = self.store.load(instance_id)
        record["version"] = version
        return record

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        iid = record["id"]
        with self._heads_lock:
            known = self._heads.pop(iid, None)
        heads = known[1] if known is not None and known[0] == expected_version else None
        version, heads = _save(self.store, _without_version(record), expected_version, heads)
        self._remember(iid, version, heads)
        return version

    def _remember(self, instance_id: str, version: int, heads: dict[str, int]) -> None:
        with self._heads_lock:
            self._heads[instance_id] = (version, heads)
            while len(self._heads) > self.HEADS_KEPT:
                del self._heads[next(iter(self._heads))]  # the least recently written

    def list_due(self, until: float | datetime) -> list[dict[str, Any]]:
        """The rows of ``list()`` (same shape, same order) of the instances with a timer due by
        ``until``, found by the store's timer index (``Store.due_instances``), not by a scan."""
        oldest_first = sorted(self.store.due_instances(until), key=lambda s: (s["created"], s["instance_id"]))
        return _rows(oldest_first)

    def list(self) -> list[dict[str, Any]]:
        """Summaries ``{"id", "process_id", "status", "version", "updated"}``, newest first."""
        return _rows(self.store.list_instances())

    def close(self) -> None:
        self.store.close()

    # The rest of the ``Store`` protocol, as the store has it: tapes, snapshots, confirmations,
    # summaries (``create``/``load``/``save`` above take and give whole records instead).
    def list_instances(self, status: str | None = None) -> builtins.list[InstanceSummary]:
        return self.store.list_instances(status)

    def due_instances(self, until: float | datetime) -> builtins.list[InstanceSummary]:
        return self.store.due_instances(until)

    def delete(self, instance_id: str) -> bool:
        with self._heads_lock:
            self._heads.pop(instance_id, None)
        return self.store.delete(instance_id)

    def append_events(self, instance_id: str, context_name: str, events: Sequence[Mapping[str, Any]],
                      expected_version: int | None = None) -> int:
        with self._heads_lock:
            self._heads.pop(instance_id, None)  # the heads remembered are no longer the store's
        return self.store.append_events(instance_id, context_name, events, expected_version)

    def read_tape(self, instance_id: str, context_name: str, since_seq: int = 0) -> builtins.list[dict[str, Any]]:
        return self.store.read_tape(instance_id, context_name, since_seq)

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        return self.store.tape_heads(instance_id)

    def put_snapshot(self, instance_id: str, snapshot_id: str, snapshot: Mapping[str, Any]) -> None:
        self.store.put_snapshot(instance_id, snapshot_id, snapshot)

    def get_snapshot(self, instance_id: str, snapshot_id: str) -> dict[str, Any]:
        return self.store.get_snapshot(instance_id, snapshot_id)

    def list_snapshots(self, instance_id: str) -> builtins.list[str]:
        return self.store.list_snapshots(instance_id)

    def put_confirmation(self, confirmation: Mapping[str, Any]) -> Confirmation:
        return self.store.put_confirmation(confirmation)

    def get_confirmation(self, confirmation_id: str) -> Confirmation:
        return self.store.get_confirmation(confirmation_id)

    def list_confirmations(self, instance_id: str | None = None, *, pending_only: bool = True) -> builtins.list[Confirmation]:
        return self.store.list_confirmations(instance_id, pending_only=pending_only)

    def answer_confirmation(self, confirmation_id: str, answer: Any, actor: str) -> Confirmation:
        return self.store.answer_confirmation(confirmation_id, answer, actor)


def _rows(summaries: Iterable[InstanceSummary]) -> list[dict[str, Any]]:
    """``list()`` rows of store summaries given oldest first (``list_instances`` order): newest first."""
    rows = [{"id": s["instance_id"], "process_id": s["process_id"], "status": s["status"],
             "version": s["version"], "updated": s["updated"]} for s in summaries]
    return sorted(rows, key=lambda r: r["updated"], reverse=True)


def _without_version(record: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in record.items() if k != "version"}
