"""Workers: take ready instances from a Redis stream, run them until they wait or finish.

::

    submit(store_url, "loan.bpmn", data)     create the instance in the store, XADD its id
    run_worker(store_url)                    XREADGROUP -> lease -> load -> run -> save -> XACK
    dead_letters(client)                     entries that failed max_deliveries times
    requeue(client, dead_id)                 put one back on the ready stream

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
* the lease is **checked before each activity** (``Heartbeat.check``): a worker paused
  past its lease whose save after the activity in hand went through (the taker had not
  saved yet) does not start the next one beside the taker; ``LeaseLost`` (a
  ``VersionConflict``) stops it, logged, and the entry is given back as for a conflict.

An entry is acknowledged once its instance is at rest (completed, waiting, error), or
when it moves to the dead letters. An instance the worker's store does not hold is a failed
delivery, not a reason to drop the entry: a worker started on another store than ``submit``
used must not empty the stream of the work of the others. An entry names the store it was
put on the stream for (``store``: ``store_identity``, a Redis store's database and key prefix, a
sqlite store's file); a worker of another store leaves it to the workers of that one without
counting a delivery (given back at once, claimable by them), so one worker started with a typo
in its ``?prefix=`` does not move the fleet's entries to the dead letters.

**Dead letters.** An entry whose handling fails every time (a record that cannot be
deserialized, a bug that escapes the engine; a failing *activity* is not one, the engine
turns it into status ``error``) would otherwise be taken over every ``idle_ms``,
forever. Redis counts the deliveries of each pending entry (``times_delivered`` in
XPENDING) across workers and restarts. A delivery whose outcome is not the entry's
fault is given back (XCLAIM ... RETRYCOUNT n-1), so the count is one of failed
deliveries::

    outcome of a delivery                       the entry         counts
    instance at rest                            acknowledged      -
    entry of another store (wrong --store)      given back        no (left to that store's workers)
    instance not in the store (wrong --store)   left pending      yes
    instance gone while it ran (data lost)      acknowledged      -
    lease held by another worker (busy)         left pending      no (given back)
    VersionConflict (another writer won)        left pending      no (given back)
    StoreUnavailable (store down / locked)      left pending      no (given back)
    any other exception, other StoreErrors      left pending      yes
    the worker dies (kill -9, out of memory)    left pending      yes

The ``max_deliveries``-th failed delivery, or the takeover of an entry already delivered
more than ``max_deliveries`` times (its workers died on it), moves the entry to the
dead-letter stream ``<stream>:dead`` with the instance id, the original entry id, the
delivery count, the last error (``error_type``, ``error``), the consumer and the time.
The XADD there and the XACK here are one MULTI/EXEC under WATCH of the dead-letter
stream: the entry is never lost and never dead-lettered twice.

A store outage does not count because it is not the entry's fault: if it did, an
outage of ``max_deliveries`` x ``idle_ms`` (2.5 minutes by default) would move every
entry in flight to the dead letters. The price: an entry that itself makes the store
report "unavailable" every time is retried every ``idle_ms``, with a warning each time.

**The queue's own outage.** When the queue's Redis stops answering (or answers but refuses
commands for now: out of memory, a read-only replica, a failed RDB save), a running worker
logs a warning and retries (backing off up to 10 s) instead of dying; an entry it had in
hand stays pending and is taken over as usual. A queue Redis that comes back *empty* (no persistence, a flush) has lost the stream, its group
and the entries on them: the worker logs that as an error naming the server, makes the group
again and puts the instances the store still holds as ``running`` back on the stream
(``requeue_running``; ``run_worker(requeue=True)``, ``layerflow worker --requeue``, does it as
the worker starts, for a queue that came back empty while no worker ran). ``submit`` checks that the queue answers
before it creates the instance, and deletes the instance again if the XADD fails, so no
``running`` instance is left that no worker will hear of.

``requeue`` puts a dead letter back on the ready stream with a fresh count once its
cause is fixed (XADD there and XDEL from the dead letters, one MULTI/EXEC).

**What stays in Redis.** XADD keeps an entry after it is acknowledged, and XREADGROUP makes a
consumer that stays after its worker is gone. Every ``TRIM_INTERVAL`` seconds, and as it stops, a
worker trims the entries every group of the stream is done with (``trim_done``: older than each
group's oldest pending entry and than what it has not read yet) and drops the consumers holding
nothing that have not read for ``CONSUMER_IDLE_MS`` (``prune_consumers``: dead workers, once their
entries were taken over); a worker that stops cleanly drops its own consumer (``forget_consumer``).

The store may be any backend (``memory://NAME`` for worker threads in one process,
``sqlite:///`` for workers on one machine, ``redis://`` for many machines); the queue
is always Redis: ``queue_url``, else the store's URL when it is Redis, else
``$LAYERFLOW_QUEUE`` / ``$REDIS_URL``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from context_layers.errors import ContextKeyError, LayerflowError, VersionConflict
from context_layers.stores import InstanceNotFound, InstanceRecords, Store, StoreError, StoreUnavailable, open_store

from .leases import Heartbeat, LeaseLost
from .process import Process, load_process
from .runtime import Engine, Instance, _prepared_start, _utc
from .store import record_head

__all__ = ["DEFAULT_STREAM", "DEFAULT_GROUP", "DEFAULT_MAX_DELIVERIES", "WorkerStats", "DeadLetter", "submit",
           "enqueue", "run_worker", "queue_client", "queue_error", "dead_stream_of", "dead_letters", "dead_letter_ids",
           "has_queue", "requeue",
           "requeue_running", "trim_done", "prune_consumers", "forget_consumer"]

DEFAULT_STREAM = "layerflow:ready"
DEFAULT_GROUP = "workers"
DEFAULT_MAX_DELIVERIES = 5
AT_REST = ("completed", "waiting", "error", "cancelled")
ERROR_CHARS = 2000  # of an error message kept in a dead letter: a message may quote a whole record
TRIM_INTERVAL = 5.0  # seconds between trims of the entries every group is done with (``trim_done``)
CONSUMER_IDLE_MS = 3600_000  # a consumer with nothing pending that did not read for this long is gone
HINT_INTERVAL = 60.0  # seconds between looks for this stream's work in the server's other databases (``_WorkElsewhere``)
DEAD_LETTER_FORMAT = 2  # 2: letters keep the entry's wake and store (``DeadLetter.format``)
BEGUN_TTL = 24 * 3600  # seconds an "activity begun" marker outlives a worker that died before its instance rested

log = logging.getLogger("layerflow.worker")


@dataclass
class WorkerStats:
    consumer: str
    acked: int = 0            # entries finished (instance at rest or gone)
    ran: int = 0              # instances this worker ran
    reclaimed: int = 0        # entries taken over from a dead/slow worker
    busy: int = 0             # entries left because another live worker holds the lease
    conflicts: int = 0        # saves that lost to another writer (work dropped, entry kept)
    failures: int = 0         # failed deliveries: store unavailable, a record that does not load, ...
    dead: int = 0             # entries moved to the dead-letter stream (and acknowledged)
    timers: int = 0           # instances with a due timer this worker put on the stream
    requeued: int = 0         # running instances of the store put back on a stream the queue had lost
    other_store: int = 0      # entries of another store (see store_identity) left to that store's workers
    statuses: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeadLetter:
    """An entry of the dead-letter stream: a ready entry that failed ``deliveries`` times."""

    id: str             # in the dead-letter stream: what ``requeue`` takes
    instance_id: str
    entry_id: str       # the original entry of the ready stream (acknowledged)
    deliveries: int
    error_type: str     # "" when no worker lived to record an error
    error: str
    consumer: str       # the worker that gave up on it
    group: str
    time: str           # ISO 8601, UTC
    wake: str = ""      # the entry's ``wake`` ("timer": a due timer's), which ``requeue`` puts back with it
    store: str = ""     # the entry's ``store`` (``store_identity``), which ``requeue`` puts back with it
    # DEAD_LETTER_FORMAT of the layerflow that wrote it; 1: from before letters kept ``wake`` and ``store``
    # (one of a due timer's wake-up has none; requeued, the timer fires all the same: ``_due_now``)
    format: int = 1

    @classmethod
    def from_entry(cls, dead_id: str, fields: Mapping[str, str]) -> DeadLetter:
        return cls(id=dead_id, instance_id=fields.get("instance_id", ""), entry_id=fields.get("entry_id", ""),
                   deliveries=_count(fields.get("deliveries")), error_type=fields.get("error_type", ""),
                   error=fields.get("error", ""), consumer=fields.get("consumer", ""),
                   group=fields.get("group", ""), time=fields.get("time", ""), wake=fields.get("wake", ""),
                   store=fields.get("store", ""), format=_count(fields.get("format")) or 1)


def _count(text: str | None) -> int:
    """A number a dead letter holds as text; 0 for none, or for one written by hand that is no number."""
    return int(text) if text and text.isdigit() else 0


# ----------------------------------------------------------------------------- the queue

def queue_client(store_url: str | None = None, queue_url: str | None = None) -> Any:
    """A redis-py client for the stream (see the module doc for how the URL is chosen)."""
    url = queue_url
    if url is None and store_url and store_url.split("://", 1)[0] in ("redis", "rediss", "unix"):
        url = store_url
    url = url or os.environ.get("LAYERFLOW_QUEUE") or os.environ.get("REDIS_URL")
    if not url:
        raise LayerflowError(f"workers take instances from a Redis stream, and store {store_url!r} is not Redis: "
                             "pass queue_url= / --queue redis://HOST:PORT/DB (or set LAYERFLOW_QUEUE)")
    # a store's ?prefix= names its keys, not the stream (--stream does): the store's URL given as
    # the queue, as it is by default, is the same Redis
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    if any(k == "prefix" for k, _ in query):
        url = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "prefix"])))
    from context_layers.stores.redis import check_redis_url, redis_client

    check_redis_url(url)
    return redis_client(url, decode_responses=True, socket_connect_timeout=5, health_check_interval=30)


def _queue_where(client: Any) -> str:
    """The queue's Redis as messages name it: its URL without the password."""
    import redis

    pool: Any = getattr(client, "connection_pool", None)
    kw = getattr(pool, "connection_kwargs", {}) or {}
    if "host" not in kw:
        return str(kw.get("path", "?"))
    tls = isinstance(getattr(pool, "connection_class", None), type) and issubclass(pool.connection_class,
                                                                                  redis.connection.SSLConnection)
    user = f"{kw.get('username') or ''}:***@" if kw.get("password") else ""
    return f"{'rediss' if tls else 'redis'}://{user}{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"


