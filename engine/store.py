"""Where instances are kept between runs: the ``Store`` protocol and two backends.

A record is a JSON-able dict (``engine.runtime.to_record``: the serialized workflow,
every context's tape, the engine's bookkeeping) with a ``format`` field. The store
owns its ``version``: ``create`` returns 1; ``save(record, expected_version)`` returns
the next version, or raises ``VersionConflict`` when someone else saved since
(optimistic concurrency: load again and retry).

Backends by URL: ``memory://`` (one process; a loaded instance never shares state with
a running one) and ``sqlite:///path/to/file.db`` (``sqlite:///:memory:`` too; tape
events are stored once each, so a save costs what changed). The issue "stores" adds
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
    """Records in a dict. ``save`` keeps the record it is given (the engine builds a new one
    for every save and never changes it afterwards); ``load`` returns a deep copy, so a
    loaded instance shares nothing with a running one."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[int, Mapping[str, Any], dict[str, Any]]] = {}
        self._lock = threading.Lock()

    def create(self, record: Mapping[str, Any]) -> int:
        with self._lock:
            if record["id"] in self._rows:
                raise VersionConflict(f"instance {record['id']!r} already exists")
            self._rows[record["id"]] = (1, record, _summary(record, 1))
            return 1

    def load(self, instance_id: str) -> dict[str, Any]:
        with self._lock:
            row = self._rows.get(instance_id)
        if row is None:
            raise _unknown(instance_id)
        record: dict[str, Any] = json.loads(_dumps(row[1]))
        record["version"] = row[0]
        return record

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        with self._lock:
            row = self._rows.get(record["id"])
            if row is None:
                raise _unknown(record["id"])
            if row[0] != expected_version:
                raise _stale(record["id"], expected_version, row[0])
            version = expected_version + 1
            self._rows[record["id"]] = (version, record, _summary(record, version))
            return version

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            rows = [r[2] for r in self._rows.values()]
        return sorted(rows, key=lambda r: r.get("updated") or 0, reverse=True)


class SqliteStore:
    """One row per instance plus one row per tape event.

    Tapes are append-only, so a save inserts only the events the store does not hold
    yet and rewrites the rest of the record (the workflow, the bookkeeping): a save
    costs the new events, not the whole history. The version check, the event inserts
    and the record update are one transaction.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            self.path = str(Path(self.path).expanduser())
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._shared: sqlite3.Connection | None = None
        with self._conn() as conn:
            conn.execute("""CREATE TABLE IF NOT EXISTS instances (
                id TEXT PRIMARY KEY, process_id TEXT, status TEXT, version INTEGER NOT NULL,
                format INTEGER NOT NULL, record TEXT NOT NULL, created REAL, updated REAL)""")
            conn.execute("""CREATE TABLE IF NOT EXISTS events (
                instance TEXT NOT NULL, context TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
                PRIMARY KEY (instance, context, seq))""")

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

    @staticmethod
    def _split(record: Mapping[str, Any], stored: Mapping[str, int]) -> tuple[str, list[tuple[str, int, str]]]:
        """The record without tapes (as JSON) and the events the store does not have yet."""
        head = {k: v for k, v in record.items() if k not in ("version", "contexts")}
        contexts: dict[str, Any] = {}
        new: list[tuple[str, int, str]] = []
        for name, ctx in (record.get("contexts") or {}).items():
            tape = ctx.get("tape") or []
            contexts[name] = {**{k: v for k, v in ctx.items() if k != "tape"}, "tape_length": len(tape)}
            have = stored.get(name, 0)
            for event in tape:
                if event["seq"] > have:
                    new.append((name, event["seq"], json.dumps(event, separators=(",", ":"), ensure_ascii=False)))
        head["contexts"] = contexts
        return json.dumps(head, separators=(",", ":"), ensure_ascii=False), new

    def _stored(self, conn: sqlite3.Connection, instance_id: str) -> dict[str, int]:
        rows = conn.execute("SELECT context, MAX(seq) FROM events WHERE instance = ? GROUP BY context", (instance_id,))
        return {r[0]: r[1] for r in rows}

    def create(self, record: Mapping[str, Any]) -> int:
        now = time.time()
        head, events = self._split(record, {})
        try:
            with self._conn() as conn:
                conn.execute("INSERT INTO instances (id, process_id, status, version, format, record, created, updated) "
                             "VALUES (?, ?, ?, 1, ?, ?, ?, ?)",
                             (record["id"], record.get("process_id"), record.get("status"),
                              record.get("format", RECORD_FORMAT), head, now, now))
                conn.executemany("INSERT INTO events (instance, context, seq, event) VALUES (?, ?, ?, ?)",
                                 [(record["id"], *e) for e in events])
        except sqlite3.IntegrityError:
            raise VersionConflict(f"instance {record['id']!r} already exists") from None
        return 1

    def load(self, instance_id: str) -> dict[str, Any]:
        conn = self._conn()
        row = conn.execute("SELECT version, record FROM instances WHERE id = ?", (instance_id,)).fetchone()
        if row is None:
            raise _unknown(instance_id)
        record: dict[str, Any] = json.loads(row[1])
        record["version"] = row[0]
        tapes: dict[str, list[Any]] = {name: [] for name in record.get("contexts", {})}
        for name, text in conn.execute("SELECT context, event FROM events WHERE instance = ? ORDER BY context, seq",
                                       (instance_id,)):
            tapes.setdefault(name, []).append(json.loads(text))
        for name, ctx in record.get("contexts", {}).items():
            ctx["tape"] = tapes[name][: ctx.pop("tape_length", len(tapes[name]))]
        return record

    def save(self, record: Mapping[str, Any], expected_version: int) -> int:
        conn = self._conn()
        with conn:
            cur = conn.execute("UPDATE instances SET status = ?, version = version + 1, format = ?, updated = ? "
                               "WHERE id = ? AND version = ?",
                               (record.get("status"), record.get("format", RECORD_FORMAT), time.time(),
                                record["id"], expected_version))
            if cur.rowcount == 1:
                head, events = self._split(record, self._stored(conn, record["id"]))
                conn.execute("UPDATE instances SET record = ? WHERE id = ?", (head, record["id"]))
                conn.executemany("INSERT INTO events (instance, context, seq, event) VALUES (?, ?, ?, ?)",
                                 [(record["id"], *e) for e in events])
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
