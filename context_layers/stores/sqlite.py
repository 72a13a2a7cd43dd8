"""``sqlite:///path.db``: one file, no server; the default store.

WAL mode (readers never block the writer), one connection per thread, and every write
in one ``BEGIN IMMEDIATE`` transaction: the version check, the tape-continuity check
and all the rows of a save commit together or not at all. Several processes may share
the file (workers on one machine); the write lock serializes them.

The timer index is the ``due`` column of ``instances`` (``timer_due`` of the record, NULL
for most rows) with a partial index on it; a file from before the column gets it on open
and is filled from its records on the first ``due_instances`` (meta ``timer_index``).
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from .base import (
    INSTANCE_FORMAT,
    STORE_FORMAT,
    TIMER_INDEX,
    BlobStats,
    Confirmation,
    ConfirmationNotFound,
    InstanceExists,
    InstanceNotFound,
    InstanceSummary,
    PreparedWrite,
    StoreError,
    StoreUnavailable,
    TapeAppends,
    answered,
    check_format,
    check_ttl,
    dumps,
    join_snapshot,
    prepare_append,
    prepare_confirmation,
    prepare_write,
    record_json,
    snapshot_not_found,
    split_snapshot,
    summary,
    tape_gap,
    timer_due,
    until_seconds,
    version_conflict,
)
from .tape_parts import PART_BYTES, read_events

__all__ = ["SQLiteStore"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS instances (
    id TEXT PRIMARY KEY, format INTEGER NOT NULL, version INTEGER NOT NULL,
    process_id TEXT NOT NULL, status TEXT NOT NULL, record TEXT NOT NULL,
    created REAL NOT NULL, updated REAL NOT NULL, due REAL);
CREATE INDEX IF NOT EXISTS instances_by_status ON instances (status, created);
CREATE TABLE IF NOT EXISTS events (
    instance_id TEXT NOT NULL, context TEXT NOT NULL, seq INTEGER NOT NULL, event TEXT NOT NULL,
    PRIMARY KEY (instance_id, context, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    instance_id TEXT NOT NULL, snapshot_id TEXT NOT NULL, manifest TEXT NOT NULL,
    PRIMARY KEY (instance_id, snapshot_id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS blobs (
    instance_id TEXT NOT NULL, hash TEXT NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (instance_id, hash)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS confirmations (
    id TEXT PRIMARY KEY, instance_id TEXT NOT NULL, status TEXT NOT NULL, created REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS confirmations_by_instance ON confirmations (instance_id, status);
CREATE TABLE IF NOT EXISTS leases (instance_id TEXT PRIMARY KEY, owner TEXT NOT NULL, expires REAL NOT NULL);
"""

# after the migration that adds the column to an older file; partial: only waiting rows have a due
_DUE_INDEX = "CREATE INDEX IF NOT EXISTS instances_by_due ON instances (due, id) WHERE due IS NOT NULL"


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[None]:
    """sqlite3 errors -> StoreError (the one place they are mapped), saying what to do."""
    try:
        yield
    except sqlite3.OperationalError as exc:
        text = str(exc)
        if "locked" in text or "busy" in text:
            raise StoreUnavailable(f"sqlite store {path!r} stayed locked by another writer ({text}); nothing was "
                                   "written. Retry, or raise busy_timeout") from exc
        if "readonly" in text or "read-only" in text:
            raise StoreError(f"sqlite store {path!r} is read-only ({text}); nothing was written. Make the file and "
                             "its folder writable by this user (SQLite writes -wal and -shm files beside it), or "
                             "point --store / $LAYERFLOW_STORE at a writable copy") from exc
        if "unable to open" in text:
            raise StoreError(f"cannot open sqlite store {path!r} ({text}): the path must name a file (not a folder) "
                             "in a folder this user can write (SQLite creates -wal and -shm files beside it); fix "
                             "the path in --store / $LAYERFLOW_STORE or the permissions") from exc
        raise StoreError(f"sqlite store {path!r}: {text}") from exc
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc):
            raise StoreError(f"sqlite store {path!r} is not a layerflow store or is damaged ({exc}); nothing was "
                             "written. Point --store / $LAYERFLOW_STORE at another file, or restore this one from a "
                             "backup") from exc
        raise StoreError(f"sqlite store {path!r}: {type(exc).__name__}: {exc}") from exc
    except sqlite3.Error as exc:
        raise StoreError(f"sqlite store {path!r}: {type(exc).__name__}: {exc}") from exc