def _queue_down(client: Any, err: BaseException) -> StoreUnavailable:
    """The error for a queue Redis that does not answer, or refuses us, naming it (without a password)."""
    import redis

    from context_layers.stores.redis import NotTLS, not_tls_advice, redis_refuses_for_now

    cause = f"{type(err).__name__}: {str(err).rstrip('.')}"
    if isinstance(err, NotTLS):  # a ConnectionError too, but waiting will not make it speak TLS
        return StoreUnavailable(f"{not_tls_advice(f'the queue Redis {_queue_where(client)}')} ({cause}); give "
                                "--queue / $LAYERFLOW_QUEUE (or the redis --store) the scheme its port speaks")
    if redis_refuses_for_now(err):
        return StoreUnavailable(f"the queue's Redis {_queue_where(client)} refuses commands for now ({cause}); fix "
                                "that on the server (maxmemory, a replica that is read-only, a failed RDB save)")
    if isinstance(err, redis.AuthenticationError):  # a ConnectionError too, but it answered
        return StoreUnavailable(f"the queue's Redis {_queue_where(client)} refused the connection ({cause}); put "
                                "its password in --queue / $LAYERFLOW_QUEUE (or a redis:// --store): "
                                "redis://:PASSWORD@HOST:PORT/DB")
    if _dropped(err):  # it answered, then closed the connection: a server that is down is refused, not reset
        return StoreUnavailable(f"the queue's Redis {_queue_where(client)} dropped the connection ({cause}): a CLIENT "
                                "KILL, the server's `timeout`, a proxy or a restart closed it; a server that answers "
                                "again is reconnected to, and if this repeats, look at what closes its clients")
    return StoreUnavailable(f"the queue's Redis {_queue_where(client)} did not answer ({cause}); start redis-server "
                            "there, or point --queue / $LAYERFLOW_QUEUE (or a redis:// --store) at one that answers")


#: How redis-py words a connection the other end closed after it was open (not one it could not open).
_DROPPED = ("Connection closed by server", "Connection reset by peer", "Broken pipe", "Error while reading from",
            "Error while writing to")


def _dropped(err: BaseException) -> bool:
    import redis

    return isinstance(err, redis.ConnectionError) and any(text in str(err) for text in _DROPPED)


def queue_error(client: Any, err: BaseException) -> LayerflowError:
    """A redis-py error of the queue as the library's own, naming the queue's Redis."""
    from context_layers.stores.redis import redis_refuses_for_now

    if isinstance(err, _redis_down()) or redis_refuses_for_now(err):
        return _queue_down(client, err)
    return StoreError(f"the queue's Redis {_queue_where(client)}: {type(err).__name__}: {str(err).rstrip('.')}")


def _stream_lost(err: BaseException) -> bool:
    """The stream or its consumer group is gone: the queue's Redis lost its data (NOGROUP; and
    UNBLOCKED when it went, flushed, while the worker's XREADGROUP waited on it: Redis 7)."""
    import redis

    return isinstance(err, redis.ResponseError) and str(err).startswith(("NOGROUP", "UNBLOCKED"))


def _redis_down() -> tuple[type[BaseException], ...]:
    import redis

    return (redis.ConnectionError, redis.TimeoutError)


def dead_stream_of(stream: str) -> str:
    """The default dead-letter stream of a ready stream: ``<stream>:dead``."""
    return f"{stream}:dead"


def _ensure_group(client: Any, stream: str, group: str) -> None:
    import redis

    try:
        # id 0: entries added before the group existed are delivered too
        client.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as err:
        if "BUSYGROUP" not in str(err):
            raise


def store_identity(store: object) -> str:
    """Which store a stream entry is for: a Redis store's database and key prefix, a sqlite store's
    file (its real path); "" for a store no other process can share (memory). Not a Redis host: one
    server is reached by other names from other machines."""
    store = store.store if isinstance(store, InstanceRecords) else store
    path = getattr(store, "path", None)
    if isinstance(path, (str, Path)) and str(path) != ":memory:":
        return f"sqlite {os.path.realpath(path)}"
    redis, prefix = getattr(store, "redis", None), getattr(store, "prefix", None)
    if redis is not None and isinstance(prefix, str):
        return f"redis db {redis.connection_pool.connection_kwargs.get('db', 0)} prefix {prefix!r}"
    return ""


#: ``store_identity`` of a Redis store, read back: its database and prefix
_REDIS_IDENTITY = re.compile(r"redis db (\d+) prefix '([^']*)'")


