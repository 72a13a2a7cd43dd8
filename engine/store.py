"""Where instances are kept between runs: the engine's view of a ``context_layers.stores`` backend.

A record is a JSON-able dict (``engine.runtime.to_record``: the serialized workflow,
every context's tape, the engine's bookkeeping) with a ``format`` field; parts that are
JSON already (``JSONText``: the workflow, the process, the snapshots a context carries)
are written as they are and load back as the values they encode. The store
owns its ``version``: ``create`` returns 1; ``save(record, expected_version)`` returns
the next version, or raises ``VersionConflict`` when someone else saved since
(optimistic concurrency: load again and retry). Tape events are appended
incrementally and atomically with the save they belong to.

Backends by URL (``context_layers.stores.open_store``): ``memory://`` (``memory://NAME``
shared within a process), ``sqlite:///path.db`` (the CLI default, a file in the user's
data directory), ``redis://host:port/db`` (several workers on several machines).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from context_layers import stores
from context_layers.stores import InstanceRecords, InvalidRecord, JSONText, json_text

__all__ = ["RECORD_FORMAT", "READ_FORMATS", "Store", "record_head", "InstanceRecords", "InvalidRecord", "JSONText", "json_text",
           "open_store", "default_store_url"]

#: Format of the records ``to_record`` writes. 1: the workflow is its JSON text, in a
#: string; 2: the workflow is the object that text encodes (not escaped again on every save).
RECORD_FORMAT = 2
#: Formats ``from_record`` reads.
READ_FORMATS = (1, 2)


@runtime_checkable
class Store(Protocol):
    """What the engine needs: one record at a time, versioned."""

    def create(self, record: Mapping[str, Any]) -> int: ...

    def load(self, instance_id: str) -> dict[str, Any]: ...

    def save(self, record: Mapping[str, Any], expected_version: int) -> int: ...

    def list(self) -> list[dict[str, Any]]: ...


def record_head(store: Store, instance_id: str) -> dict[str, Any]:
    """An instance's record without its tapes (``version`` inside): what a listing reads. A
    store of the engine's own kind reads no tape; another store gives its whole record."""
    if isinstance(store, InstanceRecords):
        return store.load_head(instance_id)
    return store.load(instance_id)


def default_store_url() -> str:
    """``$LAYERFLOW_STORE``, else a sqlite file in the user's data directory."""
    return os.environ.get("LAYERFLOW_STORE") or stores.default_store_url()


def open_store(url: str | None, *, create: bool = True) -> Store:
    """The store at ``url`` (``None``: a fresh ``memory://``); ``create=False``: a sqlite file
    that is not there raises ``StoreNotFound`` (nothing is written)."""
    return InstanceRecords(stores.open_store(url or "memory://", create=create))
