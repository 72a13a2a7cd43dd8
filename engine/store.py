"""Where instances are kept between runs: the ``Store`` protocol and two backends.

A record is a JSON-able dict (``engine.runtime.to_record``: the serialized workflow,
every context's tape, the engine's bookkeeping) with a ``format`` field. The store
owns its ``version``: ``create`` returns 1; ``save(record, expected_version)`` returns
the next version, or raises ``VersionConflict`` when someone else saved since
(optimistic concurrency: load again and retry).

Backends by URL: ``memory://`` (one process; records are copied in and out as JSON
text, so a loaded instance never shares state with a running one) and
``sqlite:///path/to/file.db`` (``sqlite:///:memory:`` too). The issue "stores" adds
Redis and one contract suite for all backends.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from context_layers.errors import ContextKeyError, LayerflowError, VersionConflict

__all__ = ["RECORD_FORMAT", "Store", "MemoryStore", "SqliteStore", "open_store", "default_store_url"]

RECORD_FORMAT = 1


@runtime_checkable
class Store(Protocol):
    def create(self, record: Mapping[str, Any]) -> int:
        """Store a new record under ``record["id"]``; return its version (1)."""
        ...

    def load(self, instance_id: str) -> dict[str, Any]:
        """The latest record, with its ``version``; ``ContextKeyError`` when unknown."""
        ...

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        """Replace the record if its stored version is ``expected_version``; return the new version."""
        ...

    def list(self) -> list[dict[str, Any]]:
        """Summaries ``{"id", "process_id", "status", "version", "updated"}``, newest first."""
        ...


def _summary(record: Mapping[str, Any], version: int) -> dict[str, Any]:
    return {"id": record["id"], "process_id": record.get("process_id"), "status": record.get("status"),
            "version": version, "updated": record.get("updated")}


def _dumps(record: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in record.items() if k != "version"}, separators=(",", ":"), ensure_ascii=False)


def _unknown(instance_id: str) -> ContextKeyError:
    return ContextKeyError(f"instance {instance_id!r} is not in the store; `layerflow list` shows the stored ones")


def _stale(instance_id: str, expected: int, actual: int) -> VersionConflict:
    return VersionConflict(f"instance {instance_id!r} was saved by someone else (stored version {actual}, "
                           f"this copy is version {expected}); load it again and repeat the change")


class MemoryStore:
    """Records in a dict, as JSON text (so nothing is shared with a live instance)."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, str, dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def create(self, record: Mapping[str, Any]) -> int:
        with self._lock:
            if record["id"] in self._rows:
                raise VersionConflict(f"instance {record['id']!r} already exists")
            self._rows[record["id"]] = (1, _dumps(record), _summary(record, 1))
            return 1

    def load(self, instance_id: str) -> dict[str, Any]:
        with self._lock:
            row = self._rows.get(instance_id)
        if row is None:
            raise _unknown(instance_id)
        record: dict[str, Any] = json.loads(row[1])
        record["version"] = row[0]
        return record

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        text = _dumps(record)
        with self._lock:
            row = self._rows.get(record["id"])
            if row is None:
                raise _unknown(record["id"])
            if row[0] != expected_version:
                raise _stale(record["id"], expected_version, row[0])
            version = expected_version + 1
            self._rows[record["id"]] = (version, text, _summary(record, version))
            return version

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = [r[2] for r in self._rows.values()]
        return sorted(rows, key=lambda r: r.get("updated") or 0, reverse=True)


class SqliteStore:
    """One table, one row per instance; the version check and the write are one statement."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
            self.path = str(Path(self.path).expanduser())
        self._local = threading.local()
        self._shared: sqlite3.Connection | None = None
        with self._conn() as conn:
            conn.execute("""CREATE TABLE IF NOT EXISTS instances (
                id TEXT PRIMARY KEY, process_id TEXT, status TEXT, version INTEGER NOT NULL,
                format INTEGER NOT NULL, record TEXT NOT NULL, created REAL, updated REAL)""")

    def _conn(self) -> sqlite3.Connection:
        if self.path == ":memory:":
            if self._shared is None:
                self._shared = sqlite3.connect(":memory:", check_same_thread=False)
            return self._shared
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    def create(self, record: Mapping[str, Any]) -> int:
        now = time.time()
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO instances (id, process_id, status, version, format, record, created, updated) "
                             "VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
                             (record["id"], record.get("process_id"), record.get("status"),
                              record.get("format", RECORD_FORMAT), _dumps(record), now, now))
        except sqlite3.IntegrityError:
            raise VersionConflict(f"instance {record['id']!r} already exists") from None
        return 1

    def load(self, instance_id: str) -> dict[str, Any]:
        row = self._conn().execute("SELECT version, record FROM instances WHERE id = ?", (instance_id,)).fetchone()
        if row is None:
            raise _unknown(instance_id)
        record: dict[str, Any] = json.loads(row[1])
        record["version"] = row[0]
        return record

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        with self._conn() as conn:
            cur = conn.execute("UPDATE instances SET record = ?, status = ?, version = version + 1, format = ?, "
                               "updated = ? WHERE id = ? AND version = ?",
                               (_dumps(record), record.get("status"), record.get("format", RECORD_FORMAT), time.time(),
                                record["id"], expected_version))
            if cur.rowcount == 1:
                return expected_version + 1
            row = conn.execute("SELECT version FROM instances WHERE id = ?", (record["id"],)).fetchone()
        if row is None:
            raise _unknown(record["id"])
        raise _stale(record["id"], expected_version, row[0])

    def list(self) -> list[dict[str, Any]]:
        rows = self._conn().execute(
            "SELECT id, process_id, status, version, updated FROM instances ORDER BY updated DESC").fetchall()
        return [{"id": r[0], "process_id": r[1], "status": r[2], "version": r[3], "updated": r[4]} for r in rows]


def default_store_url() -> str:
    """``$LAYERFLOW_STORE``, else a sqlite file in the user's data folder."""
    import os

    url = os.environ.get("LAYERFLOW_STORE")
    if url:
        return url
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return f"sqlite:///{Path(base) / 'layerflow' / 'layerflow.db'}"


def open_store(url: str | None) -> Store:
    """``memory://`` (also for None), ``sqlite:///relative.db``, ``sqlite:////absolute.db``, ``sqlite:///:memory:``."""
    if url is None or url in ("memory://", "memory"):
        return MemoryStore()
    if url.startswith("sqlite://"):
        path = url[len("sqlite://"):]
        if path.startswith("/"):
            path = path[1:]
        if not path:
            raise LayerflowError("sqlite store URL needs a file: sqlite:///path/to/layerflow.db")
        return SqliteStore(path)
    if url.startswith("redis://"):
        raise LayerflowError(f"store {url!r}: the Redis backend is not part of this build yet; use sqlite:///FILE "
                             "or memory://")
    raise LayerflowError(f"unknown store URL {url!r}; use memory:// or sqlite:///path/to/file.db")