def enqueue(client: Any, instance_id: str, *, stream: str = DEFAULT_STREAM, wake: str | None = None,
            store: str = "") -> str:
    """XADD the instance id; returns the entry id. ``wake="timer"``: the instance waits for a
    timer that is due, and the worker runs it although it is at rest. ``store``: the
    ``store_identity`` of the store that holds it (workers of another store leave the entry)."""
    fields = {"instance_id": instance_id, **({"wake": wake} if wake else {}), **({"store": store} if store else {})}
    return str(client.xadd(stream, fields))


def requeue_running(store: str | Store, client: Any, stream: str = DEFAULT_STREAM) -> list[str]:
    """Put every instance the store holds as ``running`` on the stream (oldest first); their ids.

    A queue Redis that came back empty lost the entries of the instances submitted to it (and of
    those a worker had in hand); the store, elsewhere or on a Redis that kept its data, still holds
    them as ``running``. An instance whose entry did survive, or that a live worker runs right now,
    is queued twice, which is harmless: its lease keeps a second worker away, and an entry whose
    instance is at rest is acknowledged without running it. Waiting instances are not queued (a
    timer that comes due is queued by the workers' scan; a person's answer runs the instance)."""
    store = _store(store)
    ids = [str(s["instance_id"]) for s in store.list_instances(status="running")]
    for instance_id in ids:
        enqueue(client, instance_id, stream=stream, wake="requeue", store=store_identity(store))
    return ids


def enqueue_due_timers(engine: Engine, client: Any, stream: str = DEFAULT_STREAM, *, interval: float) -> int:
    """One worker per ``interval`` (a Redis key set NX) puts every instance with a due timer on
    the stream, once per due time; how many it put there."""
    if not client.set(f"{stream}:timer-scan", "1", nx=True, px=max(1, int(interval * 1000))):
        return 0  # another worker scans this round
    queued = 0
    for item in engine.due_timers():
        marker = f"{stream}:timer:{item['instance_id']}:{item['id']}:{item['due']}"
        if client.set(marker, "1", nx=True, ex=24 * 3600):  # this due time is queued once
            enqueue(client, item["instance_id"], stream=stream, wake="timer", store=store_identity(engine.store))
            queued += 1
    return queued


def _id_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def trim_done(client: Any, stream: str = DEFAULT_STREAM) -> int:
    """Remove from ``stream`` the entries that every consumer group of it is done with: older than
    each group's oldest pending entry and than the next entry it has not read yet. How many went.

    XADD keeps every entry, acknowledged or not: without this the stream holds every instance ever
    submitted, in the Redis memory, for good. An entry pending with a worker that died stays (and
    so does everything after it) until a live worker takes it over and finishes it; a stream that
    no group reads is left alone."""
    groups = client.xinfo_groups(stream)
    if not groups:
        return 0
    floor: tuple[int, int] | None = None
    for group in groups:
        last = _id_key(str(group["last-delivered-id"]))
        mark = (last[0], last[1] + 1)  # what the group has read, it has acknowledged or holds as pending
        if group["pending"]:
            oldest = client.xpending(stream, group["name"]).get("min")
            if oldest:
                mark = min(mark, _id_key(str(oldest)))
        floor = mark if floor is None else min(floor, mark)
    if floor is None or floor <= (0, 1):
        return 0
    return int(client.xtrim(stream, minid=f"{floor[0]}-{floor[1]}"))


_FORGET_CONSUMER = """
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #pending > 0 then return -1 end
return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
"""


def prune_consumers(client: Any, stream: str, group: str, idle_ms: int = CONSUMER_IDLE_MS) -> list[str]:
    """Take out of ``group`` the consumers with nothing pending that did not read for ``idle_ms``:
    workers that died (kill -9, a lost machine) once a live worker has taken their entries over. A
    live worker reads every second or holds its entry in hand, and one taken out by mistake is made
    again by its next read. The names of those taken out."""
    gone = [str(c["name"]) for c in client.xinfo_consumers(stream, group)
            if not c["pending"] and int(c.get("idle", 0)) >= idle_ms]
    return [name for name in gone if forget_consumer(client, stream, group, name)]


def forget_consumer(client: Any, stream: str, group: str, consumer: str) -> bool:
    """Take ``consumer`` out of ``group`` if no entry is pending with it (checked and done in one
    Lua script, so an entry given back to it in between keeps it); whether it went. A worker that stops cleanly
    does this for itself: restarts (deploys, a crash loop) would otherwise leave a consumer in the
    group for every worker process that ever ran."""
    return int(client.eval(_FORGET_CONSUMER, 1, stream, group, consumer)) >= 0


def dead_letters(client: Any, stream: str = DEFAULT_STREAM, *, dead_stream: str | None = None,
                 count: int | None = None) -> list[DeadLetter]:
    """The dead letters of ``stream``, oldest first (at most ``count``)."""
    rows = client.xrange(dead_stream or dead_stream_of(stream), count=count)
    return [DeadLetter.from_entry(dead_id, fields) for dead_id, fields in rows]


def has_queue(store_url: str | None, queue_url: str | None = None) -> bool:
    """Whether ``queue_client`` finds a queue for ``store_url`` (a Redis store, ``queue_url`` or
    $LAYERFLOW_QUEUE) without asking for one: a listing reads dead letters only then."""
    scheme = (store_url or "").split("://", 1)[0]
    return bool(queue_url or os.environ.get("LAYERFLOW_QUEUE") or scheme in ("redis", "rediss", "unix"))


def dead_letter_ids(client: Any, stream: str = DEFAULT_STREAM) -> dict[str, str]:
    """Instance id -> the id of its latest dead letter of ``stream`` (what a listing names: no worker runs
    the instance until it is requeued). A queue that fails: ``queue_error``'s, naming its Redis."""
    import redis

    try:
        return {d.instance_id: d.id for d in dead_letters(client, stream)}
    except redis.RedisError as err:
        raise queue_error(client, err) from None


def requeue(client: Any, dead_id: str, stream: str = DEFAULT_STREAM, *, dead_stream: str | None = None) -> str:
    """Put dead letter ``dead_id`` back on ``stream`` as a new entry (delivery count 0) and
    remove it from the dead letters, in one MULTI/EXEC; returns the new entry id.

    Raises ``ContextKeyError`` when there is no such dead letter (already requeued?).
    """
    import redis

    dead = dead_stream or dead_stream_of(stream)
    missing = ContextKeyError(f"no dead letter {dead_id!r} in stream {dead!r}; `layerflow worker dead` lists them "
                              "(a dead letter id looks like 1718000000000-0)")
    if not re.fullmatch(r"\d+-\d+", dead_id):
        raise missing
    with client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(dead)  # XDEL touches the key: two requeues of one letter cannot both go through
                rows = pipe.xrange(dead, min=dead_id, max=dead_id, count=1)
                if not rows:
                    raise missing
                letter = rows[0][1]
                pipe.multi()
                # with its wake: a due timer's entry without it finds the instance waiting (at rest) and is
                # acknowledged without firing the timer, which the scan marked queued for a day
                pipe.xadd(stream, {"instance_id": letter.get("instance_id", ""),
                                   **{k: letter[k] for k in ("wake", "store") if letter.get(k)}})
                pipe.xdel(dead, dead_id)
                new_id, _deleted = pipe.execute()
                return str(new_id)
            except redis.WatchError:
                continue


