"""The reference ``Store``: plain dicts behind one lock, in this process only.

Values are kept as JSON text, as the other backends keep them, so a caller can never
change stored state by mutating what it passed in or got back.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .base import (
    INSTANCE_FORMAT,
    BlobStats,
    Confirmation,
    ConfirmationNotFound,
    InstanceExists,
    InstanceNotFound,
    InstanceSummary,
    PreparedWrite,
    TapeAppends,
    answered,
    check_ttl,
    dumps,
    join_snapshot,
    prepare_append,
    prepare_confirmation,
    prepare_write,
    snapshot_not_found,
    split_snapshot,
    summary,
    tape_gap,
    until_seconds,
    version_conflict,
)
from .tape_parts import PART_BYTES, read_events

__all__ = ["MemoryStore"]


@dataclass
class _Instance:
    record: str
    process_id: str
    status: str
    version: int
    created: float
    updated: float
    format: int = INSTANCE_FORMAT
    due: float | None = None  # the timer index: timer_due of the record
    tapes: dict[str, list[str]] = field(default_factory=dict)
    snapshots: dict[str, str] = field(default_factory=dict)
    blobs: dict[str, str] = field(default_factory=dict)


class MemoryStore:
    def __init__(self, url: str = "memory://", *, clock: Callable[[], float] = time.time,
                 tape_part_bytes: int | None = PART_BYTES) -> None:
        self.url = url
        self._clock = clock
        self._part_bytes = tape_part_bytes  # None: tape values stored whole (tape_parts)
        self._lock = threading.RLock()
        self._instances: dict[str, _Instance] = {}
        self._confirmations: dict[str, str] = {}
        self._leases: dict[str, tuple[str, float]] = {}

    def __repr__(self) -> str:
        return f"<MemoryStore {self.url} {len(self._instances)} instances>"

    def _get(self, instance_id: str) -> _Instance:
        inst = self._instances.get(instance_id)
        if inst is None:
            raise InstanceNotFound(instance_id)
        return inst

    # ----- instances -----------------------------------------------------------------

    def create(self, record: Mapping[str, Any], *, tape_appends: TapeAppends | None = None,
               snapshots: Mapping[str, Mapping[str, Any]] | None = None,
               confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        w = prepare_write(None, record, tape_appends, snapshots, confirmations, self._part_bytes)
        assert w.record is not None
        with self._lock:
            if w.record.instance_id in self._instances:
                raise InstanceExists(f"instance {w.record.instance_id!r} already exists; load and save it, "
                                     "or create it under a new id")
            created = w.record.stamp("created", self._clock)
            inst = _Instance(w.record.text, w.record.process_id, w.record.status, 0, created,
                             w.record.stamp("updated", lambda: created), due=w.record.due)
            self._check_appends(w.record.instance_id, inst, w)
            self._instances[w.record.instance_id] = inst
            self._apply(w.record.instance_id, inst, w)
            return inst.version

    def load(self, instance_id: str) -> tuple[dict[str, Any], int]:
        with self._lock:
            inst = self._get(instance_id)
            return json.loads(inst.record), inst.version

    def save(self, instance_id: str, record: Mapping[str, Any], expected_version: int,
             tape_appends: TapeAppends | None = None, *,
             snapshots: Mapping[str, Mapping[str, Any]] | None = None,
             confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        w = prepare_write(instance_id, record, tape_appends, snapshots, confirmations, self._part_bytes)
        return self._write(instance_id, w, expected_version)

    def _write(self, instance_id: str, w: PreparedWrite, expected_version: int | None) -> int:
        with self._lock:
            inst = self._get(instance_id)
            if expected_version is not None and inst.version != expected_version:
                raise version_conflict(instance_id, expected_version, inst.version)
            self._check_appends(instance_id, inst, w)
            self._apply(instance_id, inst, w)
            return inst.version

    @staticmethod
    def _check_appends(instance_id: str, inst: _Instance, w: PreparedWrite) -> None:
        for a in w.appends:
            last = len(inst.tapes.get(a.context, ()))
            if a.first_seq != last + 1:
                raise tape_gap(instance_id, a.context, a.first_seq, last)

    def _apply(self, instance_id: str, inst: _Instance, w: PreparedWrite) -> None:
        if w.record is not None:
            inst.record, inst.process_id, inst.status = w.record.text, w.record.process_id, w.record.status
            inst.due = w.record.due
        for a in w.appends:
            inst.tapes.setdefault(a.context, []).extend(a.events)
            for digest, text in a.parts.items():
                inst.blobs.setdefault(digest, text)
        for s in w.snapshots:
            for digest, text in s.blobs.items():
                inst.blobs.setdefault(digest, text)
            inst.snapshots[s.snapshot_id] = s.manifest
        for cid, text in w.confirmations:
            self._confirmations.setdefault(cid, text)
        inst.version += 1
        inst.updated = w.record.stamp("updated", self._clock) if w.record is not None else self._clock()

    def list_instances(self, status: str | None = None) -> list[InstanceSummary]:
        with self._lock:
            items = [(iid, i) for iid, i in self._instances.items() if status is None or i.status == status]
            return [summary(iid, i.process_id, i.status, i.version, i.created, i.updated)
                    for iid, i in sorted(items, key=lambda kv: (kv[1].created, kv[0]))]

    def count_instances(self) -> int:
        """How many instances the store holds (not part of ``Store``: a worker's start line)."""
        with self._lock:
            return len(self._instances)

    def due_instances(self, until: float | datetime) -> list[InstanceSummary]:
        # every record came through _apply, so the index is whole: a scan of the instances
        # (no record decoded) is all an in-process store needs
        bound = until_seconds(until)
        with self._lock:
            due = [(i.due, iid, i) for iid, i in self._instances.items() if i.due is not None and i.due <= bound]
            return [summary(iid, i.process_id, i.status, i.version, i.created, i.updated)
                    for _, iid, i in sorted(due, key=lambda d: d[:2])]

    def delete(self, instance_id: str) -> bool:
        with self._lock:
            if self._instances.pop(instance_id, None) is None:
                return False
            for cid in [c for c, t in self._confirmations.items() if json.loads(t)["instance_id"] == instance_id]:
                del self._confirmations[cid]
            self._leases.pop(instance_id, None)
            return True

    # ----- tapes -----------------------------------------------------------------------

    def append_events(self, instance_id: str, context_name: str, events: Sequence[Mapping[str, Any]],
                      expected_version: int | None = None) -> int:
        a = prepare_append(instance_id, context_name, events, self._part_bytes)
        return self._write(instance_id, PreparedWrite(None, (a,) if a else (), (), ()), expected_version)

    def read_tape(self, instance_id: str, context_name: str, since_seq: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            inst = self._get(instance_id)
            texts = inst.tapes.get(context_name, [])[max(since_seq, 0):]

            def fetch(hashes: Iterable[str]) -> dict[str, str]:
                return {h: inst.blobs[h] for h in hashes if h in inst.blobs}

            return read_events(texts, fetch, f"tape {context_name!r} of instance {instance_id!r}")

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        with self._lock:
            return {ctx: len(t) for ctx, t in self._get(instance_id).tapes.items()}

    # ----- snapshots ---------------------------------------------------------------------

    def put_snapshot(self, instance_id: str, snapshot_id: str, snapshot: Mapping[str, Any]) -> None:
        manifest, blobs = split_snapshot(snapshot)
        with self._lock:
            inst = self._get(instance_id)
            for digest, text in blobs.items():
                inst.blobs.setdefault(digest, text)
            inst.snapshots[snapshot_id] = manifest

    def get_snapshot(self, instance_id: str, snapshot_id: str) -> dict[str, Any]:
        with self._lock:
            inst = self._get(instance_id)
            manifest = inst.snapshots.get(snapshot_id)
            if manifest is None:
                raise snapshot_not_found(instance_id, snapshot_id, inst.snapshots)

            def fetch(hashes: Iterable[str]) -> dict[str, str]:
                return {h: inst.blobs[h] for h in hashes if h in inst.blobs}

            return join_snapshot(manifest, fetch, f"snapshot {snapshot_id!r} of instance {instance_id!r}")

    def list_snapshots(self, instance_id: str) -> list[str]:
        with self._lock:
            return sorted(self._get(instance_id).snapshots)

    def blob_stats(self, instance_id: str) -> BlobStats:
        with self._lock:
            blobs = self._get(instance_id).blobs
            return BlobStats(len(blobs), sum(len(t.encode()) for t in blobs.values()))

    # ----- confirmations -------------------------------------------------------------------

    def put_confirmation(self, confirmation: Mapping[str, Any]) -> Confirmation:
        cid, text = prepare_confirmation(confirmation)
        with self._lock:
            self._get(json.loads(text)["instance_id"])
            return json.loads(self._confirmations.setdefault(cid, text))  # type: ignore[no-any-return]

    def get_confirmation(self, confirmation_id: str) -> Confirmation:
        with self._lock:
            text = self._confirmations.get(confirmation_id)
            if text is None:
                raise ConfirmationNotFound(confirmation_id)
            return json.loads(text)  # type: ignore[no-any-return]

    def list_confirmations(self, instance_id: str | None = None, *, pending_only: bool = True) -> list[Confirmation]:
        with self._lock:
            items = [json.loads(t) for t in self._confirmations.values()]
        return sorted((c for c in items if (instance_id is None or c["instance_id"] == instance_id)
                       and (not pending_only or c["status"] == "pending")), key=lambda c: (c["created"], c["id"]))

    def answer_confirmation(self, confirmation_id: str, answer: Any, actor: str) -> Confirmation:
        with self._lock:
            new = answered(self.get_confirmation(confirmation_id), answer, actor)
            self._confirmations[confirmation_id] = dumps(new)
            return new  # type: ignore[return-value]

    # ----- leases --------------------------------------------------------------------------

    def acquire_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        ttl = check_ttl(ttl)
        with self._lock:
            now = self._clock()
            held = self._leases.get(instance_id)
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self._leases[instance_id] = (owner, now + ttl)
            return True

    def renew_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        ttl = check_ttl(ttl)
        with self._lock:
            now = self._clock()
            held = self._leases.get(instance_id)
            if held is None or held[0] != owner or held[1] <= now:
                return False
            self._leases[instance_id] = (owner, now + ttl)
            return True

    def release_lease(self, instance_id: str, owner: str) -> bool:
        with self._lock:
            held = self._leases.get(instance_id)
            if held is None or held[0] != owner:
                return False
            del self._leases[instance_id]
            return held[1] > self._clock()

    def lease_owner(self, instance_id: str) -> str | None:
        with self._lock:
            held = self._leases.get(instance_id)
            return held[0] if held is not None and held[1] > self._clock() else None

    def close(self) -> None:
        pass

    def __enter__(self) -> "MemoryStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