class SQLiteStore:
    def __init__(self, path: str | Path, *, url: str | None = None, synchronous: str = "FULL",
                 busy_timeout: float = 30.0, clock: Callable[[], float] = time.time,
                 tape_part_bytes: int | None = PART_BYTES) -> None:
        self.path = str(path)
        self._part_bytes = tape_part_bytes  # None: tape values stored whole (tape_parts)
        self.url = url or f"sqlite:///{self.path}"
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise StoreError(f"synchronous={synchronous!r}: use off, normal, full or extra")
        self._synchronous = synchronous.upper()
        self._timeout = busy_timeout
        self._clock = clock
        self._timer_index_ready = False
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._all_lock = threading.Lock()
        try:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot open sqlite store {self.path!r}: its folder cannot be created "
                             f"({exc.strerror or exc}); fix the path in --store / $LAYERFLOW_STORE") from None
        with self._tx() as c:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    c.execute(statement)
            if "due" not in {r[1] for r in c.execute("PRAGMA table_info(instances)")}:
                c.execute("ALTER TABLE instances ADD COLUMN due REAL")  # a file from before the timer index
            c.execute(_DUE_INDEX)
            row = c.execute("SELECT value FROM meta WHERE key = 'format'").fetchone()
            if row is None:  # a new file: nothing to fill the timer index from
                c.executemany("INSERT INTO meta (key, value) VALUES (?, ?)",
                              [("format", str(STORE_FORMAT)), ("timer_index", str(TIMER_INDEX))])
            else:
                check_format(f"sqlite store {self.path!r}", row[0])

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path}>"

    # ----- connections and transactions ----------------------------------------------------

    def _conn(self) -> sqlite3.Connection:
        c: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if c is None:
            with _mapped(self.path):
                c = sqlite3.connect(self.path, timeout=self._timeout, isolation_level=None, check_same_thread=False)
                c.execute("PRAGMA journal_mode=WAL")
                c.execute(f"PRAGMA synchronous={self._synchronous}")
                c.execute(f"PRAGMA busy_timeout={int(self._timeout * 1000)}")
            self._local.conn = c
            with self._all_lock:
                self._all.append(c)
        return c

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """A write transaction: BEGIN IMMEDIATE takes the write lock up front, so two
        writers never deadlock upgrading read locks."""
        c = self._conn()
        with _mapped(self.path):
            c.execute("BEGIN IMMEDIATE")
            try:
                yield c
            except BaseException:
                c.execute("ROLLBACK")
                raise
            c.execute("COMMIT")

    @contextlib.contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        """A read transaction: one consistent WAL snapshot for multi-statement reads."""
        c = self._conn()
        with _mapped(self.path):
            c.execute("BEGIN")
            try:
                yield c
            finally:
                c.execute("COMMIT")

    @staticmethod
    def _version(c: sqlite3.Connection, instance_id: str) -> int:
        row = c.execute("SELECT version FROM instances WHERE id = ?", (instance_id,)).fetchone()
        if row is None:
            raise InstanceNotFound(instance_id)
        return int(row[0])

    # ----- instances -----------------------------------------------------------------------

    def create(self, record: Mapping[str, Any], *, tape_appends: TapeAppends | None = None,
               snapshots: Mapping[str, Mapping[str, Any]] | None = None,
               confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        w = prepare_write(None, record, tape_appends, snapshots, confirmations, self._part_bytes)
        assert w.record is not None
        r = w.record
        with self._tx() as c:
            if c.execute("SELECT 1 FROM instances WHERE id = ?", (r.instance_id,)).fetchone():
                raise InstanceExists(f"instance {r.instance_id!r} already exists; load and save it, "
                                     "or create it under a new id")
            created = r.stamp("created", self._clock)
            c.execute("INSERT INTO instances (id, format, version, process_id, status, record, created, updated, due) "
                      "VALUES (?, ?, 1, ?, ?, ?, ?, ?, ?)",
                      (r.instance_id, INSTANCE_FORMAT, r.process_id, r.status, r.text, created,
                       r.stamp("updated", lambda: created), r.due))
            self._check_and_insert(c, r.instance_id, w)
        return 1

    def load(self, instance_id: str) -> tuple[dict[str, Any], int]:
        with _mapped(self.path):
            row = self._conn().execute("SELECT record, version, format FROM instances WHERE id = ?",
                                       (instance_id,)).fetchone()
        if row is None:
            raise InstanceNotFound(instance_id)
        check_format(f"instance {instance_id!r}", row[2], INSTANCE_FORMAT)
        return record_json(row[0], instance_id, f"sqlite store {self.path}"), int(row[1])

    def save(self, instance_id: str, record: Mapping[str, Any], expected_version: int,
             tape_appends: TapeAppends | None = None, *,
             snapshots: Mapping[str, Mapping[str, Any]] | None = None,
             confirmations: Sequence[Mapping[str, Any]] = ()) -> int:
        return self._write(instance_id, prepare_write(instance_id, record, tape_appends, snapshots, confirmations,
                                                      self._part_bytes), expected_version)

    def _write(self, instance_id: str, w: PreparedWrite, expected_version: int | None) -> int:
        with self._tx() as c:
            version = self._version(c, instance_id)
            if expected_version is not None and version != expected_version:
                raise version_conflict(instance_id, expected_version, version)
            if w.record is not None:
                c.execute("UPDATE instances SET version = ?, record = ?, process_id = ?, status = ?, updated = ?, "
                          "format = ?, due = ? WHERE id = ?", (version + 1, w.record.text, w.record.process_id,
                                                               w.record.status, w.record.stamp("updated", self._clock),
                                                               INSTANCE_FORMAT, w.record.due, instance_id))
            else:
                c.execute("UPDATE instances SET version = ?, updated = ? WHERE id = ?",
                          (version + 1, self._clock(), instance_id))
            self._check_and_insert(c, instance_id, w)
        return version + 1

    def _check_and_insert(self, c: sqlite3.Connection, instance_id: str, w: PreparedWrite) -> None:
        """Inside the write transaction: check every append first, then insert everything
        (a failed check raises and the caller's transaction rolls back)."""
        for a in w.appends:
            last = int(c.execute("SELECT COALESCE(MAX(seq), 0) FROM events WHERE instance_id = ? AND context = ?",
                                 (instance_id, a.context)).fetchone()[0])
            if a.first_seq != last + 1:
                raise tape_gap(instance_id, a.context, a.first_seq, last)
        for a in w.appends:
            c.executemany("INSERT INTO events (instance_id, context, seq, event) VALUES (?, ?, ?, ?)",
                          [(instance_id, a.context, a.first_seq + i, text) for i, text in enumerate(a.events)])
            c.executemany("INSERT OR IGNORE INTO blobs (instance_id, hash, body) VALUES (?, ?, ?)",
                          [(instance_id, h, b) for h, b in a.parts.items()])
        for s in w.snapshots:
            self._insert_snapshot(c, instance_id, s.snapshot_id, s.manifest, s.blobs)
        for cid, text in w.confirmations:
            self._insert_confirmation(c, cid, instance_id, text)

    @staticmethod
    def _insert_snapshot(c: sqlite3.Connection, instance_id: str, snapshot_id: str, manifest: str,
                         blobs: Mapping[str, str]) -> None:
        c.executemany("INSERT OR IGNORE INTO blobs (instance_id, hash, body) VALUES (?, ?, ?)",
                      [(instance_id, h, b) for h, b in blobs.items()])
        c.execute("INSERT OR REPLACE INTO snapshots (instance_id, snapshot_id, manifest) VALUES (?, ?, ?)",
                  (instance_id, snapshot_id, manifest))

    @staticmethod
    def _insert_confirmation(c: sqlite3.Connection, cid: str, instance_id: str, text: str) -> None:
        c.execute("INSERT OR IGNORE INTO confirmations (id, instance_id, status, created, body) "
                  "VALUES (?, ?, 'pending', ?, ?)", (cid, instance_id, json.loads(text)["created"], text))

    def list_instances(self, status: str | None = None) -> list[InstanceSummary]:
        sql = "SELECT id, process_id, status, version, created, updated FROM instances"
        args: tuple[Any, ...] = ()
        if status is not None:
            sql, args = sql + " WHERE status = ?", (status,)
        with _mapped(self.path):
            rows = self._conn().execute(sql + " ORDER BY created, id", args).fetchall()
        return [summary(r[0], r[1], r[2], int(r[3]), float(r[4]), float(r[5])) for r in rows]

    def count_instances(self) -> int:
        """How many instances the store holds (not part of ``Store``: a worker's start line)."""
        with _mapped(self.path):
            return int(self._conn().execute("SELECT COUNT(*) FROM instances").fetchone()[0])

    def due_instances(self, until: float | datetime) -> list[InstanceSummary]:
        bound = until_seconds(until)
        if not self._timer_index_ready:
            self._fill_timer_index()
        with _mapped(self.path):
            rows = self._conn().execute("SELECT id, process_id, status, version, created, updated FROM instances "
                                        "WHERE due <= ? ORDER BY due, id", (bound,)).fetchall()
        return [summary(r[0], r[1], r[2], int(r[3]), float(r[4]), float(r[5])) for r in rows]

    def _fill_timer_index(self) -> None:
        """Index the records of a file written before the timer index, once: in one write
        transaction, so no save slips between the read of a record and its index value."""
        with self._tx() as c:
            row = c.execute("SELECT value FROM meta WHERE key = 'timer_index'").fetchone()
            if row is None or int(row[0]) < TIMER_INDEX:
                for iid, text in c.execute("SELECT id, record FROM instances WHERE status = 'waiting'").fetchall():
                    c.execute("UPDATE instances SET due = ? WHERE id = ?", (timer_due(json.loads(text)), iid))
                c.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('timer_index', ?)", (str(TIMER_INDEX),))
        self._timer_index_ready = True

    def delete(self, instance_id: str) -> bool:
        with self._tx() as c:
            if c.execute("DELETE FROM instances WHERE id = ?", (instance_id,)).rowcount == 0:
                return False
            for table in ("events", "snapshots", "blobs", "confirmations", "leases"):
                c.execute(f"DELETE FROM {table} WHERE instance_id = ?", (instance_id,))
        return True

    # ----- tapes -----------------------------------------------------------------------------

    def append_events(self, instance_id: str, context_name: str, events: Sequence[Mapping[str, Any]],
                      expected_version: int | None = None) -> int:
        a = prepare_append(instance_id, context_name, events, self._part_bytes)
        return self._write(instance_id, PreparedWrite(None, (a,) if a else (), (), ()), expected_version)

    def read_tape(self, instance_id: str, context_name: str, since_seq: int = 0) -> list[dict[str, Any]]:
        with self._read() as c:
            self._version(c, instance_id)
            rows = c.execute("SELECT event FROM events WHERE instance_id = ? AND context = ? AND seq > ? ORDER BY seq",
                             (instance_id, context_name, since_seq)).fetchall()
            return read_events((r[0] for r in rows), lambda hashes: self._blobs(c, instance_id, hashes),
                               f"tape {context_name!r} of instance {instance_id!r}")

    def tape_heads(self, instance_id: str) -> dict[str, int]:
        with self._read() as c:
            self._version(c, instance_id)
            rows = c.execute("SELECT context, MAX(seq) FROM events WHERE instance_id = ? GROUP BY context "
                             "ORDER BY context", (instance_id,)).fetchall()
        return {r[0]: int(r[1]) for r in rows}

    # ----- snapshots -----------------------------------------------------------------------

    def put_snapshot(self, instance_id: str, snapshot_id: str, snapshot: Mapping[str, Any]) -> None:
        manifest, blobs = split_snapshot(snapshot)
        with self._tx() as c:
            self._version(c, instance_id)
            self._insert_snapshot(c, instance_id, snapshot_id, manifest, blobs)

    def get_snapshot(self, instance_id: str, snapshot_id: str) -> dict[str, Any]:
        with self._read() as c:
            self._version(c, instance_id)
            row = c.execute("SELECT manifest FROM snapshots WHERE instance_id = ? AND snapshot_id = ?",
                            (instance_id, snapshot_id)).fetchone()
            if row is None:
                known = [r[0] for r in c.execute("SELECT snapshot_id FROM snapshots WHERE instance_id = ?",
                                                 (instance_id,))]
                raise snapshot_not_found(instance_id, snapshot_id, known)

            return join_snapshot(row[0], lambda hashes: self._blobs(c, instance_id, hashes),
                                 f"snapshot {snapshot_id!r} of instance {instance_id!r}")

    @staticmethod
    def _blobs(c: sqlite3.Connection, instance_id: str, hashes: Iterable[str]) -> dict[str, str]:
        """The stored parts of these hashes (inside the caller's transaction)."""
        hashes = list(hashes)
        out: dict[str, str] = {}
        for i in range(0, len(hashes), 500):  # SQLite's bound-parameter limit
            chunk = hashes[i:i + 500]
            marks = ",".join("?" * len(chunk))
            out.update(c.execute(f"SELECT hash, body FROM blobs WHERE instance_id = ? AND hash IN ({marks})",
                                 (instance_id, *chunk)).fetchall())
        return out

    def list_snapshots(self, instance_id: str) -> list[str]:
        with self._read() as c:
            self._version(c, instance_id)
            return [r[0] for r in c.execute("SELECT snapshot_id FROM snapshots WHERE instance_id = ? "
                                            "ORDER BY snapshot_id", (instance_id,))]

    def blob_stats(self, instance_id: str) -> BlobStats:
        with self._read() as c:
            self._version(c, instance_id)
            n, size = c.execute("SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(body AS BLOB))), 0) FROM blobs "
                                "WHERE instance_id = ?", (instance_id,)).fetchone()
        return BlobStats(int(n), int(size))

    # ----- confirmations ---------------------------------------------------------------------

    def put_confirmation(self, confirmation: Mapping[str, Any]) -> Confirmation:
        cid, text = prepare_confirmation(confirmation)
        iid = json.loads(text)["instance_id"]
        with self._tx() as c:
            self._version(c, iid)
            self._insert_confirmation(c, cid, iid, text)
            stored = c.execute("SELECT body FROM confirmations WHERE id = ?", (cid,)).fetchone()[0]
        return json.loads(stored)  # type: ignore[no-any-return]

    def get_confirmation(self, confirmation_id: str) -> Confirmation:
        with _mapped(self.path):
            row = self._conn().execute("SELECT body FROM confirmations WHERE id = ?", (confirmation_id,)).fetchone()
        if row is None:
            raise ConfirmationNotFound(confirmation_id)
        return json.loads(row[0])  # type: ignore[no-any-return]

    def list_confirmations(self, instance_id: str | None = None, *, pending_only: bool = True) -> list[Confirmation]:
        where, args = [], []
        if instance_id is not None:
            where.append("instance_id = ?")
            args.append(instance_id)
        if pending_only:
            where.append("status = 'pending'")
        sql = "SELECT body FROM confirmations" + (" WHERE " + " AND ".join(where) if where else "")
        with _mapped(self.path):
            rows = self._conn().execute(sql + " ORDER BY created, id", args).fetchall()
        return [json.loads(r[0]) for r in rows]

    def answer_confirmation(self, confirmation_id: str, answer: Any, actor: str) -> Confirmation:
        with self._tx() as c:
            row = c.execute("SELECT body FROM confirmations WHERE id = ?", (confirmation_id,)).fetchone()
            if row is None:
                raise ConfirmationNotFound(confirmation_id)
            new = answered(json.loads(row[0]), answer, actor)
            c.execute("UPDATE confirmations SET status = 'answered', body = ? WHERE id = ?", (dumps(new), confirmation_id))
        return new  # type: ignore[return-value]

    # ----- leases ----------------------------------------------------------------------------

    def acquire_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        ttl = check_ttl(ttl)
        with self._tx() as c:
            now = self._clock()
            cur = c.execute("INSERT INTO leases (instance_id, owner, expires) VALUES (?, ?, ?) "
                            "ON CONFLICT (instance_id) DO UPDATE SET owner = excluded.owner, expires = excluded.expires "
                            "WHERE leases.owner = excluded.owner OR leases.expires <= ?",
                            (instance_id, owner, now + ttl, now))
            return cur.rowcount == 1

    def renew_lease(self, instance_id: str, owner: str, ttl: float) -> bool:
        ttl = check_ttl(ttl)
        with self._tx() as c:
            now = self._clock()
            return c.execute("UPDATE leases SET expires = ? WHERE instance_id = ? AND owner = ? AND expires > ?",
                             (now + ttl, instance_id, owner, now)).rowcount == 1

    def release_lease(self, instance_id: str, owner: str) -> bool:
        with self._tx() as c:
            now = self._clock()
            held = c.execute("SELECT expires FROM leases WHERE instance_id = ? AND owner = ?",
                             (instance_id, owner)).fetchone()
            c.execute("DELETE FROM leases WHERE instance_id = ? AND owner = ?", (instance_id, owner))
            return held is not None and float(held[0]) > now

    def lease_owner(self, instance_id: str) -> str | None:
        with _mapped(self.path):
            row = self._conn().execute("SELECT owner FROM leases WHERE instance_id = ? AND expires > ?",
                                       (instance_id, self._clock())).fetchone()
        return row[0] if row else None

    def close(self) -> None:
        with self._all_lock:
            conns, self._all = self._all, []
        for c in conns:
            with contextlib.suppress(sqlite3.Error):
                c.close()
        self._local = threading.local()

    def __enter__(self) -> "SQLiteStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