@dataclass(frozen=True)
class _Queue:
    """The stream as a worker uses it: acknowledge an entry, give a delivery back, dead-letter."""

    client: Any
    stream: str
    group: str
    dead_stream: str

    def ack(self, entry_id: str) -> None:
        self.client.xack(self.stream, self.group, entry_id)

    # Which activity a worker began last, and from which saved version: one SET before each activity
    # (not before a gateway or an event), on the worker path only, so the worker that takes an instance
    # over from a dead one can name the activity that died with it. Only a hint for the audit: a queue
    # that does not answer here costs the hint, never the run.
    def _begun_key(self, instance_id: str) -> str:
        return f"{self.stream}:begun:{instance_id}"

    def mark_begun(self, instance_id: str, consumer: str, task_id: str, version: int) -> None:
        import redis

        text = json.dumps({"task_id": task_id, "version": version, "consumer": consumer})
        try:
            self.client.set(self._begun_key(instance_id), text, ex=BEGUN_TTL)
        except redis.RedisError as err:
            log.debug("instance %s: could not mark task %r begun: %s", instance_id, task_id, err)

    def begun(self, instance_id: str) -> dict[str, Any] | None:
        """The last ``mark_begun`` of ``instance_id`` ({"task_id", "version", "consumer"}), or None."""
        import redis

        try:
            text = self.client.get(self._begun_key(instance_id))
            found = json.loads(text) if text else None
        except (redis.RedisError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def forget_begun(self, instance_id: str) -> None:
        import redis

        try:
            self.client.delete(self._begun_key(instance_id))
        except redis.RedisError:
            pass  # it expires

    def _pending(self, conn: Any, entry_id: str) -> dict[str, Any] | None:
        rows = conn.xpending_range(self.stream, self.group, min=entry_id, max=entry_id, count=1)
        return rows[0] if rows else None

    def give_back(self, entry_id: str, *, to: str | None = None, idle_ms: int = 0) -> None:
        """Undo this delivery's count (busy, conflict, store down are not the entry's fault).

        Read then write: a takeover in between loses its count, which errs toward retrying.
        Owner (or ``to``: the worker it was taken over from) and idle time stay as they were, so the
        entry is taken over when it would have been, and its next taker names who left it;
        ``idle_ms``: at least this idle, so another worker may take it over at once.
        """
        pending = self._pending(self.client, entry_id)
        if pending is None:
            return  # acknowledged meanwhile
        self.client.xclaim(self.stream, self.group, to or pending["consumer"], 0, [entry_id],
                           idle=max(pending["time_since_delivered"], idle_ms),
                           retrycount=max(pending["times_delivered"] - 1, 0), justid=True)

    def dead_letter(self, entry_id: str, letter: Mapping[str, str], *, deliveries: int) -> tuple[int, str | None]:
        """If the entry is pending with at least ``deliveries`` deliveries, move it to the dead
        letters: XADD there + XACK here in one MULTI/EXEC. Returns (its delivery count, the
        dead letter's id or None when it stays)."""
        import redis

        with self.client.pipeline() as pipe:
            while True:
                try:
                    # XACK does not touch the stream key for WATCH, an XADD to the dead letters
                    # does: two workers giving up on one entry cannot both add it
                    pipe.watch(self.dead_stream)
                    pending = self._pending(pipe, entry_id)
                    if pending is None:
                        return 0, None
                    count = int(pending["times_delivered"])
                    if count < deliveries:
                        return count, None
                    pipe.multi()
                    pipe.xadd(self.dead_stream, {**letter, "deliveries": str(count)})
                    pipe.xack(self.stream, self.group, entry_id)
                    dead_id, acked = pipe.execute()
                except redis.WatchError:
                    continue
                if not acked:
                    # another worker finished it between our check and EXEC (possible only after
                    # a lost lease): the entry is done, so our letter goes
                    self.client.xdel(self.dead_stream, dead_id)
                    return count, None
                return count, str(dead_id)


def _store(store: str | Store) -> Store:
    return open_store(store) if isinstance(store, str) else store


def _engine(store: Store, handlers: Mapping[str, Any] | None, model: str | None) -> Engine:
    return Engine(InstanceRecords(store), handlers, model=model)


def _load_model_client(model: str | None) -> None:
    """With a model, import litellm (seconds) before the first claim: imported at the first model
    call, it ran down the lease of the entry in hand, and with a short ``idle_ms`` another worker took
    the instance over meanwhile. A missing litellm ends the worker here, naming the package."""
    if not model:
        return
    from .llm import load_litellm

    started = time.monotonic()
    load_litellm()
    log.info("worker: model client for %r ready (litellm loaded in %.1fs)", model, time.monotonic() - started)


def submit(store_url: str | Store, process_path: str | Path | Iterable[str | Path] | Process,
           data: Mapping[str, Any] | None = None, *,
           config: str | Path | None = None, process_id: str | None = None, instance_id: str | None = None,
           queue_url: str | None = None, stream: str = DEFAULT_STREAM, group: str = DEFAULT_GROUP,
           client: Any = None) -> str:
    """Create an instance of ``process_path`` (a BPMN file, or the files of a process and of the ones it
    calls, as ``load_process`` takes them; or a ``Process`` loaded already) in the store (status
    ``running``, version 1) and put its id on the stream; returns the instance id.

    The process and its start data are checked first (``check_start``): refused data raises before the
    store or the queue is opened, with nothing written to either. Created first, queued second: a crash
    in between leaves a ``running`` instance that no worker was told about; ``enqueue`` it again (a
    duplicate entry is harmless, it is acknowledged once the instance is at rest).
    """
    if isinstance(process_path, Process):
        if config is not None or process_id is not None:
            raise TypeError("submit: config= and process_id= choose what load_process loads; a Process given "
                            "is loaded already, pass neither")
        process = process_path
    else:
        process = load_process(process_path, process_id, config=config)
    ctx, wf = _prepared_start(process, data)  # check_start's checks, kept to start from
    store = _store(store_url)
    client = client or queue_client(store.url, queue_url)
    try:
        _ensure_group(client, stream, group)  # the queue answers before anything is created
    except _redis_down() as err:
        raise _queue_down(client, err) from err
    instance = _engine(store, None, None)._create(process, ctx, wf, instance_id=instance_id)
    try:
        enqueue(client, instance.id, stream=stream, store=store_identity(store))
    except _redis_down() as err:
        # no `running` instance that no worker will ever hear of
        store.delete(instance.id)
        raise _queue_down(client, err) from err
    return instance.id


# ----------------------------------------------------------------------------- the worker

def run_worker(store_url: str | Store, *, queue_url: str | None = None, stream: str = DEFAULT_STREAM,
               group: str = DEFAULT_GROUP, consumer: str | None = None, idle_ms: int = 30_000,
               lease_ttl: float | None = None, block_ms: int = 1000, stop_after: int | None = None,
               stop: threading.Event | None = None, handlers: Mapping[str, Any] | None = None,
               model: str | None = None, client: Any = None, max_deliveries: int = DEFAULT_MAX_DELIVERIES,
               dead_stream: str | None = None, timer_interval: float | None = 5.0,
               requeue: bool = False) -> WorkerStats:
    """Process stream entries until ``stop_after`` entries are acknowledged (finished or
    dead-lettered), ``stop`` is set, or SIGTERM / Ctrl-C (the entry in hand is finished first; a
    second signal stops the process at once, as a kill: see ``_stop_on_signals``).

    ``idle_ms``: how long an entry may stay unacknowledged before another worker takes
    it over; ``lease_ttl`` (seconds, default ``idle_ms``) how long a dead worker's lease
    blocks the instance. Keep ``idle_ms`` above the longest activity you expect: a live
    worker's entry taken over early is harmless (the lease keeps the taker away) but
    costs a retry.

    ``max_deliveries``: failed deliveries of one entry before it moves to ``dead_stream``
    (default ``<stream>:dead``); which outcomes count is in the module doc.

    ``timer_interval``: every this many seconds one of the workers puts the instances whose
    timer is due on the stream (``enqueue_due_timers``); None or 0: this worker never does.

    ``requeue``: first put every ``running`` instance of the store on the stream
    (``requeue_running``): after the queue's Redis came back empty while no worker ran. A worker
    that finds the stream gone while it runs does that by itself.
    """
    if max_deliveries < 1:
        raise LayerflowError(f"max_deliveries must be at least 1, not {max_deliveries}")
    store = _store(store_url)
    engine = _engine(store, handlers, model)
    client = client or queue_client(store.url, queue_url)
    _load_model_client(model)
    queue = _Queue(client, stream, group, dead_stream or dead_stream_of(stream))
    consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:4]}"
    ttl = lease_ttl if lease_ttl is not None else idle_ms / 1000
    stats = WorkerStats(consumer)
    stop = stop or threading.Event()
    try:
        _ensure_group(client, stream, group)
        client.xgroup_createconsumer(stream, group, consumer)  # visible in XINFO CONSUMERS before its first entry
    except _redis_down() as err:
        raise _queue_down(client, err) from err
    _warn_if_evicting(client, getattr(store, "redis", None))
    if requeue:
        try:
            _requeue(store, client, stream, stats)
        except _redis_down() as err:
            raise _queue_down(client, err) from err
    log.info("worker %s: running the instances put on stream %r (group %r) of the queue's Redis %s, for the %s; %s. "
             "Ctrl-C or SIGTERM stops it after the instance in hand", consumer, stream, group, _queue_where(client),
             _serves(store), _stream_counts(client, stream, group))
    hint = _WorkElsewhere(client, stream, group, consumer)
    hint.check()
    next_hint = time.monotonic() + HINT_INTERVAL
    other_store = _other_store_check(queue, store, consumer, idle_ms, stats)
    restore = _stop_on_signals(stop, consumer)
    cursor = "0-0"
    pause = 0.0
    next_scan = 0.0
    next_trim = time.monotonic() + TRIM_INTERVAL
    try:
        while not stop.is_set() and (stop_after is None or stats.acked + stats.dead < stop_after):
            try:
                if timer_interval and time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + timer_interval
                    stats.timers += enqueue_due_timers(engine, client, stream, interval=timer_interval)
                if time.monotonic() >= next_trim:
                    next_trim = time.monotonic() + TRIM_INTERVAL
                    _tidy(client, stream, group)
                # entries of dead workers first, then new ones; who had each one before (XAUTOCLAIM
                # does not say) for the takeover's log line and tape note
                owners = {row["message_id"]: row["consumer"] for row in client.xpending_range(
                    stream, group, min=cursor, max="+", count=1, idle=idle_ms)}
                cursor, claimed, _deleted = client.xautoclaim(stream, group, consumer, min_idle_time=idle_ms,
                                                              start_id=cursor, count=1)
                entries = [(eid, fields) for eid, fields in claimed
                           if fields and not other_store(eid, fields, owners.get(eid))]
                stats.reclaimed += len(entries)
                taken_over = bool(entries)
                if not entries:
                    reply = client.xreadgroup(group, consumer, {stream: ">"}, count=1, block=block_ms)
                    entries = [(eid, fields) for _, batch in reply for eid, fields in batch
                               if not other_store(eid, fields, None)]
                if not entries and hint.active and time.monotonic() >= next_hint:
                    next_hint = time.monotonic() + HINT_INTERVAL
                    hint.check()
                for entry_id, fields in entries:
                    _handle(engine, store, queue, consumer, ttl, max_deliveries, entry_id, fields, stats,
                            taken_over=taken_over, previous=owners.get(entry_id))
                pause = 0.0
            except Exception as err:
                outage = _outage(client, err)
                if outage is not None:
                    # the queue went away (restart, failover; an entry in hand stays pending and is
                    # taken over later), refuses commands for now (out of memory, a read-only replica),
                    # or the store went away under the timer scan (an entry in hand deals with its own,
                    # ``_handle``): the worker waits for it instead of dying
                    stats.failures += 1
                    pause = min(max(pause * 2, 0.5), 10.0)
                    log.warning("%s; retrying in %.1fs", outage, pause)
                    stop.wait(pause)
                    continue
                if not _stream_lost(err):
                    raise
                # the server came back without its data (no persistence, a flush): the entries it
                # held are gone with it. Say so once, make the group again and go on with new work.
                stats.failures += 1
                log.error("the stream %r or its group %r is gone from the queue's Redis %s: that server lost its "
                          "data (restarted without persistence, or flushed), and with it the entries on the stream. "
                          "The instances the store still holds as 'running' are put back on the stream; use "
                          "appendonly yes on a Redis that workers share", stream, group, _queue_where(client))
                cursor = "0-0"
                try:
                    _ensure_group(client, stream, group)
                    _requeue(store, client, stream, stats)
                except _redis_down():
                    pass  # gone again: the next round waits for it
                except StoreError as lost:  # a store on the same server lost its data too: nothing to put back
                    log.error("the running instances could not be read from the store %s to put them back on the "
                              "stream: %s", _store_label(store), lost)
    finally:
        restore()
        _leave(client, stream, group, consumer)
    return stats


