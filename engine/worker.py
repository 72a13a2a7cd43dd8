"""Workers: take ready instances from a Redis stream, run them until they wait or finish.

::

    submit(store_url, "loan.bpmn", data)     create the instance in the store, XADD its id
    run_worker(store_url)                    XREADGROUP -> lease -> load -> run -> save -> XACK

The queue is a Redis stream read through a consumer group, so each entry goes to one
worker and stays *pending* until that worker acknowledges it. A worker that dies
(kill -9, a lost machine) never acknowledges: after ``idle_ms`` another worker takes the
entry over with XAUTOCLAIM and runs the instance again from its last committed state
(the engine commits after every step; an activity that was running when its worker
died runs again).

Two guards keep an instance from running twice at once and keep every update:

* a **lease** per instance (``Store.acquire_lease``; renewed by a heartbeat while the
  worker runs), so a claimed entry whose instance is still being run by a live worker
  is left alone until that worker is done;
* the store's **version check**: a worker that lost its lease (a long pause) and then
  saves gets ``VersionConflict``; its work is dropped, the entry stays pending and is
  picked up again, and the next run starts from what was committed.

An entry is acknowledged only once its instance is at rest (completed, waiting, error)
or gone, so every failure mode ends with the entry being processed again.

The store may be any backend (``memory://NAME`` for worker threads in one process,
``sqlite:///`` for workers on one machine, ``redis://`` for many machines); the queue
is always Redis: ``queue_url``, else the store's URL when it is Redis, else
``$LAYERFLOW_QUEUE`` / ``$REDIS_URL``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from context_layers.errors import ContextKeyError, LayerflowError, VersionConflict
from context_layers.stores import InstanceRecords, Store, StoreError, open_store

from .process import load_process
from .runtime import Engine

__all__ = ["DEFAULT_STREAM", "DEFAULT_GROUP", "WorkerStats", "submit", "enqueue", "run_worker", "queue_client"]

DEFAULT_STREAM = "layerflow:ready"
DEFAULT_GROUP = "workers"
AT_REST = ("completed", "waiting", "error")

log = logging.getLogger("layerflow.worker")


@dataclass
class WorkerStats:
    consumer: str
    acked: int = 0            # entries finished (instance at rest or gone)
    ran: int = 0              # instances this worker ran
    reclaimed: int = 0        # entries taken over from a dead/slow worker
    busy: int = 0             # entries left because another live worker holds the lease
    conflicts: int = 0        # saves that lost to another writer (work dropped, entry kept)
    failures: int = 0         # store unavailable and the like (entry kept)
    statuses: dict[str, int] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the queue

def queue_client(store_url: str | None = None, queue_url: str | None = None) -> Any:
    """A redis-py client for the stream (see the module doc for how the URL is chosen)."""
    import redis

    url = queue_url
    if url is None and store_url and store_url.split("://", 1)[0] in ("redis", "rediss", "unix"):
        parts = urlsplit(store_url)
        url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in parse_qsl(parts.query) if k != "prefix"])))
    url = url or os.environ.get("LAYERFLOW_QUEUE") or os.environ.get("REDIS_URL")
    if not url:
        raise LayerflowError(f"workers take instances from a Redis stream, and store {store_url!r} is not Redis: "
                             "pass queue_url= / --queue redis://HOST:PORT/DB (or set LAYERFLOW_QUEUE)")
    return redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=5, health_check_interval=30)


def _ensure_group(client: Any, stream: str, group: str) -> None:
    import redis

    try:
        # id 0: entries added before the group existed are delivered too
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as err:
        if "BUSYGROUP" not in str(err):
            raise


def enqueue(client: Any, instance_id: str, *, stream: str = DEFAULT_STREAM) -> str:
    """XADD the instance id; returns the entry id."""
    return str(client.xadd(stream, {"instance_id": instance_id}))


def _store(store: str | Store) -> Store:
    return open_store(store) if isinstance(store, str) else store


def _engine(store: Store, handlers: Mapping[str, Any] | None, model: str | None) -> Engine:
    return Engine(InstanceRecords(store), handlers, model=model)


def submit(store_url: str | Store, process_path: str | Path, data: Mapping[str, Any] | None = None, *,
           config: str | Path | None = None, process_id: str | None = None, instance_id: str | None = None,
           queue_url: str | None = None, stream: str = DEFAULT_STREAM, group: str = DEFAULT_GROUP,
           client: Any = None) -> str:
    """Create an instance of ``process_path`` in the store (status ``running``, version 1)
    and put its id on the stream; returns the instance id.

    Created first, queued second: a crash in between leaves a ``running`` instance that
    no worker was told about; ``enqueue`` it again (a duplicate entry is harmless, it is
    acknowledged once the instance is at rest).
    """
    store = _store(store_url)
    process = load_process(process_path, process_id, config=config)
    instance = _engine(store, None, None).start(process, data, instance_id=instance_id)
    client = client or queue_client(store.url, queue_url)
    _ensure_group(client, stream, group)
    enqueue(client, instance.id, stream=stream)
    return instance.id


# ----------------------------------------------------------------------------- the worker

class _Heartbeat:
    """Renews the lease every ttl/3 while an instance runs."""

    def __init__(self, store: Store, instance_id: str, owner: str, ttl: float) -> None:
        self._stop = threading.Event()
        self.lost = False

        def beat() -> None:
            while not self._stop.wait(ttl / 3):
                try:
                    if not store.renew_lease(instance_id, owner, ttl):
                        self.lost = True  # the version check will refuse our save
                        return
                except StoreError:
                    pass

        self._thread = threading.Thread(target=beat, name=f"lease-{instance_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def run_worker(store_url: str | Store, *, queue_url: str | None = None, stream: str = DEFAULT_STREAM,
               group: str = DEFAULT_GROUP, consumer: str | None = None, idle_ms: int = 30_000,
               lease_ttl: float | None = None, block_ms: int = 1000, stop_after: int | None = None,
               stop: threading.Event | None = None, handlers: Mapping[str, Any] | None = None,
               model: str | None = None, client: Any = None) -> WorkerStats:
    """Process stream entries until ``stop_after`` entries are acknowledged, ``stop`` is
    set, or SIGTERM / Ctrl-C (the entry in hand is finished first).

    ``idle_ms``: how long an entry may stay unacknowledged before another worker takes
    it over; ``lease_ttl`` (seconds, default ``idle_ms``) how long a dead worker's lease
    blocks the instance. Keep ``idle_ms`` above the longest activity you expect: a live
    worker's entry taken over early is harmless (the lease keeps the taker away) but
    costs a retry.
    """
    store = _store(store_url)
    engine = _engine(store, handlers, model)
    client = client or queue_client(store.url, queue_url)
    consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    ttl = lease_ttl if lease_ttl is not None else idle_ms / 1000
    stats = WorkerStats(consumer)
    stop = stop or threading.Event()
    _ensure_group(client, stream, group)
    client.xgroup_createconsumer(stream, group, consumer)  # visible in XINFO CONSUMERS before its first entry
    restore = _stop_on_signals(stop)
    cursor = "0-0"
    try:
        while not stop.is_set() and (stop_after is None or stats.acked < stop_after):
            # entries of dead workers first, then new ones
            cursor, claimed, _deleted = client.xautoclaim(stream, group, consumer, min_idle_time=idle_ms,
                                                          start_id=cursor, count=1)
            entries = [(eid, fields) for eid, fields in claimed if fields]
            stats.reclaimed += len(entries)
            if not entries:
                reply = client.xreadgroup(group, consumer, {stream: ">"}, count=1, block=block_ms)
                entries = [e for _, batch in reply for e in batch]
            for entry_id, fields in entries:
                _handle(engine, store, client, stream, group, consumer, ttl, entry_id, fields, stats)
    finally:
        restore()
    return stats


def _handle(engine: Engine, store: Store, client: Any, stream: str, group: str, consumer: str, ttl: float,
            entry_id: str, fields: Mapping[str, str], stats: WorkerStats) -> None:
    instance_id = fields.get("instance_id", "")
    if not store.acquire_lease(instance_id, consumer, ttl):
        stats.busy += 1  # a live worker runs it; its entry (or this one, later) gets acknowledged
        return
    heartbeat = _Heartbeat(store, instance_id, consumer, ttl)
    try:
        try:
            instance = engine.load(instance_id)
        except ContextKeyError:
            log.warning("entry %s: instance %r is not in the store; dropping the entry", entry_id, instance_id)
            client.xack(stream, group, entry_id)
            stats.acked += 1
            return
        if instance.status not in AT_REST:
            instance = engine.run(instance)
            stats.ran += 1
        if instance.status not in AT_REST:
            return  # e.g. stopped half-way: leave the entry for the next attempt
        stats.statuses[instance.status] = stats.statuses.get(instance.status, 0) + 1
        client.xack(stream, group, entry_id)
        stats.acked += 1
    except VersionConflict as err:
        stats.conflicts += 1
        log.info("entry %s: %s; leaving it pending", entry_id, err)
    except StoreError as err:
        stats.failures += 1
        log.warning("entry %s: %s; leaving it pending", entry_id, err)
    except Exception:  # noqa: BLE001 - the engine turns activity failures into status "error"; this is a bug
        stats.failures += 1
        log.exception("entry %s: instance %r could not be run; leaving the entry pending", entry_id, instance_id)
    finally:
        heartbeat.stop()
        try:
            store.release_lease(instance_id, consumer)
        except StoreError:
            pass  # it expires


def _stop_on_signals(stop: threading.Event) -> Any:
    """SIGTERM / SIGINT set ``stop`` (main thread only); returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        stop.set()

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