def _other_store_check(queue: _Queue, store: Store, consumer: str, idle_ms: int,
                       stats: WorkerStats) -> Callable[[str, Mapping[str, str], str | None], bool]:
    """``check(entry_id, fields, previous)``: True when the entry names another store than this
    worker's; the delivery is then given back uncounted, at once claimable by that store's workers
    (to ``previous``, the worker it was taken over from, when there was one), and logged once per
    entry. An entry that names no store (put there by a layerflow from before) is this worker's."""
    own = store_identity(store)
    told: dict[str, None] = {}  # the entries logged, bounded as the worker runs for months

    def check(entry_id: str, fields: Mapping[str, str], previous: str | None) -> bool:
        theirs = fields.get("store", "")
        if not theirs or not own or theirs == own:
            return False
        stats.other_store += 1
        queue.give_back(entry_id, to=previous, idle_ms=idle_ms)
        if entry_id not in told:
            told[entry_id] = None
            if len(told) > 10_000:
                del told[next(iter(told))]
            log.warning("entry %s: instance %s was submitted to the store %s, not to this worker's (%s, --store %s): "
                        "left to the workers of that store, uncounted. Start this worker with the --store `layerflow "
                        "submit` used, or give the two stores streams of their own (--stream)", entry_id,
                        fields.get("instance_id", ""), theirs, own, _store_label(store))
        return True

    return check


def _leave(client: Any, stream: str, group: str, consumer: str) -> None:
    """As the worker stops: trim what is done, and take its consumer out of the group when nothing
    is pending with it. Only tidying: a queue that does not answer now is left as it is (the next
    worker's trim catches up; a consumer left behind costs a few bytes)."""
    import redis

    try:
        if _tidy(client, stream, group):
            forget_consumer(client, stream, group, consumer)
    except redis.RedisError as err:
        log.debug("worker %s: could not tidy stream %r on leaving: %s", consumer, stream, err)


def _tidy(client: Any, stream: str, group: str) -> bool:
    """``trim_done`` and ``prune_consumers``; False when the stream or its group is gone (the queue's
    Redis lost its data: the worker's next read finds that out and deals with it)."""
    import redis

    try:
        trim_done(client, stream)
        prune_consumers(client, stream, group)
    except redis.ResponseError as err:
        if _stream_lost(err) or "no such key" in str(err).lower():
            return False
        # a Redis that refuses a command here (an ACL without XTRIM or EVAL): the stream is only not
        # tidied; the worker goes on serving it
        log.warning("could not tidy stream %r of the queue's Redis %s: %s", stream, _queue_where(client), err)
    return True


def _warn_if_evicting(*clients: Any) -> None:
    """Warn of each Redis (the queue's, the store's) that evicts keys when full: it would drop a tape, a
    record or the stream without an error (what is left is named when read: a dead letter)."""
    import redis

    warned = set()
    for c in clients:
        if c is None or _queue_where(c).rsplit("/", 1)[0] in warned:
            continue
        try:
            policy = c.info("memory").get("maxmemory_policy")
        except redis.RedisError:
            continue  # a managed Redis may refuse INFO; the worker does not need it
        if policy and policy != "noeviction":
            where = _queue_where(c).rsplit("/", 1)[0]
            warned.add(where)
            log.warning("the Redis %s has maxmemory-policy %s: once full, it evicts keys, and with them instances' "
                        "tapes, records or stream entries, without an error; give a Redis that workers share "
                        "maxmemory-policy noeviction (a full one then refuses writes, which workers wait out)",
                        where, policy)


def _serves(store: Store) -> str:
    """The store a worker serves, for its start line: as entries name it (``store_identity``), its URL, and
    how many instances it holds (when the backend counts them cheaply)."""
    inner = store.store if isinstance(store, InstanceRecords) else store
    identity = store_identity(inner)
    label = f"store {identity} ({_store_label(inner)})" if identity else f"store {_store_label(inner)}"
    count = getattr(inner, "count_instances", None)
    if count is None:
        return label
    try:
        return f"{label}, which holds {count()} instances"
    except StoreError as err:
        return f"{label} (not counted: {err})"


def _stream_counts(client: Any, stream: str, group: str) -> str:
    """What waits on the stream for the group, for the worker's start line: its entries, those the group
    has not read yet (Redis 7 counts them) and those pending with workers."""
    import redis

    try:
        length = int(client.xlen(stream))
        mine = next((g for g in client.xinfo_groups(stream) if str(g["name"]) == group), None)
    except redis.RedisError as err:
        return f"the stream not counted ({type(err).__name__}: {err})"
    text = f"the stream holds {length} entries"
    if mine is None:
        return text
    lag = mine.get("lag")
    unread = f"{lag} not yet read, " if isinstance(lag, int) else ""
    return f"{text} ({unread}{mine['pending']} pending with workers of the group)"


class _WorkElsewhere:
    """Whether the work of a worker whose stream never had an entry is elsewhere on its Redis server, where
    it would idle forever: ``check`` logs one line naming where, the entries there and the option to start
    the worker with.

    * another database holds a stream of the same name with entries: ``layerflow submit`` was given another
      database than this worker (``--store .../14`` beside ``--store .../5``);
    * another stream of this database holds entries no worker of this group has read (or no group reads):
      ``submit`` was given another ``--stream``.

    Cheap enough to run once a minute while idle: INFO keyspace names the databases holding keys, and each
    is asked about the one key of the stream's name; this database's streams are looked for with a SCAN only
    while it holds at most ``SCAN_KEYS`` keys. It stops for good once the stream has had an entry (work
    elsewhere is then another fleet's, not a mistake), and says each place once. A Redis that refuses any of
    it (an ACL without INFO, SELECT or SCAN) ends the checks: they are only a hint.
    """

    SCAN_KEYS = 10_000

    def __init__(self, client: Any, stream: str, group: str, consumer: str) -> None:
        self.client, self.stream, self.group, self.consumer = client, stream, group, consumer
        self.active = True
        self.told: set[str] = set()

    def check(self) -> None:
        import redis

        if not self.active:
            return
        try:
            if _text(self.client.xinfo_stream(self.stream).get("last-generated-id", "0-0")) != "0-0":
                self.active = False  # this stream is in use: its own work comes here
                return
            found = [f for f in [*self._elsewhere(), *self._beside()] if f[0] not in self.told]
        except (redis.ConnectionError, redis.TimeoutError):
            return  # the loop deals with an outage; the next check comes after it
        except redis.RedisError as err:
            self.active = False
            log.debug("worker %s: not looking for this stream's work elsewhere: %s", self.consumer, err)
            return
        if not found:
            return
        self.told.update(where for where, _ in found)
        log.warning("worker %s: stream %r on %s has never had an entry, but %s", self.consumer, self.stream,
                    _queue_where(self.client), "; and ".join(text for _, text in found))

    def _beside(self) -> list[tuple[str, str]]:
        """("stream NAME", what it holds and the option to start with) for each other stream of this
        database with entries that no worker of the group has read, in a database of at most SCAN_KEYS keys."""
        if int(self.client.dbsize()) > self.SCAN_KEYS:
            return []
        found = []
        for key in self.client.scan_iter(count=1000, _type="stream"):
            name = _text(key)
            if name == self.stream or name.endswith(":dead"):
                continue
            length = int(self.client.xlen(name))
            groups = self.client.xinfo_groups(name)
            group = next((g for g in groups if _text(g["name"]) == self.group), None)
            lag = group.get("lag") if group is not None else None
            if not length or (group is not None and not (isinstance(lag, int) and lag > 0)) or (
                    group is None and groups):
                continue  # read by its workers (or by another group's): another fleet's stream
            last = self.client.xrevrange(name, count=1)
            fields = {_text(k) for k in (last[0][1] if last else {})}
            if "instance_id" not in fields or "entry_id" in fields:
                continue  # not a ready stream of layerflow's (another program's, or dead letters)
            unread = f"{lag} not yet read by group {self.group!r}" if group is not None else "no group reads it"
            found.append((f"stream {name}", f"stream {name!r} of that database has {length} entries ({unread}): "
                                            f"if `layerflow submit --stream {name}` put its work there, start this "
                                            f"worker with --stream {name}"))
        return found

    def _elsewhere(self) -> list[tuple[str, str]]:
        """("db N", what it holds and the option to start with) for each other database of the server
        whose key of the stream's name is a stream with entries."""
        import redis

        pool = self.client.connection_pool
        kw = dict(pool.connection_kwargs)
        own = int(kw.get("db") or 0)
        dbs = sorted(int(str(name)[2:]) for name in self.client.info("keyspace") if str(name)[2:].isdigit())
        found = []
        for db in dbs:
            if db == own:
                continue
            other_pool = redis.ConnectionPool(connection_class=pool.connection_class, **{**kw, "db": db})
            other: Any = redis.Redis(connection_pool=other_pool)
            try:
                if _text(other.type(self.stream)) != "stream":
                    continue
                length = int(other.xlen(self.stream))
                if not length:
                    continue
                group = next((g for g in other.xinfo_groups(self.stream) if _text(g["name"]) == self.group), None)
                last = other.xrevrange(self.stream, count=1)  # which store its newest entry names
                fields = last[0][1] if last else {}
            finally:
                other_pool.disconnect()
            lag = group.get("lag") if group is not None else None
            unread = f"{lag} not yet read by group {self.group!r}" if isinstance(lag, int) else (
                f"no group {self.group!r} reads it" if group is None else "")
            theirs = _text({_text(k): v for k, v in fields.items()}.get("store") or "")
            named = _REDIS_IDENTITY.fullmatch(theirs)
            if named:
                todo = f"start this worker with --store {self._url(int(named[1]), named[2])}"
            else:
                todo = (f"start this worker with --queue {self._url(db)}"
                        + (f" and the store `layerflow submit` used ({theirs})" if theirs else ""))
            found.append((f"db {db}", f"database {db} of that server has a stream of that name with {length} entries"
                              + (f" ({unread})" if unread else "") + (f" for the store {theirs}" if theirs else "")
                              + f": `layerflow submit` put its work there; to run it, {todo}"))
        return found

    def _url(self, db: int, prefix: str = "layerflow") -> str:
        """The URL of database ``db`` of the queue's server (its password masked), with the store's prefix."""
        where = _queue_where(self.client)
        named = "" if prefix == "layerflow" else f"prefix={prefix}"
        if "://" not in where:  # a unix socket: its path
            return f"unix://{where}?db={db}" + (f"&{named}" if named else "")
        return f"{where.rsplit('/', 1)[0]}/{db}" + (f"?{named}" if named else "")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _outage(client: Any, err: BaseException) -> BaseException | None:
    """What the worker's loop waits out, as it tells it, or None: the queue's Redis down or refusing
    commands for now, or the store unavailable."""
    from context_layers.stores.redis import redis_refuses_for_now

    if isinstance(err, _redis_down()) or redis_refuses_for_now(err):
        return _queue_down(client, err)
    return err if isinstance(err, StoreUnavailable) else None


def _requeue(store: Store, client: Any, stream: str, stats: WorkerStats) -> None:
    ids = requeue_running(store, client, stream)
    stats.requeued += len(ids)
    if ids:
        log.warning("put %d running instance(s) of the store %s back on stream %r: %s", len(ids),
                    _store_label(store), stream, ", ".join(ids))


def _handle(engine: Engine, store: Store, queue: _Queue, consumer: str, ttl: float, max_deliveries: int,
            entry_id: str, fields: Mapping[str, str], stats: WorkerStats, *, taken_over: bool,
            previous: str | None = None) -> None:
    instance_id = fields.get("instance_id", "")
    try:
        leased = store.acquire_lease(instance_id, consumer, ttl)
    except StoreUnavailable as err:
        stats.failures += 1
        log.warning("entry %s: %s; leaving it pending (a store outage does not count toward its dead letter)",
                    entry_id, err)
        queue.give_back(entry_id)
        return
    if not leased:
        stats.busy += 1  # a live worker runs it; its entry (or this one, later) gets acknowledged
        queue.give_back(entry_id, to=previous if taken_over else None)  # still the dead one's, as it was
        return
    heartbeat = Heartbeat(store, instance_id, consumer, ttl)
    try:
        if taken_over:
            # more deliveries than allowed and no failure recorded: its workers died on it;
            # do not run it again (it may be what kills them)
            letter = _letter(entry_id, instance_id, consumer, queue.group, None, fields.get("wake"), fields.get("store"))
            count, dead_id = queue.dead_letter(entry_id, letter, deliveries=max_deliveries + 1)
            if dead_id is not None:
                stats.dead += 1
                queue.forget_begun(instance_id)  # a requeued dead letter is a new entry, not a takeover
                _log_dead(queue, entry_id, instance_id, count, dead_id, letter)
                return
        retry = None
        begun = None
        pending = queue._pending(queue.client, entry_id) if taken_over else None
        if pending is not None:
            begun = queue.begun(instance_id)
            # a first delivery with no activity begun is no retry: the deliveries before it were given
            # back unrun (another store's worker left it, a lease was busy). One given back after an
            # activity began (the store went down under it) is: that activity runs again.
            if int(pending["times_delivered"]) > 1 or begun is not None:
                retry = {"entry_id": entry_id, "delivery": int(pending["times_delivered"]),
                         "previous_consumer": previous or "", "consumer": consumer}
        try:
            _run_to_rest(engine, entry_id, instance_id, stats, wake=fields.get("wake"), store=store,
                         lease_check=heartbeat.check, retry=retry, begun=begun,
                         mark_begun=lambda task_id, version: queue.mark_begun(instance_id, consumer, task_id, version))
        except _Vanished as err:
            # nothing left to run and nothing written: retrying or dead-lettering cannot help
            stats.failures += 1
            log.error("entry %s: %s; acknowledging the entry", entry_id, err)
            queue.ack(entry_id)
            queue.forget_begun(instance_id)
            stats.acked += 1
        except LeaseLost as err:
            # paused past the lease (a stopped process, a long pause) and taken over: the next
            # activity's side effects are the holder's to run, not this worker's as well
            stats.conflicts += 1
            log.warning("entry %s: %s; leaving the entry pending", entry_id, err)
            queue.give_back(entry_id)
        except VersionConflict as err:
            stats.conflicts += 1
            log.info("entry %s: %s; leaving it pending", entry_id, err)
            queue.give_back(entry_id)
        except StoreUnavailable as err:
            stats.failures += 1
            log.warning("entry %s: %s; leaving it pending (a store outage does not count toward its dead letter)",
                        entry_id, err)
            queue.give_back(entry_id)
        except Exception as err:  # noqa: BLE001 - the engine turns activity failures into status "error"; this is a bug
            stats.failures += 1
            letter = _letter(entry_id, instance_id, consumer, queue.group, err, fields.get("wake"), fields.get("store"))
            count, dead_id = queue.dead_letter(entry_id, letter, deliveries=max_deliveries)
            # a store's own error (a damaged record, a lost tape) says what is wrong: its stack adds nothing
            trace = None if isinstance(err, (StoreError, NotInWorkerStore)) else err
            if dead_id is None:
                log.warning("entry %s: instance %r could not be run (failed delivery %d of %d%s); leaving the entry "
                            "pending", entry_id, instance_id, count, max_deliveries,
                            "" if trace else f": {err}", exc_info=trace)
            else:
                stats.dead += 1
                queue.forget_begun(instance_id)
                _log_dead(queue, entry_id, instance_id, count, dead_id, letter, trace)
        else:
            queue.ack(entry_id)
            queue.forget_begun(instance_id)
            stats.acked += 1
    finally:
        heartbeat.stop()
        try:
            store.release_lease(instance_id, consumer)
        except StoreError:
            pass  # it expires


def _store_label(store: Any) -> str:
    """The store as errors name it (a Redis password masked, as the store's repr does)."""
    label = repr(store)
    return label[1:-1] if label.startswith("<") and label.endswith(">") else label


class NotInWorkerStore(LayerflowError):
    """The entry's instance is not in the worker's store (another --store than `submit` used, or
    deleted): a failed delivery, its message says all (no traceback of the worker's own code)."""

    kind = "not_found"


class _Vanished(LayerflowError):
    """The instance was loaded, then was gone from the store when its run saved."""

    kind = "not_found"


def _run_to_rest(engine: Engine, entry_id: str, instance_id: str, stats: WorkerStats, *,
                 wake: str | None = None, store: Store | None = None,
                 lease_check: Callable[[str, Callable[[], bool]], None] | None = None,
                 retry: Mapping[str, Any] | None = None, begun: Mapping[str, Any] | None = None,
                 mark_begun: Callable[[str, int], None] | None = None) -> None:
    """Load the instance and run it until it is at rest; raises what stops that. Woken for a
    due timer, a waiting instance runs too (the timer fires). ``lease_check`` runs before each
    task (``Heartbeat.check``: ``LeaseLost`` once the lease is gone); then ``mark_begun(task_id,
    version)`` before each activity (not a gateway or an event), with the version it starts from
    (the last save). ``retry``: the entry was taken over from a
    worker that did not finish it (``entry_id``, ``delivery``, ``previous_consumer``, ``consumer``):
    logged, and a ``retry`` note on the main tape, saved with the run's first step, so the audit shows
    that what the other worker had begun (an activity it ran, its side effects) is run again from the
    last save; ``begun`` (the last task marked begun) names that activity when it began after that save."""
    try:
        instance = engine.load(instance_id)
    except InstanceNotFound:
        # Not acknowledged: a worker started with another --store than `submit` used (another
        # sqlite file, prefix or db) would otherwise empty the stream of the work of every
        # worker. A failed delivery instead: a worker on the right store takes it over after
        # idle_ms, and one that never finds it ends in the dead letters, to be requeued.
        raise NotInWorkerStore(
            f"instance {instance_id!r} is not in this worker's store {_store_label(store or engine.store)}: either this "
            f"worker's --store is not the one `layerflow submit` used (start it with that store, then "
            f"`layerflow worker requeue` this dead letter), or the instance was deleted (nothing to do)") from None
    if lease_check is not None:
        activities = instance.process.activity_ids() if mark_begun is not None else frozenset()

        def still_ours(task_id: str) -> None:
            # the version this run saved last is still the stored one: nobody ran it meanwhile
            lease_check(task_id, lambda: record_head(engine.store, instance_id)["version"] == instance.version)
            if mark_begun is not None and task_id in activities:
                mark_begun(task_id, instance.version)

        instance.lease_check = still_ours
    if instance.status not in AT_REST or (instance.status == "waiting" and (wake == "timer" or _due_now(instance))):
        if retry is not None:
            _note_retry(instance, entry_id, retry, begun)
        try:
            instance = engine.run(instance)
        except InstanceNotFound:
            raise _Vanished(
                f"instance {instance_id!r} vanished from the store {_store_label(store or engine.store)} while this "
                "worker ran it, so nothing of this run was saved: the store lost its data (a Redis restarted "
                "without persistence, or flushed) or someone deleted the instance meanwhile") from None
        stats.ran += 1
        if instance.status == "error" and instance.error:
            # the outcome an operator must act on: what failed, where, and how to go on
            task = instance.error.get("task_id")
            log.warning("instance %s (%s): error [%s]%s: %s; fix the cause, then `layerflow resume %s` "
                        "(with the same --store)", instance_id, instance.process_id, instance.error.get("kind"),
                        f" at {task}" if task else "", instance.error.get("message"), instance_id)
        else:
            log.info("instance %s (%s): %s%s", instance_id, instance.process_id, instance.status, _waits_for(instance))
    if instance.status not in AT_REST:
        raise LayerflowError(f"instance {instance_id!r} is still {instance.status!r} after a run; it should "
                             f"be one of {', '.join(AT_REST)}")
    stats.statuses[instance.status] = stats.statuses.get(instance.status, 0) + 1


def _due_now(instance: Instance) -> bool:
    """Whether a waiting instance has a timer, or a confirmation's timeout, due by its clock: run, it fires
    it. An entry that does not say ``wake`` may still be a due timer's wake-up (a dead letter from before
    letters kept it, requeued; an entry of an older layerflow), and acknowledging it unrun would leave the
    timer unfired until the scan queues that due time again, a day later."""
    due = [w["due"] for w in instance.waiting_for if w.get("due") and w["kind"] in ("timer", "confirmation")]
    if not due:
        return False
    now = datetime.fromtimestamp(instance.clock(), timezone.utc)
    return any(_utc(d) <= now for d in due)


def _waits_for(instance: Instance) -> str:
    """`` for confirmation GATEWAY/KEY (due ...); timer TASK (due ...)``: what a waiting instance waits for,
    for the worker's log ("" when it waits for nothing)."""
    items = []
    for w in instance.to_document()["waiting_for"]:
        if w["kind"] == "confirmation":
            what = f"confirmation {w['id']}"
        elif w.get("event"):
            what = f"{w.get('event_kind', 'event')} {w['event']!r} at {w['task_id']}"
        else:
            what = f"{w['kind'].replace('_', ' ')} {w['task_id']}"
        items.append(what + (f" (due {w['due']})" if w.get("due") else ""))
    return f" for {'; '.join(items)}" if items else ""


def _note_retry(instance: Instance, entry_id: str, retry: Mapping[str, Any],
                begun: Mapping[str, Any] | None = None) -> None:
    """Log a takeover and put its ``retry`` note on the main tape (saved with the run's first step);
    ``activity_begun`` names the task a worker began from the version it resumes from (none saved
    since), when one was marked."""
    previous, consumer = retry.get("previous_consumer") or "", retry.get("consumer") or "worker"
    data = {**retry, "resumed_from_version": instance.version}
    task = begun.get("task_id") if begun is not None and begun.get("version") == instance.version else None
    if isinstance(task, str):
        data["activity_begun"] = task
    if previous == consumer:
        who = "taken up again by this worker, whose earlier delivery"
    else:
        who = f"taken over from consumer {previous!r}, which" if previous else "taken over from a worker that"
    # no mark: nothing was begun since that save (a read whose reply a dropped connection lost, a delivery
    # given back), unless marking failed, which the queue's Redis being down for that one SET would take
    again = (f"activity {task!r}, begun then, runs again" if isinstance(task, str)
             else "no activity was marked begun since that save, so none runs again")
    log.warning("entry %s: instance %s %s did not finish it (delivery %s): running it again from its last save "
                "(version %d); %s", entry_id, instance.id, who, retry.get("delivery"), instance.version, again)
    instance.main.record("retry", actor=str(consumer), data=data)


def _letter(entry_id: str, instance_id: str, consumer: str, group: str, err: BaseException | None,
            wake: str | None = None, store: str | None = None) -> dict[str, str]:
    if err is None:
        error_type, error = "", ("no outcome recorded: the workers that took the entry stopped before finishing it "
                                 "(killed, out of memory?)")
    else:
        error_type, error = type(err).__name__, str(err)[:ERROR_CHARS]
    return {"instance_id": instance_id, "entry_id": entry_id, "error_type": error_type, "error": error,
            "consumer": consumer, "group": group, "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            **({"wake": wake} if wake else {}), **({"store": store} if store else {}),
            "format": str(DEAD_LETTER_FORMAT)}


def _log_dead(queue: _Queue, entry_id: str, instance_id: str, count: int, dead_id: str, letter: Mapping[str, str],
              err: BaseException | None = None) -> None:
    last = f"{letter['error_type']}: {letter['error']}" if letter["error_type"] else letter["error"]
    log.error("entry %s: instance %r failed %d deliveries (last: %s); moved to %s as %s and acknowledged. "
              "Fix the cause, then `layerflow worker requeue %s --stream %s`", entry_id, instance_id, count, last,
              queue.dead_stream, dead_id, dead_id, queue.stream, exc_info=err)


def _stop_on_signals(stop: threading.Event, consumer: str = "") -> Any:
    """SIGTERM / SIGINT set ``stop`` (main thread only); a second one stops the process at once, as
    a kill does (raising into the activity in hand would have the engine record it as failed: a
    kill saves nothing, and the entry is taken over). Returns the undo."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if stop.is_set():
            log.warning("worker %s: received %s again: stopping at once; an instance in hand is taken over by "
                        "another worker after --idle-ms, and its activity runs again from the last save",
                        consumer, name)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stop.set()
        log.warning("worker %s: received %s: stopping after the instance in hand (its activity finishes and is "
                    "saved); send it again to stop at once", consumer, name)

    for sig in previous:
        signal.signal(sig, handler)

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore
